"""Issue 21: the parts of a text, the phrase-region alignment loss, the trainer's use of it, and the
CAFT-style sceneworld-mini variant (tiny configurations)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from engine.backends.sceneworld_mini.network import (
    MiniConfig,
    SceneWorldMini,
    build_tokenizer,
    load_model,
    save_model,
    tokenize_with_offsets,
)
from engine.errors import ModelIntegrityError
from engine.grounding.parts import part_to_whole_weights, phrase_token_masks, pool_phrases, text_parts
from engine.training.configs import PRESETS, load_config
from engine.training.local_alignment import local_alignment_loss, local_scores
from engine.training.sceneworld_mini import ArrayImages, MiniAdapter
from engine.training.trainer import Trainer
from tests.engine.test_trainer import TINY, colour_data

CAFT_TINY = MiniConfig(**{**TINY.__dict__, "region_scales": (1,), "text_pooling": "part_to_whole"})
TEXT = "A red cat sits next to a blue box. The sky is dark."


def _tokens(texts, max_tokens=64):
    return tokenize_with_offsets(build_tokenizer(), texts, max_tokens)


def test_phrase_masks_cover_exactly_the_chunker_phrases():
    ids, mask, offsets = _tokens([TEXT])
    tok = build_tokenizer()
    masks, valid = phrase_token_masks([TEXT], offsets, max_phrases=8)
    phrases = [TEXT[a:b] for a, b in text_parts(TEXT).phrases]
    assert phrases[:2] == ["A red cat", "a blue box"]
    assert int(valid[0].sum()) == len(phrases)
    for k, phrase in enumerate(phrases):
        words = tok.decode(ids[0][masks[0, k] > 0].tolist())
        assert words == phrase.lower()
        assert masks[0, k].sum() == pytest.approx(1.0)
    # A phrase truncated away has no tokens: not valid (and the relation "next to" is no phrase).
    _, _, short = _tokens([TEXT], max_tokens=6)
    _, valid_short = phrase_token_masks([TEXT], short, max_phrases=8)
    assert int(valid_short[0].sum()) == 1
    _, valid_capped = phrase_token_masks([TEXT], offsets, max_phrases=1)
    assert valid_capped.shape == (1, 1) and valid_capped[0, 0]


def test_part_to_whole_weights_count_each_sentence_and_phrase_once():
    texts = [TEXT, "and then with of"]  # the second has no phrase at all
    ids, mask, offsets = _tokens(texts)
    w = part_to_whole_weights(texts, offsets, mask.numpy())
    np.testing.assert_allclose(w.sum(axis=1), 1.0, rtol=1e-6)
    masks, valid = phrase_token_masks(texts[:1], offsets[:1], max_phrases=8)
    parts = text_parts(TEXT)
    # Sentence 1 holds two phrases, sentence 2 one: 1/4, 1/4 and 1/2 of the weight.
    shares = sorted(float(w[0][masks[0, k] > 0].sum()) for k in range(int(valid[0].sum())))
    assert parts.phrase_sentence == (0, 0, 1)
    assert shares == pytest.approx([0.25, 0.25, 0.5])
    # Function words between phrases get nothing; a sentence with no phrase is the mean of its
    # own words (not the special tokens).
    assert w[0][ids[0] == build_tokenizer().convert_tokens_to_ids("sits")].sum() == 0
    np.testing.assert_allclose(w[1][1:5], 0.25)
    assert w[1][0] == 0 and w[1][5:].sum() == 0


def test_local_scores_equal_a_brute_force_loop():
    g = torch.Generator().manual_seed(0)
    regions = F.normalize(torch.randn(3, 5, 8, generator=g), dim=-1)
    phrases = F.normalize(torch.randn(6, 20, 8, generator=g), dim=-1)
    counts = [2, 1, 0, 3, 7, 18]  # every phrase-count group local_scores works in
    valid = torch.tensor([[k < c for k in range(20)] for c in counts])
    got = local_scores(regions, phrases, valid)
    for b in range(3):
        for t in range(6):
            best = [float((regions[b] @ phrases[t, p]).max()) for p in range(20) if valid[t, p]]
            assert float(got[b, t]) == pytest.approx(np.mean(best) if best else 0.0, abs=1e-6)


def test_local_loss_prefers_the_image_whose_best_region_matches_the_phrase():
    # Two images, each one region equal to one text's phrase and the others random: the loss
    # with the true owners is lower than with swapped owners, and its gradient reaches the regions.
    g = torch.Generator().manual_seed(1)
    phrases = F.normalize(torch.randn(2, 1, 16, generator=g), dim=-1)
    regions = F.normalize(torch.randn(2, 4, 16, generator=g), dim=-1)
    regions[0, 2], regions[1, 0] = phrases[0, 0], phrases[1, 0]
    regions.requires_grad_(True)
    valid = torch.ones(2, 1, dtype=torch.bool)
    right = local_alignment_loss(regions, phrases, valid, torch.tensor([0, 1]), 10.0)
    wrong = local_alignment_loss(regions, phrases, valid, torch.tensor([1, 0]), 10.0)
    assert float(right) < float(wrong)
    right.backward()
    assert regions.grad is not None and float(regions.grad.abs().sum()) > 0
    # Texts without phrases are left out; none at all gives 0 with a graph.
    none = local_alignment_loss(regions, phrases, torch.zeros(2, 1, dtype=torch.bool), torch.tensor([0, 1]), 10.0)
    assert float(none) == 0.0 and none.requires_grad


def test_pool_phrases_is_the_mean_of_the_phrase_token_states():
    ids, mask, offsets = _tokens([TEXT])
    states = torch.randn(1, ids.shape[1], 8)
    phrases, valid = pool_phrases(states, [TEXT], offsets, max_phrases=4)
    masks, _ = phrase_token_masks([TEXT], offsets, 4)
    first = states[0][torch.from_numpy(masks[0, 0] > 0)].mean(0)
    torch.testing.assert_close(phrases[0, 0], F.normalize(first, dim=-1))
    assert valid[0].tolist() == [True, True, True, False]


def test_region_embeddings_are_the_patches_then_their_pools():
    torch.manual_seed(0)
    model = SceneWorldMini(MiniConfig(**{**TINY.__dict__, "region_scales": (1,)})).eval()
    x = torch.randn(2, 3, 16, 16)
    glob, regions = model.vision.region_embeddings(x, (1,))
    patches = model.vision.patch_embeddings(x)
    assert regions.shape == (2, patches.shape[1] + 1, patches.shape[2])
    torch.testing.assert_close(regions[:, :-1], patches)
    torch.testing.assert_close(regions[:, -1], patches.mean(1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(glob, model.vision(x))  # fine to coarse: the same global embedding


def test_bad_variant_configs_are_refused():
    with pytest.raises(ModelIntegrityError, match="region_scales"):
        MiniConfig.from_dict({**TINY.__dict__, "region_scales": [3]})  # does not divide the 2x2 grid
    with pytest.raises(ModelIntegrityError, match="text_pooling"):
        MiniConfig.from_dict({**TINY.__dict__, "text_pooling": "max"})
    from engine.errors import ConfigError

    with pytest.raises(ConfigError, match="local_alignment"):
        PRESETS["C5"].with_overrides(extra={"local_alignment": -1})


def test_variant_saves_reloads_and_encodes_identically(tmp_path):
    torch.manual_seed(0)
    model = SceneWorldMini(CAFT_TINY).eval()
    save_model(model, tmp_path / "m")
    again = load_model(tmp_path / "m")
    assert again.cfg.region_scales == (1,) and again.cfg.text_pooling == "part_to_whole"
    from engine.backends.sceneworld_mini.embedder import SceneWorldMiniEmbedder

    emb = SceneWorldMiniEmbedder(tmp_path / "m", device="cpu")
    a = MiniAdapter(model)
    with torch.no_grad():
        direct = a.encode_texts([TEXT, "a green ball"], 64).numpy()
        glob, _, _ = a.encode_text_phrases([TEXT, "a green ball"], 64)
    np.testing.assert_allclose(emb.encode_texts([TEXT, "a green ball"], 64), direct, atol=1e-5)
    np.testing.assert_allclose(glob.numpy(), direct, atol=1e-5)
    # Part-to-whole pooling differs from the plain mean on the same weights.
    plain = SceneWorldMini(TINY).eval()
    plain.load_state_dict(model.state_dict())
    with torch.no_grad():
        mean = MiniAdapter(plain).encode_texts([TEXT], 64).numpy()
    assert not np.allclose(mean, direct[:1], atol=1e-4)


def ball_data(n: int):
    """colour_data's pictures with texts that name things (the chunker finds phrases in them)."""
    imgs, ex = colour_data(n)
    for e in ex:
        a, b = e.original.split(" and ")
        e.original = f"a {a} ball and a {b} ball"
        e.positives = [f"a {a} ball on the left", f"a {b} ball on the right"]
        e.paragraph = f"A {a} ball is on the left. A {b} ball is on the right."
    return imgs, ex


