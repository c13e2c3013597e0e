"""Review mode: caption files, verdict shortcuts, persistence in the catalog, resume, export."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from PySide6.QtCore import Qt, QUrl
from PySide6.QtWidgets import QLabel, QMessageBox

from desktop_app.dialogs import messages
from desktop_app.views.review_view import ReviewView
from tests.desktop_app.conftest import WAIT_MS, settle
from tests.desktop_app.fakes import FakeGrounder


def _write_captions(folder: Path, photos: Path) -> Path:
    imgs = sorted(p for p in photos.rglob("*.jpg"))[:3]
    lines = [
        json.dumps({"image": str(imgs[0]), "caption": "A red ball on the grass. A bench stands behind it."}),
        "{not json",
        json.dumps({"image": str(imgs[1]), "caption": "Two white clouds, and a tall tree."}),
        json.dumps({"image": "missing.jpg", "caption": "Nothing here."}),
        json.dumps({"image": str(imgs[2]), "caption": "   "}),
        json.dumps({"image": str(imgs[2]), "caption": "A yellow kite rests against a stone wall."}),
    ]
    f = folder / "captions.jsonl"
    f.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return f


@pytest.fixture
def review(qtbot, window):
    view = window.review_view
    window.tabs.setCurrentWidget(view)
    return view


def _wait_item(qtbot, view, index: int) -> None:
    qtbot.waitUntil(lambda: view.item is not None and view.item.index == index, timeout=WAIT_MS)


def _drain(qtbot, view) -> None:
    settle(qtbot, view.last_job)
    qtbot.waitUntil(lambda: view.hub.serial.activeThreadCount() == 0, timeout=WAIT_MS)
    for _ in range(3):
        qtbot.wait(10)


def test_review_flow_with_verdicts_saved_at_once(qtbot, window, review, photos, tmp_path):
    cap = _write_captions(tmp_path, photos)
    settle(qtbot, review.open_file(str(cap)))
    _wait_item(qtbot, review, 0)
    # Bad lines are reported with line numbers; the rest is reviewable.
    assert "3 line(s) of captions.jsonl skipped" in review.problems_label.text()
    problems = review.problems_text()
    assert "line 2: not valid JSON" in problems
    assert "line 4: image not found: missing.jpg" in problems
    assert "line 5: empty caption" in problems
    assert "Item 1 of 3 · line 1" == review.position_label.text()
    assert len(review.rows) == 3  # whole item + two sentences
    review.setFocus()

    # 1 = faithful on the whole item, saved to the catalog right away.
    qtbot.keyClick(review, Qt.Key.Key_1)
    _drain(qtbot, review)
    item = review.backend.review_item(review.session, 0)
    assert item.verdict.verdict == "faithful"
    assert review.progress.value() == 1
    # Down to the first sentence, 2 = unfaithful, and a note.
    qtbot.keyClick(review, Qt.Key.Key_Down)
    assert review.current_row == 1
    qtbot.keyClick(review, Qt.Key.Key_2)
    qtbot.keyClick(review, Qt.Key.Key_N)
    note = review.rows[1].note
    assert note.hasFocus()
    qtbot.keyClicks(note, "ball is blue 1 2 3")  # digits typed into the note are text, not verdicts
    qtbot.keyClick(note, Qt.Key.Key_Return)
    _drain(qtbot, review)
    item = review.backend.review_item(review.session, 0)
    assert item.sentence_verdicts[0].verdict == "unfaithful"
    assert item.sentence_verdicts[0].note == "ball is blue 1 2 3"
    assert item.verdict.verdict == "faithful"

    # Space: next item; 3 = unsure; Backspace: back, with the saved state shown.
    review.setFocus()
    qtbot.keyClick(review, Qt.Key.Key_Space)
    _wait_item(qtbot, review, 1)
    qtbot.keyClick(review, Qt.Key.Key_3)
    _drain(qtbot, review)
    qtbot.keyClick(review, Qt.Key.Key_Backspace)
    _wait_item(qtbot, review, 0)
    assert review.rows[0].verdict() == "faithful"
    assert review.rows[1].verdict() == "unfaithful" and review.rows[1].note.text() == "ball is blue 1 2 3"
    # Pressing the same verdict again clears it.
    qtbot.keyClick(review, Qt.Key.Key_1)
    _drain(qtbot, review)
    assert review.backend.review_item(review.session, 0).verdict is None
    qtbot.keyClick(review, Qt.Key.Key_1)
    qtbot.keyClick(review, Qt.Key.Key_Space)
    _wait_item(qtbot, review, 1)
    _drain(qtbot, review)
    assert review.progress.value() == 2

    # Export both formats.
    out_jsonl = tmp_path / "out" / "verdicts.jsonl"
    settle(qtbot, review.export(str(out_jsonl)))
    rows = [json.loads(x) for x in out_jsonl.read_text(encoding="utf-8").splitlines()]
    assert [r["line"] for r in rows] == [1, 3, 6]
    assert rows[0]["verdict"] == "faithful" and rows[0]["sentences"][0]["verdict"] == "unfaithful"
    assert rows[1]["verdict"] == "unsure" and rows[2]["verdict"] is None
    out_csv = tmp_path / "out" / "verdicts.csv"
    settle(qtbot, review.export(str(out_csv)))
    with open(out_csv, newline="", encoding="utf-8") as fh:
        table = list(csv.DictReader(fh))
    assert table[0]["scope"] == "item" and table[0]["verdict"] == "faithful"
    assert table[1]["scope"] == "sentence" and table[1]["note"] == "ball is blue 1 2 3"


def test_review_resumes_where_the_annotator_stopped(qtbot, window, review, photos, tmp_path, backend, hub):
    cap = _write_captions(tmp_path, photos)
    settle(qtbot, review.open_file(str(cap)))
    _wait_item(qtbot, review, 0)
    review.setFocus()
    qtbot.keyClick(review, Qt.Key.Key_2)
    qtbot.keyClick(review, Qt.Key.Key_Space)
    _wait_item(qtbot, review, 1)
    qtbot.keyClick(review, Qt.Key.Key_Space)
    _wait_item(qtbot, review, 2)
    _drain(qtbot, review)
    # A fresh view (as after a restart) on the same file resumes at item 3, verdicts intact.
    again = ReviewView(backend, hub)
    qtbot.addWidget(again)
    settle(qtbot, again.open_file(str(cap)))
    _wait_item(qtbot, again, 2)
    assert "resumed" in again.file_label.text()
    qtbot.waitUntil(lambda: again.progress.value() == 1)
    assert backend.review_item(again.session, 0).verdict.verdict == "unfaithful"


@pytest.mark.parametrize("content,name,expected", [
    ("image,notes\na.jpg,hello\n", "bad.csv", "no 'caption' column"),
    ("", "empty.jsonl", "no usable items"),
    ("hello", "notes.txt", "must be .jsonl or .csv"),
])
def test_unusable_caption_files_show_an_error(qtbot, window, review, tmp_path, content, name, expected):
    f = tmp_path / name
    f.write_text(content, encoding="utf-8")
    settle(qtbot, review.open_file(str(f)))
    boxes = window.findChildren(QMessageBox, messages.ERROR_OBJECT_NAME)
    assert boxes and expected in boxes[0].text()
    assert review.session is None and not review.export_button.isEnabled()


def test_missing_caption_file_shows_an_error(qtbot, window, review, tmp_path):
    settle(qtbot, review.open_file(str(tmp_path / "nope.jsonl")))
    boxes = window.findChildren(QMessageBox, messages.ERROR_OBJECT_NAME)
    assert boxes and "does not exist" in boxes[0].text()


def test_support_tints_and_region_maps_on_hover(qtbot, window, review, photos, tmp_path):
    window.backend.grounder_factory = lambda embedder: FakeGrounder()
    cap = _write_captions(tmp_path, photos)
    settle(qtbot, review.open_file(str(cap)))
    _wait_item(qtbot, review, 0)
    qtbot.waitUntil(lambda: review.grounding is not None, timeout=WAIT_MS)
    html = review.caption.toHtml()
    assert "phrase:0" in html and "background-color" in html
    assert review.rows[1].styleSheet() and "background-color" in review.rows[1].styleSheet()
    assert not review.canvas.has_overlay()
    qtbot.waitUntil(lambda: not review.canvas.image().isNull(), timeout=WAIT_MS)
    review._hover_link(QUrl("phrase:1"))  # what QTextBrowser.highlighted sends on hover
    assert review.canvas.has_overlay()
    review.set_current_row(2)  # the second sentence: its phrases' regions
    assert review.canvas.has_overlay()
    review.set_current_row(0)
    assert not review.canvas.has_overlay()


def test_f_toggles_full_screen(qtbot, window, review, photos, tmp_path):
    cap = _write_captions(tmp_path, photos)
    settle(qtbot, review.open_file(str(cap)))
    _wait_item(qtbot, review, 0)
    review.setFocus()
    qtbot.keyClick(review, Qt.Key.Key_F)
    qtbot.waitUntil(lambda: window.isFullScreen())
    qtbot.keyClick(review, Qt.Key.Key_F)
    qtbot.waitUntil(lambda: not window.isFullScreen())


ABBREVIATED = "Dr. Smith walks a red dog. The dog, e.g. a terrier, sits near a bench."


class _ChunkerSentenceGrounder(FakeGrounder):
    """Sentence supports per sentence of the real chunker's split (what the real grounders
    report when left to split the text themselves): 0.1 for the first, 0.9 for the second."""

    def ground(self, image, text, sentences=None):
        from engine.grounding.chunking import chunk

        g = super().ground(image, text, sentences)
        g.sentences = chunk(text).sentences
        g.sentence_supports = [0.1 + 0.8 * i for i in range(len(g.sentences))]
        return g


def test_sentence_rows_get_the_support_of_their_own_sentence(qtbot, window, review, photos, tmp_path):
    from desktop_app.widgets import overlay

    window.backend.grounder_factory = lambda embedder: _ChunkerSentenceGrounder()
    img = sorted(photos.rglob("*.jpg"))[0]
    cap = tmp_path / "abbrev.jsonl"
    cap.write_text(json.dumps({"image": str(img), "caption": ABBREVIATED}) + "\n", encoding="utf-8")
    settle(qtbot, review.open_file(str(cap)))
    _wait_item(qtbot, review, 0)
    qtbot.waitUntil(lambda: review.grounding is not None, timeout=WAIT_MS)
    # One row for the whole item, then one per sentence: two sentences, as the grounder has them.
    assert [r.sentence_index for r in review.rows] == [None, 0, 1]
    assert [review.item.sentence_text(i) for i in range(2)] == [
        "Dr. Smith walks a red dog.", "The dog, e.g. a terrier, sits near a bench."]
    for row, support in zip(review.rows[1:], (0.1, 0.9), strict=True):
        c = overlay.support_tint(support, 60)
        assert f"rgba({c.red()},{c.green()},{c.blue()},{c.alpha()})" in row.styleSheet()
    _drain(qtbot, review)


# -- rough edges seen in a real window (issue 20, item 7) --------------------------------------------


def _open(qtbot, review, photos, tmp_path):
    cap = _write_captions(tmp_path, photos)
    settle(qtbot, review.open_file(str(cap)))
    _wait_item(qtbot, review, 0)
    review.setFocus()
    return cap


def test_enter_and_esc_leave_the_note_so_keys_set_verdicts_again(qtbot, window, review, photos, tmp_path):
    _open(qtbot, review, photos, tmp_path)
    qtbot.keyClick(review, Qt.Key.Key_N)
    note = review.rows[0].note
    assert note.hasFocus()
    qtbot.keyClicks(note, "blue")
    qtbot.keyClick(note, Qt.Key.Key_Return)
    assert not note.hasFocus()
    qtbot.keyClick(review.focusWidget() or review, Qt.Key.Key_2)
    _drain(qtbot, review)
    assert note.text() == "blue"  # the 2 was a verdict, not "blue2"
    item = review.backend.review_item(review.session, 0)
    assert (item.verdict.verdict, item.verdict.note) == ("unfaithful", "blue")
    # Esc leaves the note too; then Down picks the first sentence and 1 sets its verdict.
    qtbot.keyClick(review, Qt.Key.Key_N)
    qtbot.keyClicks(note, " sky")
    qtbot.keyClick(note, Qt.Key.Key_Escape)
    assert not note.hasFocus()
    qtbot.keyClick(review.focusWidget() or review, Qt.Key.Key_Down)
    assert review.current_row == 1
    qtbot.keyClick(review.focusWidget() or review, Qt.Key.Key_1)
    _drain(qtbot, review)
    item = review.backend.review_item(review.session, 0)
    assert item.verdict.note == "blue sky" and item.sentence_verdicts[0].verdict == "faithful"
    assert review.rows[0].note.text() == "blue sky" and review.rows[1].note.text() == ""


def _share_of_colour(image, colour, tolerance: int = 40) -> float:
    from PySide6.QtGui import QColor

    target = QColor(colour)
    hits = 0
    for y in range(image.height()):
        for x in range(image.width()):
            c = image.pixelColor(x, y)
            if (abs(c.red() - target.red()) + abs(c.green() - target.green())
                    + abs(c.blue() - target.blue())) <= tolerance:
                hits += 1
    return hits / (image.width() * image.height())


def test_the_chosen_verdict_is_filled_with_its_colour(qtbot, window, review, photos, tmp_path):
    from desktop_app.views.review_view import VERDICT_COLOURS

    _open(qtbot, review, photos, tmp_path)
    qtbot.keyClick(review, Qt.Key.Key_3)
    _drain(qtbot, review)
    buttons = review.rows[0].buttons
    assert [v for v, b in buttons.items() if b.isChecked()] == ["unsure"]
    chosen = buttons["unsure"].grab().toImage()
    other = buttons["faithful"].grab().toImage()
    # Most of the chosen button is its verdict's colour; an unchosen button has none of it.
    assert _share_of_colour(chosen, VERDICT_COLOURS["unsure"]) > 0.5
    assert _share_of_colour(other, VERDICT_COLOURS["unsure"]) == 0.0
    assert _share_of_colour(other, VERDICT_COLOURS["faithful"]) == 0.0


def test_no_review_count_before_a_file_is_open(qtbot, window, review, photos, tmp_path):
    assert not review.progress.isVisible()
    assert "reviewed" not in " ".join(w.text() for w in review.findChildren(QLabel) if w.isVisible())
    _open(qtbot, review, photos, tmp_path)
    qtbot.waitUntil(review.progress.isVisible, timeout=WAIT_MS)
    # Visible only with its count: never an empty bar while the count is on its way.
    assert review.progress.text() == "0 of 3 reviewed"


def test_full_screen_hides_the_library_panel(qtbot, window, review, photos, tmp_path):
    _open(qtbot, review, photos, tmp_path)
    assert window.library_view.isVisible()
    qtbot.keyClick(review, Qt.Key.Key_F)
    qtbot.waitUntil(lambda: window.isFullScreen())
    assert not window.library_view.isVisible() and not window.banner.isVisible()
    assert review.canvas.isVisible() and review.caption.isVisible()
    qtbot.keyClick(review, Qt.Key.Key_Escape)
    qtbot.waitUntil(lambda: not window.isFullScreen())
    assert window.library_view.isVisible() and window.banner.isVisible()


def test_a_hovered_phrase_map_goes_when_the_mouse_leaves(qtbot, window, review, photos, tmp_path):
    from PySide6.QtCore import QEvent
    from PySide6.QtWidgets import QApplication

    window.backend.grounder_factory = lambda embedder: FakeGrounder()
    _open(qtbot, review, photos, tmp_path)
    qtbot.waitUntil(lambda: review.grounding is not None, timeout=WAIT_MS)
    qtbot.waitUntil(lambda: not review.canvas.image().isNull(), timeout=WAIT_MS)
    assert not review.canvas.has_overlay()  # the whole item's row: no map
    review._hover_link(QUrl("phrase:1"))  # what QTextBrowser.highlighted sends on hover
    assert review.hovered_phrase() == 1 and review.canvas.has_overlay()
    # The mouse leaves the caption straight from the phrase (no "no link" hover signal comes).
    QApplication.sendEvent(review.caption.viewport(), QEvent(QEvent.Type.Leave))
    assert review.hovered_phrase() is None and not review.canvas.has_overlay()
    # On a sentence row, leaving brings back that sentence's maps, not the hovered phrase's.
    review.set_current_row(1)
    row_overlay = review.canvas.overlay().copy()
    review._hover_link(QUrl("phrase:2"))
    assert review.canvas.overlay() != row_overlay
    QApplication.sendEvent(review.caption.viewport(), QEvent(QEvent.Type.Leave))
    assert review.canvas.overlay() == row_overlay
