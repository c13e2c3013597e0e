"""Issue 21 item 3: local (phrase-region) alignment for the BLIP and CLIP-family training adapters,
and for an LM text tower on their vision towers, on tiny random models (nothing downloaded).

Each adapter is a RegionAdapter: its regions are one per patch ([CLS] left out) in the embedding
space, the very patch embeddings the backend's grounder reads; its global embeddings are what
encode_pixels / encode_texts give; a phrase is the mean of its tokens' projected states. A C5 run
with the local loss trains the text tower only (the vision tower stays bit-identical) and its
first loss is the global loss plus the local one."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch
from PIL import Image
from torch.nn import functional as F

from engine.errors import ModelError
from engine.grounding.parts import phrase_token_masks, text_parts
from engine.training.configs import load_config
from engine.training.local_alignment import RegionAdapter
from engine.training.trainer import Example, Trainer

TEXTS = ["A red cat sits next to a blue box. The sky is dark.", "a photo of a green ball",
         "A red bicycle leans against a blue door in the morning light. " * 12]
FIXTURES = {"blip": "blip_tiny_checkpoint", "clip-b16": "clip_b16_tiny_checkpoint",
            "longclip-b": "longclip_b_tiny_checkpoint"}
COLOURS = {"red": (220, 30, 30), "green": (30, 180, 40), "blue": (30, 60, 220), "yellow": (230, 220, 40),
           "black": (10, 10, 10), "white": (245, 245, 245), "orange": (240, 140, 20), "purple": (130, 40, 160)}


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def adapter_for(arch: str, request):
    folder = request.getfixturevalue(FIXTURES[arch])
    if arch == "blip":
        from engine.backends.blip.training import make_adapter
    else:
        from engine.backends.clip.training import make_adapter
    return make_adapter(folder, device="cpu")


def pictures(n: int, size: int, seed: int = 0) -> tuple[np.ndarray, list[Example]]:
    """Two-colour pictures (left half, right half) and texts that name things in them."""
    rng = np.random.default_rng(seed)
    names = list(COLOURS)
    imgs = np.zeros((n, size, size, 3), np.uint8)
    examples = []
    for i in range(n):
        a, b = (names[k] for k in rng.choice(len(names), 2, replace=False))
        imgs[i, :, : size // 2], imgs[i, :, size // 2 :] = COLOURS[a], COLOURS[b]
        examples.append(Example(str(i), f"a {a} ball and a {b} box", [f"a {a} ball"], [],
                                f"A {a} ball is on the left. A {b} box is on the right."))
    return imgs, examples


class Pixels:
    """ImageSource: the pictures preprocessed by the model's own embedder."""

    def __init__(self, embedder, imgs: np.ndarray) -> None:
        self.embedder, self.imgs = embedder, imgs

    def __len__(self) -> int:
        return len(self.imgs)

    def pixels(self, idx: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(self.embedder.preprocess([Image.fromarray(self.imgs[i]) for i in idx]))


def checksum(module: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def vision_parts(adapter) -> list[torch.nn.Module]:
    m = adapter.model
    return [m.vision_model, m.vision_proj] if hasattr(m, "vision_proj") else [m.vision_model, m.visual_projection]


def text_parts_of(adapter) -> list[torch.nn.Module]:
    m = adapter.model
    return [m.text_encoder, m.text_proj] if hasattr(m, "text_proj") else [m.text_model, m.text_projection]


def grounder_patches(arch: str, embedder, image: Image.Image) -> torch.Tensor:
    if arch == "blip":
        from engine.backends.blip.grounder import BlipGrounder

        return BlipGrounder(embedder).image_features(image).patch_feats
    from engine.backends.clip.grounder import ClipGrounder

    return ClipGrounder(embedder).image_features(image).patch_feats


@pytest.mark.parametrize("arch", list(FIXTURES))
def test_regions_are_the_patches_and_the_globals_are_the_adapters_own(arch, request):
    adapter = adapter_for(arch, request)
    emb = adapter.embedder
    assert isinstance(adapter, RegionAdapter)
    grid = emb.image_size // int(emb.config.vision_config.patch_size)
    images = [Image.new("RGB", (90, 60), (200, 30, 40)), Image.fromarray(pictures(1, 70)[0][0])]
    px = torch.from_numpy(emb.preprocess(images))
    with torch.no_grad():
        glob, regions = adapter.encode_pixel_regions(px)
        torch.testing.assert_close(glob, adapter.encode_pixels(px), rtol=1e-5, atol=1e-6)
    assert regions.shape == (2, grid * grid, emb.dim) and grid * grid > 1
    torch.testing.assert_close(regions.norm(dim=-1), torch.ones(2, grid * grid))
    # Exactly the patch embeddings the backend's grounder draws its maps from.
    torch.testing.assert_close(regions[1], grounder_patches(arch, emb, images[1]), rtol=1e-4, atol=1e-5)
    assert not torch.allclose(regions[1, 0], regions[1, -1], atol=1e-3)  # left and right halves differ

    for budget in (8, 77, 128):
        with torch.no_grad():
            glob, phrases, valid = adapter.encode_text_phrases(TEXTS, budget)
            torch.testing.assert_close(glob, adapter.encode_texts(TEXTS, budget), rtol=1e-5, atol=1e-6)
        assert phrases.shape[:2] == valid.shape and phrases.shape[0] == 3 and phrases.shape[2] == emb.dim
        counted = valid.sum(dim=1).tolist()
        if budget >= 77:  # the short texts fit whole: every phrase the chunker finds is there
            assert counted[:2] == [len(text_parts(t).phrases) for t in TEXTS[:2]] == [3, 1]
        assert counted[2] <= len(text_parts(TEXTS[2]).phrases) and (budget > 8 or counted[2] <= 2)

    # A phrase is the normalised mean of its own tokens' projected states, read in context.
    ids = emb.tokenize(TEXTS[:1], 77)
    enc = emb.tokenizer(TEXTS[:1], truncation=True, max_length=emb.effective_max_tokens(77), padding=True,
                        return_offsets_mapping=True, return_tensors="pt")
    masks, _ = phrase_token_masks(TEXTS[:1], enc["offset_mapping"].numpy(), 24)
    with torch.no_grad():
        states = emb.text_states(ids["input_ids"], ids["attention_mask"])[0]
        tokens = (adapter.model.text_proj if arch == "blip" else adapter.model.text_projection)(states)
        _, phrases, _ = adapter.encode_text_phrases(TEXTS[:1], 77)
    blue_box = torch.from_numpy(masks[0, 1] > 0)
    assert emb.tokenizer.decode(ids["input_ids"][0][blue_box].tolist()) == "a blue box"
    torch.testing.assert_close(phrases[0, 1], F.normalize(tokens[blue_box].mean(0), dim=-1), rtol=1e-4, atol=1e-5)


def _c5_run(arch: str, request, local: float, tmp_path):
    adapter = adapter_for(arch, request)
    imgs, examples = pictures(16, adapter.embedder.image_size)
    images = Pixels(adapter.embedder, imgs)
    vision = [checksum(m) for m in vision_parts(adapter)]
    text = [checksum(m) for m in text_parts_of(adapter)]
    extra = {"local_alignment": local} if local else {}
    cfg = load_config("C5", lr=1e-3, batch_size=8, epochs=1, warmup_steps=1, extra=extra)
    with torch.no_grad():
        emb = adapter.encode_pixels(images.pixels(np.arange(16)))
    trainer = Trainer(adapter, cfg, examples, images, image_embeddings=emb, out_dir=tmp_path / f"{arch}-{local}")
    reports = list(trainer.run())
    assert reports[-1].stage == "done" and len(trainer.history) == 2
    assert [checksum(m) for m in vision_parts(adapter)] == vision  # the vision tower is frozen
    assert all(a != b for a, b in zip((checksum(m) for m in text_parts_of(adapter)), text, strict=True))
    return trainer


@pytest.mark.parametrize("arch", ["blip", "clip-b16"])
def test_c5_with_local_alignment_trains_the_text_tower_only(arch, request, tmp_path):
    with_local = _c5_run(arch, request, 1.0, tmp_path)
    without = _c5_run(arch, request, 0.0, tmp_path)
    adapter = adapter_for(arch, request)
    grid = adapter.embedder.image_size // int(adapter.embedder.config.vision_config.patch_size)
    regions = with_local.image_regions
    assert regions is not None and regions.dtype == torch.float16 and regions.shape == (16, grid * grid,
                                                                                        adapter.embedder.dim)
    assert without.image_regions is None
    # Same start, same batch, same texts: the first loss is the global loss plus the local one.
    first, plain = with_local.history[0]["loss"], without.history[0]["loss"]
    assert first > plain + 0.5, (first, plain)
    assert with_local.history[1]["loss"] != without.history[1]["loss"]


def test_an_lm_tower_trains_its_phrases_against_the_base_vision_regions(clip_b16_tiny_checkpoint, tmp_path):
    from engine.backends.clip.training import make_adapter
    from engine.models import lm_tower as L
    from engine.training.lm_tower_adapter import LMTowerAdapter, LMTowerRegionAdapter

    base = make_adapter(clip_b16_tiny_checkpoint, device="cpu")
    tower = L.tiny_tower("bert", embed_dim=base.embedder.dim, train_layers="all")
    adapter = LMTowerRegionAdapter(tower, base, device="cpu", amp_dtype=None)
    assert isinstance(adapter, RegionAdapter) and not isinstance(LMTowerAdapter(tower), RegionAdapter)
    imgs, examples = pictures(16, base.embedder.image_size)
    images = Pixels(base.embedder, imgs)
    with torch.no_grad():
        glob, regions = adapter.encode_pixel_regions(images.pixels(np.arange(2)))
        expected = base.encode_pixel_regions(images.pixels(np.arange(2)))
        g, phrases, valid = adapter.encode_text_phrases(TEXTS, 64)
        torch.testing.assert_close(g, adapter.encode_texts(TEXTS, 64), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(glob, expected[0])
    torch.testing.assert_close(regions, expected[1])
    assert valid.sum(dim=1).tolist()[:2] == [3, 1] and phrases.shape[2] == base.embedder.dim

    vision = checksum(base.model)
    before = checksum(tower)
    cfg = load_config("C5", lr=1e-3, batch_size=8, epochs=1, warmup_steps=1, extra={"local_alignment": 1.0})
    trainer = Trainer(adapter, cfg, examples, images, out_dir=tmp_path / "lm")
    list(trainer.run())
    assert len(trainer.history) == 2 and trainer.image_regions is not None
    assert checksum(base.model) == vision and checksum(tower) != before


def test_local_alignment_needs_regions_and_a_fast_tokenizer(clip_b16_tiny_checkpoint):
    from engine.models import lm_tower as L
    from engine.models.tokenizers import tokenize_with_offsets
    from engine.training.lm_tower_adapter import LMTowerAdapter

    imgs, examples = pictures(16, 64)
    cfg = load_config("C5", batch_size=8, extra={"local_alignment": 1.0})
    with pytest.raises(ValueError, match="region tokens"):  # an LM tower without a region source
        Trainer(LMTowerAdapter(L.tiny_tower("bert", embed_dim=32)), cfg, examples, image_embeddings=torch.zeros(16, 32))

    class PythonTokenizer:  # what a tokenizer without a Rust backend answers
        is_fast = False

        def __call__(self, *args, **kwargs):
            raise AssertionError("not called: it would return no offsets")

    with pytest.raises(ModelError, match="PythonTokenizer.*no character offsets"):
        tokenize_with_offsets(PythonTokenizer(), TEXTS, 77)


def test_file_images_decode_and_preprocess_as_the_cache_does(clip_b16_tiny_checkpoint, tmp_path):
    from engine.backends.clip.embedder import ClipEmbedder
    from engine.errors import LonglensError
    from engine.indexing.decode import decode_image
    from engine.training.file_images import FileImages

    emb = ClipEmbedder(clip_b16_tiny_checkpoint, device="cpu")
    imgs, _ = pictures(3, 90)
    files = []
    for i, a in enumerate(imgs):
        files.append(tmp_path / f"p{i}.jpg" if i % 2 else tmp_path / f"p{i}.png")
        Image.fromarray(a).save(files[-1])
    source = FileImages(files, emb.preprocess, emb.image_size)
    assert len(source) == 3
    got = source.pixels(np.array([2, 0]))
    want = emb.preprocess([decode_image(files[i], target_size=emb.image_size)[0] for i in (2, 0)])
    assert got.dtype == torch.float32 and torch.equal(got, torch.from_numpy(want))
    files[1].write_text("no longer a picture", encoding="utf-8")  # changed after its embedding was cached
    with pytest.raises(LonglensError, match="p1.jpg: cannot decode the image any more"):
        source.pixels(np.array([1]))


@pytest.mark.parametrize("arch", ["clip-b16", "longclip-b"])
def test_clip_token_features_are_the_same_on_the_fast_and_the_reference_path(arch, request):
    from engine.backends.clip.embedder import ClipEmbedder

    folder = request.getfixturevalue(FIXTURES[arch])
    fast, ref = ClipEmbedder(folder, device="cpu"), ClipEmbedder(folder, device="cpu", compute="reference")
    enc = fast.tokenize(TEXTS, 77)
    with torch.no_grad():
        a = fast.text_token_features(enc["input_ids"], enc["attention_mask"])
        b = ref.text_token_features(enc["input_ids"], enc["attention_mask"])
        pooled = a[torch.arange(3), fast.pooled_positions(enc["input_ids"]).long()]
    real = enc["attention_mask"].bool()  # padded rows may differ: nothing reads them
    torch.testing.assert_close(a[real], b[real], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(F.normalize(pooled, dim=-1).numpy(), fast.encode_texts(TEXTS, 77), atol=1e-6)


@pytest.mark.parametrize("arch", ["blip", "clip-b16"])
def test_under_bf16_autocast_regions_and_phrases_stay_float32_and_close(arch, request):
    """The CUDA path's autocast, exercised on the CPU (which autocasts to bf16 too)."""
    adapter = adapter_for(arch, request)
    px = torch.from_numpy(adapter.embedder.preprocess([Image.fromarray(pictures(1, 70)[0][0])]))
    with torch.no_grad():
        exact = adapter.encode_pixel_regions(px)[1], adapter.encode_text_phrases(TEXTS, 77)[1]
        adapter.amp_dtype = torch.bfloat16
        low = adapter.encode_pixel_regions(px)[1], adapter.encode_text_phrases(TEXTS, 77)[1]
    for e, lo in zip(exact, low, strict=True):
        cos = (e * lo).sum(-1)
        assert lo.dtype == torch.float32 and float(cos[e.norm(dim=-1) > 0].min()) > 0.98
