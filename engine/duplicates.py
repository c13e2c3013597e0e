"""Duplicates in the indexed libraries, in three kinds kept apart (immich #1387 asks for exactly
that separation): exact copies, near-duplicates and visually similar pictures. Longlens never
deletes, moves or writes a picture: it lists the groups, and the list can be exported.

* exact: the same bytes, a fact checked on the bytes. The catalog's content hash (the SHA-256 of
  the file's bytes when it was indexed) only finds the candidates: every file of a candidate group
  is hashed again before the group is shown, and a file whose bytes are no longer those (replaced
  by other bytes of the same size with its modification time put back) is left out, listed under
  `changed`, as is a file whose size or modification time differs from what the catalog recorded.
  One file is never its own copy: names that lead to the same file on disk (the same device and
  inode: libraries that overlap from before Longlens refused them, a symbolic link, a hard link)
  are one file, listed once (the other names under `same_file`), since deleting "the copy" would
  delete the only one. The pHash cache is filled only from a file whose bytes were checked.
* near: the same picture saved again (re-encoded, resized, a lighter edit): the 64-bit pHash
  (imagehash 4.3.2, over the decoded *upright* image, so an EXIF-rotated copy matches) of two
  distinct contents differs in at most `near_distance` bits. Hashes are computed once per
  content and kept in a derived cache (`PhashCache`) in Longlens's cache folder.
* similar: the same scene, another shot: the embeddings of the model in use have a cosine
  similarity of at least `similar`, found through each library's ANN index (its
  SIMILAR_NEIGHBOURS nearest neighbours per picture, so a group is linked pairwise, not all
  pairs of it need be that close).

The kinds nest: a near group joins at least two distinct contents (each perhaps an exact group),
a similar group at least two near groups or lone contents; a group shown at one kind is never
shown again at a weaker one. The job is a generator of Progress with a CancelToken, shared by
`longlens duplicates` and the desktop app.
"""

from __future__ import annotations

import csv
import io
import os
import sqlite3
import threading
from collections.abc import Generator, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from engine.catalog import Catalog, root_reachable
from engine.catalog.dates import picture_date
from engine.errors import DecodeError, LonglensError
from engine.fileutil import atomic_write_bytes, sha256_file
from engine.index.store import IndexStore
from engine.jobs import CancelToken, Progress, RateMeter
from engine.options import PHASH_DISTANCE, SIMILARITY_THRESHOLD
from engine.types import STATUS_OK

KIND_EXACT = "exact"
KIND_NEAR = "near"
KIND_SIMILAR = "similar"
KINDS = (KIND_EXACT, KIND_NEAR, KIND_SIMILAR)
DEFAULT_NEAR_DISTANCE = 6  # of 64 bits; the generated re-encodes, resizes and rotations measured 0, other pictures 28-40
SIMILAR_NEIGHBOURS = 10
# The decoded size the pHash starts from (it reduces to 32x32): small enough for a fast
# DCT-scaled JPEG decode, large enough that the reduction is a real average.
PHASH_DECODE_SIZE = 128
PHASH_ALGORITHM = "imagehash-4.3.2/phash-8/upright-128"
EXPORT_SUFFIXES = (".csv", ".json")
_PAIR_BLOCK = 1 << 22  # pHash pairs compared per numpy block (memory stays a few tens of MB)


class DuplicatesError(LonglensError):
    """The duplicates search cannot run as asked (no such library, no vectors of the model)."""


@dataclass
class DuplicateFile:
    path: str
    library_id: int
    image_id: int
    size: int
    date: str  # as known: a partial metadata date stays partial ("2023-06"; engine.catalog.dates)
    date_source: str  # "exif" | "xmp" | "iptc" | "file time" (engine.catalog.dates)
    width: int | None
    height: int | None
    sha256: str


@dataclass
class DuplicateGroup:
    kind: str  # exact | near | similar
    files: list[DuplicateFile]
    detail: str  # why these files are together, in words

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "detail": self.detail, "files_in_group": len(self.files),
                "total_bytes": self.total_bytes, "files": [asdict(f) for f in self.files]}


