"""Incremental indexing: scan -> classify -> hash/decode (thread pool) -> embed (batches) -> commit.

The same generator runs under the CLI's progress bar and the GUI's worker thread.
Each batch is committed in one transaction together with its vectors, so a crash loses
at most one batch; what XMP says about its pictures (engine.metadata) is stored right after it, and
a picture whose sidecars changed since (added, edited, removed) has only its metadata read again,
never its pixels, so it is not re-embedded; rows that vanished from disk are soft-deleted only after a complete
scan, and never when the root itself is missing (an unmounted drive is not a deletion).
"""

from __future__ import annotations

import time
from collections.abc import Generator, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from engine.catalog import (
    LIBRARY_PARTIAL,
    Catalog,
    ImageWrite,
    LibraryOverlapError,
    folder_within,
    root_reachable,
)
from engine.errors import DecodeError, JobCancelled
from engine.fileutil import sha256_file
from engine.index.store import IndexStore
from engine.index.vector_index import VectorIndex
from engine.indexing.decode import RAW_EXTENSIONS, SUPPORTED_EXTENSIONS, decode_image, open_error
from engine.indexing.scanner import (
    ExcludedFolder,
    FileEntry,
    Skipped,
    pair_key,
    scan_folder,
    split_raw_pairs,
    with_pair_sidecars,
)
from engine.jobs import CancelToken, Progress, RateMeter
from engine.metadata import read_photo_metadata, sidecar_state
from engine.models.base import Embedder
from engine.types import (
    LIBRARY_ONLINE,
    STATUS_DELETED,
    STATUS_OK,
    STATUS_UNREADABLE,
    ImageMeta,
    ImageRecord,
    PhotoMetadata,
)

# A cancel must take effect within about a second (reliability checklist 23). The model runs in
# a helper thread while the job polls the cancel token this often, so a cancel returns at once
# however long the batch takes (its result is then discarded). Splitting batches into chunks short
# enough to wait for would cost throughput: on the CPU the full-size BLIP runs 2-3x faster per image
# at batch 8 than at batch 1 (docs/benchmarks.md).
CANCEL_POLL_S = 0.05


def content_hash(path: Path, *, follow_symlinks: bool = True, cancel: CancelToken | None = None) -> str:
    """The catalog's content hash of a file: its SHA-256 (moves and copies are found by it).
    Raises OSError (NotARegularFileError for a path that is no longer a regular file; see
    engine.indexing.decode.open_error for the reason to record) and JobCancelled."""
    return sha256_file(path, follow_symlinks=follow_symlinks, cancel=cancel)


@dataclass
class IndexSummary:
    root: str
    model_id: str  # the model's name, as the user knows it
    library_id: int | None = None
    offline: bool = False
    cancelled: bool = False
    scanned: int = 0
    new: int = 0
    changed: int = 0
    moved: int = 0
    unchanged: int = 0
    deleted: int = 0
    embedded: int = 0  # images that went through the model
    reused: int = 0  # identical content already embedded: vector copied, no inference
    model_identity: str = ""  # what computed the vectors (engine.models.registry.model_identity)
    # Images whose vectors were made by another identity of the same model name (it was replaced):
    # re-embedded in this run, counted in `changed` or `embedded` too; the old vectors are dropped
    # at the end of a complete run and were never served.
    reembedded: int = 0
    stale_vectors_dropped: int = 0
    unreadable: list[dict[str, str]] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)
    # RAW+JPEG pairs: how the pairs were taken (engine.options.RAW_JPEG_PAIRS) and the files of
    # the pairs left out of this library (a RAW whose JPEG is indexed, or the other way round).
    raw_jpeg_pairs: str = "jpeg"
    pair_files_left_out: int = 0
    # Files of pairs indexed in place of their pair's indexed file, which cannot be read (an unreadable
    # JPEG lets its RAW stand in, until the JPEG can be read again): {"path": it, "for": that file}
    pair_stand_ins: list[dict[str, str]] = field(default_factory=list)
    # Libraries that lay inside this one and were merged into it (one picture, one library): their
    # rows and vectors are this library's now, nothing re-embedded. {"root": ..., "pictures": moved in,
    # "already_held": pictures this library held as well (libraries that overlapped from before)}
    merged_libraries: list[dict[str, object]] = field(default_factory=list)
    xmp_read: int = 0  # pictures whose XMP (embedded and sidecars) was read in this run
    # ... of them, pictures whose metadata alone was read again, their pixels untouched: a sidecar was
    # added, edited or removed (or the catalog had no metadata for them yet)
    xmp_reread: int = 0
    # A sidecar or packet that could not be read, or a field of it: {"path": picture, "reason": names the file}
    xmp_problems: list[dict[str, str]] = field(default_factory=list)
    index_notes: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class _Candidate:
    entry: FileEntry
    previous: ImageRecord | None  # the row currently at this path, if any
    # False when the previous row has no vector of this model identity, so even unchanged content
    # must go through the model (or reuse an identical file's vector of this identity).
    has_vector: bool = True


