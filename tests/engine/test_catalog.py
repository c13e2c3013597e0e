"""Catalog: schema, migrations, WAL/IMMEDIATE transactions, batch atomicity, filters, odd paths."""

from __future__ import annotations

import os
import sqlite3
import threading

import numpy as np
import pytest

from engine.catalog import Catalog, ImageFilter, ImageWrite, db
from engine.catalog import paths as dbpaths
from engine.errors import CatalogError, CatalogTooNewError
from engine.types import STATUS_DELETED, STATUS_OK


def _write(lib_id: int, rel: str, vec=None, **kw) -> ImageWrite:
    base = dict(library_id=lib_id, rel_path=rel, size=10, mtime_ns=1, content_hash="h-" + dbpaths.for_display(rel), status=STATUS_OK)
    base.update(kw)
    return ImageWrite(**base, vector=vec)


def test_new_catalog_is_wal_and_current(tmp_path):
    cat = Catalog(tmp_path / "c.sqlite3")
    with cat.read() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert db.user_version(conn) == db.SCHEMA_VERSION
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    assert cat.backup_path is None  # nothing to back up on a fresh catalog
    assert cat.integrity_check() == "ok"
    cat.close()


def test_refuses_newer_catalog_and_leaves_it_untouched(tmp_path):
    path = tmp_path / "c.sqlite3"
    Catalog(path).close()
    raw = sqlite3.connect(path)
    raw.execute(f"PRAGMA user_version={db.SCHEMA_VERSION + 5}")
    raw.commit()
    raw.close()
    before = path.read_bytes()
    with pytest.raises(CatalogTooNewError, match="newer Longlens"):
        Catalog(path)
    assert path.read_bytes() == before


def test_migration_backs_up_first_and_runs_steps_in_order(tmp_path, monkeypatch):
    path = tmp_path / "c.sqlite3"
    cat = Catalog(path)
    lib = cat.add_library(tmp_path)
    cat.close()
    ran = []

    current = db.SCHEMA_VERSION
    nxt = current + 1

    def step_next(conn):
        ran.append(nxt)
        conn.exec_driver_sql("ALTER TABLE libraries ADD COLUMN label TEXT")

    monkeypatch.setattr(db, "SCHEMA_VERSION", nxt)
    monkeypatch.setitem(db.MIGRATIONS, nxt, step_next)
    cat = Catalog(path)
    assert ran == [nxt]
    assert cat.backup_path is not None and cat.backup_path.exists()
    # The backup is the previous catalog, with the data it had.
    bak = sqlite3.connect(cat.backup_path)
    assert bak.execute("PRAGMA user_version").fetchone()[0] == current
    assert bak.execute("SELECT root FROM libraries").fetchall() == [(lib.root,)]
    bak.close()
    with cat.read() as conn:
        assert db.user_version(conn) == nxt
    cat.close()


def test_failed_migration_step_rolls_back(tmp_path, monkeypatch):
    path = tmp_path / "c.sqlite3"
    Catalog(path).close()

    def broken(conn):
        conn.exec_driver_sql("ALTER TABLE libraries ADD COLUMN label TEXT")
        raise RuntimeError("boom")

    current = db.SCHEMA_VERSION
    monkeypatch.setattr(db, "SCHEMA_VERSION", current + 1)
    monkeypatch.setitem(db.MIGRATIONS, current + 1, broken)
    with pytest.raises(RuntimeError):
        Catalog(path)
    raw = sqlite3.connect(path)
    assert raw.execute("PRAGMA user_version").fetchone()[0] == current
    cols = [r[1] for r in raw.execute("PRAGMA table_info(libraries)")]
    assert "label" not in cols
    raw.close()


def test_batch_is_all_or_nothing(tmp_path):
    cat = Catalog(tmp_path / "c.sqlite3")
    lib = cat.add_library(tmp_path)
    v = np.ones(4, dtype=np.float32) / 2
    cat.write_batch("m", [_write(lib.id, "a.jpg", v)])
    bad = _write(lib.id, "c.jpg", v)
    bad.size = None  # NOT NULL violation in the middle of the batch
    with pytest.raises(CatalogError):
        cat.write_batch("m", [_write(lib.id, "b.jpg", v), bad])
    paths = sorted(r.rel_path for r in cat.image_records(lib.id))
    assert paths == ["a.jpg"]
    assert cat.embedded_ids(lib.id, "m") == {r.id for r in cat.image_records(lib.id)}
    cat.close()


def test_vectors_round_trip_and_soft_delete(tmp_path):
    cat = Catalog(tmp_path / "c.sqlite3")
    lib = cat.add_library(tmp_path)
    rng = np.random.default_rng(0)
    vecs = rng.standard_normal((3, 8)).astype(np.float32)
    ids = cat.write_batch("m", [_write(lib.id, f"{i}.jpg", vecs[i]) for i in range(3)])
    got_ids, got = cat.all_vectors(lib.id, "m")
    assert got_ids.tolist() == sorted(ids)
    np.testing.assert_array_equal(got, vecs)
    cat.write_batch("m", [], deleted_ids=[ids[1]])
    assert cat.embedded_ids(lib.id, "m") == {ids[0], ids[2]}
    assert cat.images_by_id([ids[1]])[ids[1]].status == STATUS_DELETED
    # Purge only when asked.
    assert cat.purge_deleted(lib.id) == 1
    assert ids[1] not in cat.images_by_id(ids)
    cat.close()


