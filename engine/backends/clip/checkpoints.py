"""CLIP-family configs, the CLIP tokenizer, and random-weight checkpoints in Hugging Face layout.

The tokenizer is rebuilt offline from OpenAI's own BPE file (resources/tokenizers/clip/
bpe_simple_vocab_16e6.txt.gz, MIT, shipped with its licence) exactly as OpenAI's
simple_tokenizer.py builds its vocabulary: 256 byte symbols, the same 256 with "</w>", 48,894
merges, then <|startoftext|> (49406) and <|endoftext|> (49407). transformers' CLIPTokenizer over
that vocabulary is the tokenizer of every openai/clip-* repository; Long-CLIP uses the same one with
a 248-token context. The converter (convert.py) writes it into converted Long-CLIP folders, whose
official checkpoints ship no tokenizer.

Architectures (ARCHS) are the published ones: OpenAI CLIP ViT-B/16 and ViT-L/14 at 336 px
(77 text positions), Long-CLIP B (ViT-B/16) and L (ViT-L/14, 224 px) with 248 positions. "tiny"
variants keep each architecture's shape rules (vocabulary, context length, pooling, pre-norm,
quick-GELU, heads of 64 channels where the width allows) at a few layers of small width.

torch and transformers are imported inside the functions: importing this module stays cheap.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.errors import ModelError

if TYPE_CHECKING:
    from transformers import CLIPConfig, CLIPModel, CLIPTokenizer

CLIP_VOCAB_SIZE = 49408
CLIP_BOS_ID = 49406
CLIP_EOS_ID = 49407
CLIP_BOS = "<|startoftext|>"
CLIP_EOS = "<|endoftext|>"
OPENAI_CONTEXT = 77
LONGCLIP_CONTEXT = 248
# Long-CLIP's knowledge-preserved stretching keeps the first 20 positions of CLIP's table as
# trained and interpolates the other 57 four times (model/longclip.py, load_from_clip).
LONGCLIP_KEPT_POSITIONS = 20
LONGCLIP_STRETCH = 4

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

BPE_RESOURCE = "tokenizers/clip/bpe_simple_vocab_16e6.txt.gz"
# The number of merges OpenAI's simple_tokenizer reads from the file (lines 1 .. 48,894).
_N_MERGES = 49152 - 256 - 2


@dataclass(frozen=True)
class ClipArch:
    """What fixes a CLIP-family model's tensor shapes (OpenAI's names in brackets)."""

    image_size: int  # [input_resolution]
    patch_size: int
    vision_width: int
    vision_layers: int
    text_width: int  # [transformer_width]
    text_layers: int
    embed_dim: int  # the shared embedding [text_projection.shape[1]]
    context_length: int  # text positions
    vocab_size: int = CLIP_VOCAB_SIZE
    head_width: int = 64  # OpenAI's heads = width // 64
    # transformers' pooling rule: 2 means the legacy "argmax of the ids" (OpenAI's own rule, and
    # what the openai/clip-* configs say); 49407 the first <|endoftext|>. Equal for this tokenizer.
    eos_token_id: int = CLIP_EOS_ID


ARCHS: dict[str, ClipArch] = {
    "clip-b16": ClipArch(224, 16, 768, 12, 512, 12, 512, OPENAI_CONTEXT, eos_token_id=2),
    "clip-l14-336": ClipArch(336, 14, 1024, 24, 768, 12, 768, OPENAI_CONTEXT, eos_token_id=2),
    "longclip-b": ClipArch(224, 16, 768, 12, 512, 12, 512, LONGCLIP_CONTEXT),
    "longclip-l": ClipArch(224, 14, 1024, 24, 768, 12, 768, LONGCLIP_CONTEXT),
}
# Tiny variants for tests: the same vocabulary, context, pooling rule, patch size and layout.
TINY: dict[str, ClipArch] = {
    name: ClipArch(image_size=4 * a.patch_size, patch_size=a.patch_size, vision_width=64, vision_layers=2,
                   text_width=64, text_layers=2, embed_dim=32, context_length=a.context_length,
                   head_width=16, eos_token_id=a.eos_token_id)
    for name, a in ARCHS.items()
}
SIZES = ("tiny", "real")


def arch(name: str, size: str = "real") -> ClipArch:
    table = {"real": ARCHS, "tiny": TINY}.get(size)
    if table is None or name not in table:
        raise ValueError(f"unknown CLIP architecture {name!r} ({size}); known: {', '.join(ARCHS)} in sizes {SIZES}")
    return table[name]


def clip_config(a: ClipArch) -> CLIPConfig:
    """The transformers CLIPConfig of an architecture (OpenAI's hyper-parameters: quick-GELU,
    LayerNorm eps 1e-5, MLP 4x wide)."""
    from transformers import CLIPConfig

    if a.vision_width % a.head_width or a.text_width % a.head_width:
        raise ModelError(f"widths {a.vision_width}/{a.text_width} are not multiples of the head width {a.head_width}")
    text = {
        "vocab_size": a.vocab_size, "hidden_size": a.text_width, "intermediate_size": 4 * a.text_width,
        "num_hidden_layers": a.text_layers, "num_attention_heads": a.text_width // a.head_width,
        "max_position_embeddings": a.context_length, "hidden_act": "quick_gelu", "layer_norm_eps": 1e-5,
        "projection_dim": a.embed_dim, "bos_token_id": 0 if a.eos_token_id == 2 else CLIP_BOS_ID,
        "eos_token_id": a.eos_token_id, "pad_token_id": 1,
    }
    vision = {
        "hidden_size": a.vision_width, "intermediate_size": 4 * a.vision_width,
        "num_hidden_layers": a.vision_layers, "num_attention_heads": a.vision_width // a.head_width,
        "image_size": a.image_size, "patch_size": a.patch_size, "hidden_act": "quick_gelu",
        "layer_norm_eps": 1e-5, "projection_dim": a.embed_dim,
    }
    return CLIPConfig(text_config=text, vision_config=vision, projection_dim=a.embed_dim,
                      logit_scale_init_value=2.6592, architectures=["CLIPModel"])


# ------------------------------------------------------------------------------- tokenizer


def bpe_file() -> Path:
    """OpenAI's BPE merges file, shipped in resources/ (with OpenAI's MIT licence beside it)."""
    from engine.models.registry import find_resource

    path = find_resource(BPE_RESOURCE)
    if not path.is_file():
        raise ModelError(f"the CLIP tokenizer's BPE file is missing from this build ({path})")
    return path


def bytes_to_unicode() -> dict[int, str]:
    """OpenAI's (and GPT-2's) reversible byte -> printable character table."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs], strict=True))


