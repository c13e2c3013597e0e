"""Issue 21 item 2: the scaling experiment's plumbing. Every training-set size gets about the same
number of optimizer steps (so a run stays within about an hour on 2 cores and the sizes differ in
data only); `--kinds` splits the work between processes; the document is rendered from every
measurement on disk, with each model's epochs, the shipped reference apart from today's recipe."""

from __future__ import annotations

import json
import math

import pytest

from engine.backends.sceneworld_mini.network import CONFIG_FILE, MODEL_FILE
from engine.training import caft


def _steps(n: int, schedule: dict[str, int], batch: int = 128) -> int:
    return math.ceil(n / batch) * (schedule["epochs_a"] + schedule["epochs_b"])


def test_every_size_trains_about_the_reference_steps():
    assert caft.equal_step_schedule(caft.REFERENCE_SCENES) == dict(zip(("epochs_a", "epochs_b"),
                                                                       caft.REFERENCE_EPOCHS, strict=True))
    reference = _steps(caft.REFERENCE_SCENES, caft.equal_step_schedule(caft.REFERENCE_SCENES))
    for n in caft.SIZES:
        schedule = caft.equal_step_schedule(n)
        assert min(schedule.values()) >= 1
        assert abs(_steps(n, schedule) - reference) / reference < 0.1, (n, schedule)


def _measurement(model: str, n: int, local: float, epochs: tuple[int, int], t2i: float) -> dict:
    r = {"t2i_R@1": t2i, "i2t_R@1": t2i / 2}
    g = {"pointing_game": 0.5, "pointing_game_centre_baseline": 0.4, "mask_iou": 0.1, "faithfulness_auc": 0.6,
         "faithfulness_auc_by_error": {"attribute": 0.6}, "n_scenes": 10}
    return {"model": model, "n_train_scenes": n, "local_alignment": local, "epochs": {"a": epochs[0], "b": epochs[1]},
            "retrieval": {"n_scenes": 10, "long": r, "short": r}, "truncation_t2i_R@1": {"20": t2i / 3},
            "grounding": g}


def _trained(folder, m: dict) -> None:
    folder.mkdir(parents=True)
    (folder / MODEL_FILE).write_bytes(b"weights")
    (folder / CONFIG_FILE).write_text("{}")
    (folder / "measurement.json").write_text(json.dumps(m))


def test_the_document_gathers_every_measured_model_with_its_epochs(tmp_path, monkeypatch):
    out = tmp_path / "caft"
    _trained(out / "baseline-6000", _measurement("baseline-6000", 6000, 0.0, (4, 3), 0.41))
    _trained(out / "caft-6000", _measurement("caft-6000", 6000, 1.0, (4, 3), 0.52))  # another process's
    _trained(out / "caft-w4-6000", _measurement("caft-w4-6000", 6000, 4.0, (4, 3), 0.3))  # another local weight
    _trained(out / "shipped-20000", _measurement("shipped-20000", 20000, 0.0, (12, 8), 0.876))
    monkeypatch.setattr(caft, "measure", lambda *a, **k: pytest.fail("a measured model was measured again"))
    monkeypatch.setattr(caft, "train_baseline", lambda *a, **k: pytest.fail("a trained model was trained again"))
    doc = tmp_path / "caft.md"
    doc.write_text("# CAFT\n\nkept\n")
    assert caft.main(["--out", str(out), "--sizes", "6000", "--kinds", "baseline,shipped", "--doc", str(doc),
                      "--shipped", str(out / "shipped-20000")]) == 0
    text = doc.read_text()
    rows = [line for line in text.splitlines() if line.startswith("| 6,000") or line.startswith("| 20,000")]
    assert "kept" in text and len(rows) == 8  # four models, in the table and in the truncation table
    assert rows[0].startswith("| 6,000 | 4 + 3 | sceneworld-mini (today's recipe) | 0.410")
    assert rows[1].startswith("| 6,000 | 4 + 3 | CAFT-style variant | 0.520")
    assert rows[2].startswith("| 6,000 | 4 + 3 | CAFT-style variant (local weight 4) | 0.300")
    assert rows[3].startswith("| 20,000 | 12 + 8 | sceneworld-mini as shipped | 0.876")


def test_kinds_are_checked(tmp_path, capsys):
    with pytest.raises(SystemExit):
        caft.main(["--out", str(tmp_path), "--kinds", "baseline,best"])
    err = capsys.readouterr().err
    assert "--kinds: best is not one of baseline, caft, " in err and "caft-shipped-schedule" in err


def test_steps_of_another_size_matches_that_sizes_reference_steps_in_its_own_folder(tmp_path, monkeypatch):
    """--steps-of 6000: the 20,000-scene pair trains as many steps as 12 + 8 epochs on 6,000 scenes
    (so it can be set beside the 6,000-scene pair at the shipped epochs), into folders of their own."""
    schedule = caft.equal_step_schedule(20000, 6000)
    reference = _steps(6000, dict(zip(("epochs_a", "epochs_b"), caft.REFERENCE_EPOCHS, strict=True)))
    assert schedule == {"epochs_a": 4, "epochs_b": 2}
    assert abs(_steps(20000, schedule) - reference) / reference < 0.05
    trained = []

    def fake_train(folder, n, **kw):
        trained.append((folder.name, n, kw.get("epochs_a"), kw.get("epochs_b")))
        _trained(folder, _measurement(folder.name, n, kw.get("local_weight", 0.0), (kw["epochs_a"], kw["epochs_b"]),
                                      0.5))

    monkeypatch.setattr(caft, "train_baseline", fake_train)
    monkeypatch.setattr(caft, "train_variant", fake_train)
    assert caft.main(["--out", str(tmp_path), "--sizes", "20000", "--kinds", "baseline,caft",
                      "--steps-of", "6000"]) == 0
    assert trained == [("baseline-20000-steps6000", 20000, 4, 2), ("caft-20000-steps6000", 20000, 4, 2)]
    with pytest.raises(SystemExit):
        caft.main(["--out", str(tmp_path), "--steps-of", "0"])


def test_a_model_measured_before_epochs_were_recorded_gets_them_from_its_training_report(tmp_path):
    """Rows gathered from disk for the document (not measured by this process) show their epochs too."""
    folder = tmp_path / "baseline-2000"
    m = _measurement("baseline-2000", 2000, 0.0, (12, 8), 0.065)
    del m["epochs"]
    _trained(folder, m)
    (folder / CONFIG_FILE).write_text(json.dumps({"training_report": {"stage_a": {"epochs": 12},
                                                                       "stage_b": {"epochs": 8}}}))
    assert caft.read_measurement(folder)["epochs"] == {"a": 12, "b": 8}
    doc = tmp_path / "caft.md"
    doc.write_text("# CAFT\n")
    caft.write_section(doc, [caft.read_measurement(folder)], "make caft")
    assert "| 2,000 | 12 + 8 | sceneworld-mini (today's recipe) | 0.065" in doc.read_text()