def _train(local: float, preset: str, tmp_path, epochs: int = 3):
    imgs, ex = ball_data(64)
    torch.manual_seed(0)
    model = SceneWorldMini(CAFT_TINY)
    extra = {"local_alignment": local} if local else {}
    if preset == "pretrain":
        cfg = PRESETS["pretrain"].with_overrides(lr=3e-3, batch_size=32, epochs=epochs, warmup_steps=1, extra=extra)
    else:
        cfg = load_config(preset, lr=3e-3, batch_size=32, epochs=epochs, warmup_steps=1, extra=extra)
    trainer = Trainer(MiniAdapter(model), cfg, ex, ArrayImages(imgs), out_dir=tmp_path / f"{preset}-{local}")
    list(trainer.run())
    return model, trainer


def test_local_alignment_changes_training_and_both_stages_run(tmp_path):
    with_local, t1 = _train(1.0, "pretrain", tmp_path)
    without, t0 = _train(0.0, "pretrain", tmp_path)
    assert t1.history[0]["loss"] > t0.history[0]["loss"]  # the local term is added
    differs = [not torch.equal(a, b) for a, b in zip(with_local.vision.parameters(), without.vision.parameters(),
                                                      strict=True)]
    assert any(differs)  # its gradient reaches the vision tower
    # Frozen vision (stage b): the regions are cached, only the text tower changes.
    model, trainer = _train(1.0, "C5", tmp_path, epochs=2)
    assert trainer.image_regions is not None and trainer.image_regions.dtype == torch.float16
    assert trainer.image_regions.shape[1] == 4 + 1  # the 2x2 patches and the 1x1 pool


