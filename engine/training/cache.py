"""Frozen-vision embedding cache: every training image is embedded once, keyed by content hash.

Layout of a cache folder:

    embeddings.npy   float32 (capacity, dim), opened as a memory map; rows [0, count) are valid
    index.sqlite3    meta (model id, dim, probe vector, count), rows (sha256 -> row),
                     files (path, size, mtime -> sha256: re-runs need not re-read 500K files),
                     failed (sha256 -> decode error)
    writer.lock      held (an EXCLUSIVE SQLite transaction) by the one job that may write

Crash safety and resume: a batch's vectors are written and flushed to the memory map before
the SQLite transaction that indexes them commits, so the index only ever points at complete
rows; rows written after the last commit are simply overwritten by the next run, which skips
every hash already indexed.

Content hashes (not paths) are the key, so the same picture under two names or in two data
files is embedded once. The cache belongs to one vision tower: a probe image's embedding is
stored at creation and compared on every open, so embeddings from two models never mix.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from engine.errors import DecodeError, LonglensError
from engine.jobs import CancelToken, Progress, RateMeter

if TYPE_CHECKING:
    from engine.models.base import Embedder

EMBEDDINGS_FILE = "embeddings.npy"
INDEX_FILE = "index.sqlite3"
LOCK_FILE = "writer.lock"
CACHE_FORMAT = "longlens-embedding-cache"
CACHE_VERSION = 1
# Probe embeddings of the same tower agree to ~1e-3 across devices and dtypes (fp16 on a GPU,
# fp32 on the CPU); two different towers are far apart.
PROBE_MIN_COSINE = 0.99

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS rows (sha256 TEXT PRIMARY KEY, row INTEGER NOT NULL UNIQUE);
CREATE TABLE IF NOT EXISTS files (path TEXT PRIMARY KEY, size INTEGER NOT NULL,
                                  mtime_ns INTEGER NOT NULL, sha256 TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS failed (sha256 TEXT PRIMARY KEY, path TEXT NOT NULL, reason TEXT NOT NULL);
"""


class CacheError(LonglensError):
    pass


def sha256_of(path: Path) -> str:
    """An image's key in the cache: the same SHA-256 content hash as the catalog's."""
    from engine.indexing.pipeline import content_hash

    return content_hash(path)


def probe_image() -> Any:
    """A fixed synthetic picture (colour ramps and a square) whose embedding identifies a tower."""
    from PIL import Image

    y, x = np.mgrid[0:96, 0:96].astype(np.float32)
    rgb = np.stack([x / 95 * 255, y / 95 * 255, (x + y) / 190 * 255], axis=-1)
    rgb[30:60, 40:70] = (250, 40, 20)
    return Image.fromarray(rgb.astype(np.uint8), "RGB")


def probe_vector(embedder: Embedder) -> np.ndarray:
    return embedder.encode_pixels(embedder.preprocess([probe_image()]))[0].astype(np.float32)


