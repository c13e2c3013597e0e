"""`longlens datagen` through the real CLI: kill -9 in the middle of a run and resume, the SceneWorld
mode, input errors, and a generated file that `longlens train validate` and `longlens train` accept."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from engine.cli import main as cli_main
from engine.datagen.fake_server import DefaultAnswers
from engine.training.configs import load_config
from engine.training.data import read_training_jsonl

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def longlens_home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("LONGLENS_HOME", str(home))
    return home


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = cli_main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def _lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def test_kill_9_mid_run_then_resume_gives_every_image_once(serve, photos, tmp_path, capsys):
    # 16 distinct image files: the 8 samples and a copy of each under another name.
    for p in sorted(x for x in photos.rglob("*") if x.is_file()):
        shutil.copy(p, p.with_name(f"copy_{p.name}"))
    out = tmp_path / "gen" / "data.jsonl"
    gate = threading.Event()
    answers = DefaultAnswers()

    def responder(task, body):
        # Once two lines are on disk every answer hangs, so the process is surely mid-run when killed.
        if _lines(out) >= 2:
            gate.wait(60)
        return answers(task, body)

    srv = serve(responder=responder)
    args = ["datagen", "--images", str(photos), "--endpoint", srv.url, "--generator", "g", "--scorer", "s",
            "--out", str(out), "--concurrency", "3", "--quiet"]
    proc = subprocess.Popen([sys.executable, "-m", "engine", *args], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        deadline = time.monotonic() + 120
        while _lines(out) < 2 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, proc.communicate()[1].decode()
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(30) == -signal.SIGKILL
    finally:
        gate.set()
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    before = out.read_bytes()
    n_before = before.count(b"\n")
    assert 2 <= n_before < 16 and before.endswith(b"\n")
    # What a kill during the write of a line would leave: a line without its end.
    with open(out, "ab") as fh:
        fh.write(b'{"image": "../photos/copy_sample_00')

    rc, stdout, err = run_cli(capsys, *args, "--json")
    assert rc == 0, err
    summary = json.loads(stdout)
    assert summary["already_done"] == n_before and summary["written"] == 16 - n_before
    assert summary["torn_bytes_removed"] == len(b'{"image": "../photos/copy_sample_00') and summary["failed"] == []
    data = out.read_bytes()
    assert data.startswith(before) and data.endswith(b"\n")
    rows = [json.loads(x) for x in data.decode().splitlines()]  # every line is whole JSON
    images = [r["image"] for r in rows]
    assert len(images) == len(set(images)) == 16
    assert read_training_jsonl(out, load_config("C10"), strict=True).warnings == []
    # A third run has nothing left to do and asks the endpoint nothing.
    served = len(srv.requests())
    rc, stdout, _ = run_cli(capsys, *args, "--json")
    assert rc == 0 and json.loads(stdout)["written"] == 0 and len(srv.requests()) == served


def test_ctrl_c_stops_cleanly_and_keeps_finished_lines(serve, photos, tmp_path):
    out = tmp_path / "gen" / "data.jsonl"
    gate = threading.Event()
    answers = DefaultAnswers()

    def responder(task, body):
        if _lines(out) >= 1:
            gate.wait(60)
        return answers(task, body)

    srv = serve(responder=responder)
    proc = subprocess.Popen([sys.executable, "-m", "engine", "datagen", "--images", str(photos), "--endpoint", srv.url,
                             "--generator", "g", "--scorer", "s", "--out", str(out), "--concurrency", "2", "--json"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        deadline = time.monotonic() + 120
        while _lines(out) < 1 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None
        proc.send_signal(signal.SIGINT)
        time.sleep(0.2)  # let the handler run before the held answers arrive (either order must work)
        gate.set()
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        gate.set()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr.decode()
    summary = json.loads(stdout)
    assert summary["cancelled"] is True and 1 <= summary["written"] < 8
    rows = out.read_text().splitlines()
    assert len(rows) == summary["written"] and read_training_jsonl(out).errors == []


@pytest.fixture
def mini_dir(tmp_path) -> Path:
    import torch

    from engine.backends.sceneworld_mini.network import SceneWorldMini, save_model
    from tests.engine.test_trainer import TINY

    torch.manual_seed(0)
    return save_model(SceneWorldMini(TINY), tmp_path / "mini-base")


def test_generated_file_is_accepted_by_train_validate_and_train(serve, photos, tmp_path, capsys, mini_dir):
    srv = serve()
    out = tmp_path / "gen" / "data.jsonl"
    rc, stdout, err = run_cli(capsys, "datagen", "--images", str(photos), "--endpoint", srv.url, "--generator", "g",
                              "--scorer", "s", "--out", str(out), "--quiet")
    assert rc == 0, err
    assert stdout.startswith("finished: 8 written, 0 failed, 0 already done; ")
    rc, stdout, _ = run_cli(capsys, "train", "validate", str(out), "--config", "C10", "--strict")
    assert rc == 0 and "8 lines, 8 usable, 0 would be skipped, 0 errors, 0 warnings" in stdout
    rc, stdout, err = run_cli(capsys, "train", "--config", "C5", "--data", str(out), "--base", str(mini_dir), "--out",
                              str(tmp_path / "run"), "--epochs", "1", "--batch-size", "4", "--lr", "1e-3", "--json")
    assert rc == 0, err
    summary = json.loads(stdout)
    assert (summary["examples"], summary["steps"], summary["skipped_lines"]) == (8, 2, 0)
    assert (tmp_path / "run" / "text_tower.safetensors").is_file()


def test_sceneworld_mode_needs_no_endpoint(tmp_path, capsys):
    out = tmp_path / "sw" / "train.jsonl"
    rc, stdout, err = run_cli(capsys, "datagen", "--sceneworld", "--seed", "4", "--n", "5", "--size", "64",
                              "--out", str(out), "--json")
    assert rc == 0, err
    summary = json.loads(stdout)
    assert (summary["valid"], summary["errors"], summary["warnings"]) == (5, 0, 0)
    data = read_training_jsonl(out, load_config("C10"), strict=True)
    assert len(data.records) == 5 and all(r.paragraph_score == 10.0 for r in data.records)
    assert all(r.image.parent == tmp_path / "sw" / "train_images" for r in data.records)
    from engine.sceneworld import generate_scene

    scene = generate_scene(4, 2)  # the exact ground truth, not generated text
    assert data.records[2].paragraph == scene.paragraph.text
    assert list(data.records[2].negatives) == [t.text for t in scene.negatives]
    rc, _, err = run_cli(capsys, "datagen", "--sceneworld", "--seed", "1000", "--n", "5", "--out", str(out))
    assert rc == 2 and "reserved for evaluation" in err


def test_input_errors_are_clear(tmp_path, photos, capsys):
    out = str(tmp_path / "d.jsonl")
    rc, _, err = run_cli(capsys, "datagen", "--images", str(photos), "--out", out)
    assert rc == 2 and "needs --endpoint, --generator, --scorer" in err
    rc, _, err = run_cli(capsys, "datagen", "--images", str(photos), "--list", "x.txt", "--out", out)
    assert rc == 2 and "exactly one of --images DIR, --list FILE or --sceneworld (got --images, --list)" in err
    lst = tmp_path / "l.csv"
    lst.write_text("picture,caption\nx.jpg,hello\n")
    rc, _, err = run_cli(capsys, "datagen", "--list", str(lst), "--endpoint", "http://127.0.0.1:9", "--generator",
                         "g", "--scorer", "s", "--out", out)
    assert rc == 2 and f"{lst}:1: the header has no 'image' column" in err
    rc, _, err = run_cli(capsys, "datagen", "--images", str(tmp_path / "none"), "--endpoint", "http://127.0.0.1:9",
                         "--generator", "g", "--scorer", "s", "--out", out)
    assert rc == 2 and "is not a folder" in err
    assert not Path(out).exists()  # nothing was started


def test_failed_images_give_exit_code_1_and_are_listed(serve, photos, tmp_path, capsys):
    from engine.datagen.fake_server import Reply

    srv = serve({"positives": [Reply(status=400, raw=b'{"error": "image too large"}')]})
    rc, stdout, _ = run_cli(capsys, "datagen", "--images", str(photos), "--endpoint", srv.url, "--generator", "g",
                            "--scorer", "s", "--out", str(tmp_path / "d.jsonl"), "--concurrency", "1", "--quiet")
    assert rc == 1
    assert "finished: 7 written, 1 failed" in stdout and "HTTP 400" in stdout
    assert "run the same command again to retry the failed images" in stdout
