"""A stand-in grounder for GUI tests (and the illustrative screenshot).

The GUI's job is to display grounding, so its tests feed it a deterministic fake: phrases are
the comma/"and"-separated chunks of each sentence, support is a fixed pseudo-random value per
phrase, and each region map is a Gaussian blob whose place depends on the phrase. Nothing here
means anything about the picture.
"""

from __future__ import annotations

import re

import numpy as np

from engine.grounding.api import Grounding, Phrase, PhraseMap
from engine.text.sentences import split_sentences

_CHUNK = re.compile(r"[^,;.!?]+")


_SEPARATOR = re.compile(r",|;|\b(?:and|to the left of|to the right of|next to|behind|against|across|on)\b")


def fake_phrases(text: str) -> list[Phrase]:
    """Chunks of each sentence between commas, "and" and a few relation words, trimmed."""
    out = []
    for s, e in split_sentences(text):
        end = e - 1 if text[e - 1] in ".!?" else e
        cuts = [s] + [x for m in _SEPARATOR.finditer(text, s, end) for x in (m.start(), m.end())] + [end]
        for a, b in zip(cuts[::2], cuts[1::2], strict=True):
            while a < b and text[a].isspace():
                a += 1
            while b > a and text[b - 1].isspace():
                b -= 1
            if b - a >= 3:
                out.append(Phrase(text[a:b], a, b, "noun_phrase"))
    return out


class FakeGrounder:
    def __init__(self, grid: int = 16) -> None:
        self.grid = grid
        self.calls = 0

    def ground(self, image, text: str, sentences: list[tuple[int, int]] | None = None) -> Grounding:
        self.calls += 1
        phrases = fake_phrases(text)
        g = self.grid
        ys, xs = np.mgrid[0:g, 0:g].astype(np.float32)
        maps = []
        for i, p in enumerate(phrases):
            cx = (0.2 + 0.6 * ((i * 7) % 5) / 4) * (g - 1)
            cy = (0.25 + 0.5 * ((i * 3) % 4) / 3) * (g - 1)
            heat = np.exp(-(((xs - cx) ** 2 + (ys - cy) ** 2) / (2 * (g / 6) ** 2))).astype(np.float32)
            support = 0.15 + 0.8 * ((i * 37 + 11) % 10) / 9
            maps.append(PhraseMap(p, float(min(support, 1.0)), heat))
        sentences = split_sentences(text) if sentences is None else list(sentences)
        sup = []
        for s, e in sentences:
            inside = [m.support for m in maps if s <= m.phrase.start < e]
            sup.append(float(np.mean(inside)) if inside else 0.0)
        return Grounding(image_path="", text=text, sentences=sentences, phrases=maps, sentence_supports=sup)


class ChunkerGrounder(FakeGrounder):
    """The engine's own phrases (engine.grounding.chunking: noun phrases, settings, relations)
    with the fake's blob maps, and supports chosen by the test: `supports[kind]`."""

    def __init__(self, supports: dict[str, float], grid: int = 16) -> None:
        super().__init__(grid)
        self.supports = supports

    def ground(self, image, text: str, sentences: list[tuple[int, int]] | None = None) -> Grounding:
        from engine.grounding.chunking import chunk

        g = super().ground(image, text, sentences)
        c = chunk(text, sentences=sentences)
        blobs = [m.heatmap for m in g.phrases] or [np.zeros((self.grid, self.grid), np.float32)]
        g.phrases = [PhraseMap(p, self.supports.get(p.kind, 0.5), blobs[i % len(blobs)])
                     for i, p in enumerate(c.phrases)]
        return g
