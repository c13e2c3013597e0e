"""Fast inference forwards for BLIP's unimodal towers (image and text embeddings only).

transformers' BLIP attention is "eager" only (matmul, softmax, matmul, with the full
attention-probability tensor materialised), and its towers compute every output token
although retrieval reads the [CLS] token alone. These forwards use the model's own modules
and change only how they are evaluated:

* torch's scaled_dot_product_attention (flash / memory-efficient kernels on CUDA, a fused
  kernel on the CPU) instead of eager attention;
* the last layer computes its query, attention output and MLP for [CLS] only (keys and
  values still come from every token), which skips ~1/12 of a tower's work;
* optionally a reduced-precision copy of a tower (bf16 on CPUs with native bf16 matmuls:
  about 1.3x faster than autocast, which re-casts every weight on every call). The copy is
  made on first use; `refresh()` drops it after the model's weights change (text towers).

The reference path (BlipEmbedder with compute="reference") stays transformers' forward; the
tests compare both.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

# Shared with the other backends' fast paths; re-exported here for BLIP's callers.
from engine.models.device import cpu_supports_bf16, intra_op_threads
from engine.models.hf_dual_encoder import ReducedPrecisionTowers

__all__ = ["FastBlipTowers", "cpu_supports_bf16", "intra_op_threads"]


class FastBlipTowers(ReducedPrecisionTowers):
    """Projected, not yet normalised [CLS] features of BlipForImageTextRetrieval's vision and
    text towers, computed with SDPA in `weight_dtype` (None: the model's own dtype)."""

    def vision_parts(self) -> tuple[Any, Any]:
        return self.model.vision_model, self.model.vision_proj

    def text_parts(self) -> tuple[Any, Any]:
        return self.model.text_encoder, self.model.text_proj

    # ------------------------------------------------------------------ vision

    def image_features(self, pixels: torch.Tensor) -> torch.Tensor:
        """(N, 3, S, S) pixels on the model's device -> (N, dim) float32 projected [CLS]."""
        vm, proj = self.vision()
        h = vm.embeddings(pixels.to(proj.weight.dtype))
        layers = vm.encoder.layers
        last = len(layers) - 1
        for i, layer in enumerate(layers):
            h = _vision_layer(layer, h, cls_only=i == last)
        return proj(vm.post_layernorm(h[:, 0])).float()

    # ------------------------------------------------------------------ text

    def text_features(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Token ids and 0/1 mask (N, L) -> (N, dim) float32 projected [CLS] of the unimodal
        text encoder (no cross-attention), as transformers computes it."""
        tm, proj = self.text()
        # A boolean "may attend" mask broadcast over heads and queries; None when nothing is
        # padded (the single-query case), which lets SDPA pick its fastest kernel.
        mask = None
        if not bool(attention_mask.all()):
            mask = attention_mask.bool()[:, None, None, :]
        h = tm.embeddings(input_ids=input_ids)
        layers = tm.encoder.layer
        last = len(layers) - 1
        for i, layer in enumerate(layers):
            h = _text_layer(layer, h, mask, cls_only=i == last)
        return proj(h[:, 0]).float()


def _vision_layer(layer: Any, h: torch.Tensor, *, cls_only: bool) -> torch.Tensor:
    """BlipEncoderLayer (pre-norm) with SDPA; with cls_only the output holds [CLS] alone."""
    attn = layer.self_attn
    b, t, c = h.shape
    heads = attn.num_heads
    x = layer.layer_norm1(h)
    q, k, v = attn.qkv(x).view(b, t, 3, heads, c // heads).permute(2, 0, 3, 1, 4).unbind(0)
    if cls_only:
        q, h = q[:, :, :1], h[:, :1]
    # SDPA's default scale is 1/sqrt(head_dim), the same as BlipAttention.scale.
    o = F.scaled_dot_product_attention(q, k, v)
    h = h + attn.projection(o.transpose(1, 2).reshape(b, -1, c))
    return h + layer.mlp(layer.layer_norm2(h))


def _text_layer(layer: Any, h: torch.Tensor, mask: torch.Tensor | None, *, cls_only: bool) -> torch.Tensor:
    """BlipTextLayer (post-norm BERT layer, no cross-attention) with SDPA."""
    sa = layer.attention.self
    b, t, _ = h.shape
    heads, head_dim = sa.num_attention_heads, sa.attention_head_size
    src = h[:, :1] if cls_only else h
    q = sa.query(src).view(b, -1, heads, head_dim).transpose(1, 2)
    k = sa.key(h).view(b, t, heads, head_dim).transpose(1, 2)
    v = sa.value(h).view(b, t, heads, head_dim).transpose(1, 2)
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    a = layer.attention.output(o.transpose(1, 2).reshape(b, -1, heads * head_dim), src)
    return layer.output(layer.intermediate(a), a)
