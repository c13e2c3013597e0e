"""The one bounded way to read a JSON file a user or a model supplies (reliability checklist 33, 43).

A JSON file is read whole and parsed into nested objects, so two things about it are the
supplier's to choose and must be bounded before any work is done:

* its size, checked on the open descriptor before a byte is read (engine.fileutil.read_user_file:
  a FIFO or device never blocks, a 1 GiB `preprocessor_config.json` is refused, not read);
* its nesting depth, checked by a scan of the bytes *before* json.loads: the parser and every later
  walk (copy.deepcopy, transformers' config classes, json.dumps when the file is written back)
  recurse once per level, so a valid file nested 100,000 deep ends in a RecursionError traceback
  somewhere far from the file. The scan is linear, in C (regular expressions, bytes.translate,
  numpy's cumulative sum), and costs a few milliseconds a megabyte.

Both refusals name the file and the limit: FileTooLargeError (an OSError, from engine.fileutil)
and JsonTooDeepError (a ValueError, as json.JSONDecodeError is), so a caller's existing
`except (OSError, ValueError)` turns them into its own error with the reason kept. The limits
themselves, per kind of file and why, are in engine/limits.py.
"""

from __future__ import annotations

import json
import os
from typing import Any

from engine.fileutil import FileTooLargeError, read_user_file
from engine.limits import MAX_NESTING_DEPTH

__all__ = [
    "FileTooLargeError",
    "JsonTooDeepError",
    "check_file_size",
    "check_json_depth",
    "json_depth",
    "loads_bounded",
    "read_json_file",
]


class JsonTooDeepError(ValueError):
    """A JSON text nests deeper than its limit (nothing of it was parsed)."""

    def __init__(self, source: os.PathLike[str] | str, limit: int) -> None:
        self.source = os.fspath(source)
        self.limit = limit
        super().__init__(f"{self.source} nests deeper than {limit} levels of arrays and objects "
                         f"(the limit is {limit}); not read")


_SCAN_CHUNK = 1 << 22
_QUOTE, _BACKSLASH = 0x22, 0x5C


def json_depth(data: bytes | str, stop_above: int | None = None) -> int:
    """The deepest nesting of arrays and objects in a JSON text (0 for a bare value), brackets
    inside strings not counted. With `stop_above`, counting may stop at the first point deeper
    than it (the result is then just some value above it)."""
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")
    opens = data.count(b"[") + data.count(b"{")
    if stop_above is not None and opens <= stop_above:
        return opens  # cannot nest deeper than it opens (the usual case: no scan at all)
    if b"\\" in data:
        # Escapes only matter where they hide a quote. Dropping every escaped backslash first, left to
        # right as a JSON reader pairs them, leaves each remaining backslash escaping the byte after
        # it, so dropping the escaped quotes next leaves only the quotes that open and close strings.
        data = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    import numpy as np

    deepest, level, quotes = 0, 0, 0
    for start in range(0, len(data), _SCAN_CHUNK):
        chunk = np.frombuffer(data, dtype=np.uint8, count=min(_SCAN_CHUNK, len(data) - start), offset=start)
        quote_at = np.flatnonzero(chunk == _QUOTE)
        bracket_at = np.flatnonzero((chunk == 0x5B) | (chunk == 0x5D) | (chunk == 0x7B) | (chunk == 0x7D))
        # A bracket is inside a string when an odd number of quotes comes before it.
        outside = (np.searchsorted(quote_at, bracket_at) + quotes) % 2 == 0
        quotes += len(quote_at)
        # "[" 0x5B and "{" 0x7B open, "]" 0x5D and "}" 0x7D close: bit 1 tells them apart.
        steps = (chunk[bracket_at[outside]] & 2).astype(np.int64) - 1
        if len(steps):
            running = np.cumsum(steps) + level
            deepest = max(deepest, int(running.max()))
            level = int(running[-1])
        if stop_above is not None and deepest > stop_above:
            break
    return deepest


def check_json_depth(data: bytes | str, source: os.PathLike[str] | str, max_depth: int = MAX_NESTING_DEPTH) -> None:
    """JsonTooDeepError naming `source` when `data` nests deeper than `max_depth`."""
    if json_depth(data, stop_above=max_depth) > max_depth:
        raise JsonTooDeepError(source, max_depth)


def loads_bounded(data: bytes | str, source: os.PathLike[str] | str, *, max_depth: int = MAX_NESTING_DEPTH,
                  encoding: str = "utf-8") -> Any:
    """json.loads of text already held in memory (a line, a safetensors header, a response body),
    refused with JsonTooDeepError naming `source` when it nests deeper than `max_depth`."""
    check_json_depth(data, source, max_depth)
    return json.loads(data.decode(encoding) if isinstance(data, bytes) else data)


def read_json_file(path: os.PathLike[str] | str, *, max_bytes: int, max_depth: int = MAX_NESTING_DEPTH,
                   encoding: str = "utf-8") -> Any:
    """The parsed content of a user's or a model's JSON file, within limits.

    FileTooLargeError (nothing read) when the file is bigger than `max_bytes`; JsonTooDeepError
    (nothing parsed) when it nests deeper than `max_depth`; json.JSONDecodeError or
    UnicodeDecodeError (ValueErrors) when it is not JSON in `encoding`; NotARegularFileError and
    the other OSErrors as engine.fileutil.read_user_file raises them.
    """
    data = read_user_file(path, max_bytes=max_bytes)
    return loads_bounded(data, path, max_depth=max_depth, encoding=encoding)


def check_file_size(path: os.PathLike[str] | str, max_bytes: int) -> int:
    """The size of a file another library will read whole (a tokenizer's merges.txt, a
    sentencepiece model); FileTooLargeError naming it and the limit when it is over `max_bytes`."""
    size = os.stat(path).st_size
    if size > max_bytes:
        raise FileTooLargeError(path, size, max_bytes)
    return size
