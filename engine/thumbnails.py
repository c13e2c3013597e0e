"""Thumbnails for the results grid and review: upright, small, cached on disk with a size bound.

A thumbnail is keyed by the file's absolute path, size and modification time plus the
requested size, so an edited photo gets a new thumbnail and the stale one ages out. The
cache is a folder of JPEG files under Paths.thumbnails; a hit refreshes the file's mtime,
and when the folder grows past its byte budget the least recently used files are removed.

Thread-safe: the GUI builds thumbnails from several worker threads at once. Nothing here
writes next to the photos (the originals are never touched).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
from pathlib import Path

from PIL import Image

from engine.indexing.decode import decode_image

DEFAULT_MAX_BYTES = 512 * 1024 * 1024
THUMB_SUFFIX = ".jpg"
_JPEG_QUALITY = 85


def thumbnail_key(path: Path | str, size: int) -> str:
    """Cache key of `path` at `size`: changes when the file's size or mtime changes."""
    p = Path(path)
    st = p.stat()
    ident = f"{os.fsencode(str(p.resolve())).hex()}|{st.st_size}|{st.st_mtime_ns}|{int(size)}"
    return hashlib.sha256(ident.encode("ascii")).hexdigest()


def render_thumbnail(path: Path | str, size: int) -> Image.Image:
    """Decode upright (EXIF-transposed, JPEG draft mode) and shrink so the longer side is `size`."""
    image, _meta = decode_image(Path(path), target_size=int(size))
    image.thumbnail((int(size), int(size)), Image.Resampling.LANCZOS, reducing_gap=2.0)
    return image.convert("RGB")


class ThumbnailCache:
    """A folder of cached thumbnails, evicted least-recently-used past `max_bytes`."""

    def __init__(self, folder: Path, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.folder = Path(folder)
        self.max_bytes = int(max_bytes)
        self._lock = threading.Lock()
        self._total: int | None = None  # bytes on disk, measured lazily on first write

    def _file_for(self, key: str) -> Path:
        return self.folder / key[:2] / f"{key}{THUMB_SUFFIX}"

    def get(self, path: Path | str, size: int) -> Image.Image:
        """The thumbnail of `path` (from the cache, else rendered and stored). Raises DecodeError."""
        key = thumbnail_key(path, size)
        f = self._file_for(key)
        try:
            with Image.open(f) as im:
                im.load()
                cached = im.convert("RGB")
            try:
                os.utime(f)  # LRU: a hit makes the file recent
            except OSError:
                pass
            return cached
        except (FileNotFoundError, NotADirectoryError):
            pass
        except OSError:
            f.unlink(missing_ok=True)  # a damaged cache file is just re-rendered
        image = render_thumbnail(path, size)
        self._store(f, image)
        return image

    def _store(self, f: Path, image: Image.Image) -> None:
        tmp = f.with_name(f".{f.name}.{threading.get_ident()}.tmp")
        try:
            # Inside the try: a cache folder that cannot be created (read-only, a file in the
            # way) costs the cache entry, like a full disk, never the thumbnail.
            f.parent.mkdir(parents=True, exist_ok=True)
            image.save(tmp, "JPEG", quality=_JPEG_QUALITY)
            os.replace(tmp, f)
        except OSError:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            return  # a full disk costs the cache entry, not the thumbnail
        with self._lock:
            if self._total is None:
                self._total = self._measure()
            else:
                self._total += f.stat().st_size
            if self._total > self.max_bytes:
                self._evict()

    def _entries(self) -> list[tuple[float, int, Path]]:
        out = []
        if not self.folder.is_dir():
            return out
        for sub in self.folder.iterdir():
            if not sub.is_dir():
                continue
            for f in sub.iterdir():
                if f.suffix != THUMB_SUFFIX or f.name.startswith("."):
                    continue
                try:
                    st = f.stat()
                except OSError:
                    continue
                out.append((st.st_mtime, st.st_size, f))
        return out

    def _measure(self) -> int:
        return sum(size for _, size, _ in self._entries())

    def _evict(self) -> None:
        """Remove the oldest files until the cache is at 90% of its budget (called with the lock)."""
        entries = sorted(self._entries())
        total = sum(size for _, size, _ in entries)
        target = int(self.max_bytes * 0.9)
        for _mtime, size, f in entries:
            if total <= target:
                break
            try:
                f.unlink()
                total -= size
            except OSError:
                pass
        self._total = total

    def size_bytes(self) -> int:
        with self._lock:
            self._total = self._measure()
            return self._total

    def clear(self) -> None:
        with self._lock:
            for _, _, f in self._entries():
                f.unlink(missing_ok=True)
            self._total = 0


def make_thumbnail(path: Path | str, size: int, cache: ThumbnailCache | None = None) -> Image.Image:
    """An upright RGB thumbnail whose longer side is at most `size`, through `cache` when given."""
    if cache is None:
        return render_thumbnail(path, size)
    return cache.get(path, size)
