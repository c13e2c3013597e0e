"""CLIP text-tower overrides: a paragraph-trained text side that a CLIP model loads over its own.

A tower folder holds text_tower.safetensors (every parameter of CLIPModel's text_model.* and
text_projection.*, float32 on the CPU) and text_tower.json (format, name, the model it was trained
on, and the text architecture it fits). It is what `longlens train` writes for a CLIP base, what
`--text-tower RUN` loads, and what an imported model's text_tower/ subfolder holds, like BLIP's
(engine/backends/blip/embedder.py) but of CLIP's tensors.

The architecture check covers every config value that fixes a text tensor's shape or how the text
embedding is read: a Long-CLIP tower (248 positions) never loads on a 77-position CLIP, and a tower
pooled at the highest id never on a model pooled at the first <|endoftext|>. Long-CLIP's 248
position rows are trained as they are; nothing is re-stretched.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from engine.errors import ModelError, ModelIntegrityError, ModelNotInstalledError
from engine.models.hf_dual_encoder import (
    arch_hash,
    copy_tower_tensors,
    read_tower_tensors,
    text_transformer_arch,
    tower_misfits,
)

TEXT_TOWER_WEIGHTS = "text_tower.safetensors"
TEXT_TOWER_META = "text_tower.json"
TEXT_TOWER_FORMAT = "longlens-clip-text-tower"
TEXT_TOWER_VERSION = 1
# CLIPModel's parts a text-tower override replaces.
TEXT_TOWER_PREFIXES = ("text_model.", "text_projection.")
MAX_META_BYTES = 1024 * 1024


def text_tower_arch(config: Any) -> dict[str, Any]:
    """The config values that fix the text tower's tensors and its pooling."""
    text = config.text_config
    return {**text_transformer_arch(text), "eos_token_id": int(text.eos_token_id), "hidden_act": str(text.hidden_act),
            "projection_dim": int(config.projection_dim)}


def text_tower_arch_hash(config: Any) -> str:
    return arch_hash(text_tower_arch(config))


def text_tower_parameters(model: Any) -> dict[str, Any]:
    """name -> parameter of the text side (parameters only: position_ids is a fixed buffer)."""
    return {name: p for name, p in model.named_parameters() if name.startswith(TEXT_TOWER_PREFIXES)}


def is_clip_text_tower(folder: Path) -> bool:
    return (Path(folder) / TEXT_TOWER_META).is_file() and (Path(folder) / TEXT_TOWER_WEIGHTS).is_file()


def save_text_tower(model: Any, out_dir: Path, name: str, *, base_model_id: str | None = None) -> Path:
    """Write the text side of a CLIPModel as an override folder; returns it."""
    import torch
    from safetensors.torch import save_file

    from engine.fileutil import atomic_write_text

    if not name or not name.strip():
        raise ValueError("a text tower needs a name")
    tensors = {k: p.detach().to(device="cpu", dtype=torch.float32).contiguous().clone()
               for k, p in text_tower_parameters(model).items()}
    if not tensors:
        raise ModelError("the model has no text_model/text_projection weights to save")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / (TEXT_TOWER_WEIGHTS + ".tmp")
    save_file(tensors, str(tmp), metadata={"format": TEXT_TOWER_FORMAT})
    tmp.replace(out_dir / TEXT_TOWER_WEIGHTS)
    config = model.config
    meta = {
        "format": TEXT_TOWER_FORMAT,
        "version": TEXT_TOWER_VERSION,
        "name": name.strip(),
        "base_model_id": base_model_id,
        "arch": text_tower_arch(config),
        "arch_hash": text_tower_arch_hash(config),
        "dim": int(config.projection_dim),
        "max_text_tokens": int(config.text_config.max_position_embeddings),
        "tensors": len(tensors),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    atomic_write_text(out_dir / TEXT_TOWER_META, json.dumps(meta, indent=2) + "\n")
    return out_dir


def read_text_tower_meta(folder: Path) -> dict[str, Any]:
    from engine.jsonfile import read_json_file

    folder = Path(folder)
    meta_path = folder / TEXT_TOWER_META
    if not is_clip_text_tower(folder):
        raise ModelNotInstalledError(f"text tower folder {folder} needs {TEXT_TOWER_WEIGHTS} and {TEXT_TOWER_META}.")
    try:
        meta = read_json_file(meta_path, max_bytes=MAX_META_BYTES)
    except (OSError, ValueError) as exc:
        raise ModelIntegrityError(f"{meta_path} is unreadable: {exc}") from None
    if not isinstance(meta, dict):
        raise ModelIntegrityError(f"{meta_path} is not a JSON object")
    if meta.get("format") != TEXT_TOWER_FORMAT:
        raise ModelError(f"{meta_path} says format {meta.get('format')!r}: it is not a CLIP text tower "
                         f"({TEXT_TOWER_FORMAT}), so it does not fit a CLIP model")
    if not isinstance(meta.get("version"), int) or meta["version"] > TEXT_TOWER_VERSION:
        raise ModelIntegrityError(f"{meta_path}: version {meta.get('version')!r} is newer than this build reads")
    return meta


def load_text_tower(model: Any, folder: Path, model_id: str) -> str:
    """Copy a tower's tensors into `model` (a CLIPModel) after checking they fit; returns its name."""
    folder = Path(folder)
    meta = read_text_tower_meta(folder)
    mine = text_tower_arch(model.config)
    if meta.get("arch_hash") != text_tower_arch_hash(model.config):
        theirs = meta.get("arch") if isinstance(meta.get("arch"), dict) else {}
        diffs = [f"{k} {theirs.get(k)!r} (model: {v!r})" for k, v in mine.items() if theirs.get(k) != v]
        raise ModelError(f"text tower {folder} was trained for another CLIP text architecture than {model_id}: "
                         f"{'; '.join(diffs) or 'its architecture record does not match'}")
    own = text_tower_parameters(model)
    tensors = read_tower_tensors(folder / TEXT_TOWER_WEIGHTS)
    foreign, missing, wrong = tower_misfits(tensors, own)
    if foreign or missing or wrong:
        details = [f"{what}: {', '.join(keys[:3])}" for what, keys in
                   (("unknown tensors", foreign), ("missing tensors", missing), ("wrong shapes", wrong)) if keys]
        raise ModelError(f"text tower {folder} does not fit {model_id} ({'; '.join(details)})")
    copy_tower_tensors(own, tensors)
    return str(meta.get("name") or folder.name)
