"""BlipEmbedder against transformers' own BLIP: tokenizer, pixels, features, scores.

Everything runs offline on random-weight checkpoints written by engine.backends.blip.checkpoints.
The weights are re-initialised with a visible spread, and the tests assert that different
inputs give clearly different embeddings, so parity cannot hold by collapse.
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
from safetensors.torch import load_file, save_file
from transformers import BertTokenizerFast, BlipForImageTextRetrieval, BlipImageProcessorPil

from engine.backends.blip.checkpoints import (
    BLIP_DEC_TOKEN_ID,
    BLIP_ENC_TOKEN_ID,
    BLIP_IMAGE_MEAN,
    BLIP_IMAGE_STD,
    base_blip_config,
    bert_uncased_vocab_file,
    build_blip_tokenizer,
    save_random_blip_checkpoint,
    tiny_blip_config,
)
from engine.backends.blip.embedder import (
    TEXT_TOWER_META,
    TEXT_TOWER_WEIGHTS,
    BlipEmbedder,
    resolve_device,
    resolve_dtype,
    save_text_tower,
)
from engine.errors import ModelError, ModelIntegrityError, ModelNotInstalledError
from engine.models.base import Embedder

TOL = 1e-4

TEXTS = [
    "a red square on a white background",
    "A grey gradient, darker at the top.",
    "Two dogs playing in the snow next to a wooden fence while children watch from the porch.",
]

SENTENCES = [
    "Hello world!",
    "A photo of the Eiffel Tower at sunset, naïve café owners waving.",
    "UPPER case, lower case; numbers 12345 and symbols #@%&*.",
    "Grandma's 80th birthday party — cake, candles and 中文 characters.",
]


def sample_images() -> list[Image.Image]:
    """Images of different sizes and modes that look nothing alike."""
    rng = np.random.default_rng(7)
    red = Image.new("RGB", (120, 80), (230, 20, 20))
    gradient = Image.linear_gradient("L").resize((70, 90))
    noise = Image.fromarray(rng.integers(0, 256, (50, 64, 3), dtype=np.uint8), "RGB")
    rgba = np.zeros((96, 96, 4), dtype=np.uint8)
    rgba[..., 1] = 200
    rgba[:, 40:, 3] = np.linspace(0, 255, 56, dtype=np.uint8)[None, :]  # transparent left part, then a ramp
    checker = (((np.indices((100, 140)).sum(axis=0) // 10) % 2) * 255).astype(np.uint8)
    palette = Image.fromarray(checker, "L").convert("P")
    yy, xx = np.mgrid[0:480, 0:640]
    photo = np.stack([xx * 255 // 640, yy * 255 // 480, (xx + yy) * 255 // 1120], axis=-1).astype(np.uint8)
    return [
        red,
        gradient,
        noise,
        Image.fromarray(rgba, "RGBA"),
        palette,
        Image.fromarray(photo, "RGB"),
    ]


def mode_images() -> list[Image.Image]:
    """Every conversion path of transformers' convert_to_rgb."""
    images = sample_images()
    paletted_transparent = images[4].copy()
    paletted_transparent.info["transparency"] = 0
    la = Image.merge("LA", (images[1], Image.linear_gradient("L").resize((70, 90)).rotate(90)))
    return [
        *images,
        paletted_transparent,
        la,
        images[0].convert("CMYK"),
        Image.new("RGB", (64, 64), (1, 2, 3)),
    ]


def long_paragraph() -> str:
    colours = ["red", "blue", "green", "yellow", "purple", "orange", "black", "white"]
    animals = ["cat", "dog", "horse", "parrot", "goat", "rabbit", "fox"]
    places = ["harbour", "kitchen", "garden", "station", "library", "beach"]
    sentences = [
        f"In picture {i}, a {colours[i % 8]} {animals[i % 7]} waits near the {places[i % 6]} "
        f"while {i + 2} people walk past."
        for i in range(40)
    ]
    return " ".join(sentences)


