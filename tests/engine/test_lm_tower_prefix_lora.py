"""The frozen-prefix path of an encoder LM tower (a training job caches the frozen bottom and
runs only the trained top) and the LoRA adapters (engine/models/lora.py), on tiny random
configs: both must give exactly what the plain tower gives."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from engine.errors import ModelError  # noqa: E402
from engine.models import lm_tower as L  # noqa: E402
from engine.models.lora import LoRALinear, add_lora, merge_lora  # noqa: E402

TEXTS = ["a small red cube on the table", "two dogs", "the cat is under the chair left of a big blue tree"]


def _bert(train_layers=2):
    torch.manual_seed(0)
    return L.tiny_tower("bert", train_layers=train_layers).eval()


@pytest.mark.parametrize("k", [0, 1, 2, 3])
def test_forward_from_prefix_equals_the_full_forward_with_padding(k):
    tower = _bert(k)
    ids, mask = tower.tokenize(TEXTS, 32)
    assert (mask == 0).any()  # the batch is padded: the mask must reach the top layers
    with torch.no_grad():
        full = tower(ids, mask)
        from_prefix = tower.forward_from_prefix(tower.prefix_states(ids, mask), mask)
    assert torch.allclose(full, from_prefix, atol=1e-5), (full - from_prefix).abs().max()


def test_prefix_of_one_text_does_not_depend_on_its_batch():
    tower = _bert(2)
    ids, mask = tower.tokenize(TEXTS, 32)
    alone_ids, alone_mask = tower.tokenize(TEXTS[1:2], 32)
    with torch.no_grad():
        batch = tower.prefix_states(ids, mask)[1, : alone_ids.shape[1]]
        alone = tower.prefix_states(alone_ids, alone_mask)[0]
    assert torch.allclose(batch, alone, atol=1e-5)


def test_prefix_gradient_reaches_only_the_trained_top():
    tower = _bert(1)
    params = tower.set_trainable(1)
    ids, mask = tower.tokenize(TEXTS, 32)
    tower.forward_from_prefix(tower.prefix_states(ids, mask), mask).sum().backward()
    with_grad = {n for n, p in tower.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    top = len(L.transformer_layers(tower.lm)) - 1
    assert "proj.weight" in with_grad and any(f"layer.{top}." in n for n in with_grad)
    assert not any(f"layer.{top - 1}." in n or "embeddings" in n for n in with_grad)
    assert len(params) > 1


def test_prefix_cache_refuses_what_it_cannot_serve():
    with pytest.raises(ModelError, match="embeddings too"):
        _bert("all").prefix_states(*_bert().tokenize(TEXTS, 8), train_layers="all")
    decoder = L.tiny_tower("qwen2", train_layers=1)
    with pytest.raises(ModelError, match="encoder towers"):
        decoder.prefix_states(*decoder.tokenize(TEXTS, 8))
    with pytest.raises(ModelError, match="layers"):
        _bert(9).prefix_states(*_bert().tokenize(TEXTS, 8))


@pytest.mark.parametrize("arch", ["bert", "qwen2"])
def test_fresh_lora_changes_nothing_then_trains_only_adapters_and_merges_exactly(arch):
    torch.manual_seed(0)
    tower = L.tiny_tower(arch, train_layers=0).eval()
    ids, mask = tower.tokenize(TEXTS, 32)
    with torch.no_grad():
        before = tower(ids, mask)
    frozen = {n: p.detach().clone() for n, p in tower.named_parameters()}
    params = add_lora(L.transformer_layers(tower.lm), rank=4, alpha=8, seed=1)
    assert sum(isinstance(m, LoRALinear) for m in tower.modules()) == 2 * len(L.transformer_layers(tower.lm))
    with torch.no_grad():
        assert torch.allclose(tower(ids, mask), before, atol=1e-6)  # B = 0: the identity at start
    opt = torch.optim.SGD(params, lr=0.5)
    for _ in range(3):
        opt.zero_grad()
        (tower(ids, mask) @ torch.ones(tower.dim)).sum().backward()
        opt.step()
    with torch.no_grad():
        adapted = tower(ids, mask)
    assert not torch.allclose(adapted, before, atol=1e-4)
    for n, p in tower.named_parameters():
        key = n.replace(".base.", ".")
        if "lora_" not in n:
            assert torch.equal(p, frozen[key]), f"frozen {n} changed"
    assert merge_lora(tower) == 2 * len(L.transformer_layers(tower.lm))
    assert not any(isinstance(m, LoRALinear) for m in tower.modules())
    assert set(dict(tower.named_parameters())) == set(frozen)  # a plain tower again: save_tower's keys
    with torch.no_grad():
        assert torch.allclose(tower(ids, mask), adapted, atol=1e-5)


def test_lora_needs_a_target():
    with pytest.raises(ValueError, match="no linear named"):
        add_lora([torch.nn.Sequential(torch.nn.Linear(2, 2))])
