"""Nearest-neighbour index over the image vectors of one (library, model) pair.

The catalog (SQLite) holds every vector; this index is derived data that can always
be rebuilt from it. Vectors are float32 and L2-normalised, similarity is the inner
product, labels are the catalog's int64 image ids.

Small indexes are searched exactly with numpy (a matrix-vector product is faster
than walking a graph until a few thousand vectors, and it is exact); from
EXACT_THRESHOLD vectors on, an hnswlib graph (space "ip") takes over.

File format (one file, written atomically)::

    0   8s  magic  b"LLVECIX\\x00"
    8   u32 format version
    12  u32 mode (0 exact, 1 hnsw)
    16  u32 dim
    20  u32 M
    24  u32 ef_construction
    28  u32 ef_search
    32  u64 count      live vectors
    40  u64 capacity   hnswlib max_elements (exact: == count)
    48  u64 slots      hnswlib element slots, live + deleted (exact: == count)
    56  u64 payload length in bytes
    64  32s SHA-256 over bytes 0..63 and the payload
    96  32x reserved, zero
    128 payload: exact -> ids int64[count] + vectors float32[count, dim];
                 hnsw  -> the bytes of hnswlib's save_index (labels are the image ids)

All little-endian. `load` checks the header, the file size and the checksum, and
then walks the hnswlib structure (every link in range, levels consistent) before
hnswlib sees a byte, because hnswlib trusts its input and crafted files can make it
read out of bounds and take the whole process down.
"""

from __future__ import annotations

import hashlib
import math
import mmap
import os
import struct
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import hnswlib
import numpy as np

from engine.errors import IndexFileError
from engine.index.rwlock import RWLock
from engine.swap_journal import temp_prefix

# Measured with `python -m engine.bench.ann` (docs/benchmarks.md, "Exact -> hnsw crossover"):
# 2-core x86 VM, dim 256, M=16, ef_construction=200, ef_search=64, one query row, k=10,
# p50 per call including this class's overhead. Exact grows linearly (0.031 ms at 2k,
# 0.056 ms at 5k, 0.092 ms at 10k vectors), hnsw slowly (0.037, 0.044, 0.065 ms); the
# curves cross at ~2,850 vectors in the documented run (2,850-3,470 over four runs on a
# machine shared with other jobs), rounded to 3,000. Near the crossing the two differ by
# under 10%, so the exact value matters little; below it results are exact for free.
EXACT_THRESHOLD = 3_000

# Chosen by measurement (docs/benchmarks.md, "Chosen parameters"): the fastest setting
# with recall@10 >= 0.99 against exact search at 10k and 100k vectors (dim 256, clustered
# synthetic data, in-distribution and shifted "text-like" queries) and <= 1.4 KB/vector
# on disk: 1172 B/vector, 0.15 ms p50 at 100k vectors (11x faster than exact).
DEFAULT_M = 16
DEFAULT_EF_CONSTRUCTION = 200
DEFAULT_EF_SEARCH = 64

# hnswlib allocates max_elements up front; 1.5x keeps the slack (memory not yet used)
# at most a third of the index while still amortising the realloc+copy of a resize.
GROWTH_FACTOR = 1.5
MIN_CAPACITY = 1024
# With a filter, ask for k * FILTER_OVERFETCH neighbours first and double from there.
FILTER_OVERFETCH = 4
# Fixed so that the same inserts in the same order build the same graph.
RANDOM_SEED = 100

MODE_EXACT = "exact"
MODE_HNSW = "hnsw"
_MODE_CODES = {MODE_EXACT: 0, MODE_HNSW: 1}
_MODE_NAMES = {v: k for k, v in _MODE_CODES.items()}

MAGIC = b"LLVECIX\x00"
FORMAT_VERSION = 1
_FIELDS = struct.Struct("<8sIIIIIIQQQQ")
_HEADER_SIZE = 128
_DIGEST_SIZE = 32
# hnswlib 0.8 save_index header: offsetLevel0, max_elements, cur_element_count,
# size_data_per_element, label_offset, offsetData, maxlevel, enterpoint_node, maxM,
# maxM0, M, mult, ef_construction.
_HNSW_HEADER = struct.Struct("<QQQQQQiIQQQdQ")

# Sanity bounds for header fields; anything outside is a damaged or foreign file.
_MAX_DIM = 65_536
_MAX_M = 128
_MAX_EF = 100_000
_MAX_SLOTS = 2**32 - 2  # hnswlib's internal ids are uint32
_MAX_LEVEL = 64  # level ~ log_M(n); 64 is unreachable for any real index
_MAX_ID = 2**63 - 1

_CHUNK_BYTES = 8 << 20
_ROWS_PER_SCAN_CHUNK = 32_768


class _Corrupt(Exception):
    """A problem found in an index file; load() turns it into IndexFileError."""


