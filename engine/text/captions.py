"""The one reader of caption files, and the one mapping of a failed open to a message.

Review (`engine.review`), grounding's `check` (`engine.grounding.items.read_items`), datagen's
image lists (`engine.datagen.inputs`) read (image, caption) files here; the training data
reader (`engine.training.data`) reads its lines through `text_lines` for the same bounds and
open-error messages.

Accepted input (a superset of what each reader took before):

* JSON Lines (.jsonl, .jsonlines, .ndjson, .json): one object per line; the image under the
  first present key of IMAGE_KEYS (image, image_path, path, file, filename), the caption under
  the first present key of CAPTION_KEYS (caption, text, paragraph, description,
  original_caption); keys are matched case-insensitively. Blank lines are skipped.
* CSV (.csv) / TSV (.tsv): a header row naming those columns (any of the keys above), or, with
  no header, two or more columns image, caption (a caption holding the delimiter unquoted is
  joined back). A record is numbered by the line it starts on.
* plain lists (format "lines", only where the caller allows it): one image path per line,
  '#' starts a comment; no captions.

Relative image paths are taken relative to the caption file's folder. Reads are streamed line
by line within engine.limits (an over-long line, a line that is not UTF-8, lines past the line
limit are problems of their lines) through engine.fileutil's safe open (a FIFO, device or
folder is refused at once). A bad line is a `RowProblem` (line, field, reason), never an
exception; only a file unusable as a whole raises (the caller's error class).
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine import limits
from engine.errors import LonglensError
from engine.jsonfile import JsonTooDeepError, loads_bounded

__all__ = [
    "CAPTION_KEYS", "CSV_SUFFIXES", "IMAGE_KEYS", "JSONL_SUFFIXES", "CaptionFileError", "CaptionRow",
    "RowProblem", "open_error_message", "read_captions", "text_lines",
]

IMAGE_KEYS = ("image", "image_path", "path", "file", "filename")
CAPTION_KEYS = ("caption", "text", "paragraph", "description", "original_caption")
JSONL_SUFFIXES = frozenset({".jsonl", ".jsonlines", ".ndjson", ".json"})
CSV_SUFFIXES = frozenset({".csv", ".tsv"})


class CaptionFileError(LonglensError):
    """A caption file cannot be read at all (missing, unreadable, no usable header)."""


def open_error_message(path: Path | str, exc: OSError, label: str = "") -> str:
    """What a person is told when `path` cannot be opened or read: one wording everywhere.

    `label` names what the file is for ("training data", "the image list"), put before the path.
    """
    from engine.fileutil import NotARegularFileError

    what = f"{label} {path}" if label else str(path)
    if isinstance(exc, FileNotFoundError):
        return f"{what} does not exist"
    if isinstance(exc, NotARegularFileError):
        return f"{label} {exc}" if label else str(exc)
    return f"cannot read {what}: {exc.strerror or exc}"


def text_lines(path: Path | str, *, label: str = "", error: type[Exception] = CaptionFileError,
               split_cr: bool = False, on_bytes: Callable[[bytes], None] | None = None) -> Iterator[limits.TextLine]:
    """The file's lines within engine.limits (see limits.iter_text_lines); a file that cannot be
    opened or read raises `error` with open_error_message's wording."""
    try:
        yield from limits.iter_text_lines(path, split_cr=split_cr, on_bytes=on_bytes)
    except OSError as exc:
        raise error(open_error_message(path, exc, label)) from None


@dataclass(frozen=True)
class CaptionRow:
    line_no: int  # 1-based; for CSV the line the record starts on
    image_ref: str  # as written, stripped
    image: Path  # absolute (relative refs joined to the file's folder), not resolved
    caption: str | None  # stripped; None where the source has none (plain lists, optional captions)
    #: The record's other keys or columns (lower-cased names, values as read), e.g. a label.
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class RowProblem:
    line_no: int
    field: str  # "line", "image" or "caption"
    reason: str

    def format(self, path: Path | str) -> str:
        """FILE:LINE: FIELD: REASON."""
        return f"{path}:{self.line_no}: {self.field}: {self.reason}"

    def __str__(self) -> str:
        return f"line {self.line_no}: {self.reason}"


def _first(obj: dict[str, Any], keys: tuple[str, ...]) -> tuple[bool, Any]:
    for k in keys:
        if k in obj:
            return True, obj[k]
    return False, None


