"""sceneworld-mini's image-text matching head at run time: the network and its files.

The analogue of BLIP's ITM head (the design, and why it exists, is described in
engine/training/matcher_training.py, which trains it):

    text tokens -> text tower layers (self-attention)
                -> `layers` blocks of self-attention + cross-attention over the patch tokens
                   of the matcher's own vision tower -> masked mean -> logit

plus phrase-patch alignment (align_logits), which the grounder uses as a phrase feature and
as its "align" map method, and re-ranking as a sentence score.

Files: MODEL_DIR/matcher/{matcher.safetensors, matcher.json}.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
from torch import nn

from engine.backends.sceneworld_mini.network import MiniConfig, SceneWorldMini, TextTower, VisionTower
from engine.errors import ModelIntegrityError

MATCHER_DIR = "matcher"
WEIGHTS = "matcher.safetensors"
META = "matcher.json"
MAX_TOKENS = 48


class MiniMatcher(nn.Module):
    def __init__(self, cfg: MiniConfig, layers: int = 2) -> None:
        super().__init__()
        self.cfg = cfg
        self.vision = VisionTower(cfg)
        self.text = TextTower(cfg)
        w = cfg.vision_width
        if cfg.text_width != w:
            raise ValueError("matcher needs text_width == vision_width")
        block = nn.TransformerDecoderLayer(w, cfg.heads, w * cfg.mlp_ratio, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.cross = nn.TransformerDecoder(block, layers)
        self.norm = nn.LayerNorm(w)
        self.head = nn.Linear(w, 1)
        # Phrase-patch alignment (GLIP-style): a phrase's pooled text state against every patch
        # token; trained on SceneWorld's object masks, so its map says where the phrase is and
        # its maximum whether anything in the image is what the phrase says.
        self.align_img = nn.Linear(w, w)
        self.align_txt = nn.Linear(w, w)
        self.align_bias = nn.Parameter(torch.tensor(-4.0))
        self.has_alignment = True  # False for heads trained without the alignment loss

    @classmethod
    def from_model(cls, model: SceneWorldMini, layers: int = 2) -> MiniMatcher:
        m = cls(model.cfg, layers)
        m.vision.load_state_dict(model.vision.state_dict())
        m.text.load_state_dict(model.text.state_dict())
        return m

    def image_tokens(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.vision.patch_tokens(pixels)

    def text_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        t = self.text
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = t.embed_norm(t.tok_proj(t.tok(input_ids)) + t.pos(positions)[None])
        return t.encoder(x, src_key_padding_mask=attention_mask == 0)

    def forward(self, image_tokens: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Match logits (N,) for N (image tokens, text) pairs; image_tokens (N, P, width)."""
        x = self.text_states(input_ids, attention_mask)
        x = self.cross(x, image_tokens, tgt_key_padding_mask=attention_mask == 0)
        return self.head(_masked_mean(self.norm(x), attention_mask)).squeeze(-1)

    def align_logits(self, image_tokens: torch.Tensor, input_ids: torch.Tensor,
                     attention_mask: torch.Tensor) -> torch.Tensor:
        """Per-patch alignment logits (N, P) of N phrases with their images' tokens (N, P, width)."""
        q = self.align_txt(_masked_mean(self.text.norm(self.text_states(input_ids, attention_mask)), attention_mask))
        k = self.align_img(image_tokens)
        return torch.einsum("npd,nd->np", k, q) / math.sqrt(k.shape[-1]) + self.align_bias


def _masked_mean(x: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    m = attention_mask.unsqueeze(-1).to(x.dtype)
    return (x * m).sum(1) / m.sum(1).clamp(min=1.0)


# --------------------------------------------------------------------------- storage


def save_matcher(matcher: MiniMatcher, folder: Path, meta: dict[str, Any]) -> Path:
    from safetensors.torch import save_file

    from engine.fileutil import atomic_write_text

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(torch.float16 if v.is_floating_point() else v.dtype).contiguous().cpu()
             for k, v in matcher.state_dict().items()}
    tmp = folder / (WEIGHTS + ".tmp")
    save_file(state, str(tmp))
    tmp.replace(folder / WEIGHTS)
    atomic_write_text(folder / META, json.dumps({"layers": len(matcher.cross.layers), **meta}, indent=2) + "\n")
    return folder


def load_matcher(model_dir: Path, cfg: MiniConfig, device: str = "cpu") -> MiniMatcher | None:
    """The model's matcher, or None when the model folder has none."""
    from safetensors.torch import load_file

    folder = Path(model_dir) / MATCHER_DIR
    if not (folder / WEIGHTS).is_file():
        return None
    from engine.jsonfile import read_json_file
    from engine.limits import MAX_SMALL_JSON_BYTES

    try:
        meta = read_json_file(folder / META, max_bytes=MAX_SMALL_JSON_BYTES)
    except (OSError, ValueError) as exc:
        raise ModelIntegrityError(f"{folder / META}: cannot be read as JSON ({exc})") from None
    m = MiniMatcher(cfg, int(meta.get("layers", 2)))
    state = {k: v.float() for k, v in load_file(str(folder / WEIGHTS)).items()}
    # Heads trained before phrase-patch alignment existed have no align_* weights: they load
    # without it (has_alignment False) and the grounder does without the alignment features.
    missing, unexpected = m.load_state_dict(state, strict=False)
    if unexpected or any(not k.startswith("align_") for k in missing):
        raise ModelIntegrityError(f"{folder / WEIGHTS}: weights do not fit the matcher "
                                  f"(missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]})")
    m.has_alignment = not missing and float(meta.get("settings", {}).get("align_weight", 0.0)) > 0
    return m.to(device).eval()
