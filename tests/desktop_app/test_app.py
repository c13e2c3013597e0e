"""Start-up and seams: single instance, `longlens gui`, `longlens demo`, first run, no engine logic here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from PySide6.QtWidgets import QMessageBox

from desktop_app import app as app_module
from desktop_app.main_window import MainWindow
from tests.desktop_app.conftest import WAIT_MS, settle

DESKTOP_APP = Path(__file__).resolve().parents[2] / "desktop_app"


def test_views_reach_the_engine_only_through_the_facade():
    offenders = []
    for py in DESKTOP_APP.rglob("*.py"):
        if py.name in ("facade.py", "background.py"):
            continue
        text = py.read_text(encoding="utf-8")
        if re.search(r"^\s*(from|import)\s+engine\b", text, re.MULTILINE):
            offenders.append(py.relative_to(DESKTOP_APP).as_posix())
    assert offenders == []


def test_second_instance_on_the_same_catalog_is_refused(paths, monkeypatch):
    first = app_module.acquire_instance_lock(paths.data)
    try:
        with pytest.raises(app_module.AlreadyRunning, match="already running on this catalog"):
            app_module.acquire_instance_lock(paths.data)
        shown = []
        monkeypatch.setattr(QMessageBox, "critical", lambda _p, title, text: shown.append((title, text)))
        assert app_module.main([]) == 3
        assert shown and "already running" in shown[0][1]
    finally:
        first.unlock()
    # Once the first instance is gone, a new one may start.
    again = app_module.acquire_instance_lock(paths.data)
    again.unlock()


def test_newer_catalog_is_refused_with_a_message(paths, monkeypatch):
    import sqlite3

    from engine.catalog import Catalog

    Catalog(paths.catalog).close()
    con = sqlite3.connect(paths.catalog)
    con.execute("PRAGMA user_version=99")
    con.commit()
    con.close()
    shown = []
    monkeypatch.setattr(QMessageBox, "critical", lambda _p, title, text: shown.append(text))
    assert app_module.main([]) == 2
    assert "newer Longlens" in shown[0]


def test_longlens_gui_runs_the_app_module(monkeypatch):
    from engine.cli import main as cli_main

    seen = []
    monkeypatch.setattr(app_module, "main", lambda argv=None: seen.append(list(argv)) or 7)
    assert cli_main(["gui", "--model", "tiny", "--query", "a red door"]) == 7
    assert seen == [["--model", "tiny", "--query", "a red door"]]


def _without_bundled_model(monkeypatch, paths) -> None:
    """Simulate a build that does not ship sceneworld-mini (the random-model fallback path)."""
    from engine.models import registry

    monkeypatch.setattr(registry, "bundled_model_dir", lambda name: paths.data / "not-shipped")


def test_demo_opens_the_gui_when_a_display_is_there(monkeypatch, paths, blip_tiny_checkpoint, photos, capsys):
    import engine.cli.common
    import engine.cli.demo
    import engine.sample_collection
    from engine.models.download import import_model

    _without_bundled_model(monkeypatch, paths)
    monkeypatch.setattr(engine.sample_collection, "ensure_demo_model",
                        lambda p: import_model(blip_tiny_checkpoint, engine.sample_collection.FALLBACK_DEMO_MODEL, p) and engine.sample_collection.FALLBACK_DEMO_MODEL)
    monkeypatch.setattr(engine.sample_collection, "ensure_demo_photos", lambda p: photos)
    launched = []
    monkeypatch.setattr(engine.cli.common, "launch_gui", lambda argv=(): launched.append(list(argv)) or 0)
    monkeypatch.setenv("DISPLAY", ":99")
    import tqdm

    monkeypatch.setattr(tqdm.tqdm, "monitor_interval", 0)  # no process-wide tqdm monitor thread
    assert engine.cli.demo.run_demo(paths, no_gui=False, out=__import__("sys").stdout) == 0
    out = capsys.readouterr().out
    assert "RANDOM, UNTRAINED" in out and "opening the desktop app" in out
    assert launched and launched[0][:2] == ["--model", engine.sample_collection.FALLBACK_DEMO_MODEL]
    assert "--query" in launched[0]


def test_first_run_offers_the_demo_collection(qtbot, paths, hub, blip_tiny_checkpoint, photos, monkeypatch):
    """No model, no library: the window says so and the demo button sets everything up."""
    from desktop_app.facade import Backend
    from engine.models.download import import_model
    from engine.sample_collection import FALLBACK_DEMO_MODEL

    _without_bundled_model(monkeypatch, paths)
    backend = Backend(paths)
    try:
        def demo_setup() -> str:  # the real one generates 48 pictures; same steps, smaller
            import_model(blip_tiny_checkpoint, FALLBACK_DEMO_MODEL, paths)
            backend.save_settings({"default_model": FALLBACK_DEMO_MODEL})
            return str(photos)

        monkeypatch.setattr(backend, "demo_setup", demo_setup)
        w = MainWindow(backend, hub)
        qtbot.addWidget(w)
        w.show()
        qtbot.waitUntil(lambda: w.search_view.stack.currentWidget() is w.search_view.welcome)
        qtbot.waitUntil(lambda: "No model ready" in w.model_label.text())
        with qtbot.waitSignal(w.search_view.results_shown, timeout=WAIT_MS):
            w.search_view.welcome_demo.click()
        assert w.search_view.model.rowCount() == 12
        assert w.search_view.stack.currentWidget() is w.search_view.grid
        qtbot.waitUntil(lambda: "untrained" in w.model_label.text())
        assert FALLBACK_DEMO_MODEL in w.model_label.text()
        w.close()
    finally:
        backend.close()


def test_initial_query_runs_on_start(qtbot, backend, hub, photos):
    w = MainWindow(backend, hub, initial_query="A wooden bench under a tree.")
    qtbot.addWidget(w)
    w.show()
    qtbot.waitUntil(lambda: w.search_view.search_job is not None)
    settle(qtbot, w.search_view.search_job)
    assert w.search_view.editor.toPlainText() == "A wooden bench under a tree."
    assert "tokens read" in w.search_view.status.text()
