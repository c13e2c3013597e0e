"""ClipEmbedder against transformers' own CLIP (CLIPModel.get_image_features / get_text_features
fed by CLIPProcessor) on real image files: tokenizer, pixels, embeddings, truncation, ranking.

Two architectures, each the real configuration scaled down (engine/backends/clip/checkpoints.py,
TINY): OpenAI CLIP ViT-B/16 (77 tokens, the openai/clip-* configs' legacy pooling rule
eos_token_id=2) and Long-CLIP-B (248 tokens, pooled at the first <|endoftext|>). Random weights with
a visible spread; the tests assert that different inputs land apart, so parity cannot hold by collapse.
The tokenizer is the real 49,408-entry CLIP BPE, built offline from OpenAI's merges file.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from transformers import CLIPImageProcessorPil, CLIPModel, CLIPProcessor, CLIPTokenizer

from engine.backends.clip.checkpoints import (
    ARCHS,
    CLIP_EOS_ID,
    preprocessor_config,
    stretch_positions,
)
from engine.backends.clip.embedder import ClipEmbedder
from engine.errors import ModelError, ModelIntegrityError, ModelNotInstalledError
from engine.models.base import Embedder
from engine.sceneworld import generate_scene
from engine.sceneworld.render import render_scene
from tests.engine.clip_reference import OpenAIBPE

TOL = 1e-5
ARCH_FIXTURES = {"clip-b16": "clip_b16_tiny_checkpoint", "longclip-b": "longclip_b_tiny_checkpoint"}

TEXTS = [
    "a photo of a cat",
    "A red bicycle leans against a blue door in the morning light.",
    "Two dogs play in the snow next to a wooden fence while children watch from the porch.",
    "grey sky",
    "A crowded harbour at dusk: fishing boats, gulls, a lighthouse on the far rocks.",
    "Grandma's 80th birthday party — cake, candles and 中文 characters, naïve café owners waving!",
]


def long_paragraph(n: int = 40) -> str:
    colours = ["red", "blue", "green", "yellow", "purple", "orange", "black", "white"]
    animals = ["cat", "dog", "horse", "parrot", "goat", "rabbit", "fox"]
    places = ["harbour", "kitchen", "garden", "station", "library", "beach"]
    return " ".join(f"In picture {i}, a {colours[i % 8]} {animals[i % 7]} waits near the {places[i % 6]} "
                    f"while {i + 2} people walk past." for i in range(n))


@pytest.fixture(scope="module")
def image_files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Ten real files: SceneWorld renders and gradients as JPEG (camera-like sizes and noise), PNG
    (RGB, RGBA with transparency, palette, greyscale) in portrait, landscape and square shapes."""
    folder = tmp_path_factory.mktemp("clip-images")
    rng = np.random.default_rng(3)
    sizes = [(640, 480), (480, 640), (300, 300), (1000, 250), (97, 131), (512, 384), (200, 600), (333, 222),
             (128, 128), (720, 405)]
    paths = []
    for i, (w, h) in enumerate(sizes):
        image, _ = render_scene(generate_scene(4000, i), 256)
        arr = np.asarray(image.resize((w, h), Image.Resampling.BILINEAR), dtype=np.float32)
        arr = np.clip(arr + rng.normal(0, 8, arr.shape), 0, 255).astype(np.uint8)
        im = Image.fromarray(arr, "RGB")
        if i % 5 == 1:
            rgba = im.convert("RGBA")
            alpha = np.full((h, w), 255, np.uint8)
            alpha[:, : w // 3] = 0
            rgba.putalpha(Image.fromarray(alpha))
            path = folder / f"img{i}.png"
            rgba.save(path)
        elif i % 5 == 2:
            path = folder / f"img{i}.png"
            im.convert("P", palette=Image.Palette.ADAPTIVE).save(path)
        elif i % 5 == 3:
            path = folder / f"img{i}.png"
            im.convert("L").save(path)
        else:
            path = folder / f"img{i}.jpg"
            im.save(path, "JPEG", quality=88)
        paths.append(path)
    return paths


def open_all(paths: list[Path]) -> list[Image.Image]:
    out = []
    for p in paths:
        with Image.open(p) as im:
            im.load()
            out.append(im.copy())
    return out


@pytest.fixture(scope="module", params=list(ARCH_FIXTURES))
def arch_case(request):
    """(architecture name, checkpoint folder, embedder (exact), transformers reference, CLIPProcessor)."""
    name = request.param
    folder = request.getfixturevalue(ARCH_FIXTURES[name])
    model = CLIPModel.from_pretrained(str(folder), local_files_only=True).eval()
    processor = CLIPProcessor(image_processor=CLIPImageProcessorPil.from_pretrained(str(folder)),
                              tokenizer=CLIPTokenizer.from_pretrained(str(folder)))
    return name, folder, ClipEmbedder(folder, device="cpu"), model, processor


def reference_features(model: CLIPModel, processor: CLIPProcessor, images, texts, max_length: int):
    """transformers' own embeddings: the processor's pixels and tokens, get_*_features, normalised."""
    with torch.inference_mode():
        img = txt = None
        if images:
            pix = processor(images=images, return_tensors="pt")["pixel_values"]
            img = F.normalize(model.get_image_features(pixel_values=pix).pooler_output, dim=-1).numpy()
        if texts:
            enc = processor(text=texts, return_tensors="pt", padding=True, truncation=True, max_length=max_length)
            out = model.get_text_features(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"])
            txt = F.normalize(out.pooler_output, dim=-1).numpy()
    return img, txt


def max_off_diagonal(feats: np.ndarray) -> float:
    sims = feats @ feats.T
    return float(np.max(sims[~np.eye(len(feats), dtype=bool)]))


def top5(text_feats: np.ndarray, image_feats: np.ndarray) -> list[list[int]]:
    return [list(np.argsort(-(image_feats @ t), kind="stable")[:5]) for t in text_feats]


# ---------------------------------------------------------------- tokenizer


def test_tokenizer_is_openai_clip_bpe(arch_case) -> None:
    name, folder, emb, _, _ = arch_case
    tok = emb.tokenizer
    assert len(tok) == 49408
    assert tok("a photo of a cat")["input_ids"] == [49406, 320, 1125, 539, 320, 2368, 49407]  # CLIP's published ids
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (49406, 49407, 49407)
    assert tok.model_max_length == ARCHS[name].context_length
    reference = OpenAIBPE()
    context = ARCHS[name].context_length
    for text in [*TEXTS, long_paragraph()]:
        ours = tok(text, truncation=True, max_length=context)["input_ids"]
        assert ours == reference.tokenize(text, context), text[:40]
    assert emb.token_count(long_paragraph()) == len(reference.tokenize(long_paragraph(), 10_000)) > 400


# ---------------------------------------------------------------- pixels


def test_pixels_equal_clip_image_processor_on_real_files(arch_case, image_files) -> None:
    _, folder, emb, _, processor = arch_case
    images = open_all(image_files)
    ours = emb.preprocess(images)
    s = emb.image_size
    assert ours.shape == (len(images), 3, s, s) and ours.dtype == np.float32
    for i, image in enumerate(images):
        ref = processor(images=[image], return_tensors="np")["pixel_values"][0]
        np.testing.assert_allclose(ours[i], ref, atol=1e-5, rtol=0, err_msg=f"{image_files[i].name} {image.mode}")
    # The RGBA file is white where transparent (composited as transformers does).
    white = (1.0 - np.array([0.48145466, 0.4578275, 0.40821073])) / np.array([0.26862954, 0.26130258, 0.27577711])
    np.testing.assert_allclose(ours[1, :, s // 2, 0], white, atol=2e-2)


def test_openai_style_preprocessor_config_and_defaults(clip_b16_tiny_checkpoint, image_files, tmp_path) -> None:
    """The openai/clip-* repos write sizes as plain ints; a folder without the file gets the defaults."""
    images = open_all(image_files)
    want = ClipEmbedder(clip_b16_tiny_checkpoint, device="cpu").preprocess(images)
    legacy = tmp_path / "legacy"
    shutil.copytree(clip_b16_tiny_checkpoint, legacy)
    cfg = preprocessor_config(64)
    cfg.update({"size": 64, "crop_size": 64, "feature_extractor_type": "CLIPFeatureExtractor"})
    (legacy / "preprocessor_config.json").write_text(json.dumps(cfg))
    np.testing.assert_array_equal(ClipEmbedder(legacy, device="cpu").preprocess(images), want)
    (legacy / "preprocessor_config.json").unlink()
    np.testing.assert_array_equal(ClipEmbedder(legacy, device="cpu").preprocess(images), want)


def test_panorama_resamples_only_the_cropped_region(clip_b16_tiny_checkpoint, tmp_path) -> None:
    """A 40:1 strip: the crop's region alone is resampled, on the full resize's grid."""
    rng = np.random.default_rng(0)
    strip = Image.fromarray(rng.integers(0, 256, (50, 2000, 3), dtype=np.uint8), "RGB")
    emb = ClipEmbedder(clip_b16_tiny_checkpoint, device="cpu")
    processor = CLIPImageProcessorPil.from_pretrained(str(clip_b16_tiny_checkpoint))
    ours = emb.preprocess([strip])[0]
    ref = processor(images=[strip], return_tensors="np")["pixel_values"][0]
    # Same sampling positions; PIL's float box may round one level now and then (1/255/std = 0.015).
    assert np.mean(np.abs(ours - ref) < 1e-5) > 0.99
    assert np.max(np.abs(ours - ref)) < 0.1


# ---------------------------------------------------------------- embeddings


def test_embeddings_and_top5_equal_reference_on_real_files(arch_case, image_files) -> None:
    name, _, emb, model, processor = arch_case
    images = open_all(image_files)
    ref_img, ref_txt = reference_features(model, processor, images, TEXTS, emb.max_text_tokens)
    img = emb.encode_images(images)
    txt = emb.encode_texts(TEXTS)
    assert img.shape == (len(images), 32) and txt.shape == (len(TEXTS), 32)
    for feats in (img, txt):
        assert feats.dtype == np.float32
        np.testing.assert_allclose(np.linalg.norm(feats, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(img, ref_img, atol=TOL, rtol=0)
    np.testing.assert_allclose(txt, ref_txt, atol=TOL, rtol=0)
    assert top5(txt, img) == top5(ref_txt, ref_img)
    # Different inputs land apart, and the rankings are not one ranking repeated.
    assert max_off_diagonal(img) < 0.99 and max_off_diagonal(txt) < 0.95
    assert len({tuple(r) for r in top5(ref_txt, ref_img)}) > 1
    # Files decoded the way the indexer decodes them (JPEG draft mode, integer reduction) stay close;
    # at a 64 px input the reduced source shifts a tiny random model more than a real one.
    from engine.indexing.decode import decode_image

    drafted = emb.encode_images([decode_image(p, target_size=emb.image_size)[0] for p in image_files])
    assert np.min(np.einsum("ij,ij->i", drafted, img)) > 0.95


def test_fast_path_keeps_embeddings_and_ranking(arch_case, image_files) -> None:
    name, folder, exact, _, _ = arch_case
    fast = ClipEmbedder(folder, device="cpu", compute="fast")
    reference = ClipEmbedder(folder, device="cpu", compute="reference")
    images = open_all(image_files)
    pixels = exact.preprocess(images)
    texts = [*TEXTS, long_paragraph()]
    want_i, want_t = reference.encode_pixels(pixels), reference.encode_texts(texts)
    # "exact": the same SDPA forwards as "fast" in float32, pooled-token-only last layers.
    np.testing.assert_allclose(exact.encode_pixels(pixels), want_i, atol=TOL, rtol=0)
    np.testing.assert_allclose(exact.encode_texts(texts), want_t, atol=TOL, rtol=0)
    got_i, got_t = fast.encode_pixels(pixels), fast.encode_texts(texts)
    assert np.min(np.einsum("ij,ij->i", got_i, want_i)) > 0.999
    assert np.min(np.einsum("ij,ij->i", got_t, want_t)) > 0.999
    for ours, theirs in zip(top5(got_t, got_i), top5(want_t, want_i), strict=True):
        assert len(set(ours) & set(theirs)) >= 4


def test_padded_batches_and_batch_size_do_not_change_vectors(arch_case) -> None:
    _, _, emb, _, _ = arch_case
    texts = [TEXTS[2], TEXTS[0], long_paragraph(), TEXTS[3], "x"]
    together = emb.encode_texts(texts)
    old = emb.batch_size
    try:
        emb.batch_size = 1
        one_by_one = emb.encode_texts(texts)
    finally:
        emb.batch_size = old
    np.testing.assert_allclose(together, one_by_one, atol=1e-5)
    assert emb.encode_texts([]).shape == emb.encode_images([]).shape == (0, 32)
    with pytest.raises(ModelError, match="shape"):
        emb.encode_pixels(np.zeros((1, 3, 32, 32), np.float32))


# ---------------------------------------------------------------- truncation and limits


def test_truncation_at_the_models_limit(arch_case) -> None:
    name, _, emb, model, processor = arch_case
    limit = ARCHS[name].context_length
    para = long_paragraph()
    assert (emb.max_text_tokens, emb.default_text_tokens) == (limit, limit)
    assert emb.token_count(para) > 400
    full = emb.encode_texts([para])
    np.testing.assert_allclose(full, reference_features(model, processor, None, [para], limit)[1], atol=TOL, rtol=0)
    at_20 = emb.encode_texts([para], max_tokens=20)
    np.testing.assert_allclose(at_20, reference_features(model, processor, None, [para], 20)[1], atol=TOL, rtol=0)
    assert float(at_20[0] @ full[0]) < 0.999  # the later tokens were read
    np.testing.assert_allclose(emb.encode_texts([para], max_tokens=5000), full, atol=1e-6)  # clamped to the limit
    with pytest.raises(ValueError):
        emb.encode_texts([para], max_tokens=1)


def test_longclip_reads_past_77_tokens(longclip_b_tiny_checkpoint) -> None:
    emb = ClipEmbedder(longclip_b_tiny_checkpoint, device="cpu")
    para = long_paragraph()
    at_77, at_248 = emb.encode_texts([para], max_tokens=77), emb.encode_texts([para])
    assert float(at_77[0] @ at_248[0]) < 0.999
    ids = emb.tokenize([para])["input_ids"]
    assert ids.shape == (1, 248) and int(ids[0, -1]) == CLIP_EOS_ID


def test_token_counter_shows_each_models_limit_and_cut(arch_case) -> None:
    from engine.query_budget import token_budget

    name, _, emb, _, _ = arch_case
    limit = ARCHS[name].context_length
    para = long_paragraph()
    budget = token_budget(emb, para)
    assert (budget.budget, budget.total, budget.used, budget.truncated) == (limit, emb.token_count(para), limit, True)
    # The text before the cut fits the limit; one more word does not.
    head = para[: budget.cut_at].rstrip()
    assert emb.token_count(head) <= limit < emb.token_count(para[: budget.cut_at + len(para[budget.cut_at:].split()[0])])
    short = token_budget(emb, TEXTS[1])
    assert short.cut_at is None and short.total == emb.token_count(TEXTS[1]) < limit


# ---------------------------------------------------------------- refusals


def test_folders_that_are_not_runnable_clip_are_refused(clip_b16_tiny_checkpoint, tmp_path) -> None:
    with pytest.raises(ModelNotInstalledError):
        ClipEmbedder(tmp_path / "absent")

    def variant(name: str) -> Path:
        d = tmp_path / name
        shutil.copytree(clip_b16_tiny_checkpoint, d)
        return d

    pickled = tmp_path / "pickled"
    pickled.mkdir()
    shutil.copy(clip_b16_tiny_checkpoint / "config.json", pickled / "config.json")
    (pickled / "longclip-B.pt").write_bytes(b"never unpickled")
    with pytest.raises(ModelIntegrityError, match="safetensors"):
        ClipEmbedder(pickled, device="cpu")

    remote = variant("remote")
    cfg = json.loads((remote / "config.json").read_text())
    cfg["auto_map"] = {"AutoModel": "modeling_fgclip.FGCLIPModel"}
    (remote / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelError, match="trust_remote_code"):
        ClipEmbedder(remote, device="cpu")

    for model_type, words in (("siglip", "SigLIP"), ("blip", "CLIPModel")):
        other = variant(f"type-{model_type}")
        cfg = json.loads((other / "config.json").read_text())
        cfg["model_type"] = model_type
        (other / "config.json").write_text(json.dumps(cfg))
        with pytest.raises(ModelError, match=words):
            ClipEmbedder(other, device="cpu")

    misfit = variant("misfit")
    cfg = json.loads((misfit / "config.json").read_text())
    cfg["text_config"]["num_hidden_layers"] = 3
    (misfit / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelIntegrityError, match="do not fit"):
        ClipEmbedder(misfit, device="cpu")

    resized = variant("resized")
    pre = json.loads((resized / "preprocessor_config.json").read_text())
    pre["crop_size"] = {"height": 32, "width": 32}
    (resized / "preprocessor_config.json").write_text(json.dumps(pre))
    with pytest.raises(ModelIntegrityError, match="64x64"):
        ClipEmbedder(resized, device="cpu")

    huge = variant("huge")
    pre["crop_size"], pre["size"] = {"height": 64, "width": 64}, {"shortest_edge": 10**7}
    (huge / "preprocessor_config.json").write_text(json.dumps(pre))
    with pytest.raises(ModelIntegrityError, match="shortest side"):
        ClipEmbedder(huge, device="cpu")

    pooled = variant("pooled")
    cfg = json.loads((pooled / "config.json").read_text())
    cfg["text_config"]["eos_token_id"] = 49406
    (pooled / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelIntegrityError, match="ends texts with 49407"):
        ClipEmbedder(pooled, device="cpu")

    no_tok = variant("no-tokenizer")
    for f in ("tokenizer.json", "vocab.json", "merges.txt"):
        (no_tok / f).unlink()
    with pytest.raises(ModelIntegrityError, match="no CLIP tokenizer"):
        ClipEmbedder(no_tok, device="cpu")


def test_tokenizer_from_vocab_and_merges_alone(clip_b16_tiny_checkpoint, tmp_path) -> None:
    """openai/clip-vit-large-patch14-336 is pinned without tokenizer.json: vocab.json + merges.txt."""
    d = tmp_path / "bpe-only"
    shutil.copytree(clip_b16_tiny_checkpoint, d)
    (d / "tokenizer.json").unlink()
    emb = ClipEmbedder(d, device="cpu")
    full = ClipEmbedder(clip_b16_tiny_checkpoint, device="cpu")
    for text in [*TEXTS, long_paragraph()]:
        assert emb.tokenize([text])["input_ids"].tolist() == full.tokenize([text])["input_ids"].tolist()


# ---------------------------------------------------------------- registry and backend


def test_import_detects_clip_and_the_registry_loads_the_fast_path(longclip_b_tiny_checkpoint, tmp_path) -> None:
    from engine.config import get_paths
    from engine.models.download import import_model
    from engine.models.registry import detect_backend, get_spec, import_backend, load_embedder

    assert detect_backend(longclip_b_tiny_checkpoint) == "clip"
    assert import_backend(longclip_b_tiny_checkpoint, "any-name") == "clip"
    assert import_backend(longclip_b_tiny_checkpoint, "blip-itm-base-coco") == "blip"  # a registered name's own
    paths = get_paths(tmp_path / "home").ensure()
    import_model(longclip_b_tiny_checkpoint, "tiny-long", paths, backend="clip")
    emb = load_embedder("tiny-long", paths, device="cpu")
    assert isinstance(emb, Embedder) and emb.backend == "clip" and emb.compute == "fast"
    assert (emb.max_text_tokens, emb.default_text_tokens) == (248, 248)
    assert emb.identity.startswith("tiny-long@") and emb.text_identity.startswith("tiny-long@")
    assert emb.identity != emb.text_identity
    # A registered Long-CLIP entry's default budget is its whole context.
    assert get_spec("longclip-b").default_text_tokens == 248 and get_spec("clip-vit-base-patch16").default_text_tokens == 77
    with pytest.raises(ModelError, match="BLIP"):
        import_model(longclip_b_tiny_checkpoint, "as-blip", paths, backend="blip")


def test_registered_clip_models() -> None:
    from engine.models.registry import get_spec

    for name, (dim, size, tokens) in {"clip-vit-base-patch16": (512, 224, 77), "clip-vit-large-patch14-336": (768, 336, 77),
                                      "longclip-b": (512, 224, 248), "longclip-l": (768, 224, 248)}.items():
        spec = get_spec(name)
        assert spec.backend == "clip" and (spec.dim, spec.image_size, spec.default_text_tokens) == (dim, size, tokens)
    # Long-CLIP's official .pt files are pulled by their pinned SHA-256 and converted at pull.
    assert list(get_spec("longclip-b").files) == ["longclip-B.pt"] and get_spec("longclip-b").fully_pinned
    assert get_spec("clip-vit-base-patch16").files["pytorch_model.bin"]


def test_stretch_positions_is_longclips_knowledge_preserved_stretching() -> None:
    gen = torch.Generator().manual_seed(0)
    table = torch.randn(77, 8, generator=gen)
    out = stretch_positions(table)
    assert out.shape == (248, 8)
    torch.testing.assert_close(out[:20], table[:20])
    for i in range(56):  # every later row of the 77 lands at 20 + 4i, with 3 interpolated rows after it
        torch.testing.assert_close(out[20 + 4 * i], table[20 + i])
        torch.testing.assert_close(out[22 + 4 * i], (table[20 + i] + table[21 + i]) / 2)
        torch.testing.assert_close(out[21 + 4 * i], 0.75 * table[20 + i] + 0.25 * table[21 + i])
    step = table[76] - table[75]
    for j in range(4):  # the last row, then extrapolated
        torch.testing.assert_close(out[244 + j], table[76] + j * step / 4)


def test_engine_import_stays_light() -> None:
    code = ("import sys, engine, engine.backends.clip, engine.backends.clip.checkpoints\n"
            "from engine.models.registry import get_backend; get_backend('clip')\n"
            "heavy = [m for m in ('torch', 'transformers', 'engine.backends.clip.embedder') if m in sys.modules]\n"
            "assert not heavy, heavy\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])
