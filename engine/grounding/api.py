"""The grounding interface the GUI displays: phrases of a query, their support, their region maps.

This module only defines the shapes. Phrase chunking lives next to it (`chunking.py`); per-phrase
region maps and support scores live in each backend's folder (engine/backends/sceneworld_mini/grounder.py,
engine/backends/blip/grounder.py); `engine.grounding.get_grounder` asks the registry for the
embedder's backend and lets it make one.

Conventions an implementation must follow:

* `Phrase.start`/`end` are character offsets into `Grounding.text`, the text as given
  (not cleaned), so a view can highlight the phrase in place.
* `PhraseMap.support` is in [0, 1]: how strongly the image supports the phrase.
* `PhraseMap.heatmap` is float32 (h, w) in [0, 1] at patch resolution (e.g. 24x24 for
  ViT-B/16 at 384 px), covering the whole upright image; the view scales it up.
* `Grounding.sentences` are (start, end) character spans of the sentences of `text`;
  `sentence_supports`, when not empty, has one support in [0, 1] per sentence.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    from PIL import Image


@dataclass(frozen=True)
class Phrase:
    text: str
    start: int
    end: int
    kind: str = "noun_phrase"  # e.g. noun_phrase, relation, attribute
    #: The claim a model checks for this phrase when it is not the span itself: a relation's
    #: "<subject> <relation words> <object>". Empty: the span text.
    query: str = ""
    #: For a relation: indices (into the same phrase list) of its subject and object phrases.
    args: tuple[int, ...] = ()

    @property
    def claim(self) -> str:
        return self.query or self.text


@dataclass
class PhraseMap:
    phrase: Phrase
    support: float
    heatmap: np.ndarray  # (h, w) float32 in [0, 1], patch resolution
    #: The uncalibrated score behind `support` (similarity or ITM logit difference).
    score: float = float("nan")
    #: Index into Grounding.sentences of the sentence holding the phrase (-1: unknown).
    sentence: int = -1


@dataclass
class Grounding:
    image_path: str
    text: str
    sentences: list[tuple[int, int]]
    phrases: list[PhraseMap]
    sentence_supports: list[float] = field(default_factory=list)
    #: Which model and which map method produced this (e.g. "patch-similarity", "gradcam-l6").
    model_id: str = ""
    method: str = ""
    #: Whether sentence_supports/supports are calibrated (0.5 = undecided on SceneWorld validation).
    calibrated: bool = False


@runtime_checkable
class Grounder(Protocol):
    def ground(self, image: Image.Image, text: str) -> Grounding:
        """Split `text` into phrases and locate each in `image` (an upright RGB picture)."""
        ...
