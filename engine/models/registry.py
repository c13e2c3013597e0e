"""Which models Longlens knows, where they are installed, and whether they are intact.

An installed model is a folder `paths.models / NAME /` holding the model files plus
`longlens-manifest.json`, which records the SHA-256 and size of every file. A folder without
a readable manifest is not an installed model (installs write the manifest before the folder
appears under its final name, so a crash never leaves a half-installed model there).

Nothing here talks to the network; pulling and importing live in `engine.models.download`.

This module is also the ONE dispatch point between Longlens and its model backends: the table
backend name -> `ModelBackend` (engine/models/backend.py), filled lazily from the backend packages
(engine/backends/blip/, engine/backends/sceneworld_mini/) or through `register_backend`. Nothing
outside this module and a backend's own folder branches on a backend's name or class.
torch and transformers are imported only when an embedder is loaded.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal

from engine.config import Paths
from engine.errors import ModelError, ModelIntegrityError, ModelNotInstalledError
from engine.fileutil import sha256_file  # noqa: F401  (re-exported: models code imports it from here)
from engine.models.file_limits import check_model_files
from engine.models.lm_text_side import is_lm_tower_folder, with_text_tower
from engine.models.manifest import MANIFEST_FORMAT, MANIFEST_NAME, SHA256_RE, read_manifest_file  # noqa: F401  (re-exported)
from engine.models.pins import Pin, git_blob_pin, parse_pin, sha256_pin  # noqa: F401  (re-exported for specs)
from engine.models.text_towers import (
    TEXT_TOWERS_DIR,
    bundled_text_towers,
    check_trained_for,
    resolve_text_tower,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    import numpy as np
    from PIL import Image

    from engine.models.backend import ModelBackend
    from engine.models.base import Embedder

# A backend name: a key of the backend table below (`backend_names()`); BACKENDS reads the same.
Backend = str

BUNDLED_MODEL = "sceneworld-mini"

# Files the OS or a file manager drops into folders; they are not part of a model and their
# presence must not make verification fail.
IGNORED_JUNK = frozenset({".DS_Store", "Thumbs.db", "desktop.ini"})

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")


def check_model_name(name: str) -> str:
    """Model names become folder names, so only a safe subset of characters is allowed."""
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name) or name.endswith("."):
        raise ModelError(
            f"invalid model name {name!r}: use letters, digits, '.', '_' and '-' "
            "(starting with a letter or digit, at most 100 characters)"
        )
    return name


@dataclass(frozen=True)
class ModelSpec:
    """A model Longlens can pull (or, for bundled ones, ships with).

    `files` is the allow-list for a pull: filename -> its pin (engine/models/pins.py), one of
      "<64 hex>" or "sha256:<64 hex>"  the file's SHA-256 (Git LFS files: weights),
      "git-blob:<40 hex>"              its git blob id (small git-tracked files: configs, tokenizers),
      None                             no trustworthy value known: installed only with `trust_unpinned`.
    A pull checks every downloaded file against its pin before anything is installed; a spec whose
    files are all pinned (`fully_pinned`) installs without any trust setting.
    """

    name: str
    backend: Backend
    description: str
    repo_id: str | None
    revision: str | None  # a full 40-hex commit, never a branch name: branches move
    files: Mapping[str, str | None]
    dim: int
    image_size: int
    default_text_tokens: int
    license: str = ""
    notes: str = ""  # where the revision/hashes come from, caveats
    bundled: bool = False  # ships inside the repo's resources/ folder, never downloaded

    def __post_init__(self) -> None:
        # A read-only copy, so a spec shared across threads cannot be edited by one of them.
        object.__setattr__(self, "files", MappingProxyType(dict(self.files)))
        if self.backend not in backend_names():
            raise ValueError(f"unknown backend {self.backend!r}")
        check_model_name(self.name)
        if self.revision is not None and not _COMMIT_RE.fullmatch(self.revision):
            raise ValueError(
                f"{self.name}: revision must be a full 40-hex commit hash, got {self.revision!r}"
            )
        for fname, value in self.files.items():
            try:
                parse_pin(value)
            except ValueError as e:
                raise ValueError(f"{self.name}: {fname}: {e}") from None

    def pin(self, filename: str) -> Pin | None:
        """The pin of one of `files` (None: unpinned); KeyError for a file the spec does not list."""
        return parse_pin(self.files[filename])

    @property
    def pins(self) -> dict[str, Pin]:
        """filename -> Pin for every pinned file."""
        return {f: p for f in self.files if (p := self.pin(f)) is not None}

    @property
    def unpinned_files(self) -> list[str]:
        return sorted(f for f, h in self.files.items() if h is None)

    @property
    def fully_pinned(self) -> bool:
        return bool(self.files) and not self.unpinned_files


# --- The backend table -----------------------------------------------------------------------
#
# name -> the package exporting that backend's object as BACKEND. A package is imported the first
# time its backend is asked for; its module stays cheap (heavy imports live in its hooks).
_BACKEND_PACKAGES: dict[str, str] = {
    "blip": "engine.backends.blip",
    "sceneworld-mini": "engine.backends.sceneworld_mini",
    "clip": "engine.backends.clip",
}
_BACKENDS: dict[str, ModelBackend] = {}


def register_backend(backend: ModelBackend) -> ModelBackend:
    """Add (or replace) a backend under `backend.name`: models whose manifest names it load
    through it, and its embedders (`embedder.backend == backend.name`) ground, re-rank and train
    through it. Returns the backend, so a package can write `BACKEND = register_backend(...)`."""
    if not isinstance(backend.name, str) or not backend.name:
        raise ValueError("a backend needs a non-empty name")
    _BACKENDS[backend.name] = backend
    return backend


def unregister_backend(name: str) -> None:
    """Drop a backend `register_backend` added (a built-in one is re-imported when next asked for)."""
    _BACKENDS.pop(name, None)


def backend_names() -> tuple[str, ...]:
    """Every backend name Longlens knows: the built-in ones, then registered ones."""
    return tuple(dict.fromkeys([*_BACKEND_PACKAGES, *_BACKENDS]))


def __getattr__(name: str) -> Any:
    if name == "BACKENDS":  # derived from the table, so a registered backend is in it
        return backend_names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def get_backend(name: str) -> ModelBackend:
    """The backend object called `name` (imports its package the first time)."""
    hit = _BACKENDS.get(name)
    if hit is not None:
        return hit
    package = _BACKEND_PACKAGES.get(name) if isinstance(name, str) else None
    if package is None:
        raise ModelError(f"unknown model backend {name!r}; known: {', '.join(backend_names())}")
    import importlib

    backend = importlib.import_module(package).BACKEND
    return _BACKENDS.setdefault(name, backend)


def backend_of(embedder: Any) -> ModelBackend | None:
    """The backend an embedder belongs to (its `backend` attribute names it), or None."""
    name = getattr(embedder, "backend", None)
    if not isinstance(name, str) or name not in backend_names():
        return None
    return get_backend(name)


def detect_backend(folder: Path) -> str:
    """The backend of a model folder without a manifest (a training base, a study folder)."""
    backends = sorted((get_backend(n) for n in backend_names()), key=lambda b: b.detect_order)
    for backend in backends:
        if backend.detect(Path(folder)):
            return backend.name
    raise ModelError(f"{folder} is neither " + " nor ".join(b.folder_description for b in backends))


def import_backend(folder: Path, name: str) -> str:
    """The backend `models import FOLDER --name NAME` installs as: a registered model's own; else
    the first importable backend that recognises the folder; else BLIP's (whose checks then say
    what the folder lacks)."""
    spec = _REGISTRY.get(name)
    if spec is not None:
        return spec.backend
    backends = sorted((get_backend(n) for n in backend_names()), key=lambda b: b.detect_order)
    for backend in backends:
        if backend.importable and backend.detect(Path(folder)):
            return backend.name
    return "blip"


def rerank_support(embedder: Any) -> tuple[bool, str]:
    """(available, reason when not) for re-ranking search hits with this embedder's model."""
    backend = backend_of(embedder)
    if backend is None:
        return False, f"re-ranking is not available for model {getattr(embedder, 'model_id', '?')!r}"
    return backend.check_rerank(embedder)


