"""Fast inference forwards for CLIPModel's two towers (embeddings only).

They use the model's own modules and change only how they are evaluated, as BLIP's do
(engine/backends/blip/fast.py):

* torch's scaled_dot_product_attention, with the text tower's causal and padding masks as one
  boolean mask (or is_causal=True when nothing is padded, which lets SDPA pick its fastest kernel);
* the last vision layer computes its query, attention output and MLP for [CLS] alone, the last
  text layer for the pooled token alone (keys and values still come from every token), which
  skips about 1/12 (B) or 1/24 (L) of a tower's work;
* optionally a reduced-precision copy of the towers (bf16 on CPUs with native bf16 matmuls), made
  on first use and kept: the cached text tower a query reuses.

The pooled text token follows transformers' rule for the config's eos_token_id: 2 (the legacy
value of the openai/clip-* configs) is OpenAI's own "highest id" (argmax), anything else the first
<|endoftext|>. The reference path (ClipEmbedder with compute="reference") is transformers'
get_image_features/get_text_features; the tests compare both.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from engine.models.hf_dual_encoder import ReducedPrecisionTowers

__all__ = ["FastClipTowers", "pooled_positions"]


def pooled_positions(input_ids: torch.Tensor, eos_token_id: int) -> torch.Tensor:
    """The index of the token whose state is the text embedding, per row (transformers' rule)."""
    ids = input_ids.to(torch.int)
    if eos_token_id == 2:
        return ids.argmax(dim=-1)
    return (ids == eos_token_id).int().argmax(dim=-1)


class FastClipTowers(ReducedPrecisionTowers):
    """Projected, not yet normalised features of a CLIPModel, computed with SDPA in
    `weight_dtype` (None: the model's own dtype)."""

    def __init__(self, model: Any, *, weight_dtype: torch.dtype | None = None) -> None:
        super().__init__(model, weight_dtype=weight_dtype)
        self.eos_token_id = int(model.config.text_config.eos_token_id)

    def vision_parts(self) -> tuple[Any, Any]:
        return self.model.vision_model, self.model.visual_projection

    def text_parts(self) -> tuple[Any, Any]:
        return self.model.text_model, self.model.text_projection

    # ------------------------------------------------------------------ vision

    def image_features(self, pixels: torch.Tensor) -> torch.Tensor:
        """(N, 3, S, S) pixels on the model's device -> (N, dim) float32 projected [CLS]."""
        vm, proj = self.vision()
        h = vm.pre_layrnorm(vm.embeddings(pixels.to(proj.weight.dtype)))
        layers = vm.encoder.layers
        last = len(layers) - 1
        for i, layer in enumerate(layers):
            h = _layer(layer, h, query_rows=torch.zeros(h.shape[0], dtype=torch.long, device=h.device)
                       if i == last else None)
        return proj(vm.post_layernorm(h[:, 0])).float()

    # ------------------------------------------------------------------ text

    def text_features(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Token ids and 0/1 mask (N, L) -> (N, dim) float32 projected pooled states."""
        tm, proj = self.text()
        b, t = input_ids.shape
        pooled = pooled_positions(input_ids, self.eos_token_id).long()
        mask = None
        if not bool(attention_mask.all()):
            causal = torch.ones(t, t, dtype=torch.bool, device=input_ids.device).tril()
            mask = causal[None, None] & attention_mask.bool()[:, None, None, :]
        h = tm.embeddings(input_ids=input_ids)
        layers = tm.encoder.layers
        last = len(layers) - 1
        for i, layer in enumerate(layers):
            h = _layer(layer, h, mask=mask, causal=True, query_rows=pooled if i == last else None)
        if not layers:  # no layer picked the pooled row
            h = h[torch.arange(b, device=h.device), pooled][:, None]
        return proj(tm.final_layer_norm(h[:, 0])).float()


    def text_token_features(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """As text_features, for every token: (N, L, dim) float32 projected states after
        final_layer_norm, the last layer computed for all rows (phrase embeddings read them)."""
        tm, proj = self.text()
        t = input_ids.shape[1]
        mask = None
        if not bool(attention_mask.all()):
            causal = torch.ones(t, t, dtype=torch.bool, device=input_ids.device).tril()
            mask = causal[None, None] & attention_mask.bool()[:, None, None, :]
        h = tm.embeddings(input_ids=input_ids)
        for layer in tm.encoder.layers:
            h = _layer(layer, h, mask=mask, causal=True)
        return proj(tm.final_layer_norm(h)).float()


def _layer(layer: Any, h: torch.Tensor, *, mask: torch.Tensor | None = None, causal: bool = False,
           query_rows: torch.Tensor | None = None) -> torch.Tensor:
    """CLIPEncoderLayer (pre-norm) with SDPA. With query_rows (N,) the output holds only that row
    of each sequence, (N, 1, C): the token the tower's embedding is read from."""
    attn = layer.self_attn
    b, t, c = h.shape
    heads, head_dim = attn.num_heads, attn.head_dim
    x = layer.layer_norm1(h)
    k = attn.k_proj(x).view(b, t, heads, head_dim).transpose(1, 2)
    v = attn.v_proj(x).view(b, t, heads, head_dim).transpose(1, 2)
    if query_rows is not None:
        rows = torch.arange(b, device=h.device)
        h, x = h[rows, query_rows][:, None], x[rows, query_rows][:, None]
        if causal:
            # The one query at position p may see keys 0..p (and, with padding, only real ones).
            keys = torch.arange(t, device=h.device)[None, :] <= query_rows[:, None]
            rmask = keys[:, None, None, :]
            mask = rmask if mask is None else mask[rows, :, query_rows][:, :, None, :] & rmask
        causal = False
    q = attn.q_proj(x).view(b, -1, heads, head_dim).transpose(1, 2)
    # SDPA's default scale is 1/sqrt(head_dim), the same as CLIPAttention.scale.
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal and mask is None)
    h = h + attn.out_proj(o.transpose(1, 2).reshape(b, -1, c))
    return h + layer.mlp(layer.layer_norm2(h))
