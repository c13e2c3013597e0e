"""Issue 27 point 6 in the real window: Add folder refuses a folder inside an indexed library (or
one of Longlens's own folders) at once, with the engine's own words and the way out, before any
job starts; adding the parent of an indexed folder merges it, so the list shows one library."""

from __future__ import annotations

from PySide6.QtWidgets import QMessageBox

from desktop_app.dialogs import messages
from tests.desktop_app.conftest import index_folder


def _errors(widget) -> list[str]:
    return [b.text() for b in widget.window().findChildren(QMessageBox, messages.ERROR_OBJECT_NAME)]


def test_add_folder_refuses_a_folder_inside_a_library_and_merges_a_parent(qtbot, window, photos, paths):
    inner = next(p for p in sorted(photos.iterdir()) if p.is_dir())
    _root, summary, error = index_folder(qtbot, window, inner)
    assert error == "" and summary.new > 0
    _root, summary, error = index_folder(qtbot, window, photos)
    assert error == "" and [m["root"] for m in summary.merged_libraries] == [str(inner.resolve())]
    qtbot.waitUntil(lambda: len(window.library_view.infos) == 1)
    assert [i.root for i in window.library_view.infos] == [str(photos.resolve())]

    assert not window.library_view.add_folder(str(inner))
    assert any(f"is inside the library {photos.resolve()}" in t and f"index {photos.resolve()} instead" in t
               for t in _errors(window))
    paths.thumbnails.mkdir(parents=True, exist_ok=True)
    assert not window.library_view.add_folder(str(paths.thumbnails))
    assert any("Longlens's own data folder" in t for t in _errors(window))
    assert window.queue.pending() == [] and not window.queue.busy
