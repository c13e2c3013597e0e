"""The CLIP-family backend: transformers' CLIPModel folders (OpenAI CLIP ViT-B/16 and ViT-L/14-336,
77 text tokens; Long-CLIP B and L, 248 tokens, converted once from their official OpenAI-layout
.pt files by engine/backends/clip/convert.py, at pull or by `models convert`). Embedder, grounder
(engine/backends/clip/grounder.py: value-path or Grad-CAM patch maps, supports uncalibrated until
`longlens grounding calibrate` fits them), text-tower overrides (engine/backends/clip/text_tower.py) and a training adapter (engine/backends/clip/
training.py: CLIP's own text tower trained with C1-C10 on the frozen vision tower; LM text towers
train on the same frozen image embeddings through engine/training/lm_tower_adapter.py). Cheap to
import; torch and transformers load inside the hooks.

What this backend refuses, and why:

* Models that need transformers' trust_remote_code (FG-CLIP 2, jina-clip-v2, LLM2CLIP, any
  config.json with an auto_map): loading them executes Python files from the model's repository,
  the same risk as unpickling a .bin, so they are refused by the same rule that refuses pickles.
* SigLIP / SigLIP 2 (model_type siglip, siglip2) are not CLIP and are not run as CLIP: their score
  is a sigmoid of a scaled, biased cosine (rankings equal cosine rankings, so search would work),
  but the text tower must be fed padded to 64 tokens without a mask, the tokenizer is Gemma's
  256k-entry SentencePiece model (no offline copy to build parity tests on), and SigLIP 2's NaFlex
  checkpoints take variable-size patch sequences with a pixel mask, which the fixed (N, 3, S, S)
  preprocess interface does not carry. A separate backend is the clean way; not done yet.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.errors import ModelError
from engine.models.backend import ModelBackend, deferred
from engine.models.tokenizers import OPENAI_CLIP_CLEANING

NAME = "clip"


def _detect(folder: Path) -> bool:
    from engine.backends.clip.shapes import read_config

    if not (Path(folder) / "config.json").is_file():
        return False
    try:
        return read_config(Path(folder)).get("model_type") == "clip"
    except ModelError:
        return False


def _load_embedder(model_dir: Path, **options: Any) -> Any:
    """engine/models/hf_dual_encoder.py's load_folder_embedder, as BLIP's."""
    try:
        from engine.backends.clip.embedder import ClipEmbedder
    except ImportError as e:
        raise ModelError(f"the CLIP backend is not available in this build: {e}") from e
    from engine.models.hf_dual_encoder import load_folder_embedder

    return load_folder_embedder(ClipEmbedder, model_dir, **options)


def _import_config_check(cfg: dict[str, Any]) -> None:
    from engine.backends.clip.shapes import check_clip_config_dict

    check_clip_config_dict(cfg)


def _import_weights_check(folder: Path, weight_files: list[str]) -> None:
    from engine.backends.clip.shapes import check_clip_config_fits_weights

    check_clip_config_fits_weights(folder, weight_files=weight_files)


BACKEND = ModelBackend(
    name=NAME,
    folder_description="a CLIP folder (config.json with model_type 'clip')",
    detect=_detect,
    load_embedder=_load_embedder,
    make_grounder=deferred("engine.backends.clip.grounder", "make_grounder"),
    detect_order=80,  # before BLIP, which takes any config.json
    importable=True,
    import_config_check=_import_config_check,
    import_weights_check=_import_weights_check,
    make_training_adapter=deferred("engine.backends.clip.training", "make_adapter"),
    embed_training_scenes=deferred("engine.backends.clip.training", "embed_training_scenes"),
    # Long-CLIP's official weights: OpenAI-layout .pt state dicts, converted once at pull.
    convert_checkpoint=deferred("engine.backends.clip.convert", "convert_openai_checkpoint"),
    checkpoint_suffixes=frozenset({".pt"}),
    # OpenAI CLIP and Long-CLIP were trained on texts their simple_tokenizer.py cleaned first (ftfy,
    # HTML unescaped twice, whitespace); transformers' CLIPTokenizer does not clean so.
    text_cleaning=OPENAI_CLIP_CLEANING,
)
