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
from tests.desktop_app.conftest import WAIT_MS, index_folder, settle


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
    with qtbot.waitSignal(window.queue.finished, timeout=WAIT_MS):
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
    qtbot.waitUntil(lambda: view.infos == [], timeout=WAIT_MS)
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


def _record_engine_threads(monkeypatch) -> dict[str, set[int]]:
    """Which threads decode, embed and commit while the GUI indexes (engine functions wrapped)."""
    import threading

    from engine.indexing import pipeline

    seen: dict[str, set[int]] = {"decode": set(), "embed": set(), "commit": set()}

    def wrap(owner, name: str, kind: str) -> None:
        original = getattr(owner, name)

        def recorded(*args, **kwargs):
            seen[kind].add(threading.get_ident())
            return original(*args, **kwargs)

        monkeypatch.setattr(owner, name, recorded)

    wrap(pipeline, "decode_image", "decode")
    wrap(pipeline.Indexer, "_embed", "embed")
    wrap(pipeline.Indexer, "_commit_batch", "commit")
    return seen


@pytest.mark.serial
def test_event_loop_stays_responsive_while_indexing(qtbot, window, tmp_path, heavy_master, record_property,
                                                    monkeypatch):
    """No decoding, embedding or catalog write runs on the GUI thread, and a 10 ms timer keeps
    ticking while 40 large PNGs are indexed.

    Not a timed assertion (a shared 2-core CI machine stalls any thread now and then): the ticks
    are counted against the ticks the run's own length allows, and no pause may take a quarter
    of the run. Running the work on the GUI thread fails both. The worst gap is recorded as a
    measurement (`event_loop_max_gap_ms`; about 40-90 ms on an idle 2-core machine).
    """
    import threading

    threads = _record_engine_threads(monkeypatch)
    folder = _start_heavy(qtbot, window, tmp_path, heavy_master)
    gaps: list[float] = []
    clock = QElapsedTimer()
    timer = QTimer()
    interval_ms = 10
    timer.setInterval(interval_ms)
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
    gui = threading.get_ident()
    for kind, idents in threads.items():
        assert idents, f"no {kind} call was seen: the wrapper no longer sees the engine's work"
        assert gui not in idents, f"{kind} ran on the GUI thread"
    worst = max(gaps[1:])
    tick_share = len(gaps) / (elapsed * 1000 / interval_ms)
    record_property("event_loop_max_gap_ms", round(worst, 1))
    record_property("event_loop_tick_share", round(tick_share, 2))
    print(f"\nindexing {elapsed:.2f}s, {len(gaps)} ticks ({tick_share:.0%} of the possible), "
          f"max event-loop gap {worst:.1f} ms")
    assert tick_share > 0.5, f"the event loop ran only {tick_share:.0%} of its timer ticks"
    assert worst < elapsed * 1000 / 4, f"the event loop stopped for {worst:.0f} ms of a {elapsed:.1f} s run"


def test_cancel_stops_indexing_at_the_next_batch_boundary(qtbot, window, tmp_path, heavy_master, monkeypatch):
    """Cancel is forwarded at once; the engine commits at most the batch already computed.

    The indexer checks the token between batches and while a batch is in the model, so after
    the click at most one batch is committed (the one whose vectors were ready). Counted, not
    timed: the waitSignal timeout is only a guard against a job that never stops.
    """
    from engine.indexing import pipeline
    from engine.jobs import CancelToken

    events: list[str] = []
    commit, cancel = pipeline.Indexer._commit_batch, CancelToken.cancel

    def recorded_commit(self, *args, **kwargs):
        events.append("commit")
        return commit(self, *args, **kwargs)

    def recorded_cancel(self, *args, **kwargs):
        events.append("cancel")
        return cancel(self, *args, **kwargs)

    monkeypatch.setattr(pipeline.Indexer, "_commit_batch", recorded_commit)
    monkeypatch.setattr(CancelToken, "cancel", recorded_cancel)
    window.backend.save_settings({"batch_size": 4})
    folder = _start_heavy(qtbot, window, tmp_path, heavy_master)
    seen = []
    window.queue.progress.connect(lambda p: seen.append(p.stage))
    window.library_view.add_folder(str(folder))
    qtbot.waitUntil(lambda: "index" in seen, timeout=WAIT_MS)
    assert window.progress_panel.isVisible() and window.progress_panel.cancel_button.isEnabled()
    with qtbot.waitSignal(window.queue.finished, timeout=WAIT_MS) as blocker:
        window.progress_panel.cancel_button.click()
    summary = blocker.args[1]
    assert summary.cancelled and 0 < summary.new < 40
    assert "cancel" in events
    after = events[events.index("cancel"):].count("commit")
    assert after <= 1, f"{after} batches were committed after the cancel"
    qtbot.waitUntil(lambda: bool(window.library_view.infos))
    assert "Partly indexed · " in window.library_view.item_texts()[0]
    assert "cancelled" in window.statusBar().currentMessage().lower()
    assert os.path.isdir(folder)
