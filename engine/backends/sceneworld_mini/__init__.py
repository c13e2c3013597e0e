"""The sceneworld-mini backend (the small dual encoder trained on SceneWorld, bundled offline):
embedder, grounder (patch-similarity and matching-head alignment maps), matching-head re-ranker
and training adapter. This module is cheap to import; torch loads inside the hooks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.models.backend import ModelBackend, deferred
from engine.models.tokenizers import WORDPIECE_NORMALISER

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


def _import_config_check(meta: dict) -> None:
    from engine.backends.sceneworld_mini.network import check_config_dict

    check_config_dict(meta)


def _import_weights_check(folder: Path, weight_files: list[str]) -> None:
    from engine.backends.sceneworld_mini.network import check_folder_weights

    check_folder_weights(Path(folder), weight_files)


BACKEND = ModelBackend(
    name=NAME,
    folder_description="a sceneworld-mini folder (sceneworld_mini.json)",
    detect=_detect,
    load_embedder=_load_embedder,
    make_grounder=_make_grounder,
    rerank_support=deferred("engine.backends.sceneworld_mini.rerank", "rerank_support"),
    rerank_scores=deferred("engine.backends.sceneworld_mini.rerank", "rerank_scores"),
    make_training_adapter=deferred("engine.backends.sceneworld_mini.training", "make_adapter"),
    embed_training_scenes=deferred("engine.backends.sceneworld_mini.training", "embed_training_scenes"),
    detect_order=10,
    # A trained folder (e.g. the CAFT-style variant, docs/caft.md) installs under a registered name.
    importable=True,
    config_file=CONFIG_FILE,
    import_config_check=_import_config_check,
    import_weights_check=_import_weights_check,
    # Trained here with the bert-base-uncased tokenizer on texts cleaned by nothing else.
    text_cleaning=WORDPIECE_NORMALISER,
)
