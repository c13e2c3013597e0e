"""The parts of a text as token groups: which tokens form each phrase, and how a paragraph's
embedding is composed from its parts (issue 21, the CAFT-style "part-to-whole" text side).

Phrases are the production chunker's noun phrases and settings (engine/grounding/chunking.py):
the same phrases a person sees in the inspector, so what training aligns with regions is what
grounding later draws. Relations are left out: their spans are function words ("on", "next to")
that name no region by themselves.

Everything here works on character spans and a fast tokenizer's offset mapping, so it serves
any backend's tokenizer (WordPiece, BPE). Chunking costs about 3.5 ms per SceneWorld paragraph;
training sees the same texts every epoch, so the spans are cached per text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

#: At most this many phrases of a text take part in phrase pooling (SceneWorld paragraphs have 8–20).
MAX_PHRASES = 24


@dataclass(frozen=True)
class TextParts:
    """A text's sentences and the phrases in each, as character spans."""

    sentences: tuple[tuple[int, int], ...]
    phrases: tuple[tuple[int, int], ...]
    phrase_sentence: tuple[int, ...]  # the sentence index of each phrase


@lru_cache(maxsize=300_000)
def text_parts(text: str) -> TextParts:
    """The chunker's sentences and non-relation phrases of `text` (cached: pure function)."""
    from engine.grounding.chunking import chunk

    c = chunk(text)
    keep = [i for i, p in enumerate(c.phrases) if p.kind != "relation"]
    return TextParts(
        sentences=tuple(c.sentences),
        phrases=tuple((c.phrases[i].start, c.phrases[i].end) for i in keep),
        phrase_sentence=tuple(c.phrase_sentence[i] for i in keep),
    )


def _tokens_in(offsets: np.ndarray, start: int, end: int) -> np.ndarray:
    """Indices of the (non-special) tokens whose characters overlap [start, end)."""
    real = offsets[:, 1] > offsets[:, 0]  # special and padding tokens have (0, 0)
    return np.flatnonzero(real & (offsets[:, 0] < end) & (offsets[:, 1] > start))


def span_token_masks(offsets: np.ndarray, spans: Sequence[tuple[int, int]]) -> np.ndarray:
    """(k, L) float32 rows averaging the tokens of each character span (one text's (L, 2) offsets);
    a span with no token inside the budget is a zero row."""
    masks = np.zeros((len(spans), offsets.shape[0]), np.float32)
    for k, (start, end) in enumerate(spans):
        idx = _tokens_in(offsets, start, end)
        if len(idx):
            masks[k, idx] = 1.0 / len(idx)
    return masks


def phrase_token_masks(texts: Sequence[str], offsets: np.ndarray, max_phrases: int) -> tuple[np.ndarray, np.ndarray]:
    """(T, P, L) float32 masks, each row averaging one phrase's tokens, and (T, P) bool validity.

    `offsets` is the tokenizer's (T, L, 2) offset mapping of the same (padded, truncated) batch.
    A phrase cut off by truncation has no tokens and is not valid; past `max_phrases` phrases
    (in reading order) a text's phrases are dropped.
    """
    t, length = offsets.shape[:2]
    masks = np.zeros((t, max_phrases, length), np.float32)
    valid = np.zeros((t, max_phrases), bool)
    for i, text in enumerate(texts):
        k = 0
        for start, end in text_parts(text).phrases:
            if k == max_phrases:
                break
            idx = _tokens_in(offsets[i], start, end)
            if len(idx):
                masks[i, k, idx] = 1.0 / len(idx)
                valid[i, k] = True
                k += 1
    return masks, valid


def part_to_whole_weights(texts: Sequence[str], offsets: np.ndarray, attention: np.ndarray) -> np.ndarray:
    """(T, L) float32 token weights summing to 1 per text: the text's embedding as the mean of its
    sentences, each the mean of its phrases, each the mean of its tokens.

    With a linear pooling this IS the part-to-whole composition: every phrase counts once in its
    sentence whatever its length, and every sentence once in the paragraph, where a plain token
    mean lets long sentences and function words dominate. A sentence with no phrase counts as the
    mean of its own tokens; a text with no sentence inside the budget falls back to the plain
    mean of its tokens (the special tokens included, as the mean pooling does).
    """
    t, length = offsets.shape[:2]
    weights = np.zeros((t, length), np.float32)
    for i, text in enumerate(texts):
        parts = text_parts(text)
        groups: list[list[np.ndarray]] = []  # per sentence: its phrases' token indices
        for si, (s0, s1) in enumerate(parts.sentences):
            phrases = [_tokens_in(offsets[i], a, b) for (a, b), s in zip(parts.phrases, parts.phrase_sentence,
                                                                         strict=True) if s == si]
            phrases = [p for p in phrases if len(p)]
            if not phrases:
                own = _tokens_in(offsets[i], s0, s1)
                phrases = [own] if len(own) else []
            if phrases:
                groups.append(phrases)
        if not groups:
            m = attention[i].astype(np.float32)
            weights[i] = m / max(float(m.sum()), 1.0)
            continue
        for phrases in groups:
            for idx in phrases:
                weights[i, idx] += 1.0 / (len(groups) * len(phrases) * len(idx))
    return weights


def pool_phrases(token_states: torch.Tensor, texts: Sequence[str], offsets: np.ndarray,
                 max_phrases: int = MAX_PHRASES) -> tuple[torch.Tensor, torch.Tensor]:
    """Phrase embeddings from a text tower's projected token states (T, L, D) and the tokenizer's
    (T, L, 2) offset mapping: the mean of each phrase's tokens, normalised. Returns (T, P, D) and
    (T, P) bool (False: no phrase there, or truncated away)."""
    import torch
    from torch.nn import functional as F

    masks, valid = phrase_token_masks(texts, offsets, max_phrases)
    m = torch.from_numpy(masks).to(token_states.device, token_states.dtype)
    phrases = torch.einsum("tpl,tld->tpd", m, token_states)
    return F.normalize(phrases, dim=-1), torch.from_numpy(valid).to(token_states.device)
