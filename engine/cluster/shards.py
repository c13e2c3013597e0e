"""The shards folder a cluster job writes and `import-shards` reads.

    part-<run>-<seq>.parquet   embedded files: one row per file (SHARD_COLUMNS), vectors included
    scan-<run>.parquet         the complete file listing of one run's scan (rel_path, size, mtime_ns)
    run-<run>.json             that run's manifest: source root, model id, whether it finished

Every file is written to a temporary name and renamed into place (engine.fileutil), so a killed
job leaves only whole files; a re-run skips files already present in a part file with the same
size and mtime (resume). A run's listing lets the import soft-delete files that disappeared,
and only after a run that finished (the same mark-and-sweep rule as local indexing).
"""

from __future__ import annotations

import io
import json
import re
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from engine.cluster import ClusterError, require_pyarrow
from engine.fileutil import atomic_write_bytes, atomic_write_text, open_user_file
from engine.jsonfile import read_json_file
from engine.limits import MAX_SMALL_JSON_BYTES
from engine.types import STATUS_OK, STATUS_UNREADABLE

SHARD_FORMAT = "longlens-shard/1"
SCAN_FORMAT = "longlens-scan/1"
RUN_FORMAT = "longlens-run/1"

# name -> pyarrow type name; nullable unless listed in REQUIRED_COLUMNS.
SHARD_COLUMNS: dict[str, str] = {
    "rel_path": "string",
    "size": "int64",
    "mtime_ns": "int64",
    "content_hash": "string",
    "width": "int32",
    "height": "int32",
    "exif_date": "string",
    "camera_make": "string",
    "camera_model": "string",
    "orientation": "int32",
    "status": "string",
    "reason": "string",
    "model_id": "string",
    "vector": "list<float>",
}
REQUIRED_COLUMNS = ("rel_path", "size", "mtime_ns", "status", "model_id")
SHARD_STATUSES = (STATUS_OK, STATUS_UNREADABLE)

_RUN_ID_RE = re.compile(r"^[0-9]{8}T[0-9]{6}-[0-9a-f]{6}$")


def new_run_id() -> str:
    """Sortable by start time; unique across concurrent jobs."""
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + "-" + uuid.uuid4().hex[:6]


def shard_schema(source_root: str, model_id: str, dim: int, run_id: str) -> Any:
    pa = require_pyarrow()
    fields = [pa.field(name, _arrow_type(pa, t), nullable=name not in REQUIRED_COLUMNS)
              for name, t in SHARD_COLUMNS.items()]
    return pa.schema(fields, metadata={
        "longlens.format": SHARD_FORMAT,
        "longlens.source_root": source_root,
        "longlens.model_id": model_id,
        "longlens.dim": str(dim),
        "longlens.run_id": run_id,
    })


def _arrow_type(pa: Any, name: str) -> Any:
    return {"string": pa.string(), "int64": pa.int64(), "int32": pa.int32(),
            "list<float>": pa.list_(pa.float32())}[name]


def _write_parquet_atomic(path: Path, table: Any) -> None:
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd")
    atomic_write_bytes(path, buf.getvalue())


class ShardWriter:
    """Buffers result rows and writes them as whole part files of about `rows_per_shard` rows."""

    def __init__(self, out: Path, source_root: str, model_id: str, run_id: str, rows_per_shard: int = 4096):
        self.out = Path(out)
        self.source_root = source_root
        self.model_id = model_id
        self.run_id = run_id
        self.rows_per_shard = max(1, rows_per_shard)
        self.dim: int | None = None
        self.files_written: list[Path] = []
        self.rows_written = 0
        self._buffer: list[Any] = []  # pyarrow tables in shard schema
        self._buffered = 0
        self._seq = 0

    def add(self, table: Any) -> None:
        """Add a table in shard schema (as returned by the workers)."""
        if table.num_rows == 0:
            return
        if self.dim is None:
            for v in table.column("vector").to_pylist():
                if v is not None:
                    self.dim = len(v)
                    break
        self._buffer.append(table)
        self._buffered += table.num_rows
        if self._buffered >= self.rows_per_shard:
            self.flush()

    def flush(self) -> None:
        if not self._buffered:
            return
        pa = require_pyarrow()
        schema = shard_schema(self.source_root, self.model_id, self.dim or 0, self.run_id)
        table = pa.concat_tables([t.cast(schema) for t in self._buffer]).replace_schema_metadata(schema.metadata)
        path = self.out / f"part-{self.run_id}-{self._seq:05d}.parquet"
        _write_parquet_atomic(path, table)
        self._seq += 1
        self.files_written.append(path)
        self.rows_written += table.num_rows
        self._buffer.clear()
        self._buffered = 0


