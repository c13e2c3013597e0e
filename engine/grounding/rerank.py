"""Re-ranking the top ANN candidates of a text search with a finer image-text score.

BLIP: the ITM head (cross-attention over all patches) scores the query against each of the
top k candidates; hits are re-ordered by ITM match probability, the ANN cosine is kept.

sceneworld-mini: two candidates were measured on SceneWorld's long split (seed 2000, 1,000
scenes, top 32). Phrase coverage (mean calibrated support of the query's noun phrases) lowers
text-to-image R@1 from 0.892 to 0.503 on its own, and mixing it into the ANN score moves R@1 by
at most +0.006. Its matching head (mean sentence logit, weight chosen on validation seed 1500)
gives 0.885. So re-ranking is off for sceneworld-mini: `rerank_support` says why and the
searcher keeps the ANN order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from PIL import Image

DEFAULT_RERANK_K = 32
MINI_NOTE = ("re-ranking is off for sceneworld-mini: neither its matching head (0.892 -> 0.885) nor "
             "phrase coverage (0.892 -> 0.503) raised long-query R@1 on SceneWorld (docs/grounding.md)")


def rerank_support(embedder: Any) -> tuple[bool, str]:
    """(available, reason when not) for ITM re-ranking with this embedder."""
    name = type(embedder).__name__
    if name == "BlipEmbedder":
        from engine.grounding.blip import has_cross_attention

        if has_cross_attention(embedder.model):
            return True, ""
        return False, f"model {embedder.model_id!r} has no cross-attention layers, so no ITM head to re-rank with"
    if name == "SceneWorldMiniEmbedder":
        return False, MINI_NOTE
    return False, f"re-ranking is not available for model {getattr(embedder, 'model_id', '?')!r}"


def itm_scores(embedder: Any, images: Sequence[Image.Image], query: str, max_tokens: int | None = None) -> np.ndarray:
    """ITM match probability of `query` for each image (BLIP), batched."""
    import torch

    from engine.grounding.blip import BlipGrounder

    g = BlipGrounder(embedder)
    model = embedder.model
    budget = embedder._effective_max_tokens(max_tokens)
    enc = embedder.tokenizer([query], truncation=True, max_length=budget, return_tensors="pt")
    ids = g._itm_ids(enc["input_ids"]).to(embedder.device)
    mask = enc["attention_mask"].to(embedder.device)
    out = []
    with torch.inference_mode():
        for start in range(0, len(images), embedder.batch_size):
            batch = images[start : start + embedder.batch_size]
            px = torch.from_numpy(embedder.preprocess(batch)).to(device=embedder.device, dtype=embedder._torch_dtype)
            states = embedder._vision_states(px)
            n = len(batch)
            h = model.text_encoder(
                input_ids=ids.expand(n, -1), attention_mask=mask.expand(n, -1), encoder_hidden_states=states,
                encoder_attention_mask=torch.ones(states.shape[:2], dtype=torch.long, device=states.device),
            ).last_hidden_state
            out.append(torch.softmax(model.itm_head(h[:, 0, :]).float(), dim=-1)[:, 1].cpu().numpy())
    return np.concatenate(out) if out else np.zeros(0)
