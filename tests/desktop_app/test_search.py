"""Search view: paragraph queries, token budget, image queries, filters, the results grid."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from PySide6.QtCore import QMimeData, Qt, QUrl
from PySide6.QtWidgets import QListView, QMessageBox

from desktop_app.dialogs import messages
from desktop_app.thumbnails import ThumbnailLoader
from desktop_app.views.results_model import ResultsModel, ScoreRole, ThumbnailStateRole
from desktop_app.views.search_view import QuickLook
from desktop_app.widgets.thumbnail_delegate import ThumbnailDelegate
from tests.desktop_app.conftest import TINY_MODEL as TINY_MODEL_NAME
from tests.desktop_app.conftest import WAIT_MS, index_folder, settle

LONG = ("A red ball lies on the grass to the left of a small wooden bench, and behind it a tall "
        "green tree casts a long shadow across the lawn. ")


@pytest.fixture
def indexed(qtbot, window, photos):
    index_folder(qtbot, window, photos)
    return window


def _search(qtbot, view, text: str):
    job = view.run_text_query(text)
    settle(qtbot, job)
    return view.last_result


def test_text_search_shows_ranked_tiles_with_scores(qtbot, indexed):
    view = indexed.search_view
    result = _search(qtbot, view, "A small wooden bench under a tall tree.")
    assert view.model.rowCount() == 12 == len(result.hits)
    scores = [view.model.index(r).data(ScoreRole) for r in range(12)]
    assert scores == sorted(scores, reverse=True)
    assert "12 results" in view.status.text() and "tokens read" in view.status.text()
    # Thumbnails arrive from worker threads and land in the on-disk cache.
    qtbot.waitUntil(lambda: view.model.index(0).data(ThumbnailStateRole) == "ready", timeout=WAIT_MS)
    assert any(indexed.backend.paths.thumbnails.rglob("*.jpg"))


def test_ctrl_enter_searches_and_counter_tracks_the_budget(qtbot, indexed):
    view = indexed.search_view
    qtbot.keyClicks(view.editor, "A red door")
    qtbot.waitUntil(lambda: view.token_label.text().endswith("/ 128 tokens"), timeout=WAIT_MS)
    used = int(view.token_label.text().split("/")[0])
    assert 3 < used < 10
    with qtbot.waitSignal(view.results_shown, timeout=WAIT_MS):
        qtbot.keyClick(view.editor, Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)
    assert view.editor.toPlainText() == "A red door"  # Ctrl+Enter does not insert a line


def test_long_query_is_marked_where_the_model_stops_reading(qtbot, indexed):
    view = indexed.search_view
    text = LONG * 200  # ~5,000 words
    view.editor.setPlainText(text)
    qtbot.waitUntil(lambda: view.trunc_label.isVisible(), timeout=WAIT_MS)
    assert view.token_label.text() == "128 / 128 tokens"
    cut = view.editor.truncation_offset()
    assert cut is not None and 0 < cut < 1000
    assert view.editor.extraSelections(), "the unread part is shaded"
    result = _search(qtbot, view, text)
    assert result.truncated and "query truncated" in view.status.text()


@pytest.mark.parametrize("query", ["", "   ", "\x00\x01\u200b"])
def test_empty_queries_get_a_message(qtbot, indexed, query):
    view = indexed.search_view
    job = view.run_text_query(query)
    if job is not None:
        settle(qtbot, job)
    assert view.model.rowCount() == 0
    text = view.status.text().lower()
    assert "type a description" in text or "query is empty" in text


def test_punctuation_only_query_is_answered(qtbot, indexed):
    view = indexed.search_view
    settle(qtbot, view.run_text_query("!!! ... ???"))
    assert "results" in view.status.text() and "tokens read" in view.status.text()


def test_non_latin_query_works(qtbot, indexed):
    result = _search(qtbot, indexed.search_view, "赤いボールが木製のベンチの左にある。")
    assert len(result.hits) == 12


def test_dropping_an_image_searches_by_image(qtbot, indexed, photos):
    view = indexed.search_view
    target = sorted(photos.rglob("*.png"))[0]
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(target))])
    with qtbot.waitSignal(view.results_shown, timeout=WAIT_MS):
        view.editor.insertFromMimeData(mime)
    assert view.image_chip.isVisible() and target.name in view.image_chip_label.text()
    top = view.model.hit(0)
    assert top.path == str(target.resolve()) and top.score > 0.99
    assert view.editor.toPlainText() == ""  # the drop did not paste a path into the query


def test_dropping_a_non_image_is_an_error(qtbot, indexed, tmp_path):
    view = indexed.search_view
    notes = tmp_path / "notes.txt"
    notes.write_text("hello", encoding="utf-8")
    assert view.search_image(str(notes)) is None
    boxes = indexed.findChildren(QMessageBox, messages.ERROR_OBJECT_NAME)
    assert boxes and "not a picture" in boxes[0].text()


def test_unreadable_query_image_is_an_error(qtbot, indexed, tmp_path):
    bad = tmp_path / "broken.jpg"
    bad.write_bytes(b"\xff\xd8\xff\xe0 truncated")
    view = indexed.search_view
    settle(qtbot, view.search_image(str(bad)))
    boxes = indexed.findChildren(QMessageBox, messages.ERROR_OBJECT_NAME)
    assert boxes and "cannot use" in boxes[0].text()


def test_filters_narrow_the_results(qtbot, indexed, photos):
    view = indexed.search_view
    view.folder_box.setEditText(str(photos / "2023 summer"))
    result = _search(qtbot, view, "a bench")
    assert result.hits and all("/2023 summer/" in h.path for h in result.hits)
    view.folder_box.setCurrentIndex(0)
    cameras = {h.camera for h in _search(qtbot, view, "a bench").hits if h.camera}
    some = sorted(cameras)[0]
    view.camera_edit.setText(some.split()[-1])
    result = _search(qtbot, view, "a bench")
    assert result.hits and all(h.camera and some.split()[-1].lower() in h.camera.lower() for h in result.hits)
    view.camera_edit.clear()
    view.after_check.setChecked(True)
    view.after_edit.setDate(view.after_edit.date().fromString("2030-01-01", "yyyy-MM-dd"))
    assert _search(qtbot, view, "a bench").hits == []
    assert "No results" in view.status.text()


def test_keyboard_navigation_enter_and_space(qtbot, indexed):
    view = indexed.search_view
    _search(qtbot, view, "a wooden bench")
    view.grid.setFocus()
    view.grid.setCurrentIndex(view.model.index(0))
    qtbot.keyClick(view.grid, Qt.Key.Key_Right)
    assert view.grid.currentIndex().row() == 1
    qtbot.keyClick(view.grid, Qt.Key.Key_Space)
    dialogs = view.findChildren(QuickLook, "quick-look")
    assert dialogs, "Space opens a quick look"
    quick = dialogs[0]
    qtbot.waitUntil(lambda: quick.label.pixmap() is not None and not quick.label.pixmap().isNull(), timeout=WAIT_MS)
    qtbot.keyClick(quick, Qt.Key.Key_Space)
    qtbot.waitUntil(lambda: not quick.isVisible())
    with qtbot.waitSignal(view.open_hit) as blocker:
        qtbot.keyClick(view.grid, Qt.Key.Key_Return)
    assert blocker.args[0].rank == 2
    assert indexed.tabs.currentWidget() is indexed.inspector_view


def test_find_similar_on_a_result(qtbot, indexed):
    view = indexed.search_view
    _search(qtbot, view, "a wooden bench")
    view.grid.setCurrentIndex(view.model.index(3))
    chosen = view.current_hit().path
    with qtbot.waitSignal(view.results_shown, timeout=WAIT_MS):
        view.find_similar_current()
    assert view.model.hit(0).path == chosen
    assert view.query == {"text": None, "image": chosen}


# -- the grid with 100k+ results -----------------------------------------------------------------


@dataclass
class FakeHit:
    rank: int
    path: str
    score: float
    rel_path: str = ""
    exif_date: str | None = None
    camera: str | None = None


def check_grid_requests_only_visible_thumbnails(qtbot, n: int, *, scroll_timeout_ms: int = WAIT_MS,
                                                 wait_timeout_ms: int = WAIT_MS) -> None:
    """A results grid of n rows asks only for the thumbnails on screen, at the top and after
    jumping to the bottom, and the last row's thumbnail arrives (shared with the stress suite)."""
    from PIL import Image

    made: list[str] = []

    def make(path: str, size: int):
        made.append(path)
        return Image.new("RGB", (size, size * 3 // 4), (40, 120, 200))

    loader = ThumbnailLoader(make, 64)
    model = ResultsModel(loader)
    view = QListView()
    qtbot.addWidget(view)
    view.setViewMode(QListView.ViewMode.IconMode)
    view.setResizeMode(QListView.ResizeMode.Adjust)
    view.setUniformItemSizes(True)
    view.setLayoutMode(QListView.LayoutMode.Batched)
    view.setItemDelegate(ThumbnailDelegate(view))
    view.setModel(model)
    view.resize(1000, 700)
    view.show()
    model.set_hits([FakeHit(i + 1, f"/photos/{i:07d}.jpg", 1.0 - i / n) for i in range(n)])
    qtbot.waitUntil(lambda: loader.requests > 0, timeout=wait_timeout_ms)
    qtbot.wait(200)
    per_screen = (1000 // 190 + 1) * (700 // 200 + 2)
    assert 0 < loader.requests <= per_screen * 2, loader.requests
    # Scrolling to the end asks only for what is on screen there.
    first_batch = loader.requests
    last = model.index(n - 1)

    def at_bottom() -> bool:
        # Batched layout places the items over several timer ticks (slower on a loaded machine):
        # keep asking for the bottom until the last item is really on screen.
        view.scrollToBottom()
        return view.visualRect(last).intersects(view.viewport().rect())

    qtbot.waitUntil(at_bottom, timeout=scroll_timeout_ms)
    qtbot.waitUntil(lambda: loader.requests > first_batch, timeout=wait_timeout_ms)
    qtbot.wait(200)
    assert loader.requests <= first_batch + per_screen * 2
    view.setCurrentIndex(last)
    assert view.currentIndex().row() == n - 1
    qtbot.waitUntil(lambda: model.index(n - 1).data(ThumbnailStateRole) == "ready", timeout=wait_timeout_ms)
    assert len(made) <= loader.requests
    loader.shutdown()


def test_a_hundred_thousand_results_load_only_visible_thumbnails(qtbot, qapp):
    check_grid_requests_only_visible_thumbnails(qtbot, 120_000)


def test_thumbnail_loader_keeps_only_recent_requests(qtbot):
    import threading

    gate = threading.Event()
    made: list[str] = []

    def make(path: str, size: int):
        gate.wait(5)
        made.append(path)
        from PIL import Image

        return Image.new("RGB", (8, 8))

    loader = ThumbnailLoader(make, 8, threads=1, max_queue=5)
    for i in range(50):
        loader.request(f"p{i}")
    loader.request("p49")  # duplicate: ignored
    gate.set()
    qtbot.waitUntil(lambda: loader._drainers == 0, timeout=WAIT_MS)
    loader.shutdown()
    # Perhaps one older request (the one the worker had already taken when the rest came: p0, or a
    # later one when the worker thread started late on a busy machine), then the newest five,
    # newest first; every other older request was dropped, never made.
    assert made[-5:] == ["p49", "p48", "p47", "p46", "p45"]
    assert len(made) <= 6 and all(int(p[1:]) < 45 for p in made[:-5])
    assert loader.requests == 50


def test_results_model_tooltip_and_failed_thumbnail(qtbot):
    loader = ThumbnailLoader(lambda p, s: (_ for _ in ()).throw(FileNotFoundError(p)), 16)
    model = ResultsModel(loader)
    model.set_hits([FakeHit(1, str(Path("/nope/a.jpg")), 0.5, camera="Fuji X-T4", exif_date="2021-05-01T10:00:00")])
    idx = model.index(0)
    assert "score 0.5000" in idx.data(Qt.ItemDataRole.ToolTipRole) and "Fuji" in idx.data(Qt.ItemDataRole.ToolTipRole)
    assert idx.data(Qt.ItemDataRole.UserRole + 3) is None  # requests the thumbnail
    qtbot.waitUntil(lambda: str(idx.data(ThumbnailStateRole)).startswith("failed"), timeout=WAIT_MS)
    loader.shutdown()


def test_odd_file_names_are_indexed_and_shown(qtbot, window, photos):
    """Non-UTF-8 bytes, spaces, non-Latin script and very long names (checklist 26)."""
    import os

    src = sorted(photos.rglob("*.png"))[0]
    odd = [
        os.fsdecode(b"caf\xe9 latin1.png"),
        "ünïcødé 写真 with spaces.png",
        ("a" * 200) + ".png",
    ]
    for name in odd:
        (photos / name).write_bytes(src.read_bytes() + name.encode("utf-8", "surrogateescape"))
    index_folder(qtbot, window, photos)
    view = window.search_view
    settle(qtbot, view.run_text_query("a picture"))
    shown = {view.model.index(r).data(Qt.ItemDataRole.DisplayRole) for r in range(view.model.rowCount())}
    displayed = ["caf\ufffd latin1.png", odd[1], odd[2]]  # undecodable bytes shown as U+FFFD
    assert set(displayed) <= shown
    odd = displayed
    view.grid.setCurrentIndex(view.model.index(0))
    for r in range(view.model.rowCount()):
        view.model.index(r).data(Qt.ItemDataRole.ToolTipRole)
    qtbot.waitUntil(lambda: all(view.model.index(r).data(ThumbnailStateRole) != "loading"
                                for r in range(view.model.rowCount())
                                if view.grid.visualRect(view.model.index(r)).intersects(view.grid.viewport().rect())),
                    timeout=WAIT_MS)
    assert not view.grid.grab().isNull()  # painting the tiles does not fail
    states = {view.model.index(r).data(Qt.ItemDataRole.DisplayRole): view.model.index(r).data(ThumbnailStateRole)
              for r in range(view.model.rowCount())}
    assert all(states[n] in ("ready", "loading") for n in odd)


def test_a_german_paragraph_is_searched_with_a_warning(qtbot, indexed):
    """The model was trained on English: the GUI says so, as `longlens search` does."""
    from desktop_app import theme

    view = indexed.search_view
    result = _search(qtbot, view, "Ein roter Ball liegt auf dem grünen Rasen neben einer Holzbank. "
                                  "Dahinter steht ein hoher Baum.")
    assert len(result.hits) == 12 and len(result.warnings) == 1
    first = view.status.text().splitlines()[0]
    assert first.startswith("⚠ The query looks German") and f"'{TINY_MODEL_NAME}'" in first
    assert theme.warning_colour() in view.status.styleSheet()
    assert "12 results" in view.status.text()
    _search(qtbot, view, "A red ball lies on the green grass next to a wooden bench.")
    assert "⚠" not in view.status.text() and view.status.styleSheet() == ""
