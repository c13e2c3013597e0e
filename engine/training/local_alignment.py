"""Local (phrase–region) alignment: the "trees" half of the CAFT idea (issue 21, docs/caft.md).

Trained from pictures and texts only. Each text's phrases (the chunker's spans, pooled from the
text tower's token states in context) are matched to each image's region tokens (patch tokens,
and for the CAFT-style sceneworld-mini also coarser pooled regions). The local score of an
image and a text is the mean, over the text's phrases, of the phrase's best region cosine:

    s_loc(i, t) = mean_p max_r  <phrase_p(t), region_r(i)>

and the loss is the same contrastive objective as the global one, on s_loc instead of the
global cosine (multi-positive InfoNCE over the batch). Why this form (token-wise max similarity,
as FILIP does), rather than soft assignment or optimal transport: a phrase in SceneWorld and in
most captions names one thing that sits in one place, so "the best region" is the right
inductive bias; the max gives each phrase a gradient to exactly one region, which is what turns
into a localisation map, while a soft assignment spreads it; and it costs one batched matrix
product, with no Sinkhorn iterations. Nothing tells it which region is right: only that the
matching image's best regions must beat the other images' best regions.

Any backend whose training adapter implements `RegionAdapter` can train with it
(`TrainConfig.extra["local_alignment"]`, the weight of this loss beside the global one).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import torch

from engine.grounding.parts import MAX_PHRASES, pool_phrases  # noqa: F401  (re-exported)


@runtime_checkable
class RegionAdapter(Protocol):
    """What local alignment needs from a backend's training adapter, beside DualEncoderAdapter."""

    def encode_pixel_regions(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, D) normalised global embeddings and (B, R, D) normalised region embeddings."""
        ...

    def encode_text_phrases(self, texts: Sequence[str], max_tokens: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(T, D) normalised global embeddings, (T, P, D) normalised phrase embeddings and (T, P)
        bool validity (see `pool_phrases`)."""
        ...


def local_scores(regions: torch.Tensor, phrases: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """(B, T) local scores: per text, the mean over its valid phrases of the phrase's best region
    cosine in each image. A text without valid phrases scores 0 everywhere."""
    counts = valid.sum(dim=1)
    if not valid.numel():
        return regions.new_zeros(regions.shape[0], phrases.shape[0])
    # Captions have 1-4 phrases, paragraphs up to 24: texts are scored in groups of similar phrase
    # counts, each trimmed to its own longest, so a caption does not pay for a paragraph's padding.
    out = regions.new_zeros(regions.shape[0], phrases.shape[0])
    lo = 0
    for hi in PHRASE_COUNT_BUCKETS:
        rows = torch.nonzero((counts > lo) & (counts <= hi)).flatten()
        lo = hi
        if len(rows):
            used = int(counts[rows].max())
            out = out.index_copy(1, rows, _scores(regions, phrases[rows, :used], valid[rows, :used]))
    return out


#: Upper bounds of the phrase-count groups local_scores works in (phrases are packed first).
PHRASE_COUNT_BUCKETS = (4, 8, 16, 1 << 30)


def _scores(regions: torch.Tensor, phrases: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    b, r, d = regions.shape
    t, p, _ = phrases.shape
    # One (B*R, D) x (D, T*P) product: as fast as the batched form, without einsum's permutes.
    sim = (regions.reshape(b * r, d) @ phrases.reshape(t * p, d).t()).reshape(b, r, t, p)
    best = sim.amax(dim=1)  # (B, T, P)
    w = valid.to(best.dtype)
    return (best * w[None]).sum(-1) / w.sum(-1).clamp(min=1.0)[None]


def local_alignment_loss(regions: torch.Tensor, phrases: torch.Tensor, valid: torch.Tensor,
                         owner: torch.Tensor, scale: torch.Tensor | float) -> torch.Tensor:
    """Multi-positive InfoNCE on the local scores (engine/training/losses.py's form), over the texts
    that have at least one phrase; 0 (with a graph) when none has."""
    from engine.training.losses import multi_positive_info_nce_logits

    has = valid.any(dim=1)
    if not bool(has.any()):
        return regions.sum() * 0.0
    logits = scale * local_scores(regions, phrases[has], valid[has])
    return multi_positive_info_nce_logits(logits, owner[has])
