"""engine/models/hf_dual_encoder.py serves BLIP and CLIP with one set of rules; each backend's words
in its messages (engine errors, ValueErrors) must stay its own, letter for letter."""

from __future__ import annotations

import json

import numpy as np
import pytest

from engine.backends.blip.embedder import BlipEmbedder
from engine.backends.blip.training import BlipAdapter, embed_training_scenes
from engine.backends.clip.embedder import ClipEmbedder
from engine.backends.clip.training import ClipAdapter
from engine.errors import ModelIntegrityError, ModelNotInstalledError

CLIP_PICKLE_HINT = " (Long-CLIP's official .pt files are converted once with `longlens models convert`)"


@pytest.mark.parametrize(("embedder_class", "missing", "hint"), [
    (BlipEmbedder, "BLIP checkpoint folder {} does not exist.", ""),
    (ClipEmbedder, "CLIP model folder {} does not exist.", CLIP_PICKLE_HINT),
])
def test_folder_checks_say_what_each_backend_said(tmp_path, embedder_class, missing, hint):
    absent = tmp_path / "absent"
    with pytest.raises(ModelNotInstalledError) as exc:
        embedder_class(absent, device="cpu")
    assert str(exc.value) == missing.format(absent)

    folder = tmp_path / "model"
    folder.mkdir()
    with pytest.raises(ModelIntegrityError) as exc:
        embedder_class(folder, device="cpu")
    assert str(exc.value) == f"{folder} has no config.json; it is not a model folder."

    (folder / "config.json").write_text(json.dumps({"model_type": "clip"}), encoding="utf-8")
    (folder / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(ModelIntegrityError) as exc:
        embedder_class(folder, device="cpu")
    assert str(exc.value) == f"{folder} only has pickle weights (.bin/.pt); Longlens loads safetensors only{hint}."
    (folder / "pytorch_model.bin").unlink()
    with pytest.raises(ModelIntegrityError) as exc:
        embedder_class(folder, device="cpu")
    assert str(exc.value) == f"{folder} has no model.safetensors."


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize(("fixture", "embedder_class", "adapter_class", "special"), [
    ("blip_tiny_checkpoint", BlipEmbedder, BlipAdapter, "[CLS] and [SEP]"),
    ("clip_b16_tiny_checkpoint", ClipEmbedder, ClipAdapter, "<|startoftext|> and <|endoftext|>"),
])
def test_budget_and_training_messages_name_each_backends_tokens_and_class(
        request, fixture, embedder_class, adapter_class, special):
    folder = request.getfixturevalue(fixture)
    emb = embedder_class(folder, device="cpu", dtype="bfloat16")
    with pytest.raises(ValueError) as exc:
        emb.effective_max_tokens(1)
    assert str(exc.value) == f"max_tokens must be at least 2 ({special})"
    assert emb.effective_max_tokens(10_000) == emb.max_text_tokens  # a larger budget is clamped, not refused
    with pytest.raises(ValueError) as exc:
        adapter_class(emb)
    assert str(exc.value) == f"train on a {embedder_class.__name__} loaded with dtype='float32'"


@pytest.mark.usefixtures("one_thread")
def test_blip_training_scenes_of_an_empty_set_are_an_empty_array(blip_tiny_checkpoint):
    # The shared SceneWorld renderer answers no scenes with no rows, as CLIP's hook always did.
    out = embed_training_scenes(blip_tiny_checkpoint, [], "cpu")
    assert out.shape == (0, BlipEmbedder(blip_tiny_checkpoint, device="cpu").dim) and out.dtype == np.float32
