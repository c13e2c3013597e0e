"""Does a model folder's config fit its safetensors weights? Checked before any model is built.

A config is a few numbers a user controls; the model transformers builds from it allocates whatever
they say (vision intermediate_size 10^7 in a 5 MB folder grew a search to 5.5 GB). So the config
is checked against the weights' safetensors headers first, which cost nothing to read:

1. every layer count must be at most the number of tensors in the headers (a meta-device build of
   10^7 layers would still make 10^7 Python modules);
2. the model is built on torch's "meta" device (shapes only, no storage) and every tensor it has
   must be in the headers with exactly that shape, and the headers may hold nothing else but the
   model's buffers (older checkpoints carry position_ids).

Only then is the model built for real. Import (engine.models.download) and load (BlipEmbedder,
and the sceneworld-mini loader with the same two helpers) run this, so a folder that passes import cannot blow up at `search --model` either, and one
planted in the models folder by hand is refused at load.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from engine.errors import ModelIntegrityError
from engine.models.weights import check_layer_counts, check_meta_model_fits, safetensors_shapes

# Config fields that count repeated blocks: each block has at least one tensor in the weights.
_LAYER_COUNTS = ("num_hidden_layers",)
_SUB_CONFIGS = ("vision_config", "text_config")


MAX_WEIGHT_INDEX_BYTES = 64 * 1024 * 1024


def blip_weight_files(folder: Path) -> list[str]:
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


def check_blip_config_fits_weights(folder: Path, config: Any | None = None,
                                   weight_files: list[str] | None = None) -> None:
    """Refuse (ModelIntegrityError naming the key and both shapes) a config its weights do not fit."""
    import torch
    from transformers import BlipConfig, BlipForImageTextRetrieval

    folder = Path(folder)
    shapes = safetensors_shapes(folder, weight_files or blip_weight_files(folder))
    if config is None:
        try:
            config = BlipConfig.from_pretrained(str(folder), local_files_only=True)
        except Exception as exc:  # transformers raises OSError/ValueError/TypeError for bad configs
            raise ModelIntegrityError(f"{folder / 'config.json'} is not a BLIP config: {exc}") from exc
    check_layer_counts({f"{sub}.{field}": getattr(getattr(config, sub, None), field, None)
                        for sub in _SUB_CONFIGS for field in _LAYER_COUNTS}, shapes, "config.json")
    try:
        with torch.device("meta"):
            model = BlipForImageTextRetrieval(config)
    except Exception as exc:  # inconsistent numbers (e.g. heads not dividing the hidden size)
        raise ModelIntegrityError(f"config.json does not describe a buildable BLIP model: {exc}") from exc
    check_meta_model_fits(model, shapes, f"config.json of {folder}")
