"""Decoding settings of the pipeline's requests (a module of its own so `longlens --help` can show
the defaults without importing the pipeline)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Sampling:
    """Decoding settings. Defaults are the study's: nucleus sampling (p 0.9, T 0.7) with 160/200/200
    new tokens for captions, negatives and paragraphs; greedy scoring with 16 tokens."""

    temperature: float = 0.7
    top_p: float = 0.9
    max_tokens_positives: int = 160
    max_tokens_negatives: int = 200
    max_tokens_paragraph: int = 200
    score_temperature: float = 0.0
    score_max_tokens: int = 16
