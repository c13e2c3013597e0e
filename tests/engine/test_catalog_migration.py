"""Schema v2 (review tables): migration from a real v1 catalog, frozen DDL in step with schema.py."""

from __future__ import annotations

import sqlite3

from engine.catalog import Catalog, db, schema


def _make_v1(path) -> None:
    """A catalog as Longlens 0.1 (schema 1) left it, with some data."""
    con = sqlite3.connect(path)
    for sql in db._V1_DDL:
        con.execute(sql)
    con.execute("INSERT INTO libraries (id, root, status, added_at) VALUES (1, '/photos', 'online', 1.0)")
    con.execute(
        "INSERT INTO images (id, library_id, rel_path, size, mtime_ns, content_hash, status, added_at, updated_at) "
        "VALUES (7, 1, 'a.jpg', 10, 5, 'h', 'ok', 1.0, 1.0)"
    )
    con.execute("INSERT INTO embeddings VALUES (7, 'm', 2, x'0000803f00000000', 1.0)")
    con.execute("INSERT INTO meta VALUES ('k', 'v')")
    con.execute("PRAGMA user_version=1")
    con.commit()
    con.close()


def test_v1_catalog_migrates_to_v2_keeping_data_and_a_backup(tmp_path):
    path = tmp_path / "catalog.sqlite3"
    _make_v1(path)
    cat = Catalog(path)
    try:
        # v1 -> v2 -> v3 (verdicts keyed by content) -> v4 (renumbered) -> v5 (XMP metadata)
        assert db.SCHEMA_VERSION == 6
        with cat.read() as conn:
            assert db.user_version(conn) == db.SCHEMA_VERSION
            tables = {r[0] for r in conn.exec_driver_sql("SELECT name FROM sqlite_master WHERE type='table'")}
        assert {"review_sessions", "review_items", "verdicts"} <= tables
        assert [lib.root for lib in cat.libraries()] == ["/photos"]
        assert cat.images_by_id([7])[7].rel_path == "a.jpg"
        assert cat.vectors_for([7], "m").tolist() == [[1.0, 0.0]]
        assert cat.get_meta("k") == "v"
        assert cat.integrity_check() == "ok"
        # The backup is the untouched v1 file.
        assert cat.backup_path is not None and cat.backup_path.exists()
        bak = sqlite3.connect(cat.backup_path)
        assert bak.execute("PRAGMA user_version").fetchone()[0] == 1
        assert bak.execute("SELECT count(*) FROM sqlite_master WHERE name='verdicts'").fetchone()[0] == 0
        assert bak.execute("SELECT rel_path FROM images").fetchall() == [("a.jpg",)]
        bak.close()
    finally:
        cat.close()
    # Opening again does nothing more (no second backup).
    again = Catalog(path)
    assert again.backup_path is None
    again.close()


def test_frozen_ddl_matches_the_table_definitions(tmp_path):
    """schema.py (used by queries) and the literal migration SQL describe the same columns."""
    cat = Catalog(tmp_path / "c.sqlite3")
    try:
        with cat.read() as conn:
            for table in schema.metadata.sorted_tables:
                cols = {r[1]: (r[3], r[5] > 0) for r in conn.exec_driver_sql(f"PRAGMA table_info({table.name})")}
                want = {c.name: (not c.nullable, c.primary_key) for c in table.columns}
                assert set(cols) == set(want), table.name
                for name, (notnull, pk) in want.items():
                    assert cols[name][1] == pk, (table.name, name)
                    if not pk:
                        assert bool(cols[name][0]) == notnull, (table.name, name)
    finally:
        cat.close()


def test_deleting_a_session_cascades_to_its_items_not_to_the_verdicts(tmp_path):
    """Since schema 3 verdicts belong to (image, caption), which other sessions may share: deleting a
    session removes its items, and the verdicts stay for every session that holds the same item."""
    cat = Catalog(tmp_path / "c.sqlite3")
    try:
        with cat.write() as conn:
            conn.exec_driver_sql("INSERT INTO review_sessions VALUES (1, '/c.jsonl', 'h', 0, 1.0, 1.0)")
            conn.exec_driver_sql(
                "INSERT INTO review_items (id, session_id, line_no, image_path, caption, image_key, caption_hash) "
                "VALUES (1, 1, 1, '/a.jpg', 'A cat.', 'sha256:aa', 'cc')")
            conn.exec_driver_sql(
                "INSERT INTO verdicts (image_key, caption_hash, sentence_index, verdict, note, updated_at) "
                "VALUES ('sha256:aa', 'cc', NULL, 'faithful', '', 1.0)")
        with cat.write() as conn:
            conn.exec_driver_sql("DELETE FROM review_sessions")
        with cat.read() as conn:
            assert conn.exec_driver_sql("SELECT count(*) FROM review_items").scalar() == 0
            assert conn.exec_driver_sql("SELECT count(*) FROM verdicts").scalar() == 1
    finally:
        cat.close()
