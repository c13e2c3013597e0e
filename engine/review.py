"""Review of captions by annotators: caption files in, verdicts in the catalog, exports out.

A caption file lists (image, caption) pairs, as JSON Lines (`{"image": ..., "caption": ...}`
per line) or CSV with a header row naming the `image` and `caption` columns, read by
engine.text.captions (which lists every accepted key). Relative image paths are taken relative
to the caption file's folder. Bad lines (invalid JSON, a missing
column, an image that does not exist, an empty caption) are reported with their line number
and reason; the rest of the file is reviewed.

A session is one version of a caption file (its bytes): reopening the same unchanged file
resumes where the annotator stopped; an edited file is a new session. Verdicts, though, belong
to the item, not to the session: they are keyed by (image content hash, caption text, sentence
index) (see engine.catalog.review_keys), so whatever else changes in the file (a fixed
malformed line, an added line, reordered lines, another caption edited) every unchanged item
keeps its verdicts, in every session that holds it. A new session marks each item against the
previous version of the same file: "new", "changed" (same image, edited caption: no verdicts
carried over) or "kept". Every verdict is written at once in its own transaction.

Verdicts apply to the whole item (sentence_index None) or to one sentence of the caption,
numbered as `split_sentences` (engine.text.sentences, the grounder's splitter too) splits it;
that split is part of the stored data, so it must stay stable. (Until the shared splitter,
review split at every ". " — "Dr. Smith" made two sentences — while the grounder did not, so
the Review panel tinted rows with other sentences' supports; verdicts stored under the old
numbering on captions with abbreviations now attach to the shared splitter's sentences.)

Sizes are bounded by engine.limits: a line too long to read, a caption over the character or
sentence limit, lines past the line limit are problems of their lines; the rest is reviewed.
"""

from __future__ import annotations

import csv
import hashlib
import io
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import and_, delete, func, insert, select, update

from engine.catalog import Catalog
from engine.catalog.review_keys import IMAGE_CONTENT_PREFIX, caption_hash, image_key
from engine.catalog.schema import review_items, review_sessions, verdicts
from engine.errors import LonglensError
from engine.fileutil import atomic_write_bytes
from engine.text.captions import CSV_SUFFIXES, JSONL_SUFFIXES, RowProblem, open_error_message, read_captions
from engine.text.inert import csv_row, json_text
from engine.text.sentences import split_sentences as _split_sentences

VERDICTS: tuple[str, ...] = ("faithful", "unfaithful", "unsure")
CHANGES: tuple[str, ...] = ("new", "changed", "kept")  # an item against the previous version of its file
MAX_CAPTION_FILE_BYTES = 256 * 1024 * 1024


class ReviewError(LonglensError):
    """A caption file cannot be reviewed at all, or a review action is invalid."""


# --------------------------------------------------------------------------- sentences

def split_sentences(text: str) -> list[tuple[int, int]]:
    """(start, end) character spans of the sentences of `text`: engine.text.sentences, the
    splitter the grounder uses too, so sentence i of a review item is sentence i of its
    grounding (the Review panel tints row i with sentence_supports[i])."""
    return _split_sentences(text)


# --------------------------------------------------------------------------- caption files


@dataclass(frozen=True)
class CaptionLine:
    line_no: int  # 1-based line of the file (for CSV: the line the record starts on)
    image_path: str  # absolute
    caption: str


# A bad line: line number, field and reason (engine.text.captions, the reader every caption
# file goes through); str() is "line N: reason".
CaptionProblem = RowProblem


@dataclass
class CaptionFile:
    path: Path
    file_hash: str
    items: list[CaptionLine] = field(default_factory=list)
    problems: list[CaptionProblem] = field(default_factory=list)


