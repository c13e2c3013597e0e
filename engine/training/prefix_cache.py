"""Text batches for training the top layers of an LM text tower on a CPU.

While only the top k layers of an encoder tower train, the embeddings and the layers below them
give the same output for a text on every step. `PrefixCache` runs that frozen bottom once per
text (LMTextTower.prefix_states) and keeps its token states; a step then runs only the trained
layers on them (LMTextTower.forward_from_prefix), which gives exactly the full forward (a test
checks it) at a fraction of the cost. `LiveTexts` is the same interface without a cache, for
what cannot be cached (train_layers = "all", decoder towers, LoRA on every layer).

Training code: imported by commands and jobs only (an import-linter contract).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.models.batching import length_sorted_batches


class PrefixCache:
    """The frozen-prefix token states of `texts` (float32, one (L_i, H) tensor per text)."""

    def __init__(self, tower, texts: Sequence[str], max_tokens: int, train_layers: int, *, batch: int = 64) -> None:
        self.tower, self.train_layers = tower, train_layers
        texts = list(texts)
        self.states: list[torch.Tensor] = [torch.empty(0)] * len(texts)
        was_training = tower.training
        tower.eval()
        try:
            for idx in length_sorted_batches([len(t) for t in texts], batch):
                ids, mask = tower.tokenize([texts[i] for i in idx], max_tokens)
                states = tower.prefix_states(ids, mask, train_layers).cpu()
                lengths = mask.sum(dim=1).tolist()
                for row, i in enumerate(idx):
                    self.states[i] = states[row, : int(lengths[row])].clone()
        finally:
            tower.train(was_training)

    def __len__(self) -> int:
        return len(self.states)

    def embed(self, idx: Sequence[int]) -> torch.Tensor:
        """(len(idx), D) embeddings of the texts at idx, with graph through the trained layers."""
        rows = [self.states[int(i)] for i in idx]
        width = max(len(r) for r in rows)
        hidden = rows[0].new_zeros((len(rows), width, rows[0].shape[1]))
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for j, r in enumerate(rows):
            hidden[j, : len(r)] = r
            mask[j, : len(r)] = 1
        device = self.tower.device
        return self.tower.forward_from_prefix(hidden.to(device), mask.to(device), self.train_layers)


class LiveTexts:
    """The same interface, running the whole tower on every call."""

    def __init__(self, tower, texts: Sequence[str], max_tokens: int) -> None:
        self.tower, self.texts, self.max_tokens = tower, list(texts), max_tokens

    def __len__(self) -> int:
        return len(self.texts)

    def embed(self, idx: Sequence[int]) -> torch.Tensor:
        return self.tower.encode_tensor([self.texts[int(i)] for i in idx], self.max_tokens)


def text_batches(tower, texts: Sequence[str], max_tokens: int, cached_layers: int | None):
    """A PrefixCache when `cached_layers` (the number of layers above the frozen prefix) is
    given, else LiveTexts."""
    if cached_layers is None:
        return LiveTexts(tower, texts, max_tokens)
    return PrefixCache(tower, texts, max_tokens, cached_layers)