def rerank_scores(embedder: Any, images: Sequence[Image.Image], query: str, ann_scores: Sequence[float],
                  max_tokens: int | None = None) -> np.ndarray:
    """The score re-ranked hits are ordered by (higher first), from the embedder's backend."""
    backend = backend_of(embedder)
    if backend is None:
        raise ModelError(f"re-ranking is not available for model {getattr(embedder, 'model_id', '?')!r}")
    return backend.score_candidates(embedder, images, query, ann_scores, max_tokens=max_tokens)


def load_folder_embedder(folder: Path, backend: str, *, device: str = "auto", text_tower_dir: Path | None = None,
                         model_id: str | None = None) -> Embedder:
    """The Embedder of a model folder that is not installed (training bases, study folders):
    no manifest, no verification, the backend's reference settings."""
    text_tower_dir = resolve_text_tower(text_tower_dir, Path(folder), model_id or Path(folder).name)
    # Files read whole (configs, tokenizers) within their size and nesting limits before any is read.
    check_model_files(Path(folder))
    check_model_files(text_tower_dir)
    lm = is_lm_tower_folder(text_tower_dir)
    emb = get_backend(backend).load_embedder(Path(folder), device=device, text_tower_dir=None if lm else text_tower_dir,
                                             model_id=model_id, installed=False)
    return with_text_tower(emb, text_tower_dir)


