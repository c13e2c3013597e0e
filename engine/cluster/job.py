"""`longlens index PATH --cluster ADDRESS --out SHARDS`: index on a Ray cluster into Parquet shards.

The driver (this process) scans each folder, skips files already in the shards folder (resume),
and hands Ray Data the list of the rest. Model actors (`EmbedBatches`, one per GPU, or one per
CPU slot without GPUs) hash, decode and embed blocks of files with the same engine code as local
indexing (content_hash, decode_image, Embedder.preprocess / encode_pixels). Results stream back
to the driver, which writes them as whole part files and reports progress; cancelling stops the
stream, keeps the part files written so far, and shuts Ray down (which stops the job's workers).

Fault tolerance comes from Ray: a killed actor is restarted (`max_restarts`) and its in-flight
blocks are retried (`max_task_retries`); each file reaches the shards once, and the import drops
any duplicate row for a file anyway.
"""

from __future__ import annotations

import logging
import os
import time
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from engine.cluster import ClusterError, require_pyarrow, require_ray
from engine.cluster import shards as shardio
from engine.config import Paths
from engine.jobs import CancelToken, Progress, RateMeter

# A killed actor is restarted this many times, and a block in flight on it retried as often.
MAX_RESTARTS = 4
MAX_TASK_RETRIES = 4
LOCAL = "local"


@dataclass
class ClusterIndexSummary:
    root: str
    model_id: str
    out: str
    run_id: str
    address: str
    scanned: int = 0
    already_in_shards: int = 0  # skipped: a previous run embedded them (resume)
    processed: int = 0  # rows written by this run
    embedded: int = 0
    unreadable: list[dict[str, str]] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)
    raw_jpeg_pairs: str = "jpeg"  # as engine.indexing.pipeline.IndexSummary
    pair_files_left_out: int = 0
    shards_written: int = 0
    complete: bool = False
    cancelled: bool = False
    actors: int = 0
    elapsed_s: float = 0.0
    embed_s: float = 0.0  # from the first block submitted to the last row received
    first_result_s: float = 0.0  # from submitting to the first block back (actor start-up, model load)

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class ClusterOptions:
    address: str = LOCAL  # "local", "local:N" (N CPUs) or a Ray address ("ray://head:10001", "auto")
    block_rows: int = 32  # files per Ray block: the unit of work, retry and progress
    rows_per_shard: int = 4096
    actors: int | None = None  # default: one per GPU, else one per CPU
    cpus_per_actor: float | None = None  # default: 1 on CPU-only clusters, the node's CPUs per GPU otherwise
    decode_threads: int | None = None  # inside each actor; default: max(2, its CPUs)
    device: str = "auto"
    raw_jpeg_pairs: str = "jpeg"  # which file of a RAW+JPEG pair is embedded (engine.options.RAW_JPEG_PAIRS)


def parse_address(address: str) -> tuple[str | None, int | None]:
    """('local', N) -> start a local runtime with N CPUs; otherwise (address, None)."""
    if address == LOCAL or address.startswith(LOCAL + ":"):
        n = address[len(LOCAL) + 1:]
        if not n:
            return None, min(os.cpu_count() or 2, 4)
        if not n.isdigit() or int(n) < 1:
            raise ClusterError(f"cluster address {address!r}: expected 'local' or 'local:N' with N CPUs >= 1",
                                   settings=("cluster",))
        return None, int(n)
    return address, None