class EmbeddingCache:
    """Read access (and the writer's primitives) for one cache folder."""

    def __init__(self, folder: Path | str) -> None:
        self.folder = Path(folder)
        db_path = self.folder / INDEX_FILE
        if not db_path.is_file() or not (self.folder / EMBEDDINGS_FILE).is_file():
            raise CacheError(f"{self.folder} is not an embedding cache (run `longlens train cache` first)")
        self.db = sqlite3.connect(str(db_path))
        meta = dict(self.db.execute("SELECT key, value FROM meta"))
        if meta.get("format") != CACHE_FORMAT or int(meta.get("version", 0)) > CACHE_VERSION:
            raise CacheError(f"{db_path} is not a Longlens embedding cache of a version this build reads")
        self.model_id = meta["model_id"]
        self.identity = meta.get("identity", "")  # absent in caches made before model identities
        self.dim = int(meta["dim"])
        self.probe = np.asarray(json.loads(meta["probe"]), dtype=np.float32)
        self._vectors: np.ndarray | None = None

    # -- creation and checks ------------------------------------------------------
    @classmethod
    def create_or_open(cls, folder: Path | str, embedder: Embedder) -> EmbeddingCache:
        """Open the cache for `embedder`'s vision tower, creating it if the folder is new."""
        folder = Path(folder)
        probe = probe_vector(embedder)
        if not (folder / INDEX_FILE).is_file():
            folder.mkdir(parents=True, exist_ok=True)
            _create(folder, embedder.model_id, int(embedder.dim), probe, embedder.identity)
        cache = cls(folder)
        cache.check_compatible(embedder.model_id, probe, embedder.identity)
        return cache

    def check_compatible(self, model_id: str, probe: np.ndarray, identity: str = "") -> None:
        if _from_manifest(self.identity) and _from_manifest(identity) and self.identity != identity:
            # Both made from installed models' files: a different identity is another vision tower
            # even when the probe image happens to embed alike (a light fine-tune).
            raise CacheError(
                f"the embedding cache {self.folder} was made with {self.identity}, not with the installed "
                f"{model_id} ({identity}): its files changed since. Use another cache folder.",
                settings=("cache_dir",),
            )
        cos = float(np.dot(self.probe, probe) / max(np.linalg.norm(self.probe) * np.linalg.norm(probe), 1e-12))
        if probe.shape != self.probe.shape or cos < PROBE_MIN_COSINE:
            raise CacheError(
                f"the embedding cache {self.folder} was made with another vision tower ({self.model_id}); "
                f"{model_id} embeds its probe image differently (cosine {cos:.3f}). Use another cache folder.",
                settings=("cache_dir",),
            )

    def close(self) -> None:
        self._vectors = None
        self.db.close()

    def __enter__(self) -> EmbeddingCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reading -------------------------------------------------------------------
    def __len__(self) -> int:
        return int(self.db.execute("SELECT value FROM meta WHERE key = 'count'").fetchone()[0])

    def vectors(self) -> np.ndarray:
        """Memory map of the valid rows (read-only)."""
        if self._vectors is None:
            arr = np.load(self.folder / EMBEDDINGS_FILE, mmap_mode="r")
            self._vectors = arr[: len(self)]
        return self._vectors

    def rows_for(self, hashes: Sequence[str]) -> np.ndarray:
        """Row of each hash, -1 where it is not cached."""
        rows = dict(self._query_in("SELECT sha256, row FROM rows WHERE sha256 IN ({})", hashes))
        return np.asarray([rows.get(h, -1) for h in hashes], dtype=np.int64)

    def failures(self) -> dict[str, tuple[str, str]]:
        """sha256 -> (path, reason) of images that could not be decoded."""
        return {h: (p, r) for h, p, r in self.db.execute("SELECT sha256, path, reason FROM failed")}

    def hashes_for(self, paths: Sequence[Path], *, remember: bool = True) -> list[str | None]:
        """Content hash of each file; unchanged files (same size and mtime) reuse the recorded
        hash instead of being read again. None for a file that cannot be read."""
        keys = [str(Path(p).resolve()) for p in paths]
        known = {p: (s, m, h) for p, s, m, h in
                 self._query_in("SELECT path, size, mtime_ns, sha256 FROM files WHERE path IN ({})", keys)}
        out: list[str | None] = []
        fresh: list[tuple[str, int, int, str]] = []
        todo: list[tuple[int, str, int, int]] = []
        for i, key in enumerate(keys):
            try:
                st = os.stat(key)
            except OSError:
                out.append(None)
                continue
            rec = known.get(key)
            if rec is not None and rec[0] == st.st_size and rec[1] == st.st_mtime_ns:
                out.append(rec[2])
            else:
                out.append(None)
                todo.append((i, key, st.st_size, st.st_mtime_ns))
        # hashlib releases the GIL on large buffers, so threads overlap the reads.
        with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
            digests = list(pool.map(_safe_sha256, [k for _, k, _, _ in todo]))
        for (i, key, size, mtime), digest in zip(todo, digests, strict=True):
            out[i] = digest
            if digest is not None:
                fresh.append((key, size, mtime, digest))
        if remember and fresh:
            with self.db:
                self.db.executemany("INSERT OR REPLACE INTO files VALUES (?, ?, ?, ?)", fresh)
        return out

    def _query_in(self, sql: str, values: Sequence[str]) -> list[tuple]:
        out: list[tuple] = []
        values = list(values)
        for start in range(0, len(values), 900):  # SQLite's bound-parameter limit
            part = values[start : start + 900]
            out += self.db.execute(sql.format(",".join("?" * len(part))), part).fetchall()
        return out


