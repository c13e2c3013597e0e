"""Settings (persisted, theme) and the models dialog (list, import, use, pull offline)."""

from __future__ import annotations

import json

from PySide6.QtWidgets import QApplication, QMessageBox

from desktop_app import theme
from desktop_app.dialogs import messages
from desktop_app.dialogs.models_dialog import ModelsDialog
from desktop_app.dialogs.settings_dialog import SettingsDialog
from desktop_app.facade import Backend
from tests.desktop_app.conftest import WAIT_MS, settle


def test_settings_are_saved_and_applied(qtbot, window, paths):
    dlg = window.open_settings()
    settle(qtbot, dlg._models_job)
    assert dlg.model.findData("tiny") >= 0
    dlg.device.setCurrentIndex(dlg.device.findData("cpu"))
    dlg.model.setCurrentIndex(dlg.model.findData("tiny"))
    dlg.batch.setValue(8)
    dlg.workers.setValue(3)
    dlg.cache_mb.setValue(64)
    dlg.max_tokens.setValue(64)
    dlg.top_k.setValue(50)
    dlg.theme.setCurrentIndex(dlg.theme.findData("dark"))
    dlg.accept()
    stored = json.loads((paths.config / "settings.json").read_text(encoding="utf-8"))
    assert stored["device"] == "cpu" and stored["default_model"] == "tiny" and stored["batch_size"] == 8
    assert stored["decode_workers"] == 3 and stored["thumbnail_cache_mb"] == 64 and stored["theme"] == "dark"
    assert theme.is_dark(QApplication.instance())
    assert window.search_view.top_spin.value() == 50
    # A new session reads the same settings; the budget setting reaches the token counter.
    again = Backend(paths)
    try:
        assert again.settings()["max_tokens"] == 64 and again.settings()["device"] == "cpu"
    finally:
        again.close()
    window.search_view.editor.setPlainText("word " * 200)
    qtbot.waitUntil(lambda: window.search_view.token_label.text() == "64 / 64 tokens", timeout=WAIT_MS)
    theme.apply_theme(QApplication.instance(), "light")


def test_bad_text_tower_is_refused(qtbot, window, tmp_path):
    dlg = SettingsDialog(window.backend, window.hub, window)
    settle(qtbot, dlg._models_job)
    dlg.tower.setText(str(tmp_path / "no-such-tower"))
    dlg.accept()
    boxes = dlg.findChildren(QMessageBox, messages.ERROR_OBJECT_NAME)
    assert boxes and "is not a folder" in boxes[0].text()
    assert dlg.isVisible() or dlg.result() == 0


def test_a_query_reader_included_with_a_model_is_chosen_by_name(qtbot, window):
    dlg = SettingsDialog(window.backend, window.hub, window)
    settle(qtbot, dlg._models_job)
    actions = dlg.included.menu().actions()
    assert dlg.included.isEnabled() and any(a.text().startswith("minilm-k6  (with sceneworld-mini") for a in actions)
    next(a for a in actions if a.text().startswith("minilm-k6")).trigger()
    assert dlg.tower.text() == "minilm-k6"
    saved = []
    dlg.saved.connect(saved.append)
    dlg.accept()
    assert saved and saved[0]["text_tower"] == "minilm-k6"
    assert not dlg.findChildren(QMessageBox, messages.ERROR_OBJECT_NAME)


def test_theme_follows_the_system_by_default(qapp):
    assert theme.resolve("system") in ("light", "dark")
    assert theme.apply_theme(qapp, "dark") == "dark" and theme.is_dark(qapp)
    assert theme.apply_theme(qapp, "light") == "light" and not theme.is_dark(qapp)


def test_models_dialog_lists_imports_and_selects(qtbot, window, blip_tiny_checkpoint):
    dlg = window.open_models()
    settle(qtbot, dlg.last_job)
    names = [m.name for m in dlg.models]
    assert "tiny" in names and "blip-itm-base-coco" in names
    row = dlg.row_of("tiny")
    assert dlg.table.item(row, 1).text().startswith("installed")
    dlg.folder.setText(str(blip_tiny_checkpoint))
    dlg.name.setText("blip-tiny-random")
    settle(qtbot, dlg.import_model())
    settle(qtbot, dlg.last_job)
    r = dlg.row_of("blip-tiny-random")
    cell = dlg.table.item(r, 3)
    assert r >= 0 and cell.text().startswith("Random, untrained weights") and cell.font().bold()
    dlg.select("blip-tiny-random")
    assert dlg.use_button.isEnabled()
    dlg.use_selected()
    assert window.backend.settings()["default_model"] == "blip-tiny-random"
    settle(qtbot, dlg.last_job)
    qtbot.waitUntil(lambda: "untrained" in window.model_label.text() and "blip-tiny-random" in window.model_label.text())


def test_import_errors_are_shown(qtbot, window, tmp_path):
    dlg = ModelsDialog(window.backend, window.hub, window)
    settle(qtbot, dlg.last_job)
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "pytorch_model.bin").write_bytes(b"pickle")
    dlg.folder.setText(str(tmp_path / "m"))
    dlg.name.setText("evil")
    settle(qtbot, dlg.import_model())
    boxes = dlg.findChildren(QMessageBox, messages.ERROR_OBJECT_NAME)
    assert boxes and "pickle" in boxes[0].text()


def test_pull_fails_gracefully_offline(qtbot, window):
    dlg = window.open_models()
    settle(qtbot, dlg.last_job)
    dlg.select("blip-itm-base-coco")
    assert dlg.pull_button.isEnabled()
    dlg.trust.setChecked(True)
    job = dlg.pull_selected()
    settle(qtbot, job)
    boxes = dlg.findChildren(QMessageBox, messages.ERROR_OBJECT_NAME)
    assert boxes and "offline" in boxes[0].text().lower()
    assert dlg.pull is None and not dlg.bar.isVisible() and dlg.pull_button.isEnabled()
    assert not dlg.models[dlg.row_of("blip-itm-base-coco")].installed


def test_raw_jpeg_pairs_is_chosen_in_settings_and_used_by_gui_indexing(qtbot, window, paths, tmp_path):
    from engine.catalog import Catalog
    from engine.options import RAW_JPEG_PAIRS
    from engine.samples import marker_picture, write_dng, write_image
    from tests.desktop_app.conftest import index_folder

    folder = tmp_path / "shoot"
    picture = marker_picture((128, 96))
    write_dng(folder / "IMG_0001.DNG", picture, preview=picture)
    write_image(folder / "IMG_0001.JPG", picture, "JPEG")
    dlg = window.open_settings()
    settle(qtbot, dlg._models_job)
    combo = dlg.raw_pairs
    assert tuple(combo.itemData(i) for i in range(combo.count())) == RAW_JPEG_PAIRS.choices
    assert combo.currentData() == "jpeg" and combo.currentText() == "Index the JPEG only"
    combo.setCurrentIndex(combo.findData("both"))
    dlg.accept()
    assert json.loads((paths.config / "settings.json").read_text(encoding="utf-8"))["raw_jpeg_pairs"] == "both"
    root, summary, error = index_folder(qtbot, window, folder)
    assert error == "" and summary.raw_jpeg_pairs == "both" and summary.new == 2
    with Catalog(paths.catalog) as cat:
        (lib,) = cat.libraries()
        assert sorted(r.rel_path for r in cat.image_records(lib.id)) == ["IMG_0001.DNG", "IMG_0001.JPG"]
    # Reopened, the dialog shows the saved choice.
    again = window.open_settings()
    settle(qtbot, again._models_job)
    assert again.raw_pairs.currentData() == "both"
    again.reject()
