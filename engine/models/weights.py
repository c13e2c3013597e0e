"""Reading a checkpoint's tensor shapes without its data, and checking a model against them.

Every backend checks a folder's config against its safetensors headers before building anything
(see engine/backends/blip/shapes.py for why): these are the backend-neutral parts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from engine.errors import ModelIntegrityError

_SHOWN = 5  # differing tensors named in a message

# safetensors' own parser refuses headers over 100 MB; a header is a user-controlled size too.
MAX_SAFETENSORS_HEADER_BYTES = 100 * 1024 * 1024


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
        header = json.loads(f.read(n))
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
