"""Fixtures shared by every test suite. Keep each fixture self-describing; others add theirs here."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def blip_tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-weight BLIP retrieval checkpoint (seed 0), built once per session.

    Shared and read-only: copy it before changing anything in it.
    """
    from engine.backends.blip.checkpoints import save_random_blip_checkpoint

    return save_random_blip_checkpoint(tmp_path_factory.mktemp("blip") / "blip-tiny", size="tiny", seed=0)


@pytest.fixture(autouse=True)
def _longlens_home_in_tmp(tmp_path, monkeypatch):
    """No test reads or writes the real user's Longlens folders (catalog, models, caches): each test
    starts with LONGLENS_HOME in its own temporary folder. A test (or fixture) that sets its own
    LONGLENS_HOME, or deletes it to check the platform defaults, does so after this one."""
    monkeypatch.setenv("LONGLENS_HOME", str(tmp_path / "longlens-home"))


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread():
    """Tests use tiny models: with several intra-op threads on a 2-core machine that also runs
    decode threads, thread hand-offs dominate (measured up to ~100x slower). One thread is fast."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def clip_b16_tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """OpenAI CLIP ViT-B/16's layout scaled down (77 tokens, patch 16, pooled at the highest id),
    random weights (seed 0), with the real CLIP tokenizer. Shared and read-only."""
    from engine.backends.clip.checkpoints import save_random_clip_checkpoint

    return save_random_clip_checkpoint(tmp_path_factory.mktemp("clip") / "clip-b16-tiny", name="clip-b16", size="tiny")


@pytest.fixture(scope="session")
def longclip_b_tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Long-CLIP-B's layout scaled down (248 tokens, patch 16, pooled at the first <|endoftext|>),
    random weights (seed 0), with the real CLIP tokenizer. Shared and read-only."""
    from engine.backends.clip.checkpoints import save_random_clip_checkpoint

    return save_random_clip_checkpoint(tmp_path_factory.mktemp("longclip") / "longclip-b-tiny", name="longclip-b",
                                       size="tiny")


@pytest.fixture(scope="session")
def longclip_openai_tiny_pt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Long-CLIP checkpoint as the authors publish it, scaled down: an OpenAI-layout state dict
    (248 text positions in two tables, positional_embedding_res) with seeded random weights, saved
    with torch.save as longclip-B.pt. Shared and read-only."""
    import torch

    from tests.engine.clip_reference import random_openai_state_dict

    path = tmp_path_factory.mktemp("longclip-pt") / "longclip-B.pt"
    torch.save(random_openai_state_dict(vision_width=64, text_width=64, embed_dim=32, context=248, longclip=True,
                                        seed=5), path)
    return path


@pytest.fixture
def one_thread():
    """Tiny models on a shared 2-core machine: torch threads only contend (use with usefixtures)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
