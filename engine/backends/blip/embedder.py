"""BLIP retrieval backend (transformers' BlipForImageTextRetrieval) behind the Embedder protocol.

Embeddings are the projected, L2-normalised [CLS] features that the reference computes with
use_itm_head=False:
    image: normalize(vision_proj(vision_model(pixels).last_hidden_state[:, 0]))
    text:  normalize(text_proj(text_encoder(input_ids, attention_mask).last_hidden_state[:, 0]))
The text path feeds the tokenizer's ids unchanged ([CLS] first): transformers' reference does
not swap in [ENC] for the unimodal features, and neither do we.

Nothing imports this module at `engine` import time; the model registry imports it when a
BLIP model is loaded, so torch/transformers are imported at the top here.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from engine.backends.blip.fast import FastBlipTowers, cpu_supports_bf16, intra_op_threads
from engine.errors import ModelError, ModelIntegrityError, ModelNotInstalledError
from engine.models.base import to_rgb
from engine.models.batching import length_sorted_batches
from engine.models.device import resolve_device  # noqa: F401  (re-exported for the backend's callers)

log = logging.getLogger(__name__)

TEXT_TOWER_WEIGHTS = "text_tower.safetensors"
TEXT_TOWER_META = "text_tower.json"
TEXT_TOWER_FORMAT = "longlens-blip-text-tower"
TEXT_TOWER_VERSION = 1
# State-dict prefixes of the parts a paragraph-trained text tower replaces.
TEXT_TOWER_PREFIXES = ("text_encoder.", "text_proj.")

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}

# How image and text embeddings are computed (BlipEmbedder's `compute`):
#   "fast"      SDPA, [CLS]-only last layer, bf16 copies of the towers on CPUs with native bf16
#               (cosine >= 0.9998 to float32 on the full-size model); the weights' dtype on GPUs.
#               What the registry (CLI, GUI) loads.
#   "exact"     SDPA and [CLS]-only last layer in the weights' dtype: float32 rounding away from
#               the reference. The default for direct construction (training, evaluation, tests).
#   "reference" transformers' own eager forward.
COMPUTE_MODES = ("fast", "exact", "reference")

_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def resolve_dtype(name: str | None, device: str) -> torch.dtype:
    """None -> float16 on a GPU (half the memory, same retrieval quality), float32 on the CPU."""
    if name is None:
        return torch.float32 if device == "cpu" else torch.float16
    try:
        return _DTYPES[name.strip().lower()]
    except KeyError:
        raise ModelError(f"Unknown dtype {name!r}; use float32, float16 or bfloat16.") from None


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _text_tower_arch(config: Any) -> dict[str, int]:
    """The config values that fix the text tower's tensor shapes."""
    text = config.text_config
    return {
        "text_hidden_size": int(text.hidden_size),
        "text_num_hidden_layers": int(text.num_hidden_layers),
        "text_num_attention_heads": int(text.num_attention_heads),
        "text_intermediate_size": int(text.intermediate_size),
        "vocab_size": int(text.vocab_size),
        "max_position_embeddings": int(text.max_position_embeddings),
        "encoder_hidden_size": int(text.encoder_hidden_size),
        "image_text_hidden_size": int(config.image_text_hidden_size),
    }


def text_tower_arch_hash(config: Any) -> str:
    blob = json.dumps(_text_tower_arch(config), sort_keys=True).encode("utf-8")
    return hashlib.sha256(blob).hexdigest()[:16]


