"""The sceneworld-mini backend (the small dual encoder trained on SceneWorld, bundled offline):
embedder, grounder (patch-similarity and matching-head alignment maps), matching-head re-ranker
and training adapter. This module is cheap to import; torch loads inside the hooks.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from engine.models.backend import ModelBackend

NAME = "sceneworld-mini"
CONFIG_FILE = "sceneworld_mini.json"  # also engine.backends.sceneworld_mini.network.CONFIG_FILE


def _detect(folder: Path) -> bool:
    return (Path(folder) / CONFIG_FILE).is_file()


def _load_embedder(model_dir: Path, *, device: str = "auto", text_tower_dir: Path | None = None,
                   model_id: str | None = None, identity: str | None = None, text_identity: str | None = None,
                   default_text_tokens: int | None = None, installed: bool = False) -> Any:
    from engine.backends.sceneworld_mini.embedder import SceneWorldMiniEmbedder

    kwargs: dict[str, Any] = {"device": device, "text_tower_dir": text_tower_dir}
    if model_id is not None:
        kwargs["model_id"] = model_id
    if installed:
        kwargs.update(identity=identity, text_identity=text_identity)
    return SceneWorldMiniEmbedder(model_dir, **kwargs)


def _make_grounder(embedder: Any, calibration: Any, *, method: str | None = None, **options: Any) -> Any:
    from engine.backends.sceneworld_mini.grounder import MiniGrounder

    return MiniGrounder(embedder, calibration, method=method, **options)


def _rerank_support(embedder: Any) -> tuple[bool, str]:
    from engine.backends.sceneworld_mini.rerank import rerank_support

    return rerank_support(embedder)


def _rerank_scores(embedder: Any, images: Sequence[Any], query: str, ann_scores: Sequence[float],
                   max_tokens: int | None = None) -> Any:
    from engine.backends.sceneworld_mini.rerank import rerank_scores

    return rerank_scores(embedder, images, query, ann_scores, max_tokens=max_tokens)


def _make_training_adapter(folder: Path, **kwargs: Any) -> Any:
    from engine.backends.sceneworld_mini.training import make_adapter

    return make_adapter(folder, **kwargs)


def _embed_training_scenes(folder: Path, scenes: Sequence[Any], device: str) -> Any:
    from engine.backends.sceneworld_mini.training import embed_training_scenes

    return embed_training_scenes(folder, scenes, device)


BACKEND = ModelBackend(
    name=NAME,
    folder_description="a sceneworld-mini folder (sceneworld_mini.json)",
    detect=_detect,
    load_embedder=_load_embedder,
    make_grounder=_make_grounder,
    rerank_support=_rerank_support,
    rerank_scores=_rerank_scores,
    make_training_adapter=_make_training_adapter,
    embed_training_scenes=_embed_training_scenes,
    detect_order=10,
)
