"""Repository functions over the catalog. Storage raises; it never prints or exits."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from sqlalchemy import Connection, and_, delete, func, insert, or_, select, update

from engine.catalog import paths as dbpaths
from engine.catalog.camera import CAMERA_DISPLAY
from engine.catalog.dates import picture_date_sql, xmp_date_sql
from engine.catalog.db import (
    SCHEMA_VERSION,
    CatalogConflictError,
    CatalogDamagedError,
    create_catalog_engine,
    damaged_message,
    inspect_catalog,
    migrate,
    recover_interrupted_rebuild,
    sqlite_errors,
)
from engine.catalog.geo import GREAT_CIRCLE_KM, bounding_box
from engine.catalog.schema import embeddings, image_keywords, image_metadata, images, libraries, meta
from engine.errors import CatalogError, LibraryError
from engine.jsonfile import loads_bounded
from engine.types import (
    LIBRARY_OFFLINE,
    LIBRARY_ONLINE,
    STATUS_DELETED,
    STATUS_OK,
    ImageFields,
    ImageRecord,
    Library,
    MetadataField,
    PhotoMetadata,
)

_IMAGE_FIELDS = (
    "size",
    "mtime_ns",
    "content_hash",
    "width",
    "height",
    "exif_date",
    "camera_make",
    "camera_model",
    "orientation",
    "status",
    "reason",
)


@dataclass(kw_only=True)
class ImageWrite(ImageFields):
    """One image row to insert or update in a batch, optionally with its embedding."""

    image_id: int | None = None  # set: update this row (changed file, or moved row with new path)
    vector: np.ndarray | None = None


# What a filter over optional metadata does with a picture that lacks the field: said once here,
# counted by Catalog.filter_gaps and reported with every filtered search (engine.search.searcher).
KEPT_BY_FILE_TIME = "dated by its file time"  # the date filter: every picture has a date (catalog.dates)
LEFT_OUT = "left out"  # the picture cannot be shown to match, so the filter does not keep it
COUNTED_AS_UNRATED = "counted as unrated (0)"  # the rating filter: Lightroom's reading of no rating
MISSING_FIELD_RULES: dict[str, str] = {
    "date": KEPT_BY_FILE_TIME,
    "camera": LEFT_OUT,
    "rating": COUNTED_AS_UNRATED,
    "label": LEFT_OUT,
    "keyword": LEFT_OUT,
    "gps": LEFT_OUT,
}
_LACKING = {
    "date": lambda: and_(images.c.exif_date.is_(None), xmp_date_sql().is_(None)),
    "camera": lambda: and_(func.coalesce(images.c.camera_make, "") == "",
                           func.coalesce(images.c.camera_model, "") == "",
                           images.c.id.not_in(select(image_metadata.c.image_id).where(or_(
                               func.coalesce(image_metadata.c.camera_make, "") != "",
                               func.coalesce(image_metadata.c.camera_model, "") != "")))),
    "rating": lambda: images.c.id.not_in(select(image_metadata.c.image_id).where(image_metadata.c.rating.is_not(None))),
    "label": lambda: images.c.id.not_in(select(image_metadata.c.image_id).where(image_metadata.c.label_key.is_not(None))),
    "keyword": lambda: images.c.id.not_in(select(image_keywords.c.image_id)),
    "gps": lambda: images.c.id.not_in(select(image_metadata.c.image_id).where(
        image_metadata.c.gps_lat.is_not(None), image_metadata.c.gps_lon.is_not(None))),
}


@dataclass
class ImageFilter:
    folder: str | None = None  # absolute folder, or a folder relative to a library root
    after: str | None = None  # ISO date, inclusive, compared with the picture's date (catalog.dates)
    before: str | None = None  # ISO date, exclusive of later days
    camera: str | None = None  # case-insensitive substring of make or model
    # XMP (schema 5): rating at least this (no rating written counts as 0, rejected is -1)
    min_rating: int | None = None
    label: str | None = None  # the colour label, compared without regard to case
    # Every one must match: a keyword path ("Places|Norway") matches itself and every path under it
    # ("Places|Norway|Oslo"); a one-level keyword also matches the same flat keyword (dc:subject).
    keywords: tuple[str, ...] = ()
    # GPS: only pictures whose position is within `km` of `near` (latitude, longitude in decimal
    # degrees), by great-circle distance (engine.catalog.geo); pictures with no position are left out.
    near: tuple[float, float] | None = None
    km: float | None = None

    def is_empty(self) -> bool:
        return not (self.folder or self.after or self.before or self.camera or self.min_rating is not None
                    or self.label or self.keywords or self.near is not None)


def _row_to_record(row) -> ImageRecord:
    return ImageRecord(
        id=row.id,
        library_id=row.library_id,
        rel_path=dbpaths.from_db(row.rel_path),
        size=row.size,
        mtime_ns=row.mtime_ns,
        content_hash=row.content_hash,
        status=row.status,
        reason=row.reason,
        width=row.width,
        height=row.height,
        exif_date=row.exif_date,
        camera_make=row.camera_make,
        camera_model=row.camera_model,
        orientation=row.orientation,
    )


def _row_to_library(row) -> Library:
    return Library(row.id, row.root, row.status, row.added_at, row.last_scan_at)


def vector_to_blob(v: np.ndarray) -> bytes:
    return np.ascontiguousarray(v, dtype="<f4").tobytes()


def blob_to_vector(b: bytes) -> np.ndarray:
    return np.frombuffer(b, dtype="<f4").astype(np.float32)


class LibraryOverlapError(LibraryError):
    """A folder inside an indexed library cannot be a library of its own (one picture, one library)."""


@dataclass(frozen=True)
class MergedLibrary:
    """A library that lay inside a new library's folder and was merged into it."""

    id: int
    root: str
    moved: int  # its rows, now the outer library's (vectors and metadata kept)
    dropped: int  # its rows for files the outer library already held (overlap from before)


@dataclass(frozen=True)
class LibraryAdded:
    library: Library
    merged: tuple[MergedLibrary, ...] = ()


