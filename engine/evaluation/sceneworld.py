"""Retrieval on generated SceneWorld test scenes (seeds ≥ 1000, never used for training).

short split: the 5 positive captions per image (COCO/Flickr rules); long split: the one
paragraph per image (DOCCI-like), encoded with the model's default budget (128 tokens).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.evaluation.retrieval import recall_at_k
from engine.models.base import Embedder

SPLITS = ("short", "long")


@dataclass
class SceneWorldSet:
    seed: int
    images: np.ndarray  # image embeddings (N, D)
    scenes: list


def render_size_for(embedder: Embedder) -> int:
    # At least the demo collection's file size, so the model sees the same downsampling as in use.
    return max(256, embedder.image_size)


def embed_rendered_scenes(embedder: Embedder, scenes: Sequence[Any], batch: int = 64) -> np.ndarray:
    """(N, D) image embeddings of `scenes` rendered at render_size_for(embedder), `batch` at a time
    (what a backend's embed_training_scenes hook computes for its frozen vision tower)."""
    from engine.sceneworld import render_scene

    size = render_size_for(embedder)
    parts = [embedder.encode_images([render_scene(s, size)[0] for s in scenes[i : i + batch]])
             for i in range(0, len(scenes), batch)]
    return np.concatenate(parts) if parts else np.zeros((0, embedder.dim), dtype=np.float32)


def embed_scenes(embedder: Embedder, seed: int, n: int, batch: int = 64) -> SceneWorldSet:
    from engine.sceneworld import check_eval_seed, generate_scenes, render_scene

    check_eval_seed(seed)
    scenes = generate_scenes(seed, 0, n)
    size = render_size_for(embedder)
    parts = []
    for start in range(0, n, batch):
        imgs = [render_scene(s, size)[0] for s in scenes[start : start + batch]]
        parts.append(embedder.encode_images(imgs))
    return SceneWorldSet(seed, np.concatenate(parts), scenes)


def texts_for_split(scenes, split: str) -> tuple[list[str], list[int]]:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    texts, owner = [], []
    for i, s in enumerate(scenes):
        items = [t.text for t in s.positives] if split == "short" else [s.paragraph.text]
        texts += items
        owner += [i] * len(items)
    return texts, owner


def evaluate(embedder: Embedder, split: str, seed: int, n: int, *, max_tokens: int | None = None,
             data: SceneWorldSet | None = None) -> dict:
    data = data or embed_scenes(embedder, seed, n)
    texts, owner = texts_for_split(data.scenes, split)
    text_emb = embedder.encode_texts(texts, max_tokens=max_tokens)
    r = recall_at_k(data.images, text_emb, owner)
    return {"benchmark": "sceneworld", "split": split, "seed": seed, "n_images": len(data.scenes),
            "model": embedder.text_model_id, "max_tokens": max_tokens or embedder.default_text_tokens, **r}
