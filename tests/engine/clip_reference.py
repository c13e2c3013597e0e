"""References for the CLIP backend's tests, transcribed from the official code, not from ours:

* OpenAIBPE: OpenAI's clip/simple_tokenizer.py (the tokenizer of CLIP and of Long-CLIP's
  model/simple_tokenizer.py), with clip.tokenize's / longclip.tokenize's truncation.
* OpenAICLIP: the ViT CLIP of OpenAI's clip/model.py (VisionTransformer, ResidualAttentionBlock with
  nn.MultiheadAttention, QuickGELU, causal text mask, pooling at the highest token id), and, with
  `longclip=True`, Long-CLIP's model/model_longclip.py encode_text (two 248-row position tables
  added through the fixed masks mask1 = rows < 20, mask2 = rows >= 20). It loads an OpenAI-layout
  state dict with strict=True, so its keys are exactly the official ones.
"""

from __future__ import annotations

import html
from collections import OrderedDict

import ftfy
import regex
import torch
from torch import nn

from engine.backends.clip.checkpoints import bytes_to_unicode, clip_vocab_and_merges


class OpenAIBPE:
    """OpenAI's simple_tokenizer.py (CLIP and Long-CLIP), transcribed: the reference the HF
    tokenizer is checked against, cleaning included (basic_clean: ftfy.fix_text, HTML unescaped
    twice, stripped; whitespace_clean: runs of \\s one space; then lower case)."""

    def __init__(self) -> None:
        vocab, merges = clip_vocab_and_merges()
        self.encoder, self.ranks = vocab, {m: i for i, m in enumerate(merges)}
        self.byte_encoder = bytes_to_unicode()
        self.pat = regex.compile(r"""<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+""",
                                 regex.IGNORECASE)

    def bpe(self, token: str) -> list[str]:
        word = tuple(token[:-1]) + (token[-1] + "</w>",)
        while len(word) > 1:
            pairs = {(word[i], word[i + 1]) for i in range(len(word) - 1)}
            best = min(pairs, key=lambda p: self.ranks.get(p, float("inf")))
            if best not in self.ranks:
                break
            out, i = [], 0
            while i < len(word):
                if i < len(word) - 1 and (word[i], word[i + 1]) == best:
                    out.append(word[i] + word[i + 1])
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            word = tuple(out)
        return list(word)

    def tokenize(self, text: str, context: int) -> list[int]:
        """longclip.tokenize(..., truncate=True) / clip.tokenize for one text, unpadded."""
        text = regex.sub(r"\s+", " ", html.unescape(html.unescape(ftfy.fix_text(text))).strip()).strip().lower()
        ids = [self.encoder["<|startoftext|>"]]
        for tok in regex.findall(self.pat, text):
            ids += [self.encoder[b] for b in self.bpe("".join(self.byte_encoder[c] for c in tok.encode("utf-8")))]
        ids.append(self.encoder["<|endoftext|>"])
        if len(ids) > context:
            ids = ids[:context]
            ids[-1] = self.encoder["<|endoftext|>"]
        return ids


    def batch(self, texts: list[str], context: int) -> torch.Tensor:
        """clip.tokenize(texts, context_length, truncate=True): zero-padded (N, context) ids."""
        out = torch.zeros(len(texts), context, dtype=torch.long)
        for i, text in enumerate(texts):
            ids = self.tokenize(text, context)
            out[i, : len(ids)] = torch.tensor(ids)
        return out


