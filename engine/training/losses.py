"""Contrastive losses (formulas in docs/training.md).

All take L2-normalised embeddings and a scale s = 1/τ. Notation: image i, its texts T(i).

- info_nce: one positive text per image; symmetric cross-entropy over the B×B similarity matrix.
- multi_positive_info_nce (and _logits, on given logits): K positives per image. Image→text: the mean over the K positives of
  -log softmax over all B·K texts (each positive is a target, the others compete). Text→image:
  each text picks its own image among the B images. The two directions are averaged.
- hard_negative_info_nce: InfoNCE whose image→text denominator also holds that image's own M
  hard negatives (texts wrong in one detail); text→image is unchanged.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F


def info_nce(img: torch.Tensor, txt: torch.Tensor, scale: torch.Tensor | float) -> torch.Tensor:
    logits = scale * img @ txt.t()
    target = torch.arange(img.shape[0], device=img.device)
    return 0.5 * (F.cross_entropy(logits, target) + F.cross_entropy(logits.t(), target))


def multi_positive_info_nce(
    img: torch.Tensor, txt: torch.Tensor, owner: torch.Tensor, scale: torch.Tensor | float
) -> torch.Tensor:
    """img (B, D); txt (T, D); owner (T,) the image index of each text (every image owns ≥ 1)."""
    return multi_positive_info_nce_logits(scale * img @ txt.t(), owner)


def multi_positive_info_nce_logits(logits: torch.Tensor, owner: torch.Tensor) -> torch.Tensor:
    """The multi-positive loss on given (B, T) image-text logits (global cosines or local scores).
    Images that own no text (their texts were left out) take no image-to-text term."""
    positive = owner[None, :] == torch.arange(logits.shape[0], device=logits.device)[:, None]  # (B, T)
    log_p_i2t = logits.log_softmax(dim=1)
    n_pos = positive.sum(dim=1)
    owns = n_pos > 0
    i2t = -(log_p_i2t * positive).sum(dim=1)[owns] / n_pos[owns]
    t2i = F.cross_entropy(logits.t(), owner)
    return 0.5 * (i2t.mean() + t2i)


def hard_negative_info_nce(
    img: torch.Tensor, txt: torch.Tensor, negatives: torch.Tensor, scale: torch.Tensor | float
) -> torch.Tensor:
    """img (B, D), txt (B, D) positives; negatives (B, M, D): image i's own hard negatives."""
    logits = scale * img @ txt.t()  # (B, B)
    neg_logits = scale * torch.einsum("bd,bmd->bm", img, negatives)  # (B, M)
    target = torch.arange(img.shape[0], device=img.device)
    i2t = F.cross_entropy(torch.cat([logits, neg_logits], dim=1), target)
    t2i = F.cross_entropy(logits.t(), target)
    return 0.5 * (i2t + t2i)
