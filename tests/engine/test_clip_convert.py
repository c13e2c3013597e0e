"""The OpenAI-layout converter (engine/backends/clip/convert.py): a random OpenAI-layout state dict
(plain CLIP and Long-CLIP with its two position tables) saved as a real .pt, converted only after
its pinned SHA-256 matched, loaded by the CLIP backend and compared with the official forward
(tests/engine/clip_reference.py, transcribed from OpenAI's clip/model.py and Long-CLIP's
model/model_longclip.py) on real image files and OpenAI-tokenized texts."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from safetensors import safe_open

from engine.backends.clip.convert import convert_openai_checkpoint, openai_to_hf
from engine.backends.clip.embedder import ClipEmbedder
from engine.errors import ModelError, ModelIntegrityError
from engine.jobs import CancelToken
from engine.sceneworld import generate_scene
from engine.sceneworld.render import render_scene
from tests.engine.clip_reference import OpenAIBPE, random_openai_state_dict, reference_model

TOL = 1e-5
TEXTS = [
    "a photo of a cat",
    "A red bicycle leans against a blue door in the morning light.",
    "grey sky",
    "Two dogs play in the snow next to a wooden fence while children watch from the porch, and a crow "
    "sits on the gate. " * 6,  # past 77 tokens: Long-CLIP reads it all, CLIP truncates
]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run(job):
    """Drive a job generator to its return value."""
    while True:
        try:
            next(job)
        except StopIteration as stop:
            return stop.value


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> list[Image.Image]:
    folder = tmp_path_factory.mktemp("convert-photos")
    out = []
    for i, size in enumerate([(320, 240), (240, 320), (150, 150), (500, 200), (90, 120), (256, 256)]):
        image, _ = render_scene(generate_scene(5000, i), 256)
        path = folder / (f"p{i}.jpg" if i % 2 else f"p{i}.png")
        image.resize(size).save(path)
        with Image.open(path) as im:
            out.append(im.convert("RGB"))
    return out


@pytest.fixture(scope="module", params=["openai", "longclip"])
def converted(request, tmp_path_factory):
    """(layout, state dict, converted folder) for a plain OpenAI CLIP and a Long-CLIP checkpoint."""
    longclip = request.param == "longclip"
    state = random_openai_state_dict(context=248 if longclip else 77, longclip=longclip, seed=1 if longclip else 0)
    tmp = tmp_path_factory.mktemp(f"convert-{request.param}")
    pt = tmp / "checkpoint.pt"
    torch.save(state, pt)
    folder = run(convert_openai_checkpoint(pt, tmp / "hf", sha256=sha256(pt), size=pt.stat().st_size))
    return request.param, state, folder


def test_converted_folder_equals_the_official_forward(converted, photos) -> None:
    layout, state, folder = converted
    reference = reference_model(state)
    emb = ClipEmbedder(folder, device="cpu")
    context = 248 if layout == "longclip" else 77
    assert (emb.max_text_tokens, emb.image_size, emb.dim) == (context, 64, 64)
    assert emb.tokenizer.model_max_length == context

    pixels = emb.preprocess(photos)
    tokens = OpenAIBPE().batch(TEXTS, context)  # zero-padded, as the official tokenize() returns them
    with torch.inference_mode():
        want_i = F.normalize(reference.encode_image(torch.from_numpy(pixels)), dim=-1).numpy()
        want_t = F.normalize(reference.encode_text(tokens), dim=-1).numpy()
    got_i, got_t = emb.encode_pixels(pixels), emb.encode_texts(TEXTS)
    np.testing.assert_allclose(got_i, want_i, atol=TOL, rtol=0)
    np.testing.assert_allclose(got_t, want_t, atol=TOL, rtol=0)
    ref_rank = [list(np.argsort(-(want_i @ t))[:5]) for t in want_t]
    assert [list(np.argsort(-(got_i @ t))[:5]) for t in got_t] == ref_rank
    # Not collapsed: texts and images land apart.
    sims = want_t @ want_t.T
    assert np.max(sims[~np.eye(len(TEXTS), dtype=bool)]) < 0.95
    # transformers' own forward on the converted folder agrees too.
    ref_hf = ClipEmbedder(folder, device="cpu", compute="reference")
    np.testing.assert_allclose(ref_hf.encode_texts(TEXTS), want_t, atol=TOL, rtol=0)


def test_longclip_position_tables_are_combined_as_its_forward_adds_them(tmp_path) -> None:
    state = random_openai_state_dict(context=248, longclip=True)
    config, tensors = openai_to_hf(state)
    table = tensors["text_model.embeddings.position_embedding.weight"]
    torch.testing.assert_close(table[:20], state["positional_embedding"][:20])
    torch.testing.assert_close(table[20:], state["positional_embedding_res"][20:])
    assert config.text_config.max_position_embeddings == 248
    assert (config.vision_config.num_attention_heads, config.text_config.num_attention_heads) == (2, 2)
    assert config.text_config.eos_token_id == 2  # OpenAI's "pool at the highest id"


def test_files_of_the_converted_folder(converted) -> None:
    _, state, folder = converted
    names = {p.name for p in folder.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "vocab.json",
            "merges.txt", "special_tokens_map.json", "preprocessor_config.json"} <= names
    assert not any(p.suffix in (".pt", ".bin") for p in folder.iterdir())
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        keys = set(f.keys())
        assert all(f.get_tensor(k).dtype == torch.float32 for k in keys)
    assert "text_projection.weight" in keys and "vision_model.encoder.layers.1.self_attn.q_proj.weight" in keys
    pre = json.loads((folder / "preprocessor_config.json").read_text())
    assert pre["size"] == {"shortest_edge": 64} and pre["crop_size"] == {"height": 64, "width": 64}
    assert not list(folder.parent.glob(".*partial*"))


def test_a_file_not_matching_its_pin_is_never_unpickled(tmp_path, monkeypatch) -> None:
    pt = tmp_path / "c.pt"
    torch.save(random_openai_state_dict(), pt)
    loads = []
    original = torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **k: loads.append(1) or original(*a, **k))
    with pytest.raises(ModelIntegrityError, match="pinned SHA-256"):
        run(convert_openai_checkpoint(pt, tmp_path / "out", sha256="0" * 64))
    with pytest.raises(ModelIntegrityError, match="bytes"):
        run(convert_openai_checkpoint(pt, tmp_path / "out", sha256=sha256(pt), size=123))
    assert loads == [] and not (tmp_path / "out").exists()


class NotATensor:
    """Unpickling this needs code (a class from a module), which weights_only refuses."""

    def __reduce__(self):
        return (print, ("this would run",))


def test_a_pickle_that_needs_code_is_refused(tmp_path, capsys) -> None:
    pt = tmp_path / "evil.pt"
    torch.save({"visual.proj": NotATensor()}, pt)
    with pytest.raises(ModelIntegrityError, match="needs code to unpickle"):
        run(convert_openai_checkpoint(pt, tmp_path / "out", sha256=sha256(pt)))
    assert "this would run" not in capsys.readouterr().out
    assert not (tmp_path / "out").exists()


def test_state_dicts_that_are_not_openai_vit_clip_are_refused(tmp_path) -> None:
    state = random_openai_state_dict()
    with pytest.raises(ModelIntegrityError, match="visual.extra"):
        openai_to_hf({**state, "visual.extra": torch.zeros(1)})
    with pytest.raises(ModelIntegrityError, match="ln_final"):
        openai_to_hf({k: v for k, v in state.items() if not k.startswith("ln_final")})
    with pytest.raises(ModelError, match="ResNet"):
        openai_to_hf({**state, "visual.layer1.0.conv1.weight": torch.zeros(1)})
    bad = dict(state, positional_embedding_res=torch.zeros(77, 128))
    with pytest.raises(ModelIntegrityError, match="248"):
        openai_to_hf(bad)
    pt = tmp_path / "list.pt"
    torch.save([1, 2], pt)
    with pytest.raises(ModelIntegrityError, match="state dict"):
        run(convert_openai_checkpoint(pt, tmp_path / "out", sha256=sha256(pt)))


def test_existing_output_is_left_alone_and_cancel_stops(tmp_path) -> None:
    pt = tmp_path / "c.pt"
    torch.save(random_openai_state_dict(), pt)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    with pytest.raises(ModelError, match="already exists"):
        run(convert_openai_checkpoint(pt, tmp_path / "out", sha256=sha256(pt)))
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["keep.txt"]
    token = CancelToken()
    token.cancel()
    from engine.errors import JobCancelled

    with pytest.raises(JobCancelled):
        run(convert_openai_checkpoint(pt, tmp_path / "new", sha256=sha256(pt), cancel=token))
    assert not (tmp_path / "new").exists()
