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

import contextlib
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch.nn import functional as F

from engine.backends.blip.embedder import BlipEmbedder, save_text_tower
from engine.models.device import autocast, training_autocast_dtype

if TYPE_CHECKING:
    from engine.training.configs import TrainConfig

TRAINING_INFO = "training.json"


class BlipAdapter:
    """Train a BLIP text tower with the Trainer; see the module docstring."""

    def __init__(self, embedder: BlipEmbedder, *, amp: bool = True) -> None:
        if embedder.torch_dtype != torch.float32:
            # Optimiser updates of 1e-5 vanish in fp16/bf16 weights: master weights must be fp32.
            raise ValueError("train on a BlipEmbedder loaded with dtype='float32'")
        self.embedder = embedder
        self.model = embedder.model
        self.device = embedder.device
        self.amp_dtype = training_autocast_dtype(self.device) if amp else None
        self._log_scale: torch.nn.Parameter | None = None

    @classmethod
    def from_checkpoint(
        cls,
        checkpoint_dir: Path,
        *,
        device: str = "auto",
        text_tower_dir: Path | None = None,
        model_id: str | None = None,
        amp: bool = True,
    ) -> BlipAdapter:
        """Load a BLIP folder in float32 (optionally with a text tower to continue from)."""
        embedder = BlipEmbedder(Path(checkpoint_dir), device=device, dtype="float32",
                                text_tower_dir=text_tower_dir, model_id=model_id)
        return cls(embedder, amp=amp)

    def _autocast(self) -> contextlib.AbstractContextManager:
        return autocast(self.device, self.amp_dtype)

    # -- DualEncoderAdapter ------------------------------------------------------
    def trainable_parameters(self, train_vision: bool, learn_temperature: bool) -> list[torch.nn.Parameter]:
        m = self.model
        params = list(m.text_encoder.parameters()) + list(m.text_proj.parameters())
        if train_vision:
            params += list(m.vision_model.parameters()) + list(m.vision_proj.parameters())
        for p in m.parameters():
            p.requires_grad_(False)
        for p in params:
            p.requires_grad_(True)
        if learn_temperature:
            # BlipForImageTextRetrieval has no temperature of its own; BLIP starts from τ = 0.07.
            if self._log_scale is None:
                self._log_scale = torch.nn.Parameter(torch.tensor(math.log(1 / 0.07), device=self.device))
            params.append(self._log_scale)
        return params

    def train_mode(self, train_vision: bool) -> None:
        self.model.eval()  # the ITM head and (frozen) vision tower keep inference behaviour
        self.model.text_encoder.train()
        self.model.text_proj.train()
        if train_vision:
            self.model.vision_model.train()
            self.model.vision_proj.train()

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
        ids, mask, offsets = tokenize_with_offsets(emb.tokenizer, texts, emb.effective_max_tokens(max_tokens))
        with self._autocast():
            states = emb.text_states(ids.to(self.device), mask.to(self.device))
            tokens = self.model.text_proj(states)
        tokens = tokens.float()
        phrases, valid = pool_phrases(tokens, texts, offsets)
        return F.normalize(tokens[:, 0], dim=-1), phrases, valid

    def logit_scale(self, cfg: TrainConfig) -> torch.Tensor:
        if cfg.learn_temperature and self._log_scale is not None:
            return self._log_scale.exp().clamp(max=100.0)
        return torch.tensor(1.0 / cfg.temperature, device=self.device)

    def save(self, out_dir: Path, cfg: TrainConfig, *, text_only: bool, extra: dict) -> Path:
        from engine.fileutil import atomic_write_text

        out_dir = Path(out_dir)
        info: dict[str, Any] = {"training": cfg.to_dict(), "base_model_id": self.embedder.model_id, **extra}
        if text_only:
            save_text_tower(self.model, out_dir, cfg.name, base_model_id=self.embedder.model_id)
        else:
            self._save_full(out_dir)
        atomic_write_text(out_dir / TRAINING_INFO, json.dumps(info, indent=2, default=str) + "\n")
        return out_dir

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


def make_adapter(folder: Path, *, device: str = "auto", init_text_tower: Path | None = None,
                 model_id: str = "", amp: bool = True) -> BlipAdapter:
    """A trainable adapter on the folder's weights (float32), optionally starting from a text tower."""
    return BlipAdapter.from_checkpoint(folder, device=device, text_tower_dir=init_text_tower,
                                       model_id=model_id or None, amp=amp)


def embed_training_scenes(folder: Path, scenes: Sequence[Any], device: str) -> Any:
    """Frozen image embeddings (N, D) of SceneWorld training scenes, rendered at the size the
    evaluation renders them for this model."""
    import numpy as np

    from engine.evaluation.sceneworld import render_size_for
    from engine.sceneworld import render_scene

    emb = BlipEmbedder(folder, device=device)
    size = render_size_for(emb)
    parts = [emb.encode_images([render_scene(s, size)[0] for s in scenes[i : i + 64]])
             for i in range(0, len(scenes), 64)]
    return np.concatenate(parts)
