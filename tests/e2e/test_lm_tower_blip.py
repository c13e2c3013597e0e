"""The real-photo path of issue 18 item 4 in miniature: an LM text tower trained with
`longlens train --text-tower ... --train-layers K` on top of BLIP's frozen vision tower (a tiny
random BLIP), then used by `longlens search --text-tower` over an indexed folder of real files."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from engine.models import lm_text_side  # noqa: E402
from engine.models import lm_tower as L  # noqa: E402
from engine.models.registry import load_embedder  # noqa: E402
from engine.sceneworld.export import write_training_jsonl  # noqa: E402
from tests.e2e.conftest import TINY_MODEL  # noqa: E402
from tests.e2e.test_index_search import QUERY, brute_force_ranking  # noqa: E402


def test_the_marker_is_the_towers_config_file():
    assert lm_text_side.LM_TOWER_MARKER == L.TOWER_CONFIG_FILE


def test_train_an_lm_tower_on_blip_and_search_with_it(home, paths, photos, cli, tmp_path):
    base = load_embedder(TINY_MODEL, paths)
    data = write_training_jsonl(tmp_path / "data" / "train.jsonl", tmp_path / "data" / "images", seed=7, n=16,
                                size=64)
    start = L.save_tower(L.tiny_tower("bert", embed_dim=base.dim, train_layers=0), tmp_path / "tiny-bert")
    out = tmp_path / "run"
    summary = cli.json("train", "--config", "C5", "--data", str(data), "--base", TINY_MODEL, "--out", str(out),
                       "--epochs", "1", "--batch-size", "8", "--lr", "1e-3", "--text-tower", str(start),
                       "--train-layers", "1")
    assert summary["steps"] == 2
    meta = json.loads((out / L.TOWER_CONFIG_FILE).read_text())
    assert meta["tower"]["train_layers"] == 1 and meta["training"]["name"] == "C5"

    # The installed BLIP with the trained tower reading the texts: images stay BLIP's.
    emb = load_embedder(TINY_MODEL, paths, text_tower_dir=out)
    assert emb.identity == base.identity and emb.text_identity != base.text_identity
    assert emb.max_text_tokens == L.load_tower(out).max_text_tokens
    texts = ["a red cube on a table", QUERY]
    np.testing.assert_allclose(emb.encode_texts(texts, 64), L.load_tower(out).encode(texts, 64), atol=1e-6)
    assert not np.allclose(emb.encode_texts(texts, 64), base.encode_texts(texts, 64), atol=1e-3)
    assert emb.token_count(QUERY) == L.load_tower(out).token_count(QUERY)

    cli.json("index", str(photos))
    with_tower = cli.json("search", QUERY, "--top", "8", "--text-tower", str(out))
    plain = cli.json("search", QUERY, "--top", "8")
    expected = brute_force_ranking(paths, QUERY)  # BLIP's own text tower
    assert [r["path"] for r in plain["results"]] == [p for p, _ in expected[:8]]
    # With the tower: the same stored image vectors, ranked by the tower's query vector.
    mine = brute_force_ranking(paths, QUERY, text_tower_dir=out)[:8]
    assert [r["path"] for r in with_tower["results"]] == [p for p, _ in mine]
    np.testing.assert_allclose([r["score"] for r in with_tower["results"]], [s for _, s in mine], atol=1e-5)
    assert [r["path"] for r in with_tower["results"]] != [r["path"] for r in plain["results"]]


def test_a_tower_for_another_image_space_is_refused(home, paths, tmp_path):
    from engine.errors import ModelError

    wrong = L.save_tower(L.tiny_tower("bert", embed_dim=7, train_layers=0), tmp_path / "seven")
    with pytest.raises(ModelError, match="projects to 7 dimensions"):
        load_embedder(TINY_MODEL, paths, text_tower_dir=wrong)

