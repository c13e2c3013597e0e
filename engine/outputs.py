"""Where a run may write, and how a report with several files is written as one unit.

`check_output` is the one guard every verb that writes calls before it starts: an output may
not be an input of the run (compared by resolved path and `samefile`), may not lie inside an
input folder or an indexed library (the app never writes into photo folders), may not be a
photo, and may not replace a file or folder that is not an output of the same kind.

`staged_folder` writes a folder output (ground, eval reports) into a fresh folder next to the
target and swaps it in at the end; `ReportAssets` does the same for a report page whose assets
live in a sibling folder (check --html): each run's assets go into their own complete folder,
and the page is replaced only once that folder exists. A kill at any moment leaves the old
complete report or the new complete one, never a mix.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import fnmatch
import json
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.errors import LonglensError
from engine.fileutil import atomic_write_text, fsync_dir, open_user_file, pid_alive
from engine.jsonfile import read_json_file

# Written into every folder output, so a later run knows the folder is its own to replace.
MARKER = ".longlens-output.json"
STAGING = ".staging-"
OLD = ".old-"
# Magic numbers of the photo formats Longlens indexes: an output never overwrites a photo.
_PHOTO_MAGIC = (b"\xff\xd8\xff", b"\x89PNG", b"GIF8", b"II*\x00", b"MM\x00*", b"BM")


class OutputPathError(LonglensError):
    """An output path would overwrite an input, a photo, a library file or a foreign file."""


def _resolved(p: Path | str) -> Path:
    return Path(os.path.abspath(Path(p).expanduser())).resolve(strict=False)


def _same(a: Path, b: Path) -> bool:
    if a == b:
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or path.is_relative_to(folder)


def _looks_like_photo(path: Path) -> bool:
    try:
        with open_user_file(path) as fh:  # a FIFO or device at the path is simply not a photo
            head = fh.read(16)
    except OSError:
        return False
    return head.startswith(_PHOTO_MAGIC) or (head[:4] == b"RIFF" and head[8:12] == b"WEBP") or (
        head[4:8] == b"ftyp")


def indexed_library_roots(catalog_path: Path) -> list[Path]:
    """The library roots of an existing catalog (none when there is no catalog yet)."""
    if not Path(catalog_path).is_file():
        return []
    from engine.catalog import Catalog

    with Catalog(Path(catalog_path)) as catalog:
        return [Path(lib.root) for lib in catalog.libraries()]


def nearest_output_folder(picture: Path | str, library_roots: Iterable[Path | str] = ()) -> Path:
    """The folder nearest to `picture` that check_output accepts for a file about it: the
    picture's own folder, or, when it lies in an indexed library (Longlens never writes into
    photo folders), the folder that holds the outermost such library, next to the photo folder."""
    folder = _resolved(picture).parent
    roots = [_resolved(r) for r in library_roots]
    while True:
        holding = [r for r in roots if _inside(folder, r)]
        if not holding:
            return folder
        outer = min(holding, key=lambda r: len(r.parts))
        if outer.parent == outer:  # a library at the file system's root: nowhere above it
            return outer
        folder = outer.parent


def check_output(
    out: Path | str,
    *,
    what: str,
    kind: str,
    folder: bool = False,
    inputs: Iterable[Path | str] = (),
    library_roots: Iterable[Path | str] = (),
    own_files: Iterable[str] = (),
    resumable: bool = False,
) -> Path:
    """`out` as given when it is a safe place for this run's `what` (e.g. "report"), else
    OutputPathError naming the path.

    kind: the kind of output ("check-report", "ground", ...), recorded in a folder output's
    marker so an existing folder is replaced only when it holds the same kind of output.
    folder: the output is a folder (replaced whole) rather than a file.
    inputs: every file or folder the run reads; the output may be none of them, nor lie inside
    an input folder, nor (for a folder output) contain one.
    own_files: for folder outputs written before markers existed, glob patterns of the files this
    kind of output holds (e.g. grounding.json, phrase_*.png): a folder whose every entry matches
    one is taken to be such an output.
    resumable: a folder output a run extends or resumes (training runs, shards) rather than
    replaces: only its being a folder is checked, not what it holds.
    """
    out = Path(out).expanduser()
    target = _resolved(out)
    for raw in inputs:
        src = _resolved(raw)
        if _same(target, src):
            raise OutputPathError(f"the {what} {out} is also an input of this run; choose another path")
        if src.is_dir() and _inside(target, src):
            raise OutputPathError(f"the {what} {out} is inside the input folder {raw}; "
                                  "choose a path outside it")
        if folder and _inside(src, target):
            raise OutputPathError(f"the {what} folder {out} holds the input {raw}; "
                                  "replacing it would delete that input; choose another folder")
    for raw in library_roots:
        root = _resolved(raw)
        if _inside(target, root):
            raise OutputPathError(f"the {what} {out} is inside the indexed library {raw}; Longlens never "
                                  "writes into photo folders: choose a path outside it")
        if folder and _inside(root, target):
            raise OutputPathError(f"the {what} folder {out} holds the indexed library {raw}; "
                                  "choose another folder")
    if folder and resumable:
        if out.exists() and not out.is_dir():
            raise OutputPathError(f"the {what} {out} exists and is not a folder; give a folder path")
    elif folder:
        _check_folder_target(out, what, kind, own_files)
    else:
        _check_file_target(out, what)
    return out


def _check_file_target(out: Path, what: str) -> None:
    if out.is_dir():
        raise OutputPathError(f"the {what} {out} is a folder; give a file name")
    if out.exists() and not out.is_file():
        raise OutputPathError(f"the {what} {out} exists and is not a regular file")
    if out.is_file() and _looks_like_photo(out):
        raise OutputPathError(f"the {what} {out} is an existing image; Longlens does not overwrite photos")


def _check_folder_target(out: Path, what: str, kind: str, own_files: Iterable[str]) -> None:
    if not out.exists() and not out.is_symlink():
        return
    if not out.is_dir():
        raise OutputPathError(f"the {what} {out} exists and is not a folder; give a folder path")
    entries = os.listdir(out)
    if not entries:
        return
    marker_kind = _marker_kind(out)
    patterns = [*own_files, MARKER, f"{STAGING}*", "run-*"]
    if marker_kind == kind or (marker_kind is None and own_files
                               and all(any(fnmatch.fnmatchcase(e, p) for p in patterns) for e in entries)):
        return
    found = f"a {marker_kind} output" if marker_kind else "other files"
    raise OutputPathError(f"the {what} folder {out} already holds {found}; it would be replaced: "
                          "choose a new or empty folder")


def _marker_kind(folder: Path) -> str | None:
    try:
        # The marker sits in a folder the user named as an output: read it like any user file.
        return str(read_json_file(folder / MARKER, max_bytes=1 << 16)["kind"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_marker(folder: Path, kind: str, run_id: str) -> None:
    atomic_write_text(folder / MARKER, json.dumps({"kind": kind, "run": run_id, "pid": os.getpid(),
                                                   "written_at": time.time()}) + "\n")


def new_run_id() -> str:
    return f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"


# --------------------------------------------------------------------------- swapping folders


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two existing paths (Linux renameat2 RENAME_EXCHANGE); False if unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    rc = renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EPERM):
        return False
    raise OSError(err, os.strerror(err), str(b))


def recover_folder(target: Path) -> None:
    """Undo what a killed swap left next to `target`: put a moved-aside old folder back when the
    target is missing, and remove the staging and old folders of processes that are gone."""
    target = Path(target)
    parent = target.parent
    if not parent.is_dir():
        return
    for entry in sorted(parent.iterdir()):
        name = entry.name
        for tag in (STAGING, OLD):
            prefix = f".{target.name}{tag}"
            if not name.startswith(prefix):
                continue
            pid_text = name[len(prefix):].split("-", 1)[0]
            if pid_text.isdigit() and pid_alive(int(pid_text)) and int(pid_text) != os.getpid():
                continue  # another run is writing it now
            if tag == OLD and not target.exists():
                os.replace(entry, target)
            else:
                shutil.rmtree(entry, ignore_errors=True)


def swap_in(stage: Path, target: Path) -> None:
    """Make the complete folder `stage` become `target`; the old target is removed after."""
    fsync_dir(stage)
    if target.exists() and _exchange(stage, target):
        shutil.rmtree(stage, ignore_errors=True)  # `stage` now holds the old report
    elif target.exists():
        old = target.with_name(f".{target.name}{OLD}{os.getpid()}-{uuid.uuid4().hex[:6]}")
        os.replace(target, old)  # a kill here leaves `old`, which recover_folder puts back
        os.replace(stage, target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(stage, target)
    fsync_dir(target.parent)


@contextlib.contextmanager
def staged_folder(target: Path | str, kind: str, run_id: str | None = None) -> Iterator[Path]:
    """Yield a fresh empty folder next to `target`; when the block ends normally it replaces
    `target` whole, when it raises (or the process dies) `target` is untouched."""
    target = Path(target).expanduser()
    target.parent.mkdir(parents=True, exist_ok=True)
    recover_folder(target)
    stage = Path(tempfile.mkdtemp(prefix=f".{target.name}{STAGING}{os.getpid()}-", dir=target.parent))
    try:
        yield stage
        write_marker(stage, kind, run_id or new_run_id())
        swap_in(stage, target)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise


# --------------------------------------------------------------------------- page + assets


@dataclass
class ReportAssets:
    """Assets of a report page (e.g. check --html) in `<assets>/run-<id>/`, one folder per run.

    Usage: write assets into `staging`, call `commit()` (the folder gets its final name), then
    replace the page, then `prune()` removes earlier runs' folders. The page only ever names
    a complete folder: before the page is replaced it names the previous run's, which is kept
    until then."""

    assets: Path
    kind: str
    run_id: str
    staging: Path

    @classmethod
    def begin(cls, assets: Path, kind: str) -> ReportAssets:
        assets = Path(assets)
        if assets.exists() and not assets.is_dir():
            raise OutputPathError(f"the report's asset folder {assets} exists and is not a folder")
        assets.mkdir(parents=True, exist_ok=True)
        run_id = new_run_id()
        write_marker(assets, kind, run_id)
        for entry in assets.iterdir():  # staging folders of killed runs
            if entry.name.startswith(STAGING):
                pid_text = entry.name[len(STAGING):].split("-", 1)[0]
                if not (pid_text.isdigit() and pid_alive(int(pid_text))):
                    shutil.rmtree(entry, ignore_errors=True)
        staging = assets / f"{STAGING}{os.getpid()}-{run_id}"
        staging.mkdir()
        return cls(assets, kind, run_id, staging)

    @property
    def folder_name(self) -> str:
        """The run's folder, relative to `assets`: what the page links to."""
        return f"run-{self.run_id}"

    @property
    def final(self) -> Path:
        return self.assets / self.folder_name

    def commit(self) -> Path:
        write_marker(self.staging, self.kind, self.run_id)
        fsync_dir(self.staging)
        os.replace(self.staging, self.final)
        fsync_dir(self.assets)
        return self.final

    def abort(self) -> None:
        shutil.rmtree(self.staging, ignore_errors=True)

    def prune(self) -> None:
        """Remove every other run's folder and stray files (after the page names this run)."""
        for entry in self.assets.iterdir():
            if entry.name in (self.folder_name, MARKER) or entry.name.startswith(STAGING):
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)


def library_roots(home: str | Path | None = None) -> list[Path]:
    """The indexed library roots of the catalog under `home` (default: $LONGLENS_HOME or the user's)."""
    from engine.config import get_paths

    return indexed_library_roots(get_paths(home).catalog)


def check_script_output(parser: argparse.ArgumentParser, out: Path | str | None, **kwargs: Any) -> None:
    """check_output for a `python -m` script: a refused path is a usage error (exit 2) naming
    it. Library roots default to the user's catalog."""
    if out is None:
        return
    kwargs.setdefault("library_roots", library_roots(kwargs.pop("home", None)))
    kwargs.setdefault("what", "output")
    kwargs.setdefault("kind", parser.prog)
    try:
        check_output(out, **kwargs)
    except OutputPathError as exc:
        parser.error(str(exc))
