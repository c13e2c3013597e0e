"""Where the keyboard goes in a real window: after Search, Ctrl+Enter from the filters, Ctrl+L /
Ctrl+F, and after a view switch (issue 20, item 7)."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication, QDialog

from tests.desktop_app.conftest import WAIT_MS, index_folder, settle


@pytest.fixture
def active(qtbot, window, photos):
    index_folder(qtbot, window, photos)
    window.activateWindow()
    qtbot.waitUntil(lambda: QApplication.activeWindow() is window, timeout=WAIT_MS)
    return window


def _focus():
    return QApplication.focusWidget()


def test_clicking_search_keeps_the_keyboard_in_the_query(qtbot, active):
    view = active.search_view
    view.editor.setFocus()
    qtbot.keyClicks(view.editor, "a red ball")
    with qtbot.waitSignal(view.results_shown, timeout=WAIT_MS):
        qtbot.mouseClick(view.search_button, Qt.MouseButton.LeftButton)
    assert _focus() is view.editor
    assert not view.folder_box.lineEdit().hasSelectedText()
    # Tabbing to the button and pressing Space: the disabled button hands the keyboard back to the query.
    qtbot.waitUntil(view.search_button.isEnabled, timeout=WAIT_MS)
    view.search_button.setFocus(Qt.FocusReason.TabFocusReason)
    assert _focus() is view.search_button
    with qtbot.waitSignal(view.results_shown, timeout=WAIT_MS):
        qtbot.keyClick(view.search_button, Qt.Key.Key_Space)
    assert _focus() is view.editor
    # The next key adds to the query; the folder filter is unchanged.
    qtbot.keyClicks(_focus(), " x")
    assert view.editor.toPlainText().endswith(" x") and view.filters()["folder"] is None


@pytest.mark.parametrize("field", ["camera_edit", "folder_box", "top_spin", "after_check"])
def test_ctrl_enter_searches_from_the_filter_fields(qtbot, active, field):
    view = active.search_view
    view.editor.setPlainText("a wooden bench")
    widget = getattr(view, field)
    widget.setFocus()
    target = _focus()
    assert target is widget or widget.isAncestorOf(target)
    with qtbot.waitSignal(view.results_shown, timeout=WAIT_MS):
        qtbot.keyClick(target, Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)
    assert view.last_result is not None and view.model.rowCount() == 12
    assert view.folder_box.count() == 2  # Enter did not add the text typed as a folder


def test_enter_in_the_folder_box_searches_without_adding_a_folder(qtbot, active, photos):
    view = active.search_view
    view.editor.setPlainText("a wooden bench")
    view.folder_box.lineEdit().setFocus()
    view.folder_box.setEditText(str(photos / "2023 summer"))
    with qtbot.waitSignal(view.results_shown, timeout=WAIT_MS):
        qtbot.keyClick(view.folder_box.lineEdit(), Qt.Key.Key_Return)
    assert view.folder_box.count() == 2
    assert view.last_result.hits and all("/2023 summer/" in h.path for h in view.last_result.hits)


@pytest.mark.parametrize("keys", ["Ctrl+L", "Ctrl+F"])
def test_ctrl_l_and_ctrl_f_focus_the_query(qtbot, active, keys):
    view = active.search_view
    view.editor.setPlainText("a red ball")
    active.show_view(active.inspector_view)
    assert _focus() is active.inspector_view.canvas
    key = Qt.Key.Key_L if keys == "Ctrl+L" else Qt.Key.Key_F
    qtbot.keyClick(_focus(), key, Qt.KeyboardModifier.ControlModifier)
    assert active.tabs.currentWidget() is view and _focus() is view.editor
    qtbot.keyClicks(view.editor, " on grass")
    assert view.editor.toPlainText() == "a red ball on grass"  # nothing was selected and replaced


def test_after_a_view_switch_typing_and_space_stay_in_the_view(qtbot, active):
    view = active.search_view
    settle(qtbot, view.run_text_query("a red ball"))
    # As in the report: the inspector's picture has the keyboard, then Alt+1.
    active.open_in_inspector(view.model.hit(0), dict(view.query))
    settle(qtbot, active.inspector_view.image_job)
    assert _focus() is active.inspector_view.canvas
    qtbot.keyClick(_focus(), Qt.Key.Key_1, Qt.KeyboardModifier.AltModifier)
    assert active.tabs.currentWidget() is view
    assert _focus() is view.editor
    assert active.models_button.focusPolicy() == Qt.FocusPolicy.NoFocus
    qtbot.keyClick(_focus(), Qt.Key.Key_Space)
    qtbot.keyClicks(_focus(), "tree")
    assert view.editor.toPlainText() == "a red ball tree"
    assert not [d for d in active.findChildren(QDialog) if d.isVisible()]  # Space opened nothing
    # Alt+3 and back: the review view and then the query get the keyboard.
    qtbot.keyClick(_focus(), Qt.Key.Key_3, Qt.KeyboardModifier.AltModifier)
    assert active.tabs.currentWidget() is active.review_view and _focus() is active.review_view
    qtbot.keyClick(_focus(), Qt.Key.Key_1, Qt.KeyboardModifier.AltModifier)
    assert _focus() is view.editor
