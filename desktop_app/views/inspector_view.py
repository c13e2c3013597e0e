"""Inspector: one picture large (zoom, pan), the query's phrases with their support, and overlays.

Grounding (phrases, support, region maps) comes from the engine through Backend.ground;
this view only shows it. When the model has no grounder the overlay controls are disabled
and the view says so.
"""

from __future__ import annotations

import html
import os
from typing import Any

import numpy as np
from PySide6.QtCore import QModelIndex, QRect, QSize, Qt, Signal
from PySide6.QtGui import QColor, QImage, QKeySequence, QPainter, QPalette, QShortcut
from PySide6.QtWidgets import (
    QButtonGroup,
    QFrame,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QPlainTextEdit,
    QPushButton,
    QRadioButton,
    QScrollArea,
    QSlider,
    QSplitter,
    QStyle,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from desktop_app import theme
from desktop_app.background import Job, WorkerHub
from desktop_app.dialogs import messages
from desktop_app.facade import Backend, LonglensError, date_text, display_text
from desktop_app.widgets import overlay
from desktop_app.widgets.image_canvas import ImageCanvas

SupportRole = Qt.ItemDataRole.UserRole + 1
ColourRole = Qt.ItemDataRole.UserRole + 2

NO_GROUNDING = ("Grounding is not available for this model, so phrase support and region overlays "
                "are disabled.")
UNCALIBRATED = ("Supports are uncalibrated: no calibration has been fitted for this model's weights, so "
                "0.5 does not mean undecided. Compare phrases with each other.")


def grounding_caption(grounding: Any) -> str:
    """One line on how the maps and supports were made: the map method, and whether supports are
    calibrated (the engine's Grounding.calibrated)."""
    method = getattr(grounding, "method", "") or "maps"
    state = "calibrated supports" if getattr(grounding, "calibrated", False) else "uncalibrated supports"
    return f"{method} · {state}"


# Keys of the inspector (also in the main window's keyboard help).
BACK_KEYS = ("Esc", "Backspace")
NEXT_KEYS = ("J", "Alt+Right")
PREVIOUS_KEYS = ("K", "Alt+Left")
SELECT_NOTICE = "Select a phrase: its map shows where, its brightness how strong the support."
# Below this support a phrase's map is drawn so faint that the notice says why.
WEAK_SUPPORT = 0.2
KIND_NOTES = {
    "setting": "a setting: its map is the picture's background, around the things named",
    "relation": "a relation between two things: its map covers both",
}


def phrase_label(phrase: Any) -> str:
    """The row's words: a relation's claim ("a camel on the sand"); its span alone ("on") says nothing."""
    return phrase.claim if phrase.kind == "relation" else phrase.text


class PhraseDelegate(QStyledItemDelegate):
    """A phrase with its support as a bar and a number."""

    def sizeHint(self, option: QStyleOptionViewItem, index: QModelIndex) -> QSize:
        # One text line and the support bar under it: compact, so a 640 px high window lists
        # several phrases (it showed two).
        return QSize(200, option.fontMetrics.height() + 16)

    def paint(self, painter: QPainter, option: QStyleOptionViewItem, index: QModelIndex) -> None:
        painter.save()
        r = option.rect.adjusted(2, 2, -2, -2)
        pal = option.palette
        selected = bool(option.state & QStyle.StateFlag.State_Selected)
        painter.fillRect(r, pal.color(QPalette.ColorRole.Highlight) if selected else pal.color(QPalette.ColorRole.Base))
        support = float(index.data(SupportRole) or 0.0)
        colour = index.data(ColourRole)
        fm = option.fontMetrics
        text_col = pal.color(QPalette.ColorRole.HighlightedText if selected else QPalette.ColorRole.Text)
        x = r.left() + 6
        if colour:
            painter.fillRect(QRect(x, r.top() + 6, 10, 10), QColor(colour))
            x += 16
        score = f"{support:.2f}"
        sw = fm.horizontalAdvance("0.00") + 6
        painter.setPen(text_col)
        text = fm.elidedText(index.data(Qt.ItemDataRole.DisplayRole) or "", Qt.TextElideMode.ElideRight,
                             r.right() - x - sw - 6)
        painter.drawText(QRect(x, r.top() + 3, r.right() - x - sw, fm.height()), Qt.AlignmentFlag.AlignVCenter, text)
        painter.drawText(QRect(r.right() - sw, r.top() + 3, sw - 4, fm.height()),
                         Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter, score)
        bar = QRect(r.left() + 6, r.top() + fm.height() + 5, r.width() - 12, 4)
        painter.fillRect(bar, pal.color(QPalette.ColorRole.Mid))
        fill = QRect(bar)
        fill.setWidth(int(bar.width() * max(0.0, min(1.0, support))))
        rgb = overlay.ramp_rgb(np.array([max(0.15, support)]))[0]
        painter.fillRect(fill, QColor(int(rgb[0]), int(rgb[1]), int(rgb[2])))
        painter.restore()


# Why an overlay of a library's picture is saved beside the library and not next to the picture:
# the app never writes into photo folders (docs/reliability.md, row 7; engine/outputs.py), and a
# PNG there would be indexed at the next re-scan as a new picture, a near-duplicate of the photo.
OUTSIDE_LIBRARY_NOTE = ("The overlay is saved beside the library folder, not in it: Longlens writes nothing "
                        "into photo folders, and a PNG there would be indexed as a new picture at the next re-scan.")


class InspectorView(QWidget):
    find_similar = Signal(object)  # image path
    back_requested = Signal()  # Esc / Backspace: back to the results
    step_requested = Signal(int)  # +1 next result, -1 previous (J / K, Alt+Right / Alt+Left)
    exported = Signal(str)  # the overlay was saved there (the main window confirms it)
    status_message = Signal(str)  # a note for the status bar (why the save dialog opens where it does)

    def __init__(self, backend: Backend, hub: WorkerHub, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.backend = backend
        self.hub = hub
        self.hit: Any = None
        self.path: str | None = None
        self.query: dict[str, str | None] = {}
        self.grounding: Any = None
        self._seq = 0
        self.image_job: Job | None = None
        self.ground_job: Job | None = None
        self.metadata_job: Job | None = None

        # -- canvas + zoom bar ----------------------------------------------------------------
        self.canvas = ImageCanvas()
        self.canvas.setObjectName("inspector-canvas")
        self.canvas.set_message("Open a result (Enter or double-click) to inspect it here.")
        zoom_bar = QHBoxLayout()
        zoom_bar.setContentsMargins(0, 0, 0, 0)
        for text, tip, slot in (("Fit", "Fit to window (0)", self.canvas.fit),
                                ("100%", "Actual pixels (Ctrl+1)", self.canvas.actual_size),
                                ("−", "Zoom out (-)", lambda: self.canvas.zoom_by(0.8)),
                                ("+", "Zoom in (+)", lambda: self.canvas.zoom_by(1.25))):
            b = QToolButton()
            b.setText(text)
            b.setToolTip(tip)
            b.clicked.connect(slot)
            zoom_bar.addWidget(b)
        self.zoom_label = QLabel("")
        zoom_bar.addWidget(self.zoom_label)
        zoom_bar.addStretch(1)
        self.back_button = QToolButton()
        self.back_button.setText("← Results")
        self.back_button.setToolTip("Back to the results (Esc or Backspace)")
        self.back_button.clicked.connect(self.back_requested)
        self.previous_button = QToolButton()
        self.previous_button.setText("‹ Previous")
        self.previous_button.setToolTip("Previous result (K or Alt+Left)")
        self.previous_button.clicked.connect(lambda: self.step_requested.emit(-1))
        self.next_button = QToolButton()
        self.next_button.setText("Next ›")
        self.next_button.setToolTip("Next result (J or Alt+Right)")
        self.next_button.clicked.connect(lambda: self.step_requested.emit(1))
        for b in (self.back_button, self.previous_button, self.next_button):
            zoom_bar.addWidget(b)
        self.canvas.zoom_changed.connect(lambda z: self.zoom_label.setText(f"{z * 100:.0f}%"))
        left = QWidget()
        ll = QVBoxLayout(left)
        ll.setContentsMargins(0, 0, 0, 0)
        ll.addLayout(zoom_bar)
        ll.addWidget(self.canvas, 1)

        # -- side panel -----------------------------------------------------------------------
        self.title = QLabel("")
        self.title.setWordWrap(True)
        f = self.title.font()
        f.setPointSizeF(f.pointSizeF() + 2)
        f.setBold(True)
        self.title.setFont(f)
        self.details = QLabel("")
        self.details.setWordWrap(True)
        self.details.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.similar_button = QPushButton("Find similar")
        self.similar_button.setEnabled(False)
        self.similar_button.clicked.connect(lambda: self.path and self.find_similar.emit(self.path))

        self.query_label = QPlainTextEdit()
        self.query_label.setReadOnly(True)
        self.query_label.setObjectName("inspector-query")
        # Four lines (it scrolls): the phrase list below needs the height more.
        self.query_label.setMaximumHeight(self.query_label.fontMetrics().lineSpacing() * 4 + 12)

        self.notice = QLabel("")
        self.notice.setObjectName("grounding-notice")
        self.notice.setWordWrap(True)
        self.calibration_note = QLabel("")
        self.calibration_note.setObjectName("calibration-note")
        self.calibration_note.setWordWrap(True)
        self.calibration_note.hide()

        self.mode_phrase = QRadioButton("Selected phrase")
        self.mode_all = QRadioButton("All phrases")
        self.mode_phrase.setChecked(True)
        self.mode_group = QButtonGroup(self)
        self.mode_group.addButton(self.mode_phrase)
        self.mode_group.addButton(self.mode_all)
        self.mode_phrase.toggled.connect(lambda _on: self._render_overlay())
        self.phrases = QListWidget()
        self.phrases.setObjectName("phrase-list")
        self.phrases.setMinimumHeight((self.phrases.fontMetrics().height() + 16) * 3 + 6)  # three rows at least
        self.phrases.setItemDelegate(PhraseDelegate(self.phrases))
        self.phrases.currentRowChanged.connect(lambda _r: self._phrase_selected())
        self.opacity = QSlider(Qt.Orientation.Horizontal)
        self.opacity.setRange(0, 100)
        self.opacity.setValue(60)
        self.opacity.valueChanged.connect(lambda v: self.canvas.set_overlay_opacity(v / 100))
        self.legend = overlay.Legend()
        self.export_button = QPushButton("Export overlay as PNG…")
        self.export_button.clicked.connect(self.export_dialog)

        modes = QHBoxLayout()
        modes.addWidget(self.mode_phrase)
        modes.addWidget(self.mode_all)
        op_row = QHBoxLayout()
        op_row.addWidget(QLabel("Opacity"))
        op_row.addWidget(self.opacity, 1)
        self.phrase_box = QGroupBox("Phrases and support")
        pb = QVBoxLayout(self.phrase_box)
        pb.addWidget(self.notice)
        pb.addWidget(self.calibration_note)
        pb.addLayout(modes)
        pb.addWidget(self.phrases, 1)
        pb.addLayout(op_row)
        pb.addWidget(self.legend)
        pb.addWidget(self.export_button)

        # What the photo's XMP says (embedded, or a Lightroom / darktable / digiKam sidecar).
        self.metadata_box = QFrame()
        self.metadata_box.setObjectName("inspector-metadata")
        self.metadata_box.setFrameShape(QFrame.Shape.StyledPanel)
        self.metadata_label = QLabel("")
        self.metadata_label.setWordWrap(True)
        self.metadata_label.setTextFormat(Qt.TextFormat.RichText)  # the title in bold, escaped
        self.metadata_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.keywords_label = QLabel("")
        self.keywords_label.setObjectName("inspector-keywords")
        self.keywords_label.setTextFormat(Qt.TextFormat.PlainText)  # a keyword is never markup
        self.keywords_label.setWordWrap(True)
        self.keywords_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.metadata_problems = QLabel("")
        self.metadata_problems.setObjectName("inspector-metadata-problems")
        self.metadata_problems.setTextFormat(Qt.TextFormat.PlainText)
        self.metadata_problems.setWordWrap(True)
        fields = QWidget()
        fl = QVBoxLayout(fields)
        fl.setContentsMargins(0, 0, 4, 0)
        self.metadata_details = QLabel("")
        self.metadata_details.setWordWrap(True)
        self.metadata_details.setTextFormat(Qt.TextFormat.PlainText)
        self.metadata_details.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        # Most telling first: when the window is small only the first line shows (the rest scrolls).
        fl.addWidget(self.metadata_label)
        fl.addWidget(self.keywords_label)
        fl.addWidget(self.metadata_details)
        # Every field read and where it came from (smaller: it is the detail behind the lines above).
        self.metadata_fields = QLabel("")
        self.metadata_fields.setObjectName("inspector-metadata-fields")
        self.metadata_fields.setWordWrap(True)
        self.metadata_fields.setTextFormat(Qt.TextFormat.PlainText)
        self.metadata_fields.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        small = self.metadata_fields.font()
        small.setPointSizeF(max(small.pointSizeF() - 1, 7))
        self.metadata_fields.setFont(small)
        fl.addWidget(self.metadata_fields)
        fl.addWidget(self.metadata_problems)
        fl.addStretch(1)
        # A long description scrolls inside the box: the phrase list keeps its room at 1024x640.
        self.metadata_scroll = QScrollArea()
        self.metadata_scroll.setWidget(fields)
        self.metadata_scroll.setWidgetResizable(True)
        self.metadata_scroll.setFrameShape(QFrame.Shape.NoFrame)
        self.metadata_scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        line_h = self.metadata_label.fontMetrics().lineSpacing()
        self.metadata_scroll.setMinimumHeight(line_h + 4)
        self.metadata_scroll.setMaximumHeight(line_h * 7 + 4)
        mb = QVBoxLayout(self.metadata_box)
        mb.setContentsMargins(6, 4, 2, 4)
        mb.addWidget(self.metadata_scroll)
        self.metadata_box.setVisible(False)

        query_box = QGroupBox("Query")
        qb = QVBoxLayout(query_box)
        qb.addWidget(self.query_label)

        side = QWidget()
        sl = QVBoxLayout(side)
        sl.setContentsMargins(8, 0, 0, 0)
        sl.addWidget(self.title)
        sl.addWidget(self.details)
        sl.addWidget(self.similar_button)
        line = QFrame()
        line.setFrameShape(QFrame.Shape.HLine)
        sl.addWidget(line)
        sl.addWidget(self.metadata_box)
        sl.addWidget(query_box)
        sl.addWidget(self.phrase_box, 1)
        # The panel scrolls rather than setting the window's height: a long file name, path or
        # notice must not push the window past 640 px.
        self.side_scroll = QScrollArea()
        self.side_scroll.setObjectName("inspector-side")
        self.side_scroll.setWidget(side)
        self.side_scroll.setWidgetResizable(True)
        self.side_scroll.setFrameShape(QFrame.Shape.NoFrame)
        self.side_scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.side_scroll.setMinimumWidth(300)
        self.side_scroll.setMaximumWidth(460)

        split = QSplitter()
        split.addWidget(left)
        split.addWidget(self.side_scroll)
        split.setStretchFactor(0, 1)
        split.setStretchFactor(1, 0)
        split.setSizes([900, 360])
        lay = QVBoxLayout(self)
        lay.setContentsMargins(10, 10, 10, 6)
        lay.addWidget(split)
        self.setFocusProxy(self.canvas)  # a view switch gives the keyboard to the picture
        for keys, slot in ((BACK_KEYS, self.back_requested.emit), (NEXT_KEYS, lambda: self.step_requested.emit(1)),
                           (PREVIOUS_KEYS, lambda: self.step_requested.emit(-1))):
            for key in keys:
                sc = QShortcut(QKeySequence(key), self)
                sc.setContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)
                sc.activated.connect(slot)
        self._set_overlay_enabled(False)

    # -- showing a picture ---------------------------------------------------------------------
    def show_hit(self, hit: Any, query: dict[str, str | None]) -> None:
        self.hit = hit
        self._show(hit.path, query, score=hit.score, rank=hit.rank,
                   date=date_text(hit), camera=getattr(hit, "camera", None),
                   image_id=getattr(hit, "image_id", None))

    def show_path(self, path: str, query: dict[str, str | None]) -> None:
        self.hit = None
        self._show(path, query)

    def _show(self, path: str, query: dict[str, str | None], *, score: float | None = None,
              rank: int | None = None, date: str | None = None, camera: str | None = None,
              image_id: int | None = None) -> None:
        self._seq += 1
        seq = self._seq
        self.path = path
        self.query = dict(query)
        self.grounding = None
        self.title.setText(display_text(os.path.basename(path)))
        bits = [display_text(path)]
        if score is not None:
            bits.append(f"score {score:.4f} · rank {rank}")
        if date:
            bits.append(date)  # "taken …" or "file time … (no EXIF, XMP or IPTC date)" (facade.date_text)
        if camera:
            bits.append(camera)
        self.details.setText("\n".join(bits))
        self.similar_button.setEnabled(True)
        text = query.get("text")
        if text:
            self.query_label.setPlainText(text)
        elif query.get("image"):
            self.query_label.setPlainText(f"Similar to {os.path.basename(query['image'])} (image query)")
        else:
            self.query_label.setPlainText("—")
        self.phrases.clear()
        self.calibration_note.hide()
        self.legend.show_ramp()
        self._set_overlay_enabled(False)
        self.canvas.set_image(None)
        self.canvas.set_message("Loading…")
        self.image_job = self.hub.call(self.backend.display_image, path, 4096,
                                       on_result=lambda img, s=seq: self._image_loaded(img, s),
                                       on_error=lambda m, s=seq: self._image_failed(m, s))
        self.show_metadata(None)
        self.metadata_job = self.hub.call(self.backend.photo_metadata, path, image_id,
                                          on_result=lambda m, s=seq: self._metadata_loaded(m, s))
        if text:
            self.notice.setText("Grounding the query in this picture…")
            self.ground_job = self.hub.call(self.backend.ground, path, text,
                                            on_result=lambda g, s=seq: self._grounded(g, s),
                                            on_error=lambda m, s=seq: self._ground_failed(m, s))
        else:
            self.ground_job = None
            self.notice.setText("Phrase overlays need a text query.")

    def _metadata_loaded(self, meta: dict[str, Any] | None, seq: int) -> None:
        if seq == self._seq:
            self.show_metadata(meta)

    def show_metadata(self, meta: dict[str, Any] | None) -> None:
        """The picture's metadata (Backend.photo_metadata: what `longlens search --json` gives too),
        or nothing when it has none: title, rating, colour and pick labels; keywords once each;
        description, the other languages' titles and descriptions, date as known, camera, lens,
        GPS; then every field read, where it came from, and those not in effect with their note."""
        if not meta or not any(meta.get(k) not in (None, [], "") for k in
                               ("title", "description", "rating", "label", "pick", "taken_at", "keywords",
                                "problems", "camera", "lens", "gps", "fields")):
            self.metadata_box.setVisible(False)
            return
        head = [f"<b>{html.escape(meta['title'])}</b>"] if meta.get("title") else []
        rating = meta.get("rating")
        if rating is not None:
            head.append("Rejected" if rating < 0 else ("Unrated" if rating == 0 else "★" * rating + "☆" * (5 - rating)))
        if meta.get("label"):
            head.append(f"{html.escape(meta['label'])} label")
        if meta.get("pick_text"):
            head.append(html.escape(meta["pick_text"]))
        self.metadata_label.setText(" · ".join(head))
        self.metadata_label.setVisible(bool(head))
        details = [meta["description"]] if meta.get("description") else []
        for key, word in (("titles", "Title"), ("descriptions", "Description")):
            entries = meta.get(key) or []
            # The x-default entry is the title / description above; the others by language.
            details += [f"{word} ({e['language']}): {e['text']}" for e in entries[1:] if e.get("text")]
        if meta.get("taken_at"):
            # As written: a partial date stays partial ("2023-06"), never a made-up midnight.
            source = "IPTC date" if meta.get("taken_from") == "iptc" else "XMP date"
            details.append(f"dated {meta['taken_at'].replace('T', ' ')} ({source})")
        gear = [f"Camera: {meta['camera']}"] if meta.get("camera") else []
        gear += [f"Lens: {meta['lens']}"] if meta.get("lens") else []
        if gear:
            details.append(" · ".join(gear))
        if meta.get("gps_text"):
            details.append(f"GPS: {meta['gps_text']}")
        self.metadata_details.setText("\n".join(details))
        self.metadata_details.setVisible(bool(details))
        words = meta.get("keyword_text") or []
        self.keywords_label.setText(("Keywords: " + ", ".join(words)) if words else "")
        self.keywords_label.setVisible(bool(words))
        fields = meta.get("field_lines") or []
        self.metadata_fields.setText(("Fields read (name = value — where):\n" + "\n".join(fields)) if fields else "")
        self.metadata_fields.setVisible(bool(fields))
        problems = meta.get("problems") or []
        self.metadata_problems.setText("\n".join(problems))
        self.metadata_problems.setStyleSheet(f"color: {theme.warning_colour()};")
        self.metadata_problems.setVisible(bool(problems))
        self.metadata_box.setToolTip("From the photo's metadata (XMP, IPTC, EXIF), read from: "
                                     + ", ".join(meta.get("sources") or ["—"]))
        self.metadata_box.setVisible(True)

    def _image_loaded(self, image: QImage, seq: int) -> None:
        if seq != self._seq:
            return
        self.canvas.set_image(image)
        self._render_overlay()

    def _image_failed(self, message: str, seq: int) -> None:
        if seq != self._seq:
            return
        self.canvas.set_message(f"This picture cannot be shown: {message}")

    def _ground_failed(self, message: str, seq: int) -> None:
        if seq != self._seq:
            return
        self.notice.setText(f"Grounding failed: {message}")

    def _grounded(self, grounding: Any, seq: int) -> None:
        if seq != self._seq:
            return
        self.set_grounding(grounding)

    # -- grounding ---------------------------------------------------------------------------------
    def set_grounding(self, grounding: Any) -> None:
        self.grounding = grounding
        self.phrases.clear()
        if grounding is None:
            self.notice.setText(NO_GROUNDING)
            self.calibration_note.hide()
            self._set_overlay_enabled(False)
            self.canvas.clear_overlay()
            return
        self.notice.setText(SELECT_NOTICE)
        calibrated = bool(getattr(grounding, "calibrated", False))
        self.calibration_note.setText(grounding_caption(grounding) + ("" if calibrated else "\n" + UNCALIBRATED))
        self.calibration_note.setToolTip(f"model {getattr(grounding, 'model_id', '')}")
        self.calibration_note.show()
        for i, pm in enumerate(grounding.phrases):
            label = phrase_label(pm.phrase)
            item = QListWidgetItem(label)
            item.setData(SupportRole, float(pm.support))
            item.setData(ColourRole, overlay.PHRASE_COLOURS[i % len(overlay.PHRASE_COLOURS)])
            state = "" if calibrated else ", uncalibrated"
            kind = KIND_NOTES.get(pm.phrase.kind, pm.phrase.kind.replace("_", " "))
            item.setToolTip(f"{label}\nsupport {pm.support:.3f} ({kind}{state})")
            self.phrases.addItem(item)
        self._set_overlay_enabled(bool(grounding.phrases))
        if grounding.phrases:
            best = max(range(len(grounding.phrases)), key=lambda i: grounding.phrases[i].support)
            self.phrases.setCurrentRow(best)
        self._render_overlay()

    def _set_overlay_enabled(self, on: bool) -> None:
        controls = (self.mode_phrase, self.mode_all, self.phrases, self.opacity, self.legend, self.export_button)
        if not on and any(w.hasFocus() for w in controls):
            # A disabled widget passes the keyboard on down the focus chain, out of this view
            # (J / K and Esc would then stop working): keep it on the picture.
            self.canvas.setFocus(Qt.FocusReason.OtherFocusReason)
        for w in controls:
            w.setEnabled(on)

    def set_mode(self, mode: str) -> None:
        (self.mode_all if mode == "all" else self.mode_phrase).setChecked(True)

    def mode(self) -> str:
        return "all" if self.mode_all.isChecked() else "phrase"

    def select_phrase(self, row: int) -> None:
        self.set_mode("phrase")
        self.phrases.setCurrentRow(row)

    def _phrase_selected(self) -> None:
        if self.mode() == "phrase":
            self._render_overlay()

    def _render_overlay(self) -> None:
        g = self.grounding
        if g is None or not g.phrases or self.canvas.image().isNull():
            self.canvas.clear_overlay()
            return
        opacity = self.opacity.value() / 100
        if self.mode() == "all":
            self.canvas.set_overlay(overlay.all_phrases_image([pm.heatmap for pm in g.phrases],
                                                              [pm.support for pm in g.phrases]), opacity)
            self.legend.show_phrases([f"{phrase_label(pm.phrase)} ({pm.support:.2f})" for pm in g.phrases])
        else:
            row = self.phrases.currentRow()
            if not 0 <= row < len(g.phrases):
                self.canvas.clear_overlay()
                return
            pm = g.phrases[row]
            self.canvas.set_overlay(overlay.heatmap_image(pm.heatmap, pm.support), opacity)
            self.legend.show_ramp()
            if pm.support < WEAK_SUPPORT:
                self.notice.setText(f"“{phrase_label(pm.phrase)}” has support {pm.support:.2f}: the picture "
                                    "hardly supports it, so its map is drawn faint.")
            else:
                self.notice.setText(SELECT_NOTICE)

    # -- export --------------------------------------------------------------------------------------
    def export_dialog(self) -> None:
        if not self.canvas.has_overlay():
            messages.show_error(self, "Nothing to export", "Select a phrase first: there is no overlay to export.")
            return
        suggested = self.export_suggestion()
        if self.path and os.path.dirname(suggested) != os.path.dirname(os.path.realpath(self.path)):
            self.status_message.emit(OUTSIDE_LIBRARY_NOTE)
        dest = messages.choose_save_file(self, "Export overlay", "PNG image (*.png)", suggested)
        if dest:
            self.export_overlay(dest)

    def export_suggestion(self) -> str:
        """The path the save dialog proposes: next to the picture (next to its photo folder when
        it is in a library, where Longlens never writes: OUTSIDE_LIBRARY_NOTE), named after it."""
        stem = os.path.splitext(os.path.basename(self.path or "overlay"))[0]
        folder = self.backend.export_folder_for(self.path) if self.path else os.path.expanduser("~")
        return os.path.join(folder, f"{stem}-overlay.png")

    def _legend_for_export(self) -> tuple[str, list[tuple[QColor, str]], float | None]:
        g = self.grounding
        if self.mode() == "all":
            entries = [(overlay.phrase_colour(i), f"{phrase_label(pm.phrase)} ({pm.support:.2f})")
                       for i, pm in enumerate(g.phrases)]
            return "All phrases: each colour marks its phrase's strongest region", entries, None
        pm = g.phrases[self.phrases.currentRow()]
        return f"“{phrase_label(pm.phrase)}”: support {pm.support:.2f}", [], float(pm.support)

    def export_overlay(self, dest: str) -> bool:
        """Save the picture with the current overlay at full resolution as PNG, with a band below
        it naming the phrase and explaining the colours."""
        from PySide6.QtCore import QSaveFile
        from PySide6.QtGui import QImageWriter

        if not dest.lower().endswith(".png"):
            dest += ".png"
        try:  # never over the photo itself, another photo, or into a library folder
            self.backend.check_export_path(dest, [self.path] if self.path else [])
        except LonglensError as exc:
            messages.show_error(self, "Export refused", str(exc))
            return False
        composed = overlay.compose(self.canvas.image(), self.canvas.overlay(), self.canvas.overlay_opacity())
        title, entries, support = self._legend_for_export()
        composed = overlay.with_legend(composed, title, entries, support)
        f = QSaveFile(dest)  # written to a temporary file and renamed: never half a PNG
        if not f.open(QSaveFile.OpenModeFlag.WriteOnly):
            messages.show_error(self, "Export failed", f"Cannot write {dest}: {f.errorString()}")
            return False
        writer = QImageWriter(f, b"png")
        if not writer.write(composed) or not f.commit():
            f.cancelWriting()
            messages.show_error(self, "Export failed", f"Cannot write {dest}: {writer.errorString()}")
            return False
        self.exported.emit(dest)
        return True
