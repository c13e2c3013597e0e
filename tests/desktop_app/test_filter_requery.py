"""Issue 27 point 12 (b), in an offscreen window on a real indexed folder: a filter change searches
the text the query box shows now (never the previous query again), and results the box no longer
describes (the query edited and not searched, the image query dropped) are marked as the previous
query's until the next search."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QDate

from tests.desktop_app.conftest import WAIT_MS, index_folder, settle

QUERY_A = "A red ball on the grass next to a wooden bench."
QUERY_B = "Snow on the roof of a blue house by the lake at night."


@pytest.fixture
def indexed(qtbot, window, photos):
    index_folder(qtbot, window, photos)
    return window


def _type_query(qtbot, view, text: str) -> None:
    """Replace the query as a user does: select all, type."""
    view.editor.setFocus()
    view.editor.selectAll()
    qtbot.keyClicks(view.editor, text)
    assert view.editor.toPlainText() == text


def _shown(view) -> list[tuple[str, float]]:
    return [(view.model.hit(r).path, round(view.model.hit(r).score, 6)) for r in range(view.model.rowCount())]


def _direct(view, text: str) -> list[tuple[str, float]]:
    """What the engine answers for `text` with the view's filters, order and cut-off as they are now."""
    result = view.backend.search_text(text, view.top_spin.value(), view.filters(),
                                      view.backend.settings().get("max_tokens"), view.order(), view.cutoff())
    return [(h.path, round(h.score, 6)) for h in result.hits]


def _change_folder(view, photos):
    view.folder_box.setEditText(str(photos / "2023 summer"))


FILTER_CHANGES = {
    "folder": _change_folder,
    "dates": lambda view, _p: (view.after_edit.setDate(QDate(1990, 1, 1)), view.after_check.setChecked(True)),
    "rating": lambda view, _p: view.rating_box.setCurrentIndex(view.rating_box.findData(0)),
    "order": lambda view, _p: view.sort_box.setCurrentIndex(view.sort_box.findData("date-new")),
    "cut-off": lambda view, _p: view.cutoff_spin.setValue(view.cutoff_spin.maximum()),
    "top": lambda view, _p: view.top_spin.setValue(5),
}


@pytest.mark.parametrize("change", sorted(FILTER_CHANGES))
def test_a_filter_change_searches_the_text_in_the_box(qtbot, indexed, photos, change):
    view = indexed.search_view
    settle(qtbot, view.run_text_query(QUERY_A))
    assert _shown(view) == _direct(view, QUERY_A)
    _type_query(qtbot, view, QUERY_B)  # edited, not searched

    with qtbot.waitSignal(view.results_shown, timeout=WAIT_MS):
        FILTER_CHANGES[change](view, photos)
        assert view.stale and "searching again" in view.status.text()
    settle(qtbot, view.search_job)

    expected_b, expected_a = _direct(view, QUERY_B), _direct(view, QUERY_A)
    assert expected_b and expected_b != expected_a  # the two queries are told apart by their hits
    assert _shown(view) == expected_b  # the grid is the box's text, with the new filter
    assert view.query == {"text": QUERY_B, "image": None}  # what the inspector grounds
    assert not view.stale and "not for the query box" not in view.status.text()


def test_an_edited_query_marks_the_results_until_it_is_searched(qtbot, indexed):
    view = indexed.search_view
    settle(qtbot, view.run_text_query(QUERY_A))
    results_line = view.status.text()
    _type_query(qtbot, view, QUERY_B)
    assert view.stale
    assert view.status.text().startswith("⚠ These results are for the previous text, not for the query box: "
                                         "press Ctrl+Enter")
    assert results_line in view.status.text()  # what the results are stays said

    _type_query(qtbot, view, QUERY_A)  # back to what was searched: the mark goes
    assert not view.stale and view.status.text() == results_line

    view.editor.clear()  # emptied: nothing to search, the results stay and are marked
    assert view.stale and "type a description and press Ctrl+Enter" in view.status.text()
    before = _shown(view)
    view.top_spin.setValue(5)  # a filter change with an empty box searches nothing ...
    qtbot.waitUntil(lambda: "searching again" not in view.status.text(), timeout=WAIT_MS)
    assert view.search_job is None or not view.search_job.running
    assert _shown(view) == before and view.stale  # ... and the grid stays marked
    assert "not for the query box" in view.status.text()

    _type_query(qtbot, view, QUERY_B)
    settle(qtbot, view.search())
    assert _shown(view) == _direct(view, QUERY_B) and not view.stale


def test_an_image_query_dropped_marks_its_results(qtbot, indexed, photos):
    view = indexed.search_view
    _type_query(qtbot, view, QUERY_B)
    picture = sorted(p for p in photos.rglob("*.jpg"))[0]
    settle(qtbot, view.search_image(str(picture)))
    assert view.query == {"text": None, "image": str(picture)} and not view.stale
    view.clear_image_query()
    assert view.stale and f"These results are for the image {picture.name}" in view.status.text()
    with qtbot.waitSignal(view.results_shown, timeout=WAIT_MS):
        view.top_spin.setValue(7)  # the box's text now, not the image again
    settle(qtbot, view.search_job)
    assert _shown(view) == _direct(view, QUERY_B) and view.query["text"] == QUERY_B and not view.stale
