"""Checklist 24 at full size: a results grid with 1,000,000 rows asks only for the thumbnails on
screen, at the top and after jumping to the bottom (the 120k-row version runs in `make test`:
tests/desktop_app/test_search.py::test_a_hundred_thousand_results_load_only_visible_thumbnails)."""

from __future__ import annotations

import pytest

pytest.importorskip("PySide6")

from tests.desktop_app.test_search import check_grid_requests_only_visible_thumbnails  # noqa: E402


@pytest.mark.stress
def test_a_million_results_load_only_visible_thumbnails(qtbot):
    check_grid_requests_only_visible_thumbnails(qtbot, 1_000_000, scroll_timeout_ms=180000, wait_timeout_ms=20000)
