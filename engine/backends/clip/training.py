"""DualEncoderAdapter for CLIP-family models (transformers' CLIPModel: OpenAI CLIP, Long-CLIP).

The text path is ClipEmbedder's own (its tokenizer call with the model's truncation, the same
SDPA forward read at the pooled token, text_projection), so a tower trained here embeds queries
exactly as the app will. Trainable: text_model + text_projection, the parts a text-tower override
(engine/backends/clip/text_tower.py) replaces; the vision tower stays frozen unless a config trains
it. Weights and optimiser state are float32; on CUDA the forward passes run under bf16 autocast
where the GPU has it (engine/models/device.py), and float32 elsewhere: fp16 would need loss
scaling. Long-CLIP's 248 position rows train as they are, with no re-stretching; a token budget
past the model's positions is read up to them, as search reads it.

Nothing imports this module at `engine` import time (torch and transformers load here).
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch.nn import functional as F

from engine.backends.clip.embedder import ClipEmbedder
from engine.backends.clip.text_tower import save_text_tower
from engine.errors import ModelError
from engine.models.hf_dual_encoder import MAX_LOGIT_SCALE, HfTextTowerAdapter

# What a full (both towers trained) save copies from the base folder beside config and weights.
_FOLDER_EXTRAS = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "special_tokens_map.json",
                  "preprocessor_config.json")


class ClipAdapter(HfTextTowerAdapter):
    """Train a CLIP text tower with the Trainer; see the module docstring."""

    embedder_class = ClipEmbedder

    def __init__(self, embedder: ClipEmbedder, *, amp: bool = True) -> None:
        super().__init__(embedder, amp=amp)
        if embedder.compute == "fast" and embedder.compute_dtype != "float32":
            raise ValueError("train on a ClipEmbedder with compute='exact' (the fast path's bf16 copies get no gradients)")

    def text_modules(self) -> list[Any]:
        return [self.model.text_model, self.model.text_projection]

    def vision_modules(self) -> list[Any]:
        return [self.model.vision_model, self.model.visual_projection]

    def initial_log_scale(self) -> float:
        # CLIP learned its own temperature: start from it (capped as CLIP's training caps it).
        return min(float(self.model.logit_scale.detach().float()), math.log(MAX_LOGIT_SCALE))

    def encode_pixels(self, pixels: torch.Tensor) -> torch.Tensor:
        with self._autocast():
            feats = self.embedder.image_features(pixels.to(device=self.device, dtype=torch.float32))
        return F.normalize(feats.float(), dim=-1)

    def encode_texts(self, texts: Sequence[str], max_tokens: int) -> torch.Tensor:
        enc = self.embedder.tokenize(list(texts), max_tokens)
        with self._autocast():
            feats = self.embedder.text_features(enc["input_ids"].to(self.device), enc["attention_mask"].to(self.device))
        # Normalised in float32, as ClipEmbedder does: low-precision norms drift.
        return F.normalize(feats.float(), dim=-1)

    # -- RegionAdapter (local phrase-region alignment, engine/training/local_alignment.py) --------
    def encode_pixel_regions(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The global embedding (as encode_pixels) and one region per patch ([CLS] excluded), both
        normalised. A region is the patch's value-path embedding, the one the CLIP grounder's default
        maps read (engine/backends/clip/grounder.py): the tokens entering the last vision block go
        through its value path alone, out_proj(v_proj(layer_norm1(x))), then post_layernorm and
        visual_projection, as MaskCLIP/ClearCLIP do. The plain last-block patch tokens are not used:
        that block's attention pools them into [CLS] and they carry mostly global content, so a
        phrase's best region would say little about where the phrase is."""
        from engine.backends.clip.grounder import image_embedding_from, tokens_entering, value_path

        vision, proj = self.model.vision_model, self.model.visual_projection
        last = len(vision.encoder.layers) - 1
        if last < 0:
            raise ModelError(f"the CLIP model {self.embedder.model_id!r} has no vision blocks to take regions from")
        with self._autocast():
            h = tokens_entering(vision, pixels.to(device=self.device, dtype=torch.float32), last)
            glob = image_embedding_from(vision, proj, h, last)
            regions = proj(vision.post_layernorm(value_path(vision.encoder.layers[last], h[:, 1:])))
        return F.normalize(glob.float(), dim=-1), F.normalize(regions.float(), dim=-1)

    def encode_text_phrases(self, texts: Sequence[str], max_tokens: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The global embedding (as encode_texts) and the phrases' embeddings: the mean of each
        phrase's projected token states (text_projection after final_layer_norm, the projection the
        global embedding is read through; causal, so a token has seen the text up to itself)."""
        from engine.grounding.parts import pool_phrases
        from engine.models.tokenizers import tokenize_with_offsets

        emb = self.embedder
        # Cleaned as encode_texts cleans them; the offsets and the phrases are the cleaned texts'.
        texts = emb.clean_texts(texts)
        ids, mask, offsets = tokenize_with_offsets(emb.tokenizer, texts, emb.effective_max_tokens(max_tokens))
        ids, mask = ids.to(self.device), mask.to(self.device)
        with self._autocast():
            tokens = emb.text_token_features(ids, mask)
        tokens = tokens.float()
        glob = tokens[torch.arange(len(ids), device=self.device), emb.pooled_positions(ids).long()]
        phrases, valid = pool_phrases(tokens, texts, offsets)
        return F.normalize(glob, dim=-1), phrases, valid

    def training_info(self) -> dict[str, Any]:
        return {"max_text_tokens": self.embedder.max_text_tokens}

    def save_text_tower(self, out_dir: Path, name: str) -> None:
        save_text_tower(self.model, out_dir, name, base_model_id=self.embedder.model_id)

    def _save_full(self, out_dir: Path) -> None:
        """Both towers trained: a complete CLIPModel folder (config, weights, tokenizer, preprocessing)."""
        from transformers.utils import logging as hf_logging

        out_dir.mkdir(parents=True, exist_ok=True)
        hf_logging.disable_progress_bar()
        self.model.save_pretrained(str(out_dir))
        for name in _FOLDER_EXTRAS:
            src = self.embedder.checkpoint_dir / name
            if src.is_file():
                shutil.copyfile(src, out_dir / name)


# The backend's make_training_adapter hook (engine/models/backend.py).
make_adapter = ClipAdapter.for_training


def embed_training_scenes(folder: Path, scenes: Sequence[Any], device: str) -> Any:
    """Frozen image embeddings (N, D) of SceneWorld training scenes, rendered at the size the
    evaluation renders them for this model."""
    from engine.evaluation.sceneworld import embed_rendered_scenes

    return embed_rendered_scenes(ClipEmbedder(Path(folder), device=device), scenes)