def _declared_model_type(folder: Path) -> str | None:
    """config.json's own model_type; BlipConfig.from_pretrained only warns on a foreign one."""
    try:
        return json.loads((folder / "config.json").read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None


def _is_text_tower_key(key: str) -> bool:
    return key.startswith(TEXT_TOWER_PREFIXES)


class BlipEmbedder:
    """Image and text embeddings from a local BLIP retrieval checkpoint (Hugging Face layout)."""

    backend = "blip"  # the registry's key for this embedder's backend object

    def __init__(
        self,
        checkpoint_dir: Path,
        *,
        device: str = "auto",
        dtype: str | None = None,
        text_tower_dir: Path | None = None,
        model_id: str | None = None,
        default_text_tokens: int = 128,
        compute: str = "exact",
        identity: str | None = None,
        text_identity: str | None = None,
    ) -> None:
        """`identity`/`text_identity`: what keys this model's vectors (the registry computes them
        from the manifest); a folder loaded directly, without a manifest, is keyed by its model_id."""
        from transformers import BertTokenizerFast, BlipConfig

        if compute not in COMPUTE_MODES:
            raise ModelError(f"Unknown compute mode {compute!r}; use one of {', '.join(COMPUTE_MODES)}.")
        self.checkpoint_dir = Path(checkpoint_dir)
        self._check_checkpoint_files(self.checkpoint_dir)
        self.device = resolve_device(device)
        self.torch_dtype = resolve_dtype(dtype, self.device)
        self.dtype = _dtype_name(self.torch_dtype)

        try:
            config = BlipConfig.from_pretrained(str(self.checkpoint_dir), local_files_only=True)
        except Exception as exc:  # transformers raises OSError/ValueError/TypeError for bad configs
            raise ModelIntegrityError(
                f"{self.checkpoint_dir / 'config.json'} is not a BLIP config: {exc}"
            ) from exc
        if config.model_type != "blip" or _declared_model_type(self.checkpoint_dir) not in (None, "blip"):
            raise ModelIntegrityError(f"{self.checkpoint_dir} does not hold a BLIP model.")
        self.config = config
        self.model = self._load_model(config)

        try:
            self.tokenizer = BertTokenizerFast.from_pretrained(
                str(self.checkpoint_dir), local_files_only=True
            )
        except Exception as exc:
            raise ModelIntegrityError(f"Cannot load the tokenizer in {self.checkpoint_dir}: {exc}") from exc
        if len(self.tokenizer) > int(config.text_config.vocab_size):
            raise ModelIntegrityError(
                f"The tokenizer in {self.checkpoint_dir} has {len(self.tokenizer)} entries but the text "
                f"model only {config.text_config.vocab_size}."
            )

        self.model_id = model_id or self.checkpoint_dir.resolve().name
        self.text_model_id = self.model_id
        self.text_tower_name: str | None = None
        self.dim = int(config.image_text_hidden_size)
        self.image_size = int(config.vision_config.image_size)
        self.max_text_tokens = int(config.text_config.max_position_embeddings)
        self.default_text_tokens = max(2, min(int(default_text_tokens), self.max_text_tokens))
        # GPUs need large batches to fill; on the CPU 8 already amortises per-call overhead.
        self.batch_size = 8 if self.device == "cpu" else 128
        self.compute = compute
        self._fast = self._make_fast_towers(compute)
        # Intra-op threads for a query (a few texts) on the CPU fast path; see intra_op_threads.
        self.query_threads: int | None = 1 if compute == "fast" and self.device == "cpu" else None

        self._load_image_settings()
        self.text_tower_dir: Path | None = None
        if text_tower_dir is not None:
            self._load_text_tower(Path(text_tower_dir))
            self.text_tower_dir = Path(text_tower_dir)
        self.identity = identity or self.model_id
        self.text_identity = text_identity or self.text_model_id

    # ----------------------------------------------------------------- loading

    @staticmethod
    def _check_checkpoint_files(folder: Path) -> None:
        if not folder.is_dir():
            raise ModelNotInstalledError(f"BLIP checkpoint folder {folder} does not exist.")
        if not (folder / "config.json").is_file():
            raise ModelIntegrityError(f"{folder} has no config.json; it is not a model folder.")
        has_safetensors = (folder / "model.safetensors").is_file() or (
            folder / "model.safetensors.index.json"
        ).is_file()
        if not has_safetensors:
            if any(folder.glob("*.bin")) or any(folder.glob("*.pt")) or any(folder.glob("*.pth")):
                raise ModelIntegrityError(
                    f"{folder} only has pickle weights (.bin/.pt); Longlens loads safetensors only."
                )
            raise ModelIntegrityError(f"{folder} has no model.safetensors.")

    def _load_model(self, config: Any) -> Any:
        from transformers import BlipForImageTextRetrieval
        from transformers.utils import logging as hf_logging

        from engine.backends.blip.shapes import check_blip_config_fits_weights

        # Our callers draw their own progress; transformers' per-load bars would clutter the CLI.
        hf_logging.disable_progress_bar()
        # Before anything is allocated: a config its weights do not fit could ask for any amount.
        check_blip_config_fits_weights(self.checkpoint_dir, config)

        try:
            model, info = BlipForImageTextRetrieval.from_pretrained(
                str(self.checkpoint_dir),
                config=config,
                local_files_only=True,
                use_safetensors=True,
                dtype=self.torch_dtype,
                output_loading_info=True,
            )
        except Exception as exc:
            raise ModelIntegrityError(
                f"Cannot load the BLIP weights in {self.checkpoint_dir}: {exc}"
            ) from exc
        problems = [f"missing {k}" for k in info.get("missing_keys", [])]
        problems += [
            f"wrong shape {m[0] if isinstance(m, tuple) else m}" for m in info.get("mismatched_keys", [])
        ]
        if problems:
            shown = ", ".join(sorted(problems)[:5])
            raise ModelIntegrityError(
                f"The weights in {self.checkpoint_dir} do not fit the BLIP config ({len(problems)} problems: {shown})."
            )
        if info.get("unexpected_keys"):
            log.debug("ignoring %d unexpected keys in %s", len(info["unexpected_keys"]), self.checkpoint_dir)
        model.eval()
        return model.to(self.device)

    def _make_fast_towers(self, compute: str) -> FastBlipTowers | None:
        if compute == "reference":
            return None
        weight_dtype = None
        if compute == "fast" and self.device == "cpu" and self.torch_dtype == torch.float32 and cpu_supports_bf16():
            weight_dtype = torch.bfloat16
        return FastBlipTowers(self.model, weight_dtype=weight_dtype)

    @property
    def compute_dtype(self) -> str:
        """The dtype the towers run in ("bfloat16" for the CPU fast path)."""
        if self._fast is not None and self._fast.weight_dtype is not None:
            return _dtype_name(self._fast.weight_dtype)
        return self.dtype

    def _load_image_settings(self) -> None:
        size = self.image_size
        mean: Sequence[float] = _CLIP_MEAN
        std: Sequence[float] = _CLIP_STD
        scale = 1 / 255
        do_rescale = do_normalize = True
        resample = Image.Resampling.BICUBIC
        path = self.checkpoint_dir / "preprocessor_config.json"
        if path.is_file():
            try:
                cfg = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise ModelIntegrityError(f"{path} is unreadable: {exc}") from exc
            raw_size = cfg.get("size", {"height": size, "width": size})
            if isinstance(raw_size, int):
                raw_size = {"height": raw_size, "width": raw_size}
            resized_to = (raw_size.get("height"), raw_size.get("width"))
            if not cfg.get("do_resize", True) or resized_to != (size, size):
                raise ModelIntegrityError(
                    f"{path} resizes to {raw_size} but the vision model expects {size}x{size} images."
                )
            mean = cfg.get("image_mean", mean)
            std = cfg.get("image_std", std)
            scale = float(cfg.get("rescale_factor", scale))
            do_rescale = bool(cfg.get("do_rescale", True))
            do_normalize = bool(cfg.get("do_normalize", True))
            resample = Image.Resampling(int(cfg.get("resample", int(resample))))
        self._resample = resample
        # One float32 lookup table per channel: value -> normalised pixel. Same arithmetic as
        # transformers (uint8 -> float64 * scale -> float32, then (x - mean) / std in float32).
        levels = np.arange(256, dtype=np.float64)
        x = (levels * scale if do_rescale else levels).astype(np.float32)
        if do_normalize:
            mean32 = np.asarray(mean, dtype=np.float32)[:, None]
            std32 = np.asarray(std, dtype=np.float32)[:, None]
            self._lut = ((x[None, :] - mean32) / std32).astype(np.float32)
        else:
            self._lut = np.repeat(x[None, :], 3, axis=0)

    def _load_text_tower(self, folder: Path) -> None:
        from safetensors import safe_open

        weights_path = folder / TEXT_TOWER_WEIGHTS
        meta_path = folder / TEXT_TOWER_META
        if not weights_path.is_file() or not meta_path.is_file():
            raise ModelNotInstalledError(
                f"Text tower folder {folder} needs {TEXT_TOWER_WEIGHTS} and {TEXT_TOWER_META}."
            )
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ModelIntegrityError(f"{meta_path} is unreadable: {exc}") from exc
        if meta.get("format") != TEXT_TOWER_FORMAT:
            raise ModelIntegrityError(f"{meta_path} is not a Longlens BLIP text tower.")
        expected_hash = text_tower_arch_hash(self.config)
        if meta.get("arch_hash") != expected_hash:
            raise ModelError(
                f"Text tower {folder.name!r} was made for a different BLIP architecture "
                f"({meta.get('arch')}) than {self.model_id} ({_text_tower_arch(self.config)})."
            )
        base = meta.get("base_model_id")
        if base and base != self.model_id:
            log.warning("text tower %s was trained on %s, loading it on %s", folder, base, self.model_id)

        own = {k: v for k, v in self.model.state_dict().items() if _is_text_tower_key(k)}
        tensors: dict[str, torch.Tensor] = {}
        try:
            with safe_open(str(weights_path), framework="pt") as fh:
                for key in fh.keys():
                    tensors[key] = fh.get_tensor(key)
        except Exception as exc:
            raise ModelIntegrityError(f"{weights_path} is unreadable: {exc}") from exc
        foreign = sorted(k for k in tensors if k not in own)
        missing = sorted(k for k in own if k not in tensors)
        wrong = sorted(
            f"{k} {tuple(tensors[k].shape)} != {tuple(own[k].shape)}"
            for k in tensors
            if k in own and tuple(tensors[k].shape) != tuple(own[k].shape)
        )
        if foreign or missing or wrong:
            details = []
            if foreign:
                details.append(f"unknown keys: {', '.join(foreign[:3])}")
            if missing:
                details.append(f"missing keys: {', '.join(missing[:3])}")
            if wrong:
                details.append(f"wrong shapes: {', '.join(wrong[:3])}")
            raise ModelError(f"Text tower {folder} does not fit {self.model_id} ({'; '.join(details)}).")
        with torch.no_grad():
            for key, value in tensors.items():
                own[key].copy_(value.to(device=own[key].device, dtype=own[key].dtype))
        name = str(meta.get("name") or folder.name)
        self.text_tower_name = name
        self.text_model_id = f"{self.model_id}+{name}"
        if self._fast is not None:
            self._fast.refresh()  # reduced-precision copies hold the old text weights

    # ----------------------------------------------------------------- images

    def preprocess(self, images: Sequence[Image.Image]) -> np.ndarray:
        size = self.image_size
        out = np.empty((len(images), 3, size, size), dtype=np.float32)
        for i, image in enumerate(images):
            rgb = to_rgb(image)
            if rgb.size != (size, size):
                rgb = rgb.resize((size, size), resample=self._resample)
            arr = np.asarray(rgb, dtype=np.uint8)
            for c in range(3):
                out[i, c] = self._lut[c][arr[..., c]]
        return out

    def vision_states(self, pixels: torch.Tensor) -> torch.Tensor:
        """All vision tokens (N, 1 + patches, hidden); [CLS] first."""
        return self.model.vision_model(pixel_values=pixels).last_hidden_state

    def encode_pixels(self, pixel_values: np.ndarray) -> np.ndarray:
        pixel_values = np.asarray(pixel_values, dtype=np.float32)
        size = self.image_size
        if pixel_values.ndim != 4 or pixel_values.shape[1:] != (3, size, size):
            raise ModelError(
                f"Pixel values must have shape (N, 3, {size}, {size}); got {tuple(pixel_values.shape)}."
            )
        feats = []
        on_gpu = self.device.startswith("cuda")
        with torch.inference_mode():
            for start in range(0, len(pixel_values), self.batch_size):
                batch = torch.from_numpy(pixel_values[start : start + self.batch_size])
                if on_gpu:
                    # Pinned host memory: the copy runs by DMA, asynchronously to the host.
                    batch = batch.pin_memory().to(self.device, non_blocking=True)
                batch = batch.to(device=self.device, dtype=self.torch_dtype)
                if self._fast is not None:
                    feats.append(self._normalised(self._fast.image_features(batch)))
                else:
                    cls = self.vision_states(batch)[:, 0, :]
                    feats.append(self._normalised(self.model.vision_proj(cls)))
        return self._stack(feats)

    def encode_images(self, images: Sequence[Image.Image]) -> np.ndarray:
        feats = [
            self.encode_pixels(self.preprocess(images[start : start + self.batch_size]))
            for start in range(0, len(images), self.batch_size)
        ]
        return self._stack(feats)

    # ----------------------------------------------------------------- texts

    def effective_max_tokens(self, max_tokens: int | None) -> int:
        if max_tokens is None:
            return self.default_text_tokens
        if max_tokens < 2:
            raise ValueError("max_tokens must be at least 2 ([CLS] and [SEP])")
        # Position embeddings stop at max_text_tokens; a larger budget means "everything the
        # model can read", so it is clamped rather than refused.
        return min(int(max_tokens), self.max_text_tokens)

    def tokenize(self, texts: Sequence[str], max_tokens: int | None = None) -> dict[str, torch.Tensor]:
        """Token ids and attention mask exactly as encode_texts feeds them (on the CPU)."""
        enc = self.tokenizer(
            list(texts),
            truncation=True,
            max_length=self.effective_max_tokens(max_tokens),
            padding=True,
            return_tensors="pt",
        )
        return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}

    def text_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """All text tokens (N, L, hidden) from the unimodal text encoder; [CLS] first."""
        return self.model.text_encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    def encode_texts(self, texts: Sequence[str], max_tokens: int | None = None) -> np.ndarray:
        texts = list(texts)
        limit = self.effective_max_tokens(max_tokens)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        # Batches of similar length waste less compute on padding; order is restored below.
        lengths = [len(ids) for ids in self.tokenizer(texts, truncation=True, max_length=limit)["input_ids"]]
        feats = np.empty((len(texts), self.dim), dtype=np.float32)
        threads = self.query_threads if len(texts) <= 4 else None
        with torch.inference_mode(), intra_op_threads(threads):
            for idx in length_sorted_batches(lengths, self.batch_size):
                enc = self.tokenize([texts[i] for i in idx], limit)
                ids, mask = enc["input_ids"].to(self.device), enc["attention_mask"].to(self.device)
                if self._fast is not None:
                    feats[idx] = self._normalised(self._fast.text_features(ids, mask))
                else:
                    states = self.text_states(ids, mask)
                    feats[idx] = self._normalised(self.model.text_proj(states[:, 0, :]))
        return feats

    def token_count(self, text: str) -> int:
        # verbose=False: the over-512 warning is noise here, counting long texts is the point.
        enc = self.tokenizer(text, add_special_tokens=True, truncation=False, verbose=False)
        return len(enc["input_ids"])

    # ----------------------------------------------------------------- helpers

    @staticmethod
    def _normalised(x: torch.Tensor) -> np.ndarray:
        # Normalise in float32: float16 norms of 256-d vectors lose precision.
        return F.normalize(x.float(), dim=-1).cpu().numpy().astype(np.float32, copy=False)

    def _stack(self, feats: list[np.ndarray]) -> np.ndarray:
        if not feats:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.concatenate(feats, axis=0)

    # Room for later additions (patch features, ITM scores): vision_states() and
    # text_states() expose the full token states; the ITM head is self.model.itm_head and
    # the tokenizer's [ENC] id is self.tokenizer.convert_tokens_to_ids("[ENC]").