def _row(line_no: int, obj: dict[str, Any], base: Path, *, caption_required: bool,
         check_image: bool, empty_ok: bool = False) -> CaptionRow | RowProblem:
    lower = {str(k).strip().lower(): v for k, v in obj.items()}
    has_img, img = _first(lower, IMAGE_KEYS)
    has_cap, cap = _first(lower, CAPTION_KEYS)
    if not has_img or img is None or (isinstance(img, str) and not img.strip()):
        return RowProblem(line_no, "image", f"no image path (expected one of: {', '.join(IMAGE_KEYS)})")
    if not isinstance(img, str):
        return RowProblem(line_no, "image", f"the image path is not text (got {type(img).__name__})")
    if cap is None:
        if caption_required:
            return RowProblem(line_no, "caption", f"no caption (expected one of: {', '.join(CAPTION_KEYS)})")
    elif not isinstance(cap, str):
        return RowProblem(line_no, "caption", f"the caption is not text (got {type(cap).__name__})")
    if isinstance(cap, str):
        # The limits apply to the text as written (the bound on what is held), before the strip.
        too_big = limits.caption_problem(cap)
        if too_big is not None:
            return RowProblem(line_no, "caption", too_big)
    caption = cap.strip() if isinstance(cap, str) else None
    if not caption:
        if caption_required and not (empty_ok and isinstance(cap, str)):
            return RowProblem(line_no, "caption", "empty caption")
        caption = "" if isinstance(cap, str) and caption_required else None
    ref = img.strip()
    p = Path(ref).expanduser()
    if not p.is_absolute():
        p = base / p
    if check_image:
        try:
            exists = p.is_file()
        except OSError:
            exists = False
        if not exists:
            return RowProblem(line_no, "image", f"image not found: {ref}")
    extra = {k: v for k, v in lower.items() if k not in IMAGE_KEYS and k not in CAPTION_KEYS}
    return CaptionRow(line_no, ref, p, caption, extra)


def _jsonl(lines: Iterable[limits.TextLine], base: Path, **kw: bool) -> Iterator[CaptionRow | RowProblem]:
    for line in lines:
        if line.problem is not None:
            yield RowProblem(line.line_no, "line", line.problem)
            continue
        # Split on "\n" only (iter_text_lines does): str.splitlines() would also break at U+2028
        # and friends, which a JSON string may hold, and shift every later line number.
        text = line.text.removesuffix("\n").removesuffix("\r")
        if not text.strip():
            continue
        try:
            obj = loads_bounded(text, f"line {line.line_no}")
        except JsonTooDeepError as exc:
            yield RowProblem(line.line_no, "line", f"nests deeper than {exc.limit} levels (the limit); not read")
            continue
        except ValueError as exc:
            yield RowProblem(line.line_no, "line", f"not valid JSON ({getattr(exc, 'msg', exc)})")
            continue
        if not isinstance(obj, dict):
            yield RowProblem(line.line_no, "line", "expected a JSON object with an image path and a caption")
            continue
        yield _row(line.line_no, obj, base, **kw)


def _csv(lines: Iterable[limits.TextLine], path: Path, base: Path, delimiter: str, error: type[Exception],
         label: str, *, caption_required: bool, check_image: bool,
         empty_ok: bool = False) -> Iterator[CaptionRow | RowProblem]:
    unread: list[RowProblem] = []

    def texts() -> Iterator[str]:
        # A line that cannot be read stands in as an empty line, so csv's line numbers stay the file's.
        for line in lines:
            if line.problem is not None:
                unread.append(RowProblem(line.line_no, "line", line.problem))
            yield line.text

    what = f"{label} {path}" if label else str(path)
    reader = csv.reader(texts(), delimiter=delimiter)
    header: list[str] | None = None
    first = True
    while True:
        line_no = reader.line_num + 1
        row: list[str] | csv.Error | None
        try:
            row = next(reader)
        except StopIteration:
            row = None
        except csv.Error as exc:
            row = exc
        pending, unread[:] = list(unread), []
        yield from pending
        if row is None:
            if first:
                raise error(f"{what} is empty")
            return
        if isinstance(row, csv.Error):
            if first:
                raise error(f"{what}:1: {row}")
            yield RowProblem(line_no, "line", f"malformed CSV ({row})")
            continue
        if first:
            first = False
            names = [c.strip().lower() for c in row]
            if any(n in IMAGE_KEYS or n in CAPTION_KEYS for n in names):
                missing = [k for k, keys in (("image", IMAGE_KEYS), ("caption", CAPTION_KEYS))
                           if not any(n in keys for n in names) and (k == "image" or caption_required)]
                if missing:
                    raise error(
                        f"{what}:1: the header has no {' or '.join(repr(m) for m in missing)} column "
                        f"(found: {', '.join(repr(h) for h in row) or 'nothing'})")
                header = names
                continue
        if not row or all(not c.strip() for c in row):
            continue
        if header is not None:
            need = max(i for i, n in enumerate(header) if n in IMAGE_KEYS or n in CAPTION_KEYS) + 1
            if len(row) < need:
                yield RowProblem(line_no, "line", f"expected {len(header)} columns, found {len(row)}")
                continue
            obj = {header[j]: row[j] for j in range(min(len(header), len(row))) if header[j]}
        elif len(row) >= 2:
            obj = {"image": row[0], "caption": delimiter.join(row[1:])}
        elif not caption_required:
            obj = {"image": row[0]}
        else:
            yield RowProblem(line_no, "line", "expected two columns: image path, caption")
            continue
        yield _row(line_no, obj, base, caption_required=caption_required, check_image=check_image,
                   empty_ok=empty_ok)


