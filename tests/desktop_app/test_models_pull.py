"""The Models dialog pulls a fully pinned model without any question, from a hub on loopback
(tests/fake_hub.py); for a model listing unpinned files it asks in its own words, never with a flag."""

from __future__ import annotations

import pytest
from PySide6.QtWidgets import QMessageBox

from desktop_app.dialogs import messages
from engine.models import registry
from engine.models.registry import installed_model_dir, verify_model
from tests.desktop_app.conftest import settle
from tests.fake_hub import files_for_spec, pinned_like, publish, running_hub

NAME = "blip-itm-base-coco"


@pytest.fixture
def pinned_base(monkeypatch, blip_tiny_checkpoint):
    """blip-itm-base-coco registered with every file pinned to stand-ins served on loopback."""
    real = registry.get_spec(NAME)
    with running_hub(monkeypatch) as hub:
        served = files_for_spec(real, blip_tiny_checkpoint)
        spec = pinned_like(real, served)
        publish(hub, spec, served)
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        registry.register_model(spec)
        try:
            yield spec
        finally:
            registry.register_model(real)


def test_a_fully_pinned_model_downloads_without_a_trust_box(qtbot, window, paths, pinned_base):
    dlg = window.open_models()
    settle(qtbot, dlg.last_job)
    dlg.select(NAME)
    assert dlg.pull_button.isEnabled()
    assert not dlg.trust.isVisible() and not dlg.trust_needed()
    job = dlg.pull_selected()
    # What the status line says after each progress report (the dialog's own slot runs first).
    seen: list[str] = []
    job.progress.connect(lambda _p: seen.append(dlg.status.text()))
    settle(qtbot, job)
    settle(qtbot, dlg.last_job)
    seen.append(dlg.status.text())
    assert not dlg.findChildren(QMessageBox, messages.ERROR_OBJECT_NAME), seen
    assert installed_model_dir(NAME, paths) is not None and verify_model(NAME, paths).ok
    assert dlg.models[dlg.row_of(NAME)].installed
    assert seen[-1] == f"{NAME} is installed and verified."
    summary = next(t.split(" · ")[0] for t in seen if t.startswith(f"{NAME}: {len(pinned_base.files)} files"))
    assert "to download" in summary
    # The sizes stay in view above each file's progress: done of total, rate, time left.
    # Every download line the GUI got, however few: the job thread passes ~20 a second, and a pull
    # from loopback can be done within one 50 ms window (then only the first line is shown).
    later = [t for t in seen if t.startswith(summary + " · ")]
    assert later and all(" of " in t for t in later), seen
    assert not any("--" in t for t in seen)


def test_unpinned_files_are_asked_about_in_the_window_without_naming_a_flag(qtbot, window):
    real = registry.get_spec(NAME)
    assert real.unpinned_files  # blob ids for its config and tokenizer files are not known yet
    dlg = window.open_models()
    settle(qtbot, dlg.last_job)
    dlg.select(NAME)
    assert dlg.trust.isVisible() and dlg.trust_needed()
    assert all(f in dlg.trust.text() for f in real.unpinned_files) and "--" not in dlg.trust.text()
    assert dlg.pull_selected() is None  # not ticked: nothing starts
    assert "Tick the box" in dlg.status.text() and "--" not in dlg.status.text()
    assert dlg.pull is None and dlg.pull_button.isEnabled()

    dlg.select("tiny")  # an imported model: nothing to pull, nothing to trust
    assert not dlg.trust.isVisible()
