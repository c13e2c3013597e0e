"""Does a CLIP folder's config fit its safetensors weights? Checked before any model is built,
for the reasons engine/backends/blip/shapes.py gives: layer counts at most the number of tensors,
then a meta-device CLIPModel whose every tensor must be in the headers with exactly that shape.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.errors import ModelError, ModelIntegrityError
from engine.models.weights import check_config_fits_weights

MAX_CONFIG_BYTES = 4 * 1024 * 1024
_SUB_CONFIGS = ("vision_config", "text_config")

# Families Longlens knows are not plain CLIP: what to say when their folder is offered as CLIP.
_NOT_CLIP = {
    "siglip": "SigLIP models are not supported yet (docs: engine/backends/clip/__init__.py)",
    "siglip2": "SigLIP 2 models are not supported yet (docs: engine/backends/clip/__init__.py)",
    "clip_vision_model": "this folder holds a CLIP vision tower alone; search needs the text tower too",
    "clip_text_model": "this folder holds a CLIP text tower alone; search needs the vision tower too",
    "chinese_clip": "Chinese-CLIP has a BERT text tower, not CLIP's",
}


def read_config(folder: Path) -> dict[str, Any]:
    """config.json of a model folder, read through the safe open with its size bounded."""
    from engine.jsonfile import read_json_file

    path = Path(folder) / "config.json"
    try:
        cfg = read_json_file(path, max_bytes=MAX_CONFIG_BYTES)
    except FileNotFoundError:
        raise ModelIntegrityError(f"{Path(folder)} has no config.json; it is not a model folder.") from None
    except (OSError, ValueError) as e:
        raise ModelIntegrityError(f"{path} is unreadable: {e}") from None
    if not isinstance(cfg, dict):
        raise ModelIntegrityError(f"{path} is not a JSON object")
    return cfg


def check_clip_config_dict(cfg: dict[str, Any]) -> None:
    """A config.json Longlens can run as CLIP: model_type "clip" and no code of its own."""
    if cfg.get("auto_map") or cfg.get("trust_remote_code"):
        raise ModelError(
            "config.json names code of its own (auto_map): this model runs only with transformers' "
            "trust_remote_code, which executes the repository's Python files. Longlens never runs a "
            "model's own code, by the same rule that refuses pickled weights."
        )
    model_type = cfg.get("model_type")
    if model_type != "clip":
        why = _NOT_CLIP.get(str(model_type), "the clip backend needs a CLIPModel folder (model_type 'clip')")
        raise ModelError(f"config.json says model_type={model_type!r}: {why}")


def check_clip_config_fits_weights(folder: Path, config: Any | None = None,
                                   weight_files: list[str] | None = None) -> None:
    """Refuse (ModelIntegrityError naming the key and both shapes) a config its weights do not fit."""
    from transformers import CLIPConfig, CLIPModel

    check_config_fits_weights(folder, config, weight_files, family="CLIP", config_class=CLIPConfig,
                              model_class=CLIPModel, check_config=_check_heads_divide)


def _check_heads_divide(config: Any) -> None:
    """Each tower's num_attention_heads divides its hidden_size (the message names both fields)."""
    for sub in _SUB_CONFIGS:
        part = getattr(config, sub, None)
        hidden, heads = getattr(part, "hidden_size", None), getattr(part, "num_attention_heads", None)
        if not (isinstance(hidden, int) and isinstance(heads, int) and heads > 0 and hidden % heads == 0):
            raise ModelIntegrityError(f"config.json: {sub}.num_attention_heads = {heads!r} does not divide "
                                      f"hidden_size = {hidden!r}; nothing was loaded")
