"""Re-ranking with BLIP: the ITM head (cross-attention over all patches) scores the query against
each of the top k candidates; hits are re-ordered by ITM match probability, the ANN cosine is kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from PIL import Image


def rerank_support(embedder: Any) -> tuple[bool, str]:
    """(available, reason when not): BLIP re-ranks when its checkpoint has an ITM head."""
    from engine.backends.blip.grounder import has_cross_attention

    if has_cross_attention(embedder.model):
        return True, ""
    return False, f"model {embedder.model_id!r} has no cross-attention layers, so no ITM head to re-rank with"


def rerank_scores(embedder: Any, images: Sequence[Image.Image], query: str, ann_scores: Sequence[float],
                  max_tokens: int | None = None) -> np.ndarray:
    """BLIP's ITM match probability (the ANN cosine plays no part in the order)."""
    return itm_scores(embedder, images, query, max_tokens=max_tokens)


def itm_scores(embedder: Any, images: Sequence[Image.Image], query: str, max_tokens: int | None = None) -> np.ndarray:
    """ITM match probability of `query` for each image (BLIP), batched."""
    import torch

    from engine.backends.blip.grounder import BlipGrounder

    g = BlipGrounder(embedder)
    model = embedder.model
    budget = embedder.effective_max_tokens(max_tokens)
    enc = embedder.tokenizer([query], truncation=True, max_length=budget, return_tensors="pt")
    ids = g.itm_input_ids(enc["input_ids"]).to(embedder.device)
    mask = enc["attention_mask"].to(embedder.device)
    out = []
    with torch.inference_mode():
        for start in range(0, len(images), embedder.batch_size):
            batch = images[start : start + embedder.batch_size]
            px = torch.from_numpy(embedder.preprocess(batch)).to(device=embedder.device, dtype=embedder.torch_dtype)
            states = embedder.vision_states(px)
            n = len(batch)
            h = model.text_encoder(
                input_ids=ids.expand(n, -1), attention_mask=mask.expand(n, -1), encoder_hidden_states=states,
                encoder_attention_mask=torch.ones(states.shape[:2], dtype=torch.long, device=states.device),
            ).last_hidden_state
            out.append(torch.softmax(model.itm_head(h[:, 0, :]).float(), dim=-1)[:, 1].cpu().numpy())
    return np.concatenate(out) if out else np.zeros(0)