# A library whose last indexing run did not complete (cancelled, killed, or still running): some
# files may not be in the catalog yet. Its pending count is kept in meta under PENDING_KEY.
LIBRARY_PARTIAL = "partial"
PENDING_KEY = "library.{id}.pending"
# The state (online | partial) a library had when a run found its folder missing: it comes back
# with that state (and its pending count) when the folder is there again.
BEFORE_OFFLINE_KEY = "library.{id}.before-offline"
# write_batch re-runs a batch that lost a race with another process's hard delete this often.
WRITE_BATCH_ATTEMPTS = 3


@dataclass(frozen=True)
class LibraryState:
    """A library's state as both front ends show it."""

    status: str  # online | offline | partial
    pending: int | None  # files a cancelled/interrupted run left to do (partial only; None: unknown)
    scanned: bool = True  # a run has completed at least once

    @property
    def label(self) -> str:
        if self.status == LIBRARY_PARTIAL:
            return "partly indexed" + (f" · {self.pending} pending" if self.pending is not None else "")
        if self.status == LIBRARY_ONLINE:
            return "indexed" if self.scanned else "not indexed yet"
        return self.status


def root_reachable(root: Path | str) -> bool:
    """A library's folder is there (a missing folder, an unmounted drive or an unreachable share
    is not): the one test of "offline" that indexing, `longlens libraries` and the app share."""
    try:
        return Path(root).is_dir()
    except OSError:  # e.g. a name too long for this file system, a stale network handle
        return False


