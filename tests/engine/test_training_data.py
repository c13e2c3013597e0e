"""Training JSONL schema and validator: good lines load, bad lines are reported by line number and
field and skipped (or abort with strict), and what counts as an error follows the configuration."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.sceneworld.export import write_training_jsonl
from engine.training.configs import load_config
from engine.training.data import TrainingDataError, read_training_jsonl


@pytest.fixture(scope="module")
def good_file(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("data")
    return write_training_jsonl(root / "train.jsonl", root / "images", seed=3, n=6, size=32)


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _write(path: Path, lines: list[str]) -> Path:
    """Next to the good file, so its relative image paths resolve."""
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_a_sceneworld_export_is_valid_and_loads_every_field(good_file):
    data = read_training_jsonl(good_file, load_config("C10"))
    rows = _rows(good_file)
    assert data.problems == [] and data.n_lines == 6 and len(data.records) == 6
    rec, row = data.records[2], rows[2]
    assert rec.line == 3
    assert rec.image == good_file.parent / row["image"] and rec.image.is_file()
    assert rec.original == row["original_caption"]
    assert list(rec.positives) == row["positives"] and len(rec.negatives) == 5
    assert rec.paragraph == row["paragraph"] and rec.paragraph_score == 10.0
    ex = rec.to_example()
    assert (ex.key, ex.original, ex.paragraph) == (row["image"], row["original_caption"], row["paragraph"])
    assert ex.positives == row["positives"] and ex.negatives == row["negatives"]


def test_bad_lines_are_reported_with_line_numbers_and_skipped(tmp_path, good_file):
    rows = _rows(good_file)
    img = str((good_file.parent / rows[0]["image"]).resolve())  # absolute paths are allowed too

    def line(**changes) -> str:
        r = {**rows[1], "image": img, **changes}
        return json.dumps({k: v for k, v in r.items() if v is not ...})

    lines = [
        line(),                                         # 1 ok
        '{"image": "x.png", "original_caption": ',      # 2 broken JSON
        "[1, 2, 3]",                                    # 3 not an object
        line(image=...),                                # 4 no image field
        line(image="images/does-not-exist.png"),        # 5 image file missing
        "",                                             # 6 blank: ignored
        line(positives="a string, not a list"),         # 7 wrong type
        line(original_caption="   "),                   # 8 empty caption
        line(paragraph_score="high"),                   # 9 score not a number
        line(negatives=["fine", 3, "", "x", "y"]),      # 10 list with a non-string
        line(),                                         # 11 ok
    ]
    path = _write(good_file.parent / "mixed.jsonl", lines)
    data = read_training_jsonl(path)
    assert [r.line for r in data.records] == [1, 11]
    assert data.n_lines == 10 and data.skipped_lines == [2, 3, 4, 5, 7, 8, 9, 10]
    errors = {(p.line, p.field) for p in data.errors}
    assert errors == {(2, "line"), (3, "line"), (4, "image"), (5, "image"), (7, "positives"),
                      (8, "original_caption"), (9, "paragraph_score"), (10, "negatives")}
    reasons = {p.line: p.reason for p in data.errors}
    assert "not valid JSON" in reasons[2] and "JSON object" in reasons[3]
    assert "missing" in reasons[4] and "not found" in reasons[5] and "does-not-exist.png" in reasons[5]
    assert "list of strings" in reasons[7] and "empty" in reasons[8] and "number" in reasons[9]
    assert "item 1" in reasons[10]
    # The second good line repeats the first's image: kept, with a warning.
    assert any(p.line == 11 and p.field == "image" and "line 1" in p.reason for p in data.warnings)
    assert data.problems[0].format(path).startswith(f"{path}:2: error: line: ")


def test_strict_aborts_and_names_file_and_line(tmp_path, good_file):
    lines = good_file.read_text(encoding="utf-8").splitlines()
    lines.insert(3, '{"image": 5}')
    path = _write(good_file.parent / "strict.jsonl", lines)
    assert len(read_training_jsonl(path).records) == 6  # not strict: skipped, the rest loads
    with pytest.raises(TrainingDataError, match=r"strict\.jsonl:4: error: image: must be a string"):
        read_training_jsonl(path, strict=True)


def test_what_is_an_error_depends_on_the_configuration(tmp_path, good_file):
    rows = _rows(good_file)
    no_para = dict(rows[0], paragraph="")
    three_negs = dict(rows[1], negatives=rows[1]["negatives"][:3])
    no_pos = {k: v for k, v in rows[2].items() if k != "positives"}
    path = _write(good_file.parent / "cfg.jsonl", [json.dumps(r) for r in (no_para, three_negs, no_pos, rows[3])])

    plain = read_training_jsonl(path)  # no configuration: nothing is unusable, only warned about
    assert len(plain.records) == 4 and not plain.errors
    assert {(p.line, p.field) for p in plain.warnings} == {(1, "paragraph"), (2, "negatives"), (3, "positives")}

    c1 = read_training_jsonl(path, load_config("C1"))  # original caption only
    assert len(c1.records) == 4 and not c1.errors
    c5 = read_training_jsonl(path, load_config("C5"))  # needs the paragraph
    assert c5.skipped_lines == [1] and "config C5 needs it" in c5.errors[0].reason
    c7 = read_training_jsonl(path, load_config("C7"))  # needs 5 hard negatives
    assert c7.skipped_lines == [2] and "needs 5" in c7.errors[0].reason
    c2 = read_training_jsonl(path, load_config("C2"))  # needs generated captions
    assert c2.skipped_lines == [3]


def test_counts_and_scores_outside_the_format_are_warnings(tmp_path, good_file):
    rows = _rows(good_file)
    odd = dict(rows[0], positives=rows[0]["positives"][:4], paragraph_score=11)
    no_score = {k: v for k, v in rows[1].items() if k != "paragraph_score"}
    data = read_training_jsonl(_write(good_file.parent / "w.jsonl", [json.dumps(odd), json.dumps(no_score)]),
                               load_config("C9"))
    assert len(data.records) == 2 and not data.errors
    reasons = {(p.line, p.field): p.reason for p in data.warnings}
    assert "4 given" in reasons[(1, "positives")] and "outside" in reasons[(1, "paragraph_score")]
    assert reasons[(2, "paragraph_score")] == "missing"
    assert data.records[0].paragraph_score == 11.0 and data.records[1].paragraph_score is None


def test_unreadable_or_empty_files_are_clear_errors(tmp_path):
    with pytest.raises(TrainingDataError, match="does not exist"):
        read_training_jsonl(tmp_path / "nope.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n\n", encoding="utf-8")
    with pytest.raises(TrainingDataError, match="no training lines"):
        read_training_jsonl(tmp_path / "empty.jsonl")



def test_a_line_that_is_not_utf8_is_reported_and_skipped(tmp_path, good_file):
    lines = good_file.read_bytes().splitlines(keepends=True)
    bad = tmp_path / "mixed.jsonl"
    bad.write_bytes(lines[0] + b'{"image": "caf\xe9.jpg"}\n' + b"".join(lines[1:]))
    data = read_training_jsonl(bad, check_images=False)
    assert len(data.records) == len(lines) and data.skipped_lines == [2]
    assert "not UTF-8" in data.errors[0].reason and data.errors[0].line == 2
    with pytest.raises(TrainingDataError, match=r"mixed\.jsonl:2: .*not UTF-8"):
        read_training_jsonl(bad, strict=True, check_images=False)
