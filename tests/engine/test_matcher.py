"""sceneworld-mini's matching head: construction from the model, training, storage, and how the
grounder uses it (features, uncalibrated supports, calibration key)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from engine.grounding.calibration import calibration_key
from engine.grounding.matcher import (
    MATCHER_DIR,
    MatcherSettings,
    MiniMatcher,
    _sample_pairs,
    load_matcher,
    save_matcher,
    scene_texts,
    train_matcher,
)
from engine.jobs import CancelToken
from engine.models.demo import SceneWorldMiniEmbedder, load_model
from engine.models.registry import bundled_model_dir
from engine.sceneworld import generate_scenes


@pytest.fixture(scope="module")
def base_dir():
    return bundled_model_dir("sceneworld-mini")


def test_matcher_starts_from_the_models_towers(base_dir) -> None:
    model = load_model(base_dir).eval()
    m = MiniMatcher.from_model(model).eval()
    x = torch.randn(2, 3, model.cfg.image_size, model.cfg.image_size)
    with torch.no_grad():
        assert torch.allclose(m.image_tokens(x), model.vision.patch_tokens(x), atol=1e-6)
        ids = torch.tensor([[101, 2417, 2482, 102], [101, 2630, 102, 0]])
        mask = (ids != 0).long()
        logits = m(m.image_tokens(x), ids, mask)
    assert logits.shape == (2,) and torch.isfinite(logits).all()


def test_pairs_put_each_wrong_caption_beside_its_source() -> None:
    texts = [scene_texts(s) for s in generate_scenes(0, 0, 6)]
    rng = np.random.default_rng(1)
    t, owner, y = _sample_pairs(texts, rng)
    assert len(t) == len(owner) == len(y) == 4 * len(texts)
    for i in range(len(texts)):
        rows = [k for k, o in enumerate(owner) if o == i]
        source, wrong = t[rows[0]], t[rows[1]]
        assert (y[rows[0]], y[rows[1]]) == (1.0, 0.0)
        assert (wrong, source) in texts[i].negatives
        assert source in texts[i].positives


def test_object_share_favours_kind_errors() -> None:
    texts = [scene_texts(s) for s in generate_scenes(0, 0, 40)]
    with_kind = [t for t in texts if "object" in t.negative_types]
    assert with_kind

    def kind_rate(share: float) -> float:
        rng = np.random.default_rng(3)
        hits = total = 0
        for _ in range(20):
            t, owner, _ = _sample_pairs(with_kind, rng, share)
            for i, st in enumerate(with_kind):
                wrong = t[[k for k, o in enumerate(owner) if o == i][1]]
                types = [ty for (w, _), ty in zip(st.negatives, st.negative_types, strict=True) if w == wrong]
                hits += "object" in types
                total += 1
        return hits / total

    assert kind_rate(1.0) == 1.0
    assert kind_rate(0.0) < 0.6


def test_training_lowers_the_loss_saves_and_reloads(base_dir, tmp_path) -> None:
    torch.set_num_threads(1)
    s = MatcherSettings(n_scenes=64, epochs=6, batch_scenes=16, lr=1e-3, warmup_steps=2)
    steps = [p for p in train_matcher(base_dir, tmp_path / MATCHER_DIR, s) if p.stage == "train"]
    losses = [float(p.message.rsplit("loss ", 1)[1]) for p in steps]
    assert losses[-1] < losses[0], losses
    model = load_model(base_dir)
    m = load_matcher(tmp_path, model.cfg)
    assert m is not None and not m.training
    assert load_matcher(tmp_path / "nowhere", model.cfg) is None


def test_cancel_stops_before_saving(base_dir, tmp_path) -> None:
    token = CancelToken()
    out = tmp_path / MATCHER_DIR
    stages = []
    for p in train_matcher(base_dir, out, MatcherSettings(n_scenes=32, epochs=50, batch_scenes=16), cancel=token):
        stages.append(p.stage)
        if p.stage == "train":
            token.cancel()
    assert stages[-1] == "cancelled"
    assert not (out / "matcher.safetensors").exists()


def test_grounder_uses_a_present_matcher(base_dir, tmp_path) -> None:
    from engine.grounding.mini import MiniGrounder
    from engine.sceneworld import render_scene

    model_dir = tmp_path / "sceneworld-mini"
    shutil.copytree(base_dir, model_dir, ignore=shutil.ignore_patterns(MATCHER_DIR))
    plain = SceneWorldMiniEmbedder(model_dir)
    key_without = calibration_key(plain)
    assert "+matcher" not in key_without
    model = load_model(model_dir)
    torch.manual_seed(0)
    save_matcher(MiniMatcher.from_model(model), model_dir / MATCHER_DIR, {"test": True})
    emb = SceneWorldMiniEmbedder(model_dir)
    assert calibration_key(emb).startswith(key_without + "+matcher@")

    scene = generate_scenes(1000, 0, 1)[0]
    image = render_scene(scene, 256)[0]
    g = MiniGrounder(emb)  # uncalibrated: supports are the head's own probabilities
    assert g.matcher is not None and g.feature_names["sentence"][0] == "match_logit"
    feats = g.image_features(image)
    caption = scene.positives[0].text
    a = g.analyse(None, caption, feats=feats)
    logit = g.match_logits(feats, [caption])[0]
    assert a.sentence_x[0][0] == pytest.approx(float(logit), abs=1e-5)
    _, sent = g.supports(a)
    assert sent[0] == pytest.approx(1 / (1 + np.exp(-logit)), abs=1e-6)
    without = MiniGrounder(emb, use_matcher=False)
    assert without.matcher is None and len(without.analyse(None, caption, feats=without.image_features(image))
                                          .sentence_x[0]) == 3


def test_a_matcher_added_to_a_model_folder_verifies(base_dir, tmp_path) -> None:
    from engine.grounding.matcher import add_to_manifest
    from engine.models.registry import verify_dir

    model_dir = tmp_path / "sceneworld-mini"
    shutil.copytree(base_dir, model_dir)
    model = load_model(model_dir)
    save_matcher(MiniMatcher.from_model(model), model_dir / MATCHER_DIR, {"test": True})
    report = verify_dir(model_dir)
    assert not report.ok and {c.filename for c in report.failures} == {"matcher/matcher.json",
                                                                      "matcher/matcher.safetensors"}
    assert add_to_manifest(model_dir)
    assert verify_dir(model_dir).ok
    (model_dir / MATCHER_DIR / "matcher.safetensors").write_bytes(b"tampered")
    assert [c.filename for c in verify_dir(model_dir).failures] == ["matcher/matcher.safetensors"]
