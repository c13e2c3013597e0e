"""Review repository: caption files (JSONL/CSV) with line-numbered problems, sessions, verdicts, export."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from engine import review
from engine.catalog import Catalog
from engine.review import ReviewError


@pytest.fixture
def images(tmp_path) -> list[Path]:
    from PIL import Image

    out = []
    for i in range(3):
        p = tmp_path / "imgs" / f"img {i}.png"
        p.parent.mkdir(exist_ok=True)
        Image.new("RGB", (8, 8), (i * 80, 0, 0)).save(p)
        out.append(p)
    return out


@pytest.fixture
def cat(tmp_path):
    c = Catalog(tmp_path / "catalog.sqlite3")
    yield c
    c.close()


def test_split_sentences_is_stable():
    text = 'A red ball. "Is it?" she asked!  Two trees… and a kite'
    spans = review.split_sentences(text)
    assert [text[s:e] for s, e in spans] == ["A red ball.", '"Is it?"', "she asked!", "Two trees…", "and a kite"]
    assert review.split_sentences("   ") == []
    assert review.split_sentences("No full stop") == [(0, 12)]


def test_jsonl_problems_have_line_numbers(tmp_path, images):
    f = tmp_path / "caps.jsonl"
    f.write_text("\n".join([
        json.dumps({"image": "imgs/img 0.png", "caption": "A dark picture."}),  # relative to the file
        "{bad json",
        json.dumps(["not", "an", "object"]),
        json.dumps({"image": str(images[1])}),
        json.dumps({"image": "nope.png", "caption": "x"}),
        json.dumps({"image": str(images[2]), "caption": ""}),
        "",
        json.dumps({"image": str(images[2]), "caption": 5}),
        json.dumps({"image": str(images[2]), "caption": "  Fine.  "}),
    ]), encoding="utf-8")
    cf = review.load_caption_file(f)
    assert [(i.line_no, Path(i.image_path).name, i.caption) for i in cf.items] == [
        (1, "img 0.png", "A dark picture."), (9, "img 2.png", "Fine.")]
    assert [str(p) for p in cf.problems] == [
        "line 2: not valid JSON (Expecting property name enclosed in double quotes)",
        "line 3: expected a JSON object with an image path and a caption",
        "line 4: no caption (expected one of: caption, text, paragraph, description, original_caption)",
        "line 5: image not found: nope.png",
        "line 6: empty caption",
        "line 8: the caption is not text (got int)",
    ]


def test_csv_and_its_errors(tmp_path, images):
    f = tmp_path / "caps.csv"
    with open(f, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["id", "Image", "Caption"])
        w.writerow(["1", str(images[0]), "A picture.\nWith two lines."])  # a quoted newline
        w.writerow(["2", str(images[1])])
        w.writerow(["3", str(images[2]), "Third."])
    cf = review.load_caption_file(f)
    assert [(i.line_no, i.caption) for i in cf.items] == [(2, "A picture.\nWith two lines."), (5, "Third.")]
    assert [str(p) for p in cf.problems] == ["line 4: expected 3 columns, found 2"]
    bad = tmp_path / "bad.csv"
    bad.write_text("image,notes\na.png,hi\n", encoding="utf-8")
    with pytest.raises(ReviewError, match="bad.csv:1: the header has no 'caption' column"):
        review.load_caption_file(bad)
    with pytest.raises(ReviewError, match="must be .jsonl or .csv"):
        review.load_caption_file(tmp_path / "x.txt")
    with pytest.raises(ReviewError, match="does not exist"):
        review.load_caption_file(tmp_path / "missing.jsonl")


def _caps(tmp_path, images, captions) -> Path:
    f = tmp_path / "caps.jsonl"
    f.write_text("\n".join(json.dumps({"image": str(images[i % 3]), "caption": c})
                           for i, c in enumerate(captions)) + "\n", encoding="utf-8")
    return f


def test_session_verdicts_resume_and_progress(tmp_path, images, cat):
    f = _caps(tmp_path, images, ["A red ball. A bench.", "Two trees.", "A kite. A wall. Sky."])
    s = review.open_session(cat, f)
    assert len(s) == 3 and s.position == 0 and not s.resumed
    first = review.get_item(cat, s, 0)
    assert first.sentences == [(0, 11), (12, 20)] and first.sentence_text(1) == "A bench."
    review.set_verdict(cat, first.id, None, "faithful", "looks right")
    review.set_verdict(cat, first.id, 1, "unfaithful")
    review.set_verdict(cat, first.id, 1, "unsure", "hard to tell")  # replaces, never duplicates
    with pytest.raises(ReviewError, match="no sentence 5"):
        review.set_verdict(cat, first.id, 5, "unsure")
    with pytest.raises(ReviewError, match="unknown verdict"):
        review.set_verdict(cat, first.id, None, "great")
    second = review.get_item(cat, s, 1)
    review.set_verdict(cat, second.id, None, None, "note only, no verdict yet")
    review.set_position(cat, s, 2)
    assert review.progress(cat, s) == (1, 3)

    again = review.open_session(cat, f)
    assert again.id == s.id and again.resumed and again.position == 2
    items = review.session_items(cat, again)
    assert items[0].verdict.verdict == "faithful" and items[0].verdict.note == "looks right"
    assert items[0].sentence_verdicts == {1: items[0].sentence_verdicts[1]}
    assert items[0].sentence_verdicts[1].verdict == "unsure"
    assert items[1].verdict.verdict is None and items[1].verdict.note.startswith("note only")
    # Clearing.
    review.set_verdict(cat, first.id, None, None)
    assert review.get_item(cat, s, 0).verdict is None
    with cat.read() as conn:
        # Verdicts are keyed by the item's image and caption (schema 3), not by its row id.
        assert conn.exec_driver_sql(
            "SELECT count(*) FROM verdicts v JOIN review_items i ON v.image_key = i.image_key "
            "AND v.caption_hash = i.caption_hash WHERE i.id=?", (first.id,)).scalar() == 1


def test_an_edited_file_is_a_new_session(tmp_path, images, cat):
    f = _caps(tmp_path, images, ["One.", "Two."])
    s1 = review.open_session(cat, f)
    review.set_verdict(cat, s1.item_ids[0], None, "faithful")
    _caps(tmp_path, images, ["One.", "Two.", "Three."])
    s2 = review.open_session(cat, f)
    assert s2.id != s1.id and not s2.resumed and len(s2) == 3
    # Since schema 3 the unchanged item "One." keeps its verdict in the new version (issue 16.13).
    assert review.progress(cat, s2) == (1, 3)
    assert review.progress(cat, s1) == (1, 2)  # the old verdicts are kept


def test_a_file_with_no_usable_line_is_refused(tmp_path, cat):
    f = tmp_path / "caps.jsonl"
    f.write_text('{"image": "nope.png", "caption": "x"}\n', encoding="utf-8")
    with pytest.raises(ReviewError, match="no usable items.*line 1: image not found"):
        review.open_session(cat, f)


def test_export_jsonl_and_csv_atomically(tmp_path, images, cat):
    f = _caps(tmp_path, images, ["A red ball. A bench.", "Two trees."])
    s = review.open_session(cat, f)
    review.set_verdict(cat, s.item_ids[0], None, "faithful", 'says "yes", ok')
    review.set_verdict(cat, s.item_ids[0], 0, "unfaithful")
    out = tmp_path / "out"
    assert review.export_session(cat, s, out / "v.jsonl") == 2
    rows = [json.loads(x) for x in (out / "v.jsonl").read_text(encoding="utf-8").splitlines()]
    assert rows[0]["verdict"] == "faithful" and rows[0]["note"] == 'says "yes", ok'
    assert rows[0]["sentences"] == [
        {"index": 0, "text": "A red ball.", "verdict": "unfaithful", "note": ""},
        {"index": 1, "text": "A bench.", "verdict": None, "note": ""},
    ]
    assert rows[1]["verdict"] is None and rows[1]["line"] == 2
    assert review.export_session(cat, s, out / "v.csv") == 2
    with open(out / "v.csv", newline="", encoding="utf-8") as fh:
        table = list(csv.DictReader(fh))
    assert [(r["line"], r["scope"], r["sentence_index"], r["verdict"]) for r in table] == [
        ("1", "item", "", "faithful"), ("1", "sentence", "0", "unfaithful"), ("1", "sentence", "1", ""),
        ("2", "item", "", ""), ("2", "sentence", "0", ""),
    ]
    assert sorted(p.name for p in out.iterdir()) == ["v.csv", "v.jsonl"]  # no temp files left
    with pytest.raises(ReviewError, match="export to .jsonl or .csv"):
        review.export_session(cat, s, out / "v.xlsx")
