"""Pulling a CLIP-family spec from a fake hub on loopback (the FakeHub of test_models_registry):
the registered clip-vit-base-patch16 file list, served with a tiny CLIP's bytes (HF-layout
pytorch_model.bin, pinned), is downloaded, converted to safetensors without running pickle code,
checked as CLIP and loaded by the CLIP backend; a file that does not match its pin is refused."""

from __future__ import annotations

import io
import shutil
from dataclasses import replace as dc_replace

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from engine.backends.clip.embedder import ClipEmbedder
from engine.config import get_paths
from engine.errors import ModelIntegrityError
from engine.models.download import pull_model
from engine.models.registry import get_spec, load_embedder, verify_model
from tests.engine.test_models_registry import REPO, REV, hub, run_job, sha256  # noqa: F401  (hub: a fixture)

TEXTS = ["a photo of a cat", "two dogs in the snow next to a wooden fence"]


@pytest.fixture
def served(tmp_path, hub, clip_b16_tiny_checkpoint):  # noqa: F811  (the imported fixture)
    """clip-vit-base-patch16's spec, pointed at the fake hub and pinned to the tiny model's bytes."""
    folder = tmp_path / "src"
    shutil.copytree(clip_b16_tiny_checkpoint, folder)
    buf = io.BytesIO()
    torch.save(load_file(str(folder / "model.safetensors")), buf)
    (folder / "pytorch_model.bin").write_bytes(buf.getvalue())
    spec = get_spec("clip-vit-base-patch16")
    files = {}
    for name in spec.files:
        data = (folder / name).read_bytes()
        hub.files[(REPO, REV, name)] = data
        files[name] = sha256(data)
    return dc_replace(spec, name="clip-test", repo_id=REPO, revision=REV, files=files), hub


def test_pull_of_a_clip_spec_installs_a_working_clip_model(tmp_path, served, clip_b16_tiny_checkpoint):
    spec, fake_hub = served
    paths = get_paths(tmp_path / "home").ensure()
    reports = run_job(pull_model(spec, paths, endpoint=fake_hub.url))
    assert "convert" in [r.stage for r in reports]
    installed = paths.models / "clip-test"
    assert not list(installed.glob("*.bin")) and verify_model("clip-test", paths).ok
    emb = load_embedder("clip-test", paths, device="cpu")
    assert emb.backend == "clip" and emb.max_text_tokens == 77
    direct = ClipEmbedder(clip_b16_tiny_checkpoint, device="cpu", compute="fast")
    np.testing.assert_allclose(emb.encode_texts(TEXTS), direct.encode_texts(TEXTS), atol=1e-6)


def test_a_served_file_that_does_not_match_its_pin_is_refused(tmp_path, served):
    spec, fake_hub = served
    fake_hub.files[(REPO, REV, "pytorch_model.bin")] += b"\0"
    paths = get_paths(tmp_path / "home").ensure()
    with pytest.raises(ModelIntegrityError, match="pinned hash"):
        run_job(pull_model(spec, paths, endpoint=fake_hub.url))
    assert not (paths.models / "clip-test").exists()
