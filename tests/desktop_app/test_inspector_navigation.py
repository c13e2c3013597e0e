"""Inspector, seen in a real window (issue 20, item 7): Esc/Backspace back to the results, J/K and
Alt+Right/Alt+Left for the next/previous result, phrase rows that are never function words, maps
as bright as their support, and settings drawn as the background."""

from __future__ import annotations

import numpy as np
import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication

from tests.desktop_app.conftest import WAIT_MS, index_folder, settle
from tests.desktop_app.fakes import ChunkerGrounder

QUERY = "In the desert with orange dunes, a camel stands on the sand next to a red ball. A dog with a hat sits."
FUNCTION_WORDS = {"in", "with", "on", "at", "of", "to", "the", "a", "next to", "by", "under"}


@pytest.fixture
def results(qtbot, window, photos):
    index_folder(qtbot, window, photos)
    window.activateWindow()
    qtbot.waitUntil(lambda: QApplication.activeWindow() is window, timeout=WAIT_MS)
    settle(qtbot, window.search_view.run_text_query(QUERY))
    return window


def _open(qtbot, window, row: int = 0):
    view = window.search_view
    view.grid.setCurrentIndex(view.model.index(row))
    view.open_current()
    return _settled(qtbot, window.inspector_view)


def _settled(qtbot, insp):
    settle(qtbot, insp.image_job)
    if insp.ground_job is not None:
        settle(qtbot, insp.ground_job)
    return insp


@pytest.mark.parametrize("key", [Qt.Key.Key_Escape, Qt.Key.Key_Backspace])
def test_esc_and_backspace_go_back_to_the_results(qtbot, results, key):
    insp = _open(qtbot, results, row=3)
    assert results.tabs.currentWidget() is insp
    qtbot.keyClick(QApplication.focusWidget(), key)
    assert results.tabs.currentWidget() is results.search_view
    assert QApplication.focusWidget() is results.search_view.grid
    assert results.search_view.grid.currentIndex().row() == 3  # where the user was


@pytest.mark.parametrize("forward,backward", [
    ((Qt.Key.Key_J, Qt.KeyboardModifier.NoModifier), (Qt.Key.Key_K, Qt.KeyboardModifier.NoModifier)),
    ((Qt.Key.Key_Right, Qt.KeyboardModifier.AltModifier), (Qt.Key.Key_Left, Qt.KeyboardModifier.AltModifier)),
])
def test_next_and_previous_result(qtbot, results, forward, backward):
    model = results.search_view.model
    insp = _open(qtbot, results)
    assert insp.path == model.hit(0).path
    qtbot.keyClick(QApplication.focusWidget(), *forward)
    _settled(qtbot, insp)
    assert insp.path == model.hit(1).path and results.tabs.currentWidget() is insp
    assert "rank 2" in insp.details.text() and not insp.canvas.image().isNull()
    qtbot.keyClick(QApplication.focusWidget(), *forward)
    qtbot.keyClick(QApplication.focusWidget(), *backward)
    _settled(qtbot, insp)
    assert insp.path == model.hit(1).path
    # From the phrase list too (its type-ahead search must not eat the key).
    insp.phrases.setFocus()
    qtbot.keyClick(insp.phrases, *backward)
    _settled(qtbot, insp)
    assert insp.path == model.hit(0).path
    qtbot.keyClick(QApplication.focusWidget(), *backward)  # nothing before the first
    assert insp.path == model.hit(0).path and "first result" in results.statusBar().currentMessage()


def test_rows_are_never_function_words(qtbot, results):
    results.backend.grounder_factory = lambda embedder: ChunkerGrounder({"relation": 0.0, "noun_phrase": 0.9,
                                                                        "setting": 0.7})
    insp = _open(qtbot, results)
    rows = [insp.phrases.item(i).text() for i in range(insp.phrases.count())]
    # No "In", "on" or "with" rows: relations are shown as the claims they make; "on the sand"
    # and "in the desert" (relations to a setting) are not phrases at all.
    assert rows == ["the desert with orange dunes", "a camel", "the sand", "a camel next to a red ball",
                    "a red ball", "A dog", "A dog with a hat", "a hat"]
    assert not [r for r in rows if r.lower() in FUNCTION_WORDS]
    kinds = [pm.phrase.kind for pm in insp.grounding.phrases]
    for row, pm in zip(rows, insp.grounding.phrases, strict=True):
        if pm.phrase.kind == "relation":
            assert row == pm.phrase.claim and len(row.split()) > len(pm.phrase.text.split())
    assert "relation" in kinds and "setting" in kinds
    setting = kinds.index("setting")
    assert "setting" in insp.phrases.item(setting).toolTip()


def _alpha(image) -> np.ndarray:
    from PySide6.QtGui import QImage

    img = image.convertToFormat(QImage.Format.Format_RGBA8888)
    arr = np.frombuffer(img.constBits(), np.uint8).reshape(img.height(), img.bytesPerLine() // 4, 4)
    return arr[:, : img.width(), 3].astype(int)


def test_a_maps_brightness_follows_its_support(qtbot, results):
    results.backend.grounder_factory = lambda embedder: ChunkerGrounder({"relation": 0.0, "noun_phrase": 0.9,
                                                                        "setting": 0.45})
    insp = _open(qtbot, results)
    g = insp.grounding
    by_kind = {pm.phrase.kind: i for i, pm in enumerate(g.phrases)}
    alphas = {}
    for kind, row in by_kind.items():
        insp.select_phrase(row)
        alphas[kind] = _alpha(insp.canvas.overlay()).max()
    # Support 0.00: nothing drawn at all, however peaked its (normalised) map is.
    assert g.phrases[by_kind["relation"]].heatmap.max() == pytest.approx(1.0, abs=0.05)
    assert alphas["relation"] == 0
    assert "hardly supports" in insp.notice.text() or by_kind["relation"] != insp.phrases.currentRow()
    insp.select_phrase(by_kind["relation"])
    assert "hardly supports" in insp.notice.text()
    # 0.45 is about half as opaque as 0.9.
    assert alphas["noun_phrase"] > 150
    assert alphas["setting"] / alphas["noun_phrase"] == pytest.approx(0.5, abs=0.05)
    # The same in "all phrases" mode: the unsupported relation's region gets no colour.
    insp.set_mode("all")
    from desktop_app.widgets.overlay import strongest_regions

    labels = strongest_regions([pm.heatmap for pm in g.phrases])
    a = _alpha(insp.canvas.overlay())
    assert (a[labels == by_kind["relation"]] == 0).all()
    assert (a[labels == by_kind["noun_phrase"]] > 150).all()


def test_a_setting_is_drawn_as_the_background(qtbot, results):
    """With the model's own grounder (the tiny BLIP's): the setting row's map is the background,
    dark where the things the query names are."""
    insp = _open(qtbot, results)
    g = insp.grounding
    assert g is not None and g.phrases
    settings = [pm for pm in g.phrases if pm.phrase.kind == "setting"]
    objects = [pm for pm in g.phrases if pm.phrase.kind == "noun_phrase"]
    assert [pm.phrase.text for pm in settings] == ["the desert with orange dunes", "the sand"]
    assert objects
    peak = np.max([pm.heatmap for pm in objects], axis=0)
    for pm in settings:
        expected = 1.0 - peak
        np.testing.assert_allclose(pm.heatmap, expected / expected.max(), atol=1e-5)
    assert all(pm.phrase.kind != "relation" or "sand" not in pm.phrase.claim
               and "desert" not in pm.phrase.claim for pm in g.phrases)
