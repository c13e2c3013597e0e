"""The inputs of `longlens ground` and `longlens check`: caption files (JSONL or CSV, one image
and caption per line), the caption text and the image, each refused with a message a person can
act on."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from engine import limits
from engine.errors import LonglensError


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
    """(line number, {"image", "caption"} or None, error or None) for each data line, read by
    engine.text.captions (the one caption-file reader: its keys, bounds and messages)."""
    from engine.text.captions import RowProblem, read_captions

    # Image and caption are taken as found: a missing image or an empty caption is reported
    # when the line is checked.
    for row in read_captions(path, check_image=False, empty_ok=True, error=LonglensError):
        if isinstance(row, RowProblem):
            yield row.line_no, None, row.reason
        else:
            yield row.line_no, {"image": str(row.image), "caption": row.caption or ""}, None
