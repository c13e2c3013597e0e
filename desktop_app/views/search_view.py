"""Search: the paragraph editor with its token budget, image queries, filters and the results grid."""

from __future__ import annotations

import html
import os
from pathlib import Path
from typing import Any

from PySide6.QtCore import QDate, QEvent, QModelIndex, QObject, QSize, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QKeySequence, QPixmap, QShortcut, QTextCursor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QComboBox,
    QDateEdit,
    QDialog,
    QDoubleSpinBox,
    QFrame,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListView,
    QMenu,
    QPushButton,
    QSpinBox,
    QStackedWidget,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from desktop_app import theme
from desktop_app.background import Job, WorkerHub
from desktop_app.dialogs import messages
from desktop_app.facade import THUMBNAIL_PX, Backend, display_text
from desktop_app.thumbnails import ThumbnailLoader
from desktop_app.views.results_model import HitRole, ResultsModel
from desktop_app.widgets.paragraph_edit import ParagraphEdit
from desktop_app.widgets.thumbnail_delegate import ThumbnailDelegate

ALL_FOLDERS = "All folders"
READY_TEXT = "Type a description and press Ctrl+Enter."
# How long after the last change of a filter the search runs again (typing a camera name).
RERUN_DELAY_MS = 400
ANY_LABEL = "Any label"
# The rating filter's choices: (shown, minimum rating given to the engine; None: no filter).
RATING_CHOICES = (("Any rating", None), ("Not rejected", 0), ("★ or more", 1), ("★★ or more", 2),
                  ("★★★ or more", 3), ("★★★★ or more", 4), ("★★★★★", 5))
LABEL_CHOICES = (ANY_LABEL, "Red", "Yellow", "Green", "Blue", "Purple")


class QuickLook(QDialog):
    """Space on a result: the picture large, closed again with Space or Esc."""

    def __init__(self, backend: Backend, hub: WorkerHub, hit: Any, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle(display_text(os.path.basename(hit.path)))
        self.setObjectName("quick-look")
        self.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose, True)
        self.label = QLabel("Loading…")
        self.label.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.label.setMinimumSize(320, 240)
        caption = QLabel(f"{display_text(hit.path)}    score {hit.score:.4f}")
        caption.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        lay = QVBoxLayout(self)
        lay.addWidget(self.label, 1)
        lay.addWidget(caption)
        top = parent.window() if parent is not None else None
        if top is not None:
            self.resize(int(top.width() * 0.7), int(top.height() * 0.8))
        else:
            self.resize(900, 700)
        self._pix = QPixmap()
        hub.call(backend.display_image, hit.path, 2048, on_result=self._loaded,
                 on_error=lambda m: self.label.setText(f"Cannot show this picture: {m}"))

    def _loaded(self, image) -> None:
        self._pix = QPixmap.fromImage(image)
        self._rescale()

    def _rescale(self) -> None:
        if not self._pix.isNull():
            self.label.setPixmap(self._pix.scaled(self.label.size(), Qt.AspectRatioMode.KeepAspectRatio,
                                                  Qt.TransformationMode.SmoothTransformation))

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self._rescale()

    def keyPressEvent(self, event) -> None:
        if event.key() in (Qt.Key.Key_Space, Qt.Key.Key_Escape):
            self.close()
            return
        super().keyPressEvent(event)


class _GridKeys(QObject):
    """Enter opens the inspector, Space shows a quick look (arrows are the view's own)."""

    def __init__(self, view: SearchView) -> None:
        super().__init__(view)
        self.view = view

    def eventFilter(self, obj: QObject, event: QEvent) -> bool:
        if event.type() == QEvent.Type.KeyPress:
            if event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter):
                self.view.open_current()
                return True
            if event.key() == Qt.Key.Key_Space:
                self.view.quick_look()
                return True
        return False


