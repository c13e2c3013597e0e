"""Turning a vision-language model's free-form answer into the texts the data format needs.

Models rarely answer exactly as asked: they add an introduction ("Here are five captions:"),
close with an offer to help, use markdown, number with "1)" or "1." or bullets, wrap items in
quotes, annotate a hard negative with the detail they changed, give four items or seven, or
refuse. Each parser returns a Parsed result with the cleaned value or a `problem` saying why the
answer cannot be used; the pipeline then asks again (a bounded number of times).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from engine.text.sentences import sentence_texts

T = TypeVar("T")


@dataclass(frozen=True)
class Parsed(Generic[T]):
    value: T | None
    problem: str = ""  # empty when value is usable
    notes: tuple[str, ...] = field(default=())  # fixes applied (extra items dropped, trimmed, ...)

    @property
    def ok(self) -> bool:
        return self.value is not None and not self.problem


_REFUSAL = re.compile(
    r"^\W*(i'?m sorry|sorry,|i am sorry|i apologi[sz]e|i can(?:'|no)t|i cannot|i am unable|i'm unable|i am not able|"
    r"i'm not able|unfortunately,? i|as an ai|i won'?t be able|i do not see an image|i don'?t see an image|"
    r"there is no image|no image (?:was|is) (?:provided|attached))",
    re.IGNORECASE,
)
_FENCE = re.compile(r"^\s*```")
# "1.", "1)", "(1)", "1:", "1 -", "#1", optionally bold ("**1.**"), optionally after a bullet.
_NUMBERED = re.compile(
    r"^\s*(?:[-*•+]\s+)?(?:\*\*|__)?(?:#\s*)?\(?(\d{1,2})\s*(?:[.):\]]|\s-|–|—)(?:\*\*|__)?\s*(.*)$"
)
# "Caption 1: ...", "Negative #2 - ...", "**Caption 3:** ..."
_LABELLED = re.compile(
    r"^\s*(?:[-*•+]\s+)?(?:\*\*|__)?(?:caption|negative|hard negative|option|description|sentence)\s*#?\s*(\d{1,2})"
    r"\s*(?:[.):\]]|\s-|–|—)?(?:\*\*|__)?\s*[:.)\-–—]?\s*(.*)$",
    re.IGNORECASE,
)
_BULLET = re.compile(r"^\s*[-*•+–—]\s+(.*)$")
_HEADING = re.compile(r"^\s*#{1,6}\s")
# A trailing note such as "(changed: the car is red, not blue)" or "[wrong detail: colour]".
_ANNOTATION = re.compile(
    r"\s*[(\[](?:[^()\[\]]*?\b(?:chang\w*|wrong|incorrect|false|error|instead|actually|altered|modified|swapped|"
    r"detail|note)\b[^()\[\]]*)[)\]][.!]?\s*$",
    re.IGNORECASE,
)
_LABEL_PREFIX = re.compile(r"^(?:caption|negative|hard negative|description)\s*:\s*", re.IGNORECASE)
_QUOTES = "\"'“”‘’«»"
_CHATTER_START = re.compile(
    r"^\s*(?:sure|certainly|of course|okay|ok|absolutely|here(?:'s| is| are)|below (?:is|are))\b", re.IGNORECASE
)
_CHATTER_END = re.compile(
    r"^\s*(?:let me know|i hope|hope this|feel free|note:|if you(?:'d| would)? like|please note|these captions)\b",
    re.IGNORECASE,
)


def is_refusal(text: str) -> bool:
    return bool(_REFUSAL.match(text.strip()))


def _strip_markdown(s: str) -> str:
    s = re.sub(r"(\*\*|__)(.+?)\1", r"\2", s)
    s = re.sub(r"(?<![\w*])\*(?!\s)(.+?)(?<!\s)\*(?![\w*])", r"\1", s)
    s = s.replace("`", "")
    return s


def _unquote(s: str) -> str:
    s = s.strip()
    while len(s) >= 2 and s[0] in _QUOTES and s[-1] in _QUOTES:
        s = s[1:-1].strip()
    return s


def clean_item(s: str) -> str:
    """One caption: markdown, quotes, labels and change annotations removed, whitespace collapsed."""
    s = _strip_markdown(s).strip()
    s = _LABEL_PREFIX.sub("", s)
    for _ in range(2):  # "(changed: x) (note: y)"
        s = _ANNOTATION.sub("", s)
    s = re.sub(r"\s+", " ", _unquote(s)).strip()
    return s


def _lines(text: str) -> list[str]:
    return [ln for ln in text.replace("\r\n", "\n").replace("\r", "\n").split("\n") if not _FENCE.match(ln)]


def _ends_sentence(s: str) -> bool:
    return bool(re.search(r"[.!?…][\"'”’)\]]*\s*$", s))


def parse_list(text: str, count: int) -> Parsed[list[str]]:
    """Exactly `count` distinct items from a numbered or bulleted list, or a problem.

    Numbered items win over bullets (bullets inside a numbered list are sub-points). A line that
    follows an item without a blank line continues it when it is indented or the item has not
    ended its sentence; anything else (introductions, closing remarks) is chatter and dropped.
    More than `count` items: the first `count` are kept. Fewer: a problem, so the caller asks
    again. With no list markers at all, non-empty lines that are not introductions are taken
    as items.
    """
    if text is None or not text.strip():
        return Parsed(None, "empty answer")
    lines = _lines(text)
    numbered: list[list[str]] = []
    bullets: list[list[str]] = []
    current: list[str] | None = None
    prev_blank = True
    for raw in lines:
        if not raw.strip():
            current, prev_blank = None, True
            continue
        if _HEADING.match(raw):
            current, prev_blank = None, False
            continue
        m = _NUMBERED.match(raw) or _LABELLED.match(raw)
        if m and m.group(2).strip():
            current = [m.group(2)]
            numbered.append(current)
        elif (b := _BULLET.match(raw)) and b.group(1).strip():
            current = [b.group(1)]
            bullets.append(current)
        elif current is not None and not prev_blank and (raw[:1].isspace() or not _ends_sentence(current[-1])):
            current.append(raw.strip())
        else:
            current = None
        prev_blank = False
    groups = numbered or bullets
    notes: list[str] = []
    if not groups:
        if is_refusal(text):
            return Parsed(None, f"the model refused: {text.strip()[:120]!r}")
        plain = [ln for ln in (x.strip() for x in lines) if ln and not ln.endswith(":")
                 and not _CHATTER_START.match(ln) and not _CHATTER_END.match(ln)]
        groups = [[ln] for ln in plain]
        notes.append("no list markers; one item per line")
    items: list[str] = []
    seen: set[str] = set()
    for g in groups:
        item = clean_item(" ".join(g))
        key = re.sub(r"\W+", " ", item.lower()).strip()
        if not key:
            continue
        if key in seen:
            notes.append("duplicate item dropped")
            continue
        seen.add(key)
        items.append(item)
    if len(items) < count:
        if not items and is_refusal(text):
            return Parsed(None, f"the model refused: {text.strip()[:120]!r}")
        return Parsed(None, f"{len(items)} usable item(s), expected {count}", tuple(notes))
    if len(items) > count:
        notes.append(f"{len(items) - count} extra item(s) dropped")
    return Parsed(items[:count], "", tuple(notes))


def split_sentences(text: str) -> list[str]:
    """The sentences of a paragraph as text: engine.text.sentences (the one splitter), uncut."""
    return sentence_texts(text)


def parse_paragraph(text: str, min_sentences: int = 3, max_sentences: int = 6) -> Parsed[str]:
    """One paragraph of min..max sentences. Introductions, closing offers, markdown, quotes and
    list markers are removed; several paragraphs are joined; more than max sentences are cut to
    the first max; fewer than min is a problem."""
    if text is None or not text.strip():
        return Parsed(None, "empty answer")
    if is_refusal(text):
        return Parsed(None, f"the model refused: {text.strip()[:120]!r}")
    kept: list[str] = []
    notes: list[str] = []
    lines = [ln.strip() for ln in _lines(text)]
    for i, ln in enumerate(lines):
        if not ln or _HEADING.match(ln):
            continue
        first = not kept
        if first and (ln.endswith(":") or _CHATTER_START.match(ln)) and (
            ln.endswith(":") or len(split_sentences(ln)) == 1 and i + 1 < len(lines)
        ):
            notes.append("introduction dropped")
            continue
        if _CHATTER_END.match(ln):
            notes.append("closing remark dropped")
            continue
        m = _NUMBERED.match(ln) or _BULLET.match(ln)
        if m:
            ln = m.group(m.lastindex or 1)
        ln = _strip_markdown(ln).strip()
        if ln.lower().startswith("paragraph:"):
            ln = ln[len("paragraph:"):].strip()
        if ln:
            kept.append(ln)
    paragraph = _unquote(re.sub(r"\s+", " ", " ".join(kept)).strip())
    if not paragraph:
        return Parsed(None, "no paragraph in the answer")
    sentences = split_sentences(paragraph)
    if len(sentences) < min_sentences:
        return Parsed(None, f"{len(sentences)} sentence(s), expected {min_sentences} to {max_sentences}",
                      tuple(notes))
    if len(sentences) > max_sentences:
        notes.append(f"cut from {len(sentences)} to {max_sentences} sentences")
        paragraph = " ".join(sentences[:max_sentences])
    return Parsed(paragraph, "", tuple(notes))


_NUMBER_WORDS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten".split())}
_RANGE_ECHO = re.compile(r"\(?\b(?:from\s+)?0\s*(?:to|-|–|—)\s*10\b\)?", re.IGNORECASE)
_OUT_OF_TEN = re.compile(r"(-?\d+(?:\.\d+)?)\s*(?:/|out of)\s*10\b", re.IGNORECASE)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_LABELLED_SCORE = re.compile(r"\b(?:score|rating|rate it|rated)\b\s*(?:is|of|as|:|=)?\s*(-?\d+(?:\.\d+)?)", re.IGNORECASE)


def parse_score(text: str) -> Parsed[float]:
    """A faithfulness score 0..10 from answers such as "7", "Score: 8/10", "I'd give it 6." or
    "Eight." "N/10" and "score: N" win over other numbers ("3 dogs are shown ... Score: 4"); an echo
    of the scale ("0 to 10") is not taken for the score."""
    if text is None or not text.strip():
        return Parsed(None, "empty answer")
    t = _strip_markdown(text.strip())
    m = _OUT_OF_TEN.search(t) or _LABELLED_SCORE.search(_RANGE_ECHO.sub(" ", t))
    if m is None:
        t2 = _RANGE_ECHO.sub(" ", t)
        m = _NUMBER.search(t2)
    if m is None:
        words = re.findall(r"[a-z]+", t.lower())
        hits = [_NUMBER_WORDS[w] for w in words if w in _NUMBER_WORDS]
        if hits and not is_refusal(t):
            return Parsed(float(hits[0]), "", ("number word",))
        if is_refusal(t):
            return Parsed(None, f"the model refused: {t[:120]!r}")
        return Parsed(None, f"no score in the answer {t[:80]!r}")
    value = float(m.group(1) if m.lastindex else m.group(0))
    if not 0.0 <= value <= 10.0:
        return Parsed(None, f"score {m.group(0)} is outside 0..10")
    return Parsed(value)
