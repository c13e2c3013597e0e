"""End-to-end fixtures: a Longlens home in a temp folder, a tiny random BLIP installed from disk,
and a folder of real image files in several formats."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from engine.cli import main as cli_main
from engine.config import get_paths

TINY_MODEL = "tiny-blip"


@pytest.fixture
def home(tmp_path, monkeypatch, blip_tiny_checkpoint) -> Path:
    """A fresh LONGLENS_HOME with the tiny model imported through the CLI."""
    h = tmp_path / "home"
    monkeypatch.setenv("LONGLENS_HOME", str(h))
    assert cli_main(["models", "import", str(blip_tiny_checkpoint), "--name", TINY_MODEL]) == 0
    return h


@pytest.fixture(scope="session")
def sample_master(tmp_path_factory) -> Path:
    from engine.samples import make_sample_folder

    folder = tmp_path_factory.mktemp("master") / "photos"
    make_sample_folder(folder, n=24, seed=1)
    return folder


@pytest.fixture
def photos(tmp_path, sample_master) -> Path:
    dest = tmp_path / "photos"
    shutil.copytree(sample_master, dest)
    return dest


class CLI:
    def __init__(self, capsys):
        self.capsys = capsys

    def __call__(self, *args: str) -> tuple[int, str, str]:
        self.capsys.readouterr()
        rc = cli_main(list(args))
        out, err = self.capsys.readouterr()
        return rc, out, err

    def json(self, *args: str):
        rc, out, err = self(*args, "--json")
        assert rc == 0, err
        return json.loads(out)


@pytest.fixture
def cli(capsys) -> CLI:
    return CLI(capsys)


@pytest.fixture
def paths(home):
    return get_paths(home)
