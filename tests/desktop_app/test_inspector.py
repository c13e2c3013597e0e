"""Inspector: large image with zoom/pan, phrases with support, overlays, export."""

from __future__ import annotations

import pytest
from PySide6.QtGui import QColor, QImage

from desktop_app.views.inspector_view import NO_GROUNDING, ColourRole, SupportRole
from tests.desktop_app.conftest import WAIT_MS, index_folder, settle
from tests.desktop_app.fakes import FakeGrounder

QUERY = ("A red ball lies on the grass, next to a wooden bench. Behind the bench stands a tall tree "
         "and two white clouds drift across the sky.")


@pytest.fixture
def opened(qtbot, window, photos):
    """Index, search, and open the first result in the inspector (Enter)."""
    index_folder(qtbot, window, photos)
    view = window.search_view
    settle(qtbot, view.run_text_query(QUERY))
    return window


def _open_first(qtbot, window):
    view = window.search_view
    view.grid.setCurrentIndex(view.model.index(0))
    view.open_current()
    insp = window.inspector_view
    settle(qtbot, insp.image_job)
    if insp.ground_job is not None:
        settle(qtbot, insp.ground_job)
    return insp


def test_without_grounding_the_overlay_is_disabled_and_says_why(qtbot, opened):
    opened.backend.grounder_factory = lambda embedder: None  # a model without a grounder
    insp = _open_first(qtbot, opened)
    assert opened.tabs.currentWidget() is insp
    assert not insp.canvas.image().isNull()
    assert insp.notice.text() == NO_GROUNDING
    assert not insp.phrases.isEnabled() and not insp.export_button.isEnabled()
    assert not insp.canvas.has_overlay()
    assert "score" in insp.details.text() and insp.query_label.toPlainText() == QUERY


def test_zoom_and_pan(qtbot, opened):
    insp = _open_first(qtbot, opened)
    c = insp.canvas
    fit = c.zoom()
    c.zoom_by(2.0)
    assert c.zoom() == pytest.approx(fit * 2.0)
    c.actual_size()
    assert c.zoom() == 1.0
    c.set_zoom(6.0)
    bar = c.horizontalScrollBar()
    assert bar.maximum() > 0  # zoomed in far enough to pan
    bar.setValue(bar.maximum())
    assert bar.value() == bar.maximum()
    c.fit()
    assert c.zoom() == pytest.approx(fit)


def test_phrases_supports_overlays_and_export(qtbot, opened, tmp_path):
    fake = FakeGrounder()
    opened.backend.grounder_factory = lambda embedder: fake
    insp = _open_first(qtbot, opened)
    g = insp.grounding
    assert fake.calls == 1 and g is not None
    texts = [insp.phrases.item(i).text() for i in range(insp.phrases.count())]
    assert texts == [pm.phrase.text for pm in g.phrases] and "a wooden bench" in texts
    supports = [insp.phrases.item(i).data(SupportRole) for i in range(insp.phrases.count())]
    assert supports == [pytest.approx(pm.support) for pm in g.phrases]
    # The strongest phrase is selected first, and its map is overlaid.
    assert insp.phrases.currentRow() == max(range(len(supports)), key=supports.__getitem__)
    assert insp.canvas.has_overlay() and insp.export_button.isEnabled()
    first = insp.canvas.overlay().copy()
    insp.select_phrase(0)
    assert insp.canvas.overlay() != first
    # Opacity slider.
    insp.opacity.setValue(25)
    assert insp.canvas.overlay_opacity() == pytest.approx(0.25)
    # All phrases: one colour per phrase, explained by the legend.
    insp.set_mode("all")
    legend = insp.legend.entries()
    assert [name for _c, name in legend] == [f"{pm.phrase.text} ({pm.support:.2f})" for pm in g.phrases]
    colours = {insp.phrases.item(i).data(ColourRole) for i in range(insp.phrases.count())}
    assert {c for c, _n in legend} == {QColor(c).name() for c in colours}
    all_overlay = insp.canvas.overlay()
    assert all_overlay.width() == 16 and all_overlay.height() == 16
    # Export at the picture's full size.
    insp.opacity.setValue(70)
    out = tmp_path / "export" / "overlay"
    out.parent.mkdir()
    assert insp.export_overlay(str(out))
    saved = QImage(str(out) + ".png")
    # The picture at full size, with the legend band below it (tests/desktop_app/test_inspector_navigation.py).
    picture = insp.canvas.image()
    assert saved.width() == picture.width() and saved.height() > picture.height()
    base = picture.convertToFormat(saved.format())
    assert saved.copy(0, 0, picture.width(), picture.height()) != base  # the overlay is in it
    assert list(out.parent.iterdir()) == [out.parent / "overlay.png"]  # no temp file left behind


def test_image_query_has_no_phrases(qtbot, opened):
    opened.backend.grounder_factory = lambda embedder: FakeGrounder()
    view = opened.search_view
    first = view.model.hit(0).path
    settle(qtbot, view.search_image(first))
    insp = _open_first(qtbot, opened)
    assert "image query" in insp.query_label.toPlainText()
    assert "need a text query" in insp.notice.text()


def test_find_similar_from_the_inspector(qtbot, opened):
    insp = _open_first(qtbot, opened)
    path = insp.path
    with qtbot.waitSignal(opened.search_view.results_shown, timeout=WAIT_MS):
        insp.similar_button.click()
    assert opened.tabs.currentWidget() is opened.search_view
    assert opened.search_view.model.hit(0).path == path
