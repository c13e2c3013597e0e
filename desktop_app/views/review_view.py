"""Review mode for annotators: step through a caption file and record verdicts.

Keys follow darktable / Lightroom habits: Space / Backspace next / previous item, 1 / 2 / 3
faithful / unfaithful / unsure on the selected row (the whole item, or a sentence picked
with Up / Down), N to write a note, F full screen. Every verdict is saved to the catalog at
once (in order, through one background thread); the position is saved too, so reopening
the same file resumes where the annotator stopped. An edited file keeps the verdicts of its
unchanged items; the panel says how many items are new, changed or kept, and marks each one.
"""

from __future__ import annotations

import html
import os
from typing import Any

from PySide6.QtCore import QEvent, QObject, Qt, QUrl, Signal
from PySide6.QtGui import QAction, QFontMetrics, QImage, QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QButtonGroup,
    QFrame,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QMenu,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QSplitter,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from desktop_app import theme
from desktop_app.background import Job, WorkerHub
from desktop_app.dialogs import messages
from desktop_app.dialogs.xmp_export_dialog import XmpExportDialog
from desktop_app.facade import Backend, display_text
from desktop_app.widgets import overlay
from desktop_app.widgets.image_canvas import ImageCanvas

CAPTION_FILTER = "Caption files (*.jsonl *.ndjson *.json *.csv *.tsv);;All files (*)"
VERDICT_LABELS = {"faithful": "Faithful", "unfaithful": "Unfaithful", "unsure": "Unsure"}
# The chosen verdict's button is filled with its colour (white bold text): readable at a glance on
# both palettes, where Fusion's own "checked" look is a barely darker grey.
VERDICT_COLOURS = {"faithful": "#2e7d32", "unfaithful": "#c62828", "unsure": "#b26a00"}
# The marker of an item against the previous version of its caption file.
CHANGE_LABELS = {
    "new": "New in this version of the file",
    "changed": "Changed: the caption was edited since the last version; earlier verdicts do not apply",
    "kept": "Kept from the last version, with its verdicts",
}