def load_caption_file(path: Path | str) -> CaptionFile:
    """Parse a JSONL or CSV caption file (engine.text.captions: its accepted keys and
    messages); bad lines become `problems`, never exceptions.

    Raises ReviewError only when the file as a whole is unusable (missing, unreadable,
    unknown type, CSV without the needed columns).
    """
    path = Path(path).expanduser().resolve()
    suffix = path.suffix.lower()
    if suffix not in JSONL_SUFFIXES | CSV_SUFFIXES:
        raise ReviewError(f"{path.name}: caption files must be .jsonl or .csv (image, caption)")
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise ReviewError(open_error_message(path, exc)) from None
    if size > MAX_CAPTION_FILE_BYTES:
        raise ReviewError(f"{path} is too large for a caption file ({size / 1e6:.0f} MB)")
    digest = hashlib.sha256()
    out = CaptionFile(path=path, file_hash="")
    fmt = "jsonl" if suffix in JSONL_SUFFIXES else suffix.lstrip(".")
    for row in read_captions(path, fmt, error=ReviewError, on_bytes=digest.update):
        if isinstance(row, RowProblem):
            out.problems.append(row)
        else:
            out.items.append(CaptionLine(row.line_no, str(row.image.resolve()), row.caption or ""))
    out.problems.sort(key=lambda p: p.line_no)
    out.file_hash = digest.hexdigest()
    return out


# --------------------------------------------------------------------------- sessions


@dataclass(frozen=True)
class Verdict:
    verdict: str | None  # None: only a note so far
    note: str = ""
    updated_at: float = 0.0


@dataclass
class ReviewItem:
    id: int
    index: int  # 0-based position in the session
    line_no: int
    image_path: str
    caption: str
    sentences: list[tuple[int, int]]
    verdict: Verdict | None = None  # on the whole item
    sentence_verdicts: dict[int, Verdict] = field(default_factory=dict)
    # Against the previous version of the caption file: "new", "changed" (same image, edited
    # caption) or "kept"; None when there is no previous version to compare with.
    change: str | None = None

    def sentence_text(self, i: int) -> str:
        s, e = self.sentences[i]
        return self.caption[s:e]


@dataclass(frozen=True)
class ChangeSummary:
    """How a version of a caption file differs from the previous one, item by item."""

    new: int = 0
    changed: int = 0
    kept: int = 0

    def __str__(self) -> str:
        return f"{self.new} new, {self.changed} changed, {self.kept} kept"


@dataclass
class ReviewSession:
    id: int
    caption_file: str
    file_hash: str
    position: int
    item_ids: list[int]
    problems: list[CaptionProblem] = field(default_factory=list)
    resumed: bool = False
    # None for the first version of a file (nothing to compare with).
    changes: ChangeSummary | None = None

    def __len__(self) -> int:
        return len(self.item_ids)


@dataclass(frozen=True)
class _ImageKey:
    key: str
    size: int | None
    mtime_ns: int | None


def _image_keys(catalog: Catalog, paths: Iterable[str]) -> dict[str, _ImageKey]:
    """The content key of each image; one already computed for the same file (path, size and
    mtime unchanged) is reused rather than hashing the picture again at every open."""
    stats: dict[str, tuple[int, int] | None] = {}
    for p in dict.fromkeys(paths):
        try:
            st = Path(p).stat()
            stats[p] = (int(st.st_size), int(st.st_mtime_ns))
        except OSError:
            stats[p] = None
    cached: dict[str, str] = {}
    with catalog.read() as conn:
        for p, st in stats.items():
            if st is None:
                continue
            row = conn.execute(
                select(review_items.c.image_key).where(
                    review_items.c.image_path == p,
                    review_items.c.image_size == st[0],
                    review_items.c.image_mtime_ns == st[1],
                    review_items.c.image_key.startswith(IMAGE_CONTENT_PREFIX),
                ).order_by(review_items.c.id.desc()).limit(1)
            ).first()
            if row is not None:
                cached[p] = row[0]
    out = {}
    for p, st in stats.items():
        key = cached.get(p) or image_key(p)
        if not key.startswith(IMAGE_CONTENT_PREFIX):
            st = None  # a path key is never reused: the file may be readable next time
        out[p] = _ImageKey(key, *(st or (None, None)))
    return out