def result_table(rows: Sequence[dict[str, Any]], model_id: str) -> Any:
    """Rows (dicts keyed by SHARD_COLUMNS, vectors as float32 arrays or None) -> a table in shard schema."""
    pa = require_pyarrow()
    cols: dict[str, Any] = {}
    for name, t in SHARD_COLUMNS.items():
        if name == "model_id":
            values = [model_id] * len(rows)
        elif name == "vector":
            values = [None if r.get("vector") is None else np.asarray(r["vector"], dtype=np.float32).tolist()
                      for r in rows]
        else:
            values = [r.get(name) for r in rows]
        cols[name] = pa.array(values, type=_arrow_type(pa, t))
    return pa.table(cols)


# -- listings and run manifests ----------------------------------------------------------
@dataclass
class RunManifest:
    run_id: str
    source_root: str
    model_id: str
    files: int  # in the scan listing
    pending: int  # not yet in the shards when the run started
    started_at: float
    finished_at: float | None = None
    complete: bool = False  # every listed file has a row in some part file
    dim: int | None = None
    skipped: list[dict[str, str]] = field(default_factory=list)  # scanner's skipped entries
    format: str = RUN_FORMAT

    def save(self, out: Path) -> None:
        atomic_write_text(Path(out) / f"run-{self.run_id}.json", json.dumps(asdict(self), indent=1))


def write_listing(out: Path, run_id: str, source_root: str, model_id: str,
                  entries: Iterable[tuple[str, int, int]]) -> Path:
    """The run's complete scan as (rel_path, size, mtime_ns); the import's 'seen' set for the sweep."""
    pa = require_pyarrow()
    rel, size, mtime = [], [], []
    for r, s, m in entries:
        rel.append(r)
        size.append(s)
        mtime.append(m)
    table = pa.table({"rel_path": pa.array(rel, pa.string()), "size": pa.array(size, pa.int64()),
                      "mtime_ns": pa.array(mtime, pa.int64())})
    table = table.replace_schema_metadata({"longlens.format": SCAN_FORMAT, "longlens.source_root": source_root,
                                           "longlens.model_id": model_id, "longlens.run_id": run_id})
    path = Path(out) / f"scan-{run_id}.parquet"
    _write_parquet_atomic(path, table)
    return path


def read_listing(out: Path, run_id: str) -> dict[str, tuple[int, int]]:
    import pyarrow.parquet as pq

    require_pyarrow()
    path = Path(out) / f"scan-{run_id}.parquet"
    try:
        with open_user_file(path) as f:
            t = pq.read_table(f)
    except Exception as exc:
        raise ClusterError(f"{path}: unreadable scan listing ({exc})") from exc
    return {r: (int(s), int(m)) for r, s, m in zip(t.column("rel_path").to_pylist(), t.column("size").to_pylist(),
                                                   t.column("mtime_ns").to_pylist(), strict=True)}


def read_runs(out: Path) -> tuple[list[RunManifest], list[dict[str, str]]]:
    """Run manifests of the folder, oldest first, and the ones that could not be read."""
    runs: list[RunManifest] = []
    bad: list[dict[str, str]] = []
    for p in sorted(Path(out).glob("run-*.json")):
        try:
            d = read_json_file(p, max_bytes=MAX_SMALL_JSON_BYTES)
            if d.get("format") != RUN_FORMAT:
                raise ValueError(f"format {d.get('format')!r}, expected {RUN_FORMAT!r}")
            runs.append(RunManifest(**d))
        except (OSError, ValueError, TypeError) as exc:
            bad.append({"file": p.name, "reason": f"unreadable run manifest: {exc}"})
    runs.sort(key=lambda r: r.run_id)
    return runs, bad


# -- reading and validating part files ---------------------------------------------------
@dataclass
class Shard:
    path: Path
    source_root: str
    model_id: str
    dim: int
    run_id: str
    table: Any  # pyarrow.Table, validated


def part_files(out: Path) -> list[Path]:
    return sorted(Path(out).glob("part-*.parquet"))


