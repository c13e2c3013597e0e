"""One ANN index per (library, model), derived from the catalog and kept in agreement with it."""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path
from typing import Any

import numpy as np

from engine.catalog import Catalog
from engine.config import ensure_folder
from engine.errors import LonglensError
from engine.index.vector_index import VectorIndex
from engine.swap_journal import remove_stale_temps

# A save or load writes ".<index file name>.<save|load>-<pid>-<random>[.hnsw|.load].tmp" next to the
# index (engine.swap_journal's naming); a process killed meanwhile leaves it behind. One whose owner
# is gone is removed at once; no save takes this long, so an older one is an orphan whatever its pid
# says (the pid may have been re-used), as are the pid-less names of older releases.
STALE_TEMP_AGE_S = 3600.0
INDEX_SUFFIX = ".llidx"


def index_path(indexes_dir: Path, library_id: int, model_id: str) -> Path:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", model_id)
    return Path(indexes_dir) / f"library-{library_id}--{slug}{INDEX_SUFFIX}"


def remove_stale_temp_files(path: Path, max_age_s: float = STALE_TEMP_AGE_S) -> list[Path]:
    """Delete temp files of `path` left by a crashed save (they can be as large as the index)."""
    return remove_stale_temps(Path(path).parent, Path(path).name, max_age_s=max_age_s, also_unowned=True)


def remove_stale_index_temps(indexes_dir: Path, max_age_s: float = STALE_TEMP_AGE_S) -> list[Path]:
    """remove_stale_temp_files for every index in the folder (what opening the store runs)."""
    try:
        names = os.listdir(indexes_dir)
    except OSError:
        return []
    marker = f"{INDEX_SUFFIX}."
    targets = {n[1:n.index(marker) + len(INDEX_SUFFIX)] for n in names if n.startswith(".") and marker in n}
    removed: list[Path] = []
    for target in sorted(targets):
        removed += remove_stale_temp_files(Path(indexes_dir) / target, max_age_s)
    return removed


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc)


class IndexStore:
    """Opens indexes lazily; on open, rebuilds from the catalog if the file is bad and
    reconciles with the catalog's ids (a crash can leave the file behind the catalog)."""

    def __init__(self, indexes_dir: Path, catalog: Catalog, **index_params: Any) -> None:
        self.dir = Path(indexes_dir)
        self.catalog = catalog
        self.index_params = index_params  # e.g. exact_threshold, for tests and benchmarks
        self._open: dict[tuple[int, str], VectorIndex] = {}
        self._lock = threading.Lock()
        self.notes: list[str] = []
        # Saves killed last time (any index, not only those opened in this run) leave temp files.
        remove_stale_index_temps(self.dir)

    def get(self, library_id: int, model_id: str, dim: int) -> VectorIndex:
        key = (library_id, model_id)
        with self._lock:
            idx = self._open.get(key)
            if idx is not None:
                return idx
            ensure_folder(self.dir)
            path = index_path(self.dir, library_id, model_id)
            remove_stale_temp_files(path)
            existed = path.exists()
            idx, note = VectorIndex.open_or_rebuild(
                path, dim, lambda: self.catalog.all_vectors(library_id, model_id), **self.index_params
            )
            if note and existed:  # a first build is not news; a rebuilt damaged file is
                self.notes.append(note)
            truth = self.catalog.embedded_ids(library_id, model_id)
            added, removed = idx.reconcile(
                np.fromiter(sorted(truth), dtype=np.int64, count=len(truth)),
                lambda ids: self.catalog.vectors_for(ids.tolist(), model_id),
            )
            if added or removed:
                self.notes.append(
                    f"index for library {library_id} was behind the catalog: "
                    f"{added} added, {removed} removed"
                )
                try:
                    idx.save(path)
                except OSError as exc:
                    # The reconciled index works from memory; the file is derived data and the
                    # next save (or open) tries again. Searching must not fail for it.
                    self.notes.append(f"could not save the updated index {path} ({_reason(exc)}); "
                                      "using it from memory")
            if self.catalog.damage:
                self.notes.append(self.catalog.damage)
            self._open[key] = idx
            return idx

    def save(self, library_id: int, model_id: str) -> None:
        idx = self._open.get((library_id, model_id))
        if idx is not None:
            path = index_path(self.dir, library_id, model_id)
            try:
                idx.save(path)
            except OSError as exc:
                raise LonglensError(
                    f"could not save the vector index {path} ({_reason(exc)}); the catalog holds every "
                    "vector and the index is rebuilt from it once the folder can be written"
                ) from exc

    def drop(self, library_id: int) -> None:
        """Forget a removed library's indexes (the files are derived data)."""
        with self._lock:
            for key in [k for k in self._open if k[0] == library_id]:
                del self._open[key]
        for p in self.dir.glob(f"library-{library_id}--*.llidx"):
            p.unlink(missing_ok=True)
