"""The backend interface: what a model backend (a folder under engine/models/) offers Longlens.

Each backend package (engine/backends/blip/, engine/backends/sceneworld_mini/, or one a test defines)
exports one `ModelBackend` object; engine/models/registry.py keeps the table name -> backend and is
the one place that picks a backend, by the "backend" string of a model's manifest, by an
embedder's `backend` attribute, or (folders without a manifest) by `detect`.

Only `name`, `detect` and `load_embedder` are required (and `text_cleaning` is declared by every
backend that ships: engine/models/tokenizers.py's TextCleaning says what the model's own code did to
a text before its tokenizer, and the backend's embedders apply it); a backend without a grounder, re-ranker or
training adapter leaves those None and the app says "not available for this model". The hooks are
plain callables so a backend package can import its heavy modules (torch, transformers) inside
them: importing a backend package must stay cheap, because the registry imports it to read a
manifest's backend, long before any model is loaded.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.models.tokenizers import WORDPIECE_NORMALISER, TextCleaning

if TYPE_CHECKING:
    import numpy as np
    from PIL import Image

    from engine.grounding.api import Grounder
    from engine.models.base import Embedder


def deferred(module: str, name: str) -> Callable[..., Any]:
    """A hook that imports `module` on its first call and calls its `name`: a backend package fills
    its hooks with these so that importing the package imports neither torch nor transformers."""
    import importlib

    def hook(*args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module(module), name)(*args, **kwargs)

    hook.__name__ = hook.__qualname__ = f"{module}.{name}"
    return hook


@dataclass(frozen=True)
class ModelBackend:
    #: The manifest's "backend" string, and the `backend` attribute of this backend's embedders.
    name: str
    #: For messages about folders that are no model: "a BLIP folder (config.json)".
    folder_description: str
    #: Whether a model folder without a manifest (a training base, a study folder) is one of ours.
    detect: Callable[[Path], bool]
    #: load_embedder(model_dir, *, device, text_tower_dir, model_id, identity, text_identity,
    #:               default_text_tokens, installed) -> Embedder.
    #: installed=True: an installed model the app opens (identities from the registry); False: a
    #: plain folder (training bases, studies), opened with the backend's reference settings.
    load_embedder: Callable[..., Embedder]
    #: make_grounder(embedder, calibration, *, method=None, **options) -> Grounder; None: no grounding.
    make_grounder: Callable[..., Grounder] | None = None
    #: rerank_support(embedder) -> (available, reason when not); None: never re-ranks.
    rerank_support: Callable[[Any], tuple[bool, str]] | None = None
    #: rerank_scores(embedder, images, query, ann_scores, max_tokens=None) -> scores (higher first).
    rerank_scores: Callable[..., np.ndarray] | None = None
    #: make_training_adapter(folder, *, device, init_text_tower, model_id, amp) -> a
    #: DualEncoderAdapter (engine/training/trainer.py); None: this backend cannot be fine-tuned.
    make_training_adapter: Callable[..., Any] | None = None
    #: embed_training_scenes(folder, scenes, device) -> (N, D) frozen image embeddings of SceneWorld
    #: training scenes, rendered as this backend's training sees them (the study's training sets).
    embed_training_scenes: Callable[[Path, Sequence[Any], str], np.ndarray] | None = None
    #: Folders are detected in ascending order: backends with a specific marker file first.
    detect_order: int = 50
    #: Whether `longlens models import` installs folders of this backend.
    importable: bool = False
    #: The JSON file an importable folder must have (checked by import_config_check).
    config_file: str = "config.json"
    #: import_config_check(config_json: dict) raises ModelError when config.json is not this backend's.
    import_config_check: Callable[[dict[str, Any]], None] | None = None
    #: import_weights_check(folder, weight_files) raises when the config does not fit the weights.
    import_weights_check: Callable[[Path, list[str]], None] | None = None
    #: convert_checkpoint(path, out_dir, *, sha256, size, cancel) -> a job (Progress generator) that
    #: returns out_dir: a model folder of this backend (config.json, model.safetensors, tokenizer ...)
    #: written from a pickled checkpoint in the backend's own published format (not Hugging Face's),
    #: unpickled with weights_only=True only after the file matched `sha256` on the descriptor it is
    #: read from. out_dir must not exist. A registered model whose one file has a suffix in
    #: `checkpoint_suffixes` is pulled and then converted by it. None: no such format.
    convert_checkpoint: Callable[..., Any] | None = None
    checkpoint_suffixes: frozenset[str] = frozenset()
    #: What the model's own code did to every text before its tokenizer, in training: the
    #: backend's embedders apply it (once) to queries, token counts and training texts, and their
    #: `text_cleaning` is this object. The default, nothing beyond the tokenizer's normaliser, is
    #: a WordPiece tokenizer's; the CLIP family declares OpenAI's ftfy + HTML + whitespace cleaning.
    text_cleaning: TextCleaning = WORDPIECE_NORMALISER

    def check_rerank(self, embedder: Any) -> tuple[bool, str]:
        if self.rerank_support is None or self.rerank_scores is None:
            return False, f"re-ranking is not available for model {getattr(embedder, 'model_id', '?')!r}"
        return self.rerank_support(embedder)

    def score_candidates(self, embedder: Any, images: Sequence[Image.Image], query: str,
                         ann_scores: Sequence[float], max_tokens: int | None = None) -> np.ndarray:
        if self.rerank_scores is None:
            raise ValueError(f"the {self.name} backend cannot re-rank")
        return self.rerank_scores(embedder, images, query, ann_scores, max_tokens=max_tokens)
