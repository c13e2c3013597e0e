"""BLIP grounding on random-weight models: ITM supports match transformers' own ITM, Grad-CAM
maps have the right shapes, are normalised and deterministic, and the gradient hook returns
exactly the gradient of the match logit with respect to the cross-attention probabilities."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from engine.backends.blip.embedder import BlipEmbedder
from engine.backends.blip.grounder import (
    BlipGrounder,
    CrossAttentionRecorder,
    gradcam_from,
    has_cross_attention,
)
from engine.grounding import get_grounder

PARAGRAPH = "A red ball lies on the grass, next to a wooden bench. Two white clouds drift across the sky."


def _save_itm_checkpoint(out: Path, config) -> Path:
    from transformers import BlipForImageTextRetrieval, BlipImageProcessorPil
    from transformers.utils import logging as hf_logging

    from engine.backends.blip.checkpoints import (
        BLIP_IMAGE_MEAN,
        BLIP_IMAGE_STD,
        build_blip_tokenizer,
        reinitialise_blip_weights,
        save_blip_tokenizer,
    )

    hf_logging.disable_progress_bar()
    with torch.random.fork_rng(devices=[]):
        model = BlipForImageTextRetrieval(config).eval()
    reinitialise_blip_weights(model, seed=0, std=0.2)
    model.save_pretrained(str(out))
    save_blip_tokenizer(build_blip_tokenizer(), out)
    size = int(config.vision_config.image_size)
    BlipImageProcessorPil(size={"height": size, "width": size}, image_mean=list(BLIP_IMAGE_MEAN),
                          image_std=list(BLIP_IMAGE_STD)).save_pretrained(str(out))
    return out


@pytest.fixture(scope="module")
def itm_checkpoint(tmp_path_factory) -> Path:
    """The tiny BLIP with cross-attention in every text layer (is_decoder, set explicitly)."""
    from engine.backends.blip.checkpoints import tiny_blip_config

    cfg = tiny_blip_config()
    cfg.text_config.is_decoder = True
    return _save_itm_checkpoint(tmp_path_factory.mktemp("blip-itm") / "tiny-itm", cfg)


@pytest.fixture(scope="module")
def embedder(itm_checkpoint) -> BlipEmbedder:
    return BlipEmbedder(itm_checkpoint, device="cpu", model_id="tiny-itm")


def _image(seed: int = 0, size: tuple[int, int] = (96, 72)) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 255, size=(size[1], size[0], 3), dtype=np.uint8))


def test_hook_captures_the_gradient_of_a_hand_built_attention():
    """A toy module shaped like BlipTextSelfAttention: its probs are softmax(s), and the loss is
    sum(c * probs), so d loss / d probs must be exactly c (and the hook must not change it)."""

    class ToyAttention(torch.nn.Module):
        def __init__(self, scores):
            super().__init__()
            self.scores = torch.nn.Parameter(scores)

        def forward(self, x):
            probs = torch.softmax(self.scores, dim=-1)
            return x @ probs.sum(dim=(0, 1, 2))[:, None], probs

    scores = torch.randn(1, 2, 3, 5, generator=torch.Generator().manual_seed(0))
    c = torch.randn(1, 2, 3, 5, generator=torch.Generator().manual_seed(1))
    toy = ToyAttention(scores)
    with CrossAttentionRecorder(toy) as rec:
        _, probs = toy(torch.ones(1, 5))
        loss = (c * probs).sum()
        (grad,) = torch.autograd.grad(loss, rec.attn)
    assert rec.attn is probs
    torch.testing.assert_close(grad, c)
    cam = gradcam_from(probs.detach(), grad)
    expected = (probs.detach().numpy() * np.clip(c.numpy(), 0, None)).mean(axis=1)
    np.testing.assert_allclose(cam.numpy(), expected, rtol=1e-6)
    # Hook removed on exit: a later forward records nothing.
    rec.attn = None
    toy(torch.ones(1, 5))
    assert rec.attn is None
    # Another thread's forward pass through the shared module (a second grounding's ITM scores,
    # under inference mode) leaves this recording alone.
    import threading

    with CrossAttentionRecorder(toy) as rec:
        _, mine = toy(torch.ones(1, 5))
        other = threading.Thread(target=lambda: toy(torch.ones(1, 5)))
        other.start()
        other.join()
        assert rec.attn is mine


def test_recorded_attention_is_the_models_cross_attention(embedder):
    g = BlipGrounder(embedder, gradcam_layer=1)
    feats = g.image_features(_image())
    enc = embedder.tokenizer(["a red ball"], return_tensors="pt")
    layer = embedder.model.text_encoder.encoder.layer[1].crossattention.self
    img = feats.states
    with torch.no_grad(), CrossAttentionRecorder(layer) as rec:
        out = embedder.model.text_encoder(input_ids=g.itm_input_ids(enc["input_ids"]),
                                          attention_mask=enc["attention_mask"], encoder_hidden_states=img,
                                          encoder_attention_mask=torch.ones(img.shape[:2], dtype=torch.long),
                                          output_attentions=True)
    torch.testing.assert_close(rec.attn, out.cross_attentions[1])
    assert rec.attn.shape[-1] == img.shape[1]  # attends over [CLS] + all patches


def test_itm_support_matches_transformers_itm(embedder):
    """Uncalibrated supports are exactly the ITM head's softmax match probability."""
    g = get_grounder(embedder)
    assert isinstance(g, BlipGrounder) and g.itm and not g.calibrated
    image = _image(1)
    grounding = g.ground(image, "a red ball on the grass.")
    pixels = torch.from_numpy(embedder.preprocess([image]))
    enc = embedder.tokenizer(["a red ball on the grass."], return_tensors="pt")
    ids = g.itm_input_ids(enc["input_ids"])
    assert ids[0, 0].item() == embedder.tokenizer.convert_tokens_to_ids("[ENC]")
    with torch.no_grad():
        logits = embedder.model(input_ids=ids, pixel_values=pixels, attention_mask=enc["attention_mask"],
                                use_itm_head=True).itm_score
    expected = torch.softmax(logits, dim=-1)[0, 1].item()
    assert grounding.sentence_supports[0] == pytest.approx(expected, abs=1e-5)


