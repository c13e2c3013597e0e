"""Finding bundled resources in each layout (source tree, frozen app, installed wheel), and the
frozen app's entry point sending each command line to the app or the CLI."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from engine.models import registry

ROOT = Path(__file__).resolve().parents[2]


def test_source_tree_is_found_by_default(monkeypatch):
    monkeypatch.delenv(registry.RESOURCES_ENV, raising=False)
    monkeypatch.delattr(sys, "_MEIPASS", raising=False)
    assert registry.bundled_model_dir("sceneworld-mini") == ROOT / "resources" / "models" / "sceneworld-mini"


def test_frozen_app_looks_under_meipass_first(monkeypatch, tmp_path):
    monkeypatch.delenv(registry.RESOURCES_ENV, raising=False)
    frozen = tmp_path / "_internal"
    (frozen / "resources" / "models" / "sceneworld-mini").mkdir(parents=True)
    monkeypatch.setattr(sys, "_MEIPASS", str(frozen), raising=False)
    assert registry.resource_roots()[0] == frozen / "resources"
    assert registry.bundled_model_dir("sceneworld-mini") == frozen / "resources" / "models" / "sceneworld-mini"
    # Something the bundle lacks is taken from the next layout that has it.
    assert registry.find_resource("selftest") == ROOT / "resources" / "selftest"
    # Nothing has it: the path names the frozen app's folder, where it should have been.
    assert registry.find_resource("models/nope") == frozen / "resources" / "models" / "nope"


def test_installed_wheel_data_folder_is_a_fallback(monkeypatch, tmp_path):
    monkeypatch.delenv(registry.RESOURCES_ENV, raising=False)
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "venv"))
    roots = registry.resource_roots()
    assert roots[-1] == tmp_path / "venv" / "share" / "longlens" / "resources"
    wheel_only = roots[-1] / "models" / "only-in-wheel"
    wheel_only.mkdir(parents=True)
    assert registry.bundled_model_dir("only-in-wheel") == wheel_only


def test_explicit_resources_folder_overrides_everything(monkeypatch, tmp_path):
    monkeypatch.setenv(registry.RESOURCES_ENV, str(tmp_path / "mine"))
    assert registry.resource_roots() == [tmp_path / "mine"]
    assert registry.bundled_model_dir("sceneworld-mini") == tmp_path / "mine" / "models" / "sceneworld-mini"


@pytest.fixture(scope="module")
def entry():
    spec = importlib.util.spec_from_file_location("longlens_entry", ROOT / "installer" / "longlens_entry.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("argv", "expected"), [
    ([], ("app", [])),
    (["--self-test"], ("app", ["--self-test"])),
    (["gui", "--self-test"], ("app", ["--self-test"])),
    (["--home", "/d", "gui", "--query", "x"], ("app", ["--home", "/d", "--query", "x"])),
    (["--home", "/d"], ("app", ["--home", "/d"])),
    (["--query", "a red door"], ("app", ["--query", "a red door"])),
    (["models", "import", "/m", "--name", "blip"], ("cli", ["models", "import", "/m", "--name", "blip"])),
    (["--home", "/d", "paths"], ("cli", ["--home", "/d", "paths"])),
    (["--help"], ("cli", ["--help"])),
])
def test_entry_point_routes_to_app_or_cli(entry, argv, expected):
    assert entry.route(argv) == expected


def test_entry_point_runs_the_cli(entry, capsys, tmp_path):
    assert entry.main(["--home", str(tmp_path), "paths", "--json"]) == 0
    assert str(tmp_path) in capsys.readouterr().out
