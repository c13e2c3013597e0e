"""`longlens ground` and `longlens check` end to end with the shipped sceneworld-mini: files on
disk, JSON on stdout, clear errors for missing images, bad lines and empty captions while the
other lines are still processed. Also `search --rerank` with sceneworld-mini's matching head and BLIP's ITM."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from engine.models.registry import bundled_model_dir

pytestmark = pytest.mark.skipif(not (bundled_model_dir("sceneworld-mini") / "model.safetensors").is_file(),
                                reason="sceneworld-mini weights are not in this checkout")
MODEL = ["--model", "sceneworld-mini", "--device", "cpu"]


@pytest.fixture
def scene_files(tmp_path, monkeypatch) -> tuple[Path, list]:
    from engine.sceneworld import generate_scenes, render_scene

    monkeypatch.setenv("LONGLENS_HOME", str(tmp_path / "home"))
    folder = tmp_path / "imgs"
    folder.mkdir()
    scenes = generate_scenes(2000, 0, 3)
    for i, s in enumerate(scenes):
        render_scene(s, 256)[0].save(folder / f"s{i}.png")
    return folder, scenes


def test_ground_writes_overlays_arrays_and_json(cli, scene_files, tmp_path):
    folder, scenes = scene_files
    out = tmp_path / "g"
    text = scenes[0].paragraph.text
    rc, stdout, err = cli("ground", str(folder / "s0.png"), text, "--out", str(out), "--json", *MODEL)
    assert rc == 0, err
    report = json.loads(stdout)
    assert report == json.loads((out / "grounding.json").read_text(encoding="utf-8"))
    assert report["calibrated"] and report["verdict"] in ("supported", "partly supported", "not supported")
    assert len(report["sentences"]) == len(scenes[0].paragraph.sentences)
    for p in report["phrases"]:
        assert text[p["start"]:p["end"]] == p["text"] and 0 <= p["support"] <= 1
    overlays = report["files"]["overlays"]
    assert len(overlays) == len(report["phrases"])
    from PIL import Image

    assert Image.open(out / overlays[0]).size == (256, 256)
    arrays = np.load(out / report["files"]["arrays"])
    assert arrays["patch"].shape == (len(overlays), 16, 16)
    assert arrays["image"].shape == (len(overlays), 256, 256)
    assert 0 <= arrays["patch"].min() and arrays["patch"].max() <= 1

    rc, stdout, _ = cli("ground", str(folder / "s0.png"), text, "--out", str(tmp_path / "g2"), *MODEL)
    assert rc == 0 and "verdict" in stdout and "sentence 0" in stdout


def test_ground_errors(cli, scene_files, tmp_path):
    folder, _ = scene_files
    rc, _, err = cli("ground", str(folder / "missing.png"), "a red ball", "--out", str(tmp_path / "x"), *MODEL)
    assert rc == 2 and "image not found" in err
    rc, _, err = cli("ground", str(folder / "s0.png"), "   ", "--out", str(tmp_path / "x"), *MODEL)
    assert rc == 2 and "empty" in err
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"not an image")
    rc, _, err = cli("ground", str(bad), "a red ball", "--out", str(tmp_path / "x"), *MODEL)
    assert rc == 2 and "cannot read image" in err


def test_check_jsonl_processes_good_lines_and_reports_bad_ones(cli, scene_files, tmp_path):
    folder, scenes = scene_files
    lines = [
        json.dumps({"image": "imgs/s0.png", "caption": scenes[0].paragraph.text}),
        json.dumps({"image": "imgs/nope.png", "caption": "a red ball"}),
        "{not json",
        json.dumps({"image": "imgs/s1.png", "caption": "  "}),
        json.dumps({"caption": "no image key"}),
        "",
        json.dumps({"path": str(folder / "s1.png"), "text": scenes[1].positives[0].text}),
    ]
    src = tmp_path / "captions.jsonl"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    report, page = tmp_path / "out" / "report.jsonl", tmp_path / "out" / "report.html"
    rc, stdout, err = cli("check", str(src), "--out", str(report), "--html", str(page), *MODEL)
    assert rc == 1  # some lines failed; the others are in the report
    recs = [json.loads(x) for x in report.read_text(encoding="utf-8").splitlines()]
    assert [r["line"] for r in recs] == [1, 2, 3, 4, 5, 7]
    by_line = {r["line"]: r for r in recs}
    assert by_line[1]["verdict"] in ("supported", "partly supported", "not supported")
    assert by_line[7]["verdict"] != "error" and by_line[7]["sentences"]
    assert "image not found" in by_line[2]["error"]
    assert "not valid JSON" in by_line[3]["error"]
    assert "empty" in by_line[4]["error"]
    assert "no image path" in by_line[5]["error"]
    for line in (2, 3, 4, 5):
        assert by_line[line]["verdict"] == "error" and f":{line}:" in err
    good = by_line[1]
    assert all({"text", "support", "low_support"} <= set(s) for s in good["sentences"])
    assert all(p["low_support"] == (p["support"] < 0.5) for p in good["phrases"])
    html = page.read_text(encoding="utf-8")
    assert "line 2" in html and "image not found" in html
    files_dir = page.with_name("report_files")
    assert (files_dir / good["files"]["overlays"][0]).is_file()
    assert "checked 6 lines" in stdout


def test_check_csv(cli, scene_files, tmp_path):
    folder, scenes = scene_files
    src = folder.parent / "caps.csv"
    caption = scenes[2].positives[0].text
    src.write_text(f'image,caption\nimgs/s2.png,"{caption}"\nimgs/s2.png,\n', encoding="utf-8")
    out = tmp_path / "r.jsonl"
    rc, _, err = cli("check", str(src), "--out", str(out), "--threshold", "0.4", *MODEL)
    recs = [json.loads(x) for x in out.read_text(encoding="utf-8").splitlines()]
    assert rc == 1 and len(recs) == 2
    assert recs[0]["caption"] == caption and recs[0]["verdict"] != "error"
    assert recs[1]["verdict"] == "error" and "empty" in recs[1]["error"]


def test_check_missing_file(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("LONGLENS_HOME", str(tmp_path / "home"))
    rc, _, err = cli("check", str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "r.jsonl"), *MODEL)
    assert rc == 2 and f"{tmp_path / 'none.jsonl'} does not exist" in err


def test_search_reranks_with_the_mini_matching_head(cli, scene_files):
    from engine.backends.sceneworld_mini.rerank import MINI_RERANK_WEIGHT

    folder, scenes = scene_files
    rc, _, err = cli("index", str(folder), "--quiet", *MODEL)
    assert rc == 0, err
    rc, out, err = cli("search", scenes[0].paragraph.text, "--rerank", "--json", *MODEL)
    assert rc == 0 and "re-ranking" not in err, err
    result = json.loads(out)
    assert result["reranked"] == 3 and result["results"][0]["path"].endswith("s0.png")
    rr = [h["rerank_score"] for h in result["results"]]
    assert rr == sorted(rr, reverse=True)
    # The order score is the ANN cosine plus a small multiple of the head's logit.
    for h in result["results"]:
        assert abs(h["rerank_score"] - h["score"]) < MINI_RERANK_WEIGHT * 40
    rc, out, err = cli("search", scenes[0].paragraph.text, "--no-rerank", "--json", *MODEL)
    assert rc == 0 and json.loads(out)["reranked"] == 0


def test_search_reranks_with_blip_itm(home, photos, cli):
    """The tiny random BLIP has cross-attention, hence an ITM head: --rerank re-orders the top k
    by ITM and reports both scores; without it (or with --no-rerank) the ANN order stays."""
    from tests.e2e.conftest import TINY_MODEL

    assert cli("index", str(photos), "--model", TINY_MODEL, "--quiet")[0] == 0
    query = "A red ball lies on the grass next to a wooden bench."
    rc, out, err = cli("search", query, "--model", TINY_MODEL, "--top", "5", "--rerank", "--rerank-k", "8",
                       "--json")
    assert rc == 0, err
    got = json.loads(out)
    assert got["reranked"] == 8 and len(got["results"]) == 5
    rr = [h["rerank_score"] for h in got["results"]]
    assert rr == sorted(rr, reverse=True) and all(0 <= s <= 1 for s in rr)
    assert all("ann_rank" in h and "score" in h for h in got["results"])
    rc, out, _ = cli("search", query, "--model", TINY_MODEL, "--top", "5", "--no-rerank", "--json")
    plain = json.loads(out)
    assert plain["reranked"] == 0 and all("rerank_score" not in h for h in plain["results"])
    scores = [h["score"] for h in plain["results"]]
    assert scores == sorted(scores, reverse=True)
    # The re-ranked list is a re-ordering of the ANN top 8 (the default is no re-ranking).
    rc, out, _ = cli("search", query, "--model", TINY_MODEL, "--top", "8", "--json")
    top8 = {h["path"] for h in json.loads(out)["results"]}
    assert {h["path"] for h in got["results"]} <= top8
