"""Issue 16 item 2, class "identity by name": vectors, indexes and shards are keyed by what computed
them (the manifest's file hashes), never by the model's folder name. Real CLI, real files, a real
SQLite catalog; two different random tiny BLIP checkpoints stand in for "tinyA" and "tinyB"."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from engine.config import get_paths
from engine.models.registry import identity_name, installed_identity

NAME = "m"


@pytest.fixture(scope="module")
def tiny_b(tmp_path_factory) -> Path:
    from engine.backends.blip.checkpoints import save_random_blip_checkpoint

    return save_random_blip_checkpoint(tmp_path_factory.mktemp("blipB") / "tinyB", size="tiny", seed=1)


@pytest.fixture
def two_models_home(tmp_path, monkeypatch) -> Path:
    h = tmp_path / "home"
    monkeypatch.setenv("LONGLENS_HOME", str(h))
    return h


def stored_keys(home: Path) -> dict[str, int]:
    con = sqlite3.connect(f"{Path(home / 'data' / 'catalog.sqlite3').absolute().as_uri()}?mode=ro", uri=True)
    try:
        return dict(con.execute("SELECT model_id, count(*) FROM embeddings GROUP BY model_id"))
    finally:
        con.close()


def test_replacing_a_model_reembeds_the_library_and_search_finds_the_image_itself(
    two_models_home, cli, photos, blip_tiny_checkpoint, tiny_b
):
    home = two_models_home
    assert cli("models", "import", str(blip_tiny_checkpoint), "--name", NAME)[0] == 0
    first = cli.json("index", str(photos), "--model", NAME)
    n = first["new"]
    assert n > 0 and first["embedded"] == n and first["model_id"] == NAME
    id_a = installed_identity(NAME, get_paths(home)).image
    assert first["model_identity"] == id_a and stored_keys(home) == {id_a: n}

    assert cli("models", "import", str(tiny_b), "--name", NAME, "--replace")[0] == 0
    id_b = installed_identity(NAME, get_paths(home)).image
    assert id_b != id_a and identity_name(id_b) == NAME

    second = cli.json("index", str(photos), "--model", NAME)
    assert second["model_id"] == NAME  # the user-facing name is unchanged
    assert second["model_identity"] == id_b
    assert second["unchanged"] == 0 and second["embedded"] == n and second["reembedded"] == n
    assert second["stale_vectors_dropped"] == n
    assert any("re-embedded" in note and NAME in note for note in second["index_notes"])
    assert stored_keys(home) == {id_b: n}  # the old identity's rows do not accumulate
    idx_files = sorted(p.name for p in (home / "data" / "indexes").glob("*.llidx"))
    assert len(idx_files) == 1 and "@" not in idx_files[0]

    # The text summary says so too.
    rc, out, _ = cli("index", str(photos), "--model", NAME)
    assert rc == 0 and "re-embedded" not in out  # nothing more to do on the third run
    x = sorted(p for p in photos.rglob("*.jpg"))[0]
    hits = cli.json("search", "--image", str(x), "--model", NAME, "--top", "3")
    assert hits["model"] == NAME
    assert Path(hits["results"][0]["path"]) == x.resolve()
    assert hits["results"][0]["score"] == pytest.approx(1.0, abs=1e-3)


def test_text_summary_reports_the_reembedding(two_models_home, cli, photos, blip_tiny_checkpoint, tiny_b):
    assert cli("models", "import", str(blip_tiny_checkpoint), "--name", NAME)[0] == 0
    assert cli("index", str(photos), "--model", NAME)[0] == 0
    assert cli("models", "import", str(tiny_b), "--name", NAME, "--replace")[0] == 0
    rc, out, _ = cli("index", str(photos), "--model", NAME)
    assert rc == 0 and "re-embedded" in out and f"model {NAME!r}" in out and "unchanged 0" in out


def test_a_stale_identity_is_never_served_by_search(two_models_home, cli, photos, blip_tiny_checkpoint, tiny_b):
    """Replaced but not re-indexed: search with the new model must not use the old vectors."""
    assert cli("models", "import", str(blip_tiny_checkpoint), "--name", NAME)[0] == 0
    assert cli("index", str(photos), "--model", NAME)[0] == 0
    assert cli("models", "import", str(tiny_b), "--name", NAME, "--replace")[0] == 0
    x = sorted(p for p in photos.rglob("*.jpg"))[0]
    rc, out, err = cli("search", "--image", str(x), "--model", NAME, "--json")
    assert rc == 0 and __import__("json").loads(out)["results"] == []
    assert "earlier version of model 'm'" in err and str(photos.resolve()) in err  # and it says why


def test_a_text_tower_override_does_not_change_the_image_identity(home, paths, blip_tiny_checkpoint, tmp_path):
    """Image vectors do not depend on the text tower: a tower changes only the text identity."""
    from engine.backends.blip.embedder import BlipEmbedder, save_text_tower
    from engine.models.registry import load_embedder

    plain = load_embedder("tiny-blip", paths, device="cpu")
    donor = BlipEmbedder(blip_tiny_checkpoint, device="cpu", model_id="tiny-blip")
    with __import__("torch").no_grad():
        for k, v in donor.model.state_dict().items():
            if k.startswith("text_proj."):
                v.add_(0.5)
    tower = save_text_tower(donor, tmp_path / "tower", "t1")
    towered = load_embedder("tiny-blip", paths, device="cpu", text_tower_dir=tower)
    assert towered.identity == plain.identity
    assert towered.text_identity != plain.text_identity
    pix = plain.preprocess([__import__("PIL.Image", fromlist=["Image"]).new("RGB", (40, 30), "red")])
    assert np.allclose(plain.encode_pixels(pix), towered.encode_pixels(pix), atol=1e-5)


def test_calibration_key_changes_with_the_text_tower_weights(home, paths, blip_tiny_checkpoint, tmp_path):
    """Two towers saved under the same name but with other weights get different calibration keys."""
    import torch

    from engine.backends.blip.embedder import BlipEmbedder, save_text_tower
    from engine.grounding.calibration import calibration_key
    from engine.models.registry import load_embedder

    keys = []
    for bump in (0.1, 0.7):
        donor = BlipEmbedder(blip_tiny_checkpoint, device="cpu", model_id="tiny-blip")
        with torch.no_grad():
            for k, v in donor.model.state_dict().items():
                if k.startswith("text_proj."):
                    v.add_(bump)
        tower = save_text_tower(donor, tmp_path / f"tower{bump}", "same-name")
        emb = load_embedder("tiny-blip", paths, device="cpu", text_tower_dir=tower)
        keys.append(calibration_key(emb))
    assert keys[0] != keys[1]


def test_shards_made_by_another_identity_are_refused(two_models_home, cli, blip_tiny_checkpoint, tiny_b, tmp_path):
    """Shards written by model m before it was replaced carry m's old identity: import refuses them."""
    pytest.importorskip("pyarrow")
    import time

    from engine.cluster import shards as shardio

    home = two_models_home
    assert cli("models", "import", str(blip_tiny_checkpoint), "--name", NAME)[0] == 0
    old = installed_identity(NAME, get_paths(home)).image
    assert cli("models", "import", str(tiny_b), "--name", NAME, "--replace")[0] == 0
    src, shards, dim = str(tmp_path / "photos"), tmp_path / "shards", 8
    row = {"rel_path": "a.jpg", "size": 100, "mtime_ns": 1000, "content_hash": "h1", "status": "ok",
           "width": 4, "height": 4, "vector": np.ones(dim, np.float32) / np.sqrt(dim)}
    run_id = shardio.new_run_id()
    w = shardio.ShardWriter(shards, src, old, run_id)
    w.add(shardio.result_table([row], old))
    w.flush()
    shardio.write_listing(shards, run_id, src, old, [("a.jpg", 100, 1000)])
    shardio.RunManifest(run_id, src, old, 1, 1, time.time(), time.time(), True, dim).save(shards)
    rc, _, err = cli("import-shards", str(shards), "--library", str(tmp_path / "lib"))
    assert rc != 0 and "another version" in err and NAME in err
    assert not (home / "data" / "catalog.sqlite3").exists() or stored_keys(home) == {}