@dataclass
class ExternalResult:
    """One file as hashed, decoded and embedded outside this process (e.g. by a cluster job)."""

    entry: FileEntry  # rel_path, size and mtime as seen where the file was read
    content_hash: str | None
    meta: ImageMeta | None
    vector: np.ndarray | None  # set for readable files
    error: str | None = None  # a DECODE_REASONS tag (or read error) for unreadable files


@dataclass
class _Prepared:
    candidate: _Candidate
    content_hash: str | None = None
    pixels: np.ndarray | None = None  # preprocessed, ready for the model
    meta: ImageMeta | None = None
    error: str | None = None
    needs_model: bool = False
    vector: np.ndarray | None = None
    photo: PhotoMetadata | None = None  # what the picture's XMP says (read for every readable file)


def scan_entries(root: Path, summary: Any, cancel: CancelToken, report_every: int = 500,
                 raw_jpeg_pairs: str = "jpeg",
                 excluded: Sequence[ExcludedFolder] = ()) -> Generator[Progress, None, list[FileEntry]]:
    """Scan `root` for supported images (`entries = yield from scan_entries(...)`): yields scan
    progress, records skipped paths and the count in `summary`, returns the entries to index
    (those so far when cancelled). Of a RAW+JPEG pair only the file `raw_jpeg_pairs` names is
    returned ("both": both; engine.options.RAW_JPEG_PAIRS); the count left out goes into the
    summary. `excluded` folders (Longlens's own, other libraries) are skipped with their reason.
    `summary`: any summary with `skipped` (list), `scanned`, `raw_jpeg_pairs` and
    `pair_files_left_out`."""
    entries, _left_out = yield from scan_pairs(root, summary, cancel, report_every, raw_jpeg_pairs, excluded)
    return entries


def scan_pairs(root: Path, summary: Any, cancel: CancelToken, report_every: int = 500,
               raw_jpeg_pairs: str = "jpeg", excluded: Sequence[ExcludedFolder] = (),
               ) -> Generator[Progress, None, tuple[list[FileEntry], list[FileEntry]]]:
    """scan_entries, returning the files of pairs left out too: (entries, left out)."""
    from engine.options import RAW_JPEG_PAIRS

    summary.raw_jpeg_pairs = RAW_JPEG_PAIRS.check(raw_jpeg_pairs)
    entries: list[FileEntry] = []
    for item in scan_folder(root, SUPPORTED_EXTENSIONS, cancel=None, excluded=excluded):
        if cancel.cancelled:
            break
        if isinstance(item, Skipped):
            summary.skipped.append({"path": item.rel_path, "reason": item.reason})
        else:
            entries.append(item)
            if len(entries) % report_every == 0:
                yield Progress("scan", len(entries), None, f"found {len(entries)} images")
    entries, left_out = split_raw_pairs(entries, raw_jpeg_pairs, RAW_EXTENSIONS)
    entries = with_pair_sidecars(entries, left_out)
    summary.pair_files_left_out = len(left_out)
    summary.scanned = len(entries)
    if not cancel.cancelled:
        yield Progress("scan", len(entries), len(entries), f"found {len(entries)} images")
    return entries, left_out


def own_folder_problem(root: Path | str, own_folders: Sequence[Path | str]) -> str | None:
    """Why `root` cannot be a library because it lies in one of Longlens's own folders, or None."""
    root = Path(root).expanduser().resolve()
    for own in own_folders:
        if folder_within(root, Path(own).expanduser().resolve()):
            return (f"{root} is inside {own}, Longlens's own data folder (its catalog, backups, thumbnails and "
                    "models): it is never indexed; choose the folder of your photos")
    return None


def library_root_problem(catalog: Catalog, root: Path | str, own_folders: Sequence[Path | str],
                         data_folder: Path | str | None = None) -> str | None:
    """Why indexing `root` would be refused (Longlens's own folder, or inside another library), or
    None: what Indexer.run checks first, for a front end to say before it starts the job."""
    return own_folder_problem(root, own_folders) or catalog.overlap_problem(
        root, apart=[Path(data_folder).expanduser().resolve()] if data_folder else [])


OWN_FOLDER_REASON = "Longlens's own data folder (catalog, backups, thumbnails, models): never indexed"