class VerdictRow(QFrame):
    """The whole item or one sentence: three verdict buttons and a note."""

    changed = Signal(object, object, str)  # sentence index (None: whole item), verdict or None, note
    clicked = Signal(object)

    def __init__(self, label: str, sentence_index: int | None, verdicts: tuple[str, ...],
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.sentence_index = sentence_index
        self.verdicts = verdicts
        self.setObjectName("verdict-row")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.text = QLabel(label)
        self.text.setWordWrap(True)
        self.text.setTextFormat(Qt.TextFormat.RichText)
        self.group = QButtonGroup(self)
        self.group.setExclusive(False)  # so a second click on the chosen verdict clears it
        self.buttons: dict[str, QPushButton] = {}
        row = QHBoxLayout()
        row.setSpacing(4)
        for i, v in enumerate(verdicts, start=1):
            b = QPushButton(f"{i}  {VERDICT_LABELS.get(v, v)}")
            b.setObjectName(f"verdict-{v}")
            b.setCheckable(True)
            b.setFocusPolicy(Qt.FocusPolicy.NoFocus)
            colour = VERDICT_COLOURS.get(v, "#455a64")
            b.setStyleSheet(f"QPushButton:checked {{ background-color: {colour}; color: white; font-weight: bold; "
                            f"border: 1px solid {colour}; border-radius: 3px; padding: 3px 8px; }}")
            bold = b.font()
            bold.setBold(True)
            # As wide chosen (bold) as not: choosing a verdict must not shift the row.
            b.setMinimumWidth(QFontMetrics(bold).horizontalAdvance(b.text()) + 20)
            b.clicked.connect(lambda checked, v=v: self.choose(v if checked else None))
            self.group.addButton(b)
            self.buttons[v] = b
            row.addWidget(b)
        row.addStretch(1)
        self.note = QLineEdit()
        self.note.setPlaceholderText("Note (N; Enter when done)")
        self.note.editingFinished.connect(self._note_done)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(8, 6, 8, 6)
        lay.setSpacing(4)
        lay.addWidget(self.text)
        lay.addLayout(row)
        # Its own line: beside the buttons it made a row wider than the panel in a 1024 px window.
        lay.addWidget(self.note)
        self._verdict: str | None = None
        self._saved_note = ""
        self._current = False

    def mousePressEvent(self, event) -> None:
        self.clicked.emit(self.sentence_index)
        super().mousePressEvent(event)

    def verdict(self) -> str | None:
        return self._verdict

    def set_state(self, verdict: str | None, note: str) -> None:
        self._verdict = verdict
        self._show_verdict()
        self.note.setText(note)
        self._saved_note = note

    def choose(self, verdict: str | None) -> None:
        self._verdict = verdict
        self._show_verdict()
        self._saved_note = self.note.text()
        self.changed.emit(self.sentence_index, verdict, self.note.text())

    def _show_verdict(self) -> None:
        for v, b in self.buttons.items():
            b.setChecked(v == self._verdict)
            b.setToolTip("Chosen: press its key again to clear it" if v == self._verdict else "")

    def _note_done(self) -> None:
        if self.note.text() != self._saved_note:
            self._saved_note = self.note.text()
            self.changed.emit(self.sentence_index, self._verdict, self.note.text())

    def set_current(self, on: bool) -> None:
        self._current = on
        self._restyle()

    def set_tint(self, support: float | None) -> None:
        self._tint = support
        self._restyle()

    def _restyle(self) -> None:
        parts = []
        tint = getattr(self, "_tint", None)
        if tint is not None:
            c = overlay.support_tint(tint, 60)
            parts.append(f"background-color: rgba({c.red()},{c.green()},{c.blue()},{c.alpha()});")
        if self._current:
            hl = self.palette().color(self.palette().ColorRole.Highlight).name()
            parts.append(f"border: 2px solid {hl}; border-radius: 4px;")
        self.setStyleSheet(f"QFrame#verdict-row {{ {' '.join(parts)} }}" if parts else "")


class _NoteKeys(QObject):
    """Enter and Esc in a note field end the note and give the keys back to the review, so
    arrows and digits set verdicts again instead of typing into the note."""

    def __init__(self, view: ReviewView) -> None:
        super().__init__(view)
        self.view = view

    def eventFilter(self, obj: QObject, event: QEvent) -> bool:
        if event.type() == QEvent.Type.KeyPress and event.key() in (
                Qt.Key.Key_Return, Qt.Key.Key_Enter, Qt.Key.Key_Escape):
            self.view.leave_note()
            return True
        return False


class _LeaveWatcher(QObject):
    """The mouse left the caption: a phrase's map shown on hover goes away with it."""

    def __init__(self, view: ReviewView) -> None:
        super().__init__(view)
        self.view = view

    def eventFilter(self, obj: QObject, event: QEvent) -> bool:
        if event.type() == QEvent.Type.Leave:
            self.view.hover_ended()
        return False


class ReviewView(QWidget):
    item_shown = Signal(int)  # index
    full_screen_changed = Signal(bool)  # the main window hides its library panel while on

    def __init__(self, backend: Backend, hub: WorkerHub, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.backend = backend
        self.hub = hub
        self.verdicts = backend.verdict_names()
        self.session: Any = None
        self.item: Any = None
        self.grounding: Any = None
        self.rows: list[VerdictRow] = []
        self.current_row = 0
        self._seq = 0
        self.last_job: Job | None = None
        self.xmp_dialog: XmpExportDialog | None = None
        self.setFocusPolicy(Qt.FocusPolicy.StrongFocus)

        # -- top bar -------------------------------------------------------------------------------
        # Two menus rather than four buttons: the top bar must fit a 1024 px window with a file open.
        self.open_file_action = QAction("Caption file…", self)
        self.open_file_action.triggered.connect(self.open_dialog)
        self.catalog_action = QAction("Use the captions already in the catalogue", self)
        self.catalog_action.setToolTip("Review each indexed picture's XMP description (else its title), as "
                                       "Lightroom, darktable or digiKam wrote it; the same captions as "
                                       "longlens check --from-catalog")
        self.catalog_action.triggered.connect(self.open_catalog_captions)
        open_menu = QMenu(self)
        open_menu.setToolTipsVisible(True)
        open_menu.addAction(self.open_file_action)
        open_menu.addAction(self.catalog_action)
        self.open_button = QPushButton("Open…")
        self.open_button.setObjectName("review-open")
        self.open_button.setMenu(open_menu)
        self.file_label = QLabel("No caption file open. A caption file is JSON Lines or CSV with "
                                 "an image and a caption per line.")
        self.file_label.setWordWrap(True)
        self.position_label = QLabel("")
        self.change_label = QLabel("")
        self.change_label.setObjectName("review-change")
        self.progress = QProgressBar()
        self.progress.setObjectName("review-progress")
        self.progress.setFormat("%v of %m reviewed")
        # Between these widths: its fixed 220 px made the top bar too wide for a 1024 px window.
        self.progress.setMinimumWidth(130)
        self.progress.setMaximumWidth(220)
        self.progress.setRange(0, 0)
        self.progress.setVisible(False)  # no count to show until a file is open
        self.export_file_action = QAction("Verdicts to a file (JSON Lines or CSV)…", self)
        self.export_file_action.triggered.connect(self.export_dialog)
        self.export_xmp_action = QAction("Export to XMP sidecars…", self)
        self.export_xmp_action.setToolTip("Write the verdicts and notes into the pictures' XMP sidecars (you see "
                                          "the list of changes first)")
        self.export_xmp_action.triggered.connect(self.xmp_export_dialog)
        export_menu = QMenu(self)
        export_menu.setToolTipsVisible(True)
        export_menu.addAction(self.export_file_action)
        export_menu.addAction(self.export_xmp_action)
        self.export_button = QPushButton("Export…")
        self.export_button.setObjectName("review-export")
        self.export_button.setMenu(export_menu)
        self.full_button = QPushButton("Full screen (F)")
        self.full_button.clicked.connect(self.toggle_full_screen)
        top = QHBoxLayout()
        top.addWidget(self.open_button)
        top.addWidget(self.file_label, 1)
        top.addWidget(self.position_label)
        top.addWidget(self.change_label)
        top.addWidget(self.progress)
        top.addWidget(self.export_button)
        top.addWidget(self.full_button)
        self.problems_label = QLabel("")
        self.problems_label.setObjectName("review-problems")
        self.problems_label.setWordWrap(True)
        self.problems_label.setTextFormat(Qt.TextFormat.RichText)
        self.problems_label.linkActivated.connect(lambda _l: self.show_problems())
        self.problems_label.setVisible(False)

        # -- image ----------------------------------------------------------------------------------
        self.canvas = ImageCanvas()
        self.canvas.setObjectName("review-canvas")
        self.canvas.set_message("Open a caption file to start reviewing.")

        # -- caption, verdicts ------------------------------------------------------------------------
        self.caption = QTextBrowser()
        self.caption.setObjectName("review-caption")
        self.caption.setOpenLinks(False)
        self.caption.setMouseTracking(True)
        self.caption.highlighted.connect(self._hover_link)
        self.caption.viewport().installEventFilter(_LeaveWatcher(self))
        self.caption.setMinimumHeight(110)
        self._hovered: int | None = None  # the phrase whose map the mouse shows
        self.grounding_note = QLabel("")
        self.grounding_note.setWordWrap(True)
        self.rows_box = QWidget()
        self.rows_layout = QVBoxLayout(self.rows_box)
        self.rows_layout.setContentsMargins(0, 0, 0, 0)
        self.rows_layout.setSpacing(6)
        self.rows_layout.addStretch(1)
        scroll = QScrollArea()
        scroll.setObjectName("review-rows")
        scroll.setWidgetResizable(True)
        # The rows wrap their sentence to the panel's width: never a sideways scroll bar.
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        scroll.setWidget(self.rows_box)
        self.rows_scroll = scroll
        keys = QLabel("Space / Backspace: next / previous · 1 2 3: faithful / unfaithful / unsure · "
                      "↑ ↓: item or sentence · N: note · F: full screen")
        keys.setWordWrap(True)
        keys.setEnabled(False)
        right = QWidget()
        # Never narrower than a row of verdict buttons beside the scroll bar: the rows wrap their
        # text, and a sideways scroll bar would hide the buttons.
        sample = VerdictRow("", None, self.verdicts)
        # (+ 4: the current row's 2 px highlight border is wider than the panel frame it replaces)
        right.setMinimumWidth(sample.minimumSizeHint().width() + scroll.verticalScrollBar().sizeHint().width()
                              + 2 * scroll.frameWidth() + 8 + 4)
        sample.deleteLater()
        rl = QVBoxLayout(right)
        rl.setContentsMargins(8, 0, 0, 0)
        rl.addWidget(QLabel("<b>Caption</b> (hover a phrase to see its region)"))
        rl.addWidget(self.caption, 2)
        rl.addWidget(self.grounding_note)
        rl.addWidget(QLabel("<b>Verdicts</b>"))
        rl.addWidget(scroll, 3)
        rl.addWidget(keys)

        split = QSplitter()
        split.addWidget(self.canvas)
        split.addWidget(right)
        split.setStretchFactor(0, 3)
        split.setStretchFactor(1, 2)
        split.setSizes([760, 520])
        lay = QVBoxLayout(self)
        lay.setContentsMargins(10, 10, 10, 6)
        lay.addLayout(top)
        lay.addWidget(self.problems_label)
        lay.addWidget(split, 1)

        self._note_keys = _NoteKeys(self)
        self._shortcuts: list[QShortcut] = []
        self._bind("Space", self.next_item)
        self._bind("Backspace", self.previous_item)
        for i, v in enumerate(self.verdicts, start=1):
            self._bind(str(i), lambda v=v: self.set_verdict(v))
        self._bind("Up", lambda: self.move_row(-1))
        self._bind("Down", lambda: self.move_row(1))
        self._bind("N", self.focus_note)
        self._bind("F", self.toggle_full_screen)
        self._bind("Escape", self._escape)
        self._set_enabled(False)

    def _bind(self, key: str, slot) -> None:
        sc = QShortcut(QKeySequence(key), self)
        sc.setContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)
        sc.activated.connect(slot)
        self._shortcuts.append(sc)

    def _set_enabled(self, on: bool) -> None:
        self.export_button.setEnabled(on)
        self.export_file_action.setEnabled(on)
        self.export_xmp_action.setEnabled(on)
        for sc in self._shortcuts:
            sc.setEnabled(on or sc.key().toString() in ("F", "Esc"))

    # -- opening ------------------------------------------------------------------------------------
    def open_dialog(self) -> None:
        path = messages.choose_file(self, "Open a caption file", CAPTION_FILTER)
        if path:
            self.open_file(path)

    def open_file(self, path: str, *, from_catalog: bool = False) -> Job:
        self.file_label.setText(f"Opening {os.path.basename(path)}…")
        job = self.hub.call(self.backend.open_review, path, on_result=lambda s: self._opened(s, from_catalog),
                            on_error=lambda m: self._open_failed(path, m), serial=True)
        self.last_job = job
        return job

    def open_catalog_captions(self) -> Job:
        """Review the captions already in the catalogue: the engine writes them (each picture's XMP
        description, else title) as a caption file in Longlens' data folder, after the same checks
        as `longlens check --from-catalog`, and it opens like any caption file (resumed next time)."""
        previous = self.file_label.text()
        self.file_label.setText("Reading the captions in the catalogue…")
        job = self.hub.call(self.backend.catalog_caption_file, serial=True,
                            on_result=lambda path: self.open_file(path, from_catalog=True),
                            on_error=lambda m: self._catalog_failed(previous, m))
        self.last_job = job
        return job

    def _catalog_failed(self, previous: str, message: str) -> None:
        # Nothing to review (or a catalogue problem): whatever was open stays open, with the reason.
        self.file_label.setText(previous)
        messages.show_error(self, "No captions in the catalogue", message)

    def _open_failed(self, path: str, message: str) -> None:
        self.file_label.setText(f"Could not open {os.path.basename(path)}.")
        messages.show_error(self, "Cannot review this file", message)

    def _opened(self, session: Any, from_catalog: bool = False) -> None:
        self.session = session
        self._set_enabled(True)
        name = os.path.basename(session.caption_file)
        how = "resumed where you stopped" if session.resumed else "new review"
        if session.changes is not None:
            how += f" · since the last version: {session.changes}"
        shown = "The catalogue's captions" if from_catalog else html.escape(name)
        self.file_label.setText(f"<b>{shown}</b> · {len(session)} items · {how}")
        if from_catalog:
            self.file_label.setToolTip("Each indexed picture's XMP description, else its title; kept in "
                                       + display_text(session.caption_file))
        else:
            self.file_label.setToolTip("")
        if session.problems:
            # Shown in place (with the full list a click away), not in a modal box: the
            # annotator can start on the good lines at once.
            n = len(session.problems)
            self.problems_label.setText(
                f"{n} line(s) of {html.escape(name)} skipped: "
                + html.escape("; ".join(str(p) for p in session.problems[:3])) + (" …" if n > 3 else "")
                + ' <a href="details">details</a>')
            self.problems_label.setStyleSheet(f"color: {theme.warning_colour()};")
            self.problems_label.setVisible(True)
        else:
            self.problems_label.setVisible(False)
        self.go_to(session.position)
        self._refresh_progress()
        self.setFocus()

    def problems_text(self) -> str:
        if self.session is None:
            return ""
        return "\n".join(str(p) for p in self.session.problems)

    def show_problems(self) -> None:
        if self.session is None or not self.session.problems:
            return
        lines = self.problems_text().splitlines()
        more = f"\n… and {len(lines) - 100} more" if len(lines) > 100 else ""
        messages.show_info(self, "Skipped lines",
                           f"These lines of {os.path.basename(self.session.caption_file)} cannot be reviewed; "
                           "fix them and open the file again: the verdicts on the other lines are kept, "
                           "and the fixed lines are marked new.\n\n"
                           + "\n".join(lines[:100]) + more)

    # -- navigation ------------------------------------------------------------------------------------
    def go_to(self, index: int) -> Job | None:
        if self.session is None:
            return None
        index = max(0, min(index, len(self.session) - 1))
        self._seq += 1
        seq = self._seq
        # Reads go through the same ordered thread as the writes, so they see every verdict.
        job = self.hub.call(self.backend.review_item, self.session, index, serial=True,
                            on_result=lambda it, s=seq: self._show_item(it, s),
                            on_error=lambda m: messages.show_error(self, "Review", m))
        self.hub.call(self.backend.set_review_position, self.session, index, serial=True)
        self.last_job = job
        return job

    def next_item(self) -> None:
        if self.item is not None and self.item.index + 1 < len(self.session):
            self._commit_note()
            self.go_to(self.item.index + 1)

    def previous_item(self) -> None:
        if self.item is not None and self.item.index > 0:
            self._commit_note()
            self.go_to(self.item.index - 1)

    def _commit_note(self) -> None:
        for row in self.rows:
            row._note_done()

    def _show_item(self, item: Any, seq: int) -> None:
        if seq != self._seq:
            return
        self.item = item
        self.grounding = None
        self.position_label.setText(f"Item {item.index + 1} of {len(self.session)} · line {item.line_no}")
        change = getattr(item, "change", None)
        self.change_label.setText(change or "")
        self.change_label.setToolTip(CHANGE_LABELS.get(change, ""))
        self.change_label.setStyleSheet(
            f"color: {theme.warning_colour()}; font-weight: bold;" if change in ("new", "changed") else "")
        self.caption.setHtml(self._caption_html(item, None))
        self._build_rows(item)
        self.canvas.set_image(None)
        self.canvas.set_message("Loading…")
        self.hub.call(self.backend.display_image, item.image_path, 4096,
                      on_result=lambda img, s=seq: self._image_loaded(img, s),
                      on_error=lambda m, s=seq: seq == self._seq and self.canvas.set_message(
                          f"This picture cannot be shown: {m}"))
        self.grounding_note.setText("")
        self.hub.call(self.backend.ground, item.image_path, item.caption, list(item.sentences),
                      on_result=lambda g, s=seq: self._grounded(g, s),
                      on_error=lambda m, s=seq: seq == self._seq and self.grounding_note.setText(
                          f"Grounding failed: {m}"))
        self.item_shown.emit(item.index)

    def _image_loaded(self, image: QImage, seq: int) -> None:
        if seq == self._seq:
            self.canvas.set_image(image)

    def _build_rows(self, item: Any) -> None:
        for row in self.rows:
            row.setParent(None)
            row.deleteLater()
        self.rows = []
        whole = VerdictRow("<b>Whole item</b>", None, self.verdicts)
        v = item.verdict
        whole.set_state(v.verdict if v else None, v.note if v else "")
        self.rows.append(whole)
        for i in range(len(item.sentences)):
            text = html.escape(item.sentence_text(i))
            row = VerdictRow(f"<b>{i + 1}.</b> {text}", i, self.verdicts)
            sv = item.sentence_verdicts.get(i)
            row.set_state(sv.verdict if sv else None, sv.note if sv else "")
            self.rows.append(row)
        for row in self.rows:
            row.changed.connect(self._save)
            row.clicked.connect(self._row_clicked)
            row.note.installEventFilter(self._note_keys)
            self.rows_layout.insertWidget(self.rows_layout.count() - 1, row)
        self.set_current_row(0)

    def _row_clicked(self, sentence_index: int | None) -> None:
        self.set_current_row(0 if sentence_index is None else sentence_index + 1)

    def set_current_row(self, i: int) -> None:
        if not self.rows:
            return
        self.current_row = max(0, min(i, len(self.rows) - 1))
        for j, row in enumerate(self.rows):
            row.set_current(j == self.current_row)
        self._show_overlay_for_row()

    def move_row(self, step: int) -> None:
        self.set_current_row(self.current_row + step)

    def focus_note(self) -> None:
        if self.rows:
            self.rows[self.current_row].note.setFocus()

    def leave_note(self) -> None:
        """Enter / Esc in a note: save it and hand the keys back to the verdict shortcuts."""
        self._commit_note()
        self.setFocus(Qt.FocusReason.OtherFocusReason)

    def _escape(self) -> None:
        if self.window().isFullScreen():
            self.toggle_full_screen()
        self.setFocus()

    # -- verdicts ------------------------------------------------------------------------------------------
    def set_verdict(self, verdict: str) -> None:
        """Shortcut 1/2/3: set (or, when it is already set, clear) the verdict on the current row."""
        if not self.rows:
            return
        row = self.rows[self.current_row]
        row.choose(None if row.verdict() == verdict else verdict)

    def _save(self, sentence_index: int | None, verdict: str | None, note: str) -> None:
        if self.item is None:
            return
        self.last_job = self.hub.call(
            self.backend.set_verdict, self.item.id, sentence_index, verdict, note, serial=True,
            on_result=lambda _r: self._refresh_progress(),
            on_error=lambda m: messages.show_error(self, "Verdict not saved", m),
        )

    def _refresh_progress(self) -> None:
        if self.session is None:
            return
        self.hub.call(self.backend.review_progress, self.session, serial=True, on_result=self._show_progress)

    def _show_progress(self, progress: tuple[int, int]) -> None:
        # The bar appears with its first count: shown before it, a QProgressBar whose value is
        # still below its range draws no text at all.
        reviewed, total = progress
        self.progress.setRange(0, total)
        self.progress.setValue(reviewed)
        self.progress.setVisible(True)

    # -- grounding -----------------------------------------------------------------------------------------
    def _grounded(self, grounding: Any, seq: int) -> None:
        if seq != self._seq:
            return
        self.grounding = grounding
        if grounding is None:
            self.grounding_note.setText("Grounding is not available for this model: no support tints or "
                                        "region maps.")
            return
        note = "Tint: support of each phrase and sentence (red weak, green strong)."
        if not getattr(grounding, "calibrated", False):
            note += " Supports are uncalibrated for this model's weights: 0.5 does not mean undecided."
        self.grounding_note.setText(note)
        self.caption.setHtml(self._caption_html(self.item, grounding))
        sup = list(getattr(grounding, "sentence_supports", []) or [])
        for row in self.rows[1:]:
            i = row.sentence_index
            row.set_tint(sup[i] if i is not None and i < len(sup) else None)
        self._show_overlay_for_row()

    def _caption_html(self, item: Any, grounding: Any) -> str:
        text = item.caption
        spans = []
        if grounding is not None:
            last = 0
            for i, pm in sorted(enumerate(grounding.phrases), key=lambda t: t[1].phrase.start):
                p = pm.phrase
                if p.start < last or p.end > len(text) or p.start >= p.end:
                    continue  # overlapping or out of range: shown untinted
                spans.append((p.start, p.end, i, pm.support))
                last = p.end
        out = []
        pos = 0
        fg = self.palette().color(self.palette().ColorRole.Text).name()
        for s, e, i, support in spans:
            out.append(html.escape(text[pos:s]))
            c = overlay.support_tint(support, 110)
            out.append(f'<a href="phrase:{i}" style="color:{fg}; text-decoration:none; '
                       f'background-color: rgba({c.red()},{c.green()},{c.blue()},{c.alpha()});">'
                       f"{html.escape(text[s:e])}</a>")
            pos = e
        out.append(html.escape(text[pos:]))
        size = self.font().pointSizeF() + 2
        return f'<div style="font-size:{size:.0f}pt; line-height:140%;">{"".join(out)}</div>'

    def _hover_link(self, url: QUrl) -> None:
        s = url.toString()
        if s.startswith("phrase:") and self.grounding is not None:
            self.show_phrase_overlay(int(s.split(":", 1)[1]))
        else:
            self.hover_ended()

    def hover_ended(self) -> None:
        """Back from a hovered phrase's map to the selected row's maps (none for the whole item)."""
        self._hovered = None
        self._show_overlay_for_row()

    def hovered_phrase(self) -> int | None:
        return self._hovered

    def show_phrase_overlay(self, i: int) -> None:
        g = self.grounding
        if g is None or not 0 <= i < len(g.phrases):
            return
        self._hovered = i
        pm = g.phrases[i]
        self.canvas.set_overlay(overlay.heatmap_image(pm.heatmap, pm.support), 0.6)

    def _show_overlay_for_row(self) -> None:
        """The selected sentence's phrases (strongest regions), or nothing for the whole item."""
        g = self.grounding
        if g is None or self.item is None or self.current_row == 0:
            self.canvas.clear_overlay()
            return
        si = self.current_row - 1
        if si >= len(self.item.sentences):
            return
        s, e = self.item.sentences[si]
        own = [pm for pm in g.phrases if s <= pm.phrase.start < e]
        if own:
            self.canvas.set_overlay(overlay.all_phrases_image([pm.heatmap for pm in own],
                                                              [pm.support for pm in own]), 0.55)
        else:
            self.canvas.clear_overlay()

    # -- export, full screen ------------------------------------------------------------------------------
    def export_dialog(self) -> None:
        if self.session is None:
            return
        stem = os.path.splitext(os.path.basename(self.session.caption_file))[0]
        dest = messages.choose_save_file(self, "Export verdicts", "JSON Lines (*.jsonl);;CSV (*.csv)",
                                         f"{stem}-verdicts.jsonl")
        if dest:
            self.export(dest)

    def xmp_export_dialog(self) -> Job | None:
        """Export to XMP sidecars: the dialog opens once every verdict and note already given has
        been saved (they go through the same ordered thread), so the export sees all of them."""
        if self.session is None:
            return None
        self._commit_note()
        session = self.session
        job = self.hub.call(lambda: None, serial=True, on_result=lambda _r: self._open_xmp_dialog(session))
        self.last_job = job
        return job

    def _open_xmp_dialog(self, session: Any) -> None:
        if session is not self.session:
            return  # another file was opened meanwhile
        dlg = XmpExportDialog(self.backend, self.hub, session.caption_file, self)
        dlg.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose, True)
        dlg.destroyed.connect(lambda _o=None: setattr(self, "xmp_dialog", None))
        self.xmp_dialog = dlg
        dlg.open()

    def export(self, dest: str) -> Job | None:
        if self.session is None:
            return None
        self._commit_note()
        job = self.hub.call(self.backend.export_review, self.session, dest, serial=True,
                            on_result=lambda n: self.file_label.setText(
                                f"Exported {n} items to {os.path.basename(dest)}"),
                            on_error=lambda m: messages.show_error(self, "Export failed", m))
        self.last_job = job
        return job

    def toggle_full_screen(self) -> None:
        """F: the whole screen for the picture and the caption (the main window hides its library
        panel on full_screen_changed); F or Esc again returns."""
        w = self.window()
        if w.isFullScreen():
            w.showNormal()
            self.full_screen_changed.emit(False)
        else:
            w.showFullScreen()
            self.full_screen_changed.emit(True)