@dataclass
class DuplicateReport:
    groups: list[DuplicateGroup] = field(default_factory=list)
    libraries: list[str] = field(default_factory=list)
    looked_at: int = 0  # live catalog pictures whose file is as indexed
    near_distance: int | None = None
    similar: float | None = None
    model: str | None = None
    changed: list[str] = field(default_factory=list)  # changed or gone since indexing: left out
    # Another name of a file already looked at (same device and inode): {"path": it, "same_as": that one}
    same_file: list[dict[str, str]] = field(default_factory=list)
    unreadable: list[dict[str, str]] = field(default_factory=list)  # no pHash: path and reason
    notes: list[str] = field(default_factory=list)
    cancelled: bool = False

    def count(self, kind: str) -> int:
        return sum(1 for g in self.groups if g.kind == kind)

    def as_dict(self) -> dict[str, Any]:
        return {"libraries": self.libraries, "looked_at": self.looked_at, "near_distance": self.near_distance,
                "similar": self.similar, "model": self.model, "cancelled": self.cancelled,
                "counts": {k: self.count(k) for k in KINDS}, "groups": [g.as_dict() for g in self.groups],
                "changed": self.changed, "same_file": self.same_file, "unreadable": self.unreadable,
                "notes": self.notes}


# --------------------------------------------------------------------------- the pHash cache


class PhashCache:
    """content SHA-256 -> 64-bit pHash, derived data (deleting the file only costs time)."""

    def __init__(self, path: Path | None) -> None:
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        if path is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            try:
                self._db = sqlite3.connect(str(path), check_same_thread=False, timeout=30)
                self._db.execute("CREATE TABLE IF NOT EXISTS phash (sha256 TEXT NOT NULL, algorithm TEXT NOT NULL, "
                                 "hash INTEGER NOT NULL, PRIMARY KEY (sha256, algorithm))")
                self._db.commit()
            except sqlite3.DatabaseError:
                # A damaged cache is derived data: start a fresh one instead of failing the run.
                self._close()
                Path(path).unlink(missing_ok=True)
                self._db = sqlite3.connect(str(path), check_same_thread=False, timeout=30)
                self._db.execute("CREATE TABLE phash (sha256 TEXT NOT NULL, algorithm TEXT NOT NULL, "
                                 "hash INTEGER NOT NULL, PRIMARY KEY (sha256, algorithm))")
                self._db.commit()

    def _close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def close(self) -> None:
        with self._lock:
            self._close()

    def get(self, hashes: Sequence[str]) -> dict[str, int]:
        if self._db is None or not hashes:
            return {}
        out: dict[str, int] = {}
        with self._lock:
            for start in range(0, len(hashes), 900):
                chunk = list(hashes[start:start + 900])
                marks = ",".join("?" * len(chunk))
                for sha, value in self._db.execute(
                        f"SELECT sha256, hash FROM phash WHERE algorithm = ? AND sha256 IN ({marks})",
                        [PHASH_ALGORITHM, *chunk]):
                    out[sha] = int(value) & 0xFFFF_FFFF_FFFF_FFFF
        return out

    def put(self, values: dict[str, int]) -> None:
        if self._db is None or not values:
            return
        with self._lock:
            # SQLite integers are signed 64-bit: store the bit pattern as such.
            self._db.executemany("INSERT OR REPLACE INTO phash (sha256, algorithm, hash) VALUES (?, ?, ?)",
                                 [(k, PHASH_ALGORITHM, v - (1 << 64) if v >= 1 << 63 else v)
                                  for k, v in values.items()])
            self._db.commit()


def phash_of(path: Path | str) -> int:
    """The 64-bit pHash of the picture at `path`, decoded upright (DecodeError when unreadable)."""
    import imagehash

    from engine.indexing.decode import decode_image

    image, _ = decode_image(Path(path), target_size=PHASH_DECODE_SIZE)
    bits = imagehash.phash(image, hash_size=8).hash.flatten()
    value = 0
    for b in bits:
        value = (value << 1) | int(bool(b))
    return value