class EmbedBatches:
    """Ray Data callable class: one instance per actor holds the model for its whole life."""

    def __init__(self, model: str, paths: Paths, source_root: str, device: str, decode_threads: int) -> None:
        from engine.models.registry import load_embedder

        self.embedder = load_embedder(model, paths, device=device)
        self.root = Path(source_root)
        self.pool = ThreadPoolExecutor(max_workers=max(1, decode_threads), thread_name_prefix="longlens-decode")

    def __call__(self, batch: Any) -> Any:
        names = batch.column("rel_path").to_pylist()
        sizes = batch.column("size").to_pylist()
        mtimes = batch.column("mtime_ns").to_pylist()
        prepared = list(self.pool.map(self._prepare, names))
        rows: list[dict[str, Any]] = []
        to_embed: list[int] = []
        for i, (rel, size, mtime, (h, _pixels, meta, error)) in enumerate(zip(names, sizes, mtimes, prepared,
                                                                             strict=True)):
            row: dict[str, Any] = {"rel_path": rel, "size": size, "mtime_ns": mtime, "content_hash": h}
            if error is not None:
                row.update(status="unreadable", reason=error)
            else:
                row.update(status="ok", width=meta.width, height=meta.height, exif_date=meta.exif_date,
                           camera_make=meta.camera_make, camera_model=meta.camera_model,
                           orientation=meta.orientation)
                to_embed.append(i)
            rows.append(row)
        if to_embed:
            # encode_pixels runs the model in the embedder's own batch size (its device's best).
            vectors = self.embedder.encode_pixels(np.stack([prepared[i][1] for i in to_embed]))
            for i, v in zip(to_embed, vectors, strict=True):
                rows[i]["vector"] = v
        # Shards carry the model identity (what computed the vectors), so an import can refuse
        # vectors of a model that was replaced since under the same name.
        return shardio.result_table(rows, self.embedder.identity)

    def _prepare(self, rel: str) -> tuple[str | None, np.ndarray | None, Any, str | None]:
        """(content hash, preprocessed pixels, meta, error reason) — the local pipeline's steps."""
        from engine.errors import DecodeError
        from engine.indexing.decode import decode_image, open_error
        from engine.indexing.pipeline import content_hash

        path = self.root / rel
        try:
            h = content_hash(path)
        except OSError as exc:
            return None, None, None, open_error(exc, path).reason
        try:
            image, meta = decode_image(path, target_size=self.embedder.image_size)
            return h, self.embedder.preprocess([image])[0], meta, None
        except DecodeError as exc:
            return h, None, None, exc.reason


def _cpus_per_gpu(ray: Any) -> int:
    """CPUs per GPU on the GPU nodes (the fewest of any), so that every GPU actor can be placed."""
    ratios = [n["Resources"].get("CPU", 0) / n["Resources"]["GPU"]
              for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("GPU")]
    return max(1, int(min(ratios))) if ratios else 1


def _quiet_ray_data() -> None:
    import ray.data

    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    for name in ("ray", "ray.data"):
        logging.getLogger(name).setLevel(logging.WARNING)


