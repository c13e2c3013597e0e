"""Grounding with a CLIP-family model through the real CLI: a tiny random-weight Long-CLIP-B imported
into a fresh home, `longlens ground` (value-path and Grad-CAM maps on the patch grid, supports marked
uncalibrated), `longlens check` on a caption file, then `longlens grounding calibrate` on a labelled
caption file and on SceneWorld scenes, after which `ground` and `check` use the stored calibration."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from engine.config import get_paths
from engine.grounding.calibration import load_all, user_calibration_file

MODEL = "tiny-longclip"
PARAGRAPH = ("A red ball lies to the left of a small wooden bench. Two white clouds drift across the blue "
             "sky above the green grass.")


@pytest.fixture
def clip_home(tmp_path, monkeypatch, longclip_b_tiny_checkpoint, cli) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("LONGLENS_HOME", str(home))
    rc, out, err = cli("models", "import", str(longclip_b_tiny_checkpoint), "--name", MODEL)
    assert rc == 0 and "(clip)" in out, err
    return home


@pytest.fixture
def pictures(photos) -> list[Path]:
    return sorted(p for p in photos.rglob("*") if p.suffix.lower() in (".jpg", ".jpeg", ".png"))[:6]


def labelled_file(folder: Path, pictures: list[Path]) -> Path:
    lines = []
    for i, p in enumerate(pictures):
        lines += [{"image": str(p), "caption": f"a red ball next to a wooden bench, picture {i}", "label": "true"},
                  {"image": str(p), "caption": f"a green cat next to a wooden bench, picture {i}", "label": "false"}]
    text = "\n".join(json.dumps(x) for x in lines) + "\n" + json.dumps({"image": str(pictures[0]), "caption": "x y"})
    path = folder / "labelled.jsonl"
    path.write_text(text + "\n", encoding="utf-8")
    return path


def test_ground_check_and_calibrate_with_a_tiny_longclip(clip_home, pictures, cli, tmp_path):
    image = pictures[0]
    rc, stdout, err = cli("ground", str(image), PARAGRAPH, "--out", str(tmp_path / "g"), "--json", "--model", MODEL)
    assert rc == 0, err
    report = json.loads(stdout)
    assert report["model"] == MODEL and report["method"] == "value-path" and report["calibrated"] is False
    assert "supports are uncalibrated for model tiny-longclip" in err and "grounding calibrate" in err
    arrays = np.load(tmp_path / "g" / report["files"]["arrays"])
    assert arrays["patch"].shape == (len(report["phrases"]), 4, 4)  # Long-CLIP-B tiny: 64 px, patch 16
    assert np.isfinite(arrays["patch"]).all() and 0 <= arrays["patch"].min() and arrays["patch"].max() <= 1
    assert {p["text"] for p in report["phrases"]} >= {"A red ball", "a small wooden bench", "the blue sky"}

    rc, stdout, err = cli("ground", str(image), PARAGRAPH, "--out", str(tmp_path / "g2"), "--model", MODEL,
                          "--method", "gradcam")
    assert rc == 0, err
    assert "(gradcam-layer1, uncalibrated)" in stdout
    rc, _, err = cli("ground", str(image), PARAGRAPH, "--out", str(tmp_path / "g3"), "--model", MODEL,
                     "--method", "align")
    assert rc == 2 and "the map method 'align' is not one a CLIP model has" in err and "(--method)" in err

    captions = tmp_path / "caps.jsonl"
    captions.write_text("".join(json.dumps({"image": str(p), "caption": PARAGRAPH}) + "\n" for p in pictures[:2]),
                        encoding="utf-8")
    rc, stdout, err = cli("check", str(captions), "--out", str(tmp_path / "r.jsonl"), "--model", MODEL)
    assert rc == 0, err
    recs = [json.loads(x) for x in (tmp_path / "r.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [r["calibrated"] for r in recs] == [False, False] and all(r["sentences"] for r in recs)
    assert "uncalibrated" in err and "checked 2 lines" in stdout

    data = labelled_file(tmp_path, pictures)
    rc, stdout, err = cli("grounding", "calibrate", "--model", MODEL, "--data", str(data), "--json")
    summary = json.loads(stdout)
    assert rc == 1  # one line had no label: reported, the rest fitted
    assert summary["problems"] == [f"{data}:13: label: no label (expected one of: label, supported, match, correct)"]
    assert summary["levels"]["sentence"]["positives"] == summary["levels"]["sentence"]["negatives"] == 6
    assert "sentence" in summary["fitted"] and "phrase" in summary["fitted"]
    cal_file = user_calibration_file(get_paths(clip_home))
    assert summary["file"] == str(cal_file)
    stored = load_all(cal_file)["models"][summary["key"]]
    assert summary["key"].startswith(f"{MODEL}@") and stored["validation"]["n_captions"] == 12

    rc, stdout, err = cli("ground", str(image), "A red ball. Two white clouds.", "--out", str(tmp_path / "g4"),
                          "--json", "--model", MODEL)
    assert rc == 0, err
    report = json.loads(stdout)
    assert report["calibrated"] is True and "uncalibrated" not in err
    # The sentence supports are the stored Platt model applied to the sentence features.
    from engine.backends.clip.grounder import ClipGrounder
    from engine.grounding.calibration import Calibration
    from engine.models.registry import load_embedder

    g = ClipGrounder(load_embedder(MODEL, get_paths(clip_home)), Calibration.from_json(summary["key"], stored))
    from PIL import Image

    a = g.analyse(Image.open(image).convert("RGB"), "A red ball. Two white clouds.")
    probs = g.calibration.prob("sentence", a.sentence_x)
    assert [s["support"] for s in report["sentences"]] == [round(float(p), 4) for p in probs]

    rc, stdout, err = cli("check", str(captions), "--out", str(tmp_path / "r2.jsonl"), "--model", MODEL)
    recs = [json.loads(x) for x in (tmp_path / "r2.jsonl").read_text(encoding="utf-8").splitlines()]
    assert rc == 0 and all(r["calibrated"] is (("relation" in summary["fitted"])
                                               or not any(p["kind"] == "relation" for p in r["phrases"]))
                           for r in recs)


def test_calibrate_on_sceneworld_and_its_usage_errors(clip_home, cli):
    rc, stdout, err = cli("grounding", "calibrate", "--model", MODEL, "--sceneworld", "3", "--quiet")
    assert rc == 0, err
    assert "sentence  15 true / 15 false: fitted" in stdout and "stored in" in stdout
    key = next(iter(load_all(user_calibration_file(get_paths(clip_home)))["models"]))
    assert key.startswith(f"{MODEL}@")

    rc, _, err = cli("grounding", "calibrate", "--model", MODEL, "--sceneworld", "3", "--seed", "2000")
    assert rc == 2 and "validation seeds 1000-1999" in err and "(--seed)" in err
    rc, _, err = cli("grounding", "calibrate", "--model", MODEL)
    assert rc == 2 and "choose one source to calibrate on" in err and "(--data, --sceneworld)" in err
    rc, _, err = cli("grounding", "calibrate", "--model", MODEL, "--sceneworld", "3", "--data", "x.jsonl")
    assert rc == 2 and "not allowed with argument" in err
    rc, _, err = cli("grounding", "calibrate", "--model", MODEL, "--sceneworld", "0")
    assert rc == 2 and "number of scenes must be at least 1" in err
