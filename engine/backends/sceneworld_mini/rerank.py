"""Re-ranking with sceneworld-mini's matching head (engine/backends/sceneworld_mini/matcher.py).

The head reads at most 48 tokens, so a query is scored by the mean of the head's logits over its
sentences, and hits are ordered by ANN cosine + MINI_RERANK_WEIGHT x that mean. Measured on
SceneWorld's long split (top 32, paragraph queries; docs/grounding.md): with the shipped head
(phrase-patch alignment, 6,000 steps) and the weight chosen on validation seed 1500,
text-to-image R@1 on the test seed 2000 goes from 0.892 to 0.996.
A head without alignment (the earlier release: 0.892 -> 0.885) and phrase coverage
(0.892 -> 0.503) did not help, so re-ranking is only offered with an aligned head.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from PIL import Image

# Chosen on validation (seed 1500, 500 scenes): R@1 0.928 with ANN alone; 0.978 / 0.994 / 1.000 /
# 1.000 / 1.000 / 0.998 at weights 0.005 / 0.01 / 0.02 / 0.05 / 0.1 / 0.2: the middle of the plateau.
MINI_RERANK_WEIGHT = 0.05
MINI_NOTE = ("re-ranking needs sceneworld-mini's matching head with phrase-patch alignment; this model "
             "folder has {what} (docs/grounding.md)")


def _matcher(embedder: Any) -> Any:
    from engine.grounding import get_grounder

    grounder = get_grounder(embedder)
    return getattr(grounder, "matcher", None)


def rerank_support(embedder: Any) -> tuple[bool, str]:
    matcher = _matcher(embedder)
    if matcher is not None and matcher.has_alignment:
        return True, ""
    return False, MINI_NOTE.format(what="no matching head" if matcher is None else "a head without it")


def rerank_scores(embedder: Any, images: Sequence[Image.Image], query: str, ann_scores: Sequence[float],
                  max_tokens: int | None = None) -> np.ndarray:
    """The ANN cosine plus MINI_RERANK_WEIGHT x the head's mean sentence logit."""
    return np.asarray(ann_scores, np.float64) + MINI_RERANK_WEIGHT * mini_match_logits(embedder, images, query)


def mini_match_logits(embedder: Any, images: Sequence[Image.Image], query: str) -> np.ndarray:
    """Mean over the query's sentences of sceneworld-mini's matching-head logit, per image."""
    import torch

    from engine.backends.sceneworld_mini.matcher import MAX_TOKENS
    from engine.backends.sceneworld_mini.network import tokenize
    from engine.grounding.chunking import chunk

    matcher = _matcher(embedder)
    if matcher is None or not len(images):
        return np.zeros(len(images))
    sentences = [query[a:b] for a, b in chunk(query).sentences] or [query]
    ids, mask = tokenize(embedder.tokenizer, sentences, MAX_TOKENS)
    device = next(matcher.parameters()).device
    ids, mask = ids.to(device), mask.to(device)
    out = []
    with torch.inference_mode():
        for start in range(0, len(images), 32):
            px = torch.from_numpy(embedder.preprocess(images[start:start + 32])).to(device)
            tokens = matcher.image_tokens(px)
            n, k = len(tokens), len(sentences)
            logits = matcher(tokens.repeat_interleave(k, 0), ids.repeat(n, 1), mask.repeat(n, 1))
            out.append(logits.float().reshape(n, k).mean(1).cpu().numpy())
    return np.concatenate(out)