# --- The registered models -------------------------------------------------------------------
#
# How a spec pins its files (ModelSpec.files; engine/models/pins.py): Git LFS files by SHA-256 (the
# "Git LFS Details" of the file's page on huggingface.co), git-tracked files by their git blob id
# ("git-blob:<40 hex>", the `oid` the hub's tree API lists:
#   curl https://huggingface.co/api/models/OWNER/NAME/tree/REVISION
# prints it for every file, LFS ones too, with their SHA-256 under lfs.oid), or None where no
# value is known yet. A spec whose files are all pinned pulls without any trust setting.
#
# Provenance of the pinned values (looked up in stored copies of huggingface.co pages; no value
# here was guessed). The blob ids of small JSON files were computed from the file's content as the
# stored huggingface.co page of that file shows it, serialised the way transformers writes it
# (json.dumps(indent=2, sort_keys=True) + "\n"), and only where the resulting length equals the
# exact byte size the same page shows (sizes under 1 kB are shown to the byte):
#
# Salesforce/blip-itm-base-coco
#   revision 84e6f632c6ba01251936b05946bf2c53d1f07ba0 = "Update config.json" (PR #3, merged into
#     main on 2023-04-06 as e53efa8c21a31de017ae583d8bfe42dfa9ada8cb with the same one-line change;
#     https://huggingface.co/Salesforce/blip-itm-base-coco/discussions/3). That fix
#     (text_config.num_attention_heads, as in the sibling repos' PR #3) is why we pin at or after it.
#   pytorch_model.bin SHA-256 017fb3e7f4e125f13a8a4717f1402dbe0d0bb877474b4a203db13a4447b0227f
#     from the Git LFS details on
#     https://huggingface.co/Salesforce/blip-itm-base-coco/blob/84e6f632c6ba01251936b05946bf2c53d1f07ba0/pytorch_model.bin
#   main has no model.safetensors (the safetensors variant exists only in the unmerged
#     refs/pr/5, whose hash we did not find), so the pickled .bin is pulled and converted; it is
#     loaded with torch.load(weights_only=True) only after its pinned hash matched.
#   special_tokens_map.json git blob a8b3208c2884c4efb86e49300fdd3dc877220cdf: 125 bytes, content
#     {"cls_token": "[CLS]", "mask_token": "[MASK]", "pad_token": "[PAD]", "sep_token": "[SEP]",
#     "unk_token": "[UNK]"} on
#     https://huggingface.co/Salesforce/blip-itm-base-coco/blob/e53efa8c21a31de017ae583d8bfe42dfa9ada8cb/special_tokens_map.json
#     (last changed in 73e754b "Upload processor", an ancestor of 84e6f632, which changed only
#     config.json after it: the file is the same at the pinned revision).
#   Still unpinned (no blob id found in a stored listing, and their pages do not show the whole
#     content): config.json (4.56 kB), preprocessor_config.json (445 bytes, content not shown),
#     tokenizer_config.json (456 bytes at 73e754b; content not shown), tokenizer.json (711 kB),
#     vocab.txt (232 kB). So this model still needs trust_unpinned.
#
# Salesforce/blip-itm-large-coco
#   revision fef05cafc05298067cbbca00b125749394a77a6f: its config.json blame
#     (https://huggingface.co/Salesforce/blip-itm-large-coco/blame/fef05cafc05298067cbbca00b125749394a77a6f/config.json)
#     includes the config fix 8a0f749 on top of the upload f83d395.
#   pytorch_model.bin SHA-256 f97fb8b12b0e2bdffa6ffe38b998e1dc208eb877b9baa13237c43868cdc6741e
#     from the Git LFS details on
#     https://huggingface.co/Salesforce/blip-itm-large-coco/blob/2c51ecd3411d38905785eab933fa455065f76c0d/pytorch_model.bin
#     (last changed in f83d395 "Upload BlipForImageTextRetrieval"; the main tree lists it as
#     unchanged since that upload, so the same LFS object is at fef05caf).
#   special_tokens_map.json git blob a8b3208c2884c4efb86e49300fdd3dc877220cdf (125 bytes, the same
#     content as base's) and tokenizer_config.json git blob 8360f5587c7786385d33e3c508c6e7a8c55b5369
#     (456 bytes: cls/mask/pad/sep/unk tokens, do_basic_tokenize, do_lower_case, model_max_length
#     512, name_or_path "ybelkada/blip-image-captioning-base", never_split null, processor_class
#     BlipProcessor, special_tokens_map_file null, strip_accents null, tokenize_chinese_chars,
#     tokenizer_class BertTokenizer), both from
#     https://huggingface.co/Salesforce/blip-itm-large-coco/blob/main/special_tokens_map.json and
#     .../blob/main/tokenizer_config.json: added in e4e2b9d "Upload processor", unchanged since on
#     main (tree of 2c51ecd and of main). Both files first appear in e4e2b9d, so any revision that
#     has them at all and changed only config.json after it (the config fix 8a0f749) has these bytes.
#   Still unpinned: config.json (4.59 kB), preprocessor_config.json (445 bytes, content not shown),
#     tokenizer.json (711 kB), vocab.txt (232 kB). So this model still needs trust_unpinned.

_HF_SMALL_FILES = (
    "config.json",
    "preprocessor_config.json",
    "special_tokens_map.json",
    "tokenizer_config.json",
    "tokenizer.json",
    "vocab.txt",
)

# The same special_tokens_map.json in both BLIP repos (see the provenance above).
_BLIP_SPECIAL_TOKENS_MAP_BLOB = "a8b3208c2884c4efb86e49300fdd3dc877220cdf"

_REGISTRY: dict[str, ModelSpec] = {}


def _register(spec: ModelSpec) -> None:
    _REGISTRY[spec.name] = spec


def register_model(spec: ModelSpec) -> ModelSpec:
    """Add a model to the registry, or replace the registered one of the same name (a packager's
    extra model; a test's spec with its own pins). Returns the spec it replaced, or `spec`."""
    if not isinstance(spec, ModelSpec):
        raise TypeError(f"register_model takes a ModelSpec, not {type(spec).__name__}")
    before = _REGISTRY.get(spec.name, spec)
    _REGISTRY[spec.name] = spec
    return before


def unregister_model(name: str) -> None:
    """Drop a model from the registry (its installed files, if any, are left alone)."""
    _REGISTRY.pop(name, None)


