"""The model folder's manifest file: its name, format and reader.

Below the registry (which adds the backend check) and install_state (which only needs a
folder's model name), so neither has to import the other.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from engine.errors import ModelIntegrityError
from engine.jsonfile import read_json_file
from engine.limits import MAX_MANIFEST_BYTES

MANIFEST_NAME = "longlens-manifest.json"
MANIFEST_FORMAT = 1

SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


def read_manifest_file(model_dir: Path) -> dict[str, Any]:
    """Parse and sanity-check a manifest's format; ModelIntegrityError if it is missing or malformed.
    (Whether its backend is known is the registry's question: registry.read_manifest.)"""
    path = model_dir / MANIFEST_NAME
    try:
        data = read_json_file(path, max_bytes=MAX_MANIFEST_BYTES)
    except FileNotFoundError:
        raise ModelIntegrityError(f"{model_dir} has no {MANIFEST_NAME}") from None
    except (OSError, ValueError) as e:
        raise ModelIntegrityError(f"{path} is unreadable: {e}") from None
    files = data.get("files") if isinstance(data, dict) else None
    if not isinstance(files, dict) or not isinstance(data.get("name"), str):
        raise ModelIntegrityError(f"{path} is malformed (no name or file list)")
    for rel, entry in files.items():
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("sha256"), str)
            or not SHA256_RE.fullmatch(entry["sha256"])
            or not isinstance(entry.get("size"), int)
            or not _is_safe_relpath(rel)
        ):
            raise ModelIntegrityError(f"{path} is malformed (bad entry for {rel!r})")
    return data


def _is_safe_relpath(rel: str) -> bool:
    # Manifest paths are joined onto the model folder; they must never climb out of it.
    if not rel or rel.startswith("/") or "\\" in rel:
        return False
    parts = rel.split("/")
    return all(p not in ("", ".", "..") for p in parts)
