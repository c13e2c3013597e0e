"""CLIP-family embedder (transformers' CLIPModel folders) behind the Embedder protocol.

OpenAI CLIP (77 text positions) and Long-CLIP (the same architecture with 248 positions, converted
from its official checkpoints by convert.py) are one model class here; the limit is the config's
text max_position_embeddings. Embeddings are what transformers' CLIPModel computes:
    image: normalize(visual_projection(post_layernorm(vision_model(pixels)[:, 0])))
    text:  normalize(text_projection(final_layer_norm(text_model(ids))[pooled token]))
Pixels are CLIPImageProcessor's: shortest side resized (bicubic) to the configured edge, centre
crop, rescale 1/255, OpenAI's mean and std. Texts are the folder's CLIPTokenizer's ids truncated
at the budget ([BOS] ... [EOS] kept), padded with <|endoftext|>.

Nothing imports this module at `engine` import time; the registry imports it when a CLIP model
is loaded, so torch and transformers are imported at the top.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from engine.backends.clip.fast import FastClipTowers, pooled_positions
from engine.backends.clip.shapes import check_clip_config_dict, read_config
from engine.errors import ModelError, ModelIntegrityError, ModelNotInstalledError
from engine.models.base import to_rgb
from engine.models.batching import length_sorted_batches
from engine.models.device import cpu_supports_bf16, intra_op_threads, resolve_device

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16, "fp16": torch.float16,
           "half": torch.float16, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}

# compute modes, as BlipEmbedder's: "fast" (SDPA, pooled-token-only last layer, bf16 copies of the
# towers on CPUs with native bf16; what the registry loads), "exact" (the same forwards in the
# weights' dtype; the default for direct construction), "reference" (transformers' own forward).
COMPUTE_MODES = ("fast", "exact", "reference")

_OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)
_OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)
MAX_PREPROCESSOR_BYTES = 1024 * 1024
# The resize edge a preprocessor config may ask for: a user-controlled number that sizes an image.
MAX_RESIZE_EDGE = 4096
# Past this ratio of the resized long side to the crop, only the region the crop keeps is resampled
# (PIL's resize box): same sampling positions, and a 50:1 panorama no longer becomes a huge image.
_BOX_RESIZE_RATIO = 4


def resolve_dtype(name: str | None, device: str) -> torch.dtype:
    """None -> float16 on a GPU, float32 on the CPU."""
    if name is None:
        return torch.float32 if device == "cpu" else torch.float16
    try:
        return _DTYPES[name.strip().lower()]
    except KeyError:
        raise ModelError(f"Unknown dtype {name!r}; use float32, float16 or bfloat16.") from None


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _size_pair(value: Any, what: str, path: Path) -> dict[str, int]:
    """A size field as transformers reads it: an int, or a dict with shortest_edge or height/width."""
    if isinstance(value, int) and not isinstance(value, bool):
        return {"shortest_edge": value}
    if isinstance(value, dict) and all(isinstance(v, int) and not isinstance(v, bool) for v in value.values()):
        return dict(value)
    raise ModelIntegrityError(f"{path}: {what} = {value!r} is not a size Longlens understands")


class ClipEmbedder:
    """Image and text embeddings from a local CLIPModel folder (Hugging Face layout)."""

    backend = "clip"  # the registry's key for this embedder's backend object

    def __init__(
        self,
        checkpoint_dir: Path,
        *,
        device: str = "auto",
        dtype: str | None = None,
        model_id: str | None = None,
        default_text_tokens: int | None = None,
        compute: str = "exact",
        identity: str | None = None,
        text_identity: str | None = None,
        text_tower_dir: Path | None = None,
    ) -> None:
        """`default_text_tokens` None: the model's whole context (77 for CLIP, 248 for Long-CLIP).
        `text_tower_dir`: a CLIP text-tower override (engine/backends/clip/text_tower.py) read over
        the folder's own text side."""
        from transformers import CLIPConfig

        if compute not in COMPUTE_MODES:
            raise ModelError(f"Unknown compute mode {compute!r}; use one of {', '.join(COMPUTE_MODES)}.")
        self.checkpoint_dir = Path(checkpoint_dir)
        self._check_checkpoint_files(self.checkpoint_dir)
        check_clip_config_dict(read_config(self.checkpoint_dir))
        self.device = resolve_device(device)
        self.torch_dtype = resolve_dtype(dtype, self.device)
        self.dtype = _dtype_name(self.torch_dtype)
        try:
            config = CLIPConfig.from_pretrained(str(self.checkpoint_dir), local_files_only=True)
        except Exception as exc:  # transformers raises OSError/ValueError/TypeError for bad configs
            raise ModelIntegrityError(f"{self.checkpoint_dir / 'config.json'} is not a CLIP config: {exc}") from exc
        self.config = config
        self.model = self._load_model(config)
        self.tokenizer = self._load_tokenizer(config)

        self.model_id = model_id or self.checkpoint_dir.resolve().name
        self.text_model_id = self.model_id
        self.text_tower_name: str | None = None
        self.dim = int(config.projection_dim)
        self.image_size = int(config.vision_config.image_size)
        self.max_text_tokens = int(config.text_config.max_position_embeddings)
        default = self.max_text_tokens if default_text_tokens is None else int(default_text_tokens)
        self.default_text_tokens = max(2, min(default, self.max_text_tokens))
        self.batch_size = 8 if self.device == "cpu" else 128
        self.compute = compute
        self._fast = self._make_fast_towers(compute)
        self.query_threads: int | None = 1 if compute == "fast" and self.device == "cpu" else None
        self._load_image_settings()
        self.text_tower_dir: Path | None = None
        if text_tower_dir is not None:
            self._load_text_tower(Path(text_tower_dir))
        self.identity = identity or self.model_id
        self.text_identity = text_identity or self.text_model_id

    # ----------------------------------------------------------------- loading

    @staticmethod
    def _check_checkpoint_files(folder: Path) -> None:
        if not folder.is_dir():
            raise ModelNotInstalledError(f"CLIP model folder {folder} does not exist.")
        if not (folder / "config.json").is_file():
            raise ModelIntegrityError(f"{folder} has no config.json; it is not a model folder.")
        if not ((folder / "model.safetensors").is_file() or (folder / "model.safetensors.index.json").is_file()):
            if any(folder.glob("*.bin")) or any(folder.glob("*.pt")) or any(folder.glob("*.pth")):
                raise ModelIntegrityError(
                    f"{folder} only has pickle weights (.bin/.pt); Longlens loads safetensors only "
                    "(Long-CLIP's official .pt files are converted once with `longlens models convert`).")
            raise ModelIntegrityError(f"{folder} has no model.safetensors.")

    def _load_model(self, config: Any) -> Any:
        from transformers import CLIPModel
        from transformers.utils import logging as hf_logging

        from engine.backends.clip.shapes import check_clip_config_fits_weights

        hf_logging.disable_progress_bar()
        check_clip_config_fits_weights(self.checkpoint_dir, config)
        try:
            model, info = CLIPModel.from_pretrained(
                str(self.checkpoint_dir), config=config, local_files_only=True, use_safetensors=True,
                dtype=self.torch_dtype, output_loading_info=True)
        except Exception as exc:
            raise ModelIntegrityError(f"Cannot load the CLIP weights in {self.checkpoint_dir}: {exc}") from exc
        problems = [f"missing {k}" for k in info.get("missing_keys", [])]
        problems += [f"wrong shape {m[0] if isinstance(m, tuple) else m}" for m in info.get("mismatched_keys", [])]
        if problems:
            raise ModelIntegrityError(f"The weights in {self.checkpoint_dir} do not fit the CLIP config "
                                      f"({len(problems)} problems: {', '.join(sorted(problems)[:5])}).")
        model.eval()
        return model.to(self.device)

    def _load_tokenizer(self, config: Any) -> Any:
        from transformers import CLIPTokenizer

        folder = self.checkpoint_dir
        if not (folder / "tokenizer.json").is_file() and not (
                (folder / "vocab.json").is_file() and (folder / "merges.txt").is_file()):
            raise ModelIntegrityError(f"{folder} has no CLIP tokenizer (tokenizer.json, or vocab.json and merges.txt).")
        try:
            tok = CLIPTokenizer.from_pretrained(str(folder), local_files_only=True)
        except Exception as exc:
            raise ModelIntegrityError(f"Cannot load the tokenizer in {folder}: {exc}") from exc
        vocab = int(config.text_config.vocab_size)
        eos = int(config.text_config.eos_token_id)
        if len(tok) > vocab:
            raise ModelIntegrityError(f"The tokenizer in {folder} has {len(tok)} entries but the text model only {vocab}.")
        # The text embedding is read at the end-of-text token: the config's rule must find it.
        if eos == 2 and tok.eos_token_id != len(tok) - 1:
            raise ModelIntegrityError(
                f"config.json pools the text at the highest token id (eos_token_id 2, OpenAI's rule), but the "
                f"tokenizer in {folder} ends texts with id {tok.eos_token_id}, not its highest ({len(tok) - 1}).")
        if eos != 2 and tok.eos_token_id != eos:
            raise ModelIntegrityError(f"config.json pools the text at token {eos}, but the tokenizer in {folder} "
                                      f"ends texts with {tok.eos_token_id}.")
        return tok

    def _load_text_tower(self, folder: Path) -> None:
        from engine.backends.clip.text_tower import load_text_tower

        name = load_text_tower(self.model, folder, self.model_id)
        self.text_tower_dir = folder
        self.text_tower_name = name
        self.text_model_id = f"{self.model_id}+{name}"
        if self._fast is not None:
            self._fast.refresh()  # reduced-precision copies hold the old text weights

    def _make_fast_towers(self, compute: str) -> FastClipTowers | None:
        if compute == "reference":
            return None
        weight_dtype = None
        if compute == "fast" and self.device == "cpu" and self.torch_dtype == torch.float32 and cpu_supports_bf16():
            weight_dtype = torch.bfloat16
        return FastClipTowers(self.model, weight_dtype=weight_dtype)

    @property
    def compute_dtype(self) -> str:
        if self._fast is not None and self._fast.weight_dtype is not None:
            return _dtype_name(self._fast.weight_dtype)
        return self.dtype

    def _load_image_settings(self) -> None:
        """CLIPImageProcessor's steps from preprocessor_config.json (its defaults when absent), kept
        only when they end in the vision model's S x S input."""
        from engine.fileutil import read_user_text

        s = self.image_size
        cfg: dict[str, Any] = {}
        path = self.checkpoint_dir / "preprocessor_config.json"
        if path.is_file():
            try:
                cfg = json.loads(read_user_text(path, max_bytes=MAX_PREPROCESSOR_BYTES))
            except (OSError, ValueError) as exc:
                raise ModelIntegrityError(f"{path} is unreadable: {exc}") from exc
            if not isinstance(cfg, dict):
                raise ModelIntegrityError(f"{path} is not a JSON object")
        size = _size_pair(cfg.get("size", {"shortest_edge": s}), "size", path)
        crop = _size_pair(cfg.get("crop_size", {"height": s, "width": s}), "crop_size", path)
        if "shortest_edge" in crop:
            crop = {"height": crop["shortest_edge"], "width": crop["shortest_edge"]}
        do_crop = bool(cfg.get("do_center_crop", True))
        if not cfg.get("do_resize", True):
            raise ModelIntegrityError(f"{path} does not resize; the vision model needs {s}x{s} images.")
        if set(size) == {"shortest_edge"}:
            edge = size["shortest_edge"]
            if not do_crop or (crop.get("height"), crop.get("width")) != (s, s) or not s <= edge <= MAX_RESIZE_EDGE:
                raise ModelIntegrityError(
                    f"{path} resizes the shortest side to {edge} and crops {crop if do_crop else 'nothing'}; "
                    f"the vision model expects {s}x{s} images (shortest side {s}..{MAX_RESIZE_EDGE}, crop {s}x{s}).")
            self._resize_edge: int | None = edge
        elif (size.get("height"), size.get("width")) == (s, s) and (not do_crop or (crop.get("height"), crop.get("width")) == (s, s)):
            self._resize_edge = None  # square resize, no crop needed
        else:
            raise ModelIntegrityError(f"{path} resizes to {size}; the vision model expects {s}x{s} images.")
        mean = cfg.get("image_mean", _OPENAI_MEAN)
        std = cfg.get("image_std", _OPENAI_STD)
        if not (isinstance(mean, list | tuple) and isinstance(std, list | tuple) and len(mean) == len(std) == 3
                and all(isinstance(v, int | float) for v in (*mean, *std)) and all(v != 0 for v in std)):
            raise ModelIntegrityError(f"{path}: image_mean / image_std must be three numbers each (std non-zero)")
        try:
            self._resample = Image.Resampling(int(cfg.get("resample", int(Image.Resampling.BICUBIC))))
            scale = float(cfg.get("rescale_factor", 1 / 255))
        except (TypeError, ValueError) as exc:
            raise ModelIntegrityError(f"{path}: {exc}") from None
        levels = np.arange(256, dtype=np.float64)
        # uint8 -> float64 * scale -> float32, then (x - mean) / std in float32: transformers' arithmetic.
        x = (levels * scale if cfg.get("do_rescale", True) else levels).astype(np.float32)
        if cfg.get("do_normalize", True):
            self._lut = ((x[None, :] - np.asarray(mean, np.float32)[:, None]) / np.asarray(std, np.float32)[:, None])
        else:
            self._lut = np.repeat(x[None, :], 3, axis=0)
        self._lut = self._lut.astype(np.float32)

    # ----------------------------------------------------------------- images

    def _resized_crop(self, rgb: Image.Image) -> Image.Image:
        s = self.image_size
        if self._resize_edge is None:
            return rgb if rgb.size == (s, s) else rgb.resize((s, s), resample=self._resample)
        w, h = rgb.size
        edge = self._resize_edge
        if w <= h:
            new_w, new_h = edge, int(edge * h / w)
        else:
            new_w, new_h = int(edge * w / h), edge
        left, top = (new_w - s) // 2, (new_h - s) // 2
        if max(new_w, new_h) <= _BOX_RESIZE_RATIO * max(s, edge):
            if (new_w, new_h) != (w, h):
                rgb = rgb.resize((new_w, new_h), resample=self._resample)
            return rgb.crop((left, top, left + s, top + s))
        # Resample only the source region the crop keeps, on the full resize's grid.
        sx, sy = w / new_w, h / new_h
        box = (left * sx, top * sy, (left + s) * sx, (top + s) * sy)
        return rgb.resize((s, s), resample=self._resample, box=box)

    def preprocess(self, images: Sequence[Image.Image]) -> np.ndarray:
        s = self.image_size
        out = np.empty((len(images), 3, s, s), dtype=np.float32)
        for i, image in enumerate(images):
            arr = np.asarray(self._resized_crop(to_rgb(image)), dtype=np.uint8)
            for c in range(3):
                out[i, c] = self._lut[c][arr[..., c]]
        return out

    def vision_states(self, pixels: torch.Tensor) -> torch.Tensor:
        """All vision tokens (N, 1 + patches, hidden) before post_layernorm; [CLS] first."""
        return self.model.vision_model(pixel_values=pixels).last_hidden_state

    def image_features(self, pixels: torch.Tensor) -> torch.Tensor:
        """Projected, not yet normalised (N, dim) features of preprocessed pixels on the model's
        device, by this embedder's compute path; autograd as the caller has it (training takes
        gradients through it, encode_pixels does not)."""
        if self._fast is not None:
            return self._fast.image_features(pixels)
        return _pooler(self.model.get_image_features(pixel_values=pixels))

    def text_features(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Projected, not yet normalised (N, dim) features of `tokenize`'s ids on the model's device,
        read at the pooled token; autograd as the caller has it."""
        if self._fast is not None:
            return self._fast.text_features(input_ids, attention_mask)
        return _pooler(self.model.get_text_features(input_ids=input_ids, attention_mask=attention_mask))

    def text_token_features(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """As text_features, for every token: (N, L, dim) projected, not yet normalised states
        (the text embedding is the row at `pooled_positions`); autograd as the caller has it."""
        if self._fast is not None:
            return self._fast.text_token_features(input_ids, attention_mask)
        return self.model.text_projection(self.text_states(input_ids, attention_mask))

    def pooled_positions(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(N,) the token each row's text embedding is read at (transformers' rule for the config)."""
        return pooled_positions(input_ids, int(self.config.text_config.eos_token_id))

    def encode_pixels(self, pixel_values: np.ndarray) -> np.ndarray:
        pixel_values = np.asarray(pixel_values, dtype=np.float32)
        s = self.image_size
        if pixel_values.ndim != 4 or pixel_values.shape[1:] != (3, s, s):
            raise ModelError(f"Pixel values must have shape (N, 3, {s}, {s}); got {tuple(pixel_values.shape)}.")
        feats = []
        on_gpu = self.device.startswith("cuda")
        with torch.inference_mode():
            for start in range(0, len(pixel_values), self.batch_size):
                batch = torch.from_numpy(pixel_values[start : start + self.batch_size])
                if on_gpu:
                    batch = batch.pin_memory().to(self.device, non_blocking=True)
                batch = batch.to(device=self.device, dtype=self.torch_dtype)
                feats.append(self._normalised(self.image_features(batch)))
        return self._stack(feats)

    def encode_images(self, images: Sequence[Image.Image]) -> np.ndarray:
        return self._stack([self.encode_pixels(self.preprocess(images[i : i + self.batch_size]))
                            for i in range(0, len(images), self.batch_size)])

    # ----------------------------------------------------------------- texts

    def effective_max_tokens(self, max_tokens: int | None) -> int:
        if max_tokens is None:
            return self.default_text_tokens
        if max_tokens < 2:
            raise ValueError("max_tokens must be at least 2 (<|startoftext|> and <|endoftext|>)")
        # Position embeddings stop at max_text_tokens; a larger budget means "all the model reads".
        return min(int(max_tokens), self.max_text_tokens)

    def tokenize(self, texts: Sequence[str], max_tokens: int | None = None) -> dict[str, torch.Tensor]:
        """Token ids and attention mask exactly as encode_texts feeds them (on the CPU)."""
        enc = self.tokenizer(list(texts), truncation=True, max_length=self.effective_max_tokens(max_tokens),
                             padding=True, return_tensors="pt")
        return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}

    def text_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """All text tokens (N, L, hidden) after final_layer_norm (causal: token i saw 0..i)."""
        return self.model.text_model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    def encode_texts(self, texts: Sequence[str], max_tokens: int | None = None) -> np.ndarray:
        texts = list(texts)
        limit = self.effective_max_tokens(max_tokens)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        lengths = [len(ids) for ids in self.tokenizer(texts, truncation=True, max_length=limit)["input_ids"]]
        feats = np.empty((len(texts), self.dim), dtype=np.float32)
        threads = self.query_threads if len(texts) <= 4 else None
        with torch.inference_mode(), intra_op_threads(threads):
            for idx in length_sorted_batches(lengths, self.batch_size):
                enc = self.tokenize([texts[i] for i in idx], limit)
                ids, mask = enc["input_ids"].to(self.device), enc["attention_mask"].to(self.device)
                feats[idx] = self._normalised(self.text_features(ids, mask))
        return feats

    def token_count(self, text: str) -> int:
        # verbose=False: the over-limit warning is noise here, counting long texts is the point.
        return len(self.tokenizer(text, add_special_tokens=True, truncation=False, verbose=False)["input_ids"])

    # ----------------------------------------------------------------- helpers

    @staticmethod
    def _normalised(x: torch.Tensor) -> np.ndarray:
        return F.normalize(x.float(), dim=-1).cpu().numpy().astype(np.float32, copy=False)

    def _stack(self, feats: list[np.ndarray]) -> np.ndarray:
        if not feats:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.concatenate(feats, axis=0)


def _pooler(out: Any) -> torch.Tensor:
    """get_*_features returns the projected tensor (transformers 4) or an output whose
    pooler_output is (transformers 5)."""
    return out if isinstance(out, torch.Tensor) else out.pooler_output
