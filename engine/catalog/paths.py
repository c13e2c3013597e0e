"""Storing file names that are not valid UTF-8.

POSIX file names are bytes; Python decodes undecodable bytes to lone surrogates
(surrogateescape), which SQLite's UTF-8 TEXT cannot hold. Such names are stored as
NUL + base64 of the raw bytes: NUL never occurs in a real path, so the encoding is
unambiguous and round-trips exactly.
"""

from __future__ import annotations

import base64
import os

_MARK = "\x00"


def to_db(rel_path: str) -> str:
    try:
        rel_path.encode("utf-8")
        return rel_path
    except UnicodeEncodeError:
        return _MARK + base64.b64encode(os.fsencode(rel_path)).decode("ascii")


def from_db(stored: str) -> str:
    if stored.startswith(_MARK):
        return os.fsdecode(base64.b64decode(stored[1:]))
    return stored


def for_display(rel_path: str) -> str:
    """A printable version of a path (undecodable bytes shown as U+FFFD)."""
    return os.fsencode(rel_path).decode("utf-8", errors="replace")
