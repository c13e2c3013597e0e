"""The C1–C10 study helpers on a tiny sceneworld-mini base: train a configuration on SceneWorld
scenes from the base's captions-only tower, reuse the frozen image embeddings, evaluate a tower."""

from __future__ import annotations

import json

import pytest
import torch

from engine.backends.sceneworld_mini.embedder import SceneWorldMiniEmbedder
from engine.backends.sceneworld_mini.network import SceneWorldMini, save_model, save_text_tower
from engine.training import study
from tests.engine.test_trainer import TINY

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: tiny models, one torch thread


@pytest.fixture
def base(tmp_path):
    torch.manual_seed(0)
    model = SceneWorldMini(TINY)
    folder = save_model(model, tmp_path / "base", {"training_report": {"learned_temperature": 0.05}})
    torch.manual_seed(1)
    save_text_tower(SceneWorldMini(TINY), folder / "captions-only", "captions-only")  # a different text tower
    return folder


def test_train_config_on_sceneworld_and_evaluate(tmp_path, base, monkeypatch):
    calls = []
    real = study._embed_training_images
    monkeypatch.setattr(study, "_embed_training_images", lambda *a, **k: calls.append(1) or real(*a, **k))
    study._MEMO.clear()

    out = study.train_config_on_sceneworld(base, "C5", tmp_path / "runs" / "C5", n_train=64, epochs=1,
                                           batch_size=32, lr=1e-3, warmup_steps=1, log=None)
    assert out == tmp_path / "runs" / "C5"
    info = json.loads((out / "study.json").read_text())
    assert info["init_text_tower"] == str(base / "captions-only")  # starts from the stage-(a) tower
    assert info["config"]["temperature"] == 0.05 and info["config"]["name"] == "C5"  # the base's own τ
    emb = SceneWorldMiniEmbedder(base, device="cpu", text_tower_dir=out)
    assert emb.text_model_id == "sceneworld-mini+C5"
    cached = list((tmp_path / "runs" / ".sceneworld-embeddings").glob("sceneworld-s0-n64-*.npy"))
    assert len(cached) == 1

    # A second configuration reuses the rendered scenes' embeddings (in memory, then on disk).
    study.train_config_on_sceneworld(base, "C1", tmp_path / "runs" / "C1", n_train=64, epochs=1, batch_size=32,
                                     log=None)
    assert len(calls) == 1
    study._MEMO.clear()
    study.train_config_on_sceneworld(base, "C4", tmp_path / "runs" / "C4", n_train=64, epochs=1, batch_size=32,
                                     init_text_tower=None, log=None)
    assert len(calls) == 1  # read back from the .npy
    assert json.loads((tmp_path / "runs" / "C4" / "study.json").read_text())["init_text_tower"] is None

    result = study.evaluate_on_sceneworld(base, out, seed=1001, n=6)
    assert set(result) == {"short", "long"}
    assert result["long"]["model"] == "base+C5" and result["long"]["n_images"] == 6
    with pytest.raises(ValueError, match="training seed"):
        study.train_config_on_sceneworld(base, "C5", tmp_path / "bad", n_train=64, seed=1000, log=None)
