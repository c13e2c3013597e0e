"""Checklist 24 at full size: a results grid with 1,000,000 rows asks only for the thumbnails on
screen, at the top and after jumping to the bottom (the 120k-row version runs in `make test`:
tests/desktop_app/test_search.py::test_a_hundred_thousand_results_load_only_visible_thumbnails)."""

from __future__ import annotations

import pytest

pytest.importorskip("PySide6")

from PySide6.QtWidgets import QListView  # noqa: E402

from desktop_app.views.results_model import ResultsModel, ThumbnailStateRole  # noqa: E402
from desktop_app.widgets.thumbnail_delegate import ThumbnailDelegate  # noqa: E402
from desktop_app.workers import ThumbnailLoader  # noqa: E402
from tests.desktop_app.test_search import FakeHit  # noqa: E402


@pytest.mark.stress
def test_a_million_results_load_only_visible_thumbnails(qtbot):
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
    n = 1_000_000
    model.set_hits([FakeHit(i + 1, f"/photos/{i:07d}.jpg", 1.0 - i / n) for i in range(n)])
    qtbot.waitUntil(lambda: loader.requests > 0, timeout=20000)
    qtbot.wait(200)
    per_screen = (1000 // 190 + 1) * (700 // 200 + 2)
    assert 0 < loader.requests <= per_screen * 2, loader.requests
    first_batch = loader.requests
    last = model.index(n - 1)

    def at_bottom() -> bool:
        view.scrollToBottom()
        return view.visualRect(last).intersects(view.viewport().rect())

    qtbot.waitUntil(at_bottom, timeout=180000)
    qtbot.waitUntil(lambda: loader.requests > first_batch, timeout=20000)
    qtbot.wait(200)
    assert loader.requests <= first_batch + per_screen * 2
    view.setCurrentIndex(last)
    qtbot.waitUntil(lambda: model.index(n - 1).data(ThumbnailStateRole) == "ready", timeout=20000)
    assert len(made) <= loader.requests
    loader.shutdown()