@pytest.mark.parametrize("method", ["gradcam", "patch"])
def test_maps_shapes_normalisation_determinism(embedder, method):
    g = get_grounder(embedder, method=method)
    image = _image(2)
    a = g.ground(image, PARAGRAPH)
    b = g.ground(image, PARAGRAPH)
    grid = embedder.image_size // 8
    assert len(a.sentences) == 2 and len(a.sentence_supports) == 2
    # "the grass" is a setting (a background map), so "on" makes no relation to it.
    assert [(p.phrase.kind, p.phrase.text) for p in a.phrases][:3] == [
        ("noun_phrase", "A red ball"), ("setting", "the grass"), ("relation", "next to")]
    nonzero = 0
    for pa, pb in zip(a.phrases, b.phrases, strict=True):
        assert pa.heatmap.shape == (grid, grid) and pa.heatmap.dtype == np.float32
        assert 0 <= pa.heatmap.min() and pa.heatmap.max() <= 1
        nonzero += pa.heatmap.max() == 1.0
        assert 0 <= pa.support <= 1
        np.testing.assert_array_equal(pa.heatmap, pb.heatmap)
    assert nonzero >= len(a.phrases) - 2  # a relation word may get no positive gradient at all
    assert a.sentence_supports == b.sentence_supports
    assert a.method.startswith("itm-gradcam" if method == "gradcam" else "patch")


def test_model_without_cross_attention_falls_back(tmp_path):
    from engine.backends.blip.checkpoints import tiny_blip_config

    cfg = tiny_blip_config()
    cfg.text_config.is_decoder = False  # no cross-attention blocks: no ITM path
    emb = BlipEmbedder(_save_itm_checkpoint(tmp_path / "no-itm", cfg), device="cpu")
    assert not has_cross_attention(emb.model)
    g = get_grounder(emb)
    assert g.method == "patch-similarity"
    r = g.ground(_image(3), "a red ball. a blue cup")
    assert len(r.phrases) == 2 and all(p.heatmap.shape == (8, 8) for p in r.phrases)
    assert all(0 <= s <= 1 for s in r.sentence_supports)


@pytest.mark.slow
def test_full_architecture_gradcam_on_cpu(tmp_path):
    """Salesforce/blip-itm-base-coco's architecture (ViT-B/16 at 384 px, 12-layer BERT with
    cross-attention) with random weights: 24 x 24 maps, normalised, deterministic; time noted."""
    from transformers import BlipForImageTextRetrieval

    from engine.backends.blip.checkpoints import (
        base_blip_config,
        build_blip_tokenizer,
        reinitialise_blip_weights,
    )

    cfg = base_blip_config()
    with torch.random.fork_rng(devices=[]):
        model = BlipForImageTextRetrieval(cfg).eval()
    reinitialise_blip_weights(model, seed=0, std=0.02)
    emb = object.__new__(BlipEmbedder)  # in memory: writing 900 MB to disk would dominate the test
    emb.checkpoint_dir = tmp_path
    emb.device, emb.torch_dtype, emb.dtype = "cpu", torch.float32, "float32"
    emb.config, emb.model, emb.tokenizer = cfg, model, build_blip_tokenizer()
    emb.model_id = emb.text_model_id = "blip-base-random"
    emb.dim, emb.image_size = 256, 384
    emb.max_text_tokens, emb.default_text_tokens, emb.batch_size = 512, 128, 8
    emb._load_image_settings()
    g = BlipGrounder(emb)
    assert g.gradcam_layer == 6 and g.itm
    image = _image(4, (640, 480))
    t0 = time.perf_counter()
    a = g.ground(image, PARAGRAPH)
    seconds = time.perf_counter() - t0
    b = g.ground(image, PARAGRAPH)
    print(f"\nBLIP base Grad-CAM, {len(a.phrases)} phrases / 2 sentences: {seconds:.1f} s on CPU")
    for pa, pb in zip(a.phrases, b.phrases, strict=True):
        assert pa.heatmap.shape == (24, 24)
        assert 0 <= pa.heatmap.min() and pa.heatmap.max() <= 1
        np.testing.assert_array_equal(pa.heatmap, pb.heatmap)
    assert sum(p.heatmap.max() == 1.0 for p in a.phrases) >= len(a.phrases) - 2
    assert seconds < 120
