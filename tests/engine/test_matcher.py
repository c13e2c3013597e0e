"""sceneworld-mini's matching head: construction from the model, training, storage, and how the
grounder uses it (features, uncalibrated supports, calibration key)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from engine.backends.sceneworld_mini.embedder import SceneWorldMiniEmbedder
from engine.backends.sceneworld_mini.network import load_model
from engine.grounding.calibration import calibration_key
from engine.jobs import CancelToken
from engine.models.registry import bundled_model_dir
from engine.sceneworld import generate_scenes
from engine.training.matcher_training import (
    MATCHER_DIR,
    MatcherSettings,
    MiniMatcher,
    _sample_pairs,
    load_matcher,
    save_matcher,
    scene_texts,
    train_matcher,
)


@pytest.fixture(scope="module")
def base_dir():
    return bundled_model_dir("sceneworld-mini")


@pytest.fixture
def headless_dir(base_dir, tmp_path):
    """A copy of the bundled model folder without its matching head."""
    model_dir = tmp_path / "sceneworld-mini"
    shutil.copytree(base_dir, model_dir, ignore=shutil.ignore_patterns(MATCHER_DIR))
    return model_dir


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
    s = MatcherSettings(n_scenes=64, epochs=6, batch_scenes=16, lr=1e-3, warmup_steps=2, dense_weight=0.0,
                        align_weight=0.0)
    steps = [p for p in train_matcher(base_dir, tmp_path / MATCHER_DIR, s) if p.stage == "train"]
    losses = [sum(float(v) for v in p.message.rsplit("loss ", 1)[1].split(" + ")) for p in steps]
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


def test_grounder_uses_a_present_matcher(headless_dir) -> None:
    from engine.backends.sceneworld_mini.grounder import MiniGrounder
    from engine.sceneworld import render_scene

    model_dir = headless_dir
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
    from engine.models.registry import verify_dir
    from engine.training.matcher_training import add_to_manifest

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


def test_patch_labels_name_the_object_under_each_patch() -> None:
    from engine.sceneworld import render_scene
    from engine.training.matcher_training import (
        LABEL_FIELDS,
        MIN_PATCH_COVER,
        _label_vocab,
        patch_cover,
        patch_labels,
    )

    vocab = _label_vocab()
    for scene in generate_scenes(0, 0, 5):
        _, masks = render_scene(scene, 128)
        cover = patch_cover(masks, 8)
        covers = cover >= MIN_PATCH_COVER
        labels = patch_labels(scene, cover)
        assert labels.shape == (64, len(LABEL_FIELDS)) and covers.shape == (len(scene.objects), 64)
        for k, o in enumerate(scene.objects):
            if masks[k].mean() < 0.02:
                continue  # mostly hidden: may own no patch
            mine = np.flatnonzero(covers[k] & (labels[:, 0] == vocab["kind"].index(o.kind) + 1))
            assert len(mine), (o.kind, o.box_norm)
            row = labels[mine[0]]
            assert row[1] == vocab["colour"].index(o.colour) + 1 and row[3] == vocab["size"].index(o.size) + 1
        outside = ~covers.any(axis=0)
        assert (labels[outside, 0] == 0).all()


def test_align_loss_targets_the_referred_patches(base_dir) -> None:
    from engine.backends.sceneworld_mini.network import build_tokenizer, pixels_from_uint8
    from engine.training.matcher_training import _align_loss, render_with_labels

    scenes = generate_scenes(0, 0, 4)
    images, _, covers = render_with_labels(scenes, 64, 8)
    texts = [scene_texts(s) for s in scenes]
    for st, sc in zip(texts, scenes, strict=True):
        assert st.aligned and all(ids and max(ids) < len(sc.objects) for _, ids in st.aligned)
        assert not set(st.misaligned) & {t for t, _ in st.aligned}
    model = load_model(base_dir)
    torch.manual_seed(0)
    m = MiniMatcher.from_model(model)
    tokens = m.image_tokens(torch.from_numpy(pixels_from_uint8(images)))
    loss = _align_loss(m, tokens, texts, covers, np.random.default_rng(0), build_tokenizer())
    assert loss.ndim == 0 and torch.isfinite(loss)
    loss.backward()
    assert m.align_img.weight.grad is not None and m.align_img.weight.grad.abs().sum() > 0
    assert m.vision.stem[0].weight.grad.abs().sum() > 0  # it teaches the vision tokens too


def test_alignment_training_reloads_and_feeds_the_grounder(headless_dir) -> None:
    from engine.backends.sceneworld_mini.grounder import MAP_GRID, MiniGrounder
    from engine.sceneworld import render_scene

    torch.set_num_threads(1)
    model_dir = headless_dir
    s = MatcherSettings(n_scenes=48, epochs=4, batch_scenes=16, warmup_steps=2, dense_weight=1.0, align_weight=1.0)
    steps = [p for p in train_matcher(model_dir, model_dir / MATCHER_DIR, s) if p.stage == "train"]
    parts = [[float(v) for v in p.message.rsplit("loss ", 1)[1].split(" + ")] for p in steps]
    assert all(len(x) == 3 for x in parts)  # match, patch labels, alignment
    assert parts[-1][1] < parts[0][1] and parts[-1][2] < parts[0][2], parts
    emb = SceneWorldMiniEmbedder(model_dir)
    g = MiniGrounder(emb)
    assert g.matcher is not None and g.matcher.has_alignment and g.aligned
    scene = generate_scenes(1000, 0, 1)[0]
    image = render_scene(scene, 256)[0]
    feats = g.image_features(image)
    a = g.analyse(None, scene.positives[0].text, feats=feats)
    assert len(a.sentence_x[0]) == len(g.feature_names["sentence"]) == 5
    nouns = [k for k, lv in enumerate(a.phrase_levels) if lv == "phrase"]
    assert nouns and all(len(a.phrase_x[k]) == 3 for k in nouns)
    claims = [a.chunking.phrases[k].claim for k in nouns]
    maps, best = g.align_maps(feats, claims)
    assert maps.shape == (len(nouns), MAP_GRID, MAP_GRID) and ((maps >= 0) & (maps <= 1)).all()
    assert [a.phrase_x[k][1] for k in nouns] == pytest.approx(best.tolist(), abs=1e-5)
    aligned = MiniGrounder(emb, method="align")
    b = aligned.analyse(None, scene.positives[0].text, feats=feats)
    assert b.maps.shape[1:] == (MAP_GRID, MAP_GRID)
    np.testing.assert_allclose(b.maps[nouns[0]], (maps[0] - maps[0].min()) / (maps[0].max() - maps[0].min()),
                               atol=1e-5)


def test_a_head_without_alignment_still_loads(headless_dir) -> None:
    from safetensors.torch import load_file, save_file

    from engine.backends.sceneworld_mini.grounder import MiniGrounder
    from engine.errors import ModelIntegrityError

    model_dir = headless_dir
    model = load_model(model_dir)
    save_matcher(MiniMatcher.from_model(model), model_dir / MATCHER_DIR, {"settings": {"align_weight": 1.0}})
    weights = model_dir / MATCHER_DIR / "matcher.safetensors"
    state = load_file(str(weights))
    save_file({k: v for k, v in state.items() if not k.startswith("align_")}, str(weights))
    m = load_matcher(model_dir, model.cfg)
    assert m is not None and not m.has_alignment
    g = MiniGrounder(SceneWorldMiniEmbedder(model_dir))
    assert not g.aligned and "min_phrase_align" not in g.feature_names["sentence"]
    with pytest.raises(ValueError, match="alignment"):
        MiniGrounder(SceneWorldMiniEmbedder(model_dir), method="align")
    from engine.models.registry import rerank_support

    ok, why = rerank_support(SceneWorldMiniEmbedder(model_dir))
    assert not ok and "without" in why
    save_file({**state, "stray.weight": torch.zeros(1)}, str(weights))
    with pytest.raises(ModelIntegrityError, match="do not fit"):
        load_matcher(model_dir, model.cfg)


def test_rounds_continue_each_other_on_fresh_seeds(headless_dir) -> None:
    import json

    from engine.training.matcher_training import main

    torch.set_num_threads(1)
    model_dir = headless_dir
    assert main(["--model-dir", str(model_dir), "--n-scenes", "32", "--epochs", "1", "--rounds", "2"]) == 0
    meta = json.loads((model_dir / MATCHER_DIR / "matcher.json").read_text(encoding="utf-8"))
    assert meta["settings"]["seed"] == 1
    assert meta["continued_from"]["settings"]["seed"] == 0 and meta["continued_from"]["continued_from"] is None
    assert sorted(p.name for p in (model_dir / MATCHER_DIR).iterdir()) == ["matcher.json", "matcher.safetensors"]
    with pytest.raises(SystemExit):
        main(["--model-dir", str(model_dir), "--rounds", "0"])
    with pytest.raises(SystemExit):
        main(["--model-dir", str(model_dir), "--init-from", str(model_dir / "nowhere")])