def _safe_sha256(path: str) -> str | None:
    try:
        return sha256_of(Path(path))
    except OSError:
        return None


def _from_manifest(identity: str) -> bool:
    """Identities computed from a manifest look like NAME@hash; a bare folder's is just its name."""
    return "@" in identity


def _create(folder: Path, model_id: str, dim: int, probe: np.ndarray, identity: str = "") -> None:
    arr = np.lib.format.open_memmap(folder / EMBEDDINGS_FILE, mode="w+", dtype=np.float32, shape=(0, dim))
    del arr
    tmp = folder / (INDEX_FILE + ".tmp")
    tmp.unlink(missing_ok=True)
    db = sqlite3.connect(str(tmp))
    with db:
        db.executescript(_SCHEMA)
        db.executemany("INSERT INTO meta VALUES (?, ?)", [
            ("format", CACHE_FORMAT), ("version", str(CACHE_VERSION)), ("model_id", model_id),
            ("identity", identity), ("dim", str(dim)), ("probe", json.dumps([float(x) for x in probe])), ("count", "0"),
        ])
    db.close()
    # The index appears under its final name only when complete: a folder with an index is a cache.
    os.replace(tmp, folder / INDEX_FILE)


class _WriterLock:
    """An EXCLUSIVE transaction on a side database: the OS releases it if the process dies."""

    def __init__(self, folder: Path) -> None:
        self.conn = sqlite3.connect(str(folder / LOCK_FILE), timeout=0, isolation_level=None)
        try:
            self.conn.execute("BEGIN EXCLUSIVE")
        except sqlite3.OperationalError as exc:
            self.conn.close()
            raise CacheError(f"another job is writing the embedding cache {folder}") from exc

    def release(self) -> None:
        try:
            self.conn.execute("ROLLBACK")
        finally:
            self.conn.close()


def _ensure_capacity(cache: EmbeddingCache, needed_rows: int) -> np.ndarray:
    """A writable memory map with at least `needed_rows` rows; grows by copy + atomic rename."""
    path = cache.folder / EMBEDDINGS_FILE
    cache._vectors = None
    arr = np.load(path, mmap_mode="r+")
    if arr.shape[0] >= needed_rows:
        return arr
    count = len(cache)
    capacity = max(needed_rows, 2 * arr.shape[0])
    tmp = cache.folder / (EMBEDDINGS_FILE + ".tmp")
    grown = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=(capacity, cache.dim))
    grown[:count] = arr[:count]
    grown.flush()
    del arr, grown
    os.replace(tmp, path)
    return np.load(path, mmap_mode="r+")


def _decode(path: str, size: int) -> Any:
    from engine.indexing.decode import decode_image

    try:
        return decode_image(Path(path), target_size=size)[0]
    except DecodeError as exc:
        return exc


