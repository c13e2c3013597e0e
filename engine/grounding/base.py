"""What every grounder shares: chunk the text, ask the backend for maps and raw scores, turn
raw scores into supports (calibrated when a calibration for the exact weights exists).

A backend implements `image_features`, `_analyse` (maps and features for phrases and
sentences) and `_uncalibrated` (a fallback mapping of features to [0, 1]).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from engine.grounding.api import Grounding, Phrase, PhraseMap
from engine.grounding.calibration import Calibration
from engine.grounding.chunking import Chunking, chunk
from engine.grounding.maps import background_map, normalise, relation_geometry

if TYPE_CHECKING:
    from PIL import Image

# Relation words -> the geometric predicate they assert (SceneWorld's predicates, which cover
# the everyday spatial vocabulary). Words not listed assert nothing a map can check.
RELATION_PREDICATES: dict[str, str] = {}
for _pred, _words in {
    "left_of": "to the left of|left of|on the left of|at the left of",
    "right_of": "to the right of|right of|on the right of|at the right of",
    "above": "above|over|higher up than|higher than|on top of|atop|taller than",
    "below": "below|beneath|under|underneath|lower than|lower down than|at the foot of",
    "next_to": "next to|beside|close to|near|near to|by|along|together with",
    "in_front_of": "in front of|partly covering|partly hiding",
    "behind": "behind|partly hidden behind|partly covered by",
    "inside": "inside|in|within|peeks out of|sticks out of|out of|in the middle of|in the centre of|"
    "in the center of|surrounded by|filled with",
    "contains": "holding|containing|carrying",
}.items():
    for _w in _words.split("|"):
        RELATION_PREDICATES[_w] = _pred

# At most this many phrases are mapped per text: a pasted essay must not take minutes.
MAX_PHRASES = 64


def predicate_of(words: str) -> str | None:
    return RELATION_PREDICATES.get(" ".join(words.lower().split()))


@dataclass
class Analysis:
    """Raw output of a backend for one (image, text)."""

    text: str
    chunking: Chunking
    maps: np.ndarray  # (P, h, w) float32 in [0, 1]
    phrase_levels: list[str]  # "phrase" or "relation" per phrase
    phrase_x: list[list[float]]  # features per phrase (level-specific)
    sentence_x: list[list[float]]  # features per sentence
    timings_ms: dict[str, float] = field(default_factory=dict)


class BaseGrounder:
    """Shared flow; subclasses fill in the model-specific parts."""

    method: str = ""
    feature_names: dict[str, list[str]] = {}

    def __init__(self, embedder: Any, calibration: Calibration | None = None) -> None:
        self.embedder = embedder
        self.model_id = str(getattr(embedder, "text_model_id", getattr(embedder, "model_id", "")))
        self.calibration = calibration

    # -- backend hooks -------------------------------------------------------------------
    def image_features(self, image: Image.Image) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def _analyse(self, feats: Any, text: str, chunking: Chunking) -> Analysis:  # pragma: no cover
        raise NotImplementedError

    def _uncalibrated(self, level: str, x: np.ndarray) -> np.ndarray:  # pragma: no cover
        raise NotImplementedError

    def gradcam_layers(self) -> list[int]:
        """The layers method="gradcam" can read (gradcam_layer=...); empty: no Grad-CAM maps."""
        return []

    # -- shared ----------------------------------------------------------------------------
    def embed_texts(self, texts: list[str]) -> np.ndarray:
        """(len(texts), D) the embedder's embeddings of `texts`, each distinct text encoded once."""
        if not texts:
            return np.zeros((0, self.embedder.dim), np.float32)
        uniq = list(dict.fromkeys(texts))
        enc = self.embedder.encode_texts(uniq)
        lookup = {t: i for i, t in enumerate(uniq)}
        return enc[[lookup[t] for t in texts]]

    def analyse(self, image: Image.Image | None, text: str, *, feats: Any = None,
                chunking: Chunking | None = None, sentences: list[tuple[int, int]] | None = None) -> Analysis:
        if feats is None:
            if image is None:
                raise ValueError("give an image or its features")
            feats = self.image_features(image)
        if chunking is None:
            chunking = chunk(text, sentences=sentences)
        if len(chunking.phrases) > MAX_PHRASES:
            chunking = _truncated(chunking, MAX_PHRASES)
        return self._analyse(feats, text, chunking)

    def prob(self, level: str, x: np.ndarray | list[list[float]]) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        if x.size == 0:
            return np.zeros(0)
        x = np.atleast_2d(x)
        if level in self.calibrated_levels():
            assert self.calibration is not None
            return self.calibration.prob(level, x)
        return self._uncalibrated(level, x)

    def calibrated_levels(self) -> frozenset[str]:
        """The levels whose supports the calibration maps: those fitted on the features this
        grounder computes now (a calibration stored with other features, say before a matching
        head was added, is not applied to them)."""
        cal = self.calibration
        if cal is None:
            return frozenset()
        stored = cal.meta.get("features")
        out = set()
        for level, platt in cal.levels.items():
            names = self.feature_names.get(level)
            if isinstance(stored, dict) and names is not None and stored.get(level) != names:
                continue
            if names is not None and len(platt.w) != len(names):
                continue
            out.add(level)
        return frozenset(out)

    def supports(self, a: Analysis) -> tuple[list[float], list[float]]:
        phrase = [0.0] * len(a.phrase_x)
        for level in ("phrase", "relation"):
            idx = [i for i, lv in enumerate(a.phrase_levels) if lv == level]
            if idx:
                for i, p in zip(idx, self.prob(level, [a.phrase_x[i] for i in idx]), strict=True):
                    phrase[i] = float(p)
        sentence = [float(p) for p in self.prob("sentence", a.sentence_x)] if a.sentence_x else []
        return phrase, sentence

    @property
    def calibrated(self) -> bool:
        """Whether every level this grounder scores (phrase, relation, sentence) is calibrated."""
        levels = set(self.feature_names) or {"phrase", "relation", "sentence"}
        return self.calibration is not None and levels <= self.calibrated_levels()

    def levels_calibrated(self, a: Analysis) -> bool:
        """Whether the supports of this analysis are all calibrated (the levels it used)."""
        used = set(a.phrase_levels) | ({"sentence"} if a.sentence_x else set())
        return self.calibration is not None and used <= self.calibrated_levels()

    def ground(self, image: Image.Image, text: str, image_path: str = "",
               sentences: list[tuple[int, int]] | None = None) -> Grounding:
        """Phrases of `text`, each with a region map and a support; supports per sentence.

        `sentences`: the caller's sentence spans (review passes the ones its rows show), so
        sentence_supports[i] is the support of the caller's sentence i.
        """
        t0 = time.perf_counter()
        a = self.analyse(image, text, sentences=sentences)
        phrase_sup, sent_sup = self.supports(a)
        heat = setting_maps(a.chunking.phrases, a.maps)
        maps = [
            PhraseMap(p, sup, heat[i], score=float(a.phrase_x[i][0]) if a.phrase_x[i] else float("nan"),
                      sentence=a.chunking.phrase_sentence[i])
            for i, (p, sup) in enumerate(zip(a.chunking.phrases, phrase_sup, strict=True))
        ]
        path = image_path or str(getattr(image, "filename", "") or "")
        g = Grounding(path, text, list(a.chunking.sentences), maps, sent_sup, model_id=self.model_id,
                      method=self.method, calibrated=self.levels_calibrated(a))
        a.timings_ms["total"] = (time.perf_counter() - t0) * 1000
        return g