class Catalog:
    """The SQLite catalog: libraries, images, embeddings (every vector lives here).

    Opening it first looks at the file read-only (version, a time-bounded quick_check): a catalog
    that is refused stays byte-identical, and a damaged one is opened read-only (`damage` says
    why) so it can still be searched but every write is refused with the way out.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        # A rebuild interrupted last time is finished or rolled back before the file is looked at,
        # so a catalog moved aside is never replaced by a new, empty one (engine.catalog.db).
        self.recovered: list[str] = recover_interrupted_rebuild(self.path)
        health = inspect_catalog(self.path)
        self.damage: str | None = damaged_message(self.path, health.damage) if health.damage else None
        self.quick_checked = health.checked
        self.engine = create_catalog_engine(self.path, read_only=self.damage is not None)
        self._writer = self.engine.execution_options(sqlite_begin="IMMEDIATE")
        self.backup_path: Path | None = None
        if self.damage is None:
            with sqlite_errors(self.path):
                self.backup_path = migrate(self.engine, self.path)
        elif health.version != SCHEMA_VERSION:
            self.engine.dispose()
            raise CatalogDamagedError(self.damage)

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Catalog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def read(self) -> Iterator[Connection]:
        with sqlite_errors(self.path), self.engine.connect() as conn, conn.begin():
            yield conn

    @contextmanager
    def write(self) -> Iterator[Connection]:
        """One write transaction (BEGIN IMMEDIATE); committed on success, rolled back on error."""
        if self.damage is not None:
            raise CatalogDamagedError(self.damage)
        with sqlite_errors(self.path), self._writer.connect() as conn, conn.begin():
            yield conn

    # -- meta ---------------------------------------------------------------
    def integrity_check(self) -> str:
        with self.read() as conn:
            return str(conn.exec_driver_sql("PRAGMA integrity_check").scalar())

    def get_meta(self, key: str) -> str | None:
        with self.read() as conn:
            return conn.execute(select(meta.c.value).where(meta.c.key == key)).scalar()

    def set_meta(self, key: str, value: str) -> None:
        with self.write() as conn:
            conn.execute(delete(meta).where(meta.c.key == key))
            conn.execute(insert(meta).values(key=key, value=value))

    # -- libraries ----------------------------------------------------------
    def add_library(self, root: Path | str) -> Library:
        """Register a folder (idempotent) as add_library_merging does; the library."""
        return self.add_library_merging(root).library

    def add_library_merging(self, root: Path | str, *, apart: Sequence[Path | str] = ()) -> LibraryAdded:
        """The library at `root` (stored absolute and resolved), registered when new: one picture,
        one library. The same folder under another spelling (a case-insensitive disk, a bind
        mount: the same device and inode) is the library already there. A folder inside an
        indexed library is refused (LibraryOverlapError: index that library instead), and
        libraries inside `root` are merged into it, in the same transaction: their rows move
        under it (paths made relative to `root`, vectors and metadata kept, nothing re-embedded)
        and they are removed, so no picture is ever in two libraries. Their ANN index files are
        derived data the caller drops (IndexStore.drop). `apart`: folders a library's scan never
        enters (Longlens's data folder): a library inside one of them does not overlap a library
        around it (the demo's sample collections when the home lies inside a library)."""
        root_p = Path(root).expanduser().resolve()
        root_s = str(root_p)
        with self.write() as conn:
            known = [_row_to_library(r) for r in conn.execute(select(libraries).order_by(libraries.c.id))]
            row = next((lib for lib in known if lib.root == root_s), None)
            if row is None:
                row = next((lib for lib in known if same_folder(lib.root, root_p)), None)
            others = [lib for lib in known if row is None or lib.id != row.id]
            outer = [lib for lib in others if _overlaps(root_p, lib.root, apart)]
            if outer:
                raise LibraryOverlapError(overlap_message(root_s, outer[0].root))
            if row is None:
                conn.execute(insert(libraries).values(root=root_s, status=LIBRARY_ONLINE, added_at=time.time()))
                row = _row_to_library(conn.execute(select(libraries).where(libraries.c.root == root_s)).one())
            inside = [lib for lib in others if _overlaps(lib.root, row.root, apart)]
            offline = [lib for lib in inside if not root_reachable(lib.root)]
            if offline:
                # Merged now, its rows would be swept as deleted by this folder's scan: an unmounted
                # drive is not a deletion.
                raise LibraryOverlapError(offline_inside_message(root_s, offline[0].root))
            merged = [self._merge_into(conn, inner, row) for inner in inside]
        return LibraryAdded(row, tuple(merged))

    def overlap_problem(self, root: Path | str, *, apart: Sequence[Path | str] = ()) -> str | None:
        """Why `root` cannot be indexed (it lies inside another library, or an offline library lies
        inside it), or None, as add_library_merging would say; reads only."""
        root_p = Path(root).expanduser().resolve()
        known = self.libraries()
        same = next((lib for lib in known if lib.root == str(root_p) or same_folder(lib.root, root_p)), None)
        others = [lib for lib in known if lib is not same]
        outer = [lib for lib in others if _overlaps(root_p, lib.root, apart)]
        if outer:
            return overlap_message(str(root_p), outer[0].root)
        offline = [lib for lib in others if _overlaps(lib.root, root_p, apart) and not root_reachable(lib.root)]
        return offline_inside_message(str(root_p), offline[0].root) if offline else None

    def _merge_into(self, conn: Connection, inner: Library, outer: Library) -> MergedLibrary:
        """Move every row of `inner` (a library inside `outer`) into `outer` and remove `inner`."""
        prefix = _relative_root(inner.root, outer.root)
        moved = dropped = 0
        taken = {r.rel_path: r for r in conn.execute(
            select(images.c.id, images.c.rel_path, images.c.status).where(images.c.library_id == outer.id))}
        for r in conn.execute(select(images.c.id, images.c.rel_path, images.c.status)
                              .where(images.c.library_id == inner.id)).all():
            rel = dbpaths.to_db(f"{prefix}/{dbpaths.from_db(r.rel_path)}" if prefix else dbpaths.from_db(r.rel_path))
            there = taken.get(rel)
            if there is not None:
                # Both libraries held this file (libraries that overlap from before this check):
                # one row stays, the live one, the outer library's when both are; it takes the
                # other's vectors and metadata where it has none, so nothing is embedded again.
                keep, drop = (there.id, r.id) if there.status == STATUS_OK or r.status != STATUS_OK else (r.id, there.id)
                _take_over_vectors(conn, keep, drop)
                conn.execute(delete(images).where(images.c.id == drop))
                if keep == there.id:
                    dropped += 1
                    continue
            conn.execute(update(images).where(images.c.id == r.id).values(library_id=outer.id, rel_path=rel))
            moved += 1
        conn.execute(delete(libraries).where(libraries.c.id == inner.id))
        conn.execute(delete(meta).where(meta.c.key == PENDING_KEY.format(id=inner.id)))
        return MergedLibrary(inner.id, inner.root, moved, dropped)

    def libraries(self) -> list[Library]:
        with self.read() as conn:
            return [_row_to_library(r) for r in conn.execute(select(libraries).order_by(libraries.c.id))]

    def library(self, library_id: int) -> Library:
        with self.read() as conn:
            row = conn.execute(select(libraries).where(libraries.c.id == library_id)).first()
        if row is None:
            raise CatalogError(f"no library with id {library_id}")
        return _row_to_library(row)

    def library_by_root(self, root: Path | str) -> Library | None:
        root_s = str(Path(root).expanduser().resolve())
        with self.read() as conn:
            row = conn.execute(select(libraries).where(libraries.c.root == root_s)).first()
        return _row_to_library(row) if row else None

    def set_library_status(
        self, library_id: int, status: str, scanned: bool = False, pending: int | None = None
    ) -> None:
        """Set a library's status; `pending` (for LIBRARY_PARTIAL) is the files left to index."""
        values: dict = {"status": status}
        if scanned:
            values["last_scan_at"] = time.time()
        key = PENDING_KEY.format(id=library_id)
        with self.write() as conn:
            conn.execute(update(libraries).where(libraries.c.id == library_id).values(**values))
            conn.execute(delete(meta).where(meta.c.key == key))
            conn.execute(delete(meta).where(meta.c.key == BEFORE_OFFLINE_KEY.format(id=library_id)))
            if status == LIBRARY_PARTIAL and pending is not None:
                conn.execute(insert(meta).values(key=key, value=str(int(pending))))

    def mark_library_offline(self, library_id: int) -> None:
        """A run found the library's folder missing or unmounted: it is stored as offline, and
        the state it had (partly indexed, with its pending count, or indexed) is kept so that it
        comes back as it was when the folder is there again (library_state)."""
        before_key = BEFORE_OFFLINE_KEY.format(id=library_id)
        with self.write() as conn:
            current = conn.execute(select(libraries.c.status).where(libraries.c.id == library_id)).scalar()
            if current is None or current == LIBRARY_OFFLINE:
                return
            conn.execute(delete(meta).where(meta.c.key == before_key))
            conn.execute(insert(meta).values(key=before_key, value=current))
            conn.execute(update(libraries).where(libraries.c.id == library_id).values(status=LIBRARY_OFFLINE))

    def clear_library_offline(self, library_id: int) -> bool:
        """The folder of a library stored as offline is there again: it gets back the state it had
        before (a catalog written by an earlier version kept none: online). Only a row that is
        still offline is changed, so a run that set another state meanwhile is not undone. True
        when this call cleared it."""
        before_key = BEFORE_OFFLINE_KEY.format(id=library_id)
        with self.write() as conn:
            before = conn.execute(select(meta.c.value).where(meta.c.key == before_key)).scalar()
            restored = before if before in (LIBRARY_ONLINE, LIBRARY_PARTIAL) else LIBRARY_ONLINE
            cleared = conn.execute(
                update(libraries)
                .where(libraries.c.id == library_id, libraries.c.status == LIBRARY_OFFLINE)
                .values(status=restored)
            ).rowcount
            if cleared:
                conn.execute(delete(meta).where(meta.c.key == before_key))
        return bool(cleared)

    def _try_clear_offline(self, library_id: int) -> bool:
        # A look must not fail because its write could not be made (another process holding the
        # catalog past the busy timeout, a read-only file): the state is shown all the same and
        # the next look clears it.
        try:
            return self.clear_library_offline(library_id)
        except CatalogError:
            return False

    def library_state(self, library_id: int) -> LibraryState:
        """The library's state as it is now: its folder is looked at, so a folder that went
        missing since the last run is offline, and one that is back is no longer offline (the
        stored state is cleared here, without a re-scan; a read-only catalog shows the state it
        would get)."""
        lib = self.library(library_id)
        status = lib.status
        if not root_reachable(lib.root):
            status = LIBRARY_OFFLINE
        elif status == LIBRARY_OFFLINE:
            if self.damage is None:
                self._try_clear_offline(library_id)  # or another look (process) just did
                status = self.library(library_id).status
            if status == LIBRARY_OFFLINE:  # the write could not be made: the state it would get
                before = self.get_meta(BEFORE_OFFLINE_KEY.format(id=library_id))
                status = before if before in (LIBRARY_ONLINE, LIBRARY_PARTIAL) else LIBRARY_ONLINE
        pending = None
        if status == LIBRARY_PARTIAL:
            raw = self.get_meta(PENDING_KEY.format(id=library_id))
            pending = int(raw) if raw is not None and raw.isdigit() else None
        return LibraryState(status, pending, scanned=lib.last_scan_at is not None)

    def remove_library(self, library_id: int) -> None:
        """Forget a library (rows only; files on disk are never touched)."""
        with self.write() as conn:
            conn.execute(delete(libraries).where(libraries.c.id == library_id))
            conn.execute(delete(meta).where(meta.c.key == PENDING_KEY.format(id=library_id)))
            conn.execute(delete(meta).where(meta.c.key == BEFORE_OFFLINE_KEY.format(id=library_id)))

    # -- images -------------------------------------------------------------
    def image_records(self, library_id: int) -> list[ImageRecord]:
        with self.read() as conn:
            rows = conn.execute(select(images).where(images.c.library_id == library_id))
            return [_row_to_record(r) for r in rows]

    def images_by_id(self, ids: Iterable[int]) -> dict[int, ImageRecord]:
        ids = [int(i) for i in ids]
        out: dict[int, ImageRecord] = {}
        with self.read() as conn:
            for chunk_start in range(0, len(ids), 900):
                chunk = ids[chunk_start : chunk_start + 900]
                for r in conn.execute(select(images).where(images.c.id.in_(chunk))):
                    out[r.id] = _row_to_record(r)
        return out

    def xmp_dates(self, ids: Iterable[int]) -> dict[int, str]:
        """{image id: the date its metadata gives, as stored} for those of these pictures that have one
        (engine.catalog.dates.picture_date takes it after the EXIF date)."""
        return {i: date for i, (date, _) in self.metadata_dates(ids).items()}

    def metadata_cameras(self, ids: Iterable[int]) -> dict[int, tuple[str | None, str | None]]:
        """{image id: (make, model)} from the metadata of those of these pictures whose metadata
        names a camera (EXIF Make/Model, else XMP tiff:Make/Model)."""
        ids = [int(i) for i in ids]
        out: dict[int, tuple[str | None, str | None]] = {}
        m = image_metadata.c
        with self.read() as conn:
            for chunk_start in range(0, len(ids), 900):
                chunk = ids[chunk_start : chunk_start + 900]
                q = select(m.image_id, m.camera_make, m.camera_model).where(
                    m.image_id.in_(chunk), or_(func.coalesce(m.camera_make, "") != "",
                                               func.coalesce(m.camera_model, "") != ""))
                out.update({int(i): (make, model) for i, make, model in conn.execute(q)})
        return out

    def metadata_dates(self, ids: Iterable[int]) -> dict[int, tuple[str, str | None]]:
        """{image id: (the date its metadata gives, as stored, possibly partial; the kind of source
        it came from, "xmp" | "iptc" (None: read before schema 6))} for those of these pictures that
        have one: engine.catalog.dates.picture_date(exif, mtime, *this) labels and completes it."""
        ids = [int(i) for i in ids]
        out: dict[int, tuple[str, str | None]] = {}
        with self.read() as conn:
            for chunk_start in range(0, len(ids), 900):
                chunk = ids[chunk_start : chunk_start + 900]
                q = select(image_metadata.c.image_id, image_metadata.c.taken_at, image_metadata.c.taken_from).where(
                    image_metadata.c.image_id.in_(chunk), image_metadata.c.taken_at.is_not(None),
                    image_metadata.c.taken_at != "")
                out.update({int(i): (str(t), f) for i, t, f in conn.execute(q)})
        return out

    def embedded_ids(self, library_id: int, model_id: str) -> set[int]:
        """Ids of live (status ok) images of a library that have a vector for the model."""
        with self.read() as conn:
            q = (
                select(images.c.id)
                .join(embeddings, embeddings.c.image_id == images.c.id)
                .where(
                    images.c.library_id == library_id,
                    images.c.status == STATUS_OK,
                    embeddings.c.model_id == model_id,
                )
            )
            return {int(r[0]) for r in conn.execute(q)}

    def vectors_for(self, ids: Sequence[int], model_id: str) -> np.ndarray:
        """Vectors in the order of `ids` (every id must have one)."""
        ids = [int(i) for i in ids]
        found: dict[int, np.ndarray] = {}
        with self.read() as conn:
            for start in range(0, len(ids), 900):
                chunk = ids[start : start + 900]
                q = select(embeddings.c.image_id, embeddings.c.vector).where(
                    embeddings.c.model_id == model_id, embeddings.c.image_id.in_(chunk)
                )
                for image_id, blob in conn.execute(q):
                    found[int(image_id)] = blob_to_vector(blob)
        missing = [i for i in ids if i not in found]
        if missing:
            raise CatalogError(f"no {model_id} vector for image ids {missing[:5]}")
        if not ids:
            return np.zeros((0, 0), dtype=np.float32)
        return np.stack([found[i] for i in ids])

    def all_vectors(self, library_id: int, model_id: str) -> tuple[np.ndarray, np.ndarray]:
        """(ids, vectors) of every live image of the library embedded with the model."""
        with self.read() as conn:
            q = (
                select(embeddings.c.image_id, embeddings.c.vector)
                .join(images, embeddings.c.image_id == images.c.id)
                .where(
                    images.c.library_id == library_id,
                    images.c.status == STATUS_OK,
                    embeddings.c.model_id == model_id,
                )
                .order_by(embeddings.c.image_id)
            )
            rows = conn.execute(q).all()
        ids = np.array([r[0] for r in rows], dtype=np.int64)
        if not rows:
            return ids, np.zeros((0, 0), dtype=np.float32)
        return ids, np.stack([blob_to_vector(r[1]) for r in rows])

    def embedded_copy(self, content_hash: str, model_id: str) -> tuple[np.ndarray, ImageRecord] | None:
        """Vector and row of an image with identical content (copies need no new inference)."""
        with self.read() as conn:
            q = (
                select(embeddings.c.vector, images)
                .join(images, embeddings.c.image_id == images.c.id)
                .where(images.c.content_hash == content_hash, embeddings.c.model_id == model_id)
                .order_by(images.c.id)
                .limit(1)
            )
            row = conn.execute(q).first()
        if row is None:
            return None
        return blob_to_vector(row.vector), _row_to_record(row)

    def hashes_with_vectors(self, model_id: str) -> set[str]:
        """Content hashes that already have a vector for the model, in any library."""
        with self.read() as conn:
            q = (
                select(images.c.content_hash)
                .join(embeddings, embeddings.c.image_id == images.c.id)
                .where(embeddings.c.model_id == model_id, images.c.content_hash.is_not(None))
                .distinct()
            )
            return {r[0] for r in conn.execute(q)}

    def write_batch(
        self, model_id: str, writes: Sequence[ImageWrite], deleted_ids: Sequence[int] = ()
    ) -> list[int]:
        """Insert/update image rows and their vectors in ONE transaction; returns the row ids.

        A crash loses at most this batch: either all its rows and vectors are committed or none.
        """
        for attempt in range(1, WRITE_BATCH_ATTEMPTS + 1):
            try:
                return self._write_batch_once(model_id, writes, deleted_ids)
            except CatalogConflictError:
                # Rolled back whole; the re-run re-checks every row inside its transaction.
                if attempt == WRITE_BATCH_ATTEMPTS:
                    raise
        raise AssertionError("unreachable")

    def _write_batch_once(
        self, model_id: str, writes: Sequence[ImageWrite], deleted_ids: Sequence[int]
    ) -> list[int]:
        now = time.time()
        out: list[int] = []
        with self.write() as conn:
            live_libraries = {int(r[0]) for r in conn.execute(select(libraries.c.id))}
            for w in writes:
                if w.library_id not in live_libraries:
                    raise CatalogError(
                        f"library {w.library_id} was removed from the catalog {self.path} while it was "
                        "being indexed; nothing of this batch was written"
                    )
                values = {f: getattr(w, f) for f in _IMAGE_FIELDS}
                values["rel_path"] = dbpaths.to_db(w.rel_path)
                values["updated_at"] = now
                image_id = w.image_id
                if image_id is not None and conn.execute(
                    select(images.c.id).where(images.c.id == image_id, images.c.library_id == w.library_id)
                ).scalar() is None:
                    # Re-checked inside the write lock: another process hard-deleted the row since
                    # this batch was classified (it took over the path, or the rows were purged).
                    image_id = None
                if image_id is None:
                    # The path may hold a soft-deleted or unreadable row from before: reuse it.
                    image_id = conn.execute(
                        select(images.c.id).where(
                            images.c.library_id == w.library_id,
                            images.c.rel_path == values["rel_path"],
                        )
                    ).scalar()
                if image_id is None:
                    values.update(library_id=w.library_id, added_at=now)
                    image_id = conn.execute(insert(images).values(**values)).inserted_primary_key[0]
                else:
                    # A moved row takes over the path; a stale row still holding it is dropped.
                    conn.execute(
                        delete(images).where(
                            images.c.library_id == w.library_id,
                            images.c.rel_path == values["rel_path"],
                            images.c.id != image_id,
                        )
                    )
                    conn.execute(update(images).where(images.c.id == image_id).values(**values))
                if w.vector is not None:
                    conn.execute(
                        delete(embeddings).where(
                            embeddings.c.image_id == image_id, embeddings.c.model_id == model_id
                        )
                    )
                    conn.execute(
                        insert(embeddings).values(
                            image_id=image_id,
                            model_id=model_id,
                            dims=int(w.vector.shape[-1]),
                            vector=vector_to_blob(w.vector),
                            created_at=now,
                        )
                    )
                elif w.status != STATUS_OK:
                    conn.execute(delete(embeddings).where(embeddings.c.image_id == image_id))
                out.append(int(image_id))
            if deleted_ids:
                ids = [int(i) for i in deleted_ids]
                for start in range(0, len(ids), 900):
                    conn.execute(
                        update(images)
                        .where(images.c.id.in_(ids[start : start + 900]))
                        .values(status=STATUS_DELETED, updated_at=now)
                    )
        return out

    def touch_images(self, updates: Sequence[tuple[int, int, int]]) -> None:
        """Record new (size, mtime_ns) for files whose content hash did not change."""
        if not updates:
            return
        now = time.time()
        with self.write() as conn:
            for image_id, size, mtime_ns in updates:
                conn.execute(
                    update(images)
                    .where(images.c.id == image_id)
                    .values(size=size, mtime_ns=mtime_ns, updated_at=now)
                )

    def purge_deleted(self, library_id: int | None = None) -> int:
        """Remove soft-deleted rows for good (only when the user asks)."""
        with self.write() as conn:
            cond = images.c.status == STATUS_DELETED
            if library_id is not None:
                cond = and_(cond, images.c.library_id == library_id)
            return conn.execute(delete(images).where(cond)).rowcount

    def status_counts(self, library_id: int) -> dict[str, int]:
        with self.read() as conn:
            q = (
                select(images.c.status, func.count())
                .where(images.c.library_id == library_id)
                .group_by(images.c.status)
            )
            return {s: int(n) for s, n in conn.execute(q)}

    def unreadable(self, library_id: int) -> list[ImageRecord]:
        with self.read() as conn:
            q = select(images).where(images.c.library_id == library_id, images.c.status == "unreadable")
            return [_row_to_record(r) for r in conn.execute(q)]

    def _filter_conditions(self, library_id: int, flt: ImageFilter) -> dict[str, list] | None:
        """The SQL conditions of each part of the filter (None: the folder is outside this library)."""
        lib = self.library(library_id)
        parts: dict[str, list] = {"live": [images.c.library_id == library_id, images.c.status == STATUS_OK]}
        if flt.folder:
            rel = _folder_relative_to(flt.folder, lib.root)
            if rel is None:
                return None
            if rel:
                rel_db = dbpaths.to_db(rel)
                parts["folder"] = [
                    or_(images.c.rel_path == rel_db, images.c.rel_path.startswith(rel_db + "/", autoescape=True))
                ]
        if flt.after or flt.before:
            date = picture_date_sql()  # the EXIF date, else the XMP date, else the file time: none lacks one
            parts["date"] = ([date >= flt.after] if flt.after else []) + ([date < flt.before] if flt.before else [])
        parts.update(_metadata_parts(flt))
        if flt.camera:
            parts["camera"] = [or_(_camera_matches(images.c.camera_make, images.c.camera_model, flt.camera),
                                   images.c.id.in_(select(image_metadata.c.image_id).where(_camera_matches(
                                       image_metadata.c.camera_make, image_metadata.c.camera_model, flt.camera))))]
        return parts

    def filtered_ids(self, library_id: int, flt: ImageFilter) -> set[int]:
        """Live image ids of a library that pass the filter."""
        parts = self._filter_conditions(library_id, flt)
        if parts is None:
            return set()
        conds = [c for part in parts.values() for c in part]
        with self.read() as conn:
            return {int(r[0]) for r in conn.execute(select(images.c.id).where(*conds))}

    def filter_gaps(self, library_id: int, flt: ImageFilter) -> dict[str, int]:
        """For each active filter over optional metadata (MISSING_FIELD_RULES), how many live
        pictures of the library lack its field among those the rest of the filter keeps: the
        date filter's are kept, dated by their file time; the rating filter's count as unrated
        (0); the camera, label and keyword filters' are left out."""
        parts = self._filter_conditions(library_id, flt)
        if parts is None:
            return {}
        out: dict[str, int] = {}
        with self.read() as conn:
            for name, lacking in _LACKING.items():
                if name not in parts:
                    continue
                # The date filter applies to these pictures (through their file time); a filter
                # whose pictures lacking the field are left out is taken away to count them.
                keep = parts if MISSING_FIELD_RULES[name] == KEPT_BY_FILE_TIME else {
                    k: v for k, v in parts.items() if k != name}
                conds = [c for part in keep.values() for c in part]
                out[name] = int(conn.execute(select(func.count()).select_from(images).where(*conds, lacking()))
                                .scalar() or 0)
        return out

    # -- XMP metadata (schema 5) ----------------------------------------------
    def metadata_states(self, library_id: int) -> dict[str, tuple[int, str | None]]:
        """{rel_path: (image id, stored metadata state or None when never read)} of a library's
        live pictures: what a re-scan compares with the sidecars it finds."""
        with self.read() as conn:
            q = (
                select(images.c.id, images.c.rel_path, image_metadata.c.state)
                .select_from(images.outerjoin(image_metadata, image_metadata.c.image_id == images.c.id))
                .where(images.c.library_id == library_id, images.c.status == STATUS_OK)
            )
            return {dbpaths.from_db(r.rel_path): (int(r.id), r.state) for r in conn.execute(q)}

    def write_metadata(self, rows: Sequence[tuple[int, PhotoMetadata]]) -> int:
        """Store pictures' metadata (replacing what they had) in one transaction; rows whose picture
        is no longer in the catalog are skipped. Returns how many were written."""
        if not rows:
            return 0
        now = time.time()
        written = 0
        with self.write() as conn:
            ids = [int(i) for i, _ in rows]
            live: set[int] = set()
            for start in range(0, len(ids), 900):
                chunk = ids[start : start + 900]
                live |= {int(r[0]) for r in conn.execute(select(images.c.id).where(images.c.id.in_(chunk)))}
            for image_id, m in rows:
                if int(image_id) not in live:
                    continue  # removed by another process since it was read
                conn.execute(delete(image_keywords).where(image_keywords.c.image_id == image_id))
                conn.execute(delete(image_metadata).where(image_metadata.c.image_id == image_id))
                conn.execute(insert(image_metadata).values(
                    image_id=image_id, state=m.state, title=m.title, description=m.description,
                    rating=m.rating, label=m.label, label_key=m.label.casefold() if m.label else None,
                    taken_at=m.taken_at, gps_lat=m.gps_lat, gps_lon=m.gps_lon,
                    sources=json.dumps(list(m.sources)), problems=json.dumps(list(m.problems)), read_at=now,
                    camera_make=m.camera_make, camera_model=m.camera_model, lens=m.lens, pick=m.pick,
                    taken_from=m.taken_from, titles=_texts_json(m.titles), descriptions=_texts_json(m.descriptions),
                    fields=json.dumps([asdict(f) for f in m.fields]),  # ASCII escapes, as _texts_json
                ))
                words = {("subject", k) for k in m.subjects} | {("path", k) for k in m.hierarchy}
                if words:
                    conn.execute(insert(image_keywords), [
                        {"image_id": image_id, "kind": kind, "keyword": k, "keyword_key": k.casefold()}
                        for kind, k in sorted(words)
                    ])
                written += 1
        return written

    def photo_metadata(self, ids: Iterable[int]) -> dict[int, PhotoMetadata]:
        """The stored metadata of these pictures (those read so far)."""
        ids = [int(i) for i in ids]
        out: dict[int, PhotoMetadata] = {}
        with self.read() as conn:
            for start in range(0, len(ids), 900):
                chunk = ids[start : start + 900]
                words: dict[int, dict[str, list[str]]] = {}
                q = (select(image_keywords.c.image_id, image_keywords.c.kind, image_keywords.c.keyword)
                     .where(image_keywords.c.image_id.in_(chunk)).order_by(image_keywords.c.keyword))
                for image_id, kind, keyword in conn.execute(q):
                    words.setdefault(int(image_id), {}).setdefault(kind, []).append(keyword)
                for r in conn.execute(select(image_metadata).where(image_metadata.c.image_id.in_(chunk))):
                    w = words.get(int(r.image_id), {})
                    out[int(r.image_id)] = PhotoMetadata(
                        title=r.title, description=r.description, subjects=tuple(w.get("subject", ())),
                        hierarchy=tuple(w.get("path", ())), rating=r.rating, label=r.label, taken_at=r.taken_at,
                        gps_lat=r.gps_lat, gps_lon=r.gps_lon, sources=tuple(json.loads(r.sources)),
                        problems=tuple(json.loads(r.problems)), state=r.state,
                        camera_make=r.camera_make, camera_model=r.camera_model, lens=r.lens, pick=r.pick,
                        taken_from=r.taken_from, titles=_texts_from_json(r.titles),
                        descriptions=_texts_from_json(r.descriptions), fields=_fields_from_json(r.fields),
                    )
        return out

    def described_pictures(self, library_id: int) -> list[tuple[str, str | None, str | None]]:
        """(rel_path, description, title) of a library's live pictures whose XMP gives a
        description or a title, in path order: the captions already written by the user's tools."""
        with self.read() as conn:
            q = (
                select(images.c.rel_path, image_metadata.c.description, image_metadata.c.title)
                .select_from(images.join(image_metadata, image_metadata.c.image_id == images.c.id))
                .where(images.c.library_id == library_id, images.c.status == STATUS_OK,
                       or_(image_metadata.c.description.is_not(None), image_metadata.c.title.is_not(None)))
                .order_by(images.c.rel_path)
            )
            return [(dbpaths.from_db(r.rel_path), r.description, r.title) for r in conn.execute(q)]

    def image_at(self, path: Path | str) -> ImageRecord | None:
        """The live catalog row of the picture at this absolute path, if it is in a library."""
        p = Path(path).expanduser().absolute()
        for lib in self.libraries():
            try:
                rel = p.relative_to(Path(lib.root)).as_posix()
            except ValueError:
                continue
            with self.read() as conn:
                row = conn.execute(select(images).where(
                    images.c.library_id == lib.id, images.c.rel_path == dbpaths.to_db(rel),
                    images.c.status == STATUS_OK)).first()
            if row is not None:
                return _row_to_record(row)
        return None

    def model_ids(self) -> set[str]:
        """The keys vectors are stored under (model identities, engine.models.registry)."""
        with self.read() as conn:
            return {r[0] for r in conn.execute(select(embeddings.c.model_id).distinct())}

    def vector_keys(self, library_id: int) -> set[str]:
        """The keys a library's vectors are stored under."""
        with self.read() as conn:
            q = (select(embeddings.c.model_id).join(images, embeddings.c.image_id == images.c.id)
                 .where(images.c.library_id == library_id).distinct())
            return {r[0] for r in conn.execute(q)}

    def delete_vectors(self, library_id: int, model_ids: Sequence[str]) -> int:
        """Drop a library's vectors stored under these keys (e.g. of a replaced model); returns how many."""
        if not model_ids:
            return 0
        with self.write() as conn:
            ids_of_library = select(images.c.id).where(images.c.library_id == library_id)
            return int(conn.execute(
                delete(embeddings).where(embeddings.c.model_id.in_(list(model_ids)),
                                         embeddings.c.image_id.in_(ids_of_library))
            ).rowcount)

    def duplicate_paths(self) -> int:
        """Rows sharing (library, path): always 0 thanks to the unique constraint; checked by tests."""
        with self.read() as conn:
            q = select(func.count()).select_from(
                select(images.c.library_id, images.c.rel_path)
                .group_by(images.c.library_id, images.c.rel_path)
                .having(func.count() > 1)
                .subquery()
            )
            return int(conn.execute(q).scalar() or 0)


def _camera_matches(make, model, text: str):
    """The camera filter's test on one source's make and model (the decoder's EXIF, or the
    metadata's: EXIF, else XMP tiff:Make/Model): `text` within the make, the model, or both
    joined by a space, or the name every display shows (engine.catalog.camera: "OLYMPUS E-M5" for
    "OLYMPUS IMAGING CORP." + "E-M5"), case ignored (ASCII, as SQLite's lower())."""
    pat = f"%{text.lower()}%"
    joined = func.lower(func.coalesce(make, "") + " " + func.coalesce(model, ""))
    tests = [func.lower(func.coalesce(make, "")).like(pat), func.lower(func.coalesce(model, "")).like(pat),
             joined.like(pat)]
    words = text.lower().split()
    if len(words) > 1:
        # Only text with a space can match the shown name and not the make or model alone (across
        # the shortened maker and the model). The shown name is a Python function (one call per
        # row): it is asked only where every word is in the make or model (plain LIKEs, cheap),
        # which a match needs (SQLite stops an AND at its first false term).
        tests.append(and_(*(joined.like(f"%{w}%") for w in words),
                          func.lower(getattr(func, CAMERA_DISPLAY)(make, model)).like(pat)))
    return or_(*tests)


def _texts_json(texts: Iterable[tuple[str, str]]) -> str:
    """Titles or descriptions per language as stored: [[language, text], ...], x-default first."""
    # ASCII escapes: a file name that is not UTF-8 (kept by Python as surrogate escapes) cannot be
    # encoded for SQLite as it is, and JSON's \u escapes carry it through unchanged.
    return json.dumps([[str(lang), str(text)] for lang, text in texts])


def _texts_from_json(raw: str | None) -> tuple[tuple[str, str], ...]:
    # Written by _texts_json, but holding users' text: parsed within the depth limit all the same.
    return tuple((str(lang), str(text)) for lang, text in loads_bounded(raw or "[]", "image_metadata texts"))


def _fields_from_json(raw: str | None) -> tuple[MetadataField, ...]:
    return tuple(MetadataField(**f) for f in loads_bounded(raw or "[]", "image_metadata.fields"))


def _metadata_parts(flt: ImageFilter) -> dict[str, list]:
    """The XMP filters' conditions on images.id (schema-5 tables), one part per filter."""
    parts: dict[str, list] = {}
    if flt.min_rating is not None:
        n = int(flt.min_rating)
        if n <= 0:
            # No rating written counts as 0 (Lightroom's "unrated"): only ratings below n drop out.
            low = select(image_metadata.c.image_id).where(image_metadata.c.rating < n)
            parts["rating"] = [images.c.id.not_in(low)]
        else:
            parts["rating"] = [images.c.id.in_(select(image_metadata.c.image_id).where(image_metadata.c.rating >= n))]
    if flt.label:
        parts["label"] = [images.c.id.in_(
            select(image_metadata.c.image_id).where(image_metadata.c.label_key == flt.label.casefold()))]
    keyword_conds = []
    for keyword in flt.keywords:
        key = keyword.casefold()
        below = key + "|"
        keyword_conds.append(images.c.id.in_(select(image_keywords.c.image_id).where(or_(
            image_keywords.c.keyword_key == key,
            func.substr(image_keywords.c.keyword_key, 1, len(below)) == below,
        ))))
    if keyword_conds:
        parts["keyword"] = keyword_conds
    if flt.near is not None and flt.km is not None:
        parts["gps"] = [images.c.id.in_(_within_km(flt.near[0], flt.near[1], float(flt.km)))]
    return parts


def _within_km(lat: float, lon: float, km: float):
    """The ids of pictures whose stored position is within `km` of (lat, lon): the bounding box
    (indexed comparisons), then the exact great-circle distance on what the box keeps."""
    south, north, lons = bounding_box(lat, lon, km)
    m = image_metadata.c
    return select(m.image_id).where(
        m.gps_lat.between(south, north),
        or_(*(m.gps_lon.between(west, east) for west, east in lons)),
        getattr(func, GREAT_CIRCLE_KM)(lat, lon, m.gps_lat, m.gps_lon) <= km,
    )


def _folder_relative_to(folder: str, root: str) -> str | None:
    """'' for the root itself, a relative '/'-path inside it, or None when outside this library."""
    p = Path(folder).expanduser()
    if not p.is_absolute():
        return p.as_posix().strip("/")
    try:
        rel = p.resolve().relative_to(Path(root))
    except ValueError:
        return None
    s = rel.as_posix()
    return "" if s == "." else s


def _take_over_vectors(conn: Connection, keep: int, drop: int) -> None:
    """Row `keep` takes row `drop`'s vectors of the models it has none of, and its metadata if it has none."""
    have = select(embeddings.c.model_id).where(embeddings.c.image_id == keep)
    conn.execute(update(embeddings).where(embeddings.c.image_id == drop, embeddings.c.model_id.not_in(have))
                 .values(image_id=keep))
    if conn.execute(select(image_metadata.c.image_id).where(image_metadata.c.image_id == keep)).first() is None:
        conn.execute(update(image_metadata).where(image_metadata.c.image_id == drop).values(image_id=keep))
        conn.execute(update(image_keywords).where(image_keywords.c.image_id == drop).values(image_id=keep))


def _folder_key(path: Path | str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None  # an offline root: only its name can be compared
    return st.st_dev, st.st_ino


def same_folder(a: Path | str, b: Path | str) -> bool:
    """The same folder: the same resolved path, or (both reachable) the same device and inode, which
    also holds for two spellings of one folder on a case-insensitive disk and for bind mounts."""
    if os.path.normcase(str(a)) == os.path.normcase(str(b)):
        return True
    ka = _folder_key(a)
    return ka is not None and ka == _folder_key(b)


def folder_within(inner: Path | str, outer: Path | str) -> bool:
    """`inner` is `outer` or lies under it. Both are resolved absolute paths (symbolic links
    already followed); compared by name (os.path.normcase) and, where the folders can be reached,
    by device and inode along `inner`'s ancestors, so that another spelling of `outer` on a
    case-insensitive disk counts too."""
    inner_p, outer_p = Path(inner), Path(outer)
    if Path(os.path.normcase(str(inner_p))).is_relative_to(Path(os.path.normcase(str(outer_p)))):
        return True
    outer_key = _folder_key(outer_p)
    if outer_key is None:
        return False
    return any(_folder_key(p) == outer_key for p in (inner_p, *inner_p.parents))


def _overlaps(inner: Path | str, outer: Path | str, apart: Sequence[Path | str]) -> bool:
    """`inner` lies in `outer` and `outer`'s scan reaches it (no `apart` folder between them)."""
    if not folder_within(inner, outer):
        return False
    return not any(folder_within(inner, a) and folder_within(a, outer) and not same_folder(a, outer)
                   for a in apart)


def overlap_message(root: str, library_root: str) -> str:
    """Why a folder inside an indexed library is not made a library of its own, and the way out."""
    return (f"{root} is inside the library {library_root}, which is indexed already: index {library_root} "
            "instead (it includes this folder), or remove that library first; a picture is never in two "
            "libraries")


def offline_inside_message(root: str, library_root: str) -> str:
    """Why a folder holding an offline library is not indexed now, and the way out."""
    return (f"the library {library_root} lies inside {root} and is offline (missing or unmounted): connect it "
            f"and index {root} again (that library is then merged into it, nothing re-embedded), or remove that "
            "library first")


def _relative_root(inner: str, outer: str) -> str:
    """`inner`'s path under `outer` ('/'-separated, '' for the same folder): by name when it can,
    else by walking `inner`'s ancestors to the one that is `outer` on disk."""
    inner_p, outer_p = Path(inner), Path(outer)
    try:
        rel = inner_p.relative_to(outer_p).as_posix()
        return "" if rel == "." else rel
    except ValueError:
        pass
    outer_key = _folder_key(outer_p)
    parts: list[str] = []
    for p in (inner_p, *inner_p.parents):
        if _folder_key(p) == outer_key or os.path.normcase(str(p)) == os.path.normcase(str(outer_p)):
            return "/".join(reversed(parts))
        parts.append(p.name)
    raise CatalogError(f"{inner} is not inside {outer}")


def open_catalog(path: Path) -> Catalog:
    return Catalog(path)