def _plain(lines: Iterable[limits.TextLine], base: Path, check_image: bool) -> Iterator[CaptionRow | RowProblem]:
    for line in lines:
        if line.problem is not None:
            yield RowProblem(line.line_no, "line", line.problem)
            continue
        text = line.text.strip()
        if text and not text.startswith("#"):
            yield _row(line.line_no, {"image": text}, base, caption_required=False, check_image=check_image)


def sniff_format(path: Path, *, label: str = "", error: type[Exception] = CaptionFileError,
                 fallback: str = "csv") -> str:
    """"jsonl", "csv", "tsv" by the suffix; for another suffix, by the first bytes: JSON Lines when
    the file starts with '{', CSV when its first 4 KiB hold a comma, else `fallback`. (The suffix
    decides when it names a format: sniffing a .jsonl whose first line is broken would read every
    good line as CSV.)"""
    from engine.fileutil import open_user_file

    suffix = path.suffix.lower()
    if suffix in JSONL_SUFFIXES:
        return "jsonl"
    if suffix in CSV_SUFFIXES:
        return suffix.lstrip(".")
    try:
        with open_user_file(path) as fh:
            head = fh.read(4096)
    except OSError as exc:
        raise error(open_error_message(path, exc, label)) from None
    if head.lstrip().removeprefix(b"\xef\xbb\xbf").lstrip().startswith(b"{"):
        return "jsonl"
    return "csv" if b"," in head else fallback


def read_captions(
    path: Path | str,
    fmt: str | None = None,
    *,
    caption_required: bool = True,
    check_image: bool = True,
    empty_ok: bool = False,
    label: str = "",
    error: type[Exception] = CaptionFileError,
    on_bytes: Callable[[bytes], None] | None = None,
) -> Iterator[CaptionRow | RowProblem]:
    """The rows of a caption file, streamed in file order: a CaptionRow per usable line, a
    RowProblem per bad one (an unreadable line, invalid JSON, a missing key, a caption over the
    limits, an empty caption unless empty_ok, with check_image an image that is not a file).

    fmt: "jsonl", "csv", "tsv" or "lines" (plain list of paths); None: sniff_format. Raises
    `error` (open_error_message's wording, or a CSV without a usable header) when the file as a
    whole cannot be used.
    """
    path = Path(path).expanduser()
    fmt = fmt or sniff_format(path, label=label, error=error)
    base = path.absolute().parent
    lines = text_lines(path, label=label, error=error, split_cr=fmt in ("csv", "tsv"), on_bytes=on_bytes)
    if fmt == "jsonl":
        yield from _jsonl(lines, base, caption_required=caption_required, check_image=check_image,
                          empty_ok=empty_ok)
    elif fmt in ("csv", "tsv"):
        yield from _csv(lines, path, base, "\t" if fmt == "tsv" else ",", error, label,
                        caption_required=caption_required, check_image=check_image, empty_ok=empty_ok)
    elif fmt == "lines":
        yield from _plain(lines, base, check_image)
    else:
        raise ValueError(f"unknown caption file format {fmt!r}")
