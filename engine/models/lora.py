"""Low-rank adapters (LoRA, Hu et al. 2021, arXiv 2106.09685) on an LM text tower's attention,
for measuring LoRA against partial unfreezing (issue 18): W x + (alpha / r) B A x, with A
random and B zero, so a fresh adapter leaves the tower unchanged. Training only: `merge_lora`
folds every adapter into its weight (W + (alpha / r) B A), so a saved tower is a plain tower
and loading needs nothing from here. Written out (a few lines) rather than taken from `peft`,
which the project adds only if LoRA wins the measurement.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

#: The attention projections adapted: BERT-style encoders ("query", "value") and
#: Llama/Qwen-style decoders ("q_proj", "v_proj"), as in the LoRA paper.
TARGETS = ("query", "value", "q_proj", "v_proj")


class LoRALinear(nn.Module):
    def __init__(self, base: nn.Linear, rank: int, alpha: float, generator: torch.Generator) -> None:
        super().__init__()
        if rank < 1:
            raise ValueError(f"LoRA rank {rank} must be at least 1")
        self.base = base
        self.scale = alpha / rank
        a = torch.empty(rank, base.in_features)
        bound = 1 / math.sqrt(base.in_features)  # nn.Linear's default init, as the reference code
        a.uniform_(-bound, bound, generator=generator)
        self.lora_a = nn.Parameter(a.to(base.weight))
        self.lora_b = nn.Parameter(torch.zeros(base.out_features, rank, dtype=base.weight.dtype,
                                               device=base.weight.device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + F.linear(F.linear(x, self.lora_a), self.lora_b) * self.scale

    @torch.no_grad()
    def merged(self) -> nn.Linear:
        self.base.weight += self.scale * (self.lora_b @ self.lora_a)
        return self.base


def add_lora(layers: Sequence[nn.Module], *, rank: int = 8, alpha: float = 16.0, seed: int = 0,
             targets: Sequence[str] = TARGETS) -> list[nn.Parameter]:
    """Wrap the target linears of `layers` in LoRALinear (frozen base); returns the adapters'
    parameters (the only ones of these layers that train)."""
    gen = torch.Generator().manual_seed(seed)
    params: list[nn.Parameter] = []
    for layer in layers:
        for parent in list(layer.modules()):
            for name, child in list(parent.named_children()):
                if name in targets and isinstance(child, nn.Linear):
                    for p in child.parameters():
                        p.requires_grad_(False)
                    adapter = LoRALinear(child, rank, alpha, gen)
                    setattr(parent, name, adapter)
                    params += [adapter.lora_a, adapter.lora_b]
    if not params:
        raise ValueError(f"no linear named {', '.join(targets)} in the given layers")
    return params


def merge_lora(model: nn.Module) -> int:
    """Fold every adapter under `model` into its base linear; returns how many were merged."""
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, LoRALinear):
                setattr(parent, name, child.merged())
                count += 1
    return count
