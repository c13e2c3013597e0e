"""CLI surface: paths, models commands, demo, help without heavy imports, clear errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine.cli import main as cli_main
from tests.e2e.conftest import TINY_MODEL

ROOT = Path(__file__).resolve().parents[2]


def test_paths_follow_longlens_home(tmp_path, monkeypatch, cli):
    monkeypatch.setenv("LONGLENS_HOME", str(tmp_path / "h"))
    got = cli.json("paths")
    assert got["data"] == str(tmp_path / "h" / "data")
    assert got["models"] == str(tmp_path / "h" / "models")
    assert got["catalog"].startswith(got["data"])
    # --home wins over the environment
    rc, out, _ = cli("--home", str(tmp_path / "other"), "paths", "--json")
    assert json.loads(out)["cache"] == str(tmp_path / "other" / "cache")


def test_help_does_not_load_torch():
    code = (
        "import sys, contextlib, io\n"
        "from engine.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try: main(['--help'])\n"
        "    except SystemExit: pass\n"
        "print('torch' in sys.modules, 'transformers' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False False"


def test_models_list_import_verify(home, cli, paths):
    listing = cli.json("models", "list")
    mine = [m for m in listing if m["name"] == TINY_MODEL]
    assert mine and mine[0]["installed"] is True
    assert any(m["name"] == "blip-itm-base-coco" and not m["installed"] for m in listing)
    report = cli.json("models", "verify", TINY_MODEL)
    assert report["ok"] is True
    weights = paths.models / TINY_MODEL / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-10] ^= 0x55
    weights.write_bytes(bytes(data))
    rc, out, err = cli("models", "verify", TINY_MODEL)
    assert rc == 1 and "mismatch" in out
    rc, out, err = cli("index", str(paths.data), "--model", TINY_MODEL)
    assert rc == 2 and ("re-import" in err.lower() or "re-pull" in err.lower())


def test_import_refuses_pickle(tmp_path, monkeypatch, cli, blip_tiny_checkpoint):
    import shutil

    monkeypatch.setenv("LONGLENS_HOME", str(tmp_path / "h"))
    src = tmp_path / "src"
    shutil.copytree(blip_tiny_checkpoint, src)
    (src / "pytorch_model.bin").write_bytes(b"\x80\x04not really a pickle")
    rc, out, err = cli("models", "import", str(src), "--name", "x")
    assert rc == 2 and "pytorch_model.bin" in err
    assert not (tmp_path / "h" / "models" / "x").exists()


def test_unknown_model_and_missing_model_errors(tmp_path, monkeypatch, cli):
    monkeypatch.setenv("LONGLENS_HOME", str(tmp_path / "h"))
    rc, _, err = cli("index", str(tmp_path), "--model", "blip-itm-base-coco")
    assert rc == 2
    assert "longlens models pull blip-itm-base-coco" in err or "models import" in err
    rc, _, err = cli("search", "hello", "--model", "no-such-model")
    assert rc == 2 and "no-such-model" in err


def test_bad_date_filter_is_explained(home, cli):
    rc, _, err = cli("search", "a dog", "--after", "yesterday")
    assert rc == 2 and "the 'after' date must be a date like 2024-05-31" in err


def test_demo_without_sceneworld_model_says_untrained(tmp_path, monkeypatch, capsys):
    import engine.sample_collection

    monkeypatch.setenv("LONGLENS_HOME", str(tmp_path / "h"))
    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.setattr(engine.sample_collection, "sceneworld_model_available", lambda paths: False)
    assert cli_main(["demo", "--no-gui"]) == 0
    out = capsys.readouterr().out
    assert "RANDOM, UNTRAINED" in out
    ranked = [line for line in out.splitlines() if line.strip().startswith(("1 ", "2 ", "3 ", "4 ", "5 "))]
    assert len(ranked) == 5
    assert all((tmp_path / "h" / "data" / "demo-photos").as_posix() in line for line in ranked)
    # A second run finds everything unchanged.
    assert cli_main(["demo", "--no-gui"]) == 0
    assert "0 new, 48 unchanged" in capsys.readouterr().out


def test_demo_with_sceneworld_mini_finds_the_described_scene(tmp_path, monkeypatch, capsys):
    import engine.sample_collection

    if not engine.sample_collection.sceneworld_model_available(engine.config.get_paths(tmp_path / "h")):
        pytest.skip("sceneworld-mini is not shipped in this checkout")
    monkeypatch.setenv("LONGLENS_HOME", str(tmp_path / "h"))
    monkeypatch.delenv("DISPLAY", raising=False)
    assert cli_main(["demo", "--no-gui"]) == 0
    out = capsys.readouterr().out
    assert "understands SceneWorld pictures only" in out
    assert f"indexed: {engine.sample_collection.SCENEWORLD_DEMO_SIZE} new" in out
    ranked = [line for line in out.splitlines() if line.strip()[:2].strip().isdigit()]
    assert len(ranked) == 5
    # The query is the paragraph of one scene of the collection: the model must rank it in the top 5.
    assert any("<- the described scene" in line for line in ranked)


def test_eval_sceneworld_json(tmp_path, monkeypatch, cli):
    import engine.sample_collection

    if not engine.sample_collection.sceneworld_model_available(engine.config.get_paths(tmp_path / "h")):
        pytest.skip("sceneworld-mini is not shipped in this checkout")
    monkeypatch.setenv("LONGLENS_HOME", str(tmp_path / "h"))
    got = cli.json("eval", "sceneworld", "--split", "long", "--seed", "1234", "--n", "40")
    assert {"benchmark", "split", "seed", "n_images", "i2t", "t2i"} <= set(got)
    assert (got["benchmark"], got["split"], got["seed"], got["n_images"]) == ("sceneworld", "long", 1234, 40)
    for d in ("i2t", "t2i"):
        assert set(got[d]) == {"R@1", "R@5", "R@10"}
        assert all(0.0 <= v <= 1.0 for v in got[d].values())
        assert got[d]["R@1"] <= got[d]["R@5"] <= got[d]["R@10"]
    # Training seeds are refused for evaluation.
    rc, _, err = cli("eval", "sceneworld", "--seed", "0", "--n", "10")
    assert rc == 2 and "1000" in err