_register(
    ModelSpec(
        name="blip-itm-base-coco",
        backend="blip",
        description="BLIP ViT-B image-text retrieval model fine-tuned on COCO (about 900 MB).",
        repo_id="Salesforce/blip-itm-base-coco",
        revision="84e6f632c6ba01251936b05946bf2c53d1f07ba0",
        files={
            **{f: None for f in _HF_SMALL_FILES},
            "special_tokens_map.json": git_blob_pin(_BLIP_SPECIAL_TOKENS_MAP_BLOB),
            "pytorch_model.bin": "017fb3e7f4e125f13a8a4717f1402dbe0d0bb877474b4a203db13a4447b0227f",
        },
        dim=256,
        image_size=384,
        default_text_tokens=128,
        license="BSD-3-Clause (model card on huggingface.co)",
        notes="Weights pinned by SHA-256, special_tokens_map.json by git blob id; config, preprocessor "
        "and tokenizer files unpinned (the pull asks to trust them).",
    )
)

_register(
    ModelSpec(
        name="blip-itm-large-coco",
        backend="blip",
        description="BLIP ViT-L image-text retrieval model fine-tuned on COCO (about 1.8 GB).",
        repo_id="Salesforce/blip-itm-large-coco",
        revision="fef05cafc05298067cbbca00b125749394a77a6f",
        files={
            **{f: None for f in _HF_SMALL_FILES},
            "special_tokens_map.json": git_blob_pin(_BLIP_SPECIAL_TOKENS_MAP_BLOB),
            "tokenizer_config.json": git_blob_pin("8360f5587c7786385d33e3c508c6e7a8c55b5369"),
            "pytorch_model.bin": "f97fb8b12b0e2bdffa6ffe38b998e1dc208eb877b9baa13237c43868cdc6741e",
        },
        dim=256,
        image_size=384,
        default_text_tokens=128,
        license="BSD-3-Clause (model card on huggingface.co)",
        notes="Weights pinned by SHA-256, special_tokens_map.json and tokenizer_config.json by git blob "
        "id; config, preprocessor, tokenizer.json and vocab.txt unpinned (the pull asks to trust them).",
    )
)

def _sceneworld_spec(name: str, description: str, notes: str, *, bundled: bool = False) -> ModelSpec:
    """A model the project trains on SceneWorld (sceneworld-mini's architecture and sizes)."""
    return ModelSpec(
        name=name,
        backend="sceneworld-mini",
        description=description,
        repo_id=None,
        revision=None,
        files={},
        dim=256,
        image_size=64,
        default_text_tokens=128,
        license="Apache-2.0 (trained by the Longlens project on generated data)",
        notes=notes,
        bundled=bundled,
    )


_register(_sceneworld_spec(
    BUNDLED_MODEL,
    "Small bundled demo model trained on SceneWorld; offline. Understands SceneWorld images only: real photos "
    "need a BLIP model.",
    "Bundled in resources/models/sceneworld-mini/ (python -m engine.training.sceneworld_mini).",
    bundled=True,
))
_register(_sceneworld_spec(
    "sceneworld-mini-caft",
    "The CAFT-style sceneworld-mini variant: phrases aligned with image regions in training, no region "
    "labels; grounding from its own phrase-region maps. SceneWorld images only (docs/caft.md).",
    "Built locally by `make caft` (engine/training/caft.py); install the trained folder with "
    "`longlens models import build/caft/caft-20000 --name sceneworld-mini-caft`.",
))


# --- CLIP family (engine/backends/clip/) ------------------------------------------------------
#
# openai/clip-vit-base-patch16
#   revision 57c216476eefef5ab752ec549e440a49ae4ae5f3 = "Add widget example input (#3)", the newest
#     commit on the stored history page https://huggingface.co/openai/clip-vit-base-patch16/commits/57c216476eefef5ab752ec549e440a49ae4ae5f3
#     (after "Update config.json" 13151d2 and "add tokenizer.json" a564c9d).
#   pytorch_model.bin SHA-256 ec89c7b09c749a60aae3c9cd910516f24b58214a7df060b48962d14c469cfbf0 from the Git
#     LFS details on https://huggingface.co/openai/clip-vit-base-patch16/blob/refs%2Fpr%2F4/pytorch_model.bin,
#     last changed in 0bcfab3 "add model"; no later commit on that history touches the weights.
# openai/clip-vit-large-patch14-336
#   revision a2ab452d41e630fda015a7ad3e9751aa74081239 = "add model" (valhalla, 2022-04-22), full hash from
#     the history of the duplicate https://huggingface.co/grantpitt/clip-vit-large-patch14-336/commits/a2ab452d41e630fda015a7ad3e9751aa74081239
#     (a duplicate keeps the original's commits); the openai repo's main shows pytorch_model.bin last
#     changed in that commit, SHA-256 c6032c2e0caae3dc2d4fba35535fa6307dbb49df59c7e182b1bc4b3329b81801
#     (https://huggingface.co/openai/clip-vit-large-patch14-336/blob/main/pytorch_model.bin).
#     tokenizer.json is left out: no stored page shows it at that revision; vocab.json and merges.txt
#     are what "add model" uploaded, and the CLIP backend reads them.
# BeichenZhang/LongCLIP-B, BeichenZhang/LongCLIP-L
#   The official weights are OpenAI-layout .pt pickles (the repositories hold nothing else Longlens
#   needs). Revision 5ec98ddcf52692ea2e5a663a5e0f6920c4554c99 of LongCLIP-B is "Upload longclip-B.pt",
#   revision a29856989d49817508dbda0fb95c7f6ffc314331 of LongCLIP-L "Upload longclip-L.pt" (which
#   replaced the first upload 92e2948 after the authors' DDP fix); the SHA-256s are those files' Git
#   LFS pointers as shown on huggingface.co. The same values (and the sizes) are the converter's
#   engine/backends/clip/convert.py PINNED, which `longlens models convert FILE` checks a copy
#   downloaded by hand against; a test keeps the two equal. A pull downloads the .pt, checks it
#   against its pin, and the clip backend's convert_checkpoint turns it into a CLIPModel folder
#   (model.safetensors, CLIP's tokenizer, preprocessor_config.json) before it is installed.

