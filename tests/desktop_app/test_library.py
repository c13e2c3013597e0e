"""Library sidebar and background indexing: add, progress, cancel, responsiveness, remove, offline."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
from PySide6.QtCore import QElapsedTimer, QMimeData, QPoint, Qt, QTimer, QUrl
from PySide6.QtGui import QDropEvent
from PySide6.QtWidgets import QMessageBox

from desktop_app.dialogs import messages
from tests.desktop_app.conftest import index_folder, settle


def _errors(widget) -> list[str]:
    return [b.text() for b in widget.window().findChildren(QMessageBox, messages.ERROR_OBJECT_NAME)]


def _infos(widget) -> list[str]:
    return [b.text() for b in widget.window().findChildren(QMessageBox, messages.INFO_OBJECT_NAME)]


@pytest.fixture(scope="module")
def heavy_master(tmp_path_factory) -> Path:
    """Large, cheap-to-store PNGs (smooth 4000x3000, ~0.3 MB each) whose decoding takes real time.

    One picture is rendered, then copied with a different trailing comment so every file has
    its own content hash and goes through decode + embed.
    """
    import numpy as np
    from PIL import Image, ImageDraw

    folder = tmp_path_factory.mktemp("heavy") / "heavy"
    folder.mkdir()
    w, h = 4000, 3000
    ys, xs = np.mgrid[0:h, 0:w]
    arr = np.stack([xs * 255 // w, ys * 255 // h, (xs + ys) * 255 // (w + h)], -1).astype(np.uint8)
    im = Image.fromarray(arr)
    ImageDraw.Draw(im).ellipse((500, 400, 2500, 2000), fill=(200, 30, 30))
    src = folder / "_src.png"
    im.save(src)
    data = src.read_bytes()
    src.unlink()
    for i in range(40):
        (folder / f"big_{i:03d}.png").write_bytes(data + f"copy {i}".encode())
    return folder


def test_index_a_folder_in_the_background(qtbot, window, photos):
    root, summary, error = index_folder(qtbot, window, photos)
    assert error == "" and summary.new == 12
    texts = window.library_view.item_texts()
    assert len(texts) == 1 and "Indexed · 12 photos" in texts[0]
    assert not window.progress_panel.isVisible()
    assert "12 new" in window.statusBar().currentMessage()
    # The search view now knows the folder for its filter.
    assert window.search_view.folder_box.findText(str(photos.resolve())) > 0


def test_bad_folders_are_refused_with_a_message(qtbot, window, tmp_path):
    assert not window.library_view.add_folder(str(tmp_path / "nope"))
    assert any("does not exist" in t for t in _errors(window))
    f = tmp_path / "file.jpg"
    f.write_bytes(b"x")
    assert not window.library_view.add_folder(str(f))
    assert any("is a file, not a folder" in t for t in _errors(window))
    assert window.queue.pending() == []


def test_dropping_a_folder_adds_it(qtbot, window, photos):
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(photos))])
    view = window.library_view
    with qtbot.waitSignal(window.queue.finished, timeout=30000):
        event = QDropEvent(QPoint(10, 10).toPointF(), Qt.DropAction.CopyAction, mime,
                           Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier)
        view.dropEvent(event)
    qtbot.waitUntil(lambda: len(view.infos) == 1)


def test_unreadable_files_are_listed(qtbot, window, photos):
    (photos / "empty.jpg").write_bytes(b"")
    (photos / "notes.jpg").write_text("not a photo", encoding="utf-8")
    index_folder(qtbot, window, photos)
    view = window.library_view
    assert "2 unreadable" in view.item_texts()[0]
    view.list.setCurrentRow(0)
    assert view.unreadable_button.isEnabled()
    view.show_unreadable()
    qtbot.waitUntil(lambda: bool(_infos(window)))
    text = _infos(window)[0]
    assert "empty.jpg: empty file" in text and "notes.jpg: not an image" in text


def test_remove_forgets_the_folder_and_never_touches_files(qtbot, window, photos, monkeypatch):
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in photos.rglob("*") if p.is_file()}
    index_folder(qtbot, window, photos)
    view = window.library_view
    view.list.setCurrentRow(0)
    monkeypatch.setattr(messages, "confirm", lambda *a: True)
    view.remove_selected()
    qtbot.waitUntil(lambda: view.infos == [], timeout=10000)
    after = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in photos.rglob("*") if p.is_file()}
    assert after == before
    assert window.search_view.stack.currentWidget() is window.search_view.welcome


def test_missing_root_is_shown_offline_and_nothing_is_lost(qtbot, window, photos):
    index_folder(qtbot, window, photos)
    moved = photos.with_name("unplugged")
    shutil.move(photos, moved)
    settle(qtbot, window.library_view.refresh())
    view = window.library_view
    assert "Offline" in view.item_texts()[0] and "12 photos" in view.item_texts()[0]
    view.list.setCurrentRow(0)
    view.rescan_selected()
    assert any("missing or unmounted" in t for t in _errors(window))


def _start_heavy(qtbot, window, tmp_path, heavy_master) -> Path:
    folder = tmp_path / "heavy"
    shutil.copytree(heavy_master, folder)
    return folder


def test_event_loop_stays_responsive_while_indexing(qtbot, window, tmp_path, heavy_master, record_property):
    """A 10 ms timer keeps ticking (no gap >= 100 ms) while 40 large PNGs are indexed."""
    folder = _start_heavy(qtbot, window, tmp_path, heavy_master)
    gaps: list[float] = []
    clock = QElapsedTimer()
    timer = QTimer()
    timer.setInterval(10)
    timer.setTimerType(Qt.TimerType.PreciseTimer)

    def tick() -> None:
        gaps.append(clock.nsecsElapsed() / 1e6)
        clock.restart()

    timer.timeout.connect(tick)
    t0 = time.monotonic()
    with qtbot.waitSignal(window.queue.finished, timeout=60000) as blocker:
        window.library_view.add_folder(str(folder))
        clock.start()
        timer.start()
    timer.stop()
    elapsed = time.monotonic() - t0
    summary = blocker.args[1]
    assert summary.new == 40, blocker.args
    assert elapsed > 1.0, f"indexing took only {elapsed:.2f}s: not a meaningful measurement"
    worst = max(gaps[1:])
    record_property("event_loop_max_gap_ms", round(worst, 1))
    record_property("indexing_s", round(elapsed, 2))
    print(f"\nindexing {elapsed:.2f}s, {len(gaps)} ticks, max event-loop gap {worst:.1f} ms")
    assert worst < 100, f"event loop blocked for {worst:.0f} ms"


def test_cancel_stops_indexing_within_a_second(qtbot, window, tmp_path, heavy_master):
    """Cancel is forwarded at once; the engine stops at its next batch boundary.

    The indexer checks the token between batches, so the stop time is one batch's work: the
    test uses a batch of 4 (a setting) so that bound is well under a second on a loaded CI
    machine. (With the default 16 and these deliberately slow 12 MP PNGs it is ~0.5-2 s.)
    """
    window.backend.save_settings({"batch_size": 4})
    folder = _start_heavy(qtbot, window, tmp_path, heavy_master)
    seen = []
    window.queue.progress.connect(lambda p: seen.append(p.stage))
    window.library_view.add_folder(str(folder))
    qtbot.waitUntil(lambda: "index" in seen, timeout=30000)
    assert window.progress_panel.isVisible() and window.progress_panel.cancel_button.isEnabled()
    with qtbot.waitSignal(window.queue.finished, timeout=5000) as blocker:
        t0 = time.monotonic()
        window.progress_panel.cancel_button.click()
    stopped_in = time.monotonic() - t0
    summary = blocker.args[1]
    assert summary.cancelled and 0 < summary.new < 40
    assert stopped_in < 1.0, f"worker took {stopped_in:.2f}s to stop"
    qtbot.waitUntil(lambda: bool(window.library_view.infos))
    assert "Partly indexed · " in window.library_view.item_texts()[0]
    assert "cancelled" in window.statusBar().currentMessage().lower()
    assert os.path.isdir(folder)
