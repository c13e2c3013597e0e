"""The BLIP backend (Hugging Face BlipForImageTextRetrieval folders): embedder, ITM grounder,
ITM re-ranker and training adapter. This module is cheap to import; torch and transformers load
inside the hooks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.errors import ModelError
from engine.models.backend import ModelBackend, deferred
from engine.models.tokenizers import WORDPIECE_NORMALISER

NAME = "blip"


def _detect(folder: Path) -> bool:
    return (Path(folder) / "config.json").is_file()


def _load_embedder(model_dir: Path, **options: Any) -> Any:
    """engine/models/hf_dual_encoder.py's load_folder_embedder: an installed model runs compute="fast"
    (SDPA and, on CPUs with native bf16, bf16 towers: engine/backends/blip/embedder.py)."""
    try:
        from engine.backends.blip.embedder import BlipEmbedder
    except ImportError as e:
        raise ModelError(f"the BLIP backend is not available in this build: {e}") from e
    from engine.models.hf_dual_encoder import load_folder_embedder

    return load_folder_embedder(BlipEmbedder, model_dir, **options)


def _make_grounder(embedder: Any, calibration: Any, *, method: str | None = None, **options: Any) -> Any:
    from engine.backends.blip.grounder import BlipGrounder

    return BlipGrounder(embedder, calibration, method=method or "gradcam", **options)


def _import_config_check(cfg: dict[str, Any]) -> None:
    if cfg.get("model_type") != "blip":
        raise ModelError(
            f"config.json says model_type={cfg.get('model_type')!r}; the blip backend needs a BLIP "
            "checkpoint (model_type 'blip')"
        )


def _import_weights_check(folder: Path, weight_files: list[str]) -> None:
    from engine.backends.blip.shapes import check_blip_config_fits_weights

    check_blip_config_fits_weights(folder, weight_files=weight_files)


BACKEND = ModelBackend(
    name=NAME,
    folder_description="a BLIP folder (config.json)",
    detect=_detect,
    load_embedder=_load_embedder,
    make_grounder=_make_grounder,
    rerank_support=deferred("engine.backends.blip.rerank", "rerank_support"),
    rerank_scores=deferred("engine.backends.blip.rerank", "rerank_scores"),
    make_training_adapter=deferred("engine.backends.blip.training", "make_adapter"),
    embed_training_scenes=deferred("engine.backends.blip.training", "embed_training_scenes"),
    detect_order=90,  # config.json is what every Hugging Face folder has: checked last
    importable=True,
    import_config_check=_import_config_check,
    import_weights_check=_import_weights_check,
    # BertTokenizer's own normaliser, as the Hugging Face port and the text towers Longlens trains
    # read texts (docs/models.md, "Text cleaning": BLIP's pre_caption is not applied).
    text_cleaning=WORDPIECE_NORMALISER,
)
