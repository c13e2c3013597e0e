"""Does a CLIP folder's config fit its safetensors weights? Checked before any model is built,
for the reasons engine/backends/blip/shapes.py gives: layer counts at most the number of tensors,
then a meta-device CLIPModel whose every tensor must be in the headers with exactly that shape.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from engine.errors import ModelError, ModelIntegrityError
from engine.models.weights import check_layer_counts, check_meta_model_fits, safetensors_shapes

MAX_WEIGHT_INDEX_BYTES = 64 * 1024 * 1024
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
    from engine.fileutil import read_user_text

    path = Path(folder) / "config.json"
    try:
        cfg = json.loads(read_user_text(path, max_bytes=MAX_CONFIG_BYTES))
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


def clip_weight_files(folder: Path) -> list[str]:
    """model.safetensors, or the shards its index lists."""
    from engine.fileutil import read_user_text

    folder = Path(folder)
    if (folder / "model.safetensors").is_file():
        return ["model.safetensors"]
    index = folder / "model.safetensors.index.json"
    try:
        weight_map = json.loads(read_user_text(index, max_bytes=MAX_WEIGHT_INDEX_BYTES))["weight_map"]
        return sorted(set(weight_map.values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ModelIntegrityError(f"{index} is unreadable: {e}") from None


def check_clip_config_fits_weights(folder: Path, config: Any | None = None,
                                   weight_files: list[str] | None = None) -> None:
    """Refuse (ModelIntegrityError naming the key and both shapes) a config its weights do not fit."""
    import torch
    from transformers import CLIPConfig, CLIPModel

    folder = Path(folder)
    shapes = safetensors_shapes(folder, weight_files or clip_weight_files(folder))
    if config is None:
        try:
            config = CLIPConfig.from_pretrained(str(folder), local_files_only=True)
        except Exception as exc:  # transformers raises OSError/ValueError/TypeError for bad configs
            raise ModelIntegrityError(f"{folder / 'config.json'} is not a CLIP config: {exc}") from exc
    for sub in _SUB_CONFIGS:
        part = getattr(config, sub, None)
        hidden, heads = getattr(part, "hidden_size", None), getattr(part, "num_attention_heads", None)
        if not (isinstance(hidden, int) and isinstance(heads, int) and heads > 0 and hidden % heads == 0):
            raise ModelIntegrityError(f"config.json: {sub}.num_attention_heads = {heads!r} does not divide "
                                      f"hidden_size = {hidden!r}; nothing was loaded")
    check_layer_counts({f"{sub}.num_hidden_layers": getattr(getattr(config, sub, None), "num_hidden_layers", None)
                        for sub in _SUB_CONFIGS}, shapes, "config.json")
    try:
        with torch.device("meta"):
            model = CLIPModel(config)
    except Exception as exc:  # inconsistent numbers (e.g. heads not dividing the hidden size)
        raise ModelIntegrityError(f"config.json does not describe a buildable CLIP model: {exc}") from exc
    check_meta_model_fits(model, shapes, f"config.json of {folder}")
