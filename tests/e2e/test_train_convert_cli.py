"""`longlens train convert` through the real CLI on tiny published layouts (real JPEGs), then the
converted files through `longlens train validate` and one real training run each: DOCCI on a tiny
BLIP (C5), ShareGPT4V and DCI on a tiny sceneworld-mini (C4, C10)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.e2e.conftest import TINY_MODEL
from tests.engine.public_layouts import write_dci, write_docci, write_sharegpt4v


@pytest.fixture
def mini_dir(tmp_path) -> Path:
    from engine.backends.sceneworld_mini.network import SceneWorldMini, save_model
    from tests.engine.test_trainer import TINY

    torch.manual_seed(0)
    return save_model(SceneWorldMini(TINY), tmp_path / "mini-base")


def test_docci_convert_validate_and_train_c5_on_blip(home, cli, tmp_path):
    root = tmp_path / "docci"
    write_docci(root, n_train=6, n_test=2)
    out = tmp_path / "data" / "docci-train.jsonl"
    rc, stdout, err = cli("train", "convert", "docci", "--root", str(root), "--out", str(out), "--quiet")
    assert rc == 0, err
    assert f"wrote 6 lines to {out} (docci train): 6 records read, 0 skipped" in stdout
    rc, stdout, _ = cli("train", "validate", str(out), "--config", "C5")
    assert rc == 0 and "6 lines, 6 usable, 0 would be skipped, 0 errors" in stdout
    summary = cli.json("train", "--config", "C5", "--data", str(out), "--base", TINY_MODEL, "--out",
                       str(tmp_path / "run"), "--epochs", "1", "--batch-size", "6", "--lr", "1e-3",
                       "--warmup-steps", "1", "--quiet")
    assert (summary["steps"], summary["examples"], summary["skipped_lines"]) == (1, 6, 0)
    assert (tmp_path / "run" / "text_tower.safetensors").is_file()


def test_sharegpt4v_convert_with_skip_then_train_c4_on_sceneworld_mini(home, cli, tmp_path, mini_dir):
    root = tmp_path / "share"
    write_sharegpt4v(root, n=7, indent=4)
    out = tmp_path / "share.jsonl"
    report = cli.json("train", "convert", "sharegpt4v", "--root", str(root), "--out", str(out), "--skip", "1")
    assert (report["skipped_first"], report["written"], report["skipped"]) == (1, 6, 0)
    assert [json.loads(x)["meta"]["index"] for x in out.read_text().splitlines()] == [1, 2, 3, 4, 5, 6]
    assert cli("train", "validate", str(out), "--config", "C4")[0] == 0
    summary = cli.json("train", "--config", "C4", "--data", str(out), "--base", str(mini_dir), "--out",
                       str(tmp_path / "run"), "--epochs", "1", "--batch-size", "6", "--lr", "1e-3", "--quiet")
    assert (summary["steps"], summary["examples"]) == (1, 6)


def test_dci_convert_reports_and_trains_c10_on_what_has_summaries(home, cli, tmp_path, mini_dir):
    write_dci(tmp_path / "dl", n_train=7, n_test=2, annotations_only=(1,))
    photo = tmp_path / "dl" / "densely_captioned_images" / "photos" / "sa_1406.jpg"
    photo.unlink()
    out = tmp_path / "dci.jsonl"
    rc, stdout, err = cli("train", "convert", "dci", "--root", str(tmp_path / "dl"), "--out", str(out), "--quiet")
    assert rc == 1  # written, but a record was skipped
    assert f"image: file not found: {photo}" in err
    assert "wrote 6 lines" in stdout and "7 records read, 1 skipped (1 missing images)" in stdout
    # C10 needs generated captions: the record found only in annotations/ has none.
    rc, stdout, _ = cli("train", "validate", str(out), "--config", "C10")
    assert rc == 1 and f"{out}:2: error: positives: missing (config C10 needs 1)" in stdout
    assert "6 lines, 5 usable, 1 would be skipped" in stdout
    summary = cli.json("train", "--config", "C10", "--data", str(out), "--base", str(mini_dir), "--out",
                       str(tmp_path / "run"), "--epochs", "1", "--batch-size", "5", "--lr", "1e-3", "--quiet")
    assert (summary["steps"], summary["examples"], summary["skipped_lines"]) == (1, 5, 1)

    # --strict stops at the missing photo and writes nothing; a bad split is named with its flag.
    rc, _, err = cli("train", "convert", "dci", "--root", str(tmp_path / "dl"), "--out",
                     str(tmp_path / "strict.jsonl"), "--strict", "--quiet")
    assert rc == 2 and "image: file not found" in err and "nothing was written" in err
    assert not (tmp_path / "strict.jsonl").exists()
    rc, _, err = cli("train", "convert", "dci", "--root", str(tmp_path / "dl"), "--out", str(out), "--split", "dev")
    assert rc == 2 and "no split 'dev'" in err and "(--split)" in err


def test_convert_refuses_bad_options_and_outputs(home, cli, tmp_path):
    root = tmp_path / "docci"
    write_docci(root, n_train=2, n_test=0)
    rc, _, err = cli("train", "convert", "docci", "--root", str(root), "--out", str(root / "images" / "t.jsonl"))
    assert rc == 2 and "inside the input folder" in err
    rc, _, err = cli("train", "convert", "docci", "--root", str(root), "--out", str(tmp_path / "t.jsonl"),
                     "--limit", "0")
    assert rc == 2 and "--limit" in err
    rc, _, err = cli("train", "convert", "sharegpt4v", "--root", str(root), "--out", str(tmp_path / "t.jsonl"))
    assert rc == 2 and "exactly one ShareGPT4V .json file" in err and "(--annotations)" in err