def reference_outputs(
    model: BlipForImageTextRetrieval, pixel_values: np.ndarray, tokens: dict[str, torch.Tensor]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """transformers' use_itm_head=False forward: (scores, image features, text features)."""
    with torch.inference_mode():
        out = model(
            input_ids=tokens["input_ids"],
            attention_mask=tokens["attention_mask"],
            pixel_values=torch.from_numpy(pixel_values),
            use_itm_head=False,
        )
        image_feat = F.normalize(model.vision_proj(out.last_hidden_state[:, 0, :]), dim=-1)
        text_feat = F.normalize(model.text_proj(out.question_embeds[:, 0, :]), dim=-1)
    return out.itm_score.numpy(), image_feat.numpy(), text_feat.numpy()


def reference_text_features(
    model: BlipForImageTextRetrieval, tokenizer: BertTokenizerFast, texts: list[str], max_length: int | None
) -> np.ndarray:
    enc = tokenizer(
        texts, padding=True, truncation=max_length is not None, max_length=max_length, return_tensors="pt"
    )
    dummy = np.zeros(
        (1, 3, model.config.vision_config.image_size, model.config.vision_config.image_size), np.float32
    )
    return reference_outputs(model, dummy, enc)[2]


def max_off_diagonal(feats: np.ndarray) -> float:
    sims = feats @ feats.T
    return float(np.max(sims[~np.eye(len(feats), dtype=bool)]))


def load_reference(checkpoint: Path) -> BlipForImageTextRetrieval:
    return BlipForImageTextRetrieval.from_pretrained(str(checkpoint), local_files_only=True).eval()


@pytest.fixture(scope="module")
def tiny_embedder(blip_tiny_checkpoint: Path) -> BlipEmbedder:
    return BlipEmbedder(blip_tiny_checkpoint, device="cpu")


@pytest.fixture(scope="module")
def tiny_reference(blip_tiny_checkpoint: Path) -> BlipForImageTextRetrieval:
    return load_reference(blip_tiny_checkpoint)


@pytest.fixture(scope="module")
def checkpoint_tokenizer(blip_tiny_checkpoint: Path) -> BertTokenizerFast:
    return BertTokenizerFast.from_pretrained(str(blip_tiny_checkpoint), local_files_only=True)


# ---------------------------------------------------------------- tokenizer


def test_tokenizer_has_blip_layout() -> None:
    tok = build_blip_tokenizer()
    assert len(tok) == 30524
    assert (
        tok.convert_tokens_to_ids(["[DEC]", "[ENC]"])
        == [BLIP_DEC_TOKEN_ID, BLIP_ENC_TOKEN_ID]
        == [30522, 30523]
    )
    assert tok.bos_token == "[DEC]" and tok.bos_token_id == 30522
    assert "[ENC]" in tok.all_special_tokens
    assert (tok.cls_token_id, tok.sep_token_id, tok.pad_token_id) == (101, 102, 0)
    assert tok.model_max_length == 512
    assert tok("hello world")["input_ids"] == [101, 7592, 2088, 102]
    assert tok("HeLLo WORLD")["input_ids"] == [101, 7592, 2088, 102]  # lower-cased
    assert tok.tokenize("the [ENC] and [DEC] dog") == ["the", "[ENC]", "and", "[DEC]", "dog"]


def test_tokenizer_wordpieces_equal_bert_uncased() -> None:
    tok = build_blip_tokenizer()
    bert = BertTokenizerFast.from_pretrained(str(bert_uncased_vocab_file().parent), local_files_only=True)
    for sentence in SENTENCES:
        assert tok(sentence)["input_ids"] == bert(sentence)["input_ids"], sentence
    assert tok.tokenize(SENTENCES[1]) == [
        "a", "photo", "of", "the", "e", "##iff", "##el", "tower", "at", "sunset", ",",
        "naive", "cafe", "owners", "waving", ".",
    ]  # fmt: skip


def test_tokenizer_refuses_wrong_vocab(tmp_path: Path) -> None:
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\n", encoding="utf-8")
    with pytest.raises(ModelError, match="30522"):
        build_blip_tokenizer(vocab)


def test_checkpoint_tokenizer_files_roundtrip(blip_tiny_checkpoint: Path, checkpoint_tokenizer) -> None:
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        assert (blip_tiny_checkpoint / name).is_file(), name
    vocab_lines = (blip_tiny_checkpoint / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert vocab_lines == bert_uncased_vocab_file().read_text(encoding="utf-8").splitlines()
    special = json.loads((blip_tiny_checkpoint / "special_tokens_map.json").read_text())
    assert special["bos_token"] == "[DEC]" and special["additional_special_tokens"] == ["[ENC]"]
    built = build_blip_tokenizer()
    assert len(checkpoint_tokenizer) == 30524
    assert checkpoint_tokenizer.convert_tokens_to_ids(["[DEC]", "[ENC]"]) == [30522, 30523]
    for sentence in SENTENCES:
        assert checkpoint_tokenizer(sentence)["input_ids"] == built(sentence)["input_ids"]


# ---------------------------------------------------------------- pixels


def test_pixel_values_equal_blip_image_processor(
    tiny_embedder: BlipEmbedder, blip_tiny_checkpoint: Path
) -> None:
    processor = BlipImageProcessorPil.from_pretrained(str(blip_tiny_checkpoint))
    images = mode_images()
    ours = tiny_embedder.preprocess(images)
    assert ours.shape == (len(images), 3, 64, 64) and ours.dtype == np.float32
    for i, image in enumerate(images):
        ref = processor([image], return_tensors="np")["pixel_values"][0]
        np.testing.assert_allclose(ours[i], ref, atol=1e-5, rtol=0, err_msg=f"image {i} mode {image.mode}")
    # The RGBA image must come out white where alpha is 0 (composited, not black or green).
    mean, std = np.array(BLIP_IMAGE_MEAN), np.array(BLIP_IMAGE_STD)
    white = (1.0 - mean) / std
    np.testing.assert_allclose(ours[3, :, 32, 0], white, atol=1e-4)


def test_pixel_defaults_without_preprocessor_config(blip_tiny_checkpoint: Path, tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    shutil.copytree(blip_tiny_checkpoint, bare)
    (bare / "preprocessor_config.json").unlink()
    ours = BlipEmbedder(bare, device="cpu").preprocess(mode_images())
    ref = BlipImageProcessorPil(size={"height": 64, "width": 64})(mode_images(), return_tensors="np")
    np.testing.assert_allclose(ours, ref["pixel_values"], atol=1e-5, rtol=0)


# ---------------------------------------------------------------- tiny model parity


def test_tiny_features_and_scores_match_reference(
    tiny_embedder: BlipEmbedder,
    tiny_reference: BlipForImageTextRetrieval,
    blip_tiny_checkpoint: Path,
    checkpoint_tokenizer,
) -> None:
    images = sample_images()
    processor = BlipImageProcessorPil.from_pretrained(str(blip_tiny_checkpoint))
    ref_pixels = processor(images, return_tensors="np")["pixel_values"].astype(np.float32)
    ref_tokens = checkpoint_tokenizer(TEXTS, padding=True, return_tensors="pt")
    ref_scores, ref_img, ref_txt = reference_outputs(tiny_reference, ref_pixels, ref_tokens)

    img = tiny_embedder.encode_images(images)
    txt = tiny_embedder.encode_texts(TEXTS)
    for feats in (img, txt):
        assert feats.dtype == np.float32
        np.testing.assert_allclose(np.linalg.norm(feats, axis=1), 1.0, atol=1e-5)
    assert img.shape == (len(images), 32) and txt.shape == (len(TEXTS), 32)

    np.testing.assert_allclose(img, ref_img, atol=TOL, rtol=0)
    np.testing.assert_allclose(txt, ref_txt, atol=TOL, rtol=0)
    np.testing.assert_allclose(img @ txt.T, ref_scores, atol=TOL, rtol=0)

    # Guards against the 1e-10-init trap: distinct inputs must land far apart.
    assert max_off_diagonal(img) < 0.95
    assert max_off_diagonal(txt) < 0.99
    assert np.ptp(ref_scores) > 0.05


def test_encode_pixels_and_batching_are_consistent(tiny_embedder: BlipEmbedder) -> None:
    images = sample_images()
    whole = tiny_embedder.encode_pixels(tiny_embedder.preprocess(images))
    old = tiny_embedder.batch_size
    try:
        tiny_embedder.batch_size = 2
        np.testing.assert_allclose(tiny_embedder.encode_images(images), whole, atol=1e-5)
        texts = [TEXTS[2], TEXTS[0], long_paragraph(), TEXTS[1], "x"]
        batched = tiny_embedder.encode_texts(texts)
        tiny_embedder.batch_size = 1
        one_by_one = tiny_embedder.encode_texts(texts)
    finally:
        tiny_embedder.batch_size = old
    np.testing.assert_allclose(batched, one_by_one, atol=1e-5)
    assert tiny_embedder.encode_images([]).shape == (0, 32)
    assert tiny_embedder.encode_texts([]).shape == (0, 32)
    with pytest.raises(ModelError, match="shape"):
        tiny_embedder.encode_pixels(np.zeros((1, 3, 32, 32), np.float32))


def test_embedder_attributes(tiny_embedder: BlipEmbedder, blip_tiny_checkpoint: Path) -> None:
    assert isinstance(tiny_embedder, Embedder)
    assert tiny_embedder.model_id == tiny_embedder.text_model_id == "blip-tiny"
    assert (tiny_embedder.dim, tiny_embedder.image_size) == (32, 64)
    assert (tiny_embedder.max_text_tokens, tiny_embedder.default_text_tokens) == (512, 128)
    assert (tiny_embedder.device, tiny_embedder.dtype) == ("cpu", "float32")
    assert not tiny_embedder.model.training
    assert all(p.dtype == torch.float32 for p in tiny_embedder.model.parameters())
    named = BlipEmbedder(
        blip_tiny_checkpoint, device="cpu", model_id="blip/tiny@abc", default_text_tokens=900
    )
    assert named.model_id == named.text_model_id == "blip/tiny@abc"
    assert named.default_text_tokens == 512


def test_bfloat16_runs_close_to_float32(tiny_embedder: BlipEmbedder, blip_tiny_checkpoint: Path) -> None:
    half = BlipEmbedder(blip_tiny_checkpoint, device="cpu", dtype="bf16")
    assert half.dtype == "bfloat16"
    images = sample_images()[:3]
    low = half.encode_images(images)
    assert low.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(low, axis=1), 1.0, atol=1e-5)
    assert np.min(np.sum(low * tiny_embedder.encode_images(images), axis=1)) > 0.98
    with pytest.raises(ModelError, match="dtype"):
        BlipEmbedder(blip_tiny_checkpoint, device="cpu", dtype="int3")


# ---------------------------------------------------------------- truncation


def test_long_text_is_truncated_like_the_tokenizer(
    tiny_embedder: BlipEmbedder, tiny_reference: BlipForImageTextRetrieval, checkpoint_tokenizer, capfd
) -> None:
    para = long_paragraph()
    count = tiny_embedder.token_count(para)
    assert count > 600
    assert count == len(checkpoint_tokenizer(para, verbose=False)["input_ids"])
    assert tiny_embedder.token_count("hello world") == 4
    assert "longer than the specified maximum" not in capfd.readouterr().err

    at_128 = tiny_embedder.encode_texts([para], max_tokens=128)
    np.testing.assert_allclose(
        at_128, reference_text_features(tiny_reference, checkpoint_tokenizer, [para], 128), atol=TOL, rtol=0
    )
    np.testing.assert_allclose(tiny_embedder.encode_texts([para]), at_128, atol=1e-6)  # default budget 128

    at_512 = tiny_embedder.encode_texts([para], max_tokens=512)
    np.testing.assert_allclose(
        at_512, reference_text_features(tiny_reference, checkpoint_tokenizer, [para], 512), atol=TOL, rtol=0
    )
    assert float(at_128[0] @ at_512[0]) < 0.999  # the extra tokens were really read
    # Beyond the 512 position embeddings the budget is clamped, not a crash.
    np.testing.assert_allclose(tiny_embedder.encode_texts([para], max_tokens=2000), at_512, atol=1e-6)
    with pytest.raises(ValueError):
        tiny_embedder.encode_texts([para], max_tokens=1)


# ---------------------------------------------------------------- text tower override


def _perturbed_reference(checkpoint: Path) -> BlipForImageTextRetrieval:
    model = load_reference(checkpoint)
    gen = torch.Generator().manual_seed(123)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.startswith(("text_encoder.", "text_proj.")):
                param.add_(torch.randn(param.shape, generator=gen) * 0.05)
    return model


def test_text_tower_override(
    tiny_embedder: BlipEmbedder, blip_tiny_checkpoint: Path, checkpoint_tokenizer, tmp_path: Path
) -> None:
    trained = _perturbed_reference(blip_tiny_checkpoint)
    tower = save_text_tower(trained, tmp_path / "tower", "para-v1", base_model_id="blip-tiny")
    keys = set(load_file(str(tower / TEXT_TOWER_WEIGHTS)))
    assert keys and all(k.startswith(("text_encoder.", "text_proj.")) for k in keys)
    assert any(k.startswith("text_proj.") for k in keys)
    meta = json.loads((tower / TEXT_TOWER_META).read_text())
    assert meta["name"] == "para-v1" and meta["dim"] == 32 and meta["created"]

    overridden = BlipEmbedder(blip_tiny_checkpoint, device="cpu", text_tower_dir=tower)
    assert overridden.model_id == "blip-tiny"
    assert overridden.text_model_id == "blip-tiny+para-v1"

    expected = reference_text_features(trained, checkpoint_tokenizer, TEXTS, None)
    got = overridden.encode_texts(TEXTS)
    np.testing.assert_allclose(got, expected, atol=TOL, rtol=0)
    assert np.max(np.abs(got - tiny_embedder.encode_texts(TEXTS))) > 1e-2  # the override took effect
    images = sample_images()[:3]
    np.testing.assert_array_equal(overridden.encode_images(images), tiny_embedder.encode_images(images))

    # An embedder is accepted too, and records its own model_id as the base.
    again = save_text_tower(overridden, tmp_path / "again", "para-v2")
    assert json.loads((again / TEXT_TOWER_META).read_text())["base_model_id"] == "blip-tiny"


def test_text_tower_mismatch_is_refused(blip_tiny_checkpoint: Path, tmp_path: Path) -> None:
    tower = save_text_tower(load_reference(blip_tiny_checkpoint), tmp_path / "tower", "t")
    tensors = load_file(str(tower / TEXT_TOWER_WEIGHTS))

    key = "text_proj.weight"
    wrong_shape = dict(tensors, **{key: torch.zeros(16, 32)})
    save_file(wrong_shape, str(tower / TEXT_TOWER_WEIGHTS))
    with pytest.raises(ModelError, match="wrong shapes: text_proj.weight"):
        BlipEmbedder(blip_tiny_checkpoint, device="cpu", text_tower_dir=tower)

    missing = {k: v for k, v in tensors.items() if k != key}
    save_file(missing, str(tower / TEXT_TOWER_WEIGHTS))
    with pytest.raises(ModelError, match="missing keys: text_proj.weight"):
        BlipEmbedder(blip_tiny_checkpoint, device="cpu", text_tower_dir=tower)

    foreign = dict(tensors, **{"vision_proj.weight": torch.zeros(32, 32)})
    save_file(foreign, str(tower / TEXT_TOWER_WEIGHTS))
    with pytest.raises(ModelError, match="unknown keys: vision_proj.weight"):
        BlipEmbedder(blip_tiny_checkpoint, device="cpu", text_tower_dir=tower)

    save_file(tensors, str(tower / TEXT_TOWER_WEIGHTS))
    meta = json.loads((tower / TEXT_TOWER_META).read_text())
    meta["arch_hash"] = "0" * 16
    (tower / TEXT_TOWER_META).write_text(json.dumps(meta))
    with pytest.raises(ModelError, match="different BLIP architecture"):
        BlipEmbedder(blip_tiny_checkpoint, device="cpu", text_tower_dir=tower)

    with pytest.raises(ModelNotInstalledError):
        BlipEmbedder(blip_tiny_checkpoint, device="cpu", text_tower_dir=tmp_path / "nowhere")


# ---------------------------------------------------------------- devices and loading


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_unavailable_cuda_is_a_model_error(blip_tiny_checkpoint: Path) -> None:
    with pytest.raises(ModelError, match="CUDA"):
        resolve_device("cuda")
    with pytest.raises(ModelError, match="CUDA"):
        resolve_device("cuda:1")
    with pytest.raises(ModelError, match="CUDA"):
        BlipEmbedder(blip_tiny_checkpoint, device="cuda")


@pytest.mark.skipif(
    torch.cuda.is_available() or torch.backends.mps.is_available(), reason="an accelerator is available"
)
def test_auto_device_is_cpu_without_accelerator() -> None:
    assert resolve_device("auto") == "cpu"
    assert resolve_device("CPU") == "cpu"
    assert resolve_dtype(None, "cpu") == torch.float32
    assert resolve_dtype(None, "cuda") == torch.float16


def test_unknown_device_is_refused() -> None:
    with pytest.raises(ModelError, match="Unknown device"):
        resolve_device("tpu")


def test_missing_or_pickled_checkpoints_are_refused(blip_tiny_checkpoint: Path, tmp_path: Path) -> None:
    with pytest.raises(ModelNotInstalledError):
        BlipEmbedder(tmp_path / "absent")

    pickled = tmp_path / "pickled"
    pickled.mkdir()
    shutil.copy(blip_tiny_checkpoint / "config.json", pickled / "config.json")
    (pickled / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(ModelIntegrityError, match="safetensors"):
        BlipEmbedder(pickled, device="cpu")

    misfit = tmp_path / "misfit"
    shutil.copytree(blip_tiny_checkpoint, misfit)
    config = json.loads((misfit / "config.json").read_text())
    config["text_config"]["num_hidden_layers"] = 3  # layer 2 has no weights in the file
    (misfit / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelIntegrityError, match="do not fit"):
        BlipEmbedder(misfit, device="cpu")

    foreign = tmp_path / "foreign"
    shutil.copytree(blip_tiny_checkpoint, foreign)
    config = json.loads((foreign / "config.json").read_text())
    config["model_type"] = "clip"
    (foreign / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelIntegrityError):
        BlipEmbedder(foreign, device="cpu")

    resized = tmp_path / "resized"
    shutil.copytree(blip_tiny_checkpoint, resized)
    pre = json.loads((resized / "preprocessor_config.json").read_text())
    pre["size"] = {"height": 32, "width": 32}
    (resized / "preprocessor_config.json").write_text(json.dumps(pre))
    with pytest.raises(ModelIntegrityError, match="64x64"):
        BlipEmbedder(resized, device="cpu")


# ---------------------------------------------------------------- checkpoints


def test_random_checkpoints_are_seeded_and_not_degenerate(blip_tiny_checkpoint: Path, tmp_path: Path) -> None:
    files = {p.name for p in blip_tiny_checkpoint.iterdir()}
    assert {"config.json", "model.safetensors", "preprocessor_config.json"} <= files
    pre = json.loads((blip_tiny_checkpoint / "preprocessor_config.json").read_text())
    assert pre["size"] == {"height": 64, "width": 64} and pre["resample"] == 3

    first = load_file(str(blip_tiny_checkpoint / "model.safetensors"))
    same = load_file(str(save_random_blip_checkpoint(tmp_path / "same", seed=0) / "model.safetensors"))
    other = load_file(str(save_random_blip_checkpoint(tmp_path / "other", seed=1) / "model.safetensors"))
    assert first.keys() == same.keys() == other.keys()
    assert all(torch.equal(first[k], same[k]) for k in first)
    assert not torch.equal(first["vision_proj.weight"], other["vision_proj.weight"])
    # The vision position/class embeddings are where transformers' 1e-10 init would bite.
    assert float(first["vision_model.embeddings.position_embedding"].std()) > 0.05
    assert float(first["vision_model.embeddings.class_embedding"].std()) > 0.05


def test_configs() -> None:
    tiny = tiny_blip_config()
    assert tiny.text_config.vocab_size == 30524 and tiny.text_config.max_position_embeddings == 512
    base = base_blip_config()
    v, t = base.vision_config, base.text_config
    assert (v.hidden_size, v.intermediate_size) == (768, 3072)
    assert (v.num_hidden_layers, v.num_attention_heads) == (12, 12)
    assert (v.image_size, v.patch_size, v.layer_norm_eps, v.hidden_act) == (384, 16, 1e-5, "gelu")
    assert (t.vocab_size, t.hidden_size, t.intermediate_size) == (30524, 768, 3072)
    assert (t.num_hidden_layers, t.num_attention_heads, t.encoder_hidden_size) == (12, 12, 768)
    assert (t.max_position_embeddings, t.is_decoder) == (512, True)
    assert (base.image_text_hidden_size, base.projection_dim) == (256, 512)


def test_engine_import_stays_light() -> None:
    code = (
        "import sys, engine, engine.models, engine.models.base, engine.backends.blip.checkpoints\n"
        "heavy = [m for m in ('torch', 'transformers', 'engine.backends.blip.embedder') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])


# ---------------------------------------------------------------- full-size architecture


@pytest.fixture(scope="module")
def base_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """blip-itm-base-coco's architecture with random weights (~900 MB), written once per module."""
    return save_random_blip_checkpoint(tmp_path_factory.mktemp("blip-base") / "blip-base-random", size="base")


@pytest.mark.slow
def test_base_architecture_matches_reference(base_checkpoint: Path) -> None:
    embedder = BlipEmbedder(base_checkpoint, device="cpu")
    assert (embedder.dim, embedder.image_size, embedder.max_text_tokens) == (256, 384, 512)
    assert sum(p.numel() for p in embedder.model.parameters()) == 223_744_258

    images = [sample_images()[5], sample_images()[0]]
    texts = TEXTS[:2]
    processor = BlipImageProcessorPil.from_pretrained(str(base_checkpoint))
    ref_pixels = processor(images, return_tensors="np")["pixel_values"].astype(np.float32)
    ours_pixels = embedder.preprocess(mode_images())
    for i, image in enumerate(mode_images()):
        np.testing.assert_allclose(
            ours_pixels[i], processor([image], return_tensors="np")["pixel_values"][0], atol=1e-5, rtol=0
        )

    img = embedder.encode_pixels(ours_pixels[[5, 0]])
    txt = embedder.encode_texts(texts)
    tokens = BertTokenizerFast.from_pretrained(str(base_checkpoint), local_files_only=True)(
        texts, padding=True, return_tensors="pt"
    )
    reference = load_reference(base_checkpoint)
    ref_scores, ref_img, ref_txt = reference_outputs(reference, ref_pixels, tokens)
    del reference

    np.testing.assert_allclose(img, ref_img, atol=TOL, rtol=0)
    np.testing.assert_allclose(txt, ref_txt, atol=TOL, rtol=0)
    np.testing.assert_allclose(img @ txt.T, ref_scores, atol=TOL, rtol=0)
    assert max_off_diagonal(img) < 0.9
    assert max_off_diagonal(txt) < 0.99
