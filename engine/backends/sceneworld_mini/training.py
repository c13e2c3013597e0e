"""sceneworld-mini's training side: the DualEncoderAdapter the trainer (engine/training/trainer.py)
drives, and the renders training sees. Imported only by training code (engine/training/ and the
backend object's training hooks), never at run time.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.nn import functional as F

from engine.backends.sceneworld_mini.network import (
    SceneWorldMini,
    build_tokenizer,
    encode_text_batch,
    load_model,
    load_text_tower,
    pixels_from_uint8,
    pool_tokens,
    save_model,
    save_text_tower,
    tokenize_with_offsets,
)

if TYPE_CHECKING:
    from engine.training.configs import TrainConfig


# Render at twice the model's input size and downsample like the app does for real files
# (decode, then bicubic resize), so training sees what inference will see.
SUPERSAMPLE = 2


class MiniAdapter:
    """DualEncoderAdapter for sceneworld-mini."""

    def __init__(self, model: SceneWorldMini, device: str = "cpu") -> None:
        self.model = model.to(device)
        self.device = device
        self.tokenizer = build_tokenizer()

    def trainable_parameters(self, train_vision: bool, learn_temperature: bool) -> list[torch.nn.Parameter]:
        params = list(self.model.text.parameters())
        if train_vision:
            params += list(self.model.vision.parameters())
        if learn_temperature:
            params.append(self.model.logit_scale)
        for p in self.model.parameters():
            p.requires_grad_(False)
        for p in params:
            p.requires_grad_(True)
        return params

    def train_mode(self, train_vision: bool) -> None:
        self.model.train()
        if not train_vision:
            self.model.vision.eval()  # frozen BatchNorm statistics too

    def encode_pixels(self, pixels: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.model.vision(pixels.to(self.device)), dim=-1)

    def encode_texts(self, texts: Sequence[str], max_tokens: int) -> torch.Tensor:
        return F.normalize(encode_text_batch(self.model, self.tokenizer, texts, max_tokens, self.device), dim=-1)

    # -- local (phrase-region) alignment: engine/training/local_alignment.RegionAdapter ------------
    def encode_pixel_regions(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        g, r = self.model.vision.region_embeddings(pixels.to(self.device), self.model.cfg.region_scales)
        return F.normalize(g, dim=-1), F.normalize(r, dim=-1)

    def encode_text_phrases(self, texts: Sequence[str], max_tokens: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        from engine.grounding.parts import part_to_whole_weights, pool_phrases

        text = self.model.text
        ids, mask, offsets = tokenize_with_offsets(self.tokenizer, texts, max_tokens)
        ids, mask = ids.to(self.device), mask.to(self.device)
        states = text.token_states(ids, mask)
        weights = None
        if self.model.cfg.text_pooling == "part_to_whole":
            weights = torch.from_numpy(part_to_whole_weights(texts, offsets, mask.cpu().numpy())).to(self.device)
        glob = text.proj(pool_tokens(states, mask, weights))
        phrases, valid = pool_phrases(text.proj(states), texts, offsets)
        return F.normalize(glob, dim=-1), phrases, valid

    def logit_scale(self, cfg: TrainConfig) -> torch.Tensor:
        if cfg.learn_temperature:
            return self.model.logit_scale.exp().clamp(max=100.0)
        return torch.tensor(1.0 / cfg.temperature, device=self.device)

    def save(self, out_dir: Path, cfg: TrainConfig, *, text_only: bool, extra: dict) -> Path:
        if text_only:
            return save_text_tower(self.model, out_dir, cfg.name, {"training": cfg.to_dict(), **extra})
        return save_model(self.model, out_dir, {"training": cfg.to_dict(), **extra})


class ArrayImages:
    def __init__(self, renders: np.ndarray) -> None:
        self.renders = renders

    def __len__(self) -> int:
        return len(self.renders)

    def pixels(self, indices: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(pixels_from_uint8(self.renders[indices]))


def render_for_model(scenes, size: int) -> np.ndarray:
    """uint8 (N, size, size, 3): rendered at SUPERSAMPLE x size, then bicubic-downsampled."""
    from PIL import Image

    from engine.sceneworld import render_scene

    out = np.empty((len(scenes), size, size, 3), np.uint8)
    for i, scene in enumerate(scenes):
        img, _ = render_scene(scene, size * SUPERSAMPLE)
        out[i] = np.asarray(img.resize((size, size), Image.Resampling.BICUBIC))
    return out


def make_adapter(folder: Path, *, device: str = "auto", init_text_tower: Path | None = None,
                 model_id: str = "", amp: bool = True) -> MiniAdapter:
    """A trainable adapter on the folder's weights, optionally starting from a text tower."""
    from engine.models.device import resolve_device

    dev = resolve_device(device)
    model = load_model(Path(folder), dev)
    if init_text_tower is not None:
        load_text_tower(model, Path(init_text_tower))
    return MiniAdapter(model, dev)


def embed_training_scenes(folder: Path, scenes: Sequence[Any], device: str) -> np.ndarray:
    """Frozen image embeddings (N, D) of SceneWorld training scenes, rendered exactly as stage (b)
    trained on them: supersampled renders, bicubic-downsampled."""
    model = load_model(Path(folder), device)
    out = []
    with torch.no_grad():
        for start in range(0, len(scenes), 512):
            renders = render_for_model(scenes[start : start + 512], model.cfg.image_size)
            x = torch.from_numpy(pixels_from_uint8(renders)).to(device)
            out.append(model.encode_image(x).float().cpu().numpy())
    return np.concatenate(out)
