"""The one sentence splitter: character spans, abbreviation-aware, deterministic.

Review (verdicts are stored per sentence index), grounding (supports per sentence), datagen
(paragraph sentence counts) and the caption limits all split with this function, so a
sentence number means the same sentence everywhere: the Review panel's rows and the
grounder's sentence supports line up.

A sentence ends at . ! ? … (and CJK 。！？) followed by space or the end, unless the word
before the full stop is a known abbreviation or a single letter ("e.g.", "Dr.", "J."), or the
next word starts in lower case ("the U.S. flag"); a blank line or a new list item ("- ", "2) ")
always starts a new sentence. Spans are whitespace trimmed and keep the end punctuation; a
piece with no letter or digit is not a sentence. With `max_chars` a run-on sentence is cut at
the last ',', ';', ':' or space before the limit (a text encoder reads a bounded number of
tokens); `max_chars=None` never cuts.
"""

from __future__ import annotations

import re

__all__ = ["ABBREVIATIONS", "MAX_SENTENCE_CHARS", "sentence_texts", "split_sentences"]

# A sentence longer than this is cut (at the last ',', ';', ':' or space before the limit):
# BLIP reads 512 tokens at most and a run-on "sentence" of thousands of characters would
# otherwise make one unreadable claim.
MAX_SENTENCE_CHARS = 400

SENTENCE_END = frozenset(".!?…。！？")
CLOSERS = frozenset("\"'”’)]}»")
ABBREVIATIONS = frozenset(
    "mr mrs ms dr st prof sr jr vs etc e.g i.e approx fig mt ft inc ltd jan feb mar apr jun jul "
    "aug sep sept oct nov dec ca cf al".split()
)
_BULLET_RE = re.compile(r"\s*(?:[-*•·–]|\d{1,3}[.)])\s+")


def _trim(text: str, start: int, end: int) -> tuple[int, int]:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


def _cut_long(text: str, start: int, end: int, limit: int | None) -> list[tuple[int, int]]:
    out = []
    while limit is not None and end - start > limit:
        window = text[start : start + limit]
        cut = max(window.rfind(c) for c in ",;:")
        if cut < limit // 3:
            cut = window.rfind(" ")
        if cut < limit // 3:
            cut = limit - 1  # no break anywhere: a hard cut keeps the output bounded
        s, e = _trim(text, start, start + cut + 1)
        if e > s:
            out.append((s, e))
        start, _ = _trim(text, start + cut + 1, end)
    if end > start:
        out.append((start, end))
    return out


def _lower_follows(text: str, j: int) -> bool:
    while j < len(text) and text[j] in " \t":
        j += 1
    return j < len(text) and text[j].islower()


def _is_abbreviation(text: str, dot: int) -> bool:
    k = dot
    while k > 0 and (text[k - 1].isalpha() or text[k - 1] == "."):
        k -= 1
    word = text[k:dot].lower()
    if not word:
        return False
    if (len(word) == 1 and word.isalpha()) or "." in word:
        return True  # an initial or initialism: "J. Smith", "U.S."
    return word in ABBREVIATIONS


def split_sentences(text: str, max_chars: int | None = MAX_SENTENCE_CHARS) -> list[tuple[int, int]]:
    """(start, end) character spans of the sentences of `text` (see the module docstring)."""
    spans: list[tuple[int, int]] = []
    n = len(text)
    start = 0
    i = 0

    def close(end: int) -> None:
        s, e = _trim(text, start, end)
        if e > s and any(ch.isalnum() for ch in text[s:e]):
            spans.extend(_cut_long(text, s, e, max_chars))

    while i < n:
        ch = text[i]
        if ch in SENTENCE_END:
            j = i + 1
            while j < n and (text[j] in SENTENCE_END or text[j] in CLOSERS):
                j += 1
            if j >= n or text[j].isspace() or ch in "。！？":
                if ch == "." and j == i + 1 and (_is_abbreviation(text, i) or _lower_follows(text, j)):
                    # "Dr. Smith", "e.g. a latte", "the U.S. flag": not an end.
                    i = j
                    continue
                close(j)
                start = i = j
                continue
            i = j
            continue
        if ch == "\n":
            j = i + 1
            while j < n and text[j] in " \t\r":
                j += 1
            if j < n and (text[j] == "\n" or _BULLET_RE.match(text, j)):
                close(i)
                start = i = j
                continue
        i += 1
    close(n)
    return spans


def sentence_texts(text: str, max_chars: int | None = None) -> list[str]:
    """The sentences of `text` as strings (no run-on cut by default: for counting and cutting
    paragraphs, not for a text encoder)."""
    return [text[s:e] for s, e in split_sentences(text, max_chars)]
