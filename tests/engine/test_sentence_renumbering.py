"""Catalog schema 4: sentence verdicts stored under review's old sentence split are moved to the one
splitter's sentences (a real v3 SQLite file, migrated by opening it)."""

from __future__ import annotations

import sqlite3

from engine.catalog import Catalog, db
from engine.catalog.sentence_renumbering import SPLIT_NOTE, renumber, v3_sentence_spans
from engine.text.sentences import split_sentences
from tests.engine.catalog_versions import make_catalog_at

ABBREVIATED = "Dr. Smith walks a red dog. The dog, e.g. a terrier, sits near a bench."
PLAIN = "A red dog sits. A blue bench stands."
# One sentence of 600 characters: the splitter cuts it (sentences over its limit), the old split did not.
LONG = "A dog " + "and a cat " * 59 + "sit near a bench."


def _v3_catalog(path, verdict_rows, items):
    make_catalog_at(path, 3)
    con = sqlite3.connect(path)
    con.execute("INSERT INTO review_sessions (id, caption_file, file_hash, position, created_at, updated_at) "
                "VALUES (1, '/c.jsonl', 'h', 0, 1.0, 1.0)")
    for n, (image, cap_hash, caption) in enumerate(items, start=1):
        con.execute("INSERT INTO review_items (session_id, line_no, image_path, caption, image_key, caption_hash) "
                    "VALUES (1, ?, '/p.png', ?, ?, ?)", (n, caption, image, cap_hash))
    con.executemany("INSERT INTO verdicts (image_key, caption_hash, sentence_index, verdict, note, updated_at) "
                    "VALUES (?, ?, ?, ?, ?, ?)", verdict_rows)
    con.execute("PRAGMA user_version=3")
    con.commit()
    con.close()


def _verdicts(cat):
    with cat.read() as conn:
        return conn.exec_driver_sql(
            "SELECT image_key, sentence_index, verdict, note FROM verdicts "
            "ORDER BY image_key, coalesce(sentence_index, -1)").all()


def test_the_old_split_differs_where_the_splitter_keeps_abbreviations():
    old, new = v3_sentence_spans(ABBREVIATED), split_sentences(ABBREVIATED)
    assert [ABBREVIATED[a:b] for a, b in old] == ["Dr.", "Smith walks a red dog.", "The dog, e.g.",
                                                   "a terrier, sits near a bench."]
    assert [ABBREVIATED[a:b] for a, b in new] == ["Dr. Smith walks a red dog.",
                                                   "The dog, e.g. a terrier, sits near a bench."]
    assert v3_sentence_spans(PLAIN) == split_sentences(PLAIN)
    assert len(v3_sentence_spans(LONG)) == 1 and len(split_sentences(LONG)) > 1


def test_a_v3_catalog_keeps_every_sentence_verdict_on_the_same_text(tmp_path):
    path = tmp_path / "catalog.sqlite3"
    _v3_catalog(path, [
        ("img:a", "cap:abbr", None, "faithful", "whole item", 1.0),
        ("img:a", "cap:abbr", 1, "faithful", "the dog is there", 2.0),
        ("img:a", "cap:abbr", 2, "faithful", "", 2.0),
        ("img:a", "cap:abbr", 3, "unfaithful", "no bench", 3.0),
        ("img:b", "cap:plain", 1, "unfaithful", "no bench", 4.0),
        ("img:c", "cap:long", 0, "unfaithful", "the cat is a fox", 5.0),
        ("img:d", "cap:gone", 7, "unsure", "caption not reviewed any more", 6.0),
    ], [("img:a", "cap:abbr", ABBREVIATED), ("img:b", "cap:plain", PLAIN), ("img:c", "cap:long", LONG)])
    cat = Catalog(path)
    try:
        assert cat.backup_path is not None
        with cat.read() as conn:
            assert db.user_version(conn) == db.SCHEMA_VERSION >= 4
        rows = _verdicts(cat)
    finally:
        cat.close()
    pieces = len(split_sentences(LONG))
    assert rows == [
        ("img:a", None, "faithful", "whole item"),
        # "Dr." + "Smith walks a red dog." -> sentence 0; "The dog, e.g." + "a terrier, ..." -> 1,
        # where the strictest verdict wins and both notes are kept.
        ("img:a", 0, "faithful", "the dog is there"),
        ("img:a", 1, "unfaithful", "no bench"),
        ("img:b", 1, "unfaithful", "no bench"),  # the same split: untouched
        *[("img:c", j, "unsure", f"the cat is a fox ({SPLIT_NOTE})") for j in range(pieces)],
        ("img:d", 7, "unsure", "caption not reviewed any more"),  # no caption to re-split: kept
    ]
    # The backup is the catalog as it was.
    with sqlite3.connect(cat.backup_path) as bak:
        assert bak.execute("PRAGMA user_version").fetchone()[0] == 3
        assert bak.execute("SELECT count(*) FROM verdicts").fetchone()[0] == 7


def test_merged_sentences_take_the_strictest_verdict_and_every_note():
    old = [(0, 3), (4, 10), (11, 20)]
    new = [(0, 10), (11, 20)]
    moved = renumber(old, new, {0: ("faithful", "a", 1.0), 1: ("unsure", "b", 2.0), 2: (None, "only a note", 3.0)})
    assert moved == {0: ("unsure", "a / b", 2.0), 1: (None, "only a note", 3.0)}
