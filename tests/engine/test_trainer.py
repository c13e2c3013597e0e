"""Trainer smoke tests on sceneworld-mini with a tiny configuration: the loss falls, the output
reloads, a resumed run equals an uninterrupted one, and grad caching equals a full batch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.backends.sceneworld_mini.network import MiniConfig, SceneWorldMini, load_model, load_text_tower
from engine.training.configs import PRESETS, load_config
from engine.training.sceneworld_mini import ArrayImages, MiniAdapter
from engine.training.trainer import Example, Trainer

COLOURS = {"red": (220, 30, 30), "green": (30, 200, 40), "blue": (30, 40, 220), "yellow": (230, 220, 30),
           "white": (250, 250, 250), "black": (10, 10, 10), "purple": (140, 30, 160), "orange": (240, 140, 20)}
TINY = MiniConfig(image_size=16, stem_channels=(8, 16), vision_width=32, vision_layers=1, text_embed=16,
                  text_width=32, text_layers=1, heads=2, mlp_ratio=2, embed_dim=32)


def colour_data(n: int, seed: int = 0):
    """Images split into a left and a right colour; texts name them (a task with real signal)."""
    rng = np.random.default_rng(seed)
    names = list(COLOURS)
    imgs = np.zeros((n, 16, 16, 3), np.uint8)
    examples = []
    for i in range(n):
        a, b = rng.choice(len(names), 2, replace=False)
        imgs[i, :, :8] = COLOURS[names[a]]
        imgs[i, :, 8:] = COLOURS[names[b]]
        para = (f"The left half of the picture is {names[a]}. The right half is {names[b]}. "
                f"Nothing else is there.")
        examples.append(Example(str(i), f"{names[a]} and {names[b]}",
                                [f"{names[a]} on the left", f"{names[b]} on the right", f"{names[a]} {names[b]}",
                                 f"a {names[a]} half", f"a {names[b]} half"],
                                [f"{names[b]} and {names[a]}"] * 5, para))
    return imgs, examples


def _model(seed=0):
    torch.manual_seed(seed)
    return SceneWorldMini(TINY)


def test_both_towers_learn_and_output_reloads(tmp_path):
    imgs, ex = colour_data(64)
    model = _model()
    cfg = PRESETS["pretrain"].with_overrides(lr=3e-3, batch_size=32, epochs=40, warmup_steps=2)
    trainer = Trainer(MiniAdapter(model), cfg, ex, ArrayImages(imgs), out_dir=tmp_path / "out")
    reports = list(trainer.run())
    losses = [h["loss"] for h in trainer.history]
    assert np.mean(losses[-5:]) < 0.75 * np.mean(losses[:5])
    assert reports[-1].stage == "done"
    reloaded = load_model(tmp_path / "out")
    x = torch.from_numpy(ArrayImages(imgs).pixels(np.arange(4)).numpy())
    model.eval()
    torch.testing.assert_close(reloaded.vision(x), model.vision(x))


def test_frozen_vision_c5_changes_only_the_text_tower(tmp_path):
    imgs, ex = colour_data(64)
    model = _model()
    vision_before = {k: v.clone() for k, v in model.vision.state_dict().items()}
    text_before = {k: v.clone() for k, v in model.text.state_dict().items()}
    cfg = load_config("C5", lr=3e-3, batch_size=32, epochs=4, warmup_steps=1)
    trainer = Trainer(MiniAdapter(model), cfg, ex, ArrayImages(imgs), out_dir=tmp_path / "c5")
    list(trainer.run())
    for k, v in model.vision.state_dict().items():
        torch.testing.assert_close(v, vision_before[k])  # BatchNorm statistics included
    assert any(not torch.equal(v, text_before[k]) for k, v in model.text.state_dict().items())
    # The saved text tower is the override format and loads onto a fresh model.
    fresh = _model()
    assert load_text_tower(fresh, tmp_path / "c5") == "C5"
    for k, v in fresh.text.state_dict().items():
        torch.testing.assert_close(v, model.text.state_dict()[k])


def test_resumed_run_equals_uninterrupted(tmp_path):
    imgs, ex = colour_data(64)
    cfg = load_config("C5", lr=3e-3, batch_size=32, epochs=3, warmup_steps=1)  # 6 steps
    full = _model()
    list(Trainer(MiniAdapter(full), cfg, ex, ArrayImages(imgs)).run())

    part = _model()
    from engine.jobs import CancelToken

    token = CancelToken()
    t = Trainer(MiniAdapter(part), cfg, ex, ArrayImages(imgs), out_dir=tmp_path / "r", checkpoint_every=1)
    for p in t.run(token):
        if p.stage == "train" and p.done >= 3:
            token.cancel()
    assert (tmp_path / "r" / "checkpoint" / "state.pt").exists()
    resumed = _model()  # a fresh process would start from the base weights again
    list(Trainer(MiniAdapter(resumed), cfg, ex, ArrayImages(imgs), out_dir=tmp_path / "r", resume=True).run())
    for k, v in resumed.text.state_dict().items():
        torch.testing.assert_close(v, full.text.state_dict()[k], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("config", ["C5", "C7", "C10"])
def test_gradient_caching_equals_one_big_batch(config):
    imgs, ex = colour_data(32)
    grads = []
    for accum in (1, 4):
        model = _model()
        cfg = load_config(config, lr=1e-3, batch_size=32, epochs=1, warmup_steps=1, grad_accum=accum)
        trainer = Trainer(MiniAdapter(model), cfg, ex, ArrayImages(imgs))
        trainer.image_embeddings = trainer.cache_image_embeddings()
        params = trainer.adapter.trainable_parameters(False, False)
        trainer.adapter.train_mode(False)
        trainer._step(np.arange(32), 0)
        grads.append([p.grad.clone() for p in params])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_tokenizer_uses_the_real_wordpiece_vocabulary():
    from engine.backends.sceneworld_mini.network import build_tokenizer

    tok = build_tokenizer()
    ids = tok("A red ball on the beach")["input_ids"]
    assert ids[0] == 101 and ids[-1] == 102 and len(tok) == 30522
    assert tok.unk_token_id not in ids  # every word is in bert-base-uncased
    assert tok.convert_ids_to_tokens(ids[1:-1]) == ["a", "red", "ball", "on", "the", "beach"]


def test_config_validation_and_files(tmp_path):
    from engine.errors import ConfigError

    assert set(PRESETS) >= {f"C{i}" for i in range(1, 11)}
    assert PRESETS["C10"].positives_per_image == 7 and PRESETS["C8"].positives_per_image == 6
    f = tmp_path / "mine.json"
    f.write_text('{"base": "C5", "lr": 0.0002, "epochs": 2}')
    cfg = load_config(str(f))
    assert cfg.name == "mine" and cfg.lr == 2e-4 and cfg.loss == "multipos"
    f.write_text('{"base": "C1", "loss": "nonsense"}')
    with pytest.raises(ConfigError, match="unknown loss"):
        load_config(str(f))
    with pytest.raises(ConfigError, match="neither a preset"):
        load_config("C11")
