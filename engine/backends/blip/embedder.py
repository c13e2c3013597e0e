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

import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from engine.backends.blip import BACKEND
from engine.backends.blip.fast import FastBlipTowers
from engine.errors import ModelError, ModelIntegrityError, ModelNotInstalledError
from engine.jsonfile import read_json_file
from engine.limits import MAX_MODEL_CONFIG_BYTES, model_file_limit
from engine.models.device import resolve_device  # noqa: F401  (re-exported for the backend's callers)
from engine.models.hf_dual_encoder import (  # noqa: F401  (resolve_dtype: re-exported for the backend's callers)
    HfDualEncoderEmbedder,
    arch_hash,
    check_compute_mode,
    check_safetensors_folder,
    copy_tower_tensors,
    load_pretrained,
    load_tokenizer,
    pixel_lut,
    read_tower_tensors,
    resolve_dtype,
    text_transformer_arch,
    tower_misfits,
)

log = logging.getLogger(__name__)

TEXT_TOWER_WEIGHTS = "text_tower.safetensors"
TEXT_TOWER_META = "text_tower.json"
TEXT_TOWER_FORMAT = "longlens-blip-text-tower"
TEXT_TOWER_VERSION = 1
# State-dict prefixes of the parts a paragraph-trained text tower replaces.
TEXT_TOWER_PREFIXES = ("text_encoder.", "text_proj.")

# Compute modes: engine/models/hf_dual_encoder.py. "fast": SDPA, [CLS]-only last layer, bf16 copies
# of the towers on CPUs with native bf16 (cosine >= 0.9998 to float32 on the full-size model).
# "exact": SDPA and [CLS]-only last layer in the weights' dtype, float32 rounding away from the
# reference. "reference": transformers' own eager forward.

_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def _text_tower_arch(config: Any) -> dict[str, int]:
    """The config values that fix the text tower's tensor shapes."""
    return {**text_transformer_arch(config.text_config),
            "encoder_hidden_size": int(config.text_config.encoder_hidden_size),
            "image_text_hidden_size": int(config.image_text_hidden_size)}


def text_tower_arch_hash(config: Any) -> str:
    return arch_hash(_text_tower_arch(config))


def _declared_model_type(folder: Path) -> str | None:
    """config.json's own model_type; BlipConfig.from_pretrained only warns on a foreign one."""
    try:
        return read_json_file(folder / "config.json", max_bytes=MAX_MODEL_CONFIG_BYTES).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None


def _is_text_tower_key(key: str) -> bool:
    return key.startswith(TEXT_TOWER_PREFIXES)


class BlipEmbedder(HfDualEncoderEmbedder):
    """Image and text embeddings from a local BLIP retrieval checkpoint (Hugging Face layout)."""

    backend = "blip"  # the registry's key for this embedder's backend object
    fast_towers_class = FastBlipTowers
    special_tokens = "[CLS] and [SEP]"
    text_cleaning = BACKEND.text_cleaning  # nothing beyond BertTokenizer's own normaliser

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

        check_compute_mode(compute)
        self.checkpoint_dir = Path(checkpoint_dir)
        check_safetensors_folder(self.checkpoint_dir,
                                 not_found=f"BLIP checkpoint folder {self.checkpoint_dir} does not exist.")
        self.set_device(device, dtype)

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

        self.tokenizer = load_tokenizer(BertTokenizerFast, self.checkpoint_dir, int(config.text_config.vocab_size))

        self.dim = int(config.image_text_hidden_size)
        self.image_size = int(config.vision_config.image_size)
        self.max_text_tokens = int(config.text_config.max_position_embeddings)
        self.default_text_tokens = max(2, min(int(default_text_tokens), self.max_text_tokens))
        self.set_runtime(model_id, compute)
        self.finish_loading(text_tower_dir, identity, text_identity)

    # ----------------------------------------------------------------- loading

    def _load_model(self, config: Any) -> Any:
        from transformers import BlipForImageTextRetrieval

        from engine.backends.blip.shapes import check_blip_config_fits_weights

        # Before anything is allocated: a config its weights do not fit could ask for any amount.
        check_blip_config_fits_weights(self.checkpoint_dir, config)
        return load_pretrained(BlipForImageTextRetrieval, self.checkpoint_dir, config, dtype=self.torch_dtype,
                               device=self.device, family="BLIP")

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
                cfg = read_json_file(path, max_bytes=model_file_limit(path.name) or 0)
            except (OSError, ValueError) as exc:
                raise ModelIntegrityError(f"{path} is unreadable: {exc}") from exc
            if not isinstance(cfg, dict):
                raise ModelIntegrityError(f"{path} is not a JSON object")
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
        self._lut = pixel_lut(scale=scale, do_rescale=do_rescale, do_normalize=do_normalize, mean=mean, std=std)

    def _load_text_tower(self, folder: Path) -> None:
        weights_path = folder / TEXT_TOWER_WEIGHTS
        meta_path = folder / TEXT_TOWER_META
        if not weights_path.is_file() or not meta_path.is_file():
            raise ModelNotInstalledError(
                f"Text tower folder {folder} needs {TEXT_TOWER_WEIGHTS} and {TEXT_TOWER_META}."
            )
        try:
            meta = read_json_file(meta_path, max_bytes=model_file_limit(meta_path.name) or 0)
        except (OSError, ValueError) as exc:
            raise ModelIntegrityError(f"{meta_path} is unreadable: {exc}") from exc
        if not isinstance(meta, dict) or meta.get("format") != TEXT_TOWER_FORMAT:
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
        tensors = read_tower_tensors(weights_path)
        foreign, missing, wrong = tower_misfits(tensors, own)
        if foreign or missing or wrong:
            details = []
            if foreign:
                details.append(f"unknown keys: {', '.join(foreign[:3])}")
            if missing:
                details.append(f"missing keys: {', '.join(missing[:3])}")
            if wrong:
                details.append(f"wrong shapes: {', '.join(wrong[:3])}")
            raise ModelError(f"Text tower {folder} does not fit {self.model_id} ({'; '.join(details)}).")
        copy_tower_tensors(own, tensors)
        name = str(meta.get("name") or folder.name)
        self.text_tower_name = name
        self.text_model_id = f"{self.model_id}+{name}"
        if self._fast is not None:
            self._fast.refresh()  # reduced-precision copies hold the old text weights

    # ----------------------------------------------------------------- images

    def _to_input_size(self, rgb: Image.Image) -> Image.Image:
        size = self.image_size
        return rgb if rgb.size == (size, size) else rgb.resize((size, size), resample=self._resample)

    def vision_states(self, pixels: torch.Tensor) -> torch.Tensor:
        """All vision tokens (N, 1 + patches, hidden); [CLS] first."""
        return self.model.vision_model(pixel_values=pixels).last_hidden_state

    def image_features(self, pixels: torch.Tensor) -> torch.Tensor:
        """Projected, not yet normalised (N, dim) [CLS] features of preprocessed pixels on the
        model's device, by this embedder's compute path."""
        if self._fast is not None:
            return self._fast.image_features(pixels)
        return self.model.vision_proj(self.vision_states(pixels)[:, 0, :])

    # ----------------------------------------------------------------- texts

    def text_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """All text tokens (N, L, hidden) from the unimodal text encoder; [CLS] first."""
        return self.model.text_encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    def text_features(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Projected, not yet normalised (N, dim) [CLS] features of `tokenize`'s ids on the model's
        device, by this embedder's compute path."""
        if self._fast is not None:
            return self._fast.text_features(input_ids, attention_mask)
        return self.model.text_proj(self.text_states(input_ids, attention_mask)[:, 0, :])

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
