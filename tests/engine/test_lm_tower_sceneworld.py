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


def _no_dropout(tower):
    for m in tower.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    return tower


def _layer_run(source_kind: str, sampling: bool = False):
    """train_tower_layers on a tiny BERT tower, texts through PrefixCache or LiveTexts."""
    from engine.models.lm_tower import tiny_tower
    from engine.training.configs import PRESETS
    from engine.training.data import sample_sentences
    from engine.training.lm_tower_sceneworld import train_tower_layers
    from engine.training.prefix_cache import LiveTexts, PrefixCache

    torch.manual_seed(0)
    tower = _no_dropout(tiny_tower("bert", embed_dim=8, train_layers=1))
    lm_params = [p for n, p in zip(*zip(*tower.named_parameters(), strict=True), strict=True)
                 if p.requires_grad and not n.startswith(("proj.", "norm."))]
    caps = ["a red cube", "two blue spheres", "a cat", "a house next to a car"] * 4
    paras = [f"{c}. There is a tree. The picture shows a big table." for c in caps]

    def make(texts):
        return PrefixCache(tower, texts, 32, 1, batch=5) if source_kind == "cache" else LiveTexts(tower, texts, 32)

    fixed = make(paras)

    def of_epoch(epoch):
        if not sampling:
            return fixed
        rng = np.random.default_rng([0, epoch])
        return make([sample_sentences(p, rng, 0.5) for p in paras])

    rng = np.random.default_rng(0)
    img = torch.from_numpy(rng.standard_normal((16, 8)).astype(np.float32))
    img = img / img.norm(dim=1, keepdim=True)
    cfg = PRESETS["C5"].with_overrides(batch_size=8, lr=5e-2, epochs=6, warmup_steps=1)
    before = {n: p.detach().clone() for n, p in tower.named_parameters()}
    hist = train_tower_layers(tower, img, make(caps), of_epoch, cfg, lm_params=lm_params, lm_lr=1e-2,
                              val=(img.numpy(), make(paras)))
    return tower, before, hist


@pytest.mark.parametrize("sampling", [False, True])
def test_training_on_cached_prefixes_is_training_on_the_full_forward(sampling):
    cached_tower, before, cached = _layer_run("cache", sampling)
    live_tower, _, live = _layer_run("live", sampling)
    assert cached[-1]["loss"] < cached[0]["loss"]
    for a, b in zip(cached, live, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-4)
        assert a["val_paragraph_t2i_R@1"] == b["val_paragraph_t2i_R@1"]
    after = dict(cached_tower.named_parameters())
    top = "layer.2." if any("layer.2." in n for n in after) else None
    for n, p in after.items():
        changed = not torch.equal(before[n], p)
        trained = n.startswith("proj.") or (top is not None and top in n)
        assert changed == trained, f"{n}: changed={changed}"
    for (n, p), (_, q) in zip(after.items(), live_tower.named_parameters(), strict=True):
        if n.endswith("key.bias"):  # softmax ignores a key bias: its gradient is rounding noise, AdamW scales it up
            continue
        assert torch.allclose(p, q, atol=1e-4), n
