"""The fast BLIP forwards (engine/backends/blip/fast.py) against transformers' reference forward.

Tiny random-weight checkpoint (conftest), real JPEG files rendered from SceneWorld, and the
registry's default (what the CLI and the GUI load).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.backends.blip.embedder import BlipEmbedder, save_text_tower
from engine.backends.blip.fast import cpu_supports_bf16
from engine.indexing.decode import decode_image
from engine.sceneworld import generate_scene
from engine.sceneworld.render import render_scene

PARAGRAPHS = [
    "A red bicycle leans against a blue door.",
    "Two dogs play in the snow next to a wooden fence while children watch from the porch; "
    "behind them a row of pine trees stands under a grey winter sky with a single crow.",
    "Short.",
]


@pytest.fixture(scope="module")
def sceneworld_jpegs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Eight SceneWorld scenes saved as camera-like JPEGs (upscaled, with sensor-like noise)."""
    folder = tmp_path_factory.mktemp("sw-jpegs")
    rng = np.random.default_rng(0)
    paths = []
    for i in range(8):
        image, _ = render_scene(generate_scene(1000, i), 256)
        big = np.asarray(image.resize((1200, 900)), dtype=np.float32)
        big += rng.normal(0.0, 6.0, big.shape).astype(np.float32)
        from PIL import Image

        path = folder / f"scene_{i}.jpg"
        Image.fromarray(np.clip(big, 0, 255).astype(np.uint8)).save(path, "JPEG", quality=90)
        paths.append(path)
    return paths


@pytest.fixture(scope="module")
def embedders(blip_tiny_checkpoint: Path) -> dict[str, BlipEmbedder]:
    return {
        mode: BlipEmbedder(blip_tiny_checkpoint, device="cpu", compute=mode)
        for mode in ("reference", "exact", "fast")
    }


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.einsum("ij,ij->i", a, b)


def test_exact_matches_reference_on_pixels_and_padded_text_batches(embedders, sceneworld_jpegs):
    ref, exact = embedders["reference"], embedders["exact"]
    images = [decode_image(p, target_size=ref.image_size)[0] for p in sceneworld_jpegs]
    pixels = ref.preprocess(images)
    want = ref.encode_pixels(pixels)
    np.testing.assert_allclose(exact.encode_pixels(pixels), want, atol=1e-5, rtol=0)
    # Different lengths in one batch: the padding mask must keep padded tokens out.
    texts = PARAGRAPHS * 3
    np.testing.assert_allclose(exact.encode_texts(texts), ref.encode_texts(texts), atol=1e-5, rtol=0)
    # The check would be empty if every input gave the same vector.
    assert float(want[0] @ want[1]) < 0.999


def test_fast_path_keeps_cosine_and_ranking_on_real_files(embedders, sceneworld_jpegs):
    ref, fast = embedders["reference"], embedders["fast"]
    assert fast.compute_dtype == ("bfloat16" if cpu_supports_bf16() else "float32")
    # Reference pipeline: full decode and one resize; fast: draft-mode decode.
    from PIL import Image

    full = []
    for p in sceneworld_jpegs:
        with Image.open(p) as im:
            full.append(im.convert("RGB"))
    want = ref.encode_images(full)
    drafted = [decode_image(p, target_size=fast.image_size)[0] for p in sceneworld_jpegs]
    got = fast.encode_pixels(fast.preprocess(drafted))
    assert _cosines(got, want).min() >= 0.99
    want_t, got_t = ref.encode_texts(PARAGRAPHS), fast.encode_texts(PARAGRAPHS)
    assert _cosines(got_t, want_t).min() >= 0.99
    # Image-to-image neighbours (top-3 of 8) agree.
    for i in range(len(want)):
        top_ref = set(np.argsort(-(want @ want[i]))[:3])
        top_fast = set(np.argsort(-(got @ got[i]))[:3])
        assert len(top_ref & top_fast) >= 2


def test_text_tower_loaded_after_first_use_reaches_the_fast_path(blip_tiny_checkpoint, tmp_path, embedders):
    """A text tower loaded after the fast copies exist must replace them (refresh)."""
    fast = BlipEmbedder(blip_tiny_checkpoint, device="cpu", compute="fast")
    before = fast.encode_texts(PARAGRAPHS)  # builds the fast copies
    donor = BlipEmbedder(blip_tiny_checkpoint, device="cpu", compute="reference")
    with torch.no_grad():
        for p in donor.model.text_proj.parameters():
            p.mul_(-1.0)  # a visibly different tower: every text vector flips
    tower = save_text_tower(donor, tmp_path / "tower", "flipped")
    fast._load_text_tower(tower)
    after = fast.encode_texts(PARAGRAPHS)
    np.testing.assert_allclose(after, -before, atol=2e-2)
    loaded = BlipEmbedder(blip_tiny_checkpoint, device="cpu", compute="reference", text_tower_dir=tower)
    assert _cosines(after, loaded.encode_texts(PARAGRAPHS)).min() >= 0.99


def test_registry_loads_the_fast_path(blip_tiny_checkpoint, tmp_path):
    from engine.config import get_paths
    from engine.models.download import import_model
    from engine.models.registry import load_embedder

    paths = get_paths(tmp_path / "home").ensure()
    src = tmp_path / "ckpt"
    shutil.copytree(blip_tiny_checkpoint, src)
    import_model(src, "tiny-fast", paths)
    emb = load_embedder("tiny-fast", paths, device="cpu")
    assert emb.compute == "fast"


def test_unknown_compute_mode_is_refused(blip_tiny_checkpoint):
    from engine.errors import ModelError

    with pytest.raises(ModelError, match="compute mode"):
        BlipEmbedder(blip_tiny_checkpoint, device="cpu", compute="turbo")


def test_query_thread_limit_applies_during_the_call_and_is_restored(blip_tiny_checkpoint, monkeypatch):
    from engine.backends.blip import fast as blip_fast

    fast = BlipEmbedder(blip_tiny_checkpoint, device="cpu", compute="fast")
    assert fast.query_threads == 1
    assert BlipEmbedder(blip_tiny_checkpoint, device="cpu", compute="exact").query_threads is None
    seen: list[int] = []
    original = fast._fast.text_features

    def spy(ids, mask):
        seen.append(torch.get_num_threads())
        return original(ids, mask)

    monkeypatch.setattr(fast._fast, "text_features", spy)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        fast.encode_texts(PARAGRAPHS[:1])  # one query: limited
        fast.encode_texts(PARAGRAPHS * 3)  # a batch of 9 texts: the pool is left alone
        assert seen == [1, 2, 2]  # 9 texts at batch size 8 -> two calls
        assert torch.get_num_threads() == 2
        with blip_fast.intra_op_threads(1):
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
