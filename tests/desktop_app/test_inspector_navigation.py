"""Inspector, seen in a real window (issue 20, item 7): Esc/Backspace back to the results, J/K and
Alt+Right/Alt+Left for the next/previous result, phrase rows that are never function words, maps
as bright as their support, and settings drawn as the background."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication

from desktop_app.views.inspector_view import OUTSIDE_LIBRARY_NOTE
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


# -- the exported overlay -----------------------------------------------------------------------------


def test_export_has_the_phrase_a_legend_and_a_confirmation(qtbot, results, tmp_path):
    from PySide6.QtGui import QColor, QImage

    from desktop_app.widgets import overlay

    results.backend.grounder_factory = lambda embedder: ChunkerGrounder({"relation": 0.3, "noun_phrase": 0.9,
                                                                        "setting": 0.6})
    insp = _open(qtbot, results)
    g = insp.grounding
    row = [pm.phrase.text for pm in g.phrases].index("a red ball")
    insp.select_phrase(row)
    out = tmp_path / "exports" / "one.png"
    out.parent.mkdir()
    assert insp.export_overlay(str(out))
    saved = QImage(str(out))
    picture = insp.canvas.image()
    assert saved.width() == picture.width() and saved.height() > picture.height()
    # The picture part is exactly the picture with its overlay, untouched by the legend.
    composed = overlay.compose(picture, insp.canvas.overlay(), insp.canvas.overlay_opacity())
    top = saved.copy(0, 0, picture.width(), picture.height()).convertToFormat(QImage.Format.Format_RGB32)
    assert top == composed.convertToFormat(QImage.Format.Format_RGB32)
    # Below it: the phrase and its support (also the PNG's Description), in white on the band,
    # and the support ramp.
    assert saved.text("Description") == "“a red ball”: support 0.90"
    band = saved.copy(0, picture.height(), saved.width(), saved.height() - picture.height())
    colours = {band.pixelColor(x, y).name() for y in range(band.height()) for x in range(band.width())}
    assert overlay.BAND_TEXT.name() in colours and overlay.BAND_BACKGROUND.name() in colours
    def near(c: QColor) -> bool:
        return any(sum(abs(int(a, 16) - int(b, 16)) for a, b in zip((n[1:3], n[3:5], n[5:7]),
                                                                  (c.name()[1:3], c.name()[3:5], c.name()[5:7]),
                                                                  strict=True)) <= 12 for n in colours)

    assert near(QColor(40, 11, 84)) and near(QColor(252, 255, 164))  # both ends of the support ramp
    assert results.statusBar().currentMessage() == f"Overlay saved to {out}"
    # All phrases: one swatch per phrase, in the colours of the map.
    insp.set_mode("all")
    out2 = tmp_path / "exports" / "all.png"
    assert insp.export_overlay(str(out2))
    saved = QImage(str(out2))
    band = saved.copy(0, picture.height(), saved.width(), saved.height() - picture.height())
    colours = {band.pixelColor(x, y).name() for y in range(band.height()) for x in range(band.width())}
    assert {overlay.phrase_colour(i).name() for i in range(len(g.phrases))} <= colours
    assert saved.text("Description").startswith("All phrases")


def test_the_save_dialog_opens_next_to_the_picture(qtbot, results, photos, tmp_path, monkeypatch):
    from desktop_app.dialogs import messages

    results.backend.grounder_factory = lambda embedder: ChunkerGrounder({"noun_phrase": 0.9})
    insp = _open(qtbot, results)
    asked = []
    monkeypatch.setattr(messages, "choose_save_file", lambda _p, _t, _f, suggested: asked.append(suggested))
    notes = []
    insp.status_message.connect(notes.append)
    insp.export_dialog()
    stem = insp.path.rsplit("/", 1)[-1].rsplit(".", 1)[0]
    # The picture is in the indexed library (Longlens never writes there): the dialog opens in
    # the folder that holds the photo folder, not in the working folder, and the status bar says why.
    assert asked == [str(photos.resolve().parent / f"{stem}-overlay.png")]
    assert notes == [OUTSIDE_LIBRARY_NOTE]
    assert results.statusBar().currentMessage() == OUTSIDE_LIBRARY_NOTE
    # A picture outside every library: right next to it.
    loose = tmp_path / "elsewhere" / "loose.png"
    loose.parent.mkdir()
    shutil.copy(insp.path, loose)
    insp.show_path(str(loose), {"text": QUERY})
    _settled(qtbot, insp)
    insp.export_dialog()
    assert asked[-1] == str(loose.parent.resolve() / "loose-overlay.png")
    assert notes == [OUTSIDE_LIBRARY_NOTE]  # nothing to explain there
    # What it proposes is a path the export accepts.
    assert insp.export_overlay(asked[0]) and (photos.resolve().parent / f"{stem}-overlay.png").is_file()