class QuickGELU(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(1.702 * x)


class ResidualAttentionBlock(nn.Module):
    def __init__(self, d_model: int, n_head: int, attn_mask: torch.Tensor | None = None) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(d_model, n_head)
        self.ln_1 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(OrderedDict([("c_fc", nn.Linear(d_model, d_model * 4)), ("gelu", QuickGELU()),
                                              ("c_proj", nn.Linear(d_model * 4, d_model))]))
        self.ln_2 = nn.LayerNorm(d_model)
        self.attn_mask = attn_mask

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = self.attn_mask.to(dtype=x.dtype) if self.attn_mask is not None else None
        x = x + self.attn(self.ln_1(x), self.ln_1(x), self.ln_1(x), need_weights=False, attn_mask=mask)[0]
        return x + self.mlp(self.ln_2(x))


class Transformer(nn.Module):
    def __init__(self, width: int, layers: int, heads: int, attn_mask: torch.Tensor | None = None) -> None:
        super().__init__()
        self.resblocks = nn.Sequential(*[ResidualAttentionBlock(width, heads, attn_mask) for _ in range(layers)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.resblocks(x)


class VisionTransformer(nn.Module):
    def __init__(self, input_resolution: int, patch_size: int, width: int, layers: int, heads: int,
                 output_dim: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, kernel_size=patch_size, stride=patch_size, bias=False)
        self.class_embedding = nn.Parameter(torch.empty(width))
        self.positional_embedding = nn.Parameter(torch.empty((input_resolution // patch_size) ** 2 + 1, width))
        self.ln_pre = nn.LayerNorm(width)
        self.transformer = Transformer(width, layers, heads)
        self.ln_post = nn.LayerNorm(width)
        self.proj = nn.Parameter(torch.empty(width, output_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(x)
        x = x.reshape(x.shape[0], x.shape[1], -1).permute(0, 2, 1)
        cls = self.class_embedding + torch.zeros(x.shape[0], 1, x.shape[-1], dtype=x.dtype)
        x = torch.cat([cls, x], dim=1) + self.positional_embedding
        x = self.ln_pre(x).permute(1, 0, 2)
        x = self.transformer(x).permute(1, 0, 2)
        return self.ln_post(x[:, 0, :]) @ self.proj


class OpenAICLIP(nn.Module):
    """clip/model.py's CLIP (ViT), or Long-CLIP's with longclip=True; heads = width // 64."""

    def __init__(self, embed_dim: int, image_resolution: int, vision_layers: int, vision_width: int,
                 vision_patch_size: int, context_length: int, vocab_size: int, transformer_width: int,
                 transformer_layers: int, longclip: bool = False) -> None:
        super().__init__()
        self.context_length = context_length
        self.longclip = longclip
        self.visual = VisionTransformer(image_resolution, vision_patch_size, vision_width, vision_layers,
                                        vision_width // 64, embed_dim)
        mask = torch.empty(context_length, context_length).fill_(float("-inf")).triu_(1)
        self.transformer = Transformer(transformer_width, transformer_layers, transformer_width // 64, mask)
        self.token_embedding = nn.Embedding(vocab_size, transformer_width)
        self.positional_embedding = nn.Parameter(torch.empty(context_length, transformer_width))
        if longclip:
            self.positional_embedding_res = nn.Parameter(torch.empty(context_length, transformer_width))
            self.mask1 = torch.zeros([context_length, 1])
            self.mask1[:20, :] = 1
            self.mask2 = torch.zeros([context_length, 1])
            self.mask2[20:, :] = 1
        self.ln_final = nn.LayerNorm(transformer_width)
        self.text_projection = nn.Parameter(torch.empty(transformer_width, embed_dim))
        self.logit_scale = nn.Parameter(torch.ones([]))

    def encode_image(self, image: torch.Tensor) -> torch.Tensor:
        return self.visual(image)

    def encode_text(self, text: torch.Tensor) -> torch.Tensor:
        x = self.token_embedding(text)
        if self.longclip:
            x = x + self.positional_embedding * self.mask1 + self.positional_embedding_res * self.mask2
        else:
            x = x + self.positional_embedding
        x = self.transformer(x.permute(1, 0, 2)).permute(1, 0, 2)
        x = self.ln_final(x)
        return x[torch.arange(x.shape[0]), text.argmax(dim=-1)] @ self.text_projection


def random_openai_state_dict(*, vision_width: int = 128, vision_layers: int = 2, patch: int = 16, grid: int = 4,
                             text_width: int = 128, text_layers: int = 2, embed_dim: int = 64, context: int = 77,
                             vocab: int = 49408, longclip: bool = False, seed: int = 0,
                             std: float = 0.08) -> OrderedDict[str, torch.Tensor]:
    """A seeded OpenAI-layout ViT CLIP state dict (Long-CLIP's, with positional_embedding_res, when
    longclip), shaped by the official module tree above: LayerNorm scales near 1, the rest N(0, std)."""
    model = OpenAICLIP(embed_dim, patch * grid, vision_layers, vision_width, patch, context, vocab, text_width,
                       text_layers, longclip=longclip)
    gen = torch.Generator().manual_seed(seed)
    state: OrderedDict[str, torch.Tensor] = OrderedDict()
    for key, value in model.state_dict().items():
        noise = torch.randn(value.shape, generator=gen) * std
        norm = (".ln_" in key or key.startswith(("ln_final", "visual.ln_"))) and key.endswith("weight")
        state[key] = noise + 1.0 if norm else noise
    state["logit_scale"] = torch.tensor(4.6052)
    return state


def reference_model(state: dict[str, torch.Tensor]) -> OpenAICLIP:
    """OpenAICLIP built from a state dict's shapes (build_model's rules), loaded strictly."""
    vw, _, patch, _ = state["visual.conv1.weight"].shape
    grid = round((state["visual.positional_embedding"].shape[0] - 1) ** 0.5)
    count = lambda p: len({k[len(p):].split(".")[0] for k in state if k.startswith(p)})  # noqa: E731
    model = OpenAICLIP(state["text_projection"].shape[1], patch * grid, count("visual.transformer.resblocks."), vw,
                       patch, state["positional_embedding"].shape[0], state["token_embedding.weight"].shape[0],
                       state["ln_final.weight"].shape[0], count("transformer.resblocks."),
                       longclip="positional_embedding_res" in state)
    model.load_state_dict(state, strict=True)
    return model.eval()
