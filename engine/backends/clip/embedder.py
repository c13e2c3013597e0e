"""CLIP-family embedder (transformers' CLIPModel folders) behind the Embedder protocol.

OpenAI CLIP (77 text positions) and Long-CLIP (the same architecture with 248 positions, converted
from its official checkpoints by convert.py) are one model class here; the limit is the config's
text max_position_embeddings. Embeddings are what transformers' CLIPModel computes:
    image: normalize(visual_projection(post_layernorm(vision_model(pixels)[:, 0])))
    text:  normalize(text_projection(final_layer_norm(text_model(ids))[pooled token]))
Pixels are CLIPImageProcessor's: shortest side resized (bicubic) to the configured edge, centre
crop, rescale 1/255, OpenAI's mean and std. Texts are cleaned as OpenAI's tokenizer cleaned them
(ftfy, HTML unescaped twice, whitespace, lower case: engine/models/tokenizers.py), then are the
folder's CLIPTokenizer's ids truncated at the budget ([BOS] ... [EOS] kept), padded with <|endoftext|>.

Nothing imports this module at `engine` import time; the registry imports it when a CLIP model
is loaded, so torch and transformers are imported at the top.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from engine.backends.clip import BACKEND
from engine.backends.clip.fast import FastClipTowers, pooled_positions
from engine.backends.clip.shapes import check_clip_config_dict, read_config
from engine.errors import ModelIntegrityError
from engine.models.hf_dual_encoder import (
    HfDualEncoderEmbedder,
    check_compute_mode,
    check_safetensors_folder,
    load_pretrained,
    load_tokenizer,
    pixel_lut,
)

log = logging.getLogger(__name__)

# Compute modes (engine/models/hf_dual_encoder.py): "fast" (SDPA, pooled-token-only last layer,
# bf16 copies of the towers on CPUs with native bf16; what the registry loads), "exact" (the same
# forwards in the weights' dtype; the default for direct construction), "reference"
# (transformers' own get_image_features/get_text_features).

_OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)
_OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)
MAX_PREPROCESSOR_BYTES = 1024 * 1024
# The resize edge a preprocessor config may ask for: a user-controlled number that sizes an image.
MAX_RESIZE_EDGE = 4096
# Past this ratio of the resized long side to the crop, only the region the crop keeps is resampled
# (PIL's resize box): same sampling positions, and a 50:1 panorama no longer becomes a huge image.
_BOX_RESIZE_RATIO = 4


def _size_pair(value: Any, what: str, path: Path) -> dict[str, int]:
    """A size field as transformers reads it: an int, or a dict with shortest_edge or height/width."""
    if isinstance(value, int) and not isinstance(value, bool):
        return {"shortest_edge": value}
    if isinstance(value, dict) and all(isinstance(v, int) and not isinstance(v, bool) for v in value.values()):
        return dict(value)
    raise ModelIntegrityError(f"{path}: {what} = {value!r} is not a size Longlens understands")


class ClipEmbedder(HfDualEncoderEmbedder):
    """Image and text embeddings from a local CLIPModel folder (Hugging Face layout)."""

    backend = "clip"  # the registry's key for this embedder's backend object
    fast_towers_class = FastClipTowers
    special_tokens = "<|startoftext|> and <|endoftext|>"
    text_cleaning = BACKEND.text_cleaning  # OpenAI's ftfy + HTML + whitespace cleaning, before the BPE

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

        check_compute_mode(compute)
        self.checkpoint_dir = Path(checkpoint_dir)
        check_safetensors_folder(
            self.checkpoint_dir, not_found=f"CLIP model folder {self.checkpoint_dir} does not exist.",
            pickle_hint=" (Long-CLIP's official .pt files are converted once with `longlens models convert`)")
        check_clip_config_dict(read_config(self.checkpoint_dir))
        self.set_device(device, dtype)
        try:
            config = CLIPConfig.from_pretrained(str(self.checkpoint_dir), local_files_only=True)
        except Exception as exc:  # transformers raises OSError/ValueError/TypeError for bad configs
            raise ModelIntegrityError(f"{self.checkpoint_dir / 'config.json'} is not a CLIP config: {exc}") from exc
        self.config = config
        self.model = self._load_model(config)
        self.tokenizer = self._load_tokenizer(config)

        self.dim = int(config.projection_dim)
        self.image_size = int(config.vision_config.image_size)
        self.max_text_tokens = int(config.text_config.max_position_embeddings)
        default = self.max_text_tokens if default_text_tokens is None else int(default_text_tokens)
        self.default_text_tokens = max(2, min(default, self.max_text_tokens))
        self.set_runtime(model_id, compute)
        self.finish_loading(text_tower_dir, identity, text_identity)

    # ----------------------------------------------------------------- loading

    def _load_model(self, config: Any) -> Any:
        from transformers import CLIPModel

        from engine.backends.clip.shapes import check_clip_config_fits_weights

        check_clip_config_fits_weights(self.checkpoint_dir, config)
        return load_pretrained(CLIPModel, self.checkpoint_dir, config, dtype=self.torch_dtype, device=self.device,
                               family="CLIP")

    def _load_tokenizer(self, config: Any) -> Any:
        from transformers import CLIPTokenizer

        folder = self.checkpoint_dir
        if not (folder / "tokenizer.json").is_file() and not (
                (folder / "vocab.json").is_file() and (folder / "merges.txt").is_file()):
            raise ModelIntegrityError(f"{folder} has no CLIP tokenizer (tokenizer.json, or vocab.json and merges.txt).")
        tok = load_tokenizer(CLIPTokenizer, folder, int(config.text_config.vocab_size))
        eos = int(config.text_config.eos_token_id)
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

    def _load_image_settings(self) -> None:
        """CLIPImageProcessor's steps from preprocessor_config.json (its defaults when absent), kept
        only when they end in the vision model's S x S input."""
        from engine.jsonfile import read_json_file

        s = self.image_size
        cfg: dict[str, Any] = {}
        path = self.checkpoint_dir / "preprocessor_config.json"
        if path.is_file():
            try:
                cfg = read_json_file(path, max_bytes=MAX_PREPROCESSOR_BYTES)
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
        self._lut = pixel_lut(scale=scale, do_rescale=bool(cfg.get("do_rescale", True)),
                              do_normalize=bool(cfg.get("do_normalize", True)), mean=mean, std=std)

    # ----------------------------------------------------------------- images

    def _to_input_size(self, rgb: Image.Image) -> Image.Image:
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

    # ----------------------------------------------------------------- texts

    def text_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """All text tokens (N, L, hidden) after final_layer_norm (causal: token i saw 0..i)."""
        return self.model.text_model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def _pooler(out: Any) -> torch.Tensor:
    """get_*_features returns the projected tensor (transformers 4) or an output whose
    pooler_output is (transformers 5)."""
    return out if isinstance(out, torch.Tensor) else out.pooler_output