def run_cluster_index(
    root: Path | str,
    out: Path | str,
    model: str,
    paths: Paths,
    options: ClusterOptions | None = None,
    cancel: CancelToken | None = None,
) -> Iterator[Progress]:
    """Index one folder on Ray into `out`. The last Progress has stage "done" and the
    ClusterIndexSummary in extra["summary"]."""
    from engine.indexing.pipeline import scan_entries

    options = options or ClusterOptions()
    cancel = cancel or CancelToken()
    address, local_cpus = parse_address(options.address)
    ray = require_ray()
    pa = require_pyarrow()
    t0 = time.monotonic()
    root = Path(root).expanduser().resolve()
    if not root.is_dir():
        raise ClusterError(f"{root} is not a folder (missing or unmounted); nothing was started")
    out = Path(out).expanduser().resolve()
    out.mkdir(parents=True, exist_ok=True)
    run_id = shardio.new_run_id()
    summary = ClusterIndexSummary(root=str(root), model_id=model, out=str(out), run_id=run_id,
                                  address=options.address)

    entries = yield from scan_entries(root, summary, cancel, report_every=1000,
                                      raw_jpeg_pairs=options.raw_jpeg_pairs)
    if cancel.cancelled:
        summary.cancelled = True
        summary.elapsed_s = time.monotonic() - t0
        yield Progress("done", message="cancelled during scan", extra={"summary": summary})
        return

    from engine.models.registry import installed_identity

    # Shards, listings and the run manifest are keyed by the model identity, not its name.
    identity = installed_identity(model, paths).image
    have = shardio.existing_files(out, str(root), identity)
    pending = [e for e in entries if (e.rel_path, e.size, e.mtime_ns) not in have]
    summary.already_in_shards = len(entries) - len(pending)
    shardio.write_listing(out, run_id, str(root), identity, ((e.rel_path, e.size, e.mtime_ns) for e in entries))
    manifest = shardio.RunManifest(run_id=run_id, source_root=str(root), model_id=identity, files=len(entries),
                                   pending=len(pending), started_at=time.time(), skipped=summary.skipped)
    manifest.save(out)

    writer = shardio.ShardWriter(out, str(root), identity, run_id, options.rows_per_shard)
    started_ray = False
    received: set[str] = set()  # a retried block must not count twice
    meter = RateMeter(len(pending))
    try:
        if pending:
            if not ray.is_initialized():
                init: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False,
                                        "logging_level": logging.WARNING}
                if local_cpus is not None:
                    # A bounded local runtime; the object store is small because blocks are small.
                    init.update(num_cpus=local_cpus, num_gpus=0, object_store_memory=512 * 1024**2)
                else:
                    init["address"] = address
                ray.init(**init)
                started_ray = True
            _quiet_ray_data()
            resources = ray.cluster_resources()
            gpus = int(resources.get("GPU", 0))
            cpus = float(resources.get("CPU", 1))
            if gpus:
                # Decoding feeds the GPU: give each GPU actor its share of the cluster's CPUs.
                cpus_per_actor = options.cpus_per_actor or _cpus_per_gpu(ray)
                actors = options.actors or gpus
                per_actor: dict[str, Any] = {"num_gpus": 1, "num_cpus": cpus_per_actor}
                device = "cuda" if options.device == "auto" else options.device
            else:
                cpus_per_actor = options.cpus_per_actor or 1
                actors = options.actors or max(1, int(cpus // cpus_per_actor))
                per_actor = {"num_cpus": cpus_per_actor}
                device = "cpu" if options.device == "auto" else options.device
            decode_threads = options.decode_threads or max(2, int(cpus_per_actor))
            summary.actors = actors
            yield Progress("index", 0, len(pending), f"{actors} model actors on {options.address}")
            tables = [
                pa.table({
                    "rel_path": pa.array([e.rel_path for e in chunk], pa.string()),
                    "size": pa.array([e.size for e in chunk], pa.int64()),
                    "mtime_ns": pa.array([e.mtime_ns for e in chunk], pa.int64()),
                })
                for chunk in (pending[i:i + options.block_rows] for i in range(0, len(pending), options.block_rows))
            ]
            with warnings.catch_warnings():
                # Ray Data's own default is to restart actors and retry their blocks forever, so a file
                # that crashes the decoder would stall the job; bounded values need these remote args,
                # which Ray 2.60 marks deprecated without a replacement yet (ray is pinned).
                warnings.filterwarnings("ignore", message=".*ray_remote_args.*deprecated")
                ds = ray.data.from_arrow(tables).map_batches(
                    EmbedBatches,
                    fn_constructor_kwargs={"model": model, "paths": paths, "source_root": str(root),
                                           "device": device, "decode_threads": decode_threads},
                    batch_size=options.block_rows,
                    batch_format="pyarrow",
                    zero_copy_batch=True,
                    compute=ray.data.ActorPoolStrategy(size=actors),
                    max_restarts=MAX_RESTARTS,
                    max_task_retries=MAX_TASK_RETRIES,
                    **per_actor,
                )
            t_embed = time.monotonic()
            for batch in ds.iter_batches(batch_size=None, batch_format="pyarrow"):
                if not received:
                    summary.first_result_s = time.monotonic() - t_embed
                writer.add(batch)
                received.update(batch.column("rel_path").to_pylist())
                done = len(received)
                statuses = batch.column("status").to_pylist()
                summary.embedded += sum(1 for s in statuses if s == "ok")
                for rel, st, why in zip(batch.column("rel_path").to_pylist(), statuses,
                                        batch.column("reason").to_pylist(), strict=True):
                    if st != "ok":
                        summary.unreadable.append({"path": rel, "reason": why})
                summary.embed_s = time.monotonic() - t_embed
                yield meter.progress("index", done, f"{done}/{len(pending)} files")
                if cancel.cancelled:
                    summary.cancelled = True
                    break
    finally:
        # Rows already received are whole results: keep them, whatever stopped the stream.
        writer.flush()
        if started_ray:
            ray.shutdown()
    summary.processed = writer.rows_written
    summary.shards_written = len(writer.files_written)
    summary.complete = not summary.cancelled and len(received) == len(pending)
    if not summary.complete and not summary.cancelled:
        raise ClusterError(f"the cluster returned {len(received)} of {len(pending)} files; "
                           "run the command again to resume")
    manifest.complete = summary.complete
    manifest.finished_at = time.time()
    manifest.dim = writer.dim
    manifest.save(out)
    summary.elapsed_s = time.monotonic() - t0
    msg = "cancelled; the shards written so far are kept" if summary.cancelled else "cluster indexing complete"
    yield Progress("done", len(received), len(pending), msg, extra={"summary": summary})
