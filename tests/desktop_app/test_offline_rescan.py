"""Issue 27 point 12 (a), in an offscreen window on real folders and a real catalog: a folder found
offline by a re-scan is re-scanned once it is back, and its offline state clears by itself at
the next look (the list read again), without a re-scan."""

from __future__ import annotations

import shutil

from PySide6.QtWidgets import QMessageBox

from desktop_app.dialogs import messages
from tests.desktop_app.conftest import WAIT_MS, index_folder, settle


def _errors(widget) -> list[str]:
    return [b.text() for b in widget.window().findChildren(QMessageBox, messages.ERROR_OBJECT_NAME)]


def _stored_status(window) -> str:
    """The state the catalog holds (not the one the list shows)."""
    return window.backend.services.catalog.libraries()[0].status


def _rescan(qtbot, window):
    """Re-scan (the button's action) on the only folder; the run's summary."""
    view = window.library_view
    view.list.setCurrentRow(0)
    with qtbot.waitSignal(window.queue.finished, timeout=WAIT_MS) as blocker:
        view.rescan_button.click()
        assert not _errors(window), _errors(window)  # not refused
    settle(qtbot, view.refresh())
    return blocker.args[1]


def _unplug_during_a_rescan(qtbot, window, photos, tmp_path):
    """The drive is unplugged while the list still shows the folder indexed; a Re-scan finds it
    gone and the catalog stores it offline, as the reported fault had it."""
    unplugged = tmp_path / "unplugged"
    shutil.move(photos, unplugged)
    summary = _rescan(qtbot, window)
    assert summary is not None and summary.offline
    settle(qtbot, window.library_view.refresh())
    assert "Offline" in window.library_view.item_texts()[0]
    assert _stored_status(window) == "offline"
    return unplugged


def test_a_folder_back_from_offline_is_rescanned_and_shown_indexed(qtbot, window, photos, tmp_path):
    index_folder(qtbot, window, photos)
    unplugged = _unplug_during_a_rescan(qtbot, window, photos, tmp_path)
    view = window.library_view
    # Still unplugged: Re-scan says so and changes nothing.
    view.list.setCurrentRow(0)
    view.rescan_selected()
    assert any("missing or unmounted" in t for t in _errors(window))
    for box in window.findChildren(QMessageBox, messages.ERROR_OBJECT_NAME):
        box.close()
        box.deleteLater()
    qtbot.waitUntil(lambda: not _errors(window), timeout=WAIT_MS)

    shutil.move(unplugged, photos)  # plugged back in
    summary = _rescan(qtbot, window)
    assert not _errors(window), _errors(window)
    assert summary is not None and not summary.offline and not summary.cancelled
    assert (summary.unchanged, summary.deleted, summary.new, summary.embedded) == (12, 0, 0, 0)
    settle(qtbot, view.refresh())
    assert view.item_texts()[0].endswith("Indexed · 12 photos")
    assert _stored_status(window) == "online"


def test_offline_clears_by_itself_when_the_folder_is_back(qtbot, window, photos, tmp_path):
    index_folder(qtbot, window, photos)
    unplugged = _unplug_during_a_rescan(qtbot, window, photos, tmp_path)
    view = window.library_view
    assert view.offline_look.isActive()  # the app keeps looking while a folder is offline
    view.offline_look.setInterval(50)  # the test need not wait the user-facing interval
    shutil.move(unplugged, photos)
    # Nothing is clicked: the next look finds the folder and the list shows it indexed again.
    qtbot.waitUntil(lambda: "Offline" not in view.item_texts()[0], timeout=WAIT_MS)
    assert view.item_texts()[0].endswith("Indexed · 12 photos")
    assert _stored_status(window) == "online"  # cleared in the catalog, not only on screen
    assert not view.offline_look.isActive()
    # And the next run is an ordinary re-scan: nothing new, nothing lost.
    summary = _rescan(qtbot, window)
    assert (summary.offline, summary.unchanged, summary.deleted) == (False, 12, 0)


def test_a_freshly_started_window_shows_a_folder_that_is_back_as_indexed(qtbot, backend, window, photos,
                                                                         tmp_path):
    from desktop_app.background import WorkerHub
    from desktop_app.main_window import MainWindow

    index_folder(qtbot, window, photos)
    _unplug_during_a_rescan(qtbot, window, photos, tmp_path)
    window.library_view.offline_look.stop()  # this window no longer looks: the new one must
    shutil.move(tmp_path / "unplugged", photos)
    hub = WorkerHub()
    again = MainWindow(backend, hub)  # the app started again: its first look reads the list
    qtbot.addWidget(again)
    again.show()
    try:
        qtbot.waitUntil(lambda: bool(again.library_view.infos), timeout=WAIT_MS)
        assert again.library_view.item_texts()[0].endswith("Indexed · 12 photos")
        assert _stored_status(again) == "online"
    finally:
        again.close()  # its shutdown waits for its own workers