def claims_and_sentences(text: str, chunking: Chunking) -> tuple[list[str], list[str]]:
    """The texts a grounder scores against the image: each phrase's claim, each sentence's text."""
    return [p.claim for p in chunking.phrases], [text[s:e] for s, e in chunking.sentences]


def map_relation(maps: np.ndarray, i: int, phrase: Phrase, geometry_maps: np.ndarray) -> float:
    """A relation's map and geometry feature. With a subject and an object, maps[i] becomes their
    maps summed and renormalised, and the result is how well their `geometry_maps` satisfy the
    relation's predicate (maps.relation_geometry); without both, maps[i] is left and the result is 0."""
    if len(phrase.args) != 2:
        return 0.0
    subj, obj = phrase.args
    maps[i] = normalise(maps[subj] + maps[obj])
    return relation_geometry(predicate_of(phrase.text), geometry_maps[subj], geometry_maps[obj])


def setting_maps(phrases: list[Phrase], maps: np.ndarray) -> np.ndarray:
    """The maps with each setting phrase's replaced by the background around the text's objects
    (maps.background_map): a setting's supports are the backend's, its place is everywhere else."""
    objects = [maps[i] for i, p in enumerate(phrases) if p.kind == "noun_phrase"]
    out = np.array(maps, dtype=np.float32, copy=True)
    for i, p in enumerate(phrases):
        if p.kind == "setting":
            out[i] = background_map(objects, out.shape[1:])
    return out


def _truncated(c: Chunking, n: int) -> Chunking:
    keep = c.phrases[:n]
    # A relation whose subject or object was cut loses its arguments (it is kept, unmapped).
    fixed = [
        p if all(a < n for a in p.args) else Phrase(p.text, p.start, p.end, p.kind, p.query, ())
        for p in keep
    ]
    return Chunking(c.text, c.sentences, fixed, c.phrase_sentence[:n])