def test_non_utf8_and_unicode_paths_round_trip(tmp_path):
    cat = Catalog(tmp_path / "c.sqlite3")
    lib = cat.add_library(tmp_path)
    weird = os.fsdecode(b"caf\xe9 \xff/photo one.jpg")  # Latin-1 bytes: not valid UTF-8
    names = [weird, "Ünïcødé/写真 2024.jpg", "with space/x.jpg"]
    cat.write_batch("m", [_write(lib.id, n) for n in names])
    assert sorted(r.rel_path for r in cat.image_records(lib.id)) == sorted(names)
    assert dbpaths.from_db(dbpaths.to_db(weird)) == weird
    assert "\ufffd" in dbpaths.for_display(weird)
    cat.close()


def test_filters(tmp_path):
    cat = Catalog(tmp_path / "c.sqlite3")
    lib = cat.add_library(tmp_path)
    ids = cat.write_batch(
        "m",
        [
            _write(lib.id, "2019/a.jpg", exif_date="2019-06-01T10:00:00", camera_make="Canon", camera_model="EOS R5"),
            _write(lib.id, "2021/b.jpg", exif_date="2021-01-02T08:00:00", camera_make="FUJIFILM", camera_model="X-T4"),
            _write(lib.id, "2021/sub/c.jpg", exif_date="2021-12-31T23:00:00"),
            _write(lib.id, "2021b/d.jpg"),
        ],
    )
    a, b, c, d = ids
    assert cat.filtered_ids(lib.id, ImageFilter(folder="2021")) == {b, c}
    assert cat.filtered_ids(lib.id, ImageFilter(folder=str(tmp_path / "2021" / "sub"))) == {c}
    assert cat.filtered_ids(lib.id, ImageFilter(folder="/elsewhere")) == set()
    assert cat.filtered_ids(lib.id, ImageFilter(after="2020-01-01")) == {b, c}
    # d has no EXIF date: it is dated by its file time (mtime_ns=1, in 1970), so it is before 2021.
    assert cat.filtered_ids(lib.id, ImageFilter(before="2021-01-02")) == {a, d}
    assert cat.filtered_ids(lib.id, ImageFilter(camera="eos")) == {a}
    assert cat.filtered_ids(lib.id, ImageFilter(camera="fujifilm x-t4")) == {b}
    assert cat.filtered_ids(lib.id, ImageFilter(folder="2021", camera="fuji")) == {b}
    cat.close()


def test_concurrent_writers_never_see_busy(tmp_path):
    """Two connections writing at once wait on the lock instead of failing with SQLITE_BUSY."""
    path = tmp_path / "c.sqlite3"
    cat1, cat2 = Catalog(path), Catalog(path)
    lib = cat1.add_library(tmp_path)
    errors = []

    def writer(cat, prefix):
        try:
            for i in range(40):
                # Read first, then write, in one transaction: the upgrade pattern that
                # fails with SQLITE_BUSY under DEFERRED transactions.
                with cat.write() as conn:
                    conn.exec_driver_sql("SELECT count(*) FROM images").scalar()
                    conn.exec_driver_sql(
                        "INSERT INTO images (library_id, rel_path, size, mtime_ns, status, added_at, updated_at)"
                        f" VALUES ({lib.id}, '{prefix}{i}', 1, 1, 'ok', 0, 0)"
                    )
        except Exception as exc:  # pragma: no cover - the assertion below reports it
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(c, p)) for c, p in ((cat1, "a"), (cat2, "b"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(cat1.image_records(lib.id)) == 80
    assert cat1.duplicate_paths() == 0
    cat1.close()
    cat2.close()


def test_add_library_is_idempotent_and_remove_keeps_files(tmp_path):
    photo = tmp_path / "p.jpg"
    photo.write_bytes(b"not really a jpeg")
    cat = Catalog(tmp_path / "c.sqlite3")
    a = cat.add_library(tmp_path)
    b = cat.add_library(str(tmp_path) + "/")
    assert a.id == b.id and len(cat.libraries()) == 1
    cat.write_batch("m", [_write(a.id, "p.jpg", np.ones(2, np.float32))])
    cat.remove_library(a.id)
    assert cat.libraries() == []
    assert photo.read_bytes() == b"not really a jpeg"
    with cat.read() as conn:  # cascades: no orphans
        assert conn.exec_driver_sql("SELECT count(*) FROM images").scalar() == 0
        assert conn.exec_driver_sql("SELECT count(*) FROM embeddings").scalar() == 0
    cat.close()