def test_training_cache_refuses_another_identity_of_an_installed_model(two_models_home, cli, blip_tiny_checkpoint,
                                                                        tmp_path):
    """A re-import whose config changed (here: a field no vector depends on, so the probe image still
    embeds alike) is another identity: the embedding cache of the old one is not reused."""
    import json

    from engine.models.registry import load_embedder
    from engine.training.cache import CacheError, EmbeddingCache

    paths = get_paths(two_models_home)
    assert cli("models", "import", str(blip_tiny_checkpoint), "--name", NAME)[0] == 0
    EmbeddingCache.create_or_open(tmp_path / "cache", load_embedder(NAME, paths, device="cpu")).close()
    changed = tmp_path / "changed"
    shutil.copytree(blip_tiny_checkpoint, changed)
    cfg = json.loads((changed / "config.json").read_text())
    cfg["longlens_test_note"] = "re-exported"
    (changed / "config.json").write_text(json.dumps(cfg))
    assert cli("models", "import", str(changed), "--name", NAME, "--replace")[0] == 0
    with pytest.raises(CacheError, match="its files changed since"):
        EmbeddingCache.create_or_open(tmp_path / "cache", load_embedder(NAME, paths, device="cpu"))


def test_a_tower_file_in_a_subfolder_is_part_of_the_text_identity(tmp_path):
    """A language-model tower keeps its tokenizer in tokenizer/: a different tokenizer is another tower."""
    from engine.models.registry import model_identity

    manifest = {"backend": "blip", "files": {"config.json": {"sha256": "0" * 64, "size": 2}}}
    tower = tmp_path / "tower"
    (tower / "tokenizer").mkdir(parents=True)
    (tower / "model.safetensors").write_bytes(b"weights")
    (tower / "tokenizer" / "tokenizer.json").write_text('{"a": 1}', encoding="utf-8")
    first = model_identity("m", manifest, tower)
    (tower / "tokenizer" / "tokenizer.json").write_text('{"a": 2}', encoding="utf-8")
    second = model_identity("m", manifest, tower)
    assert first.image == second.image  # a text tower never changes the image side
    assert first.text != second.text
    flat = tmp_path / "flat"
    flat.mkdir()
    (flat / "model.safetensors").write_bytes(b"weights")
    (tower / "tokenizer" / "tokenizer.json").unlink()
    (tower / "tokenizer").rmdir()
    assert model_identity("m", manifest, flat).text == model_identity("m", manifest, tower).text
