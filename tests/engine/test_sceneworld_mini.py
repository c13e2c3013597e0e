"""The shipped sceneworld-mini: it loads through the registry, matches its manifest, and its
measured quality holds (with margin) on a smaller SceneWorld test sample; the training command runs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from engine.config import get_paths
from engine.models.registry import bundled_model_dir, load_embedder, verify_dir

MODEL_DIR = bundled_model_dir("sceneworld-mini")
shipped = pytest.mark.skipif(not (MODEL_DIR / "longlens-manifest.json").exists(),
                             reason="sceneworld-mini weights are not in this checkout")
# The documented 1,000-scene test set (about 15 s here): the short-split comparison is only
# meaningful at that size — on 300 scenes the I2T change swings to -8 points while 1,000-scene
# sets with seeds 1000, 1001 and 1002 give -4.2, -4.6 and -4.3.
N_TEST = 1000
# The acceptance bars. Measured (seed 1000): long T2I R@1 0.876, long T2I gain +19.9 points,
# short R@1 change -4.2 (I2T) / +0.9 (T2I) points.
LONG_T2I_R1_MIN = 0.50
LONG_GAIN_MIN = 0.10
SHORT_DROP_MAX = 0.05


@pytest.fixture(scope="module")
def measured():
    from engine.backends.sceneworld_mini.embedder import SceneWorldMiniEmbedder
    from engine.evaluation.sceneworld import embed_scenes, evaluate

    base = SceneWorldMiniEmbedder(MODEL_DIR, device="cpu")
    data = embed_scenes(base, 1000, N_TEST)
    caps = SceneWorldMiniEmbedder(MODEL_DIR, device="cpu", text_tower_dir=MODEL_DIR / "captions-only")
    return {
        "b": {s: evaluate(base, s, 1000, N_TEST, data=data) for s in ("short", "long")},
        "a": {s: evaluate(caps, s, 1000, N_TEST, data=data) for s in ("short", "long")},
    }


@shipped
def test_loads_through_registry_and_matches_manifest(tmp_path):
    paths = get_paths(tmp_path)
    emb = load_embedder("sceneworld-mini", paths)
    assert emb.model_id == "sceneworld-mini" and emb.dim == 256
    report = verify_dir(MODEL_DIR, "sceneworld-mini")
    assert report.ok, report.summary()
    manifest = json.loads((MODEL_DIR / "longlens-manifest.json").read_text())
    assert {"model.safetensors", "sceneworld_mini.json", "captions-only/text_tower.safetensors"} <= set(manifest["files"])
    # The model itself stays small; an included query reader (text-towers/, a 22.7 M-parameter
    # MiniLM) ships as fp16, about 2 bytes a parameter (docs/language-towers.md).
    weights = list(MODEL_DIR.rglob("*.safetensors"))
    own = [f for f in weights if "text-towers" not in f.relative_to(MODEL_DIR).parts]
    assert sum(f.stat().st_size for f in own) <= 30 * 1024 * 1024
    readers = [f for f in weights if f not in own]
    assert readers and all(f.stat().st_size <= 48 * 1024 * 1024 for f in readers)
    v = emb.encode_texts(["a red ball on the beach", "three green kites under a starry night sky"])
    assert v.shape == (2, 256) and np.allclose(np.linalg.norm(v, axis=1), 1, atol=1e-5)
    assert float(v[0] @ v[1]) < 0.99


@shipped
def test_tampered_copy_is_refused(tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(MODEL_DIR, copy)
    weights = copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-3] ^= 0x10
    weights.write_bytes(bytes(data))
    report = verify_dir(copy, "sceneworld-mini")
    assert not report.ok and "model.safetensors" in report.summary()


@shipped
def test_long_text_to_image_recall(measured):
    assert measured["b"]["long"]["t2i"]["R@1"] >= LONG_T2I_R1_MIN


@shipped
def test_paragraph_fine_tuning_beats_captions_only_on_long(measured):
    gain = measured["b"]["long"]["t2i"]["R@1"] - measured["a"]["long"]["t2i"]["R@1"]
    assert gain >= LONG_GAIN_MIN


@shipped
def test_short_split_stays_close(measured):
    for d in ("i2t", "t2i"):
        assert measured["b"]["short"][d]["R@1"] >= measured["a"]["short"][d]["R@1"] - SHORT_DROP_MAX


def test_training_command_runs_a_few_steps(tmp_path):
    from engine.backends.sceneworld_mini.embedder import SceneWorldMiniEmbedder
    from engine.backends.sceneworld_mini.network import MiniConfig
    from engine.training.sceneworld_mini import train

    cfg = MiniConfig(stem_channels=(8, 16), vision_width=32, text_width=32, heads=2, mlp_ratio=2)
    report = train(tmp_path / "m", n_train=64, epochs_a=1, epochs_b=1, batch_size=32, cfg=cfg)
    assert report["stage_b"]["name"] == "C5" and report["stage_a"]["train_vision"] is True
    emb = SceneWorldMiniEmbedder(tmp_path / "m", device="cpu", text_tower_dir=tmp_path / "m" / "captions-only")
    assert emb.encode_texts(["a red ball"]).shape == (1, 256)
    assert verify_dir(tmp_path / "m", "sceneworld-mini").ok