def build_cache(
    embedder: Embedder,
    image_paths: Sequence[Path],
    cache_dir: Path | str,
    *,
    batch_size: int = 64,
    workers: int = 4,
    cancel: CancelToken | None = None,
) -> Iterator[Progress]:
    """Embed every image not yet in the cache (a job: yields Progress, stops at the next batch
    when cancelled). The final report's extra holds added/reused counts and failures."""
    cancel = cancel or CancelToken()
    cache = EmbeddingCache.create_or_open(cache_dir, embedder)
    lock = _WriterLock(cache.folder)
    try:
        hashes: list[str | None] = []
        hash_meter = RateMeter(len(image_paths))
        for start in range(0, len(image_paths), 4096):
            if cancel.cancelled:  # only file hashes are recorded so far: nothing to undo
                yield Progress("done", 0, None, "cancelled", extra={"cancelled": True, "cache": str(cache.folder),
                                                                   "added": 0, "reused": 0, "failed": []})
                return
            hashes += cache.hashes_for(image_paths[start : start + 4096])
            yield hash_meter.progress("hash", len(hashes), "hashing image files")
        failed: list[dict[str, str]] = [
            {"path": str(p), "reason": "cannot read the file"} for p, h in zip(image_paths, hashes, strict=True)
            if h is None
        ]
        known_failed = cache.failures()
        rows = cache.rows_for([h for h in hashes if h is not None])
        cached = {h for h, r in zip((h for h in hashes if h is not None), rows, strict=True) if r >= 0}
        todo: dict[str, str] = {}  # hash -> a path with that content, in input order
        for p, h in zip(image_paths, hashes, strict=True):
            if h is None or h in cached or h in todo:
                continue
            if h in known_failed:
                failed.append({"path": str(p), "reason": known_failed[h][1]})
                continue
            todo[h] = str(Path(p).resolve())
        reused = sum(1 for h in hashes if h in cached)
        count = len(cache)
        arr = _ensure_capacity(cache, count + len(todo))
        items = list(todo.items())
        meter = RateMeter(len(items))
        added = 0
        cancelled = False
        with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            for start in range(0, len(items), batch_size):
                if cancel.cancelled:
                    cancelled = True
                    break
                batch = items[start : start + batch_size]
                decoded = list(pool.map(lambda it: _decode(it[1], embedder.image_size), batch))
                good = [(h, p, im) for (h, p), im in zip(batch, decoded, strict=True) if not isinstance(im, DecodeError)]
                bad = [(h, p, im.reason) for (h, p), im in zip(batch, decoded, strict=True) if isinstance(im, DecodeError)]
                if good:
                    vecs = embedder.encode_pixels(embedder.preprocess([im for _, _, im in good]))
                    arr[count : count + len(good)] = vecs
                    arr.flush()  # rows on disk before the index points at them
                with cache.db:
                    cache.db.executemany("INSERT INTO rows VALUES (?, ?)",
                                         [(h, count + i) for i, (h, _, _) in enumerate(good)])
                    cache.db.executemany("INSERT OR REPLACE INTO failed VALUES (?, ?, ?)", bad)
                    count += len(good)
                    cache.db.execute("UPDATE meta SET value = ? WHERE key = 'count'", (str(count),))
                added += len(good)
                failed += [{"path": p, "reason": r} for _, p, r in bad]
                done = start + len(batch)
                yield meter.progress("embed", done, f"{count} images cached")
        del arr
        summary = {"cache": str(cache.folder), "model": cache.model_id, "added": added, "reused": reused,
                   "failed": failed, "cancelled": cancelled, "count": count}
        yield Progress("done", added, len(items), "cancelled" if cancelled else "cache complete", extra=summary)
    finally:
        lock.release()
        cache.close()


def lookup(cache_dir: Path | str, image_paths: Sequence[Path]) -> tuple[np.ndarray, np.ndarray]:
    """(vectors (M, D) float32, indices (M,) into image_paths) for the images that are cached."""
    with EmbeddingCache(cache_dir) as cache:
        hashes = cache.hashes_for(image_paths)
        present = [i for i, h in enumerate(hashes) if h is not None]
        rows = cache.rows_for([hashes[i] for i in present])
        keep = np.asarray([present[j] for j in range(len(present)) if rows[j] >= 0], dtype=np.int64)
        vectors = np.asarray(cache.vectors()[rows[rows >= 0]], dtype=np.float32)
    return vectors, keep
