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

import contextlib
import json
import math
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch.nn import functional as F

from engine.backends.clip.embedder import ClipEmbedder
from engine.backends.clip.text_tower import save_text_tower
from engine.errors import ModelError
from engine.models.device import autocast, training_autocast_dtype

if TYPE_CHECKING:
    from engine.training.configs import TrainConfig

TRAINING_INFO = "training.json"
# What a full (both towers trained) save copies from the base folder beside config and weights.
_FOLDER_EXTRAS = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "special_tokens_map.json",
                  "preprocessor_config.json")
_MAX_LOGIT_SCALE = 100.0


class ClipAdapter:
    """Train a CLIP text tower with the Trainer; see the module docstring."""

    def __init__(self, embedder: ClipEmbedder, *, amp: bool = True) -> None:
        if embedder.torch_dtype != torch.float32:
            # Optimiser updates of 1e-5 vanish in fp16/bf16 weights: master weights must be fp32.
            raise ValueError("train on a ClipEmbedder loaded with dtype='float32'")
        if embedder.compute == "fast" and embedder.compute_dtype != "float32":
            raise ValueError("train on a ClipEmbedder with compute='exact' (the fast path's bf16 copies get no gradients)")
        self.embedder = embedder
        self.model = embedder.model
        self.device = embedder.device
        self.amp_dtype = training_autocast_dtype(self.device) if amp else None
        self._log_scale: torch.nn.Parameter | None = None

    @classmethod
    def from_checkpoint(cls, checkpoint_dir: Path, *, device: str = "auto", text_tower_dir: Path | None = None,
                        model_id: str | None = None, amp: bool = True) -> ClipAdapter:
        """Load a CLIP folder in float32 (optionally with a text tower to continue from)."""
        embedder = ClipEmbedder(Path(checkpoint_dir), device=device, dtype="float32", compute="exact",
                                text_tower_dir=text_tower_dir, model_id=model_id)
        return cls(embedder, amp=amp)

    def _autocast(self) -> contextlib.AbstractContextManager:
        return autocast(self.device, self.amp_dtype)

    # -- DualEncoderAdapter ------------------------------------------------------
    def trainable_parameters(self, train_vision: bool, learn_temperature: bool) -> list[torch.nn.Parameter]:
        m = self.model
        params = list(m.text_model.parameters()) + list(m.text_projection.parameters())
        if train_vision:
            params += list(m.vision_model.parameters()) + list(m.visual_projection.parameters())
        for p in m.parameters():
            p.requires_grad_(False)
        for p in params:
            p.requires_grad_(True)
        if learn_temperature:
            # CLIP learned its own temperature: start from it (capped as CLIP's training caps it).
            if self._log_scale is None:
                start = min(float(m.logit_scale.detach().float()), math.log(_MAX_LOGIT_SCALE))
                self._log_scale = torch.nn.Parameter(torch.tensor(start, device=self.device))
            params.append(self._log_scale)
        return params

    def train_mode(self, train_vision: bool) -> None:
        self.model.eval()  # the frozen vision tower keeps inference behaviour
        self.model.text_model.train()
        self.model.text_projection.train()
        if train_vision:
            self.model.vision_model.train()
            self.model.visual_projection.train()

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
        ids, mask, offsets = tokenize_with_offsets(emb.tokenizer, texts, emb.effective_max_tokens(max_tokens))
        ids, mask = ids.to(self.device), mask.to(self.device)
        with self._autocast():
            tokens = emb.text_token_features(ids, mask)
        tokens = tokens.float()
        glob = tokens[torch.arange(len(ids), device=self.device), emb.pooled_positions(ids).long()]
        phrases, valid = pool_phrases(tokens, texts, offsets)
        return F.normalize(glob, dim=-1), phrases, valid

    def logit_scale(self, cfg: TrainConfig) -> torch.Tensor:
        if cfg.learn_temperature and self._log_scale is not None:
            return self._log_scale.exp().clamp(max=_MAX_LOGIT_SCALE)
        return torch.tensor(1.0 / cfg.temperature, device=self.device)

    def save(self, out_dir: Path, cfg: TrainConfig, *, text_only: bool, extra: dict) -> Path:
        from engine.fileutil import atomic_write_text

        out_dir = Path(out_dir)
        info: dict[str, Any] = {"training": cfg.to_dict(), "base_model_id": self.embedder.model_id,
                                "max_text_tokens": self.embedder.max_text_tokens, **extra}
        if text_only:
            save_text_tower(self.model, out_dir, cfg.name, base_model_id=self.embedder.model_id)
        else:
            self._save_full(out_dir)
        atomic_write_text(out_dir / TRAINING_INFO, json.dumps(info, indent=2, default=str) + "\n")
        return out_dir

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


def make_adapter(folder: Path, *, device: str = "auto", init_text_tower: Path | None = None,
                 model_id: str = "", amp: bool = True) -> ClipAdapter:
    """A trainable adapter on the folder's weights (float32), optionally starting from a text tower."""
    return ClipAdapter.from_checkpoint(folder, device=device, text_tower_dir=init_text_tower,
                                       model_id=model_id or None, amp=amp)


def embed_training_scenes(folder: Path, scenes: Sequence[Any], device: str) -> Any:
    """Frozen image embeddings (N, D) of SceneWorld training scenes, rendered at the size the
    evaluation renders them for this model."""
    import numpy as np

    from engine.evaluation.sceneworld import render_size_for
    from engine.sceneworld import render_scene

    emb = ClipEmbedder(Path(folder), device=device)
    size = render_size_for(emb)
    parts = [emb.encode_images([render_scene(s, size)[0] for s in scenes[i : i + 64]])
             for i in range(0, len(scenes), 64)]
    return np.concatenate(parts) if parts else np.zeros((0, emb.dim), dtype=np.float32)
