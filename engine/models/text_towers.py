"""Text towers bundled inside a model folder, chosen by name instead of by folder.

A model folder may carry alternative query readers under `text-towers/NAME/` (an LM tower folder,
engine/models/lm_tower.py, trained into that model's image space). They are listed in the model's
manifest like every other file, so `longlens models verify` covers them, and `--text-tower NAME`
(or the settings' query reader) picks one; a folder path keeps working as before.

A bundled tower records the image weights it was trained against (`trained_for` in its
lm_tower.json: the model's image identity, a digest of its image-side files' hashes). A model retrained since
(`make demo-model`) embeds its images elsewhere, and such a tower would rank nonsense without an
error, so loading it is refused with what to do instead.

Importing this module loads neither torch nor transformers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.errors import ModelError
from engine.jsonfile import read_json_file
from engine.limits import model_file_limit
from engine.models.lm_text_side import LM_TOWER_MARKER, is_lm_tower_folder

TEXT_TOWERS_DIR = "text-towers"
#: The key of lm_tower.json that ties a bundled tower to its model's image weights.
TRAINED_FOR_KEY = "trained_for"


def bundled_text_towers(model_dir: Path | None) -> dict[str, Path]:
    """NAME -> folder of each text tower bundled in `model_dir` (sorted by name; {} when none)."""
    if model_dir is None:
        return {}
    root = Path(model_dir) / TEXT_TOWERS_DIR
    if not root.is_dir():
        return {}
    return {d.name: d for d in sorted(root.iterdir())
            if not d.name.startswith(".") and d.is_dir() and not d.is_symlink() and is_lm_tower_folder(d)}


def is_tower_name(value: str | Path) -> bool:
    """Whether `value` is written as a bare name (no folder separators, no ~), not a path."""
    text = str(value)
    return bool(text) and "/" not in text and "\\" not in text and not text.startswith(("~", "."))


def resolve_text_tower(value: str | Path | None, model_dir: Path | None, model_name: str) -> Path | None:
    """The folder a --text-tower value means for `model_name`: a tower bundled with the model when the
    value is one of its names, else the folder it names. A bare name that is neither is refused with
    the model's bundled names."""
    if value is None or str(value) == "":
        return None
    bundled = bundled_text_towers(model_dir)
    if is_tower_name(value) and str(value) in bundled:
        return bundled[str(value)]
    folder = Path(value).expanduser()
    if folder.is_dir():
        return folder
    names = ", ".join(bundled) if bundled else "none"
    if is_tower_name(value):
        raise ModelError(f"text tower {str(value)!r}: {model_name} bundles no tower of that name (bundled: {names}) "
                         f"and there is no folder {folder}")
    raise ModelError(f"text tower {folder}: no such folder (towers bundled with {model_name}: {names})")


def _weights_part(image_identity: str) -> str:
    # 'NAME@digest': the digest alone, so a copy of the model imported under another name keeps its towers.
    return image_identity.rsplit("@", 1)[-1]


def trained_for(image_identity: str) -> dict[str, Any]:
    """What a bundled tower records of the image weights it was trained against."""
    return {TRAINED_FOR_KEY: {"image_identity": _weights_part(image_identity)}}


def check_trained_for(tower_dir: Path, image_identity: str | None, model_name: str) -> None:
    """Refuse a tower recorded as trained for other image weights than the model's (towers that
    record nothing, e.g. a user's `longlens train` output, are not checked here)."""
    if image_identity is None:
        return
    path = Path(tower_dir) / LM_TOWER_MARKER
    try:
        meta = read_json_file(path, max_bytes=model_file_limit(LM_TOWER_MARKER) or 0)
    except (OSError, ValueError):
        return  # the tower loader reports an unreadable config with its own message
    recorded = (meta.get(TRAINED_FOR_KEY) or {}).get("image_identity") if isinstance(meta, dict) else None
    if recorded is not None and recorded != _weights_part(image_identity):
        raise ModelError(
            f"the text tower in {tower_dir} was trained for other image weights of {model_name} "
            f"({path.name}: {TRAINED_FOR_KEY}.image_identity {recorded}, the model's is "
            f"{_weights_part(image_identity)}): the model was retrained since. Retrain the tower against it "
            "(`longlens train --text-tower …`) or use the model's own text tower.")
