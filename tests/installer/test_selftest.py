"""`--self-test`: passes from the source tree, fails with a clear message when something is missing,
and never touches the user's data folder."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from engine.errors import LonglensError
from engine.models import registry
from engine.selftest import SAMPLE_COUNT, SelfTestFailed, read_sample, run_self_test, write_sample

ROOT = Path(__file__).resolve().parents[2]
RESOURCES = ROOT / "resources"

pytestmark = pytest.mark.skipif(
    not (RESOURCES / "models" / "sceneworld-mini" / "model.safetensors").is_file(),
    reason="sceneworld-mini is not shipped in this checkout",
)


@pytest.fixture
def user_home(tmp_path, monkeypatch) -> Path:
    """Where the user's data would be: the self-test must leave it untouched."""
    home = tmp_path / "user-home"
    monkeypatch.setenv("LONGLENS_HOME", str(home))
    return home


def test_self_test_passes_in_process_from_source(user_home, tmp_path):
    keep = tmp_path / "kept"
    report = run_self_test(device="cpu", keep=keep)
    assert report.ok
    assert report.model == "sceneworld-mini" and report.device == "cpu"
    assert report.images_indexed == SAMPLE_COUNT == len(report.checks)
    assert Path(report.model_dir) == RESOURCES / "models" / "sceneworld-mini"
    assert all(c.rank == 1 and c.top_image == c.image for c in report.checks)
    # Everything it wrote is under its own folder: a catalog there, nothing in the user's.
    assert (keep / "data" / "catalog.sqlite3").is_file()
    assert not user_home.exists()
    assert "12/12 paragraphs ranked their picture first" in report.summary()


def test_self_test_cleans_up_its_temporary_folder(user_home, tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    assert run_self_test(device="cpu").ok
    assert list((tmp_path / "tmp").iterdir()) == []
    assert not user_home.exists()


def test_missing_model_fails_clearly(user_home, monkeypatch, tmp_path):
    monkeypatch.setattr(registry, "bundled_model_dir", lambda name: tmp_path / "no-model-here")
    with pytest.raises(SelfTestFailed) as err:
        run_self_test(device="cpu")
    msg = str(err.value)
    assert "sceneworld-mini" in msg and "cannot be loaded" in msg
    assert str(tmp_path / "no-model-here") in msg  # names where it looked
    assert isinstance(err.value, LonglensError)


def test_damaged_model_fails_its_integrity_check(user_home, monkeypatch, tmp_path):
    resources = tmp_path / "resources"
    shutil.copytree(RESOURCES / "models", resources / "models")
    shutil.copytree(RESOURCES / "selftest", resources / "selftest")
    weights = resources / "models" / "sceneworld-mini" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    monkeypatch.setenv(registry.RESOURCES_ENV, str(resources))
    with pytest.raises(SelfTestFailed, match=r"model\.safetensors"):
        run_self_test(device="cpu")


def test_missing_sample_names_the_folder(user_home, tmp_path, monkeypatch):
    monkeypatch.setenv(registry.RESOURCES_ENV, str(tmp_path / "empty"))
    with pytest.raises(SelfTestFailed, match=r"sample is missing.*no selftest\.json in .*empty"):
        run_self_test(device="cpu")


def test_bad_sample_file_names_the_field(tmp_path):
    folder = tmp_path / "sample"
    folder.mkdir()
    (folder / "a.jpg").write_bytes(b"")
    doc = {"format": 1, "model": "sceneworld-mini", "queries": [{"image": "a.jpg", "paragraph": " "}]}
    (folder / "selftest.json").write_text(json.dumps(doc))
    with pytest.raises(SelfTestFailed, match=r"selftest\.json: queries\[0\]\.paragraph"):
        read_sample(folder)
    doc["queries"] = [{"image": "../etc/passwd", "paragraph": "x"}]
    (folder / "selftest.json").write_text(json.dumps(doc))
    with pytest.raises(SelfTestFailed, match=r"queries\[0\]\.image"):
        read_sample(folder)
    (folder / "selftest.json").write_text("{not json")
    with pytest.raises(SelfTestFailed, match="unreadable"):
        read_sample(folder)


def test_wrong_ranking_fails(user_home, tmp_path):
    """A sample whose paragraphs are swapped must fail: the check really compares rankings."""
    sample = tmp_path / "swapped"
    shutil.copytree(RESOURCES / "selftest", sample)
    doc = json.loads((sample / "selftest.json").read_text())
    q = doc["queries"]
    q[0]["paragraph"], q[1]["paragraph"] = q[1]["paragraph"], q[0]["paragraph"]
    (sample / "selftest.json").write_text(json.dumps(doc))
    with pytest.raises(SelfTestFailed, match=r"FAILED.*10/12.*scene_4242_00000\.jpg ranked \d+ \(first: scene_4242_00001\.jpg\)"):
        run_self_test(sample_dir=sample, device="cpu")


def test_shipped_sample_is_what_the_generator_writes(tmp_path):
    """resources/selftest can be regenerated: same paragraphs, same file names."""
    fresh = write_sample(tmp_path / "fresh")
    shipped_model, shipped = read_sample(RESOURCES / "selftest")
    fresh_model, regenerated = read_sample(fresh)
    assert shipped == regenerated and shipped_model == fresh_model == "sceneworld-mini"


def _run(args: list[str], env_extra: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "LONGLENS_HOME": str(tmp_path / "user-home"),
           **env_extra}
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


def test_desktop_app_self_test_flag_passes_with_the_real_window(tmp_path):
    done = _run(["-m", "desktop_app", "--self-test"], {}, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "self-test passed" in done.stdout
    assert "gui: window search ranked scene_4242_00000.jpg first" in done.stdout
    assert not (tmp_path / "user-home").exists()


def test_longlens_gui_self_test_fails_with_exit_1_and_a_message(tmp_path):
    done = _run(["-m", "engine", "gui", "--self-test"], {"LONGLENS_RESOURCES": str(tmp_path / "nothing")}, tmp_path)
    assert done.returncode == 1
    assert "longlens self-test FAILED" in done.stderr and "no selftest.json" in done.stderr
    assert not (tmp_path / "user-home").exists()