def read_shard(path: Path) -> Shard:
    """Read and validate one part file; ClusterError names the file and what is wrong."""
    import pyarrow.parquet as pq

    pa = require_pyarrow()
    try:
        with open_user_file(path) as f:
            table = pq.read_table(f)
    except Exception as exc:
        raise ClusterError(f"{path.name}: not a readable Parquet file ({type(exc).__name__}: {exc})") from exc
    meta = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}
    if meta.get("longlens.format") != SHARD_FORMAT:
        raise ClusterError(f"{path.name}: format {meta.get('longlens.format')!r}, expected {SHARD_FORMAT!r}")
    for key in ("longlens.source_root", "longlens.model_id", "longlens.dim", "longlens.run_id"):
        if not meta.get(key):
            raise ClusterError(f"{path.name}: metadata field {key!r} is missing")
    try:
        dim = int(meta["longlens.dim"])
    except ValueError:
        raise ClusterError(f"{path.name}: metadata field 'longlens.dim' is not a number") from None
    for name, t in SHARD_COLUMNS.items():
        if name not in table.column_names:
            raise ClusterError(f"{path.name}: column {name!r} is missing")
        want = _arrow_type(pa, t)
        got = table.schema.field(name).type
        if not got.equals(want):
            raise ClusterError(f"{path.name}: column {name!r} has type {got}, expected {want}")
    for name in REQUIRED_COLUMNS:
        if table.column(name).null_count:
            raise ClusterError(f"{path.name}: column {name!r} has empty values")
    model_id = meta["longlens.model_id"]
    models = set(table.column("model_id").to_pylist())
    if models - {model_id}:
        raise ClusterError(f"{path.name}: column 'model_id' holds {sorted(models)}, metadata says {model_id!r}")
    statuses = table.column("status").to_pylist()
    hashes = table.column("content_hash").to_pylist()
    vectors = table.column("vector")
    rel = table.column("rel_path").to_pylist()
    lengths = pa.compute.list_value_length(vectors).to_pylist()
    for i, (st, h, n) in enumerate(zip(statuses, hashes, lengths, strict=True)):
        where = f"{path.name}: row {i} ({rel[i]!r})"
        if st not in SHARD_STATUSES:
            raise ClusterError(f"{where}: field 'status' is {st!r}, expected one of {list(SHARD_STATUSES)}")
        if st == STATUS_OK:
            if not h:
                raise ClusterError(f"{where}: field 'content_hash' is empty for an ok row")
            if n != dim:
                raise ClusterError(f"{where}: field 'vector' has {n} values, expected {dim}")
        elif n:
            raise ClusterError(f"{where}: field 'vector' must be empty for a row with status {st!r}")
        if _unsafe_rel_path(rel[i]):
            raise ClusterError(f"{where}: field 'rel_path' is not a relative path inside the library")
    return Shard(path, meta["longlens.source_root"], model_id, dim, meta["longlens.run_id"], table)


def shard_vectors(shard: Shard) -> np.ndarray:
    """The vectors of the shard's ok rows, in row order, as one (n_ok, dim) float32 array (no copy
    into Python floats: an import of millions of rows keeps ~dim*4 bytes per row)."""
    pa = require_pyarrow()
    flat = pa.compute.list_flatten(shard.table.column("vector")).to_numpy(zero_copy_only=False)
    return np.asarray(flat, dtype=np.float32).reshape(-1, shard.dim)


def _unsafe_rel_path(rel: str) -> bool:
    parts = rel.split("/")
    return not rel or rel.startswith("/") or "\\" in rel or any(p in ("", ".", "..") for p in parts) \
        or (len(rel) > 1 and rel[1] == ":")


def existing_files(out: Path, source_root: str, model_id: str) -> set[tuple[str, int, int]]:
    """(rel_path, size, mtime_ns) of every file already in a readable part file of this root and model."""
    import pyarrow.parquet as pq

    require_pyarrow()
    have: set[tuple[str, int, int]] = set()
    for p in part_files(out):
        try:
            with open_user_file(p) as f:
                md = pq.read_schema(f).metadata or {}
                if md.get(b"longlens.source_root", b"").decode() != source_root or \
                        md.get(b"longlens.model_id", b"").decode() != model_id:
                    continue
                f.seek(0)
                t = pq.read_table(f, columns=["rel_path", "size", "mtime_ns"])
        except Exception:
            continue  # a damaged file resumes nothing; its files are embedded again
        have.update(zip(t.column("rel_path").to_pylist(), t.column("size").to_pylist(),
                        t.column("mtime_ns").to_pylist(), strict=True))
    return have


def valid_run_id(run_id: str) -> bool:
    return bool(_RUN_ID_RE.match(run_id))
