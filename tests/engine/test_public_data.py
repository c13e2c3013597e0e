"""`train convert` in the engine: DOCCI, ShareGPT4V and DCI layouts (real JPEGs, JSON in the published
schemas: tests/engine/public_layouts.py) to training JSONL that the training reader accepts; bad
records named by file, line and field; strict; skip/limit; atomic output; cancel; the streamed
JSON-list reader on every chunk boundary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine import limits
from engine.evaluation import public_sets
from engine.evaluation.loaders import load_docci, load_sharegpt4v
from engine.evaluation.public_sets import PublicDataError, dci_folder, iter_json_list, read_dci
from engine.jobs import CancelToken, run_to_end
from engine.outputs import OutputPathError
from engine.training.configs import load_config
from engine.training.data import read_training_jsonl
from engine.training.public_data import ConvertError, ConvertRequest, convert_job, first_sentence
from tests.engine.public_layouts import (
    SHAREGPT4V_FILE,
    paragraph,
    sharegpt4v_entry,
    short_caption,
    write_dci,
    write_docci,
    write_sharegpt4v,
)


def convert(source: str, root: Path, out: Path, **kw) -> dict:
    last = run_to_end(convert_job(ConvertRequest(source, root, out, **kw)))
    assert last is not None and last.stage == "done"
    return last.extra


def rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()]


def test_first_sentence_uses_the_sentence_splitter():
    assert first_sentence("Dr. Smith holds a cup. It is red.") == "Dr. Smith holds a cup."
    assert first_sentence("no full stop at all") == "no full stop at all"


# -- DOCCI -------------------------------------------------------------------------------------------
def test_docci_train_split_becomes_training_lines_the_reader_accepts(tmp_path):
    root = tmp_path / "docci"
    write_docci(root, n_train=6, n_test=2)
    out = tmp_path / "out" / "docci-train.jsonl"
    s = convert("docci", root, out)
    assert (s["split"], s["records"], s["written"], s["skipped"], s["problems"]) == ("train", 6, 6, 0, [])
    got = rows(out)
    assert got[0]["paragraph"] == paragraph(0) and got[0]["original_caption"] == short_caption(0)
    assert got[0]["meta"] == {"source": "docci", "id": "train_00000", "split": "train", "licence": "CC-BY-4.0"}
    assert "positives" not in got[0] and "paragraph_score" not in got[0]
    assert (out.parent / got[5]["image"]).resolve() == (root / "images" / "train_00005.jpg").resolve()
    data = read_training_jsonl(out, load_config("C5"), strict=True)
    assert len(data.records) == 6 and data.records[2].paragraph == paragraph(2)
    test = convert("docci", root, tmp_path / "out" / "docci-test.jsonl", split="test")
    assert test["written"] == 2
    # The evaluation loader reads the same layout through the same reader: the same texts and images.
    ev = load_docci(root, "test")
    assert ev.texts == [r["paragraph"] for r in rows(tmp_path / "out" / "docci-test.jsonl")]


def test_docci_bad_records_are_skipped_and_named_by_file_line_and_field(tmp_path):
    root = tmp_path / "docci"
    ann = write_docci(root, n_train=6, n_test=0)
    lines = ann.read_text(encoding="utf-8").splitlines()
    lines[1] = "{not json"
    lines[2] = json.dumps({"example_id": "train_00002", "split": "train", "image_file": 12, "description": "x"})
    bad = json.loads(lines[3])
    del bad["description"]
    lines[3] = json.dumps(bad)
    (root / "images" / "train_00004.jpg").unlink()
    long = json.loads(lines[5])
    long["description"] = "A cup. " + "Word " * (limits.MAX_CAPTION_CHARS // 5 + 10)
    lines[5] = json.dumps(long)
    ann.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "train.jsonl"
    s = convert("docci", root, out)
    assert (s["records"], s["written"], s["skipped"], s["missing_images"]) == (6, 1, 5, 1)
    p = s["problems"]
    assert p[0].startswith(f"{ann}:2: line: not valid JSON")
    assert p[1] == f"{ann}:3: image_file: must be a non-empty string, got 12"
    assert p[2] == f"{ann}:4: description: missing"
    assert p[3] == f"{ann}:5: image: file not found: {root / 'images' / 'train_00004.jpg'}"
    assert p[4].startswith(f"{ann}:6: description -> paragraph: the caption is too long")
    assert [r["meta"]["id"] for r in rows(out)] == ["train_00000"]

    # strict: the first problem stops the run and an older output stays byte-identical.
    before = out.read_bytes()
    with pytest.raises(ConvertError, match=rf"{ann.name}:2: line: not valid JSON.*nothing was written"):
        convert("docci", root, out, strict=True)
    assert out.read_bytes() == before
    assert [f.name for f in out.parent.iterdir() if f.name.startswith(".")] == []  # no temp file left


def test_nothing_usable_is_an_error_with_the_image_hint(tmp_path):
    root = tmp_path / "docci"
    write_docci(root, n_train=3, n_test=0)
    for f in (root / "images").iterdir():
        f.unlink()
    with pytest.raises(ConvertError, match=r"3 images are missing.*docci_images\.tar\.gz"):
        convert("docci", root, tmp_path / "x.jsonl")
    assert not (tmp_path / "x.jsonl").exists()
    with pytest.raises(ConvertError, match="is the dataset folder the DOCCI folder"):
        convert("docci", tmp_path / "nowhere", tmp_path / "x.jsonl")


def test_the_output_may_not_lie_in_the_image_folder_or_be_the_annotations(tmp_path):
    root = tmp_path / "docci"
    ann = write_docci(root, n_train=2, n_test=0)
    with pytest.raises(OutputPathError, match="inside the input folder"):
        convert("docci", root, root / "images" / "train.jsonl")
    with pytest.raises(OutputPathError, match="also an input"):
        convert("docci", root, ann)
    convert("docci", root, root / "train.jsonl")  # next to the annotations is fine


# -- ShareGPT4V ----------------------------------------------------------------------------------------
def test_sharegpt4v_streams_the_list_with_line_numbers_skip_and_limit(tmp_path):
    root = tmp_path / "share"
    ann = write_sharegpt4v(root, n=6, indent=2)
    doc = json.loads(ann.read_text(encoding="utf-8"))
    doc[3]["conversations"] = doc[3]["conversations"][:1]
    text = json.dumps(doc, indent=2)
    ann.write_text(text, encoding="utf-8")
    starts = [n + 1 for n, line in enumerate(text.splitlines()) if line == "  {"]  # where each item starts
    out = tmp_path / "share.jsonl"
    s = convert("sharegpt4v", root, out)
    assert (s["written"], s["skipped"]) == (5, 1)
    assert s["problems"] == [f"{ann}:{starts[3]}: [3].conversations: has no gpt turn"]
    got = rows(out)
    assert got[0]["paragraph"] == paragraph(300)  # "\n\n" folded into one space
    assert got[0]["original_caption"] == short_caption(300)
    assert got[1]["meta"] == {"source": "sharegpt4v", "id": "sa_1", "index": 1,
                              "licence": "CC-BY-NC-4.0; use must also follow OpenAI's terms of use"}
    assert (out.parent / got[1]["image"]).resolve() == (root / "data" / "sam" / "images" / "sa_1.jpg").resolve()
    assert len(read_training_jsonl(out, load_config("C4"), strict=True).records) == 5

    # skip counts records in file order (the bad one too); limit counts written lines.
    s = convert("sharegpt4v", root, out, skip=2, limit=3)
    assert [r["meta"]["index"] for r in rows(out)] == [2, 4, 5] and s["skipped_first"] == 2
    # The evaluation loader's first-N protocol reads the same records.
    assert load_sharegpt4v(root, limit=2).texts == [r["paragraph"] for r in got[:2]]
    with pytest.raises(ConvertError, match="ShareGPT4V has no splits"):
        convert("sharegpt4v", root, out, split="train")


def test_sharegpt4v_needs_one_annotation_file_or_its_name(tmp_path):
    root = tmp_path / "share"
    write_sharegpt4v(root, n=2)
    (root / "share-captioner_coco_lcs_sam_1246k_1107.json").write_text("[]", encoding="utf-8")
    with pytest.raises(ConvertError, match="found 2") as exc:
        convert("sharegpt4v", root, tmp_path / "o.jsonl")
    assert exc.value.settings == ("annotations",)
    s = convert("sharegpt4v", root, tmp_path / "o.jsonl", annotations=root / SHAREGPT4V_FILE)
    assert s["written"] == 2


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 64, 1 << 20])
def test_the_json_list_reader_agrees_with_json_loads_at_every_chunk_size(tmp_path, monkeypatch, chunk):
    monkeypatch.setattr(public_sets, "_CHUNK", chunk)
    items = [sharegpt4v_entry(1, "a.jpg"), 12, -3.5e2, "brackets ] and , commas [", [1, [2, {"k": "]"}]],
             {"emoji": "\u00e9t\u00e9 \U0001f600 \u4e2d"}, True, None, 0]
    path = tmp_path / "list.json"
    text = json.dumps(items, indent=1, ensure_ascii=False)
    path.write_text(text, encoding="utf-8")
    got = list(iter_json_list(path, what="test"))
    assert [v for _, _, v in got] == items
    lines = text.splitlines()
    assert [lines[line - 1].strip()[:1] for _, line, _ in got] == [json.dumps(v)[:1] for v in items]
    path.write_text("[]", encoding="utf-8")
    assert list(iter_json_list(path, what="test")) == []


def test_the_json_list_reader_names_the_line_of_broken_json(tmp_path, monkeypatch):
    monkeypatch.setattr(public_sets, "_CHUNK", 5)
    path = tmp_path / "bad.json"
    path.write_text('[\n {"a": 1},\n {"a": }\n]', encoding="utf-8")
    reader = iter_json_list(path, what="test")
    assert next(reader)[2] == {"a": 1}
    with pytest.raises(PublicDataError, match=r"bad\.json:3: not valid JSON"):
        next(reader)
    path.write_text('[\n {"a": 1},\n {"a": 2', encoding="utf-8")
    with pytest.raises(PublicDataError, match=r"bad\.json:3: not valid JSON"):
        list(iter_json_list(path, what="test"))
    path.write_text('[{"a": 1}, {"a": 2}', encoding="utf-8")
    with pytest.raises(PublicDataError, match="cut short"):
        list(iter_json_list(path, what="test"))
    path.write_text('{"a": 1}', encoding="utf-8")
    with pytest.raises(PublicDataError, match=r"bad\.json:1: expected a JSON list \(test\)"):
        list(iter_json_list(path, what="test"))
    path.write_text('[1]\n[2]', encoding="utf-8")
    with pytest.raises(PublicDataError, match=r"bad\.json:2: more data after the end of the list"):
        list(iter_json_list(path, what="test"))
    path.write_bytes(b'["\xff"]')
    with pytest.raises(PublicDataError, match="not UTF-8"):
        list(iter_json_list(path, what="test"))


def test_an_item_past_the_size_bound_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(public_sets, "_CHUNK", 16)
    path = tmp_path / "big.json"
    path.write_text(json.dumps([{"a": "x" * 200}]), encoding="utf-8")
    with pytest.raises(PublicDataError, match=r"item \[0\] is longer than 64 characters"):
        list(iter_json_list(path, what="test", max_item_chars=64))


# -- DCI -----------------------------------------------------------------------------------------------
def test_dci_records_bring_the_short_caption_summaries_and_round_robin_negatives(tmp_path):
    write_dci(tmp_path, n_train=4, n_test=2, annotations_only=(1,))
    out = tmp_path / "dci.jsonl"
    s = convert("dci", tmp_path, out)
    assert (s["split"], s["written"], s["skipped"]) == ("train", 4, 0)
    first, plain = rows(out)[:2]
    assert first["original_caption"] == short_caption(400) and first["paragraph"] == paragraph(400)
    assert first["positives"][0] == "A green cup in a plain picture." and len(first["positives"]) == 3
    assert [n.split(" ")[-1] for n in first["negatives"]] == ["picture.", "v0.", "v0.", "swapped", "v1."]
    assert first["meta"] == {"source": "dci", "id": "400-data.json", "split": "train",
                             "licence": "CC-BY-NC-4.0 (annotations); images under the SA-1B licence"}
    assert "positives" not in plain and "negatives" not in plain  # only in annotations/: no summaries
    assert len(read_training_jsonl(out, load_config("C7")).records) == 3  # C7 needs 5 negatives
    assert convert("dci", tmp_path, out, split="test")["written"] == 2
    with pytest.raises(ConvertError, match=r"no split 'val'; it has 'train', 'valid', 'test'"):
        convert("dci", tmp_path, out, split="val")


def test_dci_folder_is_found_from_its_parent_or_the_repository_data_folder(tmp_path):
    base = write_dci(tmp_path / "data", n_train=1, n_test=0)
    assert dci_folder(base) == dci_folder(tmp_path / "data") == dci_folder(tmp_path) == base
    with pytest.raises(PublicDataError, match="no splits.json"):
        dci_folder(tmp_path / "elsewhere")


def test_dci_bad_records_and_missing_photos(tmp_path):
    base = write_dci(tmp_path, n_train=5, n_test=0)
    splits = json.loads((base / "splits.json").read_text())
    rec = json.loads((base / "complete" / splits["train"][1]).read_text())
    del rec["short_caption"]
    (base / "complete" / splits["train"][1]).write_text(json.dumps(rec))
    (base / "complete" / splits["train"][2]).write_text('{"image": ')
    rec = json.loads((base / "complete" / splits["train"][3]).read_text())
    rec["summaries"]["base"] = [1, 2]
    (base / "complete" / splits["train"][3]).write_text(json.dumps(rec))
    splits["train"] += ["../../etc/passwd", "999-data.json"]
    (base / "splits.json").write_text(json.dumps(splits))
    (base / "photos" / "sa_1404.jpg").unlink()
    s = convert("dci", tmp_path, tmp_path / "dci.jsonl")
    assert (s["written"], s["skipped"], s["missing_images"]) == (1, 6, 1)
    c = base / "complete"
    assert s["problems"] == [
        f"{c / '401-data.json'}: short_caption: missing",
        f"{c / '402-data.json'}:1: record: not valid JSON (Expecting value)",
        f"{c / '403-data.json'}: summaries: base must be a string or a list of strings, got [1, 2]",
        f"{c / '404-data.json'}: image: file not found: {base / 'photos' / 'sa_1404.jpg'}",
        f"{base / 'splits.json'}: train[5]: must be the name of a record file, got \"../../etc/passwd\"",
        f"{base / 'splits.json'}: train[6]: 999-data.json is in neither {c} nor {base / 'annotations'}",
    ]
    for f in (base / "photos").iterdir():
        f.unlink()
    with pytest.raises(ConvertError, match="sa_000138.tar"):
        convert("dci", tmp_path, tmp_path / "none.jsonl")


def test_the_dci_reader_reports_progress_in_records(tmp_path):
    write_dci(tmp_path, n_train=3, n_test=0)
    stream = read_dci(tmp_path, "train")
    assert (stream.total, stream.unit, stream.done) == (3, "record", 0)
    assert len(list(stream)) == 3 and stream.done == 3


# -- the job: cancel, line limit ----------------------------------------------------------------------
def test_a_cancel_writes_nothing_and_keeps_an_older_output(tmp_path):
    root = tmp_path / "docci"
    write_docci(root, n_train=4, n_test=0)
    out = tmp_path / "train.jsonl"
    out.write_text("older\n", encoding="utf-8")
    token = CancelToken()
    job = convert_job(ConvertRequest("docci", root, out), token)
    first = next(job)
    assert first.stage == "read" and first.total == (root / "docci_descriptions.jsonlines").stat().st_size
    token.cancel()
    last = run_to_end(job)
    assert last.stage == "done" and last.extra["cancelled"] is True and last.extra["written"] == 0
    assert out.read_text(encoding="utf-8") == "older\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["docci", "train.jsonl"]


def test_records_past_the_training_line_limit_are_reported(tmp_path, monkeypatch):
    monkeypatch.setattr(limits, "MAX_FILE_LINES", 3)
    root = tmp_path / "docci"
    write_docci(root, n_train=5, n_test=0)
    s = convert("docci", root, tmp_path / "t.jsonl")
    assert s["written"] == 3 and s["left_out_at_line_limit"] is True
    assert s["problems"][0].startswith(f"{root / 'docci_descriptions.jsonlines'}:4: record: more than 3")
    assert convert("docci", root, tmp_path / "t.jsonl", limit=3)["left_out_at_line_limit"] is False