@lru_cache(maxsize=2)
def clip_vocab_and_merges(path: Path | None = None) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """The 49,408-entry vocabulary and the merges, built as OpenAI's SimpleTokenizer builds them."""
    from engine.fileutil import read_user_file

    raw = read_user_file(path or bpe_file(), max_bytes=8 * 1024 * 1024)
    lines = gzip.decompress(raw).decode("utf-8").split("\n")
    merges = [tuple(line.split()) for line in lines[1 : _N_MERGES + 1]]
    if len(merges) != _N_MERGES or any(len(m) != 2 for m in merges):
        raise ModelError(f"{path or bpe_file()} is not CLIP's BPE file ({len(merges)} merges read)")
    symbols = list(bytes_to_unicode().values())
    vocab_list = symbols + [s + "</w>" for s in symbols] + ["".join(m) for m in merges] + [CLIP_BOS, CLIP_EOS]
    vocab = {tok: i for i, tok in enumerate(vocab_list)}
    if len(vocab) != CLIP_VOCAB_SIZE:
        raise ModelError(f"the CLIP vocabulary built from the BPE file has {len(vocab)} entries, not {CLIP_VOCAB_SIZE}")
    return vocab, [(a, b) for a, b in merges]


def build_clip_tokenizer(model_max_length: int = OPENAI_CONTEXT) -> CLIPTokenizer:
    """transformers' CLIPTokenizer over OpenAI's vocabulary; pads with <|endoftext|> as the
    openai/clip-* repositories do."""
    from transformers import CLIPTokenizer

    vocab, merges = clip_vocab_and_merges()
    tok = CLIPTokenizer(vocab=dict(vocab), merges=list(merges), model_max_length=int(model_max_length))
    ids = tok.convert_tokens_to_ids([CLIP_BOS, CLIP_EOS])
    if ids != [CLIP_BOS_ID, CLIP_EOS_ID] or len(tok) != CLIP_VOCAB_SIZE:
        raise ModelError(f"unexpected CLIP tokenizer layout: special ids {ids}, {len(tok)} entries")
    return tok


