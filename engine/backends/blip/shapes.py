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

from pathlib import Path
from typing import Any

from engine.models.weights import check_config_fits_weights


def check_blip_config_fits_weights(folder: Path, config: Any | None = None,
                                   weight_files: list[str] | None = None) -> None:
    """Refuse (ModelIntegrityError naming the key and both shapes) a config its weights do not fit."""
    from transformers import BlipConfig, BlipForImageTextRetrieval

    check_config_fits_weights(folder, config, weight_files, family="BLIP", config_class=BlipConfig,
                              model_class=BlipForImageTextRetrieval)
