"""The CLIP backend's training adapter and text-tower overrides (engine/backends/clip/training.py,
text_tower.py) on tiny random CLIP and Long-CLIP folders: the adapter embeds exactly as the app
does, only the text side gets gradients, a trained tower round-trips through its folder, a tower
that does not fit is refused with why, a config that trains both towers writes a loadable CLIP
folder, and an imported model's text_tower/ is read like BLIP's."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

from engine.backends.clip.embedder import ClipEmbedder
from engine.backends.clip.text_tower import TEXT_TOWER_META, TEXT_TOWER_WEIGHTS, save_text_tower
from engine.backends.clip.training import ClipAdapter, embed_training_scenes, make_adapter
from engine.config import get_paths
from engine.errors import ModelError
from engine.models.download import import_model
from engine.models.registry import get_backend, load_embedder
from engine.training.configs import PRESETS
from engine.training.trainer import Example, Trainer

TEXTS = ["a photo of a cat", "A red bicycle leans against a blue door in the morning light. " * 12, "grey sky"]
FIXTURES = {"clip-b16": "clip_b16_tiny_checkpoint", "longclip-b": "longclip_b_tiny_checkpoint"}


def pixels(emb: ClipEmbedder) -> np.ndarray:
    images = [Image.new("RGB", (90, 60), (200, 30, 40)), Image.new("RGB", (50, 80), (20, 90, 220))]
    return emb.preprocess(images)


def examples(n: int = 8) -> list[Example]:
    colours = ["red", "green", "blue", "yellow", "black", "white", "orange", "purple"]
    return [Example(f"k{i}", f"a {c} cube", [f"the {c} cube"], [], f"A {c} cube stands on a table. " * 3)
            for i, c in enumerate(colours[:n])]


@pytest.mark.parametrize("arch", list(FIXTURES))
def test_the_adapter_embeds_as_the_app_does_and_only_the_text_side_learns(arch, request):
    folder = request.getfixturevalue(FIXTURES[arch])
    adapter = make_adapter(folder, device="cpu")
    assert isinstance(adapter, ClipAdapter) and adapter.amp_dtype is None  # float32 on the CPU
    reference = ClipEmbedder(folder, device="cpu", compute="reference")
    limit = reference.max_text_tokens
    with torch.no_grad():
        texts = adapter.encode_texts(TEXTS, limit).numpy()
        images = adapter.encode_pixels(torch.from_numpy(pixels(reference))).numpy()
    np.testing.assert_allclose(texts, reference.encode_texts(TEXTS, limit), atol=1e-5)
    np.testing.assert_allclose(images, reference.encode_pixels(pixels(reference)), atol=1e-5)

    params = adapter.trainable_parameters(train_vision=False, learn_temperature=False)
    names = {n for n, p in adapter.model.named_parameters() if any(p is q for q in params)}
    assert names and all(n.startswith(("text_model.", "text_projection.")) for n in names)
    assert "text_model.embeddings.position_embedding.weight" in names  # Long-CLIP's 248 rows train as they are
    adapter.train_mode(train_vision=False)
    loss = adapter.encode_texts(TEXTS[:2], limit) @ adapter.encode_pixels(torch.from_numpy(pixels(reference))).T
    loss.sum().backward()
    assert all(p.grad is None for n, p in adapter.model.named_parameters() if n.startswith("vision_model."))
    assert adapter.model.text_projection.weight.grad is not None
    assert not adapter.model.vision_model.training and adapter.model.text_model.training


def test_bf16_autocast_keeps_float32_master_weights_and_embeds_alike(clip_b16_tiny_checkpoint):
    """The CUDA path's autocast, exercised on the CPU (which autocasts to bf16 too)."""
    adapter = make_adapter(clip_b16_tiny_checkpoint, device="cpu")
    with torch.no_grad():
        exact = adapter.encode_texts(TEXTS, 77)
    adapter.amp_dtype = torch.bfloat16
    params = adapter.trainable_parameters(train_vision=False, learn_temperature=True)
    low = adapter.encode_texts(TEXTS, 77)
    assert low.dtype == torch.float32 and float((low.detach() * exact).sum(-1).min()) > 0.98
    low.sum().backward()
    assert all(p.dtype == torch.float32 for p in params) and params[0].grad.dtype == torch.float32
    # learn_temperature starts from CLIP's own learned scale.
    scale = adapter.logit_scale(PRESETS["C5"].with_overrides(learn_temperature=True)).detach()
    assert float(scale) == pytest.approx(float(adapter.model.logit_scale.detach().exp()), rel=1e-6)


