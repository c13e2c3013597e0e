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
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine import limits
from engine.errors import LonglensError
from engine.fileutil import UserFile, fsync_dir, open_user_file
from engine.jsonfile import loads_bounded

_TAIL_CHUNK = 1 << 20


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


def _tail_start(fh: UserFile) -> int:
    """Where the bytes after the file's last newline begin (0 when it has none), found by reading
    back from the end in 1 MiB steps: only the tail is read, never the whole file."""
    pos = fh.size
    while pos > 0:
        start = max(0, pos - _TAIL_CHUNK)
        fh.seek(start)
        i = fh.read(pos - start).rfind(b"\n")
        if i >= 0:
            return start + i + 1
        pos = start
    return 0


def recover(path: Path) -> ResumeState:
    """Cut a torn last line off `path` (if any) and list the images its complete lines hold.

    Memory stays bounded whatever the file's size: the tail is found by reading back from the end,
    and the complete lines are read one at a time within engine.limits' line limits."""
    state = ResumeState()
    if not path.exists():
        return state
    if not path.is_file():
        raise OutputError(f"the training data file {path} is not a file", settings=("out",))
    try:
        # Checked on the open descriptor: never blocks on a FIFO or device.
        with open_user_file(path) as fh:
            size = fh.size
            end = _tail_start(fh)
            tail = b""
            if end < size and size - end <= limits.MAX_LINE_BYTES:
                fh.seek(end)
                tail = fh.read(size - end)
    except OSError as exc:
        raise OutputError(f"cannot read {path}: {exc}") from None
    if end < size:
        if tail and _is_whole_line(tail):
            # Only the newline is missing (a hand-edited file, or a kill between the last byte and
            # the newline): the line is whole, so it is kept and finished instead of cut.
            with open(path, "ab") as fh:
                fh.write(b"\n")
                fh.flush()
                os.fsync(fh.fileno())
        else:
            state.torn_bytes = size - end
            with open(path, "r+b") as fh:
                fh.truncate(end)
                fh.flush()
                os.fsync(fh.fileno())
    base = path.resolve().parent
    try:
        # Every line is kept (a run may pass engine.limits.MAX_FILE_LINES); each within the line limit.
        for line in limits.iter_raw_lines(path, max_lines=sys.maxsize):
            n = line.line_no
            if line.data is None:
                raise OutputError(f"{path}:{n}: {line.problem}; fix or remove that line, or write to another file",
                                  settings=("out",))
            if not line.data.strip():
                continue
            try:
                obj = loads_bounded(line.data, f"line {n}", encoding="utf-8-sig" if n == 1 else "utf-8")
            except (UnicodeDecodeError, ValueError) as exc:
                raise OutputError(f"{path}:{n}: not a valid JSON line ({exc}); fix or remove that line, "
                                  "or write to another file", settings=("out",)) from None
            ref = obj.get("image") if isinstance(obj, dict) else None
            if not isinstance(ref, str) or not ref.strip():
                raise OutputError(f"{path}:{n}: image: missing; this does not look like a training JSONL")
            state.done.add(image_key(ref, base))
            state.lines += 1
    except OSError as exc:
        raise OutputError(f"cannot read {path}: {exc}") from None
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