class VectorIndex:
    """Inner-product k-NN over int64 ids, exact below `exact_threshold`, hnswlib above.

    Thread-safe: queries share a read lock, mutations take the write lock.
    """

    def __init__(
        self,
        dim: int,
        *,
        path: Path | None = None,
        exact_threshold: int = EXACT_THRESHOLD,
        M: int = DEFAULT_M,
        ef_construction: int = DEFAULT_EF_CONSTRUCTION,
        ef_search: int = DEFAULT_EF_SEARCH,
    ) -> None:
        _check_range("dim", dim, 1, _MAX_DIM)
        _check_range("M", M, 2, _MAX_M)
        _check_range("ef_construction", ef_construction, 1, _MAX_EF)
        _check_range("ef_search", ef_search, 1, _MAX_EF)
        if int(exact_threshold) < 0:
            raise ValueError(f"exact_threshold must be >= 0, got {exact_threshold}")
        self._dim = int(dim)
        self._path = Path(path) if path is not None else None
        self._threshold = int(exact_threshold)
        self._M = int(M)
        self._ef_construction = int(ef_construction)
        self._ef_search = int(ef_search)
        self._lock = RWLock()
        # Saving only reads the index, so it holds the read lock (searches go on);
        # this mutex keeps two saves from interleaving their temp files.
        self._save_mutex = threading.Lock()
        # Exact store: rows [0, _n) of _ex_ids/_ex_vecs are live; _pos maps id -> row.
        self._ex_ids = np.empty(0, dtype=np.int64)
        self._ex_vecs = np.empty((0, self._dim), dtype=np.float32)
        self._n = 0
        self._pos: dict[int, int] = {}
        # hnsw store: hnswlib keeps deleted labels around, so live ids are tracked here.
        self._hnsw: hnswlib.Index | None = None
        self._live: set[int] = set()

    # ------------------------------------------------------------------ properties

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def mode(self) -> str:
        return MODE_HNSW if self._hnsw is not None else MODE_EXACT

    @property
    def path(self) -> Path | None:
        return self._path

    @property
    def exact_threshold(self) -> int:
        return self._threshold

    @property
    def M(self) -> int:
        return self._M

    @property
    def ef_construction(self) -> int:
        return self._ef_construction

    @property
    def ef_search(self) -> int:
        return self._ef_search

    @ef_search.setter
    def ef_search(self, value: int) -> None:
        _check_range("ef_search", value, 1, _MAX_EF)
        with self._lock.write():
            self._ef_search = int(value)
            if self._hnsw is not None:
                self._hnsw.set_ef(self._ef_search)

    def __len__(self) -> int:
        with self._lock.read():
            return self._count()

    def __contains__(self, image_id: object) -> bool:
        if not isinstance(image_id, int | np.integer):
            return False
        key = int(image_id)
        with self._lock.read():
            return key in (self._live if self._hnsw is not None else self._pos)

    def __repr__(self) -> str:
        return f"VectorIndex(dim={self._dim}, mode={self.mode!r}, count={len(self)}, path={self._path})"

    def ids(self) -> np.ndarray:
        """All ids in the index, ascending."""
        with self._lock.read():
            if self._hnsw is not None:
                out = np.fromiter(self._live, dtype=np.int64, count=len(self._live))
            else:
                out = self._ex_ids[: self._n].copy()
        out.sort()
        return out

    def stats(self) -> dict[str, Any]:
        """Counts and sizes, for diagnostics and the benchmark."""
        with self._lock.read():
            slots = self._hnsw.element_count if self._hnsw is not None else self._n
            capacity = self._hnsw.max_elements if self._hnsw is not None else len(self._ex_ids)
            return {
                "mode": self.mode,
                "dim": self._dim,
                "count": self._count(),
                "slots": int(slots),
                "capacity": int(capacity),
                "M": self._M,
                "ef_construction": self._ef_construction,
                "ef_search": self._ef_search,
                "memory_bytes": self._memory_bytes(),
            }

    # ------------------------------------------------------------------ mutation

    def add(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        """Insert or replace: an id already present gets the new vector."""
        ids = _as_ids(ids)
        vecs = _as_vectors(vectors, self._dim)
        if len(ids) != len(vecs):
            raise ValueError(f"{len(ids)} ids but {len(vecs)} vectors")
        if len(ids) == 0:
            return
        # A repeated id within one batch: the last vector wins, as sequential upserts would.
        _, first_in_reversed = np.unique(ids[::-1], return_index=True)
        if len(first_in_reversed) != len(ids):
            keep = np.sort(len(ids) - 1 - first_in_reversed)
            ids, vecs = ids[keep], vecs[keep]
        with self._lock.write():
            if self._hnsw is None:
                self._exact_add(ids, vecs)
            else:
                self._hnsw_add(ids, vecs)
            self._maybe_switch_mode()

    def delete(self, ids: Iterable[int] | np.ndarray) -> None:
        """Remove ids; ids not present are ignored."""
        ids = _as_ids(ids)
        if len(ids) == 0:
            return
        with self._lock.write():
            if self._hnsw is None:
                self._exact_delete(ids)
            else:
                for key in ids.tolist():
                    if key in self._live:
                        # The slot stays in the graph (deleted nodes still route searches)
                        # and is handed to a later new id by add(replace_deleted=True).
                        self._hnsw.mark_deleted(key)
                        self._live.discard(key)
            self._maybe_switch_mode()

    def reconcile(
        self, ids: np.ndarray, fetch_vectors: Callable[[np.ndarray], np.ndarray], *, batch: int = 4096
    ) -> tuple[int, int]:
        """Make the index hold exactly `ids`; returns (added, removed).

        Used when the index file is older than the catalog (a crash between a catalog
        commit and the next index save). Vectors of missing ids come from
        `fetch_vectors(ids_batch)`, in the order asked for.
        """
        target = np.unique(_as_ids(ids))
        current = self.ids()
        extra = np.setdiff1d(current, target, assume_unique=True)
        missing = np.setdiff1d(target, current, assume_unique=True)
        # Delete first so that hnsw slots freed by the extras take the missing ones.
        self.delete(extra)
        for start in range(0, len(missing), batch):
            chunk = missing[start : start + batch]
            vecs = _as_vectors(fetch_vectors(chunk), self._dim)
            if len(vecs) != len(chunk):
                raise ValueError(f"fetch_vectors returned {len(vecs)} vectors for {len(chunk)} ids")
            self.add(chunk, vecs)
        return int(len(missing)), int(len(extra))

    # ------------------------------------------------------------------ search

    def query(
        self, vectors: np.ndarray, k: int, *, allowed: Callable[[int], bool] | None = None
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """For each query row: (ids int64, scores float32), best first, at most k.

        `allowed(image_id)` restricts the results; the index over-fetches (k x 4,
        doubling) until k allowed hits are found or every vector has been looked at.
        It runs under the index's read lock, so it must not call back into the index.
        Ties in score are broken by ascending id, so results are deterministic. In hnsw
        mode results are approximate (ef = max(ef_search, k)); in exact mode they are
        exactly the (filtered) brute-force top k.
        """
        q = _as_vectors(np.atleast_2d(np.asarray(vectors, dtype=np.float32)), self._dim)
        k = int(k)
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        with self._lock.read():
            if self._count() == 0:
                return [(np.empty(0, np.int64), np.empty(0, np.float32)) for _ in range(len(q))]
            if self._hnsw is None:
                return self._exact_query(q, k, allowed)
            return self._hnsw_query(q, k, allowed)

    # ------------------------------------------------------------------ persistence

    def save(self, path: Path | None = None) -> None:
        """Write the index atomically: temp file, fsync, rename, fsync the directory.

        A crash at any point leaves either the previous file or the new one, never a mix.
        """
        target = Path(path) if path is not None else self._path
        if target is None:
            raise ValueError("no path given and the index has none")
        target.parent.mkdir(parents=True, exist_ok=True)
        with self._save_mutex, self._lock.read():
            if self._hnsw is None:
                n = self._n
                chunks = _array_chunks([self._ex_ids[:n], self._ex_vecs[:n]])
                fields = self._header_fields(MODE_EXACT, n, n, n, n * (8 + 4 * self._dim))
                _atomic_write(target, fields, chunks)
            else:
                fd, hnsw_tmp = tempfile.mkstemp(
                    prefix=temp_prefix(target, "save"), suffix=".hnsw.tmp", dir=target.parent
                )
                os.close(fd)
                try:
                    self._hnsw.save_index(hnsw_tmp)
                    size = os.path.getsize(hnsw_tmp)
                    slots = self._hnsw.element_count
                    if size < _HNSW_HEADER.size + slots * (_level0_bytes(self._dim, self._M) + 4):
                        # hnswlib's ofstream does not report write errors (e.g. a full disk).
                        raise OSError(f"hnswlib wrote a short index file ({size} bytes for {slots} elements)")
                    fields = self._header_fields(
                        MODE_HNSW, len(self._live), self._hnsw.max_elements, slots, size
                    )
                    with open(hnsw_tmp, "rb") as src:
                        _atomic_write(target, fields, iter(lambda: src.read(_CHUNK_BYTES), b""))
                finally:
                    _unlink_quietly(hnsw_tmp)
        if self._path is None:
            self._path = target

    @classmethod
    def load(
        cls,
        path: Path,
        dim: int,
        *,
        exact_threshold: int = EXACT_THRESHOLD,
        ef_search: int | None = None,
    ) -> VectorIndex:
        """Read an index file written by save(); IndexFileError if it is damaged or foreign.

        FileNotFoundError propagates unchanged (a missing file is not a damaged one).
        M and ef_construction come from the file; ef_search too unless given.
        """
        path = Path(path)
        try:
            return cls._load(path, int(dim), exact_threshold, ef_search)
        except _Corrupt as exc:
            raise IndexFileError(f"vector index file {path}: {exc}") from None

    @classmethod
    def open_or_rebuild(
        cls,
        path: Path,
        dim: int,
        all_vectors: Callable[[], tuple[np.ndarray, np.ndarray]],
        **params: Any,
    ) -> tuple[VectorIndex, str | None]:
        """Load `path`, or rebuild from the catalog's (ids, vectors) and save.

        Returns the index and a note saying why it was rebuilt (None if it loaded).
        `params` are the constructor's keyword arguments, used for a rebuild;
        exact_threshold and ef_search also apply to a loaded index.
        """
        path = Path(path)
        load_params = {key: params[key] for key in ("exact_threshold", "ef_search") if key in params}
        try:
            return cls.load(path, dim, **load_params), None
        except FileNotFoundError:
            reason = f"vector index file {path} is missing"
        except IndexFileError as exc:
            reason = str(exc)
        ids, vectors = all_vectors()
        index = cls(dim, path=path, **params)
        index.add(ids, vectors)
        note = f"{reason}; rebuilt from the catalog ({len(index)} vectors)"
        try:
            index.save(path)
        except OSError as exc:
            # The rebuilt index still works in memory; the next save will try again.
            note += f"; saving the rebuilt index failed: {exc}"
        return index, note

    # ------------------------------------------------------------------ internals: exact

    def _count(self) -> int:
        return len(self._live) if self._hnsw is not None else self._n

    def _exact_add(self, ids: np.ndarray, vecs: np.ndarray) -> None:
        rows = np.fromiter((self._pos.get(key, -1) for key in ids.tolist()), dtype=np.int64, count=len(ids))
        present = rows >= 0
        self._ex_vecs[rows[present]] = vecs[present]
        new_ids, new_vecs = ids[~present], vecs[~present]
        if len(new_ids) == 0:
            return
        need = self._n + len(new_ids)
        if need > len(self._ex_ids):
            capacity = max(need, int(len(self._ex_ids) * 2), 64)
            grown_ids = np.empty(capacity, dtype=np.int64)
            grown_vecs = np.empty((capacity, self._dim), dtype=np.float32)
            grown_ids[: self._n] = self._ex_ids[: self._n]
            grown_vecs[: self._n] = self._ex_vecs[: self._n]
            self._ex_ids, self._ex_vecs = grown_ids, grown_vecs
        self._ex_ids[self._n : need] = new_ids
        self._ex_vecs[self._n : need] = new_vecs
        self._pos.update(zip(new_ids.tolist(), range(self._n, need), strict=True))
        self._n = need

    def _exact_delete(self, ids: np.ndarray) -> None:
        for key in ids.tolist():
            row = self._pos.pop(key, None)
            if row is None:
                continue
            last = self._n - 1
            if row != last:
                # Move the last row into the hole so live rows stay contiguous.
                moved = int(self._ex_ids[last])
                self._ex_ids[row] = moved
                self._ex_vecs[row] = self._ex_vecs[last]
                self._pos[moved] = row
            self._n = last

    def _exact_query(
        self, q: np.ndarray, k: int, allowed: Callable[[int], bool] | None
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        ids = self._ex_ids[: self._n]
        vecs = self._ex_vecs[: self._n]
        out: list[tuple[np.ndarray, np.ndarray]] = []
        # Bound the (rows x n) score matrix to ~64 MB for large query batches.
        rows_per_chunk = max(1, (16 << 20) // max(self._n, 1))
        for start in range(0, len(q), rows_per_chunk):
            scores = q[start : start + rows_per_chunk] @ vecs.T
            for row in scores:
                out.append(_topk_from_scores(ids, row, k, allowed))
        return out

    # ------------------------------------------------------------------ internals: hnsw

    def _new_hnsw(self, capacity: int) -> hnswlib.Index:
        index = hnswlib.Index(space="ip", dim=self._dim)
        index.init_index(
            max_elements=capacity,
            M=self._M,
            ef_construction=self._ef_construction,
            random_seed=RANDOM_SEED,
            allow_replace_deleted=True,
        )
        index.set_ef(self._ef_search)
        return index

    def _maybe_switch_mode(self) -> None:
        count = self._count()
        if self._hnsw is None and count > 0 and count >= self._threshold:
            self._exact_to_hnsw()
        elif self._hnsw is not None and count < self._threshold // 2:
            # Hysteresis (half the threshold) so that add/delete around the threshold does
            # not rebuild back and forth; going back also drops the deleted hnsw slots.
            self._hnsw_to_exact()

    def _exact_to_hnsw(self) -> None:
        n = self._n
        order = np.argsort(self._ex_ids[:n], kind="stable")
        ids, vecs = self._ex_ids[:n][order], self._ex_vecs[:n][order]
        # Small headroom only: a rebuild from the catalog lands here with every vector at
        # once, and full GROWTH_FACTOR slack would cost ~600 B per image until it fills.
        index = self._new_hnsw(n + max(n // 8, MIN_CAPACITY))
        # One thread: hnswlib's multi-threaded insert order is racy, so the graph (and
        # therefore results) would differ from run to run.
        index.add_items(vecs, ids, num_threads=1)
        self._hnsw, self._live = index, set(ids.tolist())
        self._ex_ids = np.empty(0, dtype=np.int64)
        self._ex_vecs = np.empty((0, self._dim), dtype=np.float32)
        self._n, self._pos = 0, {}

    def _hnsw_to_exact(self) -> None:
        assert self._hnsw is not None
        ids = np.fromiter(self._live, dtype=np.int64, count=len(self._live))
        ids.sort()
        vecs = self._hnsw_vectors(ids)
        self._hnsw, self._live = None, set()
        self._ex_ids, self._ex_vecs, self._n, self._pos = (
            ids,
            vecs,
            len(ids),
            dict(zip(ids.tolist(), range(len(ids)), strict=True)),
        )

    def _hnsw_vectors(self, ids: np.ndarray) -> np.ndarray:
        index = self._hnsw
        assert index is not None
        if len(ids) == 0:
            return np.empty((0, self._dim), dtype=np.float32)
        return np.asarray(index.get_items(ids), dtype=np.float32).reshape(len(ids), self._dim)

    def _hnsw_add(self, ids: np.ndarray, vecs: np.ndarray) -> None:
        index = self._hnsw
        assert index is not None
        live = self._live
        is_live = np.fromiter((key in live for key in ids.tolist()), dtype=bool, count=len(ids))
        # An id hnswlib still holds as deleted must be revived in its own slot: adding it
        # with replace_deleted=True could put it in another deleted slot and leave two
        # slots carrying the same label (hnswlib 0.8 does not guard against that).
        revived = np.zeros(len(ids), dtype=bool)
        for i in np.flatnonzero(~is_live).tolist():
            try:
                index.unmark_deleted(int(ids[i]))
            except RuntimeError:  # hnswlib has never seen this label
                continue
            revived[i] = True
            live.add(int(ids[i]))
        update = is_live | revived
        fresh = ~update
        n_fresh = int(fresh.sum())
        free_slots = index.element_count - len(live)
        need = index.element_count + max(0, n_fresh - free_slots)
        if need > index.max_elements:
            index.resize_index(max(need, int(index.max_elements * GROWTH_FACTOR)))
        if update.any():
            # Existing label: hnswlib overwrites the vector and repairs its links.
            index.add_items(vecs[update], ids[update], num_threads=1, replace_deleted=False)
        if n_fresh:
            index.add_items(vecs[fresh], ids[fresh], num_threads=1, replace_deleted=True)
            live.update(ids[fresh].tolist())

    def _hnsw_query(
        self, q: np.ndarray, k: int, allowed: Callable[[int], bool] | None
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        index = self._hnsw
        assert index is not None
        n = len(self._live)
        if allowed is not None:
            return [self._hnsw_filtered(row, k, allowed) for row in q]
        kk = min(k, n)
        try:
            # hnswlib searches with ef = max(ef_search, k) by itself.
            labels, dists = index.knn_query(q, k=kk, num_threads=1)
        except RuntimeError:
            # Fewer than k reachable live nodes (possible after many deletes): scan instead.
            return [self._hnsw_scan(row, k, None) for row in q]
        return [
            _order(lab.astype(np.int64), (1.0 - dist).astype(np.float32))
            for lab, dist in zip(labels, dists, strict=True)
        ]

    def _hnsw_filtered(
        self, row: np.ndarray, k: int, allowed: Callable[[int], bool]
    ) -> tuple[np.ndarray, np.ndarray]:
        index = self._hnsw
        assert index is not None
        n = len(self._live)
        verdict: dict[int, bool] = {}
        fetch = k * FILTER_OVERFETCH
        while fetch * 2 <= n:
            try:
                labels, dists = index.knn_query(row[None, :], k=fetch, num_threads=1)
            except RuntimeError:
                break
            hits = []
            for label, dist in zip(labels[0].tolist(), dists[0].tolist(), strict=True):
                ok = verdict.get(label)
                if ok is None:
                    ok = verdict[label] = bool(allowed(label))
                if ok:
                    hits.append((label, 1.0 - dist))
            if len(hits) >= k:
                ids = np.array([h[0] for h in hits], dtype=np.int64)
                scores = np.array([h[1] for h in hits], dtype=np.float32)
                ids, scores = _order(ids, scores)
                return ids[:k], scores[:k]
            fetch *= 2
        # Past half the index a graph search costs more than reading every vector, and
        # only the full scan can prove there are fewer than k allowed hits.
        return self._hnsw_scan(row, k, allowed, verdict)

    def _hnsw_scan(
        self,
        row: np.ndarray,
        k: int,
        allowed: Callable[[int], bool] | None,
        verdict: dict[int, bool] | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        ids = np.fromiter(self._live, dtype=np.int64, count=len(self._live))
        if allowed is not None:
            known = verdict or {}
            keep = [known[key] if key in known else bool(allowed(key)) for key in ids.tolist()]
            ids = ids[np.asarray(keep, dtype=bool)]
        best_ids = np.empty(0, dtype=np.int64)
        best_scores = np.empty(0, dtype=np.float32)
        for start in range(0, len(ids), _ROWS_PER_SCAN_CHUNK):
            chunk = ids[start : start + _ROWS_PER_SCAN_CHUNK]
            scores = self._hnsw_vectors(chunk) @ row
            best_ids, best_scores = _topk_from_scores(
                np.concatenate([best_ids, chunk]), np.concatenate([best_scores, scores]), k, None
            )
        return best_ids, best_scores

    def _memory_bytes(self) -> int:
        if self._hnsw is None:
            # Arrays at capacity + the id -> row dict (~100 B per entry in CPython).
            return int(self._ex_ids.nbytes + self._ex_vecs.nbytes + 100 * len(self._pos))
        return estimate_hnsw_memory(
            self._dim, self._M, int(self._hnsw.max_elements), int(self._hnsw.element_count), len(self._live)
        )

    def _header_fields(self, mode: str, count: int, capacity: int, slots: int, payload_len: int) -> bytes:
        return _FIELDS.pack(
            MAGIC,
            FORMAT_VERSION,
            _MODE_CODES[mode],
            self._dim,
            self._M,
            self._ef_construction,
            self._ef_search,
            count,
            capacity,
            slots,
            payload_len,
        )

    # ------------------------------------------------------------------ internals: load

    @classmethod
    def _load(cls, path: Path, dim: int, exact_threshold: int, ef_search: int | None) -> VectorIndex:
        try:
            f = open(path, "rb")  # closed by the `with` below; FileNotFoundError escapes as is
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise _Corrupt(f"cannot be read ({exc})") from None
        with f:
            size = os.fstat(f.fileno()).st_size
            raw = f.read(_HEADER_SIZE)
            hdr = _parse_header(raw, size, dim)
            hasher = hashlib.sha256(raw[: _FIELDS.size])
            index = cls(
                dim,
                path=path,
                exact_threshold=exact_threshold,
                M=hdr["M"],
                ef_construction=hdr["ef_construction"],
                ef_search=ef_search if ef_search is not None else hdr["ef_search"],
            )
            if hdr["mode"] == MODE_EXACT:
                payload = _read_exactly(f, hdr["payload_len"])
                hasher.update(payload)
                _check_digest(hasher, hdr["digest"])
                ids, vecs = _parse_exact_payload(payload, hdr["count"], dim)
                del payload
                index._exact_add(ids, vecs)
            else:
                index._load_hnsw_payload(f, path, hdr, hasher)
        with index._lock.write():
            index._maybe_switch_mode()
        return index

    def _load_hnsw_payload(self, f: Any, path: Path, hdr: dict[str, Any], hasher: Any) -> None:
        # hnswlib only loads from a path: copy the payload next to the index file,
        # hashing as we go, and let hnswlib read it only once everything checks out.
        try:
            fd, tmp = tempfile.mkstemp(prefix=temp_prefix(path, "load"), suffix=".load.tmp", dir=path.parent)
        except OSError:
            fd, tmp = tempfile.mkstemp(prefix=temp_prefix(path, "load"), suffix=".load.tmp")
        try:
            with os.fdopen(fd, "wb") as out:
                remaining = hdr["payload_len"]
                while remaining:
                    chunk = f.read(min(_CHUNK_BYTES, remaining))
                    if not chunk:
                        raise _Corrupt("payload ends early (file truncated while reading)")
                    hasher.update(chunk)
                    out.write(chunk)
                    remaining -= len(chunk)
            _check_digest(hasher, hdr["digest"])
            problem = None
            with open(tmp, "rb") as src, mmap.mmap(src.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                try:
                    live = _check_hnsw_payload(buf, self._dim, hdr["M"], hdr["ef_construction"], hdr["slots"])
                except (_Corrupt, ValueError) as exc:
                    # Keep only the message: the traceback's frames hold numpy views of
                    # the mmap, which could not be closed while they are alive.
                    problem = str(exc) or type(exc).__name__
            if problem is not None:
                raise _Corrupt(problem)
            if len(live) != hdr["count"]:
                raise _Corrupt(f"header says {hdr['count']} live vectors, the graph holds {len(live)}")
            capacity = max(hdr["slots"], min(hdr["capacity"], max(2 * hdr["slots"], MIN_CAPACITY)), 1)
            index = hnswlib.Index(space="ip", dim=self._dim)
            try:
                index.load_index(tmp, max_elements=capacity, allow_replace_deleted=True)
            except (RuntimeError, MemoryError) as exc:
                raise _Corrupt(f"hnswlib could not load the graph ({exc})") from None
            index.set_ef(self._ef_search)
            self._hnsw, self._live = index, set(live.tolist())
        finally:
            _unlink_quietly(tmp)


# ---------------------------------------------------------------------- helpers


def _check_range(name: str, value: int, low: int, high: int) -> None:
    if not isinstance(value, int | np.integer) or isinstance(value, bool) or not low <= value <= high:
        raise ValueError(f"{name} must be an integer in [{low}, {high}], got {value!r}")


def _as_ids(ids: Iterable[int] | np.ndarray) -> np.ndarray:
    if isinstance(ids, np.ndarray):
        arr = np.atleast_1d(ids)
    elif np.isscalar(ids):
        arr = np.asarray([ids])
    else:
        arr = np.asarray(list(ids))
    if arr.size == 0:
        return np.empty(0, dtype=np.int64)
    if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"ids must be a 1-D array of integers, got shape {arr.shape} dtype {arr.dtype}")
    if arr.dtype == np.uint64 and (arr > _MAX_ID).any():
        raise ValueError("ids must fit in int64")
    arr = arr.astype(np.int64, copy=False)
    if (arr < 0).any():
        raise ValueError("ids must be >= 0 (catalog row ids)")
    return arr


def _as_vectors(vectors: np.ndarray, dim: int) -> np.ndarray:
    arr = np.asarray(vectors, dtype=np.float32)
    if arr.size == 0:
        return np.empty((0, dim), dtype=np.float32)
    if arr.ndim != 2 or arr.shape[1] != dim:
        raise ValueError(f"vectors must have shape (n, {dim}), got {arr.shape}")
    if not np.isfinite(arr).all():
        raise ValueError("vectors contain NaN or infinity")
    return np.ascontiguousarray(arr)


def estimate_hnsw_memory(dim: int, M: int, capacity: int, slots: int, live: int) -> int:
    """Rough resident bytes of an hnsw-mode index, from hnswlib 0.8's allocations.

    Per allocated slot: level-0 links + vector + label, its level (int), its upper-link
    pointer, its std::mutex (40 B) and its visited-list entry (2 B). Per used slot: the
    label -> slot hash map entry (~48 B) and the expected upper-level links (a node
    reaches level >= 1 with probability 1/M). Per live id: our Python set (~60 B).
    """
    per_slot = _level0_bytes(dim, M) + 4 + 8 + 40 + 2
    upper = slots / max(M - 1, 1) * (4 + 4 * M + 16)
    fixed = 65_536 * 40  # hnswlib's label-operation mutexes
    return int(capacity * per_slot + upper + 48 * slots + 60 * live + fixed)


def _level0_bytes(dim: int, M: int) -> int:
    """hnswlib's size_data_per_element: level-0 links + vector + label."""
    return 4 + 4 * 2 * M + 4 * dim + 8


def _order(ids: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.lexsort((ids, -scores))
    return ids[order], scores[order]


def _topk_from_scores(
    ids: np.ndarray, scores: np.ndarray, k: int, allowed: Callable[[int], bool] | None
) -> tuple[np.ndarray, np.ndarray]:
    """Top k by (-score, id), optionally keeping only allowed ids (exact, not approximate)."""
    n = len(scores)
    fetch = k if allowed is None else k * FILTER_OVERFETCH
    checked = 0
    hits: list[int] = []
    while True:
        fetch = min(fetch, n)
        if fetch >= n:
            prefix = np.lexsort((ids, -scores))
        else:
            part = np.argpartition(-scores, fetch - 1)[:fetch]
            # Everything scoring at least the fetch-th score, ties included, is a prefix
            # of the full (-score, id) order, so successive prefixes extend each other.
            cand = np.flatnonzero(scores >= scores[part].min())
            prefix = cand[np.lexsort((ids[cand], -scores[cand]))]
        if allowed is None:
            sel = prefix[:k]
            return ids[sel], scores[sel].astype(np.float32, copy=False)
        for row in prefix[checked:].tolist():
            if allowed(int(ids[row])):
                hits.append(row)
                if len(hits) == k:
                    break
        checked = len(prefix)
        if len(hits) >= k or len(prefix) >= n:
            sel = np.asarray(hits[:k], dtype=np.int64)
            return ids[sel], scores[sel].astype(np.float32, copy=False)
        fetch *= 2


def _array_chunks(arrays: list[np.ndarray]) -> Iterator[memoryview]:
    for arr in arrays:
        if arr.size == 0:
            continue
        view = memoryview(np.ascontiguousarray(arr)).cast("B")
        for start in range(0, len(view), _CHUNK_BYTES):
            yield view[start : start + _CHUNK_BYTES]


def _write_chunks(out: Any, chunks: Iterable[bytes | memoryview], hasher: Any) -> int:
    """Write and hash the payload; returns the byte count. Split out so tests can fail it midway."""
    written = 0
    for chunk in chunks:
        hasher.update(chunk)
        out.write(chunk)
        written += len(chunk)
    return written


def _atomic_write(target: Path, fields: bytes, chunks: Iterable[bytes | memoryview]) -> None:
    payload_len = _FIELDS.unpack(fields)[-1]
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(target, "save"), suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(b"\0" * _HEADER_SIZE)
            hasher = hashlib.sha256(fields)
            written = _write_chunks(out, chunks, hasher)
            if written != payload_len:
                raise OSError(f"wrote {written} payload bytes, expected {payload_len}")
            out.seek(0)
            out.write(fields + hasher.digest() + b"\0" * (_HEADER_SIZE - _FIELDS.size - _DIGEST_SIZE))
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, target)
    except BaseException:
        _unlink_quietly(tmp)
        raise
    _fsync_dir(target.parent)


def _fsync_dir(directory: Path) -> None:
    # Makes the rename itself durable; directories cannot be opened for fsync on Windows.
    if os.name == "nt":
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _unlink_quietly(path: str | Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _read_exactly(f: Any, n: int) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise _Corrupt(f"payload ends early: {len(data)} of {n} bytes")
    return data


def _check_digest(hasher: Any, expected: bytes) -> None:
    if hasher.digest() != expected:
        raise _Corrupt("checksum mismatch (the file is damaged)")


def _parse_header(raw: bytes, file_size: int, dim: int) -> dict[str, Any]:
    if len(raw) < _HEADER_SIZE:
        raise _Corrupt(f"truncated: {file_size} bytes, shorter than the {_HEADER_SIZE}-byte header")
    (magic, version, mode_code, f_dim, M, efc, efs, count, capacity, slots, payload_len) = (
        _FIELDS.unpack_from(raw)
    )
    if magic != MAGIC:
        raise _Corrupt(f"not a Longlens vector index (magic {magic!r})")
    if version > FORMAT_VERSION:
        raise _Corrupt(f"format version {version} is newer than this Longlens supports ({FORMAT_VERSION})")
    if version != FORMAT_VERSION:
        raise _Corrupt(f"unknown format version {version}")
    if mode_code not in _MODE_NAMES:
        raise _Corrupt(f"unknown mode {mode_code}")
    if f_dim != dim:
        raise _Corrupt(f"vector dimension {f_dim} does not match the model's {dim}")
    if not 1 <= dim <= _MAX_DIM:
        raise _Corrupt(f"dimension {dim} out of range")
    if not 2 <= M <= _MAX_M or not 1 <= efc <= _MAX_EF or not 1 <= efs <= _MAX_EF:
        raise _Corrupt(f"hnsw parameters out of range (M={M}, ef_construction={efc}, ef_search={efs})")
    if not count <= slots <= capacity <= _MAX_SLOTS:
        raise _Corrupt(f"inconsistent counts (count={count}, slots={slots}, capacity={capacity})")
    if any(raw[_FIELDS.size + _DIGEST_SIZE : _HEADER_SIZE]):
        raise _Corrupt("reserved header bytes are not zero")
    if payload_len != file_size - _HEADER_SIZE:
        raise _Corrupt(
            f"header says the payload is {payload_len} bytes but the file holds {file_size - _HEADER_SIZE} "
            "(truncated or padded)"
        )
    mode = _MODE_NAMES[mode_code]
    if mode == MODE_EXACT:
        if slots != count or payload_len != count * (8 + 4 * dim):
            raise _Corrupt(f"exact payload of {payload_len} bytes does not hold {count} vectors of dim {dim}")
    else:
        minimum = _HNSW_HEADER.size + slots * (_level0_bytes(dim, M) + 4)
        if payload_len < minimum:
            raise _Corrupt(f"hnsw payload of {payload_len} bytes is too small for {slots} elements")
    return {
        "mode": mode,
        "M": M,
        "ef_construction": efc,
        "ef_search": efs,
        "count": count,
        "capacity": capacity,
        "slots": slots,
        "payload_len": payload_len,
        "digest": raw[_FIELDS.size : _FIELDS.size + _DIGEST_SIZE],
    }


def _parse_exact_payload(payload: bytes, count: int, dim: int) -> tuple[np.ndarray, np.ndarray]:
    ids = np.frombuffer(payload, dtype="<i8", count=count).astype(np.int64)
    vecs = np.frombuffer(payload, dtype="<f4", count=count * dim, offset=8 * count).astype(np.float32)
    vecs = vecs.reshape(count, dim)
    if (ids < 0).any() or len(np.unique(ids)) != count:
        raise _Corrupt("ids are negative or repeated")
    if not np.isfinite(vecs).all():
        raise _Corrupt("vectors contain NaN or infinity")
    return ids, vecs


def _check_hnsw_payload(buf: Any, dim: int, M: int, ef_construction: int, slots: int) -> np.ndarray:
    """Validate hnswlib's save_index bytes so that loading and searching stay in bounds.

    Returns the live (not deleted) labels. Checks every field hnswlib uses as an offset
    or size, every link target, and that upper-level links point at nodes that exist
    on that level, since hnswlib follows all of these without bounds checks.
    """
    size = len(buf)
    if size < _HNSW_HEADER.size:
        raise _Corrupt("hnsw payload shorter than its header")
    (off0, max_el, cur, sdpe, label_off, data_off, maxlevel, entry, maxM, maxM0, m_, mult, efc) = (
        _HNSW_HEADER.unpack_from(buf, 0)
    )
    links0 = 4 + 4 * 2 * M
    expected = {
        "level-0 offset": (off0, 0),
        "element count": (cur, slots),
        "M": (m_, M),
        "maxM": (maxM, M),
        "maxM0": (maxM0, 2 * M),
        "bytes per element": (sdpe, _level0_bytes(dim, M)),
        "data offset": (data_off, links0),
        "label offset": (label_off, links0 + 4 * dim),
        "ef_construction": (efc, max(ef_construction, M)),
    }
    for name, (got, want) in expected.items():
        if got != want:
            raise _Corrupt(f"hnsw {name} is {got}, expected {want}")
    if not cur <= max_el <= _MAX_SLOTS:
        raise _Corrupt(f"hnsw capacity {max_el} out of range")
    if not (math.isfinite(mult) and 0 < mult < 10):
        raise _Corrupt(f"hnsw level multiplier {mult} out of range")
    if cur == 0:
        if size != _HNSW_HEADER.size:
            raise _Corrupt("empty hnsw graph followed by data")
        return np.empty(0, dtype=np.int64)
    if not 0 <= maxlevel <= _MAX_LEVEL or entry >= cur:
        raise _Corrupt(f"hnsw entry point {entry} / top level {maxlevel} out of range")
    level0_end = _HNSW_HEADER.size + cur * sdpe
    if level0_end > size:
        raise _Corrupt("hnsw level-0 block truncated")

    labels = np.empty(cur, dtype=np.uint64)
    deleted = np.empty(cur, dtype=bool)
    col = np.arange(2 * M)[None, :]
    rows_per_chunk = max(1, (16 << 20) // sdpe)
    for start in range(0, cur, rows_per_chunk):
        rows = min(rows_per_chunk, cur - start)
        block = np.frombuffer(
            buf, dtype=np.uint8, count=rows * sdpe, offset=_HNSW_HEADER.size + start * sdpe
        ).reshape(rows, sdpe)
        counts = block[:, 0].astype(np.uint32) | (block[:, 1].astype(np.uint32) << 8)
        flags = block[:, 2]
        if (counts > 2 * M).any():
            raise _Corrupt("hnsw level-0 neighbour count exceeds 2*M")
        if (flags > 1).any() or block[:, 3].any():
            raise _Corrupt("hnsw level-0 flags damaged")
        links = np.ascontiguousarray(block[:, 4:links0]).view("<u4")
        if (links[col < counts[:, None]] >= cur).any():
            raise _Corrupt("hnsw level-0 link points past the last element")
        data = np.ascontiguousarray(block[:, data_off:label_off]).view("<f4")
        if not np.isfinite(data).all():
            raise _Corrupt("hnsw vectors contain NaN or infinity")
        labels[start : start + rows] = np.ascontiguousarray(block[:, label_off : label_off + 8]).view("<u8")[
            :, 0
        ]
        deleted[start : start + rows] = flags == 1
        del block, links, data

    if (labels > _MAX_ID).any() or len(np.unique(labels)) != cur:
        raise _Corrupt("hnsw labels are out of range or repeated")

    per_level = 4 + 4 * M
    levels = np.zeros(cur, dtype=np.int64)
    upper: list[tuple[int, int]] = []
    pos = level0_end
    unpack_u32 = struct.Struct("<I").unpack_from
    for i in range(cur):
        if pos + 4 > size:
            raise _Corrupt("hnsw upper-level links truncated")
        (nbytes,) = unpack_u32(buf, pos)
        pos += 4
        if nbytes:
            if nbytes % per_level or nbytes // per_level > maxlevel or pos + nbytes > size:
                raise _Corrupt(f"hnsw element {i} has a damaged upper-level link list")
            levels[i] = nbytes // per_level
            upper.append((i, pos))
            pos += nbytes
    if pos != size:
        raise _Corrupt(f"hnsw payload has {size - pos} unexpected trailing bytes")
    if levels[entry] != maxlevel:
        raise _Corrupt("hnsw entry point is not on the top level")
    for i, offset in upper:
        lists = np.frombuffer(buf, dtype="<u4", count=int(levels[i]) * (1 + M), offset=offset).reshape(
            -1, 1 + M
        )
        counts = lists[:, 0] & 0xFFFF
        if (counts > M).any():
            raise _Corrupt(f"hnsw element {i} has more than M upper-level neighbours")
        for level in range(1, int(levels[i]) + 1):
            targets = lists[level - 1, 1 : 1 + int(counts[level - 1])]
            if (targets >= cur).any() or (levels[targets] < level).any():
                raise _Corrupt(f"hnsw element {i} links to a node missing from level {level}")
    return labels[~deleted].astype(np.int64)
