"""engine.training.lm_tower_sceneworld: cached pooled features + the projection give what the
tower's own encode gives (k = 0), and C5's loss trains the projection on the cache."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")


def test_cached_features_match_the_towers_encode_and_training_lowers_the_loss():
    from engine.models.lm_tower import tiny_tower
    from engine.training.configs import PRESETS
    from engine.training.lm_tower_sceneworld import pooled_features, project, train_projection

    tower = tiny_tower("bert", embed_dim=8, train_layers=0)
    texts = ["a red cube", "two blue spheres left of a big green tree", "a cat", "the house is next to a car"] * 4
    feats = pooled_features(tower, texts, 64, batch=3)
    with torch.no_grad():
        cached = project(tower, torch.from_numpy(feats)).numpy()
    np.testing.assert_allclose(cached, tower.encode(texts, 64), atol=1e-5)

    rng = np.random.default_rng(0)
    img = torch.from_numpy(rng.standard_normal((16, 8)).astype(np.float32))
    img = img / img.norm(dim=1, keepdim=True)
    para = torch.from_numpy(feats)
    cfg = PRESETS["C5"].with_overrides(batch_size=8, lr=5e-2, epochs=15, warmup_steps=1)
    hist = train_projection(tower, img, para, para, cfg, val=(img.numpy(), feats))
    assert hist[-1]["loss"] < hist[0]["loss"] and "val_paragraph_t2i_R@1" in hist[-1]
    assert [n for n, p in tower.named_parameters() if p.requires_grad] == ["proj.weight"]  # k = 0


def test_refuses_a_test_seed(tmp_path):
    from engine.cli import main

    assert main(["dev", "train-lm-tower", "--out", str(tmp_path / "t"), "--seed", "1000"]) == 2


def test_extra_positives_train_too():
    """--paraphrase-train: each extra tensor is one more positive per image in the loss."""
    from engine.models.lm_tower import tiny_tower
    from engine.training.configs import PRESETS
    from engine.training.lm_tower_sceneworld import pooled_features, train_projection

    tower = tiny_tower("bert", embed_dim=8, train_layers=0)
    texts = ["a red cube", "two blue spheres", "a cat", "a house next to a car"] * 4
    feats = torch.from_numpy(pooled_features(tower, texts, 64))
    rng = np.random.default_rng(0)
    img = torch.from_numpy(rng.standard_normal((16, 8)).astype(np.float32))
    img = img / img.norm(dim=1, keepdim=True)
    cfg = PRESETS["C5"].with_overrides(batch_size=8, lr=5e-2, epochs=10, warmup_steps=1)
    hist = train_projection(tower, img, feats, feats, cfg, extra=[feats.flip(1), feats * 0.5])
    assert hist[-1]["loss"] < hist[0]["loss"]
