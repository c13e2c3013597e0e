"""Recall@K for image→text and text→image with several texts per image (COCO/Flickr rules):
an image→text query is a hit when ANY of its texts is in the top K; a text→image query is a hit
when its own image is in the top K."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

KS = (1, 5, 10)


def recall_at_k(image_emb: np.ndarray, text_emb: np.ndarray, text_owner: Sequence[int],
                ks: Sequence[int] = KS) -> dict[str, dict[str, float]]:
    """image_emb (N, D), text_emb (T, D) L2-normalised; text_owner[t] = index of t's image."""
    owner = np.asarray(text_owner, dtype=np.int64)
    sim = image_emb.astype(np.float32) @ text_emb.astype(np.float32).T  # (N, T)
    n_img = sim.shape[0]
    # image -> text: rank of the best-ranked own text. Ties count against the query (stable,
    # pessimistic): a model that scores everything equal gets chance-level recall, not 1.0.
    own = owner[None, :] == np.arange(n_img)[:, None]
    best_own = np.where(own, sim, -np.inf).max(axis=1)
    rank_i2t = (np.where(own, -np.inf, sim) >= best_own[:, None]).sum(axis=1)
    # text -> image: rank of the own image among all images.
    sim_t = sim.T  # (T, N)
    own_score = sim_t[np.arange(len(owner)), owner]
    rank_t2i = (sim_t >= own_score[:, None]).sum(axis=1) - 1
    return {
        "i2t": {f"R@{k}": float((rank_i2t < k).mean()) for k in ks},
        "t2i": {f"R@{k}": float((rank_t2i < k).mean()) for k in ks},
    }
