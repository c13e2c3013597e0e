"""Grounding: which parts of a query an image supports, and where (interface + factory).

`get_grounder(embedder)` returns None until a grounding implementation exists for the
embedder's model; callers treat None as "grounding not available for this model".
"""

from __future__ import annotations

from engine.grounding.api import Grounder, Grounding, Phrase, PhraseMap
from engine.models.base import Embedder

__all__ = ["Grounder", "Grounding", "Phrase", "PhraseMap", "get_grounder"]


def get_grounder(embedder: Embedder) -> Grounder | None:
    """The grounder for `embedder`'s model, or None when none is available (for now: always)."""
    return None
