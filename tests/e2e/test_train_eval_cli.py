"""`longlens train` (validate, cache, train, resume guard) and `longlens eval` (benchmarks, compare,
truncation report, grounding hook) through the real CLI on real files, with a tiny BLIP and a
tiny sceneworld-mini."""

from __future__ import annotations

import json
import os
import signal
import sys
import types
from pathlib import Path

import pytest
import torch

from engine.sceneworld.export import write_coco_layout, write_docci_layout, write_training_jsonl
from tests.e2e.conftest import TINY_MODEL

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: tiny models, one torch thread


@pytest.fixture
def data(tmp_path) -> Path:
    """24 valid lines plus one malformed line (line 25)."""
    path = write_training_jsonl(tmp_path / "data" / "train.jsonl", tmp_path / "data" / "images", seed=7, n=24,
                                size=64)
    with open(path, "a", encoding="utf-8") as fh:
        fh.write('{"image": "images/missing.png", "original_caption": "nothing"}\n')
    return path


@pytest.fixture
def mini_dir(tmp_path) -> Path:
    from engine.backends.sceneworld_mini.network import SceneWorldMini, save_model
    from tests.engine.test_trainer import TINY

    torch.manual_seed(0)
    return save_model(SceneWorldMini(TINY), tmp_path / "mini-base")


def test_validate_reports_lines_and_exit_codes(home, cli, data):
    rc, out, _ = cli("train", "validate", str(data))
    assert rc == 1
    assert f"{data}:25: error: image: file not found" in out
    assert "25 lines, 24 usable, 1 would be skipped" in out
    report = json.loads(cli("train", "validate", str(data), "--json")[1])
    assert report["skipped_lines"] == [25] and report["valid"] == 24
    good = data.with_name("good.jsonl")
    good.write_text("".join(data.read_text().splitlines(keepends=True)[:24]))
    assert cli("train", "validate", str(good), "--config", "C7")[0] == 0
    # --strict: warnings fail too (one line with 4 hard negatives).
    rows = [json.loads(x) for x in good.read_text().splitlines()]
    rows[0]["negatives"] = rows[0]["negatives"][:4]
    good.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert cli("train", "validate", str(good))[0] == 0
    rc, out, _ = cli("train", "validate", str(good), "--strict")
    assert rc == 1 and ":1: warning: negatives: 4 given" in out


def test_cache_train_and_evaluate_with_blip(home, cli, data, tmp_path):
    cache = tmp_path / "cache"
    first = cli.json("train", "cache", "--data", str(data), "--base", TINY_MODEL, "--out", str(cache))
    assert (first["added"], first["reused"], first["failed"]) == (24, 0, [])
    out = tmp_path / "run"
    args = ["train", "--config", "C5", "--data", str(data), "--base", TINY_MODEL, "--out", str(out),
            "--cache", str(cache), "--epochs", "2", "--batch-size", "8", "--lr", "1e-3", "--warmup-steps", "1",
            "--seed", "3"]
    summary = cli.json(*args)
    assert summary["skipped_lines"] == 1 and summary["examples"] == 24 and summary["steps"] == 6
    assert summary["cache_added"] == 0  # everything came from the cache
    assert summary["cancelled"] is False and summary["fingerprint"]["config"]["name"] == "C5"
    assert len((out / "history.jsonl").read_text().splitlines()) == 6
    assert (out / "text_tower.safetensors").is_file() and (out / "checkpoint" / "state.pt").is_file()
    # The same command again must not silently overwrite the run.
    rc, _, err = cli(*args)
    assert rc == 2 and "--resume" in err
    # --resume with another configuration is refused.
    rc, _, err = cli(*[a if a != "C5" else "C4" for a in args], "--resume")
    assert rc == 2 and "different config" in err

    # Evaluate the base and the trained tower side by side on a COCO-layout set, with a truncation report.
    root = tmp_path / "coco"
    write_coco_layout(root, seed=1004, n=6, size=64)
    rep = cli.json("eval", "coco", "--root", str(root), "--model", TINY_MODEL, "--compare", f"{TINY_MODEL}@{out}",
                   "--truncation", "--budgets", "8,16,32", "--out", str(tmp_path / "report"))
    assert [r["model"] for r in rep["results"]] == [TINY_MODEL, f"{TINY_MODEL}+C5"]
    assert rep["n_images"] == 6 and rep["n_texts"] == 30 and rep["results"][0]["max_tokens"] == 77
    assert set(rep["truncation"]) == {TINY_MODEL, f"{TINY_MODEL}+C5"}
    assert [r["max_tokens"] for r in rep["truncation"][TINY_MODEL]] == [8, 16, 32]
    for name in ("report.json", "report.md", "truncation.png"):
        assert (tmp_path / "report" / name).is_file()
    # The base's image embeddings are shared, the text tower is not: the rows differ.
    assert rep["results"][0]["t2i"] != rep["results"][1]["t2i"] or rep["results"][0]["i2t"] != rep["results"][1]["i2t"]


