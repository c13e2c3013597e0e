"""Paragraph training on CLIP-family vision towers (issue 19 item 4) through the real CLI, on tiny
random CLIP folders and real image files:

* `longlens train --config C5 --base <installed tiny Long-CLIP-B>`: one epoch trains CLIP's own text
  tower (vision frozen) and writes a CLIP text-tower override; `longlens search --text-tower RUN`
  ranks the same stored image vectors by the trained tower's query vector;
* the same from a CLIP folder as the base (OpenAI CLIP-B/16's 77 positions: C5's 128-token
  paragraphs are read up to 77, and the run says so);
* `longlens train --config C5 --base <clip> --text-tower minilm --train-layers 1`: an LM text tower
  on the CLIP vision tower, then used by search.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors import safe_open

from engine.backends.clip.embedder import ClipEmbedder
from engine.backends.clip.text_tower import TEXT_TOWER_FORMAT, TEXT_TOWER_META, TEXT_TOWER_WEIGHTS
from engine.catalog import Catalog
from engine.config import get_paths
from engine.models.registry import load_embedder
from engine.sceneworld.export import write_training_jsonl

MODEL = "tiny-longclip"
CLIP_MODEL = "tiny-clip"
QUERY = ("A wide sandy beach at low tide with a red umbrella near the water. Two children build a castle "
         "to the left of a blue bucket, while gulls circle above the waves under a cloudy afternoon sky.")


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: tiny models, one torch thread


@pytest.fixture
def data(tmp_path) -> Path:
    return write_training_jsonl(tmp_path / "data" / "train.jsonl", tmp_path / "data" / "images", seed=7, n=16,
                                size=64)


@pytest.fixture
def clip_home(tmp_path, monkeypatch, cli, longclip_b_tiny_checkpoint, clip_b16_tiny_checkpoint) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("LONGLENS_HOME", str(home))
    for folder, name in ((longclip_b_tiny_checkpoint, MODEL), (clip_b16_tiny_checkpoint, CLIP_MODEL)):
        rc, out, err = cli("models", "import", str(folder), "--name", name)
        assert rc == 0 and "(clip)" in out, err
    return home


def ranking(paths, model: str, text: str, text_tower_dir: Path | None = None) -> list[tuple[str, float]]:
    """Exact ranking over every stored vector of `model`, independent of the ANN index."""
    emb = load_embedder(model, paths, text_tower_dir=text_tower_dir)
    q = emb.encode_texts([text])[0]
    out = []
    with Catalog(paths.catalog) as cat:
        for lib in cat.libraries():
            ids, vecs = cat.all_vectors(lib.id, emb.identity)
            recs = cat.images_by_id(ids.tolist())
            out += [(float(v @ q), i, str(Path(lib.root) / recs[i].rel_path)) for i, v in zip(ids.tolist(), vecs,
                                                                                                strict=True)]
    out.sort(key=lambda t: (-t[0], t[1]))
    return [(p, s) for s, _, p in out]


def tower_tensors(folder: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(folder / TEXT_TOWER_WEIGHTS), framework="pt") as fh:
        return {k: fh.get_tensor(k) for k in fh.keys()}


def test_train_c5_on_an_installed_longclip_and_search_with_the_tower(clip_home, cli, data, photos, tmp_path,
                                                                     longclip_b_tiny_checkpoint):
    paths = get_paths(clip_home)
    out = tmp_path / "run"
    summary = cli.json("train", "--config", "C5", "--data", str(data), "--base", MODEL, "--out", str(out),
                       "--epochs", "1", "--batch-size", "8", "--lr", "1e-3", "--warmup-steps", "1")
    assert summary["steps"] == 2 and summary["examples"] == 16 and summary["cancelled"] is False
    assert summary["text_tokens_cut"] == {}  # Long-CLIP reads C5's 128-token paragraphs whole
    meta = json.loads((out / TEXT_TOWER_META).read_text())
    assert meta["format"] == TEXT_TOWER_FORMAT and meta["name"] == "C5" and meta["base_model_id"] == MODEL
    assert meta["max_text_tokens"] == 248
    info = json.loads((out / "training.json").read_text())
    assert info["training"]["name"] == "C5" and info["steps"] == 2

    # The tower is CLIP's text side, trained; Long-CLIP's 248 position rows are kept as they are.
    trained = tower_tensors(out)
    base = ClipEmbedder(longclip_b_tiny_checkpoint, device="cpu")
    own = dict(base.model.named_parameters())
    assert trained and all(k.startswith(("text_model.", "text_projection.")) for k in trained)
    assert set(trained) == {k for k in own if k.startswith(("text_model.", "text_projection."))}
    pos = "text_model.embeddings.position_embedding.weight"
    assert trained[pos].shape == own[pos].shape and trained[pos].shape[0] == 248
    changed = [k for k, v in trained.items() if not torch.equal(v, own[k].detach())]
    assert "text_projection.weight" in changed and len(changed) > len(trained) // 2

    # Loaded over the installed model: image vectors are the model's own, texts are the tower's.
    plain = load_embedder(MODEL, paths)
    tuned = load_embedder(MODEL, paths, text_tower_dir=out)
    assert tuned.identity == plain.identity and tuned.text_identity != plain.text_identity
    assert tuned.text_model_id == f"{MODEL}+C5" and tuned.max_text_tokens == 248
    image = base.preprocess([Image.new("RGB", (90, 70), (200, 40, 20))])
    np.testing.assert_allclose(tuned.encode_pixels(image), plain.encode_pixels(image), atol=1e-6)
    assert not np.allclose(tuned.encode_texts([QUERY]), plain.encode_texts([QUERY]), atol=1e-3)

    cli.json("index", str(photos), "--model", MODEL)
    with_tower = cli.json("search", QUERY, "--model", MODEL, "--top", "8", "--text-tower", str(out))
    without = cli.json("search", QUERY, "--model", MODEL, "--top", "8")
    mine = ranking(paths, MODEL, QUERY, text_tower_dir=out)[:8]
    assert [r["path"] for r in with_tower["results"]] == [p for p, _ in mine]
    np.testing.assert_allclose([r["score"] for r in with_tower["results"]], [s for _, s in mine], atol=1e-5)
    assert [r["path"] for r in without["results"]] == [p for p, _ in ranking(paths, MODEL, QUERY)[:8]]
    assert [r["path"] for r in with_tower["results"]] != [r["path"] for r in without["results"]]


def test_train_c5_from_a_clip_folder_says_where_77_positions_cut_the_paragraphs(clip_home, cli, data, tmp_path,
                                                                                clip_b16_tiny_checkpoint):
    out = tmp_path / "run-folder"
    rc, _, err = cli("train", "--config", "C5", "--data", str(data), "--base", str(clip_b16_tiny_checkpoint),
                     "--out", str(out), "--epochs", "1", "--batch-size", "8", "--lr", "1e-3")
    assert rc == 0, err
    assert "reads at most 77 text tokens" in err and "128-token texts are read up to there" in err
    run = json.loads((out / "run.json").read_text())
    assert run["steps"] == 2 and run["text_tokens_cut"] == {"128": 77}
    assert json.loads((out / TEXT_TOWER_META).read_text())["max_text_tokens"] == 77

    # The tower loads on the folder it was trained on and on the same weights installed.
    emb = ClipEmbedder(clip_b16_tiny_checkpoint, device="cpu", text_tower_dir=out)
    installed = load_embedder(CLIP_MODEL, get_paths(clip_home), text_tower_dir=out)
    # The installed model runs the fast path (bf16 copies of the towers on CPUs with native bf16):
    # it may differ from the float32 folder by rounding, far less than the tower moved the text.
    q = installed.encode_texts([QUERY])[0]
    rounding = 1 - float(q @ emb.encode_texts([QUERY])[0])
    trained = 1 - float(q @ load_embedder(CLIP_MODEL, get_paths(clip_home)).encode_texts([QUERY])[0])
    assert rounding < 1e-3 and rounding * 10 < trained
    # A 77-position tower does not fit Long-CLIP's 248 positions: refused, naming why.
    from engine.errors import ModelError

    with pytest.raises(ModelError, match="max_position_embeddings 77"):
        load_embedder(MODEL, get_paths(clip_home), text_tower_dir=out)


def test_an_lm_text_tower_trains_on_a_clip_vision_tower_and_search_uses_it(clip_home, cli, data, photos, tmp_path):
    from engine.models import lm_tower as L

    paths = get_paths(clip_home)
    out = tmp_path / "lm-run"
    summary = cli.json("train", "--config", "C5", "--data", str(data), "--base", CLIP_MODEL, "--out", str(out),
                       "--epochs", "1", "--batch-size", "8", "--lr", "1e-3", "--text-tower", "minilm",
                       "--train-layers", "1")
    assert summary["steps"] == 2 and summary["fingerprint"]["text_tower"] == "minilm"
    meta = json.loads((out / L.TOWER_CONFIG_FILE).read_text())
    assert meta["tower"]["train_layers"] == 1 and meta["training"]["name"] == "C5"
    tower = L.load_tower(out)
    base = load_embedder(CLIP_MODEL, paths)
    assert tower.dim == base.dim

    emb = load_embedder(CLIP_MODEL, paths, text_tower_dir=out)
    assert emb.identity == base.identity and emb.text_identity != base.text_identity
    np.testing.assert_allclose(emb.encode_texts([QUERY], 128), tower.encode([QUERY], 128), atol=1e-6)

    cli.json("index", str(photos), "--model", CLIP_MODEL)
    res = cli.json("search", QUERY, "--model", CLIP_MODEL, "--top", "6", "--text-tower", str(out))
    mine = ranking(paths, CLIP_MODEL, QUERY, text_tower_dir=out)[:6]
    assert [r["path"] for r in res["results"]] == [p for p, _ in mine]
