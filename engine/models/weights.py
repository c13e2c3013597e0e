"""Reading a checkpoint's tensor shapes without its data, and checking a model against them.

Every backend checks a folder's config against its safetensors headers before building anything
(see engine/backends/blip/shapes.py for why): these are the backend-neutral parts.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.errors import ModelIntegrityError
from engine.jsonfile import loads_bounded, read_json_file
from engine.limits import MAX_WEIGHT_INDEX_BYTES

_SHOWN = 5  # differing tensors named in a message

# safetensors' own parser refuses headers over 100 MB; a header is a user-controlled size too.
MAX_SAFETENSORS_HEADER_BYTES = 100 * 1024 * 1024
# model.safetensors.index.json of a sharded checkpoint: a user-controlled size like any other
# (MAX_WEIGHT_INDEX_BYTES, engine.limits).
# Config fields that count repeated blocks in each tower of a Hugging Face dual encoder: each
# block has at least one tensor in the weights.
_SUB_CONFIGS = ("vision_config", "text_config")


def _header_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """The tensor shapes a safetensors file declares (8-byte length, then a JSON header), read
    through the safe open with the header's length bounded; data offsets must lie in the file."""
    from engine.fileutil import open_user_file

    with open_user_file(path) as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError("shorter than a safetensors header")
        n = int.from_bytes(head, "little")
        if n > MAX_SAFETENSORS_HEADER_BYTES or 8 + n > f.size:
            raise ValueError(f"header length {n} does not fit the file ({f.size} bytes)")
        header = loads_bounded(f.read(n), f"the header of {path}")
        data_bytes = f.size - 8 - n
    if not isinstance(header, dict):
        raise ValueError("the header is not a JSON object")
    shapes: dict[str, tuple[int, ...]] = {}
    for key, info in header.items():
        if key == "__metadata__":
            continue
        shape, offsets = info.get("shape"), info.get("data_offsets")
        if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)
                and isinstance(offsets, list) and len(offsets) == 2
                and 0 <= offsets[0] <= offsets[1] <= data_bytes):
            raise ValueError(f"tensor {key!r} has a malformed entry")
        shapes[key] = tuple(shape)
    return shapes


def safetensors_shapes(folder: Path, weight_files: list[str]) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape from the headers of the weight files (no tensor data is read)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for rel in weight_files:
        try:
            shapes.update(_header_shapes(Path(folder) / rel))
        except (OSError, ValueError, AttributeError) as e:
            raise ModelIntegrityError(f"{rel} is not a valid safetensors file: {e}") from None
    return shapes


def check_layer_counts(counts: dict[str, Any], shapes: dict[str, tuple[int, ...]], where: str) -> None:
    """Every count of repeated blocks is a positive int no larger than the number of tensors."""
    for field, value in counts.items():
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= len(shapes):
            raise ModelIntegrityError(
                f"{where}: {field} = {value!r} does not fit the weights, which hold {len(shapes)} tensors "
                "in all; nothing was loaded"
            )


def check_meta_model_fits(model: Any, shapes: dict[str, tuple[int, ...]], where: str) -> None:
    """`model` (built on the meta device) must have exactly the header's tensors, shape for shape;
    the header may hold the model's buffers besides."""
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    buffers = {name for name, _ in model.named_buffers()}
    problems = [f"{k}: config implies {expected[k]}, weights have {shapes[k]}"
                for k in sorted(expected) if k in shapes and shapes[k] != expected[k]]
    problems += [f"{k}: config implies {expected[k]}, missing from the weights"
                 for k in sorted(expected) if k not in shapes]
    problems += [f"{k}: in the weights {shapes[k]}, not in the model the config describes"
                 for k in sorted(shapes) if k not in expected and k not in buffers]
    if problems:
        more = f" and {len(problems) - _SHOWN} more" if len(problems) > _SHOWN else ""
        raise ModelIntegrityError(
            f"the weights do not fit {where} ({len(problems)} tensors differ: "
            f"{'; '.join(problems[:_SHOWN])}{more}); nothing was loaded"
        )


def safetensors_weight_files(folder: Path) -> list[str]:
    """model.safetensors, or the shards its index lists."""
    folder = Path(folder)
    if (folder / "model.safetensors").is_file():
        return ["model.safetensors"]
    index = folder / "model.safetensors.index.json"
    try:
        weight_map = read_json_file(index, max_bytes=MAX_WEIGHT_INDEX_BYTES)["weight_map"]
        return sorted(set(weight_map.values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ModelIntegrityError(f"{index} is unreadable: {e}") from None


def check_config_fits_weights(folder: Path, config: Any | None, weight_files: list[str] | None, *,
                              family: str, config_class: Any, model_class: Any,
                              check_config: Callable[[Any], None] | None = None) -> None:
    """Refuse (ModelIntegrityError naming the key and both shapes) a Hugging Face dual encoder's
    config (vision_config and text_config) that its safetensors weights do not fit: layer counts
    first, then a meta-device `model_class(config)` against the headers. `config` None: read with
    `config_class`; `check_config` runs on it before anything is counted or built. `family` ("BLIP",
    "CLIP") names the model in the messages."""
    import torch

    folder = Path(folder)
    shapes = safetensors_shapes(folder, weight_files or safetensors_weight_files(folder))
    if config is None:
        try:
            config = config_class.from_pretrained(str(folder), local_files_only=True)
        except Exception as exc:  # transformers raises OSError/ValueError/TypeError for bad configs
            raise ModelIntegrityError(f"{folder / 'config.json'} is not a {family} config: {exc}") from exc
    if check_config is not None:
        check_config(config)
    check_layer_counts({f"{sub}.num_hidden_layers": getattr(getattr(config, sub, None), "num_hidden_layers", None)
                        for sub in _SUB_CONFIGS}, shapes, "config.json")
    try:
        with torch.device("meta"):
            model = model_class(config)
    except Exception as exc:  # inconsistent numbers (e.g. heads not dividing the hidden size)
        raise ModelIntegrityError(f"config.json does not describe a buildable {family} model: {exc}") from exc
    check_meta_model_fits(model, shapes, f"config.json of {folder}")
