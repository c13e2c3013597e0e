"""Issue 18 item 3: a text tower bundled with a model (text-towers/NAME) is a query reader chosen by
name; the shipped MiniLM-L6 k = 6 tower reads SceneWorld paragraphs in sceneworld-mini's image
space; a bundled tower trained for other image weights is refused; `ship-text-tower` writes one
(fp16, NOTICE, manifest) that verifies."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from engine.config import get_paths
from engine.errors import ModelError
from engine.models.registry import bundled_model_dir, list_models, load_embedder, verify_dir
from engine.models.text_towers import TEXT_TOWERS_DIR, bundled_text_towers, resolve_text_tower

SHIPPED = "minilm-k6"


@pytest.fixture
def paths(tmp_path: Path):
    return get_paths(tmp_path / "home").ensure()


def test_names_resolve_to_bundled_towers_and_paths_to_folders(tmp_path):
    model = tmp_path / "model"
    (model / TEXT_TOWERS_DIR / "reader").mkdir(parents=True)
    (model / TEXT_TOWERS_DIR / "reader" / "lm_tower.json").write_text("{}")
    (model / TEXT_TOWERS_DIR / "not-a-tower").mkdir()  # no lm_tower.json: not listed
    folder = tmp_path / "my-tower"
    folder.mkdir()
    assert list(bundled_text_towers(model)) == ["reader"]
    assert resolve_text_tower("reader", model, "m") == model / TEXT_TOWERS_DIR / "reader"
    assert resolve_text_tower(folder, model, "m") == folder
    assert resolve_text_tower(None, model, "m") is None
    with pytest.raises(ModelError, match=r"'readr': m bundles no tower of that name \(bundled: reader\)"):
        resolve_text_tower("readr", model, "m")
    with pytest.raises(ModelError, match=r"no such folder \(towers bundled with m: reader\)"):
        resolve_text_tower(tmp_path / "gone" / "tower", model, "m")


def test_the_bundled_model_lists_and_verifies_its_shipped_tower(paths):
    row = next(m for m in list_models(paths) if m.name == "sceneworld-mini")
    assert row.text_towers == (SHIPPED,)
    report = verify_dir(bundled_model_dir("sceneworld-mini"), "sceneworld-mini")
    assert report.ok and any(c.filename.startswith(f"{TEXT_TOWERS_DIR}/{SHIPPED}/") for c in report.files)
    meta = json.loads((bundled_model_dir("sceneworld-mini") / TEXT_TOWERS_DIR / SHIPPED / "lm_tower.json")
                      .read_text())
    assert meta["dtype"] == "float16" and meta["licence"] == "Apache-2.0" and meta["tower"]["train_layers"] == 6


def test_the_shipped_tower_reads_paragraphs_in_the_models_image_space(paths):
    from engine.evaluation.sceneworld import evaluate

    own = load_embedder("sceneworld-mini", paths)
    lm = load_embedder("sceneworld-mini", paths, text_tower_dir=Path(SHIPPED))
    assert lm.text_model_id == "all-MiniLM-L6-v2" and lm.dim == own.dim
    assert lm.identity == own.identity and lm.text_identity != own.text_identity
    r = evaluate(lm, "long", 1000, 30)
    # 30 test scenes, chance 1/30: the tower was trained against these image embeddings.
    assert r["t2i"]["R@1"] >= 0.8, r["t2i"]


def test_a_bundled_tower_trained_for_other_image_weights_is_refused(paths, tmp_path):
    from engine.models.download import import_model

    copy = tmp_path / "copy"
    shutil.copytree(bundled_model_dir("sceneworld-mini"), copy)
    # The same weights under another name keep their tower (the record is the weights' digest).
    import_model(copy, "sceneworld-mini-caft", paths, backend="sceneworld-mini")
    assert load_embedder("sceneworld-mini-caft", paths, text_tower_dir=Path(SHIPPED)).dim == 256
    meta_path = copy / TEXT_TOWERS_DIR / SHIPPED / "lm_tower.json"
    meta = json.loads(meta_path.read_text())
    meta["trained_for"]["image_identity"] = "0123456789abcdef"
    meta_path.write_text(json.dumps(meta))
    import_model(copy, "sceneworld-mini-caft", paths, backend="sceneworld-mini", replace=True)
    with pytest.raises(ModelError, match="trained for other image weights of sceneworld-mini-caft.*0123456789abcdef"):
        load_embedder("sceneworld-mini-caft", paths, text_tower_dir=Path(SHIPPED))
    # Its own text tower still loads.
    assert load_embedder("sceneworld-mini-caft", paths).dim == 256


def test_ship_writes_a_verified_fp16_tower_with_its_notice(tmp_path):
    from engine.models.lm_tower import load_tower, save_tower, tiny_tower
    from engine.models.registry import model_identity, read_manifest
    from engine.training.ship_text_tower import ship

    model = tmp_path / "model"
    shutil.copytree(bundled_model_dir("sceneworld-mini"), model, ignore=shutil.ignore_patterns(TEXT_TOWERS_DIR))
    from engine.models.download import write_local_manifest

    write_local_manifest(model, "sceneworld-mini", "sceneworld-mini")
    src = save_tower(tiny_tower("bert", train_layers=0), tmp_path / "trained")
    for _ in range(2):  # shipping again replaces the copy; the model keeps verifying
        target = ship(src, model, "tiny-reader", licence="Apache-2.0", source="a tiny random BERT")
        assert verify_dir(model).ok
    assert bundled_text_towers(model) == {"tiny-reader": target}
    meta = json.loads((target / "lm_tower.json").read_text())
    digest = model_identity("sceneworld-mini", read_manifest(model)).image.rsplit("@", 1)[1]
    assert meta["dtype"] == "float16" and meta["trained_for"] == {"image_identity": digest}
    assert "Apache-2.0" in (target / "NOTICE").read_text() and not list(target.parent.glob(".*"))
    texts = ["a small red square", "two big blue circles at the top"]
    assert (load_tower(target).encode(texts) * load_tower(src).encode(texts)).sum(1).min() > 0.999
    with pytest.raises(ModelError, match="one word"):
        ship(src, model, "a/b", licence="Apache-2.0", source="x")