_CLIP_SMALL_FILES = (
    "config.json",
    "preprocessor_config.json",
    "special_tokens_map.json",
    "tokenizer_config.json",
    "vocab.json",
    "merges.txt",
)

_register(
    ModelSpec(
        name="clip-vit-base-patch16",
        backend="clip",
        description="OpenAI CLIP ViT-B/16 (224 px, 77 text tokens, about 600 MB).",
        repo_id="openai/clip-vit-base-patch16",
        revision="57c216476eefef5ab752ec549e440a49ae4ae5f3",
        files={
            **{f: None for f in _CLIP_SMALL_FILES},
            "tokenizer.json": None,
            "pytorch_model.bin": "ec89c7b09c749a60aae3c9cd910516f24b58214a7df060b48962d14c469cfbf0",
        },
        dim=512,
        image_size=224,
        default_text_tokens=77,
        license="MIT (OpenAI CLIP)",
        notes="Weights pinned by SHA-256; the config and tokenizer files are not pinned yet, so a pull asks to trust them.",
    )
)

_register(
    ModelSpec(
        name="clip-vit-large-patch14-336",
        backend="clip",
        description="OpenAI CLIP ViT-L/14 at 336 px (77 text tokens, about 1.7 GB).",
        repo_id="openai/clip-vit-large-patch14-336",
        revision="a2ab452d41e630fda015a7ad3e9751aa74081239",
        files={
            **{f: None for f in _CLIP_SMALL_FILES},
            "pytorch_model.bin": "c6032c2e0caae3dc2d4fba35535fa6307dbb49df59c7e182b1bc4b3329b81801",
        },
        dim=768,
        image_size=336,
        default_text_tokens=77,
        license="MIT (OpenAI CLIP)",
        notes="Weights pinned by SHA-256; the config and tokenizer files are not pinned yet, so a pull asks to trust them.",
    )
)

@dataclass(frozen=True)
class PinnedCheckpoint:
    """One official OpenAI-layout checkpoint file, pinned (converted at pull or by `models convert`)."""

    repo_id: str
    revision: str
    filename: str
    sha256: str
    size: int


#: The Long-CLIP checkpoints (one table: the pulls below and engine/backends/clip/convert.py).
OPENAI_LAYOUT_CHECKPOINTS: dict[str, PinnedCheckpoint] = {
    "longclip-b": PinnedCheckpoint("BeichenZhang/LongCLIP-B", "5ec98ddcf52692ea2e5a663a5e0f6920c4554c99",
                                   "longclip-B.pt", "ca2face3716d60473a4e284e5be2cf0a1f3a4ad9954a6a651d878e814cc0c894",
                                   599_433_439),
    "longclip-l": PinnedCheckpoint("BeichenZhang/LongCLIP-L", "a29856989d49817508dbda0fb95c7f6ffc314331",
                                   "longclip-L.pt", "9d2c12ffcbf9099f95bfb9cf8f08f949b695e22fb0018e8895e088f4a88b6afd",
                                   1_711_923_133),
}

for _name, _what, _size, _dim, _card in (
    ("longclip-b", "Long-CLIP B/16: CLIP ViT-B/16 fine-tuned for paragraphs (248 text tokens, about 600 MB).",
     "B", 512, "BeichenZhang/LongCLIP-B"),
    ("longclip-l", "Long-CLIP L/14: CLIP ViT-L/14 fine-tuned for paragraphs (224 px, 248 text tokens, about 1.7 GB).",
     "L", 768, "BeichenZhang/LongCLIP-L"),
):
    _pin = OPENAI_LAYOUT_CHECKPOINTS[_name]
    _register(
        ModelSpec(
            name=_name,
            backend="clip",
            description=f"{_what} Pulled as the official {_pin.filename} and converted once to safetensors.",
            repo_id=_pin.repo_id,
            revision=_pin.revision,
            files={_pin.filename: sha256_pin(_pin.sha256)},
            dim=_dim,
            image_size=224,
            default_text_tokens=248,
            license=f"Apache-2.0 ({_card}; fine-tuned from OpenAI CLIP, MIT)",
            notes="The official OpenAI-layout .pt, pinned by SHA-256, converted at pull by "
            "engine/backends/clip/convert.py (unpickled with weights_only only after the pin matched); the .pt is "
            "not kept.",
        )
    )


# --- Names and lookup ------------------------------------------------------------------------


def registered_specs() -> list[ModelSpec]:
    return list(_REGISTRY.values())


def known_model_names() -> list[str]:
    return list(_REGISTRY)


def get_spec(name: str) -> ModelSpec:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ModelError(f"unknown model {name!r}; known models: {', '.join(_REGISTRY)}") from None