def _changes(new_keys: list[tuple[str, str]], old_keys: list[tuple[str, str]]) -> list[str]:
    """Per item of the new version: kept (same image and caption as an item of the old one),
    changed (an image of the old version whose caption is no longer there) or new."""
    old = set(old_keys)
    new = set(new_keys)
    edited_images = {img for img, cap in old if (img, cap) not in new}
    return ["kept" if k in old else "changed" if k[0] in edited_images else "new" for k in new_keys]


def _item_key_join():
    return and_(verdicts.c.image_key == review_items.c.image_key, verdicts.c.caption_hash == review_items.c.caption_hash)


def open_session(catalog: Catalog, path: Path | str) -> ReviewSession:
    """Load a caption file and resume its session (same file, same content) or create one.

    A new version of a file that was reviewed before keeps every verdict of its unchanged
    items, marks each item new / changed / kept against the previous version, and starts at
    the first item with no verdict on the whole item.
    """
    cf = load_caption_file(path)
    if not cf.items:
        detail = "; ".join(str(p) for p in cf.problems[:5])
        raise ReviewError(f"{cf.path.name} has no usable items" + (f" ({detail})" if detail else ""))
    # Hashing the pictures reads files: done before the write transaction, which then only
    # takes the write lock for the inserts.
    keys = _image_keys(catalog, [it.image_path for it in cf.items])
    item_keys = [(keys[it.image_path].key, caption_hash(it.caption)) for it in cf.items]
    now = time.time()
    with catalog.write() as conn:
        row = conn.execute(
            select(review_sessions.c.id, review_sessions.c.position).where(
                review_sessions.c.caption_file == str(cf.path), review_sessions.c.file_hash == cf.file_hash
            )
        ).first()
        resumed = row is not None
        if row is None:
            previous = conn.execute(
                select(review_sessions.c.id)
                .where(review_sessions.c.caption_file == str(cf.path))
                .order_by(review_sessions.c.updated_at.desc(), review_sessions.c.id.desc())
                .limit(1)
            ).first()
            changes: list[str | None] = [None] * len(cf.items)
            if previous is not None:
                old = [(r[0], r[1]) for r in conn.execute(
                    select(review_items.c.image_key, review_items.c.caption_hash)
                    .where(review_items.c.session_id == previous[0])
                )]
                changes = list(_changes(item_keys, old))
            sid = conn.execute(
                insert(review_sessions).values(
                    caption_file=str(cf.path), file_hash=cf.file_hash, position=0, created_at=now, updated_at=now
                )
            ).inserted_primary_key[0]
            conn.execute(
                insert(review_items),
                [
                    {"session_id": sid, "line_no": it.line_no, "image_path": it.image_path, "caption": it.caption,
                     "image_key": key[0], "caption_hash": key[1], "change": change,
                     "image_size": keys[it.image_path].size, "image_mtime_ns": keys[it.image_path].mtime_ns}
                    for it, key, change in zip(cf.items, item_keys, changes, strict=True)
                ],
            )
            first_open = conn.execute(
                select(review_items.c.line_no)
                .where(review_items.c.session_id == sid)
                .where(~select(verdicts.c.id).where(
                    _item_key_join(), verdicts.c.sentence_index.is_(None), verdicts.c.verdict.is_not(None)
                ).exists())
                .order_by(review_items.c.line_no).limit(1)
            ).first()
            position = 0
            if first_open is not None:
                position = [it.line_no for it in cf.items].index(int(first_open[0]))
            conn.execute(update(review_sessions).where(review_sessions.c.id == sid).values(position=position))
        else:
            sid, position = int(row[0]), int(row[1])
            # Touched, so that the next version of the file is compared with this one.
            conn.execute(update(review_sessions).where(review_sessions.c.id == sid).values(updated_at=now))
        stored = conn.execute(
            select(review_items.c.id, review_items.c.change)
            .where(review_items.c.session_id == sid).order_by(review_items.c.line_no)
        ).all()
    ids = [int(r[0]) for r in stored]
    marks = [r[1] for r in stored]
    summary = None
    if any(m is not None for m in marks):
        summary = ChangeSummary(*(sum(1 for m in marks if m == c) for c in CHANGES))
    position = min(max(position, 0), len(ids) - 1)
    return ReviewSession(int(sid), str(cf.path), cf.file_hash, position, ids, cf.problems, resumed, summary)


