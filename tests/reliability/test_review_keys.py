"""Issue 16.13: an annotator's verdicts survive edits of the caption file.

Verdicts are keyed by (image content hash, caption text, sentence index): fixing a malformed line
as the skipped-lines dialog suggests, adding or reordering lines, editing another caption or
renaming a picture keeps every unchanged item's verdicts; each item is marked new / changed /
kept. Real caption files, real pictures, real SQLite catalogs (one made by the v2 DDL and
migrated), and the real Qt Review panel (offscreen).
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from engine import review
from engine.catalog import Catalog, db
from tests.reliability.gui_fixtures import *  # noqa: F403  (the GUI suite's fixtures)
from tests.reliability.gui_fixtures import settle

CAPTIONS = [
    "A red square sits on the left. A blue circle is beside it.",
    "Two green triangles. One of them is small.",
    "A yellow star in the middle of the picture.",
    "A black line runs across. It is thin. It ends at a dot.",
]


@pytest.fixture
def pictures(tmp_path) -> list[Path]:
    from PIL import Image

    folder = tmp_path / "pics"
    folder.mkdir()
    out = []
    for i in range(5):
        p = folder / f"p{i}.png"
        Image.new("RGB", (16, 16), (40 * i, 255 - 40 * i, 7 * i)).save(p)
        out.append(p)
    return out


def _line(image: Path, caption: str) -> str:
    return json.dumps({"image": str(image), "caption": caption})


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _malformed_then_fixed(tmp_path: Path, pictures: list[Path]) -> tuple[Path, list[str], list[str]]:
    """Three good lines and, as line 3, the fourth item with a missing closing brace."""
    good = [_line(pictures[i], CAPTIONS[i]) for i in range(4)]
    broken = good[:2] + [good[2][:-1]] + [good[3]]
    fixed = list(good)
    return tmp_path / "caps.jsonl", broken, fixed


def _annotate_three(cat: Catalog, s: review.ReviewSession) -> dict[str, tuple]:
    """A whole-item verdict on each item, a sentence verdict and a note on the first."""
    given = {}
    for index, verdict in enumerate(("faithful", "unfaithful", "unsure")):
        item = review.get_item(cat, s, index)
        review.set_verdict(cat, item.id, None, verdict, f"note {index}")
        given[item.caption] = (verdict, f"note {index}")
    first = review.get_item(cat, s, 0)
    review.set_verdict(cat, first.id, 1, "unfaithful", "the circle is green")
    return given


def test_fixing_a_malformed_line_keeps_the_other_verdicts(tmp_path, pictures):
    f, broken, fixed = _malformed_then_fixed(tmp_path, pictures)
    cat = Catalog(tmp_path / "catalog.sqlite3")
    try:
        _write(f, broken)
        s1 = review.open_session(cat, f)
        assert len(s1) == 3 and [p.line_no for p in s1.problems] == [3]
        given = _annotate_three(cat, s1)
        assert review.progress(cat, s1) == (3, 3)

        _write(f, fixed)  # as the skipped-lines dialog suggests
        s2 = review.open_session(cat, f)
        assert len(s2) == 4 and not s2.problems
        items = review.session_items(cat, s2)
        kept = [it for it in items if it.caption in given]
        assert len(kept) == 3
        for it in kept:
            assert it.verdict is not None, f"line {it.line_no} lost its verdict"
            assert (it.verdict.verdict, it.verdict.note) == given[it.caption]
        assert items[0].sentence_verdicts[1].verdict == "unfaithful"
        assert items[0].sentence_verdicts[1].note == "the circle is green"
        assert review.progress(cat, s2) == (3, 4)
        assert s1.changes is None  # the first version: nothing to compare with
        assert [it.change for it in kept] == ["kept"] * 3
        new = [it for it in items if it.caption not in given]
        assert [(it.line_no, it.change, it.verdict) for it in new] == [(3, "new", None)]
        assert str(s2.changes) == "1 new, 0 changed, 3 kept"
        assert s2.position == 2  # opens at the first item still without a verdict: the fixed line
        # The first version still reads the same.
        assert review.progress(cat, s1) == (3, 3)
    finally:
        cat.close()


def test_unchanged_items_keep_their_verdicts_whatever_else_changes(tmp_path, pictures):
    f = tmp_path / "caps.jsonl"
    cat = Catalog(tmp_path / "catalog.sqlite3")
    try:
        _write(f, [_line(pictures[i], CAPTIONS[i]) for i in range(3)])
        s1 = review.open_session(cat, f)
        _annotate_three(cat, s1)
        # Reordered, one caption edited, a line added, and picture 1 renamed (its path in the file too).
        renamed = pictures[1].with_name("renamed.png")
        pictures[1].rename(renamed)
        edited = CAPTIONS[2].replace("yellow", "golden")
        _write(f, [_line(pictures[4], "A new line about a new picture."), _line(pictures[0], CAPTIONS[0]),
                   _line(pictures[2], edited), _line(renamed, CAPTIONS[1])])
        s2 = review.open_session(cat, f)
        by_caption = {it.caption: it for it in review.session_items(cat, s2)}
        assert review.progress(cat, s2) == (2, 4)  # the two unchanged items
        assert by_caption[CAPTIONS[0]].change == "kept" and by_caption[CAPTIONS[0]].verdict.verdict == "faithful"
        assert by_caption[CAPTIONS[0]].sentence_verdicts[1].verdict == "unfaithful"
        assert by_caption[CAPTIONS[1]].change == "kept" and by_caption[CAPTIONS[1]].verdict.verdict == "unfaithful"
        assert by_caption[edited].change == "changed" and by_caption[edited].verdict is None
        assert by_caption["A new line about a new picture."].change == "new"
        assert str(s2.changes) == "1 new, 1 changed, 2 kept"
        # A verdict given in the new version is seen by the old one (same image, same caption)...
        review.set_verdict(cat, by_caption[CAPTIONS[0]].id, None, "unsure")
        assert review.get_item(cat, s1, 0).verdict.verdict == "unsure"
        # ... and going back to the old file resumes it with every verdict there.
        renamed.rename(pictures[1])
        _write(f, [_line(pictures[i], CAPTIONS[i]) for i in range(3)])
        back = review.open_session(cat, f)
        assert back.id == s1.id and back.resumed
        assert review.progress(cat, back) == (3, 3)
        # The export of the new version carries the kept verdicts.
        out = tmp_path / "v.jsonl"
        assert review.export_session(cat, s2, out) == 4
        rows = {r["caption"]: r for r in map(json.loads, out.read_text(encoding="utf-8").splitlines())}
        assert rows[CAPTIONS[1]]["verdict"] == "unfaithful" and rows[edited]["verdict"] is None
    finally:
        cat.close()


def test_an_unreadable_picture_is_keyed_by_its_path(tmp_path, pictures, monkeypatch):
    """No content to hash: the path is the key, so the verdict is kept while the file stays unreadable."""
    from engine.catalog import review_keys

    real = review_keys.sha256_file

    def unreadable(path, **kw):
        if Path(path).name == "p1.png":
            raise PermissionError(13, "Permission denied")
        return real(path, **kw)

    monkeypatch.setattr(review_keys, "sha256_file", unreadable)
    f = _write(tmp_path / "caps.jsonl", [_line(pictures[0], CAPTIONS[0]), _line(pictures[1], CAPTIONS[1])])
    cat = Catalog(tmp_path / "catalog.sqlite3")
    try:
        s1 = review.open_session(cat, f)
        review.set_verdict(cat, s1.item_ids[1], None, "faithful")
        with cat.read() as conn:
            keys = [r[0] for r in conn.exec_driver_sql("SELECT image_key FROM review_items ORDER BY line_no")]
        assert keys[0].startswith("sha256:") and keys[1] == f"path:{pictures[1].resolve()}"
        _write(f, [_line(pictures[1], CAPTIONS[1]), _line(pictures[2], CAPTIONS[2])])
        s2 = review.open_session(cat, f)
        assert review.get_item(cat, s2, 0).verdict.verdict == "faithful"
    finally:
        cat.close()


def _make_v2_catalog(path: Path, caption_file: Path, pictures: list[Path]) -> None:
    """A catalog exactly as schema 2 left it, with a session, items and verdicts."""
    con = sqlite3.connect(path)
    for sql in db._V1_DDL + db._V2_DDL:
        con.execute(sql)
    con.execute("INSERT INTO review_sessions VALUES (1, ?, 'oldhash', 1, 1.0, 2.0)", (str(caption_file),))
    items = [(10, 1, 1, str(pictures[0]), CAPTIONS[0]), (11, 1, 2, str(pictures[1]), CAPTIONS[1]),
             (12, 1, 3, str(caption_file.parent / "gone.png"), "A picture that was deleted since."),
             (13, 1, 4, str(caption_file.parent / "fifo.png"), "A picture that is a FIFO now.")]
    con.executemany("INSERT INTO review_items VALUES (?, ?, ?, ?, ?)", items)
    con.executemany("INSERT INTO verdicts VALUES (?, ?, ?, ?, ?, ?)", [
        (1, 10, None, "faithful", "good", 5.0),
        (2, 10, 1, "unfaithful", "not blue", 5.0),
        (3, 11, None, None, "a note only", 5.0),
        (4, 12, None, "unsure", "", 5.0),
    ])
    # A second, later session of the same file (an edit under schema 2 started from nothing) that
    # holds item 10's image and caption again with a newer verdict: the newer one wins.
    con.execute("INSERT INTO review_sessions VALUES (2, ?, 'newerhash', 0, 3.0, 4.0)", (str(caption_file),))
    con.execute("INSERT INTO review_items VALUES (20, 2, 1, ?, ?)", (str(pictures[0]), CAPTIONS[0]))
    con.execute("INSERT INTO verdicts VALUES (5, 20, NULL, 'unsure', 'second look', 9.0)")
    con.execute("PRAGMA user_version=2")
    con.commit()
    con.close()


@pytest.mark.timeout(120)  # hashing the pictures must never block (a FIFO in a picture's place)
def test_a_v2_catalog_keeps_its_verdicts_after_migrating(tmp_path, pictures):
    import os

    f = _write(tmp_path / "caps.jsonl", [_line(pictures[0], CAPTIONS[0]), _line(pictures[1], CAPTIONS[1])])
    os.mkfifo(tmp_path / "fifo.png")
    path = tmp_path / "catalog.sqlite3"
    _make_v2_catalog(path, f.resolve(), [p.resolve() for p in pictures])
    cat = Catalog(path)
    try:
        assert cat.backup_path is not None
        with sqlite3.connect(cat.backup_path) as bak:
            assert bak.execute("PRAGMA user_version").fetchone()[0] == 2
            assert bak.execute("SELECT count(*) FROM verdicts").fetchone()[0] == 5
        with cat.read() as conn:
            assert db.user_version(conn) == db.SCHEMA_VERSION
            rows = conn.exec_driver_sql(
                "SELECT i.line_no, i.session_id, v.sentence_index, v.verdict, v.note FROM review_items i "
                "JOIN verdicts v ON v.image_key = i.image_key AND v.caption_hash = i.caption_hash "
                "ORDER BY i.session_id, i.line_no, coalesce(v.sentence_index, -1)").all()
            keys = dict(conn.exec_driver_sql("SELECT id, image_key FROM review_items").all())
        assert rows == [
            (1, 1, None, "unsure", "second look"), (1, 1, 1, "unfaithful", "not blue"),
            (2, 1, None, None, "a note only"),
            (3, 1, None, "unsure", ""),
            (1, 2, None, "unsure", "second look"), (1, 2, 1, "unfaithful", "not blue"),
        ]
        assert keys[10].startswith("sha256:") and keys[10] == keys[20]
        assert keys[12] == f"path:{f.resolve().parent / 'gone.png'}"  # no file to hash: keyed by its path
        assert keys[13] == f"path:{f.resolve().parent / 'fifo.png'}"  # not a regular file: refused, not read
        assert cat.integrity_check() == "ok"

        # Opened in the new version: the migrated verdicts are the items' verdicts.
        s = review.open_session(cat, f)
        items = review.session_items(cat, s)
        assert (items[0].verdict.verdict, items[0].verdict.note) == ("unsure", "second look")
        assert items[0].sentence_verdicts[1].note == "not blue"
        assert items[1].verdict.verdict is None and items[1].verdict.note == "a note only"
        assert [it.change for it in items] == ["kept", "new"]  # against the later schema-2 session
    finally:
        cat.close()


# --------------------------------------------------------------------------- the Review panel


def test_review_panel_keeps_verdicts_after_fixing_a_line(qtbot, window, tmp_path, pictures):
    from PySide6.QtCore import Qt

    from desktop_app.views.review_view import ReviewView

    view = window.review_view
    window.tabs.setCurrentWidget(view)
    f, broken, fixed = _malformed_then_fixed(tmp_path, pictures)
    _write(f, broken)
    settle(qtbot, view.open_file(str(f)))
    qtbot.waitUntil(lambda: view.item is not None and view.item.index == 0, timeout=10000)
    assert "1 line(s) of caps.jsonl skipped" in view.problems_label.text()
    view.setFocus()
    for i, key in enumerate((Qt.Key.Key_1, Qt.Key.Key_2, Qt.Key.Key_3)):
        qtbot.keyClick(view, key)
        if i < 2:
            qtbot.keyClick(view, Qt.Key.Key_Space)
            qtbot.waitUntil(lambda i=i: view.item is not None and view.item.index == i + 1, timeout=10000)
    settle(qtbot, view.last_job)
    qtbot.waitUntil(lambda: view.hub.serial.activeThreadCount() == 0, timeout=10000)
    qtbot.waitUntil(lambda: view.progress.value() == 3, timeout=10000)

    _write(f, fixed)
    again = ReviewView(window.backend, window.hub)
    qtbot.addWidget(again)
    settle(qtbot, again.open_file(str(f)))
    qtbot.waitUntil(lambda: again.item is not None, timeout=10000)
    assert "4 items" in again.file_label.text() and "new review" in again.file_label.text()
    assert not again.problems_label.isVisible()
    qtbot.waitUntil(lambda: again.progress.maximum() == 4, timeout=10000)
    settle(qtbot, again.hub.call(again.backend.review_progress, again.session, serial=True))
    assert again.progress.value() == 3, "the three verdicts of the unchanged lines are gone"
    assert "1 new, 0 changed, 3 kept" in again.file_label.text()
    # It opens on the fixed line, marked new, with no verdict.
    assert again.item.line_no == 3 and again.change_label.text() == "new"
    assert all(row.verdict() is None for row in again.rows)
    marks = {}
    for index in range(4):
        settle(qtbot, again.go_to(index))
        qtbot.waitUntil(lambda index=index: again.item is not None and again.item.index == index, timeout=10000)
        marks[again.item.line_no] = (again.change_label.text(), again.rows[0].verdict())
    assert marks == {1: ("kept", "faithful"), 2: ("kept", "unfaithful"), 3: ("new", None), 4: ("kept", "unsure")}
    qtbot.waitUntil(lambda: again.hub.serial.activeThreadCount() == 0, timeout=10000)