# Points Longlens at a resources/ folder of the packager's choice (a distro's /usr/share/longlens,
# a test's stand-in); when set, no other place is looked at.
RESOURCES_ENV = "LONGLENS_RESOURCES"


def resource_roots() -> list[Path]:
    """The resources/ folders Longlens may be running from, most specific first.

    A frozen app (PyInstaller) unpacks its data next to the code under sys._MEIPASS; a source
    checkout or editable install has resources/ at the repository root; an installed wheel
    carries it as data files under PREFIX/share/longlens/resources (see pyproject).
    """
    explicit = os.environ.get(RESOURCES_ENV)
    if explicit:
        return [Path(explicit).expanduser()]
    roots: list[Path] = []
    frozen_root = getattr(sys, "_MEIPASS", None)
    if frozen_root:
        roots.append(Path(frozen_root) / "resources")
    roots.append(Path(__file__).resolve().parents[2] / "resources")
    roots.append(Path(sys.prefix) / "share" / "longlens" / "resources")
    return roots


def find_resource(rel: str) -> Path:
    """`rel` (e.g. "models/sceneworld-mini") under the first resources/ folder that has it.

    When none has it, the path under the most specific folder is returned, so error messages
    name the place this build expects it.
    """
    roots = resource_roots()
    for root in roots:
        candidate = root / rel
        if candidate.exists():
            return candidate
    return roots[0] / rel


def bundled_model_dir(name: str) -> Path:
    """Where a bundled model's files live (resources/models/NAME in whichever layout is running)."""
    return find_resource(f"models/{name}")


def how_to_get(name: str) -> str:
    """The sentence every 'model missing' message ends with."""
    demo = (
        f" The bundled demo model ({BUNDLED_MODEL}) needs no download and works offline."
        if name != BUNDLED_MODEL
        else ""
    )
    pull = f"`longlens models pull {name}`, or " if name in _REGISTRY and _REGISTRY[name].repo_id else ""
    return f"Get it with {pull}`longlens models import DIR --name {name}` from a local copy.{demo}"


# --- Hashing and manifests -------------------------------------------------------------------


def read_manifest(model_dir: Path) -> dict[str, Any]:
    """Parse and sanity-check a manifest; ModelIntegrityError if it is missing or malformed, or
    names a backend this build does not know."""
    data = read_manifest_file(model_dir)
    if data.get("backend") not in backend_names():
        raise ModelIntegrityError(f"{model_dir / MANIFEST_NAME} names an unknown backend {data.get('backend')!r}")
    return data


def installed_model_dir(name: str, paths: Paths) -> Path | None:
    """The folder of an installed model (one with a manifest), or None."""
    check_model_name(name)
    spec = _REGISTRY.get(name)
    if spec is not None and spec.bundled:
        d = bundled_model_dir(name)
        return d if (d / MANIFEST_NAME).is_file() else None
    d = paths.models / name
    return d if (d / MANIFEST_NAME).is_file() else None


# --- Identity ---------------------------------------------------------------------------------
#
# Vectors, indexes and shards must be keyed by what computed them, never by the folder name: a model
# re-imported under the same name with other weights would otherwise serve the old vectors.
# Only image-side files decide an image vector: top-level weights and configs. Tokenizer files and
# text towers (a model's own text_tower/, or an override) change only text vectors, so they are in
# the text identity alone, and replacing a text tower never re-embeds a library.

_TEXT_SIDE_FILES = frozenset(
    {"vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
     "generation_config.json", "vocab.json", "merges.txt"}
)
_DOC_PREFIXES = ("README", "LICENSE")
IDENTITY_SEPARATOR = "@"


@dataclass(frozen=True)
class ModelIdentity:
    """What computed a model's vectors, as 'NAME@<16 hex>' strings (names never contain '@')."""

    name: str
    image: str  # keys image vectors in the catalog, ANN index files and cluster shards
    text: str  # keys text-side derived data (text caches, calibrations); includes any text tower


def _is_image_side(rel: str) -> bool:
    return "/" not in rel and rel not in _TEXT_SIDE_FILES and not rel.startswith(_DOC_PREFIXES)


def _digest(parts: Mapping[str, str]) -> str:
    import hashlib

    blob = json.dumps(sorted(parts.items()), separators=(",", ":")).encode("utf-8")
    return hashlib.sha256(blob).hexdigest()[:16]


def model_identity(name: str, manifest: Mapping[str, Any], text_tower_dir: Path | None = None) -> ModelIdentity:
    """The identity of an installed model from its manifest's file hashes (nothing is re-hashed but
    an override text tower, which has no manifest)."""
    files: Mapping[str, Mapping[str, Any]] = manifest["files"]
    backend = str(manifest.get("backend"))
    image_parts = {rel: e["sha256"] for rel, e in files.items() if _is_image_side(rel)}
    image = f"{name}{IDENTITY_SEPARATOR}{_digest({'backend': backend, **image_parts})}"
    # The towers bundled beside the model's own (text-towers/) are not its text side until chosen.
    text_parts = {rel: e["sha256"] for rel, e in files.items() if not rel.startswith(TEXT_TOWERS_DIR + "/")}
    if text_tower_dir is not None:
        tower = Path(text_tower_dir)
        # Every file, nested ones too (a language-model tower keeps its tokenizer in tokenizer/);
        # a top-level file keeps the key it always had, so flat towers keep their identity.
        for p in sorted(tower.rglob("*")) if tower.is_dir() else ():
            if p.is_file() and p.name not in IGNORED_JUNK:
                text_parts[f"override-tower/{p.relative_to(tower).as_posix()}"] = sha256_file(p)
    text = f"{name}{IDENTITY_SEPARATOR}{_digest({'backend': backend, **text_parts})}"
    return ModelIdentity(name, image, text)


