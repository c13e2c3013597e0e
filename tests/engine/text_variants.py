"""A few hundred varied texts for the CLIP-family cleaning tests: the ways a typed or pasted query
differs from the plain ASCII a test usually tries. Each of the BASES in each of the VARIANTS
(curly quotes, HTML entities, full-width forms, mojibake, decomposed accents, emoji, other
scripts, odd whitespace, ligatures and dashes, upper case, long pastes), deterministic."""

from __future__ import annotations

import unicodedata
from collections.abc import Callable

BASES = (
    "a dog's ball on the grass",
    "the cat's toy under the sofa",
    "it's a red car parked by the river",
    "children playing in the park, summer 2019",
    "Café au lait at sunset in Paris",
    "a photo of a man & his dog",
    "\"Golden hour\" over the sea",
    "5 people at a table with 3 glasses of wine",
    "we're at the beach, they've got ice cream",
    "Zoë and Renée at the fiancé's birthday",
    "mountains <snow> and a lake",
    "an old bicycle leaning on a wall; rust, ivy",
    "night sky: the Milky Way above São Paulo",
    "she'll be holding a bouquet of roses",
    "a crème brûlée on a white plate",
    "I'd like the photo with the blue door",
    "a fox in the snow — early morning",
    "street market in Kraków, 1990s",
    "the Eiffel Tower at night (long exposure)",
    "a cat on a keyboard... again",
    "two kids' bikes and a dog's leash",
    "rock 'n' roll concert, stage lights",
    "Ångström's lab with a naïve robot",
    "x-ray of a hand, 50% contrast",
    "a 'quoted' word and a \"quoted\" phrase",
    "the O'Brien family's reunion",
    "São João festival bonfire",
    "fish & chips in a newspaper cone",
    "a red apple, a green pear & a yellow banana",
    "wedding in Zürich, bride's veil in the wind",
)

_CURLY = {"'": "\u2019", '"': "\u201c"}
_ENTITIES = {"&": "&amp;", "'": "&#39;", '"': "&quot;", "<": "&lt;", ">": "&gt;", "é": "&eacute;", " ": " "}


def curly(text: str) -> str:
    """Typographic quotes as macOS, iOS and Word type them: ’ for ', “…” for "."""
    out, double_open = [], True
    for ch in text:
        if ch == '"':
            out.append("\u201c" if double_open else "\u201d")
            double_open = not double_open
        else:
            out.append(_CURLY.get(ch, ch))
    return "".join(out)


def html_escaped(text: str) -> str:
    """As pasted from a web page's source or a feed: entities, one of them escaped twice."""
    escaped = "".join(_ENTITIES.get(ch, ch) for ch in text)
    return escaped.replace(" ", "&nbsp;", 1) + " &amp;amp; more"


def full_width(text: str) -> str:
    """ASCII as full-width forms (CJK input methods): U+FF01..U+FF5E and U+3000 for spaces."""
    return "".join("\u3000" if ch == " " else chr(ord(ch) + 0xFEE0) if "!" <= ch <= "~" else ch for ch in text)


def mojibake(text: str) -> str:
    """UTF-8 read as Windows-1252 (a CSV opened in the wrong encoding), with a curly apostrophe."""
    return curly(text + " it's").encode("utf-8").decode("cp1252", errors="replace")


def decomposed(text: str) -> str:
    """Accents as combining marks (NFD, as macOS file names keep them), plus a few more accents."""
    return unicodedata.normalize("NFD", text + " à la façon de Dvořák")


def with_emoji(text: str) -> str:
    return f"{text} 🐶❤️👍🏽 👨\u200d👩\u200d👧"


def other_scripts(text: str) -> str:
    """CJK, Hangul, Cyrillic, Arabic, and capital Greek (a word-final sigma lower-cases to ς)."""
    return f"{text} 東京の夜景 서울 Москва ΟΔΟΣ ΑΘΗΝΑΣ العربية"


def odd_whitespace(text: str) -> str:
    """Tabs, line breaks, non-breaking and ideographic spaces, and leading/trailing runs."""
    words = text.split(" ")
    seps = ["\t", "\n", "\u00a0", "  ", "\r\n", "\u2003", "\u3000"]
    return "  " + "".join(w + seps[i % len(seps)] for i, w in enumerate(words)) + "\n"


def typography(text: str) -> str:
    """Ligatures, dashes, an ellipsis and a trademark sign, as word processors write them."""
    return text.replace("fi", "\ufb01").replace("fl", "\ufb02") + " \u2013 the \ufb01nal \ufb02ight\u2026 ™"


def shouting(text: str) -> str:
    return text.upper() + "!!!"


def long_paste(text: str) -> str:
    """Longer than CLIP's 77 tokens (and, repeated, than Long-CLIP's 248), with curly quotes."""
    return curly(" ".join([text + "."] * 12))


VARIANTS: dict[str, Callable[[str], str]] = {
    "plain": lambda t: t, "curly": curly, "html": html_escaped, "full_width": full_width, "mojibake": mojibake,
    "decomposed": decomposed, "emoji": with_emoji, "scripts": other_scripts, "whitespace": odd_whitespace,
    "typography": typography, "shouting": shouting, "long": long_paste,
}


def variant_texts() -> list[tuple[str, str]]:
    """(variant name, text) for every base in every variant: 360 texts."""
    return [(name, make(base)) for name, make in VARIANTS.items() for base in BASES]