class Indexer:
    """Indexes library folders into the catalog and the ANN indexes for one embedder."""

    def __init__(
        self,
        catalog: Catalog,
        store: IndexStore,
        embedder: Embedder,
        *,
        batch_size: int = 32,
        decode_workers: int = 2,
        raw_jpeg_pairs: str = "jpeg",
        own_folders: Sequence[Path | str] = (),
        data_folder: Path | str | None = None,
    ) -> None:
        self.catalog = catalog
        self.store = store
        self.embedder = embedder
        from engine.options import BATCH_SIZE, RAW_JPEG_PAIRS, SETTINGS_NUMBERS

        # Defence in depth: a batch size of 0 would scan nothing and still mark the library scanned.
        self.batch_size = BATCH_SIZE.check(batch_size)
        self.decode_workers = SETTINGS_NUMBERS["decode_workers"][0].check(decode_workers)
        # Which file of a RAW+JPEG pair is indexed; the other is left out of the library (and a row
        # indexed before under another choice is swept like a deleted file).
        self.raw_jpeg_pairs = RAW_JPEG_PAIRS.check(raw_jpeg_pairs)
        # Longlens's own folders (engine.config.Paths: cache, config, models, the index files, the
        # sidecar backups): never a library, never scanned when a library contains them (its backups
        # and thumbnails are not photos). The data folder is never scanned as part of a library that
        # contains it either; a folder in it may be a library (the demo's sample collections).
        self.own_folders = tuple(Path(p).expanduser().resolve() for p in own_folders)
        self.data_folder = Path(data_folder).expanduser().resolve() if data_folder is not None else None
        self._model_thread: ThreadPoolExecutor | None = None  # created on first use

    # -- the job ------------------------------------------------------------
    def run(self, root: Path | str, cancel: CancelToken | None = None) -> Iterator[Progress]:
        """Index one folder. The last Progress has stage "done" and the summary in extra["summary"]."""
        try:
            yield from self._run(root, cancel or CancelToken())
        finally:
            # The model thread lives for one run: a cancelled batch still in the model finishes
            # in the background and the thread ends then, instead of idling until garbage collection.
            if self._model_thread is not None:
                self._model_thread.shutdown(wait=False, cancel_futures=True)
                self._model_thread = None

    def _run(self, root: Path | str, cancel: CancelToken) -> Iterator[Progress]:
        t0 = time.monotonic()
        root = Path(root).expanduser().resolve()
        model_id = self.embedder.identity
        summary = IndexSummary(root=str(root), model_id=self.embedder.model_id, model_identity=model_id)

        lib = self.catalog.library_by_root(root)
        if not root_reachable(root):
            # Missing or unmounted root: report offline, delete nothing.
            summary.offline = True
            if lib is not None:
                summary.library_id = lib.id
                self.catalog.mark_library_offline(lib.id)  # comes back as it was (library_state)
            summary.elapsed_s = time.monotonic() - t0
            yield Progress("done", message=f"{root} is offline or missing; nothing changed",
                           extra={"summary": summary})
            return
        lib = self._library_for(root, summary)
        summary.library_id = lib.id
        # "partly indexed" until this run completes (_sweep), whether it is cancelled or killed.
        self.catalog.set_library_status(lib.id, LIBRARY_PARTIAL)

        # 1. scan (Longlens's own folders and other libraries are not part of this one)
        excluded = [ExcludedFolder(p, OWN_FOLDER_REASON)
                    for p in (*self.own_folders, *([self.data_folder] if self.data_folder else []))]
        excluded += [ExcludedFolder(Path(other.root), f"the library {other.root}, indexed on its own")
                     for other in self.catalog.libraries() if other.id != lib.id]
        entries, left_out = yield from scan_pairs(root, summary, cancel, raw_jpeg_pairs=self.raw_jpeg_pairs,
                                                  excluded=excluded)
        if cancel.cancelled:
            summary.cancelled = True
            summary.elapsed_s = time.monotonic() - t0
            yield Progress("done", message="cancelled during scan", extra={"summary": summary})
            return

        # 2. classify against the catalog; a pair whose indexed file is known unreadable (unchanged
        # since) has its other file indexed in its place
        pairs = _Pairs(entries, left_out)
        records = self.catalog.image_records(lib.id)
        stand_ins = pairs.stand_ins({r.rel_path: r for r in records})
        candidates, vanished, movable = self._classify(lib.id, entries + stand_ins, summary, records=records)
        for r in pairs.partner_rows(vanished):
            # A pair's other file may come back (its indexed file unreadable): never a move target.
            movable.pop(r.content_hash or "", None)
        self.catalog.set_library_status(lib.id, LIBRARY_PARTIAL, pending=len(candidates))
        known_hashes = self.catalog.hashes_with_vectors(model_id)

        claimed: set[int] = set()  # ids of vanished rows taken over by a moved file
        index = self.store.get(lib.id, model_id, self.embedder.dim)
        summary.index_notes.extend(self.store.notes)
        self.store.notes.clear()

        # 3. hash, decode, embed, commit — batch by batch
        size = self.embedder.image_size
        total = len(candidates)
        done = 0
        with ThreadPoolExecutor(max_workers=self.decode_workers, thread_name_prefix="longlens-decode") as pool:
            def prepare(c: _Candidate) -> _Prepared:
                p = self._prepare(c, size, movable, known_hashes, cancel)
                if p.error is None:
                    p.photo = read_entry_metadata(c.entry)
                return p

            meter = RateMeter(total)
            done = yield from self._process(candidates, prepare, pool, lib.id, index, movable, claimed, summary,
                                            cancel, meter, done, total)

            # 3a. pairs whose indexed file turned out unreadable in this run: the other file stands in
            if pairs.kept and not summary.cancelled:
                rows = {r.rel_path: r for r in self.catalog.image_records(lib.id)}
                late = pairs.stand_ins(rows, already=stand_ins)
                if late:
                    stand_ins += late
                    late_paths = {e.rel_path for e in late}
                    vanished = [r for r in vanished if r.rel_path not in late_paths]
                    more = self._candidates(lib.id, late, rows, summary)
                    total += len(more)
                    meter.total = total
                    done = yield from self._process(more, prepare, pool, lib.id, index, movable, claimed, summary,
                                                    cancel, meter, done, total)
            summary.pair_stand_ins = [{"path": e.rel_path, "for": ", ".join(e.pair_of)} for e in stand_ins]
            summary.pair_files_left_out -= len(stand_ins)
            summary.scanned += len(stand_ins)

            # 3b. metadata only: pictures whose sidecars differ from what their metadata was read from
            if not summary.cancelled:
                yield from self._refresh_metadata(lib.id, entries + stand_ins, pool, cancel, summary)

        # 4. sweep: only after a complete scan and pass
        if not summary.cancelled:
            self._sweep(lib.id, index, vanished, claimed, summary)
            self._drop_stale_identities(lib.id, summary)
        else:
            self.catalog.set_library_status(lib.id, LIBRARY_PARTIAL, pending=total - done)
        self.store.save(lib.id, model_id)
        summary.elapsed_s = time.monotonic() - t0
        msg = "cancelled; committed batches are kept" if summary.cancelled else "indexing complete"
        yield Progress("done", done, total, msg, extra={"summary": summary})

    def _library_for(self, root: Path, summary: IndexSummary):
        """The library at `root`, registered when new (Catalog.add_library_merging: a folder inside a
        library is refused, libraries inside this one are merged into it); never Longlens's own folder."""
        problem = own_folder_problem(root, self.own_folders)
        if problem is not None:
            raise LibraryOverlapError(problem)
        added = self.catalog.add_library_merging(root, apart=[self.data_folder] if self.data_folder else [])
        if added.merged:
            # Derived data: the merged libraries' index files go, and this library's index is rebuilt
            # from the catalog, which now holds their vectors under this library.
            for m in added.merged:
                self.store.drop(m.id)
                summary.merged_libraries.append({"root": m.root, "pictures": m.moved, "already_held": m.dropped})
            self.store.drop(added.library.id)
        return added.library

    def _process(self, candidates: Sequence[_Candidate], prepare, pool: ThreadPoolExecutor, library_id: int,
                 index: VectorIndex, movable: dict[str, ImageRecord], claimed: set[int], summary: IndexSummary,
                 cancel: CancelToken, meter: RateMeter, done: int, total: int) -> Generator[Progress, None, int]:
        """Hash, decode, embed and commit `candidates` batch by batch; returns `done` plus those committed.
        Sets summary.cancelled when the cancel token stops it."""
        # Bounded look-ahead: decoding of the next batch overlaps embedding of this one,
        # and memory stays bounded however large the folder.
        pending: list[Future[_Prepared]] = []
        it = iter(candidates)
        lookahead = self.batch_size * 2

        def refill() -> None:
            while len(pending) < lookahead:
                c = next(it, None)
                if c is None:
                    return
                pending.append(pool.submit(prepare, c))

        refill()
        while pending:
            if cancel.cancelled:
                for f in pending:
                    f.cancel()
                summary.cancelled = True
                break
            batch = _results_unless_cancelled(pending[: self.batch_size], cancel)
            if batch is None:
                for f in pending:
                    f.cancel()
                summary.cancelled = True
                break
            del pending[: self.batch_size]
            refill()
            if not self._embed(batch, cancel):
                # Cancelled mid-batch: nothing of this batch is committed; a re-run redoes it.
                for f in pending:
                    f.cancel()
                summary.cancelled = True
                break
            self._commit_batch(batch, library_id, index, movable, claimed, summary)
            done += len(batch)
            yield meter.progress("index", done, f"{done}/{total} files")
        return done

    # -- merging results computed elsewhere ------------------------------------
    def merge(
        self,
        root: Path | str,
        results: Sequence[ExternalResult],
        *,
        complete: bool,
        cancel: CancelToken | None = None,
    ) -> Iterator[Progress]:
        """Merge files hashed, decoded and embedded elsewhere (a cluster job's shards) into `root`'s
        library with the same rules as run(): unchanged files are left alone, a changed content hash
        replaces the row's vector, a vanished row whose content reappears is moved (row and vector
        kept), and, only when `complete` says `results` lists every file of the root, rows absent
        from it are soft-deleted. The model is never called: every ok result carries its vector.
        The last Progress has stage "done" and the summary in extra["summary"]."""
        cancel = cancel or CancelToken()
        t0 = time.monotonic()
        root = Path(root).expanduser().resolve()
        model_id = self.embedder.identity
        summary = IndexSummary(root=str(root), model_id=self.embedder.model_id, model_identity=model_id)
        lib = self._library_for(root, summary)
        summary.library_id = lib.id
        by_path = {r.entry.rel_path: r for r in results}
        summary.scanned = len(by_path)
        candidates, vanished, movable = self._classify(lib.id, [r.entry for r in by_path.values()], summary)
        claimed: set[int] = set()
        index = self.store.get(lib.id, model_id, self.embedder.dim)
        summary.index_notes.extend(self.store.notes)
        self.store.notes.clear()
        meter = RateMeter(len(candidates))
        for start in range(0, len(candidates), self.batch_size):
            if cancel.cancelled:
                summary.cancelled = True
                break
            batch = []
            for c in candidates[start : start + self.batch_size]:
                r = by_path[c.entry.rel_path]
                p = _Prepared(c, content_hash=r.content_hash, meta=r.meta, error=r.error)
                prev = c.previous
                same = prev is not None and prev.status == STATUS_OK and prev.content_hash == r.content_hash
                if r.error is None and not same and r.content_hash not in movable:
                    p.needs_model, p.vector = True, r.vector  # "embedded" here: the vector came with it
                batch.append(p)
            self._commit_batch(batch, lib.id, index, movable, claimed, summary)
            done = min(start + self.batch_size, len(candidates))
            yield meter.progress("merge", done, f"{done}/{len(candidates)} files")
        if complete and not summary.cancelled:
            self._sweep(lib.id, index, vanished, claimed, summary)
            self._drop_stale_identities(lib.id, summary)
        self.store.save(lib.id, model_id)
        summary.elapsed_s = time.monotonic() - t0
        msg = "cancelled; committed batches are kept" if summary.cancelled else "merge complete"
        yield Progress("done", len(candidates), len(candidates), msg, extra={"summary": summary})

    # -- steps --------------------------------------------------------------
    def _classify(
        self, library_id: int, entries: Sequence[FileEntry], summary: IndexSummary,
        records: Sequence[ImageRecord] | None = None,
    ) -> tuple[list[_Candidate], list[ImageRecord], dict[str, ImageRecord]]:
        """(files needing work, rows whose file vanished, vanished embedded rows by content hash).
        `records`: the library's rows, when the caller has just read them."""
        records = self.catalog.image_records(library_id) if records is None else records
        by_path = {r.rel_path: r for r in records}
        embedded = self.catalog.embedded_ids(library_id, self.embedder.identity)
        candidates = self._candidates(library_id, entries, by_path, summary, embedded)
        seen = {e.rel_path for e in entries}
        vanished = [r for r in records if r.rel_path not in seen and r.status != STATUS_DELETED]
        # Rows whose file disappeared but whose content may reappear elsewhere (a move).
        movable = {r.content_hash: r for r in vanished if r.content_hash and r.id in embedded}
        return candidates, vanished, movable

    def _candidates(self, library_id: int, entries: Sequence[FileEntry], by_path: dict[str, ImageRecord],
                    summary: IndexSummary, embedded: set[int] | None = None) -> list[_Candidate]:
        """The entries that need work (new, changed, or without a vector of this model identity);
        the others are counted unchanged. `embedded`: the library's ids with such a vector, if just read."""
        if embedded is None:
            embedded = self.catalog.embedded_ids(library_id, self.embedder.identity)
        candidates: list[_Candidate] = []
        for e in entries:
            rec = by_path.get(e.rel_path)
            if rec is None or rec.status == STATUS_DELETED:
                candidates.append(_Candidate(e, rec))
            elif rec.size != e.size or rec.mtime_ns != e.mtime_ns:
                candidates.append(_Candidate(e, rec))
            elif rec.status == STATUS_OK and rec.id not in embedded:
                # Indexed before with another model, or another identity of this one: re-embedded.
                candidates.append(_Candidate(e, rec, has_vector=False))
            else:
                summary.unchanged += 1
        return candidates

    def _sweep(
        self, library_id: int, index: VectorIndex, vanished: list[ImageRecord], claimed: set[int],
        summary: IndexSummary,
    ) -> None:
        """Soft-delete vanished rows no moved file took over; only after a complete scan and pass."""
        gone = [r.id for r in vanished if r.id not in claimed]
        if gone:
            self.catalog.write_batch(self.embedder.identity, [], deleted_ids=gone)
            index.delete(np.asarray(gone, dtype=np.int64))
            summary.deleted = len(gone)
        self.catalog.set_library_status(library_id, LIBRARY_ONLINE, scanned=True)

    def _drop_stale_identities(self, library_id: int, summary: IndexSummary) -> None:
        """After a complete pass every live image has a vector of the current identity: drop this
        library's vectors of other identities of the same model name, and their index files."""
        from engine.index.store import index_path
        from engine.models.registry import identity_name

        current = self.embedder.identity
        name = identity_name(current)
        stale = [k for k in self.catalog.model_ids() if k != current and identity_name(k) == name]
        if stale:
            summary.stale_vectors_dropped = self.catalog.delete_vectors(library_id, stale)
            for key in stale:
                index_path(self.store.dir, library_id, key).unlink(missing_ok=True)
        if summary.reembedded or summary.stale_vectors_dropped:
            summary.index_notes.append(_stale_identity_note(summary))

    def _embed(self, batch: list[_Prepared], cancel: CancelToken) -> bool:
        """Run the model on the batch in the model thread, polling the cancel token meanwhile;
        False when cancelled (the batch is then dropped whole; a computation in flight finishes
        in the background and its result is discarded)."""
        to_embed = [p for p in batch if p.needs_model]
        if not to_embed:
            return True
        if cancel.cancelled:
            return False
        if self._model_thread is None:
            self._model_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="longlens-model")
        future = self._model_thread.submit(self.embedder.encode_pixels, np.stack([p.pixels for p in to_embed]))
        while True:
            try:
                vecs = future.result(timeout=CANCEL_POLL_S)
                break
            except FutureTimeout:
                if cancel.cancelled:
                    return False
        for p, v in zip(to_embed, vecs, strict=True):
            p.vector = v
        return True

    def _prepare(
        self, c: _Candidate, size: int, movable: dict[str, ImageRecord], known_hashes: set[str],
        cancel: CancelToken,
    ) -> _Prepared:
        """Runs in a worker thread: hash the file, decode and preprocess it if the model must see it.
        Raises JobCancelled when `cancel` is set while a (large) file is being hashed."""
        p = _Prepared(c)
        # A path the scan saw as a plain file is opened without following links (O_NOFOLLOW).
        follow = c.entry.followed_link
        try:
            p.content_hash = content_hash(c.entry.abs_path, follow_symlinks=follow, cancel=cancel)
        except OSError as exc:
            p.error = open_error(exc, c.entry.abs_path).reason
            return p
        prev = c.previous
        if prev is not None and prev.status == STATUS_OK and prev.content_hash == p.content_hash and c.has_vector:
            return p  # only the mtime changed
        if p.content_hash in movable or p.content_hash in known_hashes:
            return p  # a move or a copy: the vector exists already
        try:
            image, meta = decode_image(c.entry.abs_path, target_size=size, follow_symlinks=follow)
            p.pixels = self.embedder.preprocess([image])[0]
            p.meta = meta
            p.needs_model = True
        except DecodeError as exc:
            p.error = exc.reason
        return p

    def _refresh_metadata(self, library_id: int, entries: Sequence[FileEntry], pool: ThreadPoolExecutor,
                          cancel: CancelToken, summary: IndexSummary) -> Iterator[Progress]:
        """Read again the XMP of every live picture whose sidecars (names, sizes, mtimes) are not
        those its stored metadata was read from: a sidecar added, edited or removed, a RAW+JPEG pair
        taken otherwise (engine.metadata.sidecar_state holds the pair a picture stands for), a picture
        from before catalog schema 5. Only the metadata is read and written: no hash, no decode,
        no model. Runs after the batches, so the pictures just indexed already match."""
        stored = self.catalog.metadata_states(library_id)
        stale = [(stored[e.rel_path][0], e) for e in entries
                 if e.rel_path in stored and stored[e.rel_path][1] != sidecar_state(e.sidecars, e.pair_of)]
        for start in range(0, len(stale), self.batch_size):
            if cancel.cancelled:
                summary.cancelled = True
                return
            chunk = stale[start : start + self.batch_size]
            photos = list(pool.map(read_entry_metadata, [e for _, e in chunk]))
            self.catalog.write_metadata([(image_id, m) for (image_id, _), m in zip(chunk, photos, strict=True)])
            for (_, e), m in zip(chunk, photos, strict=True):
                _note_metadata(summary, e, m)
            summary.xmp_reread += len(chunk)
            done = start + len(chunk)
            yield Progress("metadata", done, len(stale), f"{done}/{len(stale)} sidecar changes read")

    def _commit_batch(
        self,
        batch: list[_Prepared],
        library_id: int,
        index: VectorIndex,
        movable: dict[str, ImageRecord],
        claimed: set[int],
        summary: IndexSummary,
    ) -> None:
        model_id = self.embedder.identity
        writes: list[ImageWrite] = []
        vectors: list[np.ndarray | None] = []
        photos: list[PhotoMetadata | None] = []  # of each write (None: an unreadable file)
        touched_photos: list[tuple[int, PhotoMetadata]] = []
        touches: list[tuple[int, int, int]] = []
        summary.embedded += sum(1 for p in batch if p.needs_model)
        removed_from_index: list[int] = []
        for p in batch:
            e, prev = p.candidate.entry, p.candidate.previous
            base = dict(library_id=library_id, rel_path=e.rel_path, size=e.size, mtime_ns=e.mtime_ns,
                        content_hash=p.content_hash)
            if p.error is None and p.photo is not None:
                _note_metadata(summary, e, p.photo)
            if p.error is not None:
                writes.append(ImageWrite(**base, status=STATUS_UNREADABLE, reason=p.error,
                                         image_id=prev.id if prev else None))
                vectors.append(None)
                photos.append(None)
                summary.unreadable.append({"path": e.rel_path, "reason": p.error})
                if prev is not None:
                    removed_from_index.append(prev.id)
                continue
            same_content = prev is not None and prev.status == STATUS_OK and prev.content_hash == p.content_hash
            if same_content and not p.needs_model and p.candidate.has_vector:
                touches.append((prev.id, e.size, e.mtime_ns))
                if p.photo is not None:
                    touched_photos.append((prev.id, p.photo))
                summary.unchanged += 1
                continue
            if same_content and not p.candidate.has_vector:
                summary.reembedded += 1
            if p.needs_model:
                writes.append(ImageWrite(**base, status=STATUS_OK, **_meta_fields(p.meta),
                                         image_id=prev.id if prev else None, vector=p.vector))
                vectors.append(p.vector)
                photos.append(p.photo)
                if prev is None or prev.status == STATUS_DELETED:
                    summary.new += 1
                else:
                    summary.changed += 1
                continue
            # No inference needed: a moved file takes its old row (vector kept), a copy reuses a vector.
            src = movable.get(p.content_hash)
            if src is not None and src.id not in claimed:
                claimed.add(src.id)
                if prev is not None and prev.id != src.id:
                    removed_from_index.append(prev.id)
                writes.append(ImageWrite(**base, status=STATUS_OK, **_meta_fields(src), image_id=src.id))
                vectors.append(None)
                photos.append(p.photo)
                summary.moved += 1
                continue
            copy = self.catalog.embedded_copy(p.content_hash, model_id)
            if copy is None:
                # The donor vanished mid-run (rare): decode now rather than lose the file.
                try:
                    image, meta = decode_image(e.abs_path, target_size=self.embedder.image_size,
                                               follow_symlinks=e.followed_link)
                    vec = self.embedder.encode_images([image])[0]
                    donor = _meta_fields(meta)
                    summary.embedded += 1
                except DecodeError as exc:
                    writes.append(ImageWrite(**base, status=STATUS_UNREADABLE, reason=exc.reason,
                                             image_id=prev.id if prev else None))
                    vectors.append(None)
                    photos.append(None)
                    summary.unreadable.append({"path": e.rel_path, "reason": exc.reason})
                    continue
            else:
                vec, twin = copy
                donor = _meta_fields(twin)
                summary.reused += 1
            writes.append(ImageWrite(**base, status=STATUS_OK, image_id=prev.id if prev else None,
                                     vector=vec, **donor))
            vectors.append(vec)
            photos.append(p.photo)
            if prev is None or prev.status == STATUS_DELETED:
                summary.new += 1
            else:
                summary.changed += 1
        if touches:
            self.catalog.touch_images(touches)
        metadata_rows = touched_photos
        if writes:
            ids = self.catalog.write_batch(model_id, writes)
            add_ids = [i for i, v in zip(ids, vectors, strict=True) if v is not None]
            if add_ids:
                index.add(np.asarray(add_ids, dtype=np.int64),
                          np.stack([v for v in vectors if v is not None]))
            metadata_rows += [(i, m) for i, m in zip(ids, photos, strict=True) if m is not None]
        if metadata_rows:
            # Its own transaction, after the batch's: a crash in between leaves pictures without
            # metadata, which the next scan finds (no stored state) and reads again.
            self.catalog.write_metadata(metadata_rows)
        if removed_from_index:
            index.delete(np.asarray(removed_from_index, dtype=np.int64))


