"""The grounding interface: shapes the GUI displays, and no grounder until one is implemented."""

from __future__ import annotations

import numpy as np

from engine.grounding import Grounder, Grounding, Phrase, PhraseMap, get_grounder


def test_no_grounder_yet():
    assert get_grounder(object()) is None


def test_shapes_and_protocol():
    class Fixed:
        def ground(self, image, text):
            p = Phrase("a red ball", 0, 10, "noun_phrase")
            return Grounding("x.jpg", text, [(0, len(text))], [PhraseMap(p, 0.8, np.zeros((24, 24), np.float32))])

    assert isinstance(Fixed(), Grounder)
    g = Fixed().ground(None, "a red ball on grass")
    assert g.text[g.phrases[0].phrase.start:g.phrases[0].phrase.end] == "a red ball"
    assert g.sentence_supports == []