# --------------------------------------------------------------------------- grouping


class _Components:
    """Union-find over content hashes."""

    def __init__(self, keys: Iterable[str]) -> None:
        self.parent = {k: k for k in keys}

    def find(self, k: str) -> str:
        root = k
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[k] != root:
            self.parent[k], k = root, self.parent[k]
        return root

    def union(self, a: str, b: str) -> bool:
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return False
        self.parent[max(ra, rb)] = min(ra, rb)
        return True

    def groups(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for k in self.parent:
            out.setdefault(self.find(k), []).append(k)
        return out


def near_pairs(hashes: np.ndarray, max_distance: int,
               cancel: CancelToken | None = None) -> Iterable[tuple[int, int, int]]:
    """(i, j, distance) for every i < j whose 64-bit hashes differ in at most max_distance bits."""
    h = np.asarray(hashes, dtype=np.uint64)
    n = len(h)
    rows = max(1, _PAIR_BLOCK // max(n, 1))
    for start in range(0, n, rows):
        if cancel is not None:
            cancel.raise_if_cancelled()
        block = h[start:start + rows]
        rest = h[start:]  # only the pairs (i, j > i): the upper triangle
        dist = np.bitwise_count(block[:, None] ^ rest[None, :])
        ii, jj = np.nonzero(dist <= max_distance)
        for i, j in zip(ii.tolist(), jj.tolist(), strict=True):
            if i < j:
                yield start + i, start + j, int(dist[i, j])


def _file_as_indexed(path: Path, size: int, mtime_ns: int) -> tuple[int, int] | None:
    """The file's (device, inode) when its size and modification time are as indexed, else None."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if st.st_size != size or st.st_mtime_ns != mtime_ns:
        return None
    return st.st_dev, st.st_ino


def _bytes_hash(path: str, cancel: CancelToken) -> str | None:
    """The SHA-256 of the file's bytes now (None: it cannot be read any more)."""
    try:
        return sha256_file(path, cancel=cancel)
    except OSError:
        return None


def find_duplicates(
    catalog: Catalog,
    store: IndexStore | None = None,
    *,
    library_roots: Sequence[str] | None = None,
    near_distance: int | None = DEFAULT_NEAR_DISTANCE,
    similar: float | None = None,
    model_identity: str | None = None,
    model_name: str | None = None,
    phash_cache: PhashCache | None = None,
    cancel: CancelToken | None = None,
) -> Generator[Progress, None, DuplicateReport]:
    """Find the groups (a job: `report = yield from find_duplicates(...)`; the last Progress,
    stage "done", carries it in extra["report"]).

    library_roots: the libraries to look in (indexed roots; default: all). near_distance: the
    pHash distance of near-duplicates (None: no near stage). similar: the cosine threshold of
    visually similar pictures (None: no similar stage), over the vectors stored under
    `model_identity` (engine.models.registry.installed_identity(...).image). Nothing is written
    but the pHash cache; no picture is ever changed."""
    cancel = cancel or CancelToken()
    if near_distance is not None:
        PHASH_DISTANCE.check(near_distance)
    if similar is not None:
        SIMILARITY_THRESHOLD.check(similar)
        if model_identity is None or store is None:
            raise DuplicatesError("visually similar pictures need the model whose vectors to compare",
                                  settings=("model",))
    libs = _select_libraries(catalog, library_roots)
    report = DuplicateReport(libraries=[lib.root for lib in libs], near_distance=near_distance, similar=similar,
                             model=model_name if similar is not None else None)

    # 1. the files as indexed, by content
    yield Progress("check", 0, None, "checking the files against the catalog")
    files: dict[int, DuplicateFile] = {}
    by_content: dict[str, list[int]] = {}
    seen_files: dict[tuple[int, int], str] = {}  # (device, inode) -> the path it was first met by
    for lib in libs:
        if not root_reachable(lib.root):
            report.notes.append(f"{lib.root} is offline or missing: its pictures were not looked at")
            continue
        records = [rec for rec in catalog.image_records(lib.id) if rec.status == STATUS_OK and rec.content_hash]
        xmp_dates = catalog.metadata_dates(rec.id for rec in records if not rec.exif_date)
        for rec in records:
            path = Path(lib.root) / rec.rel_path
            key = _file_as_indexed(path, rec.size, rec.mtime_ns)
            if key is None:
                report.changed.append(str(path))
                continue
            if key in seen_files:
                report.same_file.append({"path": str(path), "same_as": seen_files[key]})
                continue
            seen_files[key] = str(path)
            when = picture_date(rec.exif_date, rec.mtime_ns, *xmp_dates.get(rec.id, (None, None)))
            files[rec.id] = DuplicateFile(str(path), lib.id, rec.id, rec.size, when.shown, when.source, rec.width,
                                          rec.height, rec.content_hash)
            by_content.setdefault(rec.content_hash, []).append(rec.id)
        cancel.raise_if_cancelled()
    if report.same_file:
        report.notes.append(f"{len(report.same_file)} name(s) lead to a file already looked at (the same file on "
                            "disk: overlapping libraries, a symbolic or hard link): each file is listed once, "
                            "never as a copy of itself")
    yield Progress("check", len(files), len(files), "checking exact copies on their bytes")

    # 1b. exact copies are a fact of the bytes: the candidates' files are hashed again now
    yield from _verify_exact(by_content, files, report, cancel)
    contents = sorted(by_content)
    comps = _Components(contents)
    exact = [c for c in contents if len(by_content[c]) > 1]
    yield Progress("check", len(files), len(files), f"{len(exact)} group(s) of exact copies")

    # 2. near-duplicates by perceptual hash, one hash per distinct content
    # Per content, the pHash distances and cosines of the links it made: the groups' details.
    near_links: dict[str, list[int]] = {}
    similar_links: dict[str, list[float]] = {}
    near_roots: dict[str, str] = {}
    if near_distance is not None and len(contents) > 1:
        hashes = yield from _phashes(contents, by_content, files, phash_cache, report, cancel)
        hashed = [c for c in contents if c in hashes]
        values = np.array([hashes[c] for c in hashed], dtype=np.uint64)
        for i, j, dist in near_pairs(values, near_distance, cancel):
            comps.union(hashed[i], hashed[j])
            near_links.setdefault(hashed[i], []).append(dist)
        near_roots = {c: comps.find(c) for c in contents}
    else:
        near_roots = {c: c for c in contents}

    # 3. visually similar by embedding, through the ANN index
    if similar is not None and len(contents) > 1:
        yield from _similar_links(catalog, store, libs, model_identity, similar, files, comps, similar_links, report,
                                  cancel)

    report.groups = _groups(comps, near_roots, by_content, files, exact, near_links, similar_links, near_distance,
                            similar)
    report.looked_at = len(files)
    if report.changed:
        report.notes.append(f"{len(report.changed)} picture(s) changed or gone since they were indexed were left "
                            "out; index the library again to include them")
    yield Progress("done", len(files), len(files), f"{len(report.groups)} group(s)", extra={"report": report})
    return report


def _verify_exact(by_content: dict[str, list[int]], files: dict[int, DuplicateFile], report: DuplicateReport,
                  cancel: CancelToken) -> Generator[Progress, None, None]:
    """Hash again every file of each candidate group of exact copies (same catalog hash); a file
    whose bytes are not those any more is left out, under `changed`."""
    todo = [(c, i) for c, ids in by_content.items() if len(ids) > 1 for i in ids]
    meter = RateMeter(len(todo))
    for n, (content, image_id) in enumerate(todo, start=1):
        cancel.raise_if_cancelled()
        path = files[image_id].path
        if _bytes_hash(path, cancel) != content:
            report.changed.append(path)
            del files[image_id]
            by_content[content].remove(image_id)
        if n % 50 == 0 or n == len(todo):
            yield meter.progress("verify", n, f"{n}/{len(todo)} files of exact copies hashed again")
    for content in [c for c, ids in by_content.items() if not ids]:
        del by_content[content]


def _select_libraries(catalog: Catalog, roots: Sequence[str] | None) -> list:
    libs = catalog.libraries()
    if not roots:
        return libs
    chosen = []
    for root in roots:
        lib = catalog.library_by_root(root)
        if lib is None:
            known = ", ".join(x.root for x in libs) or "none yet"
            raise DuplicatesError(f"{root} is not an indexed library (indexed: {known})", settings=("library",))
        if lib.id not in {x.id for x in chosen}:
            chosen.append(lib)
    return chosen


def _phashes(contents: list[str], by_content: dict[str, list[int]], files: dict[int, DuplicateFile],
             cache: PhashCache | None, report: DuplicateReport,
             cancel: CancelToken) -> Generator[Progress, None, dict[str, int]]:
    known = cache.get(contents) if cache is not None else {}
    todo = [c for c in contents if c not in known]
    meter = RateMeter(len(todo))
    fresh: dict[str, int] = {}
    for n, content in enumerate(todo, start=1):
        cancel.raise_if_cancelled()
        last_error = None
        for image_id in by_content[content]:  # any copy will do; the next one if it cannot be read
            path = files[image_id].path
            if len(by_content[content]) == 1 and _bytes_hash(path, cancel) != content:
                # Its bytes are no longer those indexed (a group's files were checked already): a
                # pHash of them must not be cached under the old content's hash, nor the file grouped.
                report.changed.append(path)
                del files[image_id]
                continue
            try:
                fresh[content] = phash_of(path)
                break
            except DecodeError as exc:
                last_error = (path, str(exc))
        if content not in fresh and last_error is not None:
            report.unreadable.append({"path": last_error[0], "reason": last_error[1]})
        if n % 50 == 0 or n == len(todo):
            if cache is not None:
                cache.put(fresh)
            yield meter.progress("phash", n, f"{n}/{len(todo)} perceptual hashes")
    if cache is not None:
        cache.put(fresh)
    return {**known, **fresh}


def _similar_links(catalog: Catalog, store: IndexStore, libs: list, identity: str, threshold: float,
                   files: dict[int, DuplicateFile], comps: _Components, links: dict[str, list[float]],
                   report: DuplicateReport, cancel: CancelToken) -> Generator[Progress, None, None]:
    content_of = {i: f.sha256 for i, f in files.items()}
    indexes = []
    for lib in libs:
        ids, vecs = catalog.all_vectors(lib.id, identity)
        if len(ids) == 0:
            report.notes.append(f"{lib.root} has no vectors of model {report.model!r}: index it with that model to "
                                "find visually similar pictures there")
            continue
        indexes.append((lib, ids, vecs, store.get(lib.id, identity, int(vecs.shape[1]))))
    total = sum(len(ids) for _, ids, _, _ in indexes)
    meter = RateMeter(total)
    done = 0
    for _, ids, vecs, _ in indexes:
        keep = np.array([int(i) in content_of for i in ids], dtype=bool)
        ids, vecs = ids[keep], vecs[keep]
        for start in range(0, len(ids), 256):
            cancel.raise_if_cancelled()
            batch_ids, batch = ids[start:start + 256], vecs[start:start + 256]
            for _, _, _, index in indexes:  # every library's index: a copy may sit in another library
                k = min(SIMILAR_NEIGHBOURS + 1, len(index))
                if k < 1:
                    continue
                for src, (nb_ids, nb_scores) in zip(batch_ids.tolist(), index.query(batch, k), strict=True):
                    a = content_of[src]
                    for nb, score in zip(nb_ids.tolist(), nb_scores.tolist(), strict=True):
                        b = content_of.get(int(nb))
                        if b is None or b == a or score < threshold:
                            continue
                        if comps.find(a) != comps.find(b):
                            links.setdefault(a, []).append(float(score))
                            comps.union(a, b)
            done += len(batch_ids)
            yield meter.progress("similar", done, f"{done}/{total} pictures compared")


def _groups(comps: _Components, near_roots: dict[str, str], by_content: dict[str, list[int]],
            files: dict[int, DuplicateFile], exact: list[str], near_links: dict[str, list[int]],
            similar_links: dict[str, list[float]], near_distance: int | None,
            similar: float | None) -> list[DuplicateGroup]:
    def members(contents: Iterable[str]) -> list[DuplicateFile]:
        return sorted((files[i] for c in contents for i in by_content[c] if i in files), key=lambda f: f.path)

    groups = [DuplicateGroup(KIND_EXACT, members([c]), f"same SHA-256 {c[:12]}…") for c in exact]
    near: dict[str, list[str]] = {}
    for c, root in near_roots.items():
        near.setdefault(root, []).append(c)
    for contents in near.values():
        if len(contents) > 1:
            worst = max((d for c in contents for d in near_links.get(c, [])), default=0)
            groups.append(DuplicateGroup(KIND_NEAR, members(contents),
                                         f"{len(contents)} distinct contents, perceptual hashes at most {worst} of "
                                         f"64 bits apart (limit {near_distance})"))
    if similar is not None:
        for contents in comps.groups().values():
            if len({near_roots[c] for c in contents}) > 1:
                scores = [s for c in contents for s in similar_links.get(c, [])]
                low = min(scores) if scores else similar
                groups.append(DuplicateGroup(KIND_SIMILAR, members(contents),
                                             f"{len({near_roots[c] for c in contents})} different pictures, each "
                                             f"linked at cosine >= {low:.3f} (limit {similar:g})"))
    order = {k: i for i, k in enumerate(KINDS)}
    groups.sort(key=lambda g: (order[g.kind], -g.total_bytes, g.files[0].path))
    return groups


# --------------------------------------------------------------------------- export

CSV_COLUMNS = ("group", "kind", "files_in_group", "group_bytes", "path", "size_bytes", "date", "date_source",
               "width", "height", "sha256", "detail")


def report_csv(report: DuplicateReport) -> str:
    """The list as CSV, one row per file. A file name may start like a spreadsheet formula: every
    cell is quoted and such a cell starts with "'" (engine.text.inert.csv_cell, the OWASP rule)."""
    from engine.text.inert import csv_row

    buf = io.StringIO()
    out = csv.writer(buf, lineterminator="\n", quoting=csv.QUOTE_ALL)
    out.writerow(CSV_COLUMNS)
    for n, g in enumerate(report.groups, start=1):
        for f in g.files:
            out.writerow(csv_row([n, g.kind, len(g.files), g.total_bytes, f.path, f.size, f.date, f.date_source,
                                  f.width if f.width is not None else "", f.height if f.height is not None else "",
                                  f.sha256, g.detail]))
    return buf.getvalue()


def check_export_path(dest: Path | str, library_roots: Iterable[str]) -> Path:
    """`dest` when the list may be written there (a .csv or .json outside every library, not a
    photo), else an error naming it: checked before the job starts."""
    from engine.outputs import OutputPathError, check_output

    dest = Path(dest).expanduser()
    if dest.suffix.lower() not in EXPORT_SUFFIXES:
        raise OutputPathError(f"the duplicates list {dest} must end in .csv or .json", settings=("out",))
    return check_output(dest, what="duplicates list", kind="duplicates", library_roots=library_roots)


def export_report(report: DuplicateReport, dest: Path | str, library_roots: Iterable[str] = ()) -> Path:
    """Write the list as CSV or JSON (by the suffix), atomically: the old file or the new, whole.

    A file name that is not UTF-8 (POSIX names are bytes) is in the JSON as \\udcXX escapes and in
    the CSV as its own bytes, as `ls > list` would write it: both give the exact name back."""
    from engine.text.inert import json_text

    dest = check_export_path(dest, library_roots)
    if dest.suffix.lower() == ".json":
        text = json_text(report.as_dict(), indent=2) + "\n"
    else:
        text = report_csv(report)
    atomic_write_bytes(dest, text.encode("utf-8", "surrogateescape"))
    return dest