def _verdicts_for(conn, item_ids: Iterable[int]) -> dict[int, list]:
    """item id -> its verdict rows (found through the item's image and caption keys)."""
    ids = list(item_ids)
    out: dict[int, list] = {}
    for start in range(0, len(ids), 900):
        q = (
            select(review_items.c.id.label("item_id"), verdicts)
            .select_from(review_items.join(verdicts, _item_key_join()))
            .where(review_items.c.id.in_(ids[start : start + 900]))
        )
        for r in conn.execute(q):
            out.setdefault(int(r.item_id), []).append(r)
    return out


def _to_item(row, index: int, vrows: list) -> ReviewItem:
    item = ReviewItem(
        id=int(row.id),
        index=index,
        line_no=int(row.line_no),
        image_path=row.image_path,
        caption=row.caption,
        sentences=split_sentences(row.caption),
        change=row.change,
    )
    for v in vrows:
        verdict = Verdict(v.verdict, v.note, float(v.updated_at))
        if v.sentence_index is None:
            item.verdict = verdict
        else:
            item.sentence_verdicts[int(v.sentence_index)] = verdict
    return item


def session_items(catalog: Catalog, session: ReviewSession) -> list[ReviewItem]:
    """Every item of the session, in file order, with its verdicts."""
    with catalog.read() as conn:
        rows = conn.execute(
            select(review_items).where(review_items.c.session_id == session.id).order_by(review_items.c.line_no)
        ).all()
        vs = _verdicts_for(conn, [r.id for r in rows])
    return [_to_item(r, i, vs.get(int(r.id), [])) for i, r in enumerate(rows)]


def get_item(catalog: Catalog, session: ReviewSession, index: int) -> ReviewItem:
    if not 0 <= index < len(session.item_ids):
        raise ReviewError(f"no item {index + 1} in this session of {len(session.item_ids)} items")
    item_id = session.item_ids[index]
    with catalog.read() as conn:
        row = conn.execute(select(review_items).where(review_items.c.id == item_id)).first()
        if row is None:
            raise ReviewError("this review session was removed from the catalog")
        vs = _verdicts_for(conn, [item_id])
    return _to_item(row, index, vs.get(item_id, []))


def set_verdict(
    catalog: Catalog, item_id: int, sentence_index: int | None, verdict: str | None, note: str = ""
) -> None:
    """Record (or replace) the verdict on an item or one of its sentences, committed at once.

    The verdict is stored under the item's (image, caption) keys, so every session holding the
    same image and caption sees it. `verdict` None with an empty note clears it; None with a
    note keeps just the note.
    """
    if verdict is not None and verdict not in VERDICTS:
        raise ReviewError(f"unknown verdict {verdict!r}; use one of {', '.join(VERDICTS)}")
    note = note or ""
    with catalog.write() as conn:
        row = conn.execute(
            select(review_items.c.caption, review_items.c.image_key, review_items.c.caption_hash)
            .where(review_items.c.id == item_id)
        ).first()
        if row is None:
            raise ReviewError(f"no review item {item_id}")
        caption, img_key, cap_hash = row
        if sentence_index is not None and not 0 <= sentence_index < len(split_sentences(caption)):
            raise ReviewError(f"item {item_id} has no sentence {sentence_index}")
        target = (verdicts.c.image_key == img_key) & (verdicts.c.caption_hash == cap_hash)
        target = target & (
            verdicts.c.sentence_index.is_(None) if sentence_index is None else verdicts.c.sentence_index == sentence_index
        )
        conn.execute(delete(verdicts).where(target))
        if verdict is not None or note.strip():
            conn.execute(
                insert(verdicts).values(
                    image_key=img_key, caption_hash=cap_hash, sentence_index=sentence_index, verdict=verdict,
                    note=note, updated_at=time.time()
                )
            )