def test_a_trained_tower_round_trips_and_the_vision_tower_stays_frozen(longclip_b_tiny_checkpoint, tmp_path):
    adapter = make_adapter(longclip_b_tiny_checkpoint, device="cpu")
    vision_before = {k: v.clone() for k, v in adapter.model.vision_model.state_dict().items()}
    text_before = adapter.model.text_projection.weight.detach().clone()
    with torch.no_grad():
        image_emb = adapter.encode_pixels(torch.randn(8, 3, 64, 64))
    cfg = PRESETS["C5"].with_overrides(batch_size=4, epochs=1, lr=1e-3, warmup_steps=1)
    out = tmp_path / "run"
    reports = list(Trainer(adapter, cfg, examples(), image_embeddings=image_emb, out_dir=out).run())
    assert reports[-1].stage == "done"
    assert all(torch.equal(v, vision_before[k]) for k, v in adapter.model.vision_model.state_dict().items())
    assert not torch.equal(adapter.model.text_projection.weight, text_before)
    meta = json.loads((out / TEXT_TOWER_META).read_text())
    assert meta["name"] == "C5" and meta["max_text_tokens"] == 248
    assert json.loads((out / "training.json").read_text())["training"]["name"] == "C5"

    loaded = ClipEmbedder(longclip_b_tiny_checkpoint, device="cpu", text_tower_dir=out)
    with torch.no_grad():
        np.testing.assert_allclose(loaded.encode_texts(TEXTS, 248), adapter.encode_texts(TEXTS, 248).numpy(),
                                   atol=1e-5)
    plain = ClipEmbedder(longclip_b_tiny_checkpoint, device="cpu")
    np.testing.assert_allclose(loaded.encode_pixels(pixels(plain)), plain.encode_pixels(pixels(plain)), atol=1e-6)
    assert loaded.text_model_id == f"{plain.model_id}+C5" and loaded.text_tower_dir == out

    # A tower continues from where it stopped (init_text_tower).
    again = make_adapter(longclip_b_tiny_checkpoint, device="cpu", init_text_tower=out)
    assert torch.equal(again.model.text_projection.weight, adapter.model.text_projection.weight)


def test_towers_that_do_not_fit_are_refused_with_why(clip_b16_tiny_checkpoint, longclip_b_tiny_checkpoint,
                                                     blip_tiny_checkpoint, tmp_path):
    long_tower = save_text_tower(ClipEmbedder(longclip_b_tiny_checkpoint, device="cpu").model, tmp_path / "long",
                                 "long")
    with pytest.raises(ModelError, match="max_position_embeddings 248 .model: 77"):
        ClipEmbedder(clip_b16_tiny_checkpoint, device="cpu", text_tower_dir=long_tower)

    from engine.backends.blip.embedder import BlipEmbedder
    from engine.backends.blip.embedder import save_text_tower as save_blip_tower

    blip_tower = save_blip_tower(BlipEmbedder(blip_tiny_checkpoint, device="cpu"), tmp_path / "blip", "b")
    with pytest.raises(ModelError, match="not a CLIP text tower"):
        ClipEmbedder(clip_b16_tiny_checkpoint, device="cpu", text_tower_dir=blip_tower)

    own = save_text_tower(ClipEmbedder(clip_b16_tiny_checkpoint, device="cpu").model, tmp_path / "own", "own")
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(own / TEXT_TOWER_WEIGHTS))
    del tensors["text_projection.weight"]
    save_file(tensors, str(own / TEXT_TOWER_WEIGHTS))
    with pytest.raises(ModelError, match="missing tensors: text_projection.weight"):
        ClipEmbedder(clip_b16_tiny_checkpoint, device="cpu", text_tower_dir=own)
    with pytest.raises(ModelError, match="needs text_tower.safetensors"):
        ClipEmbedder(clip_b16_tiny_checkpoint, device="cpu", text_tower_dir=tmp_path)


def test_training_both_towers_writes_a_clip_folder(clip_b16_tiny_checkpoint, tmp_path):
    adapter = make_adapter(clip_b16_tiny_checkpoint, device="cpu")
    vision_before = adapter.model.visual_projection.weight.detach().clone()
    images = type("Pixels", (), {"__len__": lambda self: 8,
                                 "pixels": lambda self, idx: torch.randn(len(idx), 3, 64, 64,
                                                                         generator=torch.Generator().manual_seed(1))})()
    cfg = PRESETS["pretrain"].with_overrides(batch_size=4, epochs=1, lr=1e-3, warmup_steps=1)
    out = tmp_path / "full"
    list(Trainer(adapter, cfg, examples(), images, out_dir=out).run())
    assert not torch.equal(adapter.model.visual_projection.weight, vision_before)
    emb = ClipEmbedder(out, device="cpu")
    with torch.no_grad():
        np.testing.assert_allclose(emb.encode_texts(TEXTS, 77), adapter.encode_texts(TEXTS, 77).numpy(), atol=1e-5)
    assert get_backend("clip").detect(out)


def test_an_imported_model_reads_its_own_text_tower_folder(clip_b16_tiny_checkpoint, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(clip_b16_tiny_checkpoint, src)
    model = ClipEmbedder(clip_b16_tiny_checkpoint, device="cpu").model
    with torch.no_grad():
        model.text_projection.weight.mul_(-1)  # a tower that visibly differs
    save_text_tower(model, src / "text_tower", "flipped")
    paths = get_paths(tmp_path / "home").ensure()
    import_model(src, "clip-with-tower", paths, backend="clip")
    import_model(clip_b16_tiny_checkpoint, "clip-plain", paths, backend="clip")
    with_tower, plain = load_embedder("clip-with-tower", paths), load_embedder("clip-plain", paths)
    assert with_tower.text_model_id == "clip-with-tower+flipped"
    np.testing.assert_allclose(with_tower.encode_texts(TEXTS), -plain.encode_texts(TEXTS), atol=1e-5)
    assert with_tower.text_identity != plain.text_identity


def test_embed_training_scenes_gives_the_vision_towers_embeddings(clip_b16_tiny_checkpoint):
    from engine.sceneworld import generate_scenes

    scenes = generate_scenes(11, 0, 3)
    out = embed_training_scenes(clip_b16_tiny_checkpoint, scenes, "cpu")
    assert out.shape == (3, 32) and np.allclose(np.linalg.norm(out, axis=1), 1, atol=1e-5)
