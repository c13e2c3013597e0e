"""Making what Longlens prints or exports inert (checklist class 44).

File names, captions, notes and error messages come from the user's files, and a file name can
hold any byte but "/" and NUL: a terminal runs the control sequences in them (ESC [ moves the
cursor or repaints lines, OSC 52 writes the clipboard, C1 CSI 0x9b is ESC [ on 8-bit terminals,
a bare CR overwrites the line), and Unicode's bidi controls (U+202E ...) reverse what is shown.
A spreadsheet runs a CSV cell that starts with "=", "+", "-" or "@" as a formula.

* `inert(text)` shows a value (a path, a caption) on one line: every control character
  escaped, newline and tab included. `inert(text, layout=True)` keeps the newlines and tabs of
  a message (our own line breaks) and escapes the rest. Escapes are Python's: "\\n", "\\r",
  "\\x1b", "\\x9b", "\\u202e"; an undecodable byte of a POSIX file name (a lone surrogate from surrogateescape) is
  shown as the byte, "\\xff". Printable Unicode (accents, CJK, emoji and their joiners) is kept.
  A backslash is not doubled (Windows paths stay readable), so the text shown is for people:
  `--json` gives the exact value.
* `json_text(obj)` is JSON with ensure_ascii=False whose only non-ASCII escapes are the
  characters above: json.dumps already writes C0 controls as \\u00XX, this adds C1, the bidi
  controls, U+2028/U+2029 and lone surrogates (\\udcff: json.loads gives the same string back,
  and os.fsencode the original bytes). Still valid JSON, and exactly the same value.
* `csv_cell(value)` is the OWASP rule for a text cell: one "'" before a cell that starts with
  = + - @, tab, CR, LF or NUL (or with "'" itself, so that removing one leading "'" from every
  cell that has one gives the exact text back). Writers quote every cell (csv.QUOTE_ALL): a cell
  holding ";" or "," stays one cell in a spreadsheet that splits on either, so no formula can
  start in the middle of a cell. Numbers are written as numbers.
* `InertStream` wraps a text stream (sys.stdout, sys.stderr) so that whatever is written
  through it is `inert(..., layout=True)`: the net under every command's output.

Plain Python, no imports beyond the standard library: the base layer.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any, TextIO

# The characters a terminal (or a text viewer) acts on instead of showing: C0 and C1 controls
# and DEL (category Cc), Unicode's bidi embeddings, overrides, isolates and marks, the line and
# paragraph separators, and lone surrogates (undecodable bytes of a file name, or broken text).
_BIDI = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
_ACTIVE = re.compile(f"[\x00-\x1f\x7f-\x9f{_BIDI}\u2028\u2029\ud800-\udfff]")
_ACTIVE_BUT_LAYOUT = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f{_BIDI}\u2028\u2029\ud800-\udfff]")
# In JSON text, C0 controls are already \u00XX (json.dumps escapes them): the others are left.
_ACTIVE_IN_JSON = re.compile(f"[\x7f-\x9f{_BIDI}\u2028\u2029\ud800-\udfff]")

# OWASP's list (= + - @ tab CR) with ASVS 5.0's NUL and LF (a cell may start with a line break),
# and "'" so that the prefix can always be taken off again.
FORMULA_STARTS = frozenset("=+-@\t\r\n\x00'")


_SHORT = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _escape(match: re.Match[str]) -> str:
    short = _SHORT.get(match.group())
    if short is not None:
        return short
    c = ord(match.group())
    if 0xDC80 <= c <= 0xDCFF:  # surrogateescape: the byte of the file name that is not UTF-8
        return f"\\x{c - 0xDC00:02x}"
    return f"\\x{c:02x}" if c <= 0xFF else f"\\u{c:04x}"


def inert(text: Any, *, layout: bool = False) -> str:
    """`text` (str() of it) safe to write to a terminal: control, bidi and separator characters
    and undecodable bytes escaped. layout=True keeps newlines and tabs (a message's own)."""
    s = text if isinstance(text, str) else str(text)
    return (_ACTIVE_BUT_LAYOUT if layout else _ACTIVE).sub(_escape, s)


def json_text(obj: Any, **dumps_kwargs: Any) -> str:
    """json.dumps(obj, ensure_ascii=False, ...) with no raw control, bidi or separator character
    and no lone surrogate: each is a \\uXXXX escape (valid JSON, the same value read back).
    Such characters can only be inside JSON strings, so escaping them there is exact."""
    dumps_kwargs.setdefault("ensure_ascii", False)
    text = json.dumps(obj, **dumps_kwargs)
    return _ACTIVE_IN_JSON.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def csv_cell(value: Any) -> Any:
    """A CSV cell a spreadsheet shows as text: `value` with "'" before it when it is text that
    starts like a formula (FORMULA_STARTS); numbers and None unchanged."""
    if isinstance(value, str) and value and value[0] in FORMULA_STARTS:
        return "'" + value
    return value


def csv_row(values: Iterable[Any]) -> list[Any]:
    """Every cell of a row through `csv_cell`."""
    return [csv_cell(v) for v in values]


class InertStream:
    """A text stream whose writes go through `inert(..., layout=True)`; everything else (flush,
    fileno, isatty, encoding, buffer) is the wrapped stream's. `wrapped` is the stream itself,
    for a writer that draws with control characters of its own (a progress bar)."""

    def __init__(self, wrapped: TextIO) -> None:
        self.wrapped = wrapped

    def write(self, text: str) -> int:
        self.wrapped.write(inert(text, layout=True))
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.wrapped, name)


def unwrapped(stream: Any) -> Any:
    """The stream under an InertStream (or the stream itself)."""
    while isinstance(stream, InertStream):
        stream = stream.wrapped
    return stream


__all__ = ["FORMULA_STARTS", "InertStream", "csv_cell", "csv_row", "inert", "json_text", "unwrapped"]
