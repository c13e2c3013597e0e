"""Walk a library folder: image files with their size and mtime, and what was skipped and why.

Hidden and system folders are skipped, symlinked folders are followed once (loops are
detected by device+inode), symlinked files are followed, and unreadable entries are reported,
never fatal. Each picture carries the XMP sidecar files named after it in its folder
(engine.metadata.match_sidecars: IMG.CR2.xmp and IMG.xmp), so a re-scan sees a sidecar added,
edited or removed even when the picture itself did not change. The scan only describes the tree: what a path names may change before the file is
read, so readers open it with engine.fileutil.open_user_file (passing `followed_link` on as
follow_symlinks, so that a plain file swapped for a link is refused).
"""

from __future__ import annotations

import dataclasses
import os
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from engine.jobs import CancelToken
from engine.metadata import SidecarFile, is_sidecar_name, match_sidecars

# Folders that hold OS or NAS bookkeeping, never a user's photos.
SYSTEM_FOLDERS = frozenset(
    {
        "$recycle.bin",
        "system volume information",
        "@eadir",  # Synology thumbnails
        "#recycle",
        "lost+found",
        "__macosx",
        ".trashes",
        ".spotlight-v100",
        ".fseventsd",
        "node_modules",
    }
)


@dataclass(frozen=True)
class FileEntry:
    rel_path: str  # '/'-separated, relative to the root
    abs_path: Path
    size: int
    mtime_ns: int
    followed_link: bool = False  # the path was a symbolic link at scan time (and was followed)
    sidecars: tuple[SidecarFile, ...] = ()  # the XMP sidecars named after it (whole-name ones first)
    # RAW+JPEG pairs indexed once: the names of the pair's files left out, which this one stands for
    # (their sidecars are among `sidecars`; see with_pair_sidecars).
    pair_of: tuple[str, ...] = ()


@dataclass(frozen=True)
class Skipped:
    rel_path: str
    reason: str


def _skip_dir(name: str) -> bool:
    return name.startswith(".") or name.lower() in SYSTEM_FOLDERS


@dataclass(frozen=True)
class ExcludedFolder:
    """A folder under a library root that is never scanned as part of it, and why: Longlens's own
    data (catalog, backups, thumbnails, models) or another library (one picture, one library)."""

    path: Path
    reason: str


class _Exclusions:
    """The excluded folders by device and inode (every spelling of the folder, every way down to
    it) and by resolved name (what a symbolic link into one of them resolves to)."""

    def __init__(self, excluded: Sequence[ExcludedFolder]) -> None:
        self.by_key: dict[tuple[int, int], str] = {}
        self.by_path: list[tuple[str, str]] = []
        for ex in excluded:
            try:
                st = os.stat(ex.path)
                self.by_key[(st.st_dev, st.st_ino)] = ex.reason
            except OSError:
                pass  # not there: nothing of it can be found either, except by name below
            real = os.path.normcase(os.path.realpath(ex.path))
            self.by_path.append((real.rstrip(os.sep) + os.sep, ex.reason))

    def of_folder(self, st: os.stat_result) -> str | None:
        return self.by_key.get((st.st_dev, st.st_ino))

    def of_link(self, path: str) -> str | None:
        """Why a symbolic link's target lies in an excluded folder, if it does."""
        real = os.path.normcase(os.path.realpath(path)) + os.sep
        return next((reason for prefix, reason in self.by_path if real.startswith(prefix)), None)


