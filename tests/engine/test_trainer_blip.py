"""Trainer smoke tests on a tiny random BLIP: the adapter's text path is BlipEmbedder's, the loss
falls, only the text tower changes, the output loads as BlipEmbedder's text-tower override, and a
resumed run equals an uninterrupted one."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.backends.blip.embedder import BlipEmbedder
from engine.backends.blip.training import BlipAdapter
from engine.jobs import CancelToken
from engine.training.configs import load_config
from engine.training.trainer import Trainer
from tests.engine.test_trainer import colour_data

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: tiny models, one torch thread


class CancelAfter(CancelToken):
    """Cancelled from the (n+1)-th check on: the trainer checks once before every step."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.checks, self.n = 0, n

    @property
    def cancelled(self) -> bool:
        self.checks += 1
        return self.checks > self.n


def _adapter(checkpoint) -> BlipAdapter:
    return BlipAdapter.from_checkpoint(checkpoint, device="cpu")


@pytest.fixture(scope="module")
def colour_set():
    """64 two-colour images at the tiny model's 64 px, with their texts."""
    imgs, examples = colour_data(64)
    return np.kron(imgs, np.ones((1, 4, 4, 1), np.uint8)), examples


def _image_embeddings(adapter: BlipAdapter, imgs: np.ndarray) -> torch.Tensor:
    from PIL import Image

    pixels = adapter.embedder.preprocess([Image.fromarray(a) for a in imgs])
    with torch.no_grad():
        return adapter.encode_pixels(torch.from_numpy(pixels))


def test_adapter_embeds_exactly_like_blip_embedder(blip_tiny_checkpoint, colour_set):
    adapter = _adapter(blip_tiny_checkpoint)
    embedder = BlipEmbedder(blip_tiny_checkpoint, device="cpu")
    texts = ["a red ball", "The left half is green. The right half is blue. " * 8, "x"]
    adapter.model.eval()
    with torch.no_grad():
        for budget in (8, 77, 128):
            np.testing.assert_allclose(adapter.encode_texts(texts, budget).numpy(),
                                       embedder.encode_texts(texts, max_tokens=budget), rtol=1e-5, atol=1e-6)
    from PIL import Image

    pil = [Image.fromarray(a) for a in colour_set[0][:4]]
    np.testing.assert_allclose(_image_embeddings(adapter, colour_set[0][:4]).numpy(), embedder.encode_images(pil),
                               rtol=1e-5, atol=1e-6)


def test_c5_trains_the_text_tower_only_and_the_output_is_an_override(tmp_path, blip_tiny_checkpoint, colour_set):
    imgs, examples = colour_set
    adapter = _adapter(blip_tiny_checkpoint)
    before = {k: v.clone() for k, v in adapter.model.state_dict().items()}
    emb = _image_embeddings(adapter, imgs)
    cfg = load_config("C5", lr=2e-3, batch_size=32, epochs=30, warmup_steps=2)
    trainer = Trainer(adapter, cfg, examples, image_embeddings=emb, out_dir=tmp_path / "c5")
    reports = list(trainer.run())
    losses = [h["loss"] for h in trainer.history]
    assert len(losses) == 60 and np.mean(losses[-5:]) < 0.6 * np.mean(losses[:5])
    train_reports = [p for p in reports if p.stage == "train"]
    assert train_reports and all(p.rate and p.eta_s is not None and "loss" in p.extra and "lr" in p.extra
                                 for p in train_reports)
    after = adapter.model.state_dict()
    changed = {k for k in after if not torch.equal(after[k], before[k])}
    assert changed and all(k.startswith(("text_encoder.", "text_proj.")) for k in changed)

    # BlipEmbedder loads the result as a text-tower override and embeds like the trained adapter.
    assert {p.name for p in (tmp_path / "c5").iterdir()} >= {"text_tower.safetensors", "text_tower.json",
                                                            "training.json", "checkpoint"}
    loaded = BlipEmbedder(blip_tiny_checkpoint, device="cpu", text_tower_dir=tmp_path / "c5")
    assert loaded.text_model_id.endswith("+C5")
    adapter.model.eval()
    texts = [examples[0].paragraph, examples[1].original]
    with torch.no_grad():
        np.testing.assert_allclose(loaded.encode_texts(texts, 128), adapter.encode_texts(texts, 128).numpy(),
                                   rtol=1e-5, atol=1e-6)
    # The trained tower retrieves: each paragraph finds its own image in the top 5 far above chance.
    t = loaded.encode_texts([e.paragraph for e in examples], 128)
    ranks = (t @ emb.numpy().T >= np.sum(t * emb.numpy(), axis=1, keepdims=True)).sum(axis=1)
    assert np.mean(ranks <= 5) > 0.3  # chance is 5/64