class _Pairs:
    """The RAW+JPEG pairs of one scan, indexed once: the file indexed of each pair, and the files
    left out (split_raw_pairs). A pair follows the state of the file indexed for it: when every
    such file of a pair is unreadable (the catalog says so, and it has not changed since), the
    files left out stand in for it, with the pair's sidecars, so the shot stays findable; once
    the file can be read again, they are left out again (swept like a deleted file)."""

    def __init__(self, kept: Sequence[FileEntry], left_out: Sequence[FileEntry]) -> None:
        self.left_out: dict[str, list[FileEntry]] = {}
        for e in left_out:
            self.left_out.setdefault(pair_key(e.rel_path), []).append(e)
        self.kept: dict[str, list[FileEntry]] = {}
        for e in kept:
            if pair_key(e.rel_path) in self.left_out:
                self.kept.setdefault(pair_key(e.rel_path), []).append(e)

    def stand_ins(self, rows: dict[str, ImageRecord], already: Sequence[FileEntry] = ()) -> list[FileEntry]:
        """The left-out files that stand in now (`rows`: the library's rows by path), less `already`."""
        have = {e.rel_path for e in already}
        out: list[FileEntry] = []
        for key, kept in self.kept.items():
            if all(_known_unreadable(rows.get(k.rel_path), k) for k in kept):
                # The stand-in reads the pair's sidecars too, as the file it stands for did.
                out += [e for e in with_pair_sidecars(self.left_out[key], kept) if e.rel_path not in have]
        return out

    def partner_rows(self, rows: Sequence[ImageRecord]) -> list[ImageRecord]:
        """Those of `rows` that belong to a file left out of a pair."""
        paths = {e.rel_path for files in self.left_out.values() for e in files}
        return [r for r in rows if r.rel_path in paths]


