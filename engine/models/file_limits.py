"""Size and nesting limits on the files of a model or text-tower folder (reliability checklist 33, 43).

Longlens reads some of a model's files itself and hands the others to transformers and tokenizers,
which read them whole with json.load (config.json, tokenizer.json, tokenizer_config.json, ...).
Every such file is checked against its limit (engine.limits.MODEL_FILE_LIMITS) by size, and JSON
files by nesting depth too, before anything reads it: at `models import` before a byte is copied,
and again at every load (a model installed before these limits, or a text tower given as a folder,
was never checked). A file over a limit is refused with ModelIntegrityError naming it and the limit.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from engine.errors import ModelIntegrityError
from engine.fileutil import FileTooLargeError, read_user_file
from engine.jsonfile import JsonTooDeepError, check_file_size, check_json_depth
from engine.limits import MAX_NESTING_DEPTH, model_file_limit, size_words

# Subfolders whose files a loader reads: a BLIP text tower imported with its model, and an LM
# tower's tokenizer. Bundled towers (text-towers/NAME/) are checked when one is chosen.
_READ_SUBFOLDERS = ("text_tower", "tokenizer")


def check_model_file(path: Path, rel: str | None = None) -> None:
    """Refuse one model file over its limit (size, and depth for JSON); nothing when the file's name
    has no limit. `rel`: its name in the model folder, which decides the limit and names it in the
    message (default: its path; a hub cache's blob is named by its hash, not by what it is)."""
    path = Path(path)
    name = (rel or path.name).rsplit("/", 1)[-1]
    limit = model_file_limit(name)
    if limit is None:
        return
    shown = rel or str(path)
    try:
        if name.endswith(".json"):
            # Size and depth only: parsing is its reader's work (and its errors are its to word).
            check_json_depth(read_user_file(path, max_bytes=limit), path)
        else:
            check_file_size(path, limit)
    except FileTooLargeError as exc:
        raise ModelIntegrityError(
            f"{shown} is too large ({size_words(exc.size)}; the limit for {name} is {size_words(limit)}); "
            "nothing was read") from None
    except JsonTooDeepError:
        raise ModelIntegrityError(
            f"{shown} nests deeper than {MAX_NESTING_DEPTH} levels (the limit for JSON files); nothing was read"
        ) from None
    except (ValueError, OSError):
        return  # not JSON, unreadable: the file's reader reports that in its own words


def model_files_to_check(folder: Path) -> Iterable[tuple[Path, str]]:
    """(path, name relative to `folder`) of every file with a limit that a load of `folder` reads."""
    folder = Path(folder)
    for sub in ("", *_READ_SUBFOLDERS):
        d = folder / sub if sub else folder
        try:
            entries = sorted(os.scandir(d), key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            if model_file_limit(entry.name) is not None:
                yield Path(entry.path), f"{sub}/{entry.name}" if sub else entry.name


def check_model_files(folder: Path | None) -> None:
    """Refuse a model or text-tower folder holding a file over its limit (ModelIntegrityError naming
    the file and the limit). None: nothing to check."""
    if folder is None:
        return
    for path, _rel in model_files_to_check(Path(folder)):
        check_model_file(path)


def check_model_tree(folder: Path) -> None:
    """check_model_files for every level of `folder` (an import's staged copy, bundled towers and
    their tokenizer folders included)."""
    root = Path(folder)
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            if model_file_limit(name) is not None:
                path = Path(dirpath) / name
                check_model_file(path, path.relative_to(root).as_posix())