def installed_identity(name: str, paths: Paths) -> ModelIdentity:
    """The identity of the model installed as `name` (its manifest is read, no file is hashed)."""
    model_dir = installed_model_dir(name, paths)
    if model_dir is None:
        raise ModelNotInstalledError(f"model {name!r} is not installed. {how_to_get(name)}")
    return model_identity(name, read_manifest(model_dir))


def identity_name(identity: str) -> str:
    """The model name an identity string belongs to (a key from before identities is a bare name)."""
    return identity.split(IDENTITY_SEPARATOR, 1)[0]


# --- Verification ----------------------------------------------------------------------------

FileStatus = Literal["ok", "missing", "mismatch", "unexpected"]


@dataclass(frozen=True)
class FileCheck:
    filename: str  # relative to the model folder, '/'-separated
    status: FileStatus
    expected_sha256: str | None = None
    actual_sha256: str | None = None
    expected_size: int | None = None
    actual_size: int | None = None

    def describe(self) -> str:
        if self.status == "ok":
            return f"{self.filename}: ok"
        if self.status == "missing":
            return f"{self.filename}: missing"
        if self.status == "unexpected":
            return f"{self.filename}: unexpected file (not in the manifest)"
        if self.expected_size != self.actual_size:
            return f"{self.filename}: size mismatch (expected {self.expected_size} bytes, found {self.actual_size})"
        return f"{self.filename}: hash mismatch (expected {self.expected_sha256}, found {self.actual_sha256})"


@dataclass(frozen=True)
class VerifyReport:
    name: str
    location: Path
    files: tuple[FileCheck, ...] = ()
    problems: tuple[str, ...] = field(default=())  # manifest-level problems

    @property
    def ok(self) -> bool:
        return not self.problems and all(c.status == "ok" for c in self.files)

    @property
    def failures(self) -> list[FileCheck]:
        return [c for c in self.files if c.status != "ok"]

    def summary(self) -> str:
        if self.ok:
            return f"{self.name}: {len(self.files)} files verified"
        lines = list(self.problems) + [c.describe() for c in self.failures]
        return f"{self.name}: verification failed: " + "; ".join(lines)


def verify_dir(model_dir: Path, name: str | None = None) -> VerifyReport:
    """Check every file in `model_dir` against its manifest; unlisted files fail too."""
    label = name or model_dir.name
    try:
        manifest = read_manifest(model_dir)
    except ModelIntegrityError as e:
        return VerifyReport(label, model_dir, (), (str(e),))
    problems: list[str] = []
    if name is not None and manifest["name"] != name:
        problems.append(f"manifest is for {manifest['name']!r}, not {name!r}")
    checks: list[FileCheck] = []
    listed: dict[str, dict[str, Any]] = manifest["files"]
    for rel, entry in sorted(listed.items()):
        p = model_dir.joinpath(*rel.split("/"))
        # A symlink could point anywhere; an installed model is made of plain files only.
        if p.is_symlink() or not p.is_file():
            checks.append(FileCheck(rel, "missing", entry["sha256"], None, entry["size"], None))
            continue
        size = p.stat().st_size
        if size != entry["size"]:
            # Size differs: no need to read the whole file to know it is wrong.
            checks.append(FileCheck(rel, "mismatch", entry["sha256"], None, entry["size"], size))
            continue
        actual = _sha256_unless_unchanged(p)
        status: FileStatus = "ok" if actual == entry["sha256"] else "mismatch"
        checks.append(FileCheck(rel, status, entry["sha256"], actual, entry["size"], size))
    for rel in _walk_files(model_dir):
        if rel != MANIFEST_NAME and rel not in listed and rel.rsplit("/", 1)[-1] not in IGNORED_JUNK:
            checks.append(FileCheck(rel, "unexpected"))
    return VerifyReport(label, model_dir, tuple(checks), tuple(problems))


# sha256 of files this process has hashed, by (path, size, mtime, inode, device): a model loaded
# again (each search in the app, each test) is not read again unless one of those changed.
_HASHED: dict[tuple[str, int, int, int, int], str] = {}


def _sha256_unless_unchanged(p: Path) -> str:
    st = p.stat()
    key = (str(p.resolve()), st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev)
    digest = _HASHED.get(key)
    if digest is None:
        digest = _HASHED[key] = sha256_file(p)
    return digest


def _walk_files(root: Path) -> list[str]:
    out: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root)
        for fn in filenames + [d for d in dirnames if (Path(dirpath) / d).is_symlink()]:
            out.append((rel_dir / fn).as_posix())
    return sorted(out)


def verify_model(name: str, paths: Paths) -> VerifyReport:
    """Hash every file of an installed model against its manifest."""
    model_dir = installed_model_dir(name, paths)
    if model_dir is None:
        raise ModelNotInstalledError(f"model {name!r} is not installed. {how_to_get(name)}")
    return verify_dir(model_dir, name)