def test_strict_training_aborts_on_a_bad_line(home, cli, data, tmp_path):
    rc, _, err = cli("train", "--config", "C1", "--data", str(data), "--base", TINY_MODEL, "--out",
                     str(tmp_path / "run"), "--strict", "--batch-size", "8")
    assert rc == 2 and f"{data}:25: error: image" in err
    assert not (tmp_path / "run").exists()


def test_missing_train_options_are_named(home, cli):
    rc, _, err = cli("train", "--config", "C5")
    assert rc == 2 and "--data, --base, --out" in err


def test_train_a_sceneworld_mini_folder_and_evaluate_it(home, cli, data, mini_dir, tmp_path):
    from engine.backends.sceneworld_mini.embedder import SceneWorldMiniEmbedder

    out = tmp_path / "mini-run"
    summary = cli.json("train", "--config", "C4", "--data", str(data), "--base", str(mini_dir), "--out", str(out),
                       "--epochs", "1", "--batch-size", "8", "--lr", "1e-3")
    assert summary["steps"] == 3 and summary["examples"] == 24
    # Default cache: under the Longlens cache, named after the folder plus a hash of its path.
    cache = Path(summary["cache"])
    assert cache.parent == home / "cache" / "train-embeddings" and cache.name.startswith("mini-base-")
    emb = SceneWorldMiniEmbedder(mini_dir, device="cpu", text_tower_dir=out)
    assert emb.text_model_id == "sceneworld-mini+C4"
    # Legacy SceneWorld evaluation output, with a model folder and a text tower.
    got = cli.json("eval", "sceneworld", "--model", str(mini_dir), "--text-tower", str(out), "--n", "8",
                   "--seed", "1001")
    assert set(got) == {"benchmark", "split", "seed", "n_images", "model", "max_tokens", "i2t", "t2i"}
    assert (got["split"], got["n_images"], got["model"], got["max_tokens"]) == ("long", 8, "mini-base+C4", 128)


def test_eval_docci_and_sharegpt4v_budgets(home, cli, tmp_path):
    root = tmp_path / "docci"
    write_docci_layout(root, seed=1005, n=5, size=64)
    got = cli.json("eval", "docci", "--root", str(root), "--model", TINY_MODEL)
    assert got["results"][0]["max_tokens"] == 128 and got["n_texts"] == 5
    rows = [json.loads(x) for x in (root / "docci_descriptions.jsonlines").read_text().splitlines()]
    share = [{"image": f"images/{r['image_file']}",
              "conversations": [{"from": "human", "value": "<image>"}, {"from": "gpt", "value": r["description"]}]}
             for r in rows]
    (root / "sharegpt4v.json").write_text(json.dumps(share))
    main = cli.json("eval", "sharegpt4v", "--root", str(root), "--model", TINY_MODEL)
    long = cli.json("eval", "sharegpt4v", "--root", str(root), "--model", TINY_MODEL, "--max-tokens", "128")
    assert main["results"][0]["max_tokens"] == 77 and long["results"][0]["max_tokens"] == 128
    rc, out, _ = cli("eval", "docci", "--root", str(root), "--model", TINY_MODEL)
    assert rc == 0 and "| model | tokens | truncated | I2T R@1" in out
    rc, _, err = cli("eval", "flickr30k", "--root", str(tmp_path / "nowhere"), "--model", TINY_MODEL)
    assert rc == 2 and "dataset_flickr30k.json" in err


def test_eval_grounding_calls_the_grounding_module(home, cli, monkeypatch, mini_dir):
    calls = []

    def fake(embedder, *, seed, n):
        calls.append((embedder.model_id, seed, n))
        return {"pointing_accuracy": 0.5, "n": n}

    module = types.ModuleType("engine.evaluation.grounding_benchmark")
    module.evaluate_grounding = fake
    monkeypatch.setitem(sys.modules, "engine.evaluation.grounding_benchmark", module)
    got = cli.json("eval", "grounding", "--model", str(mini_dir), "--seed", "1007", "--n", "3")
    assert got == {"pointing_accuracy": 0.5, "n": 3} and calls == [("mini-base", 1007, 3)]
    monkeypatch.setitem(sys.modules, "engine.evaluation.grounding_benchmark", None)  # import now fails
    rc, _, err = cli("eval", "grounding", "--model", str(mini_dir))
    assert rc == 2 and "grounding evaluation is not available" in err


def test_ctrl_c_asks_the_job_to_stop_instead_of_killing_it():
    from engine.cli.training import run_training_job as _drive
    from engine.jobs import Progress

    def job(token):
        for i in range(5):
            if token.cancelled:
                yield Progress("done", i, 5, extra={"cancelled": True})
                return
            if i == 2:
                os.kill(os.getpid(), signal.SIGINT)  # as if the user pressed Ctrl+C mid-step
            yield Progress("train", i + 1, 5)
        yield Progress("done", 5, 5)

    previous = signal.getsignal(signal.SIGINT)
    last = _drive(job, quiet=True)
    assert last.extra == {"cancelled": True} and last.done == 3
    assert signal.getsignal(signal.SIGINT) is previous