def set_position(catalog: Catalog, session: ReviewSession, position: int) -> None:
    position = min(max(int(position), 0), max(len(session.item_ids) - 1, 0))
    with catalog.write() as conn:
        conn.execute(
            update(review_sessions)
            .where(review_sessions.c.id == session.id)
            .values(position=position, updated_at=time.time())
        )
    session.position = position


def progress(catalog: Catalog, session: ReviewSession) -> tuple[int, int]:
    """(items with a whole-item verdict, items in the session)."""
    with catalog.read() as conn:
        done = conn.execute(
            select(func.count(func.distinct(review_items.c.id)))
            .select_from(review_items.join(verdicts, _item_key_join()))
            .where(
                review_items.c.session_id == session.id,
                verdicts.c.sentence_index.is_(None),
                verdicts.c.verdict.is_not(None),
            )
        ).scalar()
    return int(done or 0), len(session.item_ids)


# --------------------------------------------------------------------------- export


def _v(v: Verdict | None) -> tuple[str | None, str]:
    return (v.verdict, v.note) if v is not None else (None, "")


def export_session(catalog: Catalog, session: ReviewSession, dest: Path | str, fmt: str | None = None) -> int:
    """Write the session's items and verdicts as JSONL or CSV (by `fmt` or dest's suffix), atomically.

    JSONL: one object per item with its verdict, note and a list of sentences with theirs.
    CSV: one row per item (scope "item") followed by one row per sentence (scope "sentence").
    Returns the number of items written.
    """
    dest = Path(dest).expanduser()
    fmt = (fmt or dest.suffix.lstrip(".")).lower()
    if fmt in ("jsonl", "ndjson", "json"):
        fmt = "jsonl"
    if fmt not in ("jsonl", "csv"):
        raise ReviewError(f"export to .jsonl or .csv, not {dest.name!r}")
    items = session_items(catalog, session)
    if fmt == "jsonl":
        lines = []
        for it in items:
            verdict, note = _v(it.verdict)
            sentences = []
            for i in range(len(it.sentences)):
                sv, sn = _v(it.sentence_verdicts.get(i))
                sentences.append({"index": i, "text": it.sentence_text(i), "verdict": sv, "note": sn})
            lines.append(json_text({
                "line": it.line_no, "image": it.image_path, "caption": it.caption,
                "verdict": verdict, "note": note, "sentences": sentences,
            }))
        text = "\n".join(lines) + ("\n" if lines else "")
    else:
        # Captions, notes and file names come from the user: a spreadsheet would run one that
        # starts like a formula. Every cell is quoted and such a cell starts with "'" (csv_cell).
        buf = io.StringIO(newline="")
        w = csv.writer(buf, lineterminator="\n", quoting=csv.QUOTE_ALL)
        w.writerow(["line", "image", "scope", "sentence_index", "text", "verdict", "note"])
        for it in items:
            verdict, note = _v(it.verdict)
            w.writerow(csv_row([it.line_no, it.image_path, "item", "", it.caption, verdict or "", note]))
            for i in range(len(it.sentences)):
                sv, sn = _v(it.sentence_verdicts.get(i))
                w.writerow(csv_row([it.line_no, it.image_path, "sentence", i, it.sentence_text(i), sv or "", sn]))
        text = buf.getvalue()
    try:
        # A path that is not UTF-8 (POSIX names are bytes) goes in as its own bytes; the JSONL
        # has it as \udcXX escapes (json_text). Both give the exact name back.
        atomic_write_bytes(dest, text.encode("utf-8", "surrogateescape"))
    except OSError as exc:
        raise ReviewError(f"cannot write {dest}: {exc.strerror or exc}") from None
    return len(items)
