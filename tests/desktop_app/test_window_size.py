"""The main window works at 1024×640 (issue 20, item 7): its minimum size fits, nothing the user
needs is elided or clipped, and lists show more than a sliver. Measured with the app's own theme
(Fusion, as desktop_app.app applies it)."""

from __future__ import annotations

import json

import pytest
from PySide6.QtWidgets import QApplication, QStyle, QStyleOptionFrame, QToolButton

from desktop_app import theme
from tests.desktop_app.conftest import WAIT_MS, index_folder, settle
from tests.desktop_app.fakes import FakeGrounder

SMALL = (1024, 640)
LONG_SENTENCE = ("A small red ball with white stripes lies on the short green grass just to the left of a "
                 "weathered wooden bench whose paint is peeling off in long curling strips.")


@pytest.fixture
def themed(qapp):
    style, palette, font = qapp.style().name(), qapp.palette(), qapp.font()
    theme.apply_theme(qapp, "light")
    yield qapp
    qapp.setStyle(style)
    qapp.setPalette(palette)
    qapp.setFont(font)


@pytest.fixture
def small(qtbot, themed, window):
    window.resize(*SMALL)
    qtbot.waitUntil(lambda: (window.width(), window.height()) == SMALL, timeout=WAIT_MS)
    return window


def test_the_minimum_size_fits_1024_by_640(themed, window):
    hint = window.minimumSizeHint()
    assert hint.width() <= SMALL[0] and hint.height() <= SMALL[1], hint
    for view in (window.search_view, window.inspector_view, window.review_view):
        window.tabs.setCurrentWidget(view)
        assert window.minimumSizeHint().width() <= SMALL[0], (type(view).__name__, window.minimumSizeHint())


def test_search_view_at_1024(qtbot, small):
    view = small.search_view
    camera = view.camera_edit
    placeholder = camera.fontMetrics().horizontalAdvance(camera.placeholderText())
    assert camera.isVisible() and camera.width() >= placeholder + 12  # "Camera (make or model)", not "Ca…"
    assert view.folder_box.width() >= 160
    # The welcome text is shown whole: its label is as tall as its wrapped text needs.
    view.show_welcome(True)
    QApplication.processEvents()
    text = view.welcome_text
    assert text.isVisible() and text.height() >= text.heightForWidth(text.width()) > text.fontMetrics().height()
    assert view.welcome_add.isVisible() and view.welcome_demo.isVisible()
    assert view.welcome.rect().contains(view.welcome_demo.geometry().bottomRight())


def placeholder_room(edit) -> tuple[int, int]:
    """(the placeholder's width, the room for text in the field beside its clear button)."""
    opt = QStyleOptionFrame()
    edit.initStyleOption(opt)
    contents = edit.style().subElementRect(QStyle.SubElement.SE_LineEditContents, opt, edit)
    clear = sum(b.width() for b in edit.findChildren(QToolButton))  # reserved even while the field is empty
    return edit.fontMetrics().horizontalAdvance(edit.placeholderText()), contents.width() - clear - 2 * 2


def test_the_filter_placeholders_are_not_clipped_at_1024(qtbot, small):
    view = small.search_view
    for edit in (view.keyword_edit, view.camera_edit):
        assert edit.isVisible() and edit.placeholderText()
        needed, room = placeholder_room(edit)
        assert needed <= room, (edit.objectName(), edit.placeholderText(), needed, room)
    # What the short placeholder leaves out is in the tooltip.
    assert "Places|Norway|Oslo" in view.keyword_edit.toolTip()


def test_inspector_lists_more_than_two_phrases_at_1024(qtbot, small, photos):
    index_folder(qtbot, small, photos)
    small.backend.grounder_factory = lambda embedder: FakeGrounder()
    view = small.search_view
    settle(qtbot, view.run_text_query("A red ball, a blue cup, a green tree, a white cloud and a yellow kite."))
    view.grid.setCurrentIndex(view.model.index(0))
    view.open_current()
    insp = small.inspector_view
    settle(qtbot, insp.image_job)
    settle(qtbot, insp.ground_job)
    assert insp.phrases.count() == 5
    insp.phrases.scrollToTop()
    shown = [r for r in range(insp.phrases.count())
             if insp.phrases.viewport().rect().contains(insp.phrases.visualItemRect(insp.phrases.item(r)))]
    assert len(shown) >= 3, (shown, insp.phrases.viewport().height())
    insp.set_mode("all")
    QApplication.processEvents()
    assert len([r for r in range(insp.phrases.count()) if insp.phrases.viewport().rect().contains(
        insp.phrases.visualItemRect(insp.phrases.item(r)))]) >= 3  # the legend does not squeeze the list


def test_review_wraps_a_long_sentence_without_a_sideways_scroll_bar(qtbot, small, photos, tmp_path):
    img = sorted(photos.rglob("*.jpg"))[0]
    cap = tmp_path / "long.jsonl"
    cap.write_text(json.dumps({"image": str(img), "caption": LONG_SENTENCE + " " + LONG_SENTENCE}) + "\n"
                   + json.dumps({"image": "missing.jpg", "caption": "A line whose picture is missing."}) + "\n",
                   encoding="utf-8")
    review = small.review_view
    small.tabs.setCurrentWidget(review)
    settle(qtbot, review.open_file(str(cap)))
    qtbot.waitUntil(lambda: review.item is not None and len(review.rows) == 3, timeout=WAIT_MS)
    QApplication.processEvents()
    # With a file open (its name, the item position, the count, the skipped-lines notice) the
    # window still fits.
    assert review.problems_label.isVisible() and review.position_label.text().startswith("Item 1 of 1")
    assert small.minimumSizeHint().width() <= SMALL[0], small.minimumSizeHint()
    assert (small.width(), small.height()) == SMALL
    scroll = review.rows_scroll
    assert not scroll.horizontalScrollBar().isVisible()
    width = scroll.viewport().width()
    for row in review.rows:
        assert row.minimumSizeHint().width() <= width, (row.minimumSizeHint(), width)
        assert row.width() <= width
    sentence = review.rows[1].text
    assert sentence.height() > 2 * sentence.fontMetrics().height()  # wrapped onto several lines
    assert sentence.height() >= sentence.heightForWidth(sentence.width())
    buttons = review.rows[1].buttons.values()
    assert all(review.rows[1].rect().contains(b.geometry()) for b in buttons)


def test_full_size_still_fits(qtbot, themed, window):
    window.resize(1440, 900)
    qtbot.waitUntil(lambda: window.width() == 1440, timeout=WAIT_MS)
    camera = window.search_view.camera_edit
    assert camera.width() >= camera.fontMetrics().horizontalAdvance(camera.placeholderText()) + 12