def scan_folder(
    root: Path, extensions: frozenset[str], cancel: CancelToken | None = None,
    excluded: Sequence[ExcludedFolder] = (),
) -> Iterator[FileEntry | Skipped]:
    """Yield every image file under root (by extension) and every entry that had to be skipped.
    An `excluded` folder met on the way (or a symbolic link into one) is a Skipped with its reason."""
    root = Path(root)
    try:
        root_st = root.stat()
    except OSError as exc:
        yield Skipped("", f"root unreadable: {exc.strerror or exc}")
        return
    exclusions = _Exclusions(excluded)
    visited = {(root_st.st_dev, root_st.st_ino)}
    stack: list[tuple[Path, str]] = [(root, "")]
    while stack:
        if cancel is not None:
            cancel.raise_if_cancelled()
        folder, rel_folder = stack.pop()
        try:
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name)
        except PermissionError:
            yield Skipped(rel_folder or ".", "permission denied")
            continue
        except OSError as exc:
            yield Skipped(rel_folder or ".", f"unreadable folder: {exc.strerror or exc}")
            continue
        subfolders: list[tuple[Path, str]] = []
        # The folder's results in name order; pictures get their sidecars once the folder is listed.
        found: list[FileEntry | Skipped] = []
        xmp_files: dict[str, list[SidecarFile]] = {}
        for entry in entries:
            rel = f"{rel_folder}/{entry.name}" if rel_folder else entry.name
            try:
                is_link = entry.is_symlink()
                st = entry.stat(follow_symlinks=True)
            except FileNotFoundError:
                if is_link:
                    found.append(Skipped(rel, "broken symlink"))
                continue  # vanished between listing and stat
            except PermissionError:
                found.append(Skipped(rel, "permission denied"))
                continue
            except OSError as exc:
                # ELOOP for a symlink pointing at itself, EIO on failing media, ...
                found.append(Skipped(rel, f"unreadable: {exc.strerror or exc}"))
                continue
            if stat.S_ISDIR(st.st_mode):
                if _skip_dir(entry.name):
                    continue
                why = exclusions.of_folder(st) or (exclusions.of_link(entry.path) if is_link else None)
                if why is not None:
                    found.append(Skipped(rel, why))
                    continue
                key = (st.st_dev, st.st_ino)
                if key in visited:
                    if is_link:
                        found.append(Skipped(rel, "symlink loop"))
                    continue
                visited.add(key)
                subfolders.append((Path(entry.path), rel))
            elif stat.S_ISREG(st.st_mode):
                if entry.name.startswith("."):
                    continue
                if is_sidecar_name(entry.name):
                    xmp_files.setdefault(entry.name.casefold(), []).append(
                        SidecarFile(entry.name, Path(entry.path), st.st_size, st.st_mtime_ns, followed_link=is_link))
                    continue
                if os.path.splitext(entry.name)[1].lower() not in extensions:
                    continue
                why = exclusions.of_link(entry.path) if is_link else None
                if why is not None:
                    found.append(Skipped(rel, why))
                    continue
                if not os.access(entry.path, os.R_OK):
                    found.append(Skipped(rel, "permission denied"))
                    continue
                found.append(FileEntry(rel, Path(entry.path), st.st_size, st.st_mtime_ns, followed_link=is_link))
        for item in found:
            if isinstance(item, FileEntry) and xmp_files:
                sidecars = match_sidecars(item.abs_path.name, xmp_files)
                if sidecars:
                    item = dataclasses.replace(item, sidecars=sidecars)
            yield item
        # Depth-first in name order, so scans are deterministic.
        stack.extend(reversed(subfolders))


# The pictures a camera writes beside a RAW of the same name (RAW+JPEG, RAW+HEIF modes).
RAW_TWIN_EXTENSIONS = frozenset({".jpg", ".jpeg", ".jpe", ".jfif", ".heic", ".heif", ".hif"})


def pair_key(rel_path: str) -> str:
    """What the files of one RAW+JPEG pair share: the folder and name without the extension, in any case."""
    return os.path.splitext(rel_path)[0].casefold()


def split_raw_pairs(
    entries: list[FileEntry], keep: str, raw_extensions: frozenset[str]
) -> tuple[list[FileEntry], list[FileEntry]]:
    """(entries to index, entries left out) for RAW+JPEG pairs: a RAW file (`raw_extensions`) and
    a JPEG or HEIF (RAW_TWIN_EXTENSIONS) with the same name in the same folder are one shot.
    `keep`: "jpeg" indexes the JPEG (the camera's own rendering, cheap to decode), "raw" the RAW,
    "both" both. Names are compared case-insensitively (IMG_0001.CR2 and IMG_0001.jpg pair, as
    on the case-insensitive file systems of Windows and macOS). Order is kept."""
    if keep == "both":
        return list(entries), []
    if keep not in ("jpeg", "raw"):
        raise ValueError(f"keep must be 'jpeg', 'raw' or 'both', got {keep!r}")
    raws: set[str] = set()
    twins: set[str] = set()
    for e in entries:
        stem, ext = os.path.splitext(e.rel_path)
        if ext.lower() in raw_extensions:
            raws.add(stem.casefold())
        elif ext.lower() in RAW_TWIN_EXTENSIONS:
            twins.add(stem.casefold())
    paired = raws & twins
    drop = raw_extensions if keep == "jpeg" else RAW_TWIN_EXTENSIONS
    kept: list[FileEntry] = []
    left_out: list[FileEntry] = []
    for e in entries:
        stem, ext = os.path.splitext(e.rel_path)
        (left_out if ext.lower() in drop and stem.casefold() in paired else kept).append(e)
    return kept, left_out


def with_pair_sidecars(kept: list[FileEntry], left_out: list[FileEntry]) -> list[FileEntry]:
    """`kept` with, on the picture that stands for a RAW+JPEG pair, the XMP sidecars of the pair's
    file left out (split_raw_pairs): the pair is one shot, and its keywords and rating usually live
    in the RAW's sidecar (Lightroom's IMG_0001.xmp marked for CR2, darktable's IMG_0001.CR2.xmp)
    while the JPEG is what is indexed. engine.metadata.read_photo_metadata orders them."""
    partners: dict[str, list[FileEntry]] = {}
    for e in left_out:
        partners.setdefault(os.path.splitext(e.rel_path)[0].casefold(), []).append(e)
    if not partners:
        return kept
    out: list[FileEntry] = []
    for e in kept:
        others = partners.get(os.path.splitext(e.rel_path)[0].casefold())
        if not others:
            out.append(e)
            continue
        have = {s.path for s in e.sidecars}
        extra = tuple(dataclasses.replace(s, pair_of=o.abs_path.name)
                      for o in others for s in o.sidecars if s.path not in have)
        out.append(dataclasses.replace(e, sidecars=e.sidecars + extra,
                                       pair_of=tuple(o.abs_path.name for o in others)))
    return out
