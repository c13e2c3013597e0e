"""The sceneworld-mini Embedder: the network of engine/backends/sceneworld_mini/network.py behind the
Embedder interface (engine/models/base.py)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from engine.backends.sceneworld_mini import BACKEND
from engine.backends.sceneworld_mini.network import (
    build_tokenizer,
    encode_text_batch,
    load_model,
    load_text_tower,
    preprocess_images,
)
from engine.models.base import l2_normalise
from engine.models.tokenizers import thread_safe

if TYPE_CHECKING:
    from PIL import Image


# -- the Embedder -----------------------------------------------------------------
class SceneWorldMiniEmbedder:
    """Embedder over a sceneworld-mini folder (model.safetensors + sceneworld_mini.json)."""

    backend = "sceneworld-mini"  # the registry's key for this embedder's backend object
    text_cleaning = BACKEND.text_cleaning  # nothing beyond the WordPiece tokenizer's own normaliser

    def __init__(
        self,
        model_dir: Path,
        *,
        device: str = "auto",
        text_tower_dir: Path | None = None,
        model_id: str = "sceneworld-mini",
        identity: str | None = None,
        text_identity: str | None = None,
    ) -> None:
        """`identity`/`text_identity`: see engine.models.base.Embedder (default: model_id)."""
        from engine.models.device import resolve_device

        self.device = resolve_device(device)
        self.model_dir = Path(model_dir)  # grounding keys its calibration on these weights
        self.model = load_model(model_dir, self.device)
        self.cfg = self.model.cfg
        self.tokenizer = thread_safe(build_tokenizer())  # shared by the GUI thread and background jobs
        self.model_id = model_id
        self.text_model_id = model_id
        self.text_tower_dir: Path | None = None
        if text_tower_dir is not None:
            name = load_text_tower(self.model, text_tower_dir)
            self.text_model_id = f"{model_id}+{name}"
            self.text_tower_dir = Path(text_tower_dir)
        self.identity = identity or model_id
        self.text_identity = text_identity or self.text_model_id
        self.dim = self.cfg.embed_dim
        self.image_size = self.cfg.image_size
        self.max_text_tokens = self.cfg.max_positions
        self.default_text_tokens = self.cfg.default_text_tokens
        self.batch_size = 64

    def preprocess(self, images: Sequence[Image.Image]) -> np.ndarray:
        return preprocess_images(images, self.image_size)

    @torch.inference_mode()
    def encode_pixels(self, pixel_values: np.ndarray) -> np.ndarray:
        out = []
        for start in range(0, len(pixel_values), self.batch_size):
            x = torch.from_numpy(np.ascontiguousarray(pixel_values[start : start + self.batch_size])).to(self.device)
            out.append(self.model.vision(x).float().cpu().numpy())
        if not out:
            return np.zeros((0, self.dim), np.float32)
        return l2_normalise(np.concatenate(out))

    def encode_images(self, images: Sequence[Image.Image]) -> np.ndarray:
        return self.encode_pixels(self.preprocess(images))

    @torch.inference_mode()
    def patch_embeddings(self, images: Sequence[Image.Image]) -> np.ndarray:
        """(N, G, G, D) L2-normalised per-patch embeddings (for region maps)."""
        x = torch.from_numpy(self.preprocess(images)).to(self.device)
        p = self.model.vision.patch_embeddings(x).float().cpu().numpy()
        g = self.cfg.grid
        return l2_normalise(p).reshape(len(images), g, g, self.dim)

    def _limit(self, max_tokens: int | None) -> int:
        limit = self.default_text_tokens if max_tokens is None else int(max_tokens)
        if limit < 2:
            raise ValueError("max_tokens must be at least 2 ([CLS] and [SEP])")
        return min(limit, self.max_text_tokens)

    @torch.inference_mode()
    def encode_texts(self, texts: Sequence[str], max_tokens: int | None = None) -> np.ndarray:
        texts = self.text_cleaning.texts(texts)
        if not texts:
            return np.zeros((0, self.dim), np.float32)
        limit = self._limit(max_tokens)
        out = []
        for start in range(0, len(texts), self.batch_size):
            batch = texts[start : start + self.batch_size]
            out.append(encode_text_batch(self.model, self.tokenizer, batch, limit, self.device).float().cpu().numpy())
        return l2_normalise(np.concatenate(out))

    @torch.inference_mode()
    def phrase_vectors(self, text: str, spans: Sequence[tuple[int, int]], max_tokens: int | None = None) -> np.ndarray:
        """(k, D) L2-normalised embeddings of the character spans of `text`, each the mean of its
        tokens' projected states with the whole text as context: the phrase vectors the local
        (phrase-region) alignment loss trains (engine/training/local_alignment.py). A span cut off
        by the token budget gets a zero row."""
        from engine.backends.sceneworld_mini.network import tokenize_with_offsets
        from engine.grounding.parts import span_token_masks

        ids, mask, offsets = tokenize_with_offsets(self.tokenizer, [text], self._limit(max_tokens))
        states = self.model.text.proj(self.model.text.token_states(ids.to(self.device), mask.to(self.device)))[0]
        masks = torch.from_numpy(span_token_masks(offsets[0], spans)).to(states.device, states.dtype)
        return l2_normalise((masks @ states).float().cpu().numpy())

    def token_count(self, text: str) -> int:
        return len(self.tokenizer(self.text_cleaning(text), add_special_tokens=True, truncation=False, verbose=False)["input_ids"])