class SearchView(QWidget):
    open_hit = Signal(object, dict)  # hit, query {"text": str | None, "image": str | None}
    add_folder_requested = Signal()
    demo_requested = Signal()
    results_shown = Signal(int)

    def __init__(self, backend: Backend, hub: WorkerHub, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.backend = backend
        self.hub = hub
        self.setAcceptDrops(True)
        self._seq = 0  # newest search request; older answers are dropped
        self._budget_seq = 0
        self._budget_job: Job | None = None
        self._budget_done: Job | None = None  # the last budget job whose finished was handled
        self._budget_dirty = False
        # The query of the results shown (what the inspector grounds); the query box may say
        # something else until the next search, and the status line then says so.
        self.query: dict[str, str | None] = {"text": None, "image": None}
        self.image_query: str | None = None  # the image the chip shows: searches are by image
        self.last_result: Any = None
        # The results shown are not those of the query box and filters as they are now (a filter
        # changed and the search runs again, or the query was edited and not searched yet).
        self.stale = False
        self._results_status: tuple[str, bool] = ("", False)  # the status line of the results shown
        self.search_job: Job | None = None

        # -- query editor --------------------------------------------------------------------
        self.editor = ParagraphEdit()
        self.editor.setObjectName("query-editor")
        self.editor.image_suffixes = backend.image_suffixes()
        self.editor.setFixedHeight(self.editor.fontMetrics().lineSpacing() * 5 + 16)
        self.editor.submitted.connect(self.search)
        self.editor.image_dropped.connect(self.search_image)
        self.editor.textChanged.connect(self._text_changed)

        self.search_button = QPushButton("Search")
        self.search_button.setDefault(True)
        self.search_button.setToolTip("Ctrl+Enter, from the query or any filter")
        # A click leaves the keyboard where it was (the query), and Tab still reaches the button.
        self.search_button.setFocusPolicy(Qt.FocusPolicy.TabFocus)
        self.search_button.clicked.connect(self.search)
        self.token_label = QLabel("– tokens")
        self.token_label.setObjectName("token-counter")
        self.token_label.setToolTip("Tokens the model reads out of its budget")
        self.trunc_label = QLabel()
        self.trunc_label.setObjectName("truncation-marker")
        self.trunc_label.setWordWrap(True)
        self.trunc_label.setVisible(False)
        side = QVBoxLayout()
        side.addWidget(self.search_button)
        side.addWidget(self.token_label)
        side.addWidget(self.trunc_label)
        side.addStretch(1)
        side_w = QWidget()
        side_w.setLayout(side)
        side_w.setFixedWidth(190)
        top = QHBoxLayout()
        top.addWidget(self.editor, 1)
        top.addWidget(side_w)

        # -- image query chip -------------------------------------------------------------------
        self.image_chip = QFrame()
        self.image_chip.setFrameShape(QFrame.Shape.StyledPanel)
        chip = QHBoxLayout(self.image_chip)
        chip.setContentsMargins(8, 2, 4, 2)
        self.image_chip_label = QLabel()
        clear = QToolButton()
        clear.setText("✕")
        clear.setToolTip("Back to the text query")
        clear.clicked.connect(self.clear_image_query)
        chip.addWidget(self.image_chip_label, 1)
        chip.addWidget(clear)
        self.image_chip.setVisible(False)

        # -- filters ------------------------------------------------------------------------------
        self.folder_box = QComboBox()
        self.folder_box.setEditable(True)
        self.folder_box.addItem(ALL_FOLDERS)
        self.folder_box.setMinimumWidth(160)
        self.folder_box.setToolTip("Search one folder (and its sub-folders), or all of them")
        self.folder_box.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        # Enter in the typed folder searches; it must not add the typed text to the list of folders.
        self.folder_box.setInsertPolicy(QComboBox.InsertPolicy.NoInsert)
        self.folder_box.lineEdit().returnPressed.connect(self.search)
        self.after_check = QCheckBox("From")
        self.after_edit = QDateEdit(QDate.currentDate().addYears(-1))
        self.before_check = QCheckBox("to")
        self.before_edit = QDateEdit(QDate.currentDate())
        for e in (self.after_edit, self.before_edit):
            e.setCalendarPopup(True)
            e.setDisplayFormat("yyyy-MM-dd")
            e.setEnabled(False)
        self.after_check.toggled.connect(self.after_edit.setEnabled)
        self.before_check.toggled.connect(self.before_edit.setEnabled)
        self.camera_edit = QLineEdit()
        self.camera_edit.setObjectName("camera-filter")
        self.camera_edit.setPlaceholderText("Camera (make or model)")
        self.camera_edit.setClearButtonEnabled(True)
        # Wide enough for its whole placeholder (it showed "Ca…" in a 1024 px window) and the
        # clear button.
        self.camera_edit.setMinimumWidth(self.camera_edit.fontMetrics().horizontalAdvance(
            self.camera_edit.placeholderText()) + self.camera_edit.fontMetrics().height() + 28)
        self.camera_edit.setMaximumWidth(320)
        self.camera_edit.returnPressed.connect(self.search)
        self.top_spin = QSpinBox()
        self.top_spin.setRange(*backend.setting_range("top_k"))
        self.top_spin.setValue(int(backend.settings().get("top_k") or 200))
        self.top_spin.setPrefix("top ")
        self.top_spin.setToolTip("How many results to show")
        # Two rows (what is searched; how it is arranged), so the view fits a 1024 px window.
        filters = QHBoxLayout()
        filters.addWidget(QLabel("Folder"))
        filters.addWidget(self.folder_box, 2)
        filters.addSpacing(8)
        filters.addWidget(self.camera_edit, 1)
        filters.addWidget(self.top_spin)

        # -- order and relevance cut-off (engine.search.ordering) ------------------------------------
        self.sort_box = QComboBox()
        self.sort_box.setObjectName("result-order")
        for value, label in backend.result_orders():
            self.sort_box.addItem(label, value)
        self.sort_box.setToolTip("Relevance, or the same results by date (the EXIF date, else the XMP or IPTC "
                                 "date, else the file's modification time)")
        lo, hi = backend.cutoff_range()
        self.cutoff_spin = QDoubleSpinBox()
        self.cutoff_spin.setObjectName("relevance-cutoff")
        self.cutoff_spin.setDecimals(3)
        self.cutoff_spin.setSingleStep(0.01)
        # The engine's range; its lower end (excluded there) is "no cut-off" here.
        self.cutoff_spin.setRange(lo, hi)
        self.cutoff_spin.setSpecialValueText("no cut-off")
        self.cutoff_spin.setPrefix("within ")
        self.cutoff_spin.setToolTip("Show only the results whose score is within this much of the best "
                                    "result's score, so the list ends where the scores fall off")
        self.cutoff_label = QLabel()
        self.cutoff_label.setObjectName("cutoff-divider")
        self.cutoff_label.setWordWrap(True)
        self.cutoff_label.setVisible(False)
        arrange = QHBoxLayout()
        arrange.addWidget(self.after_check)
        arrange.addWidget(self.after_edit)
        arrange.addWidget(self.before_check)
        arrange.addWidget(self.before_edit)
        arrange.addSpacing(12)
        arrange.addWidget(QLabel("Order"))
        arrange.addWidget(self.sort_box)
        arrange.addSpacing(8)
        arrange.addWidget(QLabel("Cut-off"))
        arrange.addWidget(self.cutoff_spin)
        arrange.addSpacing(8)
        arrange.addWidget(self.cutoff_label, 1)

        # What XMP says (Lightroom, darktable, digiKam): keyword, rating, colour label.
        self.keyword_edit = QLineEdit()
        self.keyword_edit.setObjectName("keyword-filter")
        # Short, so it is read whole in a 1024 px window (the label beside it says "Keyword"); the
        # tooltip says how a path matches.
        self.keyword_edit.setPlaceholderText("e.g. Places|Norway or harbour")
        self.keyword_edit.setToolTip("An XMP keyword (as Lightroom, darktable or digiKam wrote it). A path like "
                                     "Places|Norway also finds the keywords under it (Places|Norway|Oslo); "
                                     "case is ignored")
        self.keyword_edit.setClearButtonEnabled(True)
        # Never narrower than its placeholder beside the clear button.
        self.keyword_edit.setMinimumWidth(self.keyword_edit.fontMetrics().horizontalAdvance(
            self.keyword_edit.placeholderText()) + self.keyword_edit.fontMetrics().height() + 28)
        self.keyword_edit.returnPressed.connect(self.search)
        self.rating_box = QComboBox()
        self.rating_box.setObjectName("rating-filter")
        for text, value in RATING_CHOICES:
            self.rating_box.addItem(text, value)
        self.label_box = QComboBox()
        self.label_box.setObjectName("label-filter")
        self.label_box.setEditable(True)  # labels are free text: a German Lightroom writes "Rot"
        self.label_box.addItems(LABEL_CHOICES)
        self.label_box.lineEdit().returnPressed.connect(self.search)
        # GPS: near a place (latitude, longitude) within a radius; the engine checks both values
        # (engine.search.filters) and its message names the field, as the CLI's --near / --km.
        self.near_edit = QLineEdit()
        self.near_edit.setObjectName("near-filter")
        self.near_edit.setPlaceholderText("Near lat, lon")
        self.near_edit.setToolTip("Only pictures taken near this place: latitude and longitude in decimal degrees "
                                  "(south and west negative), e.g. 59.91, 10.75. Pictures with no GPS position "
                                  "are left out")
        self.near_edit.setClearButtonEnabled(True)
        # Its placeholder whole beside the clear button; a typed position scrolls (1024 px window).
        self.near_edit.setMinimumWidth(self.near_edit.fontMetrics().horizontalAdvance(
            self.near_edit.placeholderText()) + self.near_edit.fontMetrics().height() + 20)
        self.near_edit.returnPressed.connect(self.search)
        self.km_edit = QLineEdit()
        self.km_edit.setObjectName("km-filter")
        self.km_edit.setPlaceholderText("km")
        self.km_edit.setToolTip("The distance from that place, in kilometres (more than 0)")
        self.km_edit.setMaximumWidth(self.km_edit.fontMetrics().horizontalAdvance("00000") + 20)
        self.km_edit.returnPressed.connect(self.search)
        xmp_filters = QHBoxLayout()
        xmp_filters.addWidget(QLabel("Keyword"))
        xmp_filters.addWidget(self.keyword_edit, 3)
        xmp_filters.addSpacing(8)
        xmp_filters.addWidget(self.rating_box)
        xmp_filters.addWidget(self.label_box, 1)
        xmp_filters.addSpacing(8)
        xmp_filters.addWidget(self.near_edit, 1)
        xmp_filters.addWidget(self.km_edit)

        # A filter, the order or the cut-off changed: the last search runs again once the user
        # pauses (debounced, in a worker: the GUI thread never waits for it).
        self._rerun_timer = QTimer(self)
        self._rerun_timer.setSingleShot(True)
        self._rerun_timer.setInterval(RERUN_DELAY_MS)
        self._rerun_timer.timeout.connect(self.rerun)
        self.folder_box.editTextChanged.connect(self._filters_changed)
        for check in (self.after_check, self.before_check):
            check.toggled.connect(self._filters_changed)
        for edit in (self.after_edit, self.before_edit):
            edit.dateChanged.connect(self._filters_changed)
        self.camera_edit.textChanged.connect(self._filters_changed)
        self.top_spin.valueChanged.connect(self._filters_changed)
        self.sort_box.currentIndexChanged.connect(self._filters_changed)
        self.cutoff_spin.valueChanged.connect(self._filters_changed)
        self.keyword_edit.textChanged.connect(self._filters_changed)
        self.rating_box.currentIndexChanged.connect(self._filters_changed)
        self.label_box.editTextChanged.connect(self._filters_changed)
        self.near_edit.textChanged.connect(self._filters_changed)
        self.km_edit.textChanged.connect(self._filters_changed)

        # -- results --------------------------------------------------------------------------------
        self.loader = ThumbnailLoader(backend.thumbnail, THUMBNAIL_PX, parent=self)
        self.model = ResultsModel(self.loader, self)
        self.grid = QListView()
        self.grid.setObjectName("results-grid")
        self.grid.setViewMode(QListView.ViewMode.IconMode)
        self.grid.setResizeMode(QListView.ResizeMode.Adjust)
        self.grid.setMovement(QListView.Movement.Static)
        self.grid.setUniformItemSizes(True)
        self.grid.setLayoutMode(QListView.LayoutMode.Batched)
        self.grid.setBatchSize(2000)
        self.grid.setSpacing(4)
        self.grid.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.grid.setVerticalScrollMode(QAbstractItemView.ScrollMode.ScrollPerPixel)
        self.grid.setMouseTracking(True)
        self.delegate = ThumbnailDelegate(self.grid)
        self.grid.setItemDelegate(self.delegate)
        self.grid.setModel(self.model)
        self.grid.doubleClicked.connect(lambda idx: self.open_index(idx))
        self.grid.installEventFilter(_GridKeys(self))
        self.grid.viewport().installEventFilter(self)
        self.grid.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.grid.customContextMenuRequested.connect(self._context_menu)

        self.welcome = self._make_welcome()
        self.stack = QStackedWidget()
        self.stack.addWidget(self.grid)
        self.stack.addWidget(self.welcome)

        self.status = QLabel(READY_TEXT)
        self.status_is_error = False
        self._query_at_error: str | None = None
        self.status.setObjectName("search-status")
        self.status.setWordWrap(True)

        lay = QVBoxLayout(self)
        lay.setContentsMargins(10, 10, 10, 6)
        lay.setSpacing(8)
        lay.addLayout(top)
        lay.addWidget(self.image_chip)
        lay.addLayout(filters)
        lay.addLayout(xmp_filters)
        lay.addLayout(arrange)
        lay.addWidget(self.stack, 1)
        lay.addWidget(self.status)

        self._budget_timer = QTimer(self)
        self._budget_timer.setSingleShot(True)
        self._budget_timer.setInterval(250)
        self._budget_timer.timeout.connect(self._update_budget)

        find = QShortcut(QKeySequence("Ctrl+Shift+F"), self)
        find.activated.connect(self.find_similar_current)
        # Ctrl+Enter searches from anywhere in the view: the query, a filter, the order, the grid.
        for keys in ("Ctrl+Return", "Ctrl+Enter"):
            run = QShortcut(QKeySequence(keys), self)
            run.setContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)
            run.activated.connect(self.search)
        # Focus given to the view (a view switch, a click on its background) goes to the query.
        self.setFocusProxy(self.editor)

    def eventFilter(self, obj: QObject, event: QEvent) -> bool:
        if obj is self.grid.viewport() and event.type() == QEvent.Type.Resize:
            self._spread_columns(event.size().width())
        return super().eventFilter(obj, event)

    def _spread_columns(self, width: int) -> None:
        """Share the row's spare width between the tiles, so the grid fills the view evenly."""
        tile = self.delegate.tile_size(self.grid.fontMetrics())
        cols = max(1, width // (tile.width() + 2))
        self.grid.setGridSize(QSize(max(tile.width(), width // cols - 1), tile.height() + 4))

    def _make_welcome(self) -> QWidget:
        w = QWidget()
        w.setObjectName("welcome")
        title = QLabel("<h2>Welcome to Longlens</h2>")
        text = QLabel(
            "Your catalog is empty. Add a folder of photos to index it on this computer "
            "(nothing is uploaded, and your files are never changed), or try the demo collection first."
        )
        text.setObjectName("welcome-text")
        text.setWordWrap(True)
        text.setAlignment(Qt.AlignmentFlag.AlignCenter)
        text.setMaximumWidth(560)
        self.welcome_text = text
        self.welcome_add = QPushButton("Add a photo folder…")
        self.welcome_demo = QPushButton("Open the demo collection")
        self.welcome_demo.setToolTip("300 generated SceneWorld pictures searched with the bundled sceneworld-mini "
                                     "model (it understands SceneWorld pictures only; real photos need BLIP).")
        self.welcome_add.clicked.connect(self.add_folder_requested)
        self.welcome_demo.clicked.connect(self.demo_requested)
        row = QHBoxLayout()
        row.addStretch(1)
        row.addWidget(self.welcome_add)
        row.addWidget(self.welcome_demo)
        row.addStretch(1)
        # The wrapped text sits in a row between stretches, not in the column with an alignment:
        # an aligned word-wrapped label gets its one-line height and is clipped (Qt's layouts
        # ask it for its height at its width only when it fills the cell).
        text_row = QHBoxLayout()
        text_row.addStretch(1)
        text_row.addWidget(text, 4)
        text_row.addStretch(1)
        lay = QVBoxLayout(w)
        lay.addStretch(1)
        lay.addWidget(title, 0, Qt.AlignmentFlag.AlignHCenter)
        lay.addLayout(text_row)
        lay.addSpacing(12)
        lay.addLayout(row)
        lay.addStretch(2)
        return w

    # -- library-dependent bits -------------------------------------------------------------------
    def set_libraries(self, infos: list) -> None:
        self._drop_removed_libraries({info.id for info in infos})
        current = self.folder_box.currentText()
        self.folder_box.blockSignals(True)
        self.folder_box.clear()
        self.folder_box.addItem(ALL_FOLDERS)
        for info in infos:
            self.folder_box.addItem(info.root)
        idx = self.folder_box.findText(current)
        if idx >= 0:
            self.folder_box.setCurrentIndex(idx)
        else:
            self.folder_box.setEditText(current)
        self.folder_box.blockSignals(False)
        self.show_welcome(not infos)

    def _drop_removed_libraries(self, library_ids: set[int]) -> None:
        """A folder was removed: its pictures leave the grid at once, and the search runs again
        (so the count, the cut-off and the top results are those of what is left)."""
        hits = self.model.hits()
        kept = [h for h in hits if getattr(h, "library_id", None) in library_ids]
        if len(kept) == len(hits):
            return
        self.model.set_hits(kept)
        if kept:
            self.grid.setCurrentIndex(self.model.index(0))
        self._set_status(f"{len(hits) - len(kept)} results from a removed folder taken away; searching again…")
        self.rerun()

    def show_welcome(self, on: bool) -> None:
        self.stack.setCurrentWidget(self.welcome if on else self.grid)

    # -- token budget -------------------------------------------------------------------------------
    def _text_changed(self) -> None:
        self.editor.mark_truncation(None)
        self._budget_timer.start()
        self._show_whether_stale()

    def _update_budget(self) -> None:
        # Busy until its finished signal is handled here: Job.running turns False only after the
        # signal is sent, so a request in between would be marked dirty and never re-run.
        if self._budget_job is not None and self._budget_job is not self._budget_done:
            self._budget_dirty = True
            return
        self._budget_dirty = False
        self._budget_seq += 1
        seq = self._budget_seq
        text = self.editor.toPlainText()
        self._budget_job = self.hub.call(
            self.backend.token_budget, text, self.backend.settings().get("max_tokens"),
            on_result=lambda b, s=seq, t=text: self._show_budget(b, s, t),
            on_error=lambda _m: self.token_label.setText("– tokens (no model)"),
            on_finished=lambda: self._budget_finished(job),
        )
        job = self._budget_job

    def _budget_finished(self, job: Job | None = None) -> None:
        self._budget_done = job if job is not None else self._budget_job
        if self._budget_dirty:
            self._update_budget()

    def _show_budget(self, b: Any, seq: int, text: str) -> None:
        if seq != self._budget_seq or text != self.editor.toPlainText():
            return
        self.token_label.setText(f"{b.used} / {b.budget} tokens")
        if text.strip() and text != self._query_at_error:
            self.clear_error()  # the model reads the new query: "type a description" or "no model" is past
        if b.truncated:
            over = b.total - b.budget
            self.token_label.setStyleSheet(f"color: {theme.warning_colour()}; font-weight: bold;")
            self.trunc_label.setText(f"✂ {over} tokens over the budget: the shaded part is not read.")
            self.trunc_label.setStyleSheet(f"color: {theme.warning_colour()};")
            self.trunc_label.setVisible(True)
            self.editor.mark_truncation(b.cut_at)
        else:
            self.token_label.setStyleSheet("")
            self.trunc_label.setVisible(False)
            self.editor.mark_truncation(None)

    # -- running searches ------------------------------------------------------------------------------
    def filters(self) -> dict[str, Any]:
        folder = self.folder_box.currentText().strip()
        out: dict[str, Any] = {"folder": None if folder in ("", ALL_FOLDERS) else folder}
        out["after"] = self.after_edit.date().toString("yyyy-MM-dd") if self.after_check.isChecked() else None
        # The "to" date is inclusive for people; the engine's `before` is exclusive.
        out["before"] = (self.before_edit.date().addDays(1).toString("yyyy-MM-dd")
                         if self.before_check.isChecked() else None)
        out["camera"] = self.camera_edit.text().strip() or None
        out["keyword"] = self.keyword_edit.text().strip() or None
        out["rating"] = self.rating_box.currentData()
        label = self.label_box.currentText().strip()
        out["label"] = None if label in ("", ANY_LABEL) else label
        out["near"] = self.near_edit.text().strip() or None
        out["km"] = self.km_edit.text().strip() or None
        return out

    def order(self) -> str:
        return str(self.sort_box.currentData())

    def cutoff(self) -> float | None:
        value = self.cutoff_spin.value()
        return None if value <= self.cutoff_spin.minimum() else float(value)

    def _filters_changed(self, *_args: Any) -> None:
        if self._seq == 0:
            return  # nothing searched yet: nothing to refresh
        self.stale = True
        self._set_status("Filters changed: searching again…")
        self._rerun_timer.start()

    def rerun(self) -> Job | None:
        """Search again with the filters, order and cut-off as they are now, for what the query
        box says now (the image of the chip, else the text in the box), never for a text the box
        no longer shows. With the box emptied there is nothing to search: the results stay, marked
        as the previous query's."""
        self._rerun_timer.stop()
        if self.image_query:
            return self.search_image(self.image_query)
        text = self.editor.toPlainText()
        if text.strip():
            return self._search_text(text)
        self._show_whether_stale()
        return None

    def run_text_query(self, text: str) -> Job | None:
        self.editor.setPlainText(text)
        self.editor.moveCursor(QTextCursor.MoveOperation.End)  # typing then adds to the query
        return self.search()

    def search(self) -> Job | None:
        if self.image_query:
            return self.search_image(self.image_query)
        text = self.editor.toPlainText()
        if not text.strip():
            self._set_status("Type a description first (or drop an image to find similar ones).", error=True)
            return None
        return self._search_text(text)

    def _search_text(self, text: str) -> Job:
        return self._run({"text": text, "image": None}, self.backend.search_text, text, self.top_spin.value(),
                         self.filters(), self.backend.settings().get("max_tokens"), self.order(), self.cutoff())

    def search_image(self, path: str) -> Job | None:
        if Path(path).suffix.lower() not in self.backend.image_suffixes():
            messages.show_error(self, "Not an image", f"{path} is not a picture Longlens can read.")
            return None
        self.image_query = path
        self.image_chip_label.setText(
            f"Finding pictures similar to <b>{html.escape(display_text(os.path.basename(path)))}</b>")
        self.image_chip.setVisible(True)
        return self._run({"text": None, "image": path}, self.backend.search_image, path, self.top_spin.value(),
                         self.filters(), self.order(), self.cutoff())

    def clear_image_query(self) -> None:
        """Back to the text query: the next search is the box's text. The image's results stay
        until then, marked as the image's."""
        self.image_query = None
        self.image_chip.setVisible(False)
        self._show_whether_stale()

    def focus_query(self) -> None:
        """Ctrl+L / Ctrl+F: the keyboard to the query, the cursor at its end (nothing selected,
        so the next key adds to the query rather than replacing it)."""
        self.editor.setFocus(Qt.FocusReason.ShortcutFocusReason)
        self.editor.moveCursor(QTextCursor.MoveOperation.End)

    def _run(self, query: dict[str, str | None], fn, *args) -> Job:
        self._rerun_timer.stop()  # this search already has the filters as they are now
        self._seq += 1
        seq = self._seq
        self._set_status("Searching…")
        if self.search_button.hasFocus():
            # A disabled button hands the focus to the next widget in the chain (the Folder box,
            # text selected, so the next key would replace the filter): keep it in the query.
            self.editor.setFocus(Qt.FocusReason.OtherFocusReason)
        self.search_button.setEnabled(False)
        job = self.hub.call(fn, *args, on_result=lambda r, s=seq, q=dict(query): self._show_result(r, s, q),
                            on_error=lambda m, s=seq: self._search_failed(m, s),
                            on_finished=lambda: self.search_button.setEnabled(True))
        self.search_job = job
        return job

    def _search_failed(self, message: str, seq: int) -> None:
        if seq != self._seq:
            return
        self._set_status(message, error=True)
        if self.image_query:
            messages.show_error(self, "Cannot search with this image", message)

    def _show_result(self, result: Any, seq: int, query: dict[str, str | None]) -> None:
        if seq != self._seq:
            return
        self.query = query
        self.last_result = result
        self.stale = False
        self.show_welcome(False)
        self.model.set_hits(result.hits)
        if result.hits:
            self.grid.setCurrentIndex(self.model.index(0))
            self.grid.scrollToTop()
        parts = [f"{len(result.hits)} result{'s' if len(result.hits) != 1 else ''}"]
        cut = getattr(result, "cutoff", None)
        self.cutoff_label.setVisible(cut is not None)
        if cut is not None:
            self.cutoff_label.setText(f"✂ {cut.text()}")
        if getattr(result, "order", "relevance") != "relevance":
            parts.append("newest first" if result.order == "date-new" else "oldest first")
        if result.tokens_total is not None:
            parts.append(f"{result.tokens_used}/{result.tokens_total} tokens read"
                         + (" (query truncated)" if result.truncated else ""))
        ms = sum(result.timings_ms.values())
        parts.append(f"{ms:.0f} ms")
        parts.append(f"model {result.model_id}")
        parts += list(getattr(result, "notes", ()))
        if not result.hits:
            parts.insert(0, "No results: is a folder indexed with this model, and do the filters match?")
        warnings = list(getattr(result, "warnings", ()))
        if warnings:
            # Before everything else and in the warning colour: the results themselves are in doubt.
            self._results_status = (" · ".join(f"⚠ {w[:1].upper()}{w[1:]}" for w in warnings) + "\n"
                                    + " · ".join(parts), True)
        else:
            self._results_status = (" · ".join(parts), False)
        self._set_status(self._results_status[0], warning=self._results_status[1])
        self._show_whether_stale(landed=True)  # the query may have been edited while this search ran
        self.results_shown.emit(len(result.hits))

    def stale_reason(self) -> str | None:
        """Why the results shown are not those of what the query box says now, with the way to
        get those (None: they are, or nothing is shown)."""
        if self.last_result is None or self.image_query:
            return None  # an image query is searched as soon as it is given
        text = self.editor.toPlainText()
        if self.query.get("image") is None and self.query.get("text") == text:
            return None
        if self.query.get("image"):
            shown = f"the image {display_text(os.path.basename(self.query['image']))}"
        else:
            shown = "the previous text"
        todo = ("press Ctrl+Enter to search for the text in the box" if text.strip()
                else "type a description and press Ctrl+Enter")
        return f"⚠ These results are for {shown}, not for the query box: {todo}."

    def _show_whether_stale(self, *, landed: bool = False) -> None:
        """Mark the results as the previous query's while the box says something else, and take
        the mark away when it says the same again. A search in flight decides when it lands."""
        if not landed and self.search_job is not None and self.search_job.running:
            return
        if self._rerun_timer.isActive():
            return  # a filter changed: the search for what the box says is about to run
        reason = self.stale_reason()
        if reason is not None:
            self.stale = True
            self._set_status(reason + "\n" + self._results_status[0], warning=True)
        elif self.stale and self.last_result is not None:
            self.stale = False
            self._set_status(self._results_status[0], warning=self._results_status[1])

    def _set_status(self, text: str, error: bool = False, warning: bool = False) -> None:
        self.status.setText(text)
        self.status.setStyleSheet(f"color: {theme.warning_colour()};" if error or warning else "")
        self.status_is_error = error
        self._query_at_error = self.editor.toPlainText() if error else None

    def clear_error(self) -> None:
        """Something worked since the error shown (a model installed, a folder indexed, the query
        read): the error is stale, the status line goes back to its hint."""
        if self.status_is_error:
            self._set_status(READY_TEXT)

    # -- results interaction ------------------------------------------------------------------------------
    def current_hit(self) -> Any:
        idx = self.grid.currentIndex()
        return idx.data(HitRole) if idx.isValid() else None

    def open_index(self, idx: QModelIndex) -> None:
        if idx.isValid():
            self.open_hit.emit(idx.data(HitRole), dict(self.query))

    def open_current(self) -> None:
        self.open_index(self.grid.currentIndex())

    def step_result(self, step: int) -> Any:
        """The result `step` places from the current one, made current (None past either end)."""
        row = self.grid.currentIndex().row() + step
        if not 0 <= row < self.model.rowCount():
            return None
        self.grid.setCurrentIndex(self.model.index(row))
        return self.model.hit(row)

    def focus_results(self) -> None:
        """The keyboard to the results grid (back from the inspector), or to the query when empty."""
        if self.model.rowCount():
            self.grid.setFocus(Qt.FocusReason.OtherFocusReason)
        else:
            self.editor.setFocus(Qt.FocusReason.OtherFocusReason)

    def quick_look(self) -> QuickLook | None:
        hit = self.current_hit()
        if hit is None:
            return None
        dlg = QuickLook(self.backend, self.hub, hit, self)
        dlg.open()
        return dlg

    def find_similar_current(self) -> None:
        hit = self.current_hit()
        if hit is not None:
            self.search_image(hit.path)

    def _context_menu(self, pos) -> None:
        idx = self.grid.indexAt(pos)
        if not idx.isValid():
            return
        self.grid.setCurrentIndex(idx)
        menu = QMenu(self)
        open_action = QAction("Open in inspector", menu)
        open_action.triggered.connect(lambda: self.open_index(idx))
        similar = QAction("Find similar", menu)
        similar.triggered.connect(self.find_similar_current)
        look = QAction("Quick look", menu)
        look.triggered.connect(self.quick_look)
        menu.addActions([open_action, similar, look])
        menu.popup(self.grid.viewport().mapToGlobal(pos))

    # -- drops anywhere on the view -------------------------------------------------------------------------
    def _dropped_image(self, mime) -> str | None:
        if not mime.hasUrls():
            return None
        for u in mime.urls():
            if u.isLocalFile():
                return u.toLocalFile()
        return None

    def dragEnterEvent(self, event) -> None:
        if self._dropped_image(event.mimeData()):
            event.acceptProposedAction()

    def dragMoveEvent(self, event) -> None:
        self.dragEnterEvent(event)

    def dropEvent(self, event) -> None:
        path = self._dropped_image(event.mimeData())
        if path:
            event.acceptProposedAction()
            self.search_image(path)

    def shutdown(self) -> None:
        self._budget_timer.stop()
        self._rerun_timer.stop()
        self.loader.shutdown()

    def sizeHint(self) -> QSize:
        return QSize(900, 700)

