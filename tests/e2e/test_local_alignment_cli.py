"""`longlens train ... --local-alignment WEIGHT` (issue 21 item 3) through the real CLI, on tiny random
CLIP and BLIP models and real image files: the phrase-region loss trains the text tower beside the
global one (vision frozen), the weight is part of the run's fingerprint, an LM text tower trains its
phrases against the base's regions, and what cannot work is refused with a plain message."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from engine.backends.clip.text_tower import TEXT_TOWER_WEIGHTS
from engine.cli import main as cli_main
from engine.sceneworld.export import write_training_jsonl

RUN = ["--config", "C5", "--epochs", "1", "--batch-size", "8", "--lr", "1e-3", "--warmup-steps", "1",
       "--checkpoint-every", "0", "--device", "cpu"]


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture
def data(tmp_path) -> Path:
    return write_training_jsonl(tmp_path / "data" / "train.jsonl", tmp_path / "data" / "images", seed=7, n=16,
                                size=64)


def tensors(folder: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(folder / TEXT_TOWER_WEIGHTS), framework="pt") as fh:
        return {k: fh.get_tensor(k) for k in fh.keys()}


def history(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "history.jsonl").read_text().splitlines()]


def test_train_c5_with_local_alignment_on_a_clip_folder(cli, data, tmp_path, clip_b16_tiny_checkpoint):
    base = ["train", *RUN, "--data", str(data), "--base", str(clip_b16_tiny_checkpoint)]
    local = cli.json(*base, "--out", str(tmp_path / "local"), "--local-alignment", "1")
    plain = cli.json(*base, "--out", str(tmp_path / "plain"))
    assert local["steps"] == plain["steps"] == 2 and local["examples"] == 16
    assert local["fingerprint"]["config"]["extra"] == {"local_alignment": 1.0}
    assert plain["fingerprint"]["config"]["extra"] == {}  # off by default: the config as it was
    # The output is a CLIP text-tower override (text side only), trained differently with the local loss.
    a, b = tensors(tmp_path / "local"), tensors(tmp_path / "plain")
    assert a.keys() == b.keys() and all(k.startswith(("text_model.", "text_projection.")) for k in a)
    assert not torch.equal(a["text_projection.weight"], b["text_projection.weight"])
    first_local, first_plain = history(tmp_path / "local")[0]["loss"], history(tmp_path / "plain")[0]["loss"]
    assert first_local > first_plain + 0.5  # the global loss plus the local one
    info = json.loads((tmp_path / "local" / "training.json").read_text())
    assert info["training"]["extra"] == {"local_alignment": 1.0}

    # A resumed run must ask for the same weight: it is part of the fingerprint.
    rc, _, err = cli(*base, "--out", str(tmp_path / "local"), "--resume", "--local-alignment", "2")
    assert rc == 2 and "different config" in err and "Traceback" not in err


def test_train_c5_with_local_alignment_on_an_installed_blip(home, cli, data, tmp_path):
    from tests.e2e.conftest import TINY_MODEL

    out = tmp_path / "blip-local"
    summary = cli.json("train", *RUN, "--data", str(data), "--base", TINY_MODEL, "--out", str(out),
                       "--local-alignment", "0.5")
    assert summary["steps"] == 2 and summary["fingerprint"]["config"]["extra"] == {"local_alignment": 0.5}
    meta = json.loads((out / "text_tower.json").read_text())
    assert meta["name"] == "C5" and meta["base_model_id"] == TINY_MODEL


def test_an_lm_text_tower_trains_with_local_alignment(cli, data, tmp_path, clip_b16_tiny_checkpoint):
    from engine.models import lm_tower as L

    start = L.save_tower(L.tiny_tower("qwen2", embed_dim=32, train_layers=0), tmp_path / "tiny-qwen2")
    out = tmp_path / "lm-local"
    summary = cli.json("train", *RUN, "--data", str(data), "--base", str(clip_b16_tiny_checkpoint), "--out",
                       str(out), "--text-tower", str(start), "--train-layers", "1", "--local-alignment", "1")
    assert summary["steps"] == 2 and summary["fingerprint"]["config"]["extra"] == {"local_alignment": 1.0}
    assert L.load_tower(out).encode(["a red cube"]).shape == (1, 32)


@pytest.mark.parametrize("weight", ["101", "-1", "abc", "nan"])
def test_a_weight_out_of_range_is_a_usage_error(cli, data, tmp_path, clip_b16_tiny_checkpoint, weight):
    rc, _, err = cli("train", *RUN, "--data", str(data), "--base", str(clip_b16_tiny_checkpoint), "--out",
                     str(tmp_path / "r"), f"--local-alignment={weight}")
    assert rc == 2 and "local-alignment weight" in err and weight in err and "Traceback" not in err
    assert not (tmp_path / "r").exists()


def test_what_local_alignment_cannot_train_is_refused_plainly(cli, data, tmp_path, clip_b16_tiny_checkpoint,
                                                              monkeypatch, capsys):
    rc, _, err = cli("train", *RUN, "--data", str(data), "--base", str(clip_b16_tiny_checkpoint), "--out",
                     str(tmp_path / "r"), "--local-alignment", "1", "--grad-accum", "2")
    assert rc == 2 and "gradient caching" in err and "(--local-alignment, --grad-accum)" in err

    # A backend whose training adapter has no regions (the registry test's toy backend).
    from engine.config import get_paths
    from engine.models import registry
    from engine.models.download import write_local_manifest
    from tests.engine.test_backend_registry import COLOURS, TOY, TOY_BACKEND

    registry.register_backend(TOY_BACKEND)
    try:
        home = tmp_path / "home"
        monkeypatch.setenv("LONGLENS_HOME", str(home))
        model = get_paths(home).models / "toy"
        model.mkdir(parents=True)
        (model / "toy.json").write_text("{}", encoding="utf-8")
        write_local_manifest(model, "toy", TOY)
        from PIL import Image

        photos = tmp_path / "toy-photos"
        photos.mkdir()
        lines = []
        for name, rgb in COLOURS.items():
            Image.new("RGB", (32, 32), rgb).save(photos / f"{name}.png")
            lines += [json.dumps({"image": str(photos / f"{name}.png"), "original_caption": f"a {name} square",
                                  "paragraph": f"A {name} square fills the picture."})] * 2
        toy_data = tmp_path / "toy.jsonl"
        toy_data.write_text("\n".join(lines) + "\n", encoding="utf-8")
        capsys.readouterr()
        rc = cli_main(["train", "--config", "C5", "--data", str(toy_data), "--base", "toy", "--out",
                       str(tmp_path / "toy-run"), "--epochs", "1", "--batch-size", "6", "--device", "cpu", "--quiet",
                       "--local-alignment", "1"])
        err = capsys.readouterr().err
    finally:
        registry.unregister_backend(TOY)
    assert rc == 2 and "Traceback" not in err
    assert "longlens: error: local (phrase-region) alignment needs a model whose vision tower gives region" in err
    assert "toy" in err and err.rstrip().endswith("(--local-alignment)")