# --- Listing ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelStatus:
    name: str
    backend: str
    installed: bool
    location: Path | None
    description: str
    registered: bool  # False for a model imported under a name Longlens does not know
    bundled: bool = False
    source: str | None = None  # "pull" | "import" (from the manifest)
    size_bytes: int | None = None
    verified: bool | None = None  # None: not checked (listing does not hash unless asked)
    installed_at: str | None = None
    problem: str | None = None  # why an installed model cannot be used
    unpinned: tuple[str, ...] = ()  # files a pull of it installs only when trusted (no pin known)
    text_towers: tuple[str, ...] = ()  # names of the query readers bundled in it (text-towers/NAME)


def list_models(paths: Paths, *, verify: bool = False) -> list[ModelStatus]:
    """Registered models (installed or not), then models imported under other names."""
    from engine.models.install_state import recover_models_folder

    recover_models_folder(paths)  # an install killed last time: restore or clean up first
    out: list[ModelStatus] = []
    seen: set[str] = set()
    for spec in _REGISTRY.values():
        seen.add(spec.name)
        out.append(_status(spec.name, paths, spec, verify))
    if paths.models.is_dir():
        for d in sorted(paths.models.iterdir()):
            # Dot-folders are staging/trash areas of installs in progress.
            if d.name.startswith(".") or d.name in seen or not d.is_dir():
                continue
            if not _NAME_RE.fullmatch(d.name) or not (d / MANIFEST_NAME).is_file():
                continue
            out.append(_status(d.name, paths, None, verify))
    return out


def _status(name: str, paths: Paths, spec: ModelSpec | None, verify: bool) -> ModelStatus:
    model_dir = installed_model_dir(name, paths)
    description = spec.description if spec else ""
    backend = spec.backend if spec else "?"
    unpinned = tuple(spec.unpinned_files) if spec is not None and spec.repo_id else ()
    if model_dir is None:
        return ModelStatus(
            name, backend, False, None, description, spec is not None, bool(spec and spec.bundled),
            unpinned=unpinned,
        )
    problem = None
    try:
        manifest = read_manifest(model_dir)
        backend = manifest["backend"]
        size = sum(e["size"] for e in manifest["files"].values())
        source, installed_at = manifest.get("source"), manifest.get("installed_at")
        if not description:
            description = manifest.get("description") or f"imported {backend} model"
    except ModelIntegrityError as e:
        size, source, installed_at, problem = None, None, None, str(e)
    verified = None
    if verify:
        report = verify_dir(model_dir, name)
        verified = report.ok
        if not report.ok:
            problem = report.summary()
    return ModelStatus(
        name,
        backend,
        True,
        model_dir,
        description,
        spec is not None,
        bool(spec and spec.bundled),
        source,
        size,
        verified,
        installed_at,
        problem,
        unpinned,
        tuple(bundled_text_towers(model_dir)),
    )


# --- Loading ---------------------------------------------------------------------------------


def load_embedder(
    name: str,
    paths: Paths,
    *,
    device: str = "auto",
    text_tower_dir: Path | None = None,
    verify: bool = True,
) -> Embedder:
    """Construct the Embedder of an installed model, after checking its files (unless verify=False)."""
    check_model_name(name)
    spec = _REGISTRY.get(name)
    if spec is not None and spec.bundled and installed_model_dir(name, paths) is None:
        raise ModelNotInstalledError(
            f"the demo model {name!r} is not included in this build (no {MANIFEST_NAME} in "
            f"{bundled_model_dir(name)}). Use a BLIP model instead: `longlens models pull "
            "blip-itm-base-coco`, or `longlens models import DIR --name NAME` from a local copy."
        )
    model_dir = installed_model_dir(name, paths)
    if model_dir is None:
        known = f" Known models: {', '.join(_REGISTRY)}." if spec is None else ""
        raise ModelNotInstalledError(f"model {name!r} is not installed. {how_to_get(name)}{known}")
    manifest = read_manifest(model_dir)
    if verify:
        report = verify_dir(model_dir, name)
        if not report.ok:
            fix = f"re-import it (`longlens models import DIR --name {name} --replace`)" + (
                f" or re-pull it (`longlens models pull {name}`)" if spec is not None and spec.repo_id else ""
            )
            raise ModelIntegrityError(f"{report.summary()}. The model files were changed or damaged; {fix}.")
    # A bare name picks a tower bundled with the model (text-towers/NAME/); a path, any folder.
    text_tower_dir = resolve_text_tower(text_tower_dir, model_dir, name)
    # Files read whole (configs, tokenizers) within their size and nesting limits before any is read:
    # a model installed before the limits, or a tower given as a folder, was never checked.
    check_model_files(model_dir)
    check_model_files(text_tower_dir)
    identity = model_identity(name, manifest, text_tower_dir)
    if text_tower_dir is not None:
        check_trained_for(text_tower_dir, identity.image, name)
    backend = get_backend(manifest["backend"])
    # An LM text tower (lm_tower.json) reads the texts in place of the backend's own text tower.
    lm = is_lm_tower_folder(text_tower_dir)
    emb = backend.load_embedder(
        model_dir, device=device, text_tower_dir=None if lm else text_tower_dir, model_id=name,
        identity=identity.image, text_identity=identity.text,
        default_text_tokens=spec.default_text_tokens if spec is not None else None, installed=True,
    )
    return with_text_tower(emb, text_tower_dir, text_identity=identity.text)
