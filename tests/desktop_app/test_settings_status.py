"""Settings and status, seen in a real window (issue 20, item 7): only the devices this machine
has, plain words for the query reader, one model description, stale errors cleared, a removed
folder's pictures gone from the grid."""

from __future__ import annotations

import json
import re
import shutil

from PySide6.QtWidgets import QLabel, QMessageBox

from desktop_app.dialogs import messages
from desktop_app.dialogs.models_dialog import ModelsDialog
from desktop_app.dialogs.settings_dialog import QUERY_READER_LABEL, SettingsDialog
from desktop_app.facade import LonglensError
from desktop_app.views.search_view import READY_TEXT
from tests.desktop_app.conftest import WAIT_MS, index_folder, settle


def _no_gpus(monkeypatch, cuda: bool = False, mps: bool = False) -> None:
    import torch

    from engine.models import device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(device, "_mps_available", lambda: mps)


def _devices(qtbot, window) -> tuple[SettingsDialog, list[str]]:
    dlg = SettingsDialog(window.backend, window.hub, window)
    qtbot.addWidget(dlg)
    settle(qtbot, dlg._devices_job)
    settle(qtbot, dlg._models_job)
    return dlg, [dlg.device.itemData(i) for i in range(dlg.device.count())]


def test_settings_offer_only_the_devices_this_machine_has(qtbot, window, monkeypatch, paths):
    _no_gpus(monkeypatch)
    dlg, offered = _devices(qtbot, window)
    assert offered == ["auto", "cpu"]
    labels = [dlg.device.itemText(i) for i in range(dlg.device.count())]
    assert not [t for t in labels if "CUDA" in t or "MPS" in t]
    dlg.reject()
    _no_gpus(monkeypatch, cuda=True)
    dlg, offered = _devices(qtbot, window)
    assert offered == ["auto", "cuda", "cpu"]
    dlg.reject()
    # A saved device this machine lacks (a settings file from another computer) is kept and said so.
    window.backend.save_settings({"device": "mps"})
    _no_gpus(monkeypatch)
    dlg, offered = _devices(qtbot, window)
    assert offered == ["auto", "cpu", "mps"]
    assert dlg.device.currentData() == "mps" and "not available on this computer" in dlg.device.currentText()
    dlg.accept()
    assert json.loads((paths.config / "settings.json").read_text(encoding="utf-8"))["device"] == "mps"


def test_the_query_reader_is_named_by_what_it_does(qtbot, window, tmp_path, paths, monkeypatch):
    _no_gpus(monkeypatch)
    dlg, _ = _devices(qtbot, window)
    texts = [w.text() for w in dlg.findChildren(QLabel)]
    assert QUERY_READER_LABEL in texts
    assert not [t for t in texts if "tower" in t.lower()]
    assert "tower" not in dlg.tower.placeholderText().lower()
    label = next(w for w in dlg.findChildren(QLabel) if w.text() == QUERY_READER_LABEL)
    assert "paragraph" in label.toolTip() and label.toolTip() == dlg.tower.toolTip()
    reader = tmp_path / "reader"
    reader.mkdir()
    dlg.tower.setText(str(reader))
    dlg.accept()
    # The settings key is unchanged: the CLI and older settings files still read it.
    assert json.loads((paths.config / "settings.json").read_text(encoding="utf-8"))["text_tower"] == str(reader)


def test_the_sceneworld_mini_description_is_said_once(qtbot, window):
    dlg = ModelsDialog(window.backend, window.hub, window)
    qtbot.addWidget(dlg)
    settle(qtbot, dlg.last_job)
    row = dlg.row_of("sceneworld-mini")
    assert row >= 0
    desc = dlg.table.item(row, 3).text()
    assert desc.lower().count("real photos need a blip model") == 1, desc
    assert not re.search(r"\b[A-Z]{4,}\b(?: \b[A-Z]{2,}\b)+", desc), desc  # nothing shouted in capitals
    assert "SceneWorld" in desc
    # A notice the description does not make is still shown, once, in sentence case.
    tiny = dlg.models[dlg.row_of("tiny")]
    from dataclasses import replace

    from desktop_app.dialogs.models_dialog import description_text

    text = description_text(replace(tiny, notice="random, untrained weights: rankings are meaningless"))
    assert text.startswith("Random, untrained weights: rankings are meaningless.") and text.count("meaningless") == 1


def test_a_stale_error_is_cleared_by_the_next_action_that_works(qtbot, window, photos, monkeypatch):
    view = window.search_view
    # The search view: "type a description first", then typing a query (the model reads it).
    assert view.run_text_query("   ") is None
    assert view.status_is_error and "Type a description" in view.status.text()
    view.editor.setPlainText("a red ball")
    qtbot.waitUntil(lambda: view.status.text() == READY_TEXT, timeout=WAIT_MS)
    assert not view.status_is_error and view.status.styleSheet() == ""
    # A failed search stays while nothing else happens, and goes once a folder is indexed.
    real = window.backend.search_text

    def broken(*args, **kwargs):
        raise LonglensError("the model 'x' is not installed")

    monkeypatch.setattr(window.backend, "search_text", broken)
    settle(qtbot, view.search())
    assert view.status_is_error and "not installed" in view.status.text()
    monkeypatch.setattr(window.backend, "search_text", real)
    index_folder(qtbot, window, photos)
    assert not view.status_is_error and view.status.text() == READY_TEXT
    # The status bar: a failed indexing run stays until something works (here, settings saved).

    def failing_job(root):
        def job(token):
            raise LonglensError(f"cannot read {root}")
            yield  # pragma: no cover - a generator that fails at once

        return job

    monkeypatch.setattr(window.backend, "index_job", failing_job)
    with qtbot.waitSignal(window.queue.finished, timeout=WAIT_MS):
        window.queue.enqueue(str(photos))
    assert window.statusBar().currentMessage().startswith(f"Indexing {photos} failed")
    for box in window.findChildren(QMessageBox, messages.ERROR_OBJECT_NAME):
        box.close()
    dlg = window.open_settings()
    settle(qtbot, dlg._models_job)
    dlg.accept()
    assert window.statusBar().currentMessage() == ""


def test_a_removed_folders_pictures_leave_the_grid(qtbot, window, photos, tmp_path, monkeypatch):
    other = tmp_path / "other"
    shutil.copytree(photos / "2023 summer", other)
    index_folder(qtbot, window, photos)
    index_folder(qtbot, window, other)
    view = window.search_view
    settle(qtbot, view.run_text_query("a red ball"))
    shown = {h.path for h in view.model.hits()}
    assert any(p.startswith(str(other.resolve())) for p in shown)
    lib = window.library_view
    row = next(i for i, info in enumerate(lib.infos) if info.root == str(other.resolve()))
    lib.list.setCurrentRow(row)
    monkeypatch.setattr(messages, "confirm", lambda *a: True)
    lib.remove_selected()
    qtbot.waitUntil(lambda: len(lib.infos) == 1, timeout=WAIT_MS)
    assert not [h for h in view.model.hits() if h.path.startswith(str(other.resolve()) + "/")]
    settle(qtbot, view.search_job)  # searched again: the count is that of what is left
    hits = view.model.hits()
    assert hits and all(h.path.startswith(str(photos.resolve()) + "/") for h in hits)
    assert view.status.text().startswith(f"{len(hits)} results")
