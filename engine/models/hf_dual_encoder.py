"""What the Hugging Face dual-encoder backends (engine/backends/blip/, engine/backends/clip/) share.

Both load a transformers folder (config.json, safetensors weights, a tokenizer) into an Embedder
with the same runtime rules: dtype and compute mode, pixel lookup tables, batching, token budgets,
float32 normalisation, reduced-precision tower copies for the fast path, text-tower overrides
checked tensor by tensor, and a Trainer adapter that trains the text side in float32. The rules
live here once; each backend keeps what is its own: its model and tokenizer classes and checks,
its image preprocessing (BLIP resizes to a square, CLIP resizes the shortest side and crops), the
module each tower is and where its embedding is read, and its text-tower file format.

Nothing here branches on a backend: a backend passes its classes and its words ("BLIP", "CLIP")
in. torch is imported inside the functions (as engine/models/device.py does), so importing this
module stays cheap.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from engine.errors import ModelError, ModelIntegrityError, ModelNotInstalledError
from engine.models.file_limits import check_model_files
from engine.models.tokenizers import TextCleaning, thread_safe

if TYPE_CHECKING:
    import torch
    from PIL import Image

    from engine.training.configs import TrainConfig

log = logging.getLogger(__name__)

# How image and text embeddings are computed (an embedder's `compute`):
#   "fast"      SDPA, a last layer computed for the embedding's token only, bf16 copies of the
#               towers on CPUs with native bf16; the weights' dtype on GPUs. What the registry
#               (CLI, GUI) loads.
#   "exact"     the same forwards in the weights' dtype. The default for direct construction
#               (training, evaluation, tests).
#   "reference" transformers' own forward.
COMPUTE_MODES = ("fast", "exact", "reference")

# dtype setting -> torch dtype name.
DTYPE_NAMES = {"float32": "float32", "fp32": "float32", "float16": "float16", "fp16": "float16",
               "half": "float16", "bfloat16": "bfloat16", "bf16": "bfloat16"}

# A learnt temperature's cap (CLIP's training caps its logit scale at 100).
MAX_LOGIT_SCALE = 100.0
TRAINING_INFO = "training.json"


# --------------------------------------------------------------------------- settings


def check_compute_mode(compute: str) -> None:
    if compute not in COMPUTE_MODES:
        raise ModelError(f"Unknown compute mode {compute!r}; use one of {', '.join(COMPUTE_MODES)}.")


def resolve_dtype(name: str | None, device: str) -> torch.dtype:
    """None -> float16 on a GPU (half the memory, same retrieval quality), float32 on the CPU."""
    import torch

    if name is None:
        return torch.float32 if device == "cpu" else torch.float16
    try:
        return getattr(torch, DTYPE_NAMES[name.strip().lower()])
    except KeyError:
        raise ModelError(f"Unknown dtype {name!r}; use float32, float16 or bfloat16.") from None


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def fast_weight_dtype(compute: str, device: str, torch_dtype: torch.dtype) -> torch.dtype | None:
    """The dtype of the fast path's tower copies: bf16 for float32 weights on a CPU with native
    bf16 matmuls, else None (the weights' own dtype)."""
    import torch

    from engine.models.device import cpu_supports_bf16

    if compute == "fast" and device == "cpu" and torch_dtype == torch.float32 and cpu_supports_bf16():
        return torch.bfloat16
    return None


# --------------------------------------------------------------------------- loading a folder


def check_safetensors_folder(folder: Path, *, not_found: str, pickle_hint: str = "") -> None:
    """A model folder with config.json and safetensors weights. `not_found`: the message when the
    folder does not exist; `pickle_hint`: what the pickle-only message adds (how to convert)."""
    if not folder.is_dir():
        raise ModelNotInstalledError(not_found)
    if not (folder / "config.json").is_file():
        raise ModelIntegrityError(f"{folder} has no config.json; it is not a model folder.")
    if not ((folder / "model.safetensors").is_file() or (folder / "model.safetensors.index.json").is_file()):
        if any(folder.glob("*.bin")) or any(folder.glob("*.pt")) or any(folder.glob("*.pth")):
            raise ModelIntegrityError(
                f"{folder} only has pickle weights (.bin/.pt); Longlens loads safetensors only{pickle_hint}.")
        raise ModelIntegrityError(f"{folder} has no model.safetensors.")
    # What transformers reads whole (config, tokenizer files, preprocessor config) within its size and
    # nesting limits before it reads any (engine.models.file_limits).
    check_model_files(folder)


def load_pretrained(model_class: Any, folder: Path, config: Any, *, dtype: torch.dtype, device: str,
                    family: str) -> Any:
    """`model_class.from_pretrained` on the folder's safetensors with `config`, refused unless every
    weight is there in its shape; in eval mode on `device`. Run the backend's config-fits-weights
    check first: a config its weights do not fit could ask for any amount of memory."""
    from transformers.utils import logging as hf_logging

    # Our callers draw their own progress; transformers' per-load bars would clutter the CLI.
    hf_logging.disable_progress_bar()
    try:
        model, info = model_class.from_pretrained(str(folder), config=config, local_files_only=True,
                                                  use_safetensors=True, dtype=dtype, output_loading_info=True)
    except Exception as exc:
        raise ModelIntegrityError(f"Cannot load the {family} weights in {folder}: {exc}") from exc
    problems = [f"missing {k}" for k in info.get("missing_keys", [])]
    problems += [f"wrong shape {m[0] if isinstance(m, tuple) else m}" for m in info.get("mismatched_keys", [])]
    if problems:
        raise ModelIntegrityError(f"The weights in {folder} do not fit the {family} config "
                                  f"({len(problems)} problems: {', '.join(sorted(problems)[:5])}).")
    if info.get("unexpected_keys"):
        log.debug("ignoring %d unexpected keys in %s", len(info["unexpected_keys"]), folder)
    model.eval()
    return model.to(device)


def load_tokenizer(tokenizer_class: Any, folder: Path, vocab_size: int) -> Any:
    """The folder's tokenizer, refused when it has more entries than the text model's vocabulary."""
    try:
        tokenizer = tokenizer_class.from_pretrained(str(folder), local_files_only=True)
    except Exception as exc:
        raise ModelIntegrityError(f"Cannot load the tokenizer in {folder}: {exc}") from exc
    if len(tokenizer) > vocab_size:
        raise ModelIntegrityError(
            f"The tokenizer in {folder} has {len(tokenizer)} entries but the text model only {vocab_size}.")
    # The embedder that holds it is called from the GUI thread and background jobs at once.
    return thread_safe(tokenizer)


def pixel_lut(*, scale: float, do_rescale: bool, do_normalize: bool, mean: Sequence[float],
              std: Sequence[float]) -> np.ndarray:
    """(3, 256) float32: channel value -> normalised pixel. Same arithmetic as transformers
    (uint8 -> float64 * scale -> float32, then (x - mean) / std in float32)."""
    levels = np.arange(256, dtype=np.float64)
    x = (levels * scale if do_rescale else levels).astype(np.float32)
    if not do_normalize:
        return np.repeat(x[None, :], 3, axis=0)
    mean32 = np.asarray(mean, dtype=np.float32)[:, None]
    std32 = np.asarray(std, dtype=np.float32)[:, None]
    return ((x[None, :] - mean32) / std32).astype(np.float32)


def load_folder_embedder(embedder_class: Any, model_dir: Path, *, device: str = "auto",
                         text_tower_dir: Path | None = None, model_id: str | None = None,
                         identity: str | None = None, text_identity: str | None = None,
                         default_text_tokens: int | None = None, installed: bool = False) -> Any:
    """A backend's load_embedder hook (engine/models/backend.py). A folder loaded directly: the
    exact compute path, keyed by its model_id. An installed model: compute="fast", the identities
    the registry computed, and the text tower imported with it (model_dir/text_tower)."""
    model_dir = Path(model_dir)
    if not installed:
        return embedder_class(model_dir, device=device, text_tower_dir=text_tower_dir, model_id=model_id)
    if text_tower_dir is None and (model_dir / "text_tower" / "text_tower.json").is_file():
        # An imported paragraph-trained text tower travels inside the model folder.
        text_tower_dir = model_dir / "text_tower"
    kwargs: dict[str, Any] = {"device": device, "text_tower_dir": text_tower_dir, "model_id": model_id,
                              "compute": "fast", "identity": identity, "text_identity": text_identity}
    if default_text_tokens is not None:
        kwargs["default_text_tokens"] = default_text_tokens
    return embedder_class(model_dir, **kwargs)


# --------------------------------------------------------------------------- the embedder


class HfDualEncoderEmbedder:
    """The Embedder protocol's runtime for a Hugging Face dual encoder. A subclass's __init__
    calls set_device, loads its model and tokenizer, sets the sizes (dim, image_size,
    max_text_tokens, default_text_tokens), then calls set_runtime and finish_loading; it
    implements image_features, text_features, _to_input_size, _load_image_settings (which sets
    _lut, see pixel_lut) and _load_text_tower."""

    #: the fast path's towers (a ReducedPrecisionTowers subclass taking (model, weight_dtype=...))
    fast_towers_class: Any = None
    #: the two tokens every tokenised text keeps, as effective_max_tokens' message names them
    special_tokens = ""
    #: what the model's own code did to a text before its tokenizer (the backend's declaration,
    #: ModelBackend.text_cleaning); applied once, to the text as given, by every text path here
    text_cleaning: TextCleaning

    checkpoint_dir: Path
    model: Any
    tokenizer: Any
    dim: int
    image_size: int
    max_text_tokens: int
    default_text_tokens: int
    _lut: np.ndarray

    # ----------------------------------------------------------------- loading

    def set_device(self, device: str, dtype: str | None) -> None:
        from engine.models.device import resolve_device

        self.device = resolve_device(device)
        self.torch_dtype = resolve_dtype(dtype, self.device)
        self.dtype = dtype_name(self.torch_dtype)

    def set_runtime(self, model_id: str | None, compute: str) -> None:
        """Identifiers before any text tower, batch size and compute path (the model is loaded)."""
        self.model_id = model_id or self.checkpoint_dir.resolve().name
        self.text_model_id = self.model_id
        self.text_tower_name: str | None = None
        # GPUs need large batches to fill; on the CPU 8 already amortises per-call overhead.
        self.batch_size = 8 if self.device == "cpu" else 128
        self.compute = compute
        self._fast = self._make_fast_towers(compute)
        # Intra-op threads for a query (a few texts) on the CPU fast path; see intra_op_threads.
        self.query_threads: int | None = 1 if compute == "fast" and self.device == "cpu" else None

    def finish_loading(self, text_tower_dir: Path | None, identity: str | None, text_identity: str | None) -> None:
        """Image settings, the text tower, and what keys this model's vectors (the registry computes
        identities from the manifest; a folder loaded directly is keyed by its model_id)."""
        self._load_image_settings()
        self.text_tower_dir: Path | None = None
        if text_tower_dir is not None:
            self._load_text_tower(Path(text_tower_dir))
            self.text_tower_dir = Path(text_tower_dir)
        self.identity = identity or self.model_id
        self.text_identity = text_identity or self.text_model_id

    def _make_fast_towers(self, compute: str) -> Any:
        if compute == "reference":
            return None
        weight_dtype = fast_weight_dtype(compute, self.device, self.torch_dtype)
        return self.fast_towers_class(self.model, weight_dtype=weight_dtype)

    def _load_image_settings(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _load_text_tower(self, folder: Path) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def compute_dtype(self) -> str:
        """The dtype the towers run in ("bfloat16" for the CPU fast path)."""
        if self._fast is not None and self._fast.weight_dtype is not None:
            return dtype_name(self._fast.weight_dtype)
        return self.dtype

    # ----------------------------------------------------------------- images

    def _to_input_size(self, rgb: Image.Image) -> Image.Image:  # pragma: no cover - abstract
        raise NotImplementedError

    def image_features(self, pixels: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def preprocess(self, images: Sequence[Image.Image]) -> np.ndarray:
        from engine.models.base import to_rgb

        size = self.image_size
        out = np.empty((len(images), 3, size, size), dtype=np.float32)
        for i, image in enumerate(images):
            arr = np.asarray(self._to_input_size(to_rgb(image)), dtype=np.uint8)
            for c in range(3):
                out[i, c] = self._lut[c][arr[..., c]]
        return out

    def encode_pixels(self, pixel_values: np.ndarray) -> np.ndarray:
        import torch

        pixel_values = np.asarray(pixel_values, dtype=np.float32)
        size = self.image_size
        if pixel_values.ndim != 4 or pixel_values.shape[1:] != (3, size, size):
            raise ModelError(
                f"Pixel values must have shape (N, 3, {size}, {size}); got {tuple(pixel_values.shape)}.")
        feats = []
        on_gpu = self.device.startswith("cuda")
        with torch.inference_mode():
            for start in range(0, len(pixel_values), self.batch_size):
                batch = torch.from_numpy(pixel_values[start : start + self.batch_size])
                if on_gpu:
                    # Pinned host memory: the copy runs by DMA, asynchronously to the host.
                    batch = batch.pin_memory().to(self.device, non_blocking=True)
                batch = batch.to(device=self.device, dtype=self.torch_dtype)
                feats.append(self._normalised(self.image_features(batch)))
        return self._stack(feats)

    def encode_images(self, images: Sequence[Image.Image]) -> np.ndarray:
        return self._stack([self.encode_pixels(self.preprocess(images[i : i + self.batch_size]))
                            for i in range(0, len(images), self.batch_size)])

    # ----------------------------------------------------------------- texts

    def text_features(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError

    def effective_max_tokens(self, max_tokens: int | None) -> int:
        if max_tokens is None:
            return self.default_text_tokens
        if max_tokens < 2:
            raise ValueError(f"max_tokens must be at least 2 ({self.special_tokens})")
        # Position embeddings stop at max_text_tokens; a larger budget means "everything the
        # model can read", so it is clamped rather than refused.
        return min(int(max_tokens), self.max_text_tokens)

    def clean_texts(self, texts: Sequence[str]) -> list[str]:
        """`texts` as the model's own code cleaned its texts before tokenizing (text_cleaning)."""
        return self.text_cleaning.texts(texts)

    def tokenize(self, texts: Sequence[str], max_tokens: int | None = None) -> dict[str, torch.Tensor]:
        """Token ids and attention mask exactly as encode_texts feeds them (on the CPU): the texts
        cleaned as the model was trained (text_cleaning), then tokenized."""
        return self._tokenize_cleaned(self.clean_texts(texts), self.effective_max_tokens(max_tokens))

    def _tokenize_cleaned(self, cleaned: list[str], limit: int) -> dict[str, torch.Tensor]:
        enc = self.tokenizer(cleaned, truncation=True, max_length=limit, padding=True, return_tensors="pt")
        return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}

    def encode_texts(self, texts: Sequence[str], max_tokens: int | None = None) -> np.ndarray:
        import torch

        from engine.models.batching import length_sorted_batches
        from engine.models.device import intra_op_threads

        # Cleaned once here: the cleaning is not idempotent (a double HTML unescape).
        texts = self.clean_texts(texts)
        limit = self.effective_max_tokens(max_tokens)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        # Batches of similar length waste less compute on padding; order is restored below.
        lengths = [len(ids) for ids in self.tokenizer(texts, truncation=True, max_length=limit)["input_ids"]]
        feats = np.empty((len(texts), self.dim), dtype=np.float32)
        threads = self.query_threads if len(texts) <= 4 else None
        with torch.inference_mode(), intra_op_threads(threads):
            for idx in length_sorted_batches(lengths, self.batch_size):
                enc = self._tokenize_cleaned([texts[i] for i in idx], limit)
                ids, mask = enc["input_ids"].to(self.device), enc["attention_mask"].to(self.device)
                feats[idx] = self._normalised(self.text_features(ids, mask))
        return feats

    def token_count(self, text: str) -> int:
        """Tokens of `text` as tokenize reads it (cleaned first), special tokens included: what the
        GUI's counter shows and where search cuts."""
        # verbose=False: the over-limit warning is noise here, counting long texts is the point.
        return len(self.tokenizer(self.text_cleaning(text), add_special_tokens=True, truncation=False,
                                  verbose=False)["input_ids"])

    # ----------------------------------------------------------------- helpers

    @staticmethod
    def _normalised(x: torch.Tensor) -> np.ndarray:
        import torch.nn.functional as F

        # Normalise in float32: float16 norms of 256-d vectors lose precision.
        return F.normalize(x.float(), dim=-1).cpu().numpy().astype(np.float32, copy=False)

    def _stack(self, feats: list[np.ndarray]) -> np.ndarray:
        if not feats:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.concatenate(feats, axis=0)


class ReducedPrecisionTowers:
    """What a backend's fast towers (engine/backends/*/fast.py) share: the model, and copies of
    its vision and text towers (each with its projection) in `weight_dtype` (None: the model's
    own dtype, no copy), made on first use. A subclass names the modules (vision_parts,
    text_parts) and computes the features."""

    def __init__(self, model: Any, *, weight_dtype: torch.dtype | None = None) -> None:
        self.model = model
        self.weight_dtype = weight_dtype
        self._vision: tuple[Any, ...] | None = None
        self._text: tuple[Any, ...] | None = None

    def vision_parts(self) -> tuple[Any, Any]:  # pragma: no cover - abstract
        raise NotImplementedError

    def text_parts(self) -> tuple[Any, Any]:  # pragma: no cover - abstract
        raise NotImplementedError

    def refresh(self) -> None:
        """Forget the reduced-precision copies; the next call copies the current weights."""
        self._vision = self._text = None

    def vision(self) -> tuple[Any, ...]:
        """(tower, projection) of the vision side, in weight_dtype."""
        if self._vision is None:
            self._vision = self._cast(*self.vision_parts())
        return self._vision

    def text(self) -> tuple[Any, ...]:
        """(tower, projection) of the text side, in weight_dtype."""
        if self._text is None:
            self._text = self._cast(*self.text_parts())
        return self._text

    def _cast(self, *modules: Any) -> tuple[Any, ...]:
        dtype = self.weight_dtype
        if dtype is None or all(p.dtype == dtype for m in modules for p in m.parameters()):
            return modules
        return tuple(copy.deepcopy(m).to(dtype).eval() for m in modules)


# --------------------------------------------------------------------------- text towers


def text_transformer_arch(text_config: Any) -> dict[str, int]:
    """The text transformer's size fields every text-tower record starts with, under the names
    both backends' tower formats store. Changing this changes every format's arch_hash (and so
    refuses every tower written before): a backend's own fields belong in its own record."""
    return {
        "text_hidden_size": int(text_config.hidden_size),
        "text_num_hidden_layers": int(text_config.num_hidden_layers),
        "text_num_attention_heads": int(text_config.num_attention_heads),
        "text_intermediate_size": int(text_config.intermediate_size),
        "vocab_size": int(text_config.vocab_size),
        "max_position_embeddings": int(text_config.max_position_embeddings),
    }


def arch_hash(arch: dict[str, Any]) -> str:
    """The short hash a text-tower record stores of its architecture fields."""
    blob = json.dumps(arch, sort_keys=True).encode("utf-8")
    return hashlib.sha256(blob).hexdigest()[:16]


def read_tower_tensors(weights_path: Path) -> dict[str, Any]:
    """Every tensor of a text tower's safetensors file (ModelIntegrityError if it cannot be read)."""
    from safetensors import safe_open

    try:
        with safe_open(str(weights_path), framework="pt") as fh:
            return {key: fh.get_tensor(key) for key in fh.keys()}
    except Exception as exc:  # safetensors raises its own error types for bad headers
        raise ModelIntegrityError(f"{weights_path} is unreadable: {exc}") from None


def tower_misfits(tensors: dict[str, Any], own: dict[str, Any]) -> tuple[list[str], list[str], list[str]]:
    """How a tower's tensors fail to fit the model's own (name -> tensor): the names the model
    lacks, the names the tower lacks, and `name (tower shape) != (model shape)`, each sorted."""
    foreign = sorted(k for k in tensors if k not in own)
    missing = sorted(k for k in own if k not in tensors)
    wrong = sorted(f"{k} {tuple(tensors[k].shape)} != {tuple(own[k].shape)}"
                   for k in tensors if k in own and tuple(tensors[k].shape) != tuple(own[k].shape))
    return foreign, missing, wrong


def copy_tower_tensors(own: dict[str, Any], tensors: dict[str, Any]) -> None:
    """Copy a fitting tower's tensors into the model's own, in their device and dtype."""
    import torch

    with torch.no_grad():
        for key, value in tensors.items():
            own[key].copy_(value.to(device=own[key].device, dtype=own[key].dtype))


# --------------------------------------------------------------------------- training


class HfTextTowerAdapter:
    """The Trainer's DualEncoderAdapter skeleton on a float32 embedder of `embedder_class`:
    which parameters train, train/eval modes, autocast, the temperature and the save. A subclass
    names its towers' modules (text_modules, vision_modules), where a learnt temperature starts
    (initial_log_scale), writes a text tower (save_text_tower) and a full folder (_save_full), and
    computes the embeddings."""

    embedder_class: Any = None

    def __init__(self, embedder: Any, *, amp: bool = True) -> None:
        import torch

        from engine.models.device import training_autocast_dtype

        if embedder.torch_dtype != torch.float32:
            # Optimiser updates of 1e-5 vanish in fp16/bf16 weights: master weights must be fp32.
            raise ValueError(f"train on a {self.embedder_class.__name__} loaded with dtype='float32'")
        self.embedder = embedder
        self.model = embedder.model
        self.device = embedder.device
        self.amp_dtype = training_autocast_dtype(self.device) if amp else None
        self._log_scale: torch.nn.Parameter | None = None

    @classmethod
    def from_checkpoint(cls, checkpoint_dir: Path, *, device: str = "auto", text_tower_dir: Path | None = None,
                        model_id: str | None = None, amp: bool = True) -> Any:
        """Load a folder in float32 on the exact compute path (optionally with a text tower to
        continue from)."""
        embedder = cls.embedder_class(Path(checkpoint_dir), device=device, dtype="float32", compute="exact",
                                      text_tower_dir=text_tower_dir, model_id=model_id)
        return cls(embedder, amp=amp)

    @classmethod
    def for_training(cls, folder: Path, *, device: str = "auto", init_text_tower: Path | None = None,
                     model_id: str = "", amp: bool = True) -> Any:
        """A backend's make_training_adapter hook (engine/models/backend.py): a trainable adapter on
        the folder's weights (float32), optionally starting from a text tower."""
        return cls.from_checkpoint(folder, device=device, text_tower_dir=init_text_tower, model_id=model_id or None,
                                   amp=amp)

    def text_modules(self) -> list[Any]:  # pragma: no cover - abstract
        raise NotImplementedError

    def vision_modules(self) -> list[Any]:  # pragma: no cover - abstract
        raise NotImplementedError

    def initial_log_scale(self) -> float:  # pragma: no cover - abstract
        raise NotImplementedError

    def save_text_tower(self, out_dir: Path, name: str) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _save_full(self, out_dir: Path) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def training_info(self) -> dict[str, Any]:
        """What training.json records besides the config, the base model and the Trainer's extras."""
        return {}

    def _autocast(self) -> Any:
        from engine.models.device import autocast

        return autocast(self.device, self.amp_dtype)

    # -- DualEncoderAdapter ------------------------------------------------------
    def trainable_parameters(self, train_vision: bool, learn_temperature: bool) -> list[torch.nn.Parameter]:
        import torch

        params = [p for m in self.text_modules() for p in m.parameters()]
        if train_vision:
            params += [p for m in self.vision_modules() for p in m.parameters()]
        for p in self.model.parameters():
            p.requires_grad_(False)
        for p in params:
            p.requires_grad_(True)
        if learn_temperature:
            if self._log_scale is None:
                self._log_scale = torch.nn.Parameter(torch.tensor(self.initial_log_scale(), device=self.device))
            params.append(self._log_scale)
        return params

    def train_mode(self, train_vision: bool) -> None:
        self.model.eval()  # the frozen parts (vision tower, any other head) keep inference behaviour
        for m in self.text_modules() + (self.vision_modules() if train_vision else []):
            m.train()

    def logit_scale(self, cfg: TrainConfig) -> torch.Tensor:
        import torch

        if cfg.learn_temperature and self._log_scale is not None:
            return self._log_scale.exp().clamp(max=MAX_LOGIT_SCALE)
        return torch.tensor(1.0 / cfg.temperature, device=self.device)

    def save(self, out_dir: Path, cfg: TrainConfig, *, text_only: bool, extra: dict) -> Path:
        from engine.fileutil import atomic_write_text

        out_dir = Path(out_dir)
        info: dict[str, Any] = {"training": cfg.to_dict(), "base_model_id": self.embedder.model_id,
                                **self.training_info(), **extra}
        if text_only:
            self.save_text_tower(out_dir, cfg.name)
        else:
            self._save_full(out_dir)
        atomic_write_text(out_dir / TRAINING_INFO, json.dumps(info, indent=2, default=str) + "\n")
        return out_dir

