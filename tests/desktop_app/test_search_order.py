"""Issue 20 item 5 in a real (offscreen) window: results ordered by date from the results view,
the relevance cut-off with its divider line, file-time dates marked, and the search running
again by itself (debounced, in a worker) when a filter, the order or the cut-off changes."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from desktop_app.facade import LonglensError
from tests.dated_pictures import NEWEST_FIRST, file_state, make_dated_folder
from tests.desktop_app.conftest import WAIT_MS, index_folder, settle

QUERY = "A red ball on the grass next to a wooden bench under a tall tree."


@pytest.fixture
def dated_window(qtbot, window, tmp_path):
    files = make_dated_folder(tmp_path / "dated")
    before = file_state(files)
    index_folder(qtbot, window, tmp_path / "dated")
    yield window, files
    assert file_state(files) == before  # originals byte- and mtime-identical


def _names(view) -> list[str]:
    return [view.model.hit(r).path.rsplit("/", 1)[-1][:-4] for r in range(view.model.rowCount())]


def _wait_rerun(qtbot, view, change) -> None:
    """Make a change and wait for the search it starts by itself (no Search click)."""
    with qtbot.waitSignal(view.results_shown, timeout=WAIT_MS):
        change()
        assert view.stale and "searching again" in view.status.text()
    settle(qtbot, view.search_job)


def test_order_cutoff_and_filters_rerun_the_search_in_the_results_view(qtbot, dated_window):
    window, files = dated_window
    view = window.search_view
    settle(qtbot, view.run_text_query(QUERY))
    relevance = _names(view)
    assert sorted(relevance) == sorted(NEWEST_FIRST)
    assert [view.sort_box.itemData(i) for i in range(view.sort_box.count())] == ["relevance", "date-new", "date-old"]
    assert not view.cutoff_label.isVisible() and view.cutoff_spin.text() == "no cut-off"

    _wait_rerun(qtbot, view, lambda: view.sort_box.setCurrentIndex(view.sort_box.findData("date-new")))
    assert tuple(_names(view)) == NEWEST_FIRST and "newest first" in view.status.text() and not view.stale
    row = _names(view).index("shot2021")
    tip = view.model.index(row).data(Qt.ItemDataRole.ToolTipRole)
    assert "file time 2021-06-06 12:00:00 (no EXIF, XMP or IPTC date)" in tip
    tip = view.model.index(_names(view).index("exif2020")).data(Qt.ItemDataRole.ToolTipRole)
    assert "taken 2020-07-15 09:30:00" in tip

    # The cut-off: a delta that keeps the best three of this query; the divider says where it cut.
    scores = sorted((view.model.hit(r).score for r in range(6)), reverse=True)
    assert scores[2] > scores[3], f"the tiny model scored two pictures alike: {scores}"
    delta = round(scores[0] - scores[2] + min((scores[2] - scores[3]) / 2, 5e-4), 3)
    if scores[0] - delta > scores[2] or scores[0] - delta <= scores[3]:
        pytest.skip(f"three decimals cannot cut these scores between the third and fourth: {scores}")
    _wait_rerun(qtbot, view, lambda: view.cutoff_spin.setValue(delta))
    assert view.model.rowCount() == 3 and view.cutoff_label.isVisible()
    assert view.cutoff_label.text().startswith("✂ 3 results above the cut-off") and "3 below it not shown" in \
        view.cutoff_label.text()
    dates = [view.model.hit(r).date for r in range(3)]
    assert dates == sorted(dates, reverse=True)  # still newest first

    # Typing a camera filter runs the search again after the pause, and says what was left out.
    view.cutoff_spin.setValue(view.cutoff_spin.minimum())
    _wait_rerun(qtbot, view, lambda: qtbot.keyClicks(view.camera_edit, "canon"))
    assert sorted(_names(view)) == ["exif2019", "exif2020", "exif2022"]
    assert "camera filter: 3 pictures with no camera recorded left out" in view.status.text()
    assert not view.cutoff_label.isVisible()


def test_the_views_cutoff_range_and_message_are_the_engines(qtbot, dated_window):
    window, _ = dated_window
    view = window.search_view
    assert (view.cutoff_spin.minimum(), view.cutoff_spin.maximum()) == window.backend.cutoff_range() == (0.0, 2.0)
    with pytest.raises(LonglensError, match="relevance cut-off must be greater than 0, got 0"):
        window.backend.search_text(QUERY, 10, None, None, "relevance", 0.0)
    with pytest.raises(LonglensError, match="result order must be one of relevance, date-new, date-old"):
        window.backend.search_image(str(next(iter(_files(window)))), 10, None, "newest")


def _files(window):
    from pathlib import Path

    return sorted(Path(window.library_view.infos[0].root).glob("*.jpg"))
