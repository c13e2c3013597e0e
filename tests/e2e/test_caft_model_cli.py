"""Issue 21 item 3: the CAFT-style variant is a selectable model. A (tiny) variant folder imports
under its registered name, `longlens models list` shows it installed, and `longlens ground` draws
its own phrase-region maps (its phrases against its patches; no matching head: that one learns from
masks), and `--method context` the maps of its phrases pooled in context."""

from __future__ import annotations

import json

import torch
from PIL import Image

from engine.backends.sceneworld_mini.network import MiniConfig, SceneWorldMini, save_model
from engine.cli import main as cli_main

NAME = "sceneworld-mini-caft"
CFG = MiniConfig(image_size=32, stem_channels=(8, 16), vision_width=32, vision_layers=1, text_embed=16,
                 text_width=32, text_layers=1, heads=2, mlp_ratio=2, embed_dim=32,
                 region_scales=(2,), text_pooling="part_to_whole")


def test_the_variant_imports_by_name_and_grounds_with_its_own_maps(tmp_path, monkeypatch, cli):
    monkeypatch.setenv("LONGLENS_HOME", str(tmp_path / "home"))
    torch.manual_seed(0)
    save_model(SceneWorldMini(CFG), tmp_path / "caft-tiny")
    assert cli_main(["models", "import", str(tmp_path / "caft-tiny"), "--name", NAME]) == 0
    listed = cli.json("models", "list")
    row = next(m for m in (listed if isinstance(listed, list) else listed["models"]) if m["name"] == NAME)
    assert row["installed"] and row["backend"] == "sceneworld-mini"
    image = tmp_path / "p.png"
    Image.new("RGB", (64, 64), (200, 30, 30)).save(image)
    rc, out, err = cli("ground", str(image), "A red ball sits next to a blue box.", "--model", NAME,
                       "--out", str(tmp_path / "g"), "--json")
    assert rc == 0, err
    g = json.loads(out)
    assert g["method"] == "patch-similarity-shifted"  # its own patches against its phrases (docs/caft.md)
    # Method "context": the phrases pooled in context (what the local loss trains) give other maps.
    rc, out2, err = cli("ground", str(image), "A red ball sits next to a blue box.", "--model", NAME,
                        "--out", str(tmp_path / "g2"), "--json", "--method", "context")
    assert rc == 0, err
    assert json.loads(out2)["method"] == "phrase-in-context-patch-similarity-shifted"
    import numpy as np

    ctx, alone = np.load(tmp_path / "g" / "maps.npz"), np.load(tmp_path / "g2" / "maps.npz")
    assert any(not np.allclose(ctx[k], alone[k]) for k in ctx.files)
    assert [p["text"] for p in g["phrases"] if p["kind"] != "relation"] == ["A red ball", "a blue box"]


def test_a_sceneworld_mini_folder_that_does_not_fit_its_config_is_refused_at_import(tmp_path, monkeypatch, cli):
    monkeypatch.setenv("LONGLENS_HOME", str(tmp_path / "home"))
    torch.manual_seed(0)
    folder = save_model(SceneWorldMini(CFG), tmp_path / "bad")
    meta = json.loads((folder / "sceneworld_mini.json").read_text())
    meta["config"]["vision_width"] = 64  # the weights are 32 wide
    (folder / "sceneworld_mini.json").write_text(json.dumps(meta))
    rc, _, err = cli("models", "import", str(folder), "--name", NAME)
    assert rc != 0 and "sceneworld_mini.json" in err and "Traceback" not in err
    meta["config"] = {**meta["config"], "vision_width": 32, "region_scales": [3]}
    (folder / "sceneworld_mini.json").write_text(json.dumps(meta))
    rc, _, err = cli("models", "import", str(folder), "--name", NAME)
    assert rc != 0 and "region_scales" in err
    assert not (tmp_path / "home" / "models" / NAME).exists()