def _known_unreadable(row: ImageRecord | None, entry: FileEntry) -> bool:
    return (row is not None and row.status == STATUS_UNREADABLE and row.size == entry.size
            and row.mtime_ns == entry.mtime_ns)


def read_entry_metadata(entry: FileEntry) -> PhotoMetadata:
    """The XMP of a scanned picture: its sidecars and embedded packet (engine.metadata)."""
    return read_photo_metadata(entry.abs_path, entry.sidecars, follow_symlinks=entry.followed_link,
                               pair_of=entry.pair_of)


def _note_metadata(summary: IndexSummary, entry: FileEntry, photo: PhotoMetadata) -> None:
    summary.xmp_read += 1
    summary.xmp_problems.extend({"path": entry.rel_path, "reason": r} for r in photo.problems)


def _results_unless_cancelled(futures: Sequence[Future[_Prepared]], cancel: CancelToken) -> list[_Prepared] | None:
    """The futures' results, or None once `cancel` is set: the wait polls the token, so a cancel
    (Ctrl+C, the GUI's Cancel) takes effect while a worker is still hashing or decoding."""
    while True:
        if cancel.cancelled:
            return None
        _done, not_done = wait(futures, timeout=CANCEL_POLL_S)
        if not not_done:
            break
    try:
        return [f.result() for f in futures]
    except JobCancelled:
        return None


def _stale_identity_note(summary: IndexSummary) -> str:
    return (f"{summary.reembedded} images re-embedded: their vectors were made by another version of model "
            f"{summary.model_id!r} (its files changed since); {summary.stale_vectors_dropped} old vectors dropped")


def _meta_fields(m: ImageMeta | ImageRecord) -> dict:
    return {
        "width": m.width,
        "height": m.height,
        "exif_date": m.exif_date,
        "camera_make": m.camera_make,
        "camera_model": m.camera_model,
        "orientation": m.orientation,
    }
