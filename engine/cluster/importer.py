"""`longlens import-shards SHARDS --library ROOT`: merge a cluster job's shards into the catalog.

Every part file is validated first (schema, model id, vector sizes); a bad one is reported and
skipped, the others are imported. Rows go through Indexer.merge, i.e. the same upsert, move
detection (by content hash) and mark-and-sweep rules as local indexing, and the library's HNSW
index is extended in the same transactions. Rows that describe the same file twice (a retried
block, or a re-run after the file changed) are reduced to one: the one matching the latest
finished scan, else the newest. Importing the same shards again changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from engine.catalog import Catalog
from engine.cluster import ClusterError, require_pyarrow
from engine.cluster import shards as shardio
from engine.errors import ModelError
from engine.index.store import IndexStore
from engine.jobs import CancelToken, Progress
from engine.types import STATUS_OK, ImageMeta


@dataclass
class VectorsOnly:
    """Stands in for the model during a merge: vectors come with the shards, nothing is inferred."""

    model_id: str  # here the identity the shards were made with (they carry no display name)
    dim: int
    image_size: int = 0
    text_model_id: str = ""
    device: str = "none"

    @property
    def identity(self) -> str:
        return self.model_id

    @property
    def text_identity(self) -> str:
        return self.model_id

    def _no_model(self, *args: object, **kwargs: object) -> np.ndarray:
        raise ModelError(f"importing shards never runs the model {self.model_id!r}")

    preprocess = encode_pixels = encode_images = encode_texts = _no_model


@dataclass
class ImportSummary:
    shards_dir: str
    library: str
    source_root: str = ""
    model_id: str = ""  # the model's name
    model_identity: str = ""  # what computed the shards' vectors (the key they are stored under)
    shards_read: int = 0
    bad_shards: list[dict[str, str]] = field(default_factory=list)
    rows: int = 0
    duplicate_rows: int = 0  # the same file more than once across shards: one kept
    stale_rows: int = 0  # files the latest finished scan saw with another size/mtime, or not at all
    complete: bool = False  # a finished run's listing is fully covered: deletions were applied
    notes: list[str] = field(default_factory=list)
    merge: dict = field(default_factory=dict)  # the IndexSummary of the merge

    def as_dict(self) -> dict:
        return asdict(self)


def import_shards(
    catalog: Catalog,
    store: IndexStore,
    shards_dir: Path | str,
    library_root: Path | str,
    *,
    model_id: str | None = None,
    source_root: str | None = None,
    batch_size: int = 512,
    cancel: CancelToken | None = None,
    installed_identity: Callable[[str], str | None] | None = None,
) -> Iterator[Progress]:
    """Validate and merge; the last Progress has stage "done" and the ImportSummary in extra["summary"].

    `model_id`: the exact model identity the shards must carry. `installed_identity`: model name ->
    the identity installed here (None if not installed); shards made by another identity of an
    installed model (it was replaced since) are refused, as their vectors would be stale."""
    from engine.indexing.pipeline import ExternalResult, Indexer
    from engine.indexing.scanner import FileEntry

    require_pyarrow()
    shards_dir = Path(shards_dir).expanduser().resolve()
    if not shards_dir.is_dir():
        raise ClusterError(f"{shards_dir} is not a folder")
    library_root = Path(library_root).expanduser().resolve()
    summary = ImportSummary(shards_dir=str(shards_dir), library=str(library_root))

    files = shardio.part_files(shards_dir)
    if not files:
        raise ClusterError(f"{shards_dir} holds no part-*.parquet shards")
    good: list[shardio.Shard] = []
    for i, path in enumerate(files):
        try:
            shard = shardio.read_shard(path)
        except ClusterError as exc:
            summary.bad_shards.append({"file": path.name, "reason": str(exc)})
            continue
        if model_id is not None and shard.model_id != model_id:
            summary.bad_shards.append({"file": path.name,
                                       "reason": f"{path.name}: model id {shard.model_id!r}, expected {model_id!r}"})
            continue
        good.append(shard)
        yield Progress("read", i + 1, len(files), f"{i + 1}/{len(files)} shards")
    if not good:
        raise ClusterError(f"no usable shard in {shards_dir}: " + "; ".join(b["reason"] for b in summary.bad_shards))

    roots = sorted({s.source_root for s in good})
    if source_root is None:
        if len(roots) > 1:
            raise ClusterError(f"{shards_dir} holds shards of several folders ({', '.join(roots)}); "
                               "pick the source folder to import", settings=("source_root",))
        source_root = roots[0]
    good = [s for s in good if s.source_root == source_root]
    if not good:
        raise ClusterError(f"no shard of {source_root!r} in {shards_dir} (folders there: {', '.join(roots)})")
    models = sorted({s.model_id for s in good})
    if len(models) > 1:
        raise ClusterError(f"the shards of {source_root} hold vectors of several models ({', '.join(models)}); "
                           "pick the model to import", settings=("model_id",))
    model = models[0]
    if installed_identity is not None:
        from engine.models.registry import identity_name

        name = identity_name(model)
        current = installed_identity(name)
        if current is not None and current != model:
            raise ClusterError(
                f"the shards in {shards_dir} were made by another version of model {name!r} (identity "
                f"{model!r}); the installed {name} is {current!r}, so their vectors would not match it. "
                f"Run the cluster job again with the installed {name}; nothing was imported"
            )
    dims = {s.dim for s in good if s.dim}  # a shard of unreadable files only has no vector size
    if len(dims) > 1:
        raise ClusterError(f"the {model} shards disagree on the vector size ({sorted(dims)})")
    if not dims:
        raise ClusterError(f"the shards of {source_root} hold no vector (no readable image): nothing to import")
    dim = dims.pop()
    known_dim = _catalog_dim(catalog, model)
    if known_dim is not None and known_dim != dim:
        raise ClusterError(f"the catalog's {model} vectors have {known_dim} values, the shards {dim}: "
                           "not the same model")
    from engine.models.registry import identity_name

    summary.source_root, summary.model_id, summary.model_identity = source_root, identity_name(model), model

    # The latest finished run of this folder and model defines which files exist (its listing).
    runs, bad_runs = shardio.read_runs(shards_dir)
    summary.notes += [f"{b['file']}: {b['reason']}" for b in bad_runs]
    finished = [r for r in runs if r.complete and r.source_root == source_root and r.model_id == model]
    listing = shardio.read_listing(shards_dir, finished[-1].run_id) if finished else None

    # One row per file: prefer the row matching the listing, else the newest (by mtime, then run).
    chosen: dict[str, tuple[tuple[int, str], dict, np.ndarray | None]] = {}
    scalar_columns = [c for c in shardio.SHARD_COLUMNS if c != "vector"]
    for shard in good:
        summary.shards_read += 1
        vectors = shardio.shard_vectors(shard)
        n_ok = 0
        for row in shard.table.select(scalar_columns).to_pylist():
            summary.rows += 1
            vector = None
            if row["status"] == STATUS_OK:
                vector = vectors[n_ok]
                n_ok += 1
            rel = row["rel_path"]
            if listing is not None and listing.get(rel) != (row["size"], row["mtime_ns"]):
                summary.stale_rows += 1
                continue
            key = (row["mtime_ns"], shard.run_id)
            prev = chosen.get(rel)
            if prev is not None:
                summary.duplicate_rows += 1
                if prev[0] >= key:
                    continue
            chosen[rel] = (key, row, vector)

    complete = listing is not None and len(chosen) == len(listing)
    if listing is None:
        summary.notes.append("no finished cluster run in the shards folder: nothing is marked deleted")
    elif not complete:
        summary.notes.append(f"{len(listing) - len(chosen)} files of the latest finished scan have no row "
                             "(a skipped shard?): nothing is marked deleted")
    summary.complete = complete

    results = []
    for rel, (_, row, vector) in sorted(chosen.items()):
        entry = FileEntry(rel, library_root / rel, int(row["size"]), int(row["mtime_ns"]))
        if row["status"] == STATUS_OK:
            meta = ImageMeta(width=row["width"], height=row["height"], exif_date=row["exif_date"],
                             camera_make=row["camera_make"], camera_model=row["camera_model"],
                             orientation=row["orientation"])
            results.append(ExternalResult(entry, row["content_hash"], meta, vector))
        else:
            results.append(ExternalResult(entry, row["content_hash"], None, None, error=row["reason"] or "unreadable"))

    indexer = Indexer(catalog, store, VectorsOnly(model, dim), batch_size=batch_size)  # type: ignore[arg-type]
    last = None
    for last in indexer.merge(library_root, results, complete=complete, cancel=cancel):
        if last.stage != "done":
            yield last
    assert last is not None
    summary.merge = last.extra["summary"].as_dict()
    yield Progress("done", last.done, last.total, last.message, extra={"summary": summary})


def _catalog_dim(catalog: Catalog, model_id: str) -> int | None:
    from sqlalchemy import select

    from engine.catalog.schema import embeddings

    with catalog.read() as conn:
        dims = conn.execute(select(embeddings.c.dims).where(embeddings.c.model_id == model_id).limit(1)).scalar()
    return None if dims is None else int(dims)