def test_resumed_run_equals_uninterrupted(tmp_path, blip_tiny_checkpoint, colour_set):
    imgs, examples = colour_set
    cfg = load_config("C10", lr=2e-3, batch_size=16, epochs=2, warmup_steps=1)  # 8 steps
    full = _adapter(blip_tiny_checkpoint)
    emb = _image_embeddings(full, imgs)
    list(Trainer(full, cfg, examples, image_embeddings=emb).run())

    part = _adapter(blip_tiny_checkpoint)
    t = Trainer(part, cfg, examples, image_embeddings=emb, out_dir=tmp_path / "r", checkpoint_every=2)
    last = list(t.run(CancelAfter(3)))[-1]  # stops before step 4: an odd step, between checkpoints
    assert last.extra.get("cancelled") is True and last.done == 3
    assert (tmp_path / "r" / "checkpoint" / "state.pt").exists()
    # Each checkpoint carries a loadable text tower too.
    assert BlipEmbedder(blip_tiny_checkpoint, device="cpu", text_tower_dir=tmp_path / "r" / "checkpoint" / "text_tower")
    resumed = _adapter(blip_tiny_checkpoint)  # a new process starts from the base weights again
    r = Trainer(resumed, cfg, examples, image_embeddings=emb, out_dir=tmp_path / "r", resume=True)
    list(r.run())
    assert len(r.history) == 8
    full_state, resumed_state = full.model.state_dict(), resumed.model.state_dict()
    for k in full_state:
        torch.testing.assert_close(resumed_state[k], full_state[k], rtol=1e-5, atol=1e-6)


def test_gradient_caching_equals_one_big_batch(blip_tiny_checkpoint, colour_set):
    imgs, examples = colour_set
    grads = []
    for accum in (1, 4):
        adapter = _adapter(blip_tiny_checkpoint)
        emb = _image_embeddings(adapter, imgs[:32])
        cfg = load_config("C9", lr=1e-3, batch_size=32, epochs=1, warmup_steps=1, grad_accum=accum)
        trainer = Trainer(adapter, cfg, examples[:32], image_embeddings=emb)
        params = adapter.trainable_parameters(False, False)
        adapter.train_mode(False)
        trainer._step(np.arange(32), 0)
        grads.append([p.grad.clone() if p.grad is not None else None for p in params])
    for a, b in zip(*grads, strict=True):
        assert (a is None) == (b is None)  # cross-attention weights get no gradient either way
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_learned_temperature_and_vision_training_are_supported(tmp_path, blip_tiny_checkpoint, colour_set):
    imgs, examples = colour_set
    adapter = _adapter(blip_tiny_checkpoint)
    params = adapter.trainable_parameters(train_vision=True, learn_temperature=True)
    names = {id(p) for p in adapter.model.vision_model.parameters()}
    assert any(id(p) in names for p in params)
    cfg = load_config("C1", learn_temperature=True, batch_size=16)
    assert abs(float(adapter.logit_scale(cfg).detach()) - 1 / 0.07) < 1e-3