def _portable(value: torch.Tensor) -> torch.Tensor:
    """A CPU copy in float32 whatever the runtime dtype, so the file loads on any device."""
    dtype = torch.float32 if value.is_floating_point() else value.dtype
    return value.detach().to(device="cpu", dtype=dtype).contiguous().clone()


def save_text_tower(
    model_or_embedder: Any, out_dir: Path, name: str, *, base_model_id: str | None = None
) -> Path:
    """Write a text-tower override: text_tower.safetensors (text_encoder.* and text_proj.*)
    and text_tower.json. `model_or_embedder` is a BlipForImageTextRetrieval or a BlipEmbedder;
    base_model_id defaults to the embedder's model_id."""
    from safetensors.torch import save_file

    if not name or not name.strip():
        raise ValueError("a text tower needs a name")
    embedder = model_or_embedder if isinstance(model_or_embedder, BlipEmbedder) else None
    model = embedder.model if embedder is not None else model_or_embedder
    config = model.config
    tensors = {key: _portable(value) for key, value in model.state_dict().items() if _is_text_tower_key(key)}
    if not tensors:
        raise ModelError("the model has no text_encoder/text_proj weights to save")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out_dir / TEXT_TOWER_WEIGHTS), metadata={"format": TEXT_TOWER_FORMAT})
    meta = {
        "format": TEXT_TOWER_FORMAT,
        "version": TEXT_TOWER_VERSION,
        "name": name.strip(),
        "base_model_id": base_model_id or (embedder.model_id if embedder is not None else None),
        "arch": _text_tower_arch(config),
        "arch_hash": text_tower_arch_hash(config),
        "dim": int(config.image_text_hidden_size),
        "tensors": len(tensors),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    (out_dir / TEXT_TOWER_META).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return out_dir
