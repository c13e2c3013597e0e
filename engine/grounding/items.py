"""The inputs of `longlens ground` and `longlens check`: caption files (JSONL or CSV, one image
and caption per line), the caption text and the image, each refused with a message a person can
act on."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from engine import limits
from engine.errors import LonglensError

IMAGE_KEYS = ("image", "image_path", "path", "file", "filename")
CAPTION_KEYS = ("caption", "text", "paragraph", "description")


def load_image(path: Path) -> Any:
    from engine.errors import DecodeError
    from engine.indexing.decode import decode_image

    if not path.exists():
        raise LonglensError(f"image not found: {path}")
    if not path.is_file():
        raise LonglensError(f"not a file: {path}")
    try:
        image, _ = decode_image(path)
    except DecodeError as exc:
        raise LonglensError(f"cannot read image {path}: {exc}") from None
    return image


def check_caption(text: str) -> str:
    if not isinstance(text, str) or not text.strip():
        raise LonglensError("the caption is empty")
    too_big = limits.caption_problem(text)
    if too_big is not None:
        raise LonglensError(too_big)
    if not any(ch.isalnum() for ch in text):
        raise LonglensError("the caption has no words")
    return text


def read_items(path: Path) -> Iterator[tuple[int, dict[str, Any] | None, str | None]]:
    """(line number, {"image", "caption"} or None, error or None) for each data line.

    JSONL: an object per line with an image key (image, image_path, path, file) and a caption
    key (caption, text, paragraph). CSV: a header naming those columns, or two unnamed
    columns image,caption. Relative image paths are relative to the file's folder.
    """
    from engine.fileutil import NotARegularFileError, open_user_file

    # Read line by line within engine.limits: a 2 GB line or a file of millions of lines is
    # reported, never read whole into memory. The open never blocks on a FIFO or device.
    try:
        with open_user_file(path) as fh:
            head = fh.read(4096)
    except FileNotFoundError:
        raise LonglensError(f"input file not found: {path}") from None
    except NotARegularFileError as exc:
        raise LonglensError(str(exc)) from None
    except OSError as exc:
        raise LonglensError(f"cannot read {path}: {exc.strerror or exc}") from None
    base = path.parent
    # The suffix decides when it names a format: sniffing a .jsonl file whose first line is
    # broken would read every good line as CSV.
    suffix = path.suffix.lower()
    is_csv = suffix == ".csv" or (
        suffix not in (".jsonl", ".json", ".jsonlines", ".ndjson")
        and not head.lstrip().removeprefix(b"\xef\xbb\xbf").lstrip().startswith(b"{") and b"," in head)
    lines = _text_lines(path, split_cr=is_csv)
    if is_csv:
        yield from _read_csv(lines, base)
        return
    # Split on "\n" only: str.splitlines() also breaks at U+2028, U+0085, form feeds, ..., which a
    # JSON string may hold, and would cut such a line in two and shift every later line number.
    for n, line, problem in lines:
        if problem is not None:
            yield n, None, problem
            continue
        line = line.removesuffix("\n").removesuffix("\r")
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            yield n, None, f"not valid JSON ({exc.msg})"
            continue
        if not isinstance(obj, dict):
            yield n, None, "expected a JSON object with an image path and a caption"
            continue
        yield n, *_pick(obj, base)


def _text_lines(path: Path, split_cr: bool) -> Iterator[tuple[int, str, str | None]]:
    """(line number, text with its newline, None) per line, or (line number, "\n", reason) for a
    line that cannot be read (too long, not UTF-8, past the line limit)."""
    try:
        for line in limits.iter_text_lines(path, split_cr=split_cr):
            yield line.line_no, line.text, line.problem
    except OSError as exc:
        raise LonglensError(f"cannot read {path}: {exc.strerror or exc}") from None


def _pick(obj: dict[str, Any], base: Path) -> tuple[dict[str, Any] | None, str | None]:
    lower = {str(k).lower(): v for k, v in obj.items()}
    img = next((lower[k] for k in IMAGE_KEYS if k in lower), None)
    cap = next((lower[k] for k in CAPTION_KEYS if k in lower), None)
    if img is None or (isinstance(img, str) and not img.strip()):
        return None, f"no image path (expected one of: {', '.join(IMAGE_KEYS)})"
    if cap is None:
        return None, f"no caption (expected one of: {', '.join(CAPTION_KEYS)})"
    if not isinstance(img, str) or not isinstance(cap, str):
        return None, "image path and caption must be strings"
    too_big = limits.caption_problem(cap)
    if too_big is not None:
        return None, too_big
    p = Path(img).expanduser()
    return {"image": str(p if p.is_absolute() else base / p), "caption": cap}, None


def _read_csv(lines: Iterator[tuple[int, str, str | None]], base: Path
              ) -> Iterator[tuple[int, dict[str, Any] | None, str | None]]:
    # Numbered by the line each record starts on (a quoted caption may span lines), and a
    # malformed record (e.g. a field over the csv module's size limit) is reported, not raised.
    # A line that could not be read stands in as an empty line (its problem is reported first).
    unread: list[tuple[int, str]] = []

    def texts() -> Iterator[str]:
        for n, text, problem in lines:
            if problem is not None:
                unread.append((n, problem))
            yield text

    reader = csv.reader(texts())
    header: list[str] = []
    has_header: bool | None = None
    while True:
        k = reader.line_num + 1
        row: list[str] | csv.Error | None
        try:
            row = next(reader)
        except StopIteration:
            row = None
        except csv.Error as exc:
            row = exc
        pending, unread[:] = list(unread), []
        yield from ((n, None, problem) for n, problem in pending)
        if row is None:
            return
        if isinstance(row, csv.Error):
            yield k, None, f"malformed CSV ({row})"
            continue
        if has_header is None:
            header = [c.strip().lower() for c in row]
            has_header = any(h in header for h in IMAGE_KEYS) or any(h in header for h in CAPTION_KEYS)
            if has_header:
                continue
        if not row or all(not c.strip() for c in row):
            continue
        if has_header:
            obj = {header[j]: row[j] for j in range(min(len(header), len(row)))}
        elif len(row) >= 2:
            obj = {"image": row[0], "caption": ",".join(row[1:])}
        else:
            yield k, None, "expected two columns: image path, caption"
            continue
        yield k, *_pick(obj, base)
