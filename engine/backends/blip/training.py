"""DualEncoderAdapter for BLIP (transformers' BlipForImageTextRetrieval).

The text path is BlipEmbedder's own (its tokenizer call, its unimodal text encoder, the [CLS]
state through text_proj), so a tower trained here embeds queries exactly as the app will.
Trainable: text_encoder + text_proj (the parts a text-tower override replaces); the vision
tower stays frozen unless a config trains it. On CUDA the forward passes run under bf16
autocast where the GPU supports it (weights and optimizer state stay float32); older GPUs
without bf16 train in float32, because fp16 would need loss scaling for the gradients.

Nothing imports this module at `engine` import time (torch and transformers load here).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch.nn import functional as F

from engine.backends.blip.embedder import BlipEmbedder, save_text_tower
from engine.models.hf_dual_encoder import HfTextTowerAdapter


class BlipAdapter(HfTextTowerAdapter):
    """Train a BLIP text tower with the Trainer; see the module docstring."""

    embedder_class = BlipEmbedder

    def text_modules(self) -> list[Any]:
        return [self.model.text_encoder, self.model.text_proj]

    def vision_modules(self) -> list[Any]:
        return [self.model.vision_model, self.model.vision_proj]

    def initial_log_scale(self) -> float:
        # BlipForImageTextRetrieval has no temperature of its own; BLIP starts from τ = 0.07.
        return math.log(1 / 0.07)

    def encode_pixels(self, pixels: torch.Tensor) -> torch.Tensor:
        with self._autocast():
            states = self.embedder.vision_states(pixels.to(device=self.device, dtype=torch.float32))
            proj = self.model.vision_proj(states[:, 0, :])
        return F.normalize(proj.float(), dim=-1)

    def encode_texts(self, texts: Sequence[str], max_tokens: int) -> torch.Tensor:
        enc = self.embedder.tokenize(list(texts), max_tokens)
        with self._autocast():
            states = self.embedder.text_states(enc["input_ids"].to(self.device),
                                                enc["attention_mask"].to(self.device))
            proj = self.model.text_proj(states[:, 0, :])
        # Normalised in float32, as BlipEmbedder does: low-precision norms of 256-d vectors drift.
        return F.normalize(proj.float(), dim=-1)

    # -- RegionAdapter (local phrase-region alignment, engine/training/local_alignment.py) --------
    def encode_pixel_regions(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The global embedding (as encode_pixels: vision_proj of [CLS]) and one region per patch:
        vision_proj of every patch state of the same last_hidden_state, both normalised (the patch
        embeddings BLIP's grounder reads, engine/backends/blip/grounder.py)."""
        with self._autocast():
            states = self.embedder.vision_states(pixels.to(device=self.device, dtype=torch.float32))
            proj = self.model.vision_proj(states)
        proj = proj.float()
        return F.normalize(proj[:, 0], dim=-1), F.normalize(proj[:, 1:], dim=-1)

    def encode_text_phrases(self, texts: Sequence[str], max_tokens: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The global embedding (as encode_texts: text_proj of [CLS]) and the phrases' embeddings:
        the mean of each phrase's token states through the same text_proj."""
        from engine.grounding.parts import pool_phrases
        from engine.models.tokenizers import tokenize_with_offsets

        emb = self.embedder
        texts = emb.clean_texts(texts)  # as encode_texts cleans them; the offsets are the cleaned texts'
        ids, mask, offsets = tokenize_with_offsets(emb.tokenizer, texts, emb.effective_max_tokens(max_tokens))
        with self._autocast():
            states = emb.text_states(ids.to(self.device), mask.to(self.device))
            tokens = self.model.text_proj(states)
        tokens = tokens.float()
        phrases, valid = pool_phrases(tokens, texts, offsets)
        return F.normalize(tokens[:, 0], dim=-1), phrases, valid

    def save_text_tower(self, out_dir: Path, name: str) -> None:
        save_text_tower(self.model, out_dir, name, base_model_id=self.embedder.model_id)

    def _save_full(self, out_dir: Path) -> None:
        """Both towers trained: a complete Hugging Face folder (config, weights, tokenizer)."""
        import shutil

        from engine.backends.blip.checkpoints import save_blip_tokenizer

        out_dir.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(str(out_dir))
        save_blip_tokenizer(self.embedder.tokenizer, out_dir)
        pre = self.embedder.checkpoint_dir / "preprocessor_config.json"
        if pre.is_file():
            shutil.copyfile(pre, out_dir / pre.name)


# The backend's make_training_adapter hook (engine/models/backend.py).
make_adapter = BlipAdapter.for_training


def embed_training_scenes(folder: Path, scenes: Sequence[Any], device: str) -> Any:
    """Frozen image embeddings (N, D) of SceneWorld training scenes, rendered at the size the
    evaluation renders them for this model."""
    from engine.evaluation.sceneworld import embed_rendered_scenes

    return embed_rendered_scenes(BlipEmbedder(folder, device=device), scenes)