def test_local_alignment_needs_a_region_adapter():
    class NoRegions:
        pass

    imgs, ex = colour_data(64)
    cfg = PRESETS["C5"].with_overrides(batch_size=32, extra={"local_alignment": 1.0})
    with pytest.raises(ValueError, match="region tokens"):
        Trainer(NoRegions(), cfg, ex, ArrayImages(imgs))  # type: ignore[arg-type]


def test_the_variant_trains_from_pictures_and_texts_only(tmp_path, monkeypatch):
    """No region supervision: the masks the renderer draws are poisoned (any use raises), the
    trainer sees only Examples (texts) and uint8 pictures, and nothing on the local-alignment path
    imports the scene generator (where boxes and masks live)."""
    import ast
    from pathlib import Path

    import engine.sceneworld as sceneworld
    import engine.training.trainer as trainer_module
    from engine.training.caft import train_variant

    class Poisoned:
        def __getattr__(self, name):
            raise AssertionError(f"training touched the masks ({name})")

        def __getitem__(self, key):
            raise AssertionError("training indexed the masks")

        def __array__(self, *a, **k):
            raise AssertionError("training converted the masks")

    real_render = sceneworld.render_scene
    monkeypatch.setattr(sceneworld, "render_scene", lambda scene, size: (real_render(scene, size)[0], Poisoned()))
    seen = []
    real_init = trainer_module.Trainer.__init__

    def spy(self, adapter, cfg, examples, images=None, **kw):
        seen.append((cfg, examples, images))
        real_init(self, adapter, cfg, examples, images, **kw)

    monkeypatch.setattr(trainer_module.Trainer, "__init__", spy)
    import engine.training.sceneworld_mini as swm
    monkeypatch.setattr(swm, "Trainer", trainer_module.Trainer)
    cfg = MiniConfig(**{**TINY.__dict__, "image_size": 32, "region_scales": (2,), "text_pooling": "part_to_whole"})
    train_variant(tmp_path / "v", 32, cfg=cfg, epochs_a=1, epochs_b=1, batch_size=16)
    assert [c.extra.get("local_alignment") for c, _, _ in seen] == [1.0, 1.0]  # both stages
    for _, examples, images in seen:
        assert {f for e in examples for f in vars(e)} == {"key", "original", "positives", "negatives", "paragraph"}
        assert all(isinstance(e.original, str) and isinstance(e.paragraph, str) for e in examples)
        assert images.renders.dtype == np.uint8 and images.renders.shape[1:] == (32, 32, 3)
    assert load_model(tmp_path / "v").cfg.text_pooling == "part_to_whole"
    root = Path(__file__).resolve().parents[2]
    for module in ("engine/training/local_alignment.py", "engine/grounding/parts.py"):
        tree = ast.parse((root / module).read_text(encoding="utf-8"))
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not any(n.startswith("engine.sceneworld") for n in names), module
