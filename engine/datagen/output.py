"""The pipeline's output: a training JSONL that grows one complete line at a time.

Crash safety without rewriting the file: each line goes out in a single write to a file opened
with O_APPEND, then flush + fsync, so after a crash the file holds whole lines plus at most one
unterminated tail (a write cut short by kill -9 or a power loss). On resume that tail is detected
(the file does not end with a newline, and the tail is not a whole JSON object) and cut off; every
complete line is kept, and its image is skipped. A complete line that is not valid JSON is not ours to repair: it stops the run with
its line number instead of being dropped.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.errors import LonglensError
from engine.fileutil import fsync_dir
from engine.jsonfile import loads_bounded


class OutputError(LonglensError):
    """The output file exists but cannot be resumed safely."""


@dataclass
class ResumeState:
    done: set[Path] = field(default_factory=set)  # resolved image paths already in the file
    lines: int = 0
    torn_bytes: int = 0  # size of the unterminated tail that was cut off (0: none)


def image_key(ref: str, base_dir: Path) -> Path:
    p = Path(ref)
    return (p if p.is_absolute() else base_dir / p).resolve()


def _is_whole_line(raw: bytes) -> bool:
    try:
        obj = loads_bounded(raw, "the line")
    except (UnicodeDecodeError, ValueError):
        return False
    return isinstance(obj, dict) and isinstance(obj.get("image"), str)


def recover(path: Path) -> ResumeState:
    """Cut a torn last line off `path` (if any) and list the images its complete lines hold."""
    state = ResumeState()
    if not path.exists():
        return state
    if not path.is_file():
        raise OutputError(f"the training data file {path} is not a file", settings=("out",))
    from engine.fileutil import read_user_file

    try:
        data = read_user_file(path)  # checked on the open descriptor: never blocks on a FIFO or device
    except OSError as exc:
        raise OutputError(f"cannot read {path}: {exc}") from None
    end = data.rfind(b"\n") + 1  # 0 when there is no complete line at all
    if end < len(data):
        if _is_whole_line(data[end:]):
            # Only the newline is missing (a hand-edited file, or a kill between the last byte and
            # the newline): the line is whole, so it is kept and finished instead of cut.
            with open(path, "ab") as fh:
                fh.write(b"\n")
                fh.flush()
                os.fsync(fh.fileno())
            data += b"\n"
        else:
            state.torn_bytes = len(data) - end
            with open(path, "r+b") as fh:
                fh.truncate(end)
                fh.flush()
                os.fsync(fh.fileno())
            data = data[:end]
    base = path.resolve().parent
    for n, raw in enumerate(data.split(b"\n")[:-1], start=1):
        if not raw.strip():
            continue
        try:
            obj = loads_bounded(raw, f"line {n}", encoding="utf-8-sig" if n == 1 else "utf-8")
        except (UnicodeDecodeError, ValueError) as exc:
            raise OutputError(f"{path}:{n}: not a valid JSON line ({exc}); fix or remove that line, "
                              "or write to another file", settings=("out",)) from None
        ref = obj.get("image") if isinstance(obj, dict) else None
        if not isinstance(ref, str) or not ref.strip():
            raise OutputError(f"{path}:{n}: image: missing; this does not look like a training JSONL")
        state.done.add(image_key(ref, base))
        state.lines += 1
    return state


class LineAppender:
    """Appends one JSON object per call as one complete, fsynced line."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        existed = self.path.exists()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        if not existed:
            fsync_dir(self.path.parent)  # the new file's name survives a crash too

    def append(self, row: dict[str, Any]) -> str:
        line = json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n"
        data = line.encode("utf-8")
        view = memoryview(data)
        while view:  # a regular-file write is complete in practice; loop in case it is not
            written = os.write(self._fd, view)
            view = view[written:]
        os.fsync(self._fd)
        return line

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> LineAppender:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