def save_clip_tokenizer(out_dir: Path, model_max_length: int) -> None:
    """tokenizer.json, tokenizer_config.json, vocab.json, merges.txt and special_tokens_map.json."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok = build_clip_tokenizer(model_max_length)
    tok.save_pretrained(str(out_dir))
    vocab, merges = clip_vocab_and_merges()
    (out_dir / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False) + "\n", encoding="utf-8")
    (out_dir / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges), encoding="utf-8")
    special = {"bos_token": CLIP_BOS, "eos_token": CLIP_EOS, "pad_token": CLIP_EOS, "unk_token": CLIP_EOS}
    (out_dir / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n", encoding="utf-8")


def preprocessor_config(image_size: int) -> dict[str, Any]:
    """The preprocessor_config.json of the openai/clip-* repositories (shortest side to the
    model's size, bicubic, centre crop, OpenAI's mean and std)."""
    return {
        "crop_size": {"height": image_size, "width": image_size},
        "do_center_crop": True, "do_convert_rgb": True, "do_normalize": True, "do_rescale": True,
        "do_resize": True, "image_mean": list(OPENAI_CLIP_MEAN), "image_std": list(OPENAI_CLIP_STD),
        "image_processor_type": "CLIPImageProcessor", "resample": 3, "rescale_factor": 1 / 255,
        "size": {"shortest_edge": image_size},
    }


def save_folder_extras(out_dir: Path, image_size: int, context_length: int) -> None:
    """Everything of a CLIP folder but config.json and the weights."""
    save_clip_tokenizer(out_dir, context_length)
    (Path(out_dir) / "preprocessor_config.json").write_text(
        json.dumps(preprocessor_config(image_size), indent=2) + "\n", encoding="utf-8")


# ------------------------------------------------------------------------------- random weights


def reinitialise(model: Any, seed: int, std: float) -> None:
    """Every parameter from a seeded generator: weights ~ N(0, std), LayerNorm scales 1 + N(0, std)
    (so activations keep their size; transformers' own init would do too, but is not seeded per
    call and is less spread out at tiny widths)."""
    import torch

    gen = torch.Generator().manual_seed(int(seed))
    norms = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.LayerNorm)}
    with torch.no_grad():
        for _, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=gen, dtype=torch.float32) * std
            if id(param) in norms:
                noise += 1.0
            param.copy_(noise.to(param.dtype))


def random_clip_model(a: ClipArch, seed: int = 0, std: float | None = None) -> CLIPModel:
    import torch
    from transformers import CLIPModel

    with torch.random.fork_rng(devices=[]):
        model = CLIPModel(clip_config(a))
    model.eval()
    reinitialise(model, seed, (0.2 if a.text_width <= 128 else 0.02) if std is None else float(std))
    with torch.no_grad():
        model.logit_scale.fill_(2.6592)
    return model


def save_random_clip_checkpoint(out_dir: Path, name: str = "longclip-b", size: str = "tiny", seed: int = 0,
                                std: float | None = None) -> Path:
    """A CLIPModel with seeded random weights as a Hugging Face folder: config.json,
    model.safetensors, the tokenizer files (model_max_length = the context) and
    preprocessor_config.json. The same arguments always give the same files."""
    from transformers.utils import logging as hf_logging

    a = arch(name, size)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model = random_clip_model(a, seed, std)
    hf_logging.disable_progress_bar()
    model.save_pretrained(str(out_dir))
    del model
    save_folder_extras(out_dir, a.image_size, a.context_length)
    return out_dir


def stretch_positions(table: Any, keep: int = LONGCLIP_KEPT_POSITIONS, ratio: int = LONGCLIP_STRETCH) -> Any:
    """Long-CLIP's knowledge-preserved stretching of a (77, width) text position table to
    (4 * 77 - 3 * 20 = 248, width): rows < keep copied, every later gap interpolated `ratio` times,
    the last row extrapolated (model/longclip.py, load_from_clip)."""
    import torch

    length, width = table.shape
    out = torch.zeros(ratio * length - (ratio - 1) * keep, width, dtype=table.dtype)
    out[:keep] = table[:keep]
    for i in range(length - 1 - keep):
        for j in range(ratio):
            out[ratio * i + j + keep] = ((ratio - j) * table[i + keep] + j * table[i + 1 + keep]) / ratio
    last, step = table[length - 1], table[length - 1] - table[length - 2]
    for j in range(ratio):
        out[ratio * length - (ratio - 1) * keep - ratio + j] = last + j * step / ratio
    return out
