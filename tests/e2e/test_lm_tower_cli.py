"""`longlens train --text-tower ... --train-layers K`: an LM text tower (engine/models/lm_tower.py)
trained against a base's frozen image embeddings through the real CLI, on tiny random models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from engine.sceneworld.export import write_training_jsonl  # noqa: E402


@pytest.fixture
def data(tmp_path) -> Path:
    return write_training_jsonl(tmp_path / "data" / "train.jsonl", tmp_path / "data" / "images", seed=7, n=16,
                                size=64)


@pytest.fixture
def mini_dir(tmp_path) -> Path:
    from engine.backends.sceneworld_mini.network import SceneWorldMini, save_model
    from tests.engine.test_trainer import TINY

    torch.manual_seed(0)
    return save_model(SceneWorldMini(TINY), tmp_path / "mini-base")


def test_train_an_lm_tower_against_a_frozen_base(home, cli, data, mini_dir, tmp_path):
    from engine.models import lm_tower as L
    from tests.engine.test_trainer import TINY

    start = L.save_tower(L.tiny_tower("qwen2", embed_dim=TINY.embed_dim, train_layers=0), tmp_path / "tiny-qwen2")
    out = tmp_path / "run"
    summary = cli.json("train", "--config", "C4", "--data", str(data), "--base", str(mini_dir), "--out", str(out),
                       "--epochs", "1", "--batch-size", "8", "--lr", "1e-3", "--text-tower", str(start),
                       "--train-layers", "2")
    assert summary["steps"] == 2 and summary["examples"] == 16
    meta = json.loads((out / L.TOWER_CONFIG_FILE).read_text())
    assert meta["tower"]["train_layers"] == 2 and meta["training"]["name"] == "C4"
    run = json.loads((out / "run.json").read_text())
    assert run["fingerprint"]["text_tower"] == str(start) and run["fingerprint"]["train_layers"] == 2
    tower = L.load_tower(out)
    assert tower.encode(["a red cube"]).shape == (1, TINY.embed_dim)


def test_lm_tower_options_are_checked(home, cli, data, mini_dir, tmp_path):
    base = ["train", "--config", "C4", "--data", str(data), "--base", str(mini_dir), "--out", str(tmp_path / "r"),
            "--batch-size", "8"]
    rc, _, err = cli(*base, "--train-layers", "1")
    assert rc != 0 and "--train-layers" in err
    (tmp_path / "old-tower").mkdir()
    rc, _, err = cli(*base, "--text-tower", "minilm", "--init-text-tower", str(tmp_path / "old-tower"))
    assert rc != 0 and "--text-tower" in err and "--init-text-tower" in err
    rc, _, err = cli(*base, "--text-tower", "no-such-tower")
    assert rc != 0 and "no-such-tower" in err


def test_sentence_sampling_is_part_of_the_run(home, cli, data, mini_dir, tmp_path):
    out = tmp_path / "run"
    cli.json("train", "--config", "C5", "--data", str(data), "--base", str(mini_dir), "--out", str(out),
             "--epochs", "1", "--batch-size", "8", "--text-tower", "minilm", "--train-layers", "0",
             "--sentence-sampling", "0.5")
    run = json.loads((out / "run.json").read_text())
    assert run["fingerprint"]["config"]["extra"] == {"sentence_sampling": 0.5}
    rc, _, err = cli("train", "--config", "C5", "--data", str(data), "--base", str(mini_dir), "--out",
                     str(tmp_path / "r2"), "--sentence-sampling", "1.5")
    assert rc == 2 and "sentence-sampling fraction" in err and "1.5" in err
