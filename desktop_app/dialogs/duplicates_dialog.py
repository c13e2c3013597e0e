"""Duplicates: exact copies, near-duplicates and visually similar pictures, listed with
thumbnails, sizes, dates and paths, and exported; nothing is ever deleted (engine.duplicates,
the same job as `longlens duplicates`)."""

from __future__ import annotations

import os
from typing import Any

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QIcon, QImage, QPixmap
from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QDoubleSpinBox,
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from desktop_app.background import Job, WorkerHub
from desktop_app.dialogs import messages
from desktop_app.facade import Backend, LonglensError, display_text, human_size
from desktop_app.thumbnails import ThumbnailLoader

KIND_WORDS = {"exact": "Exact copies", "near": "Near-duplicates", "similar": "Visually similar"}
THUMB_PX = 64
PathRole = Qt.ItemDataRole.UserRole + 1


class DuplicatesDialog(QDialog):
    def __init__(self, backend: Backend, hub: WorkerHub, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("duplicates-dialog")
        self.setWindowTitle("Duplicates")
        self.backend = backend
        self.hub = hub
        self.job: Job | None = None
        self.report: Any = None
        opts = backend.duplicate_settings()

        self.near_check = QCheckBox("Near-duplicates: pictures whose perceptual hashes differ in at most")
        self.near_check.setChecked(True)
        self.near_spin = QSpinBox()
        self.near_spin.setRange(*opts["near_range"])
        self.near_spin.setValue(opts["near_default"])
        self.near_spin.setSuffix(" of 64 bits")
        self.near_check.toggled.connect(self.near_spin.setEnabled)
        self.similar_check = QCheckBox("Visually similar: the model sees them as alike, cosine at least")
        self.similar_spin = QDoubleSpinBox()
        lo, hi = opts["similar_range"]
        self.similar_spin.setDecimals(3)
        self.similar_spin.setSingleStep(0.01)
        self.similar_spin.setRange(lo + 0.001, hi)  # the engine's range excludes its lower end
        self.similar_spin.setValue(0.9)
        self.similar_spin.setEnabled(False)
        self.similar_check.toggled.connect(self.similar_spin.setEnabled)
        self.find_button = QPushButton("Find duplicates")
        self.find_button.setDefault(True)
        self.find_button.clicked.connect(self.start)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setEnabled(False)
        self.cancel_button.clicked.connect(self.cancel)
        self.export_button = QPushButton("Export…")
        self.export_button.setEnabled(False)
        self.export_button.setToolTip("Save the list as CSV or JSON (nothing is deleted)")
        self.export_button.clicked.connect(self.export_dialog)

        self.progress = QProgressBar()
        self.progress.setVisible(False)
        self.summary = QLabel("Exact copies are always listed. Longlens never deletes or changes a picture.")
        self.summary.setObjectName("duplicates-summary")
        self.summary.setWordWrap(True)

        self.tree = QTreeWidget()
        self.tree.setObjectName("duplicates-tree")
        self.tree.setColumnCount(4)
        self.tree.setHeaderLabels(["Picture", "Size", "Date", "Path"])
        self.tree.setIconSize(QSize(THUMB_PX, THUMB_PX))
        self.tree.setUniformRowHeights(False)
        header = self.tree.header()
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Interactive)
        header.setStretchLastSection(True)
        self.tree.setColumnWidth(0, 300)
        self.tree.itemExpanded.connect(self._request_thumbnails)

        self.loader = ThumbnailLoader(backend.thumbnail, THUMB_PX * 2, parent=self)
        self.loader.ready.connect(self._thumbnail_ready)
        self._items_by_path: dict[str, list[QTreeWidgetItem]] = {}

        near_row = QHBoxLayout()
        near_row.addWidget(self.near_check)
        near_row.addWidget(self.near_spin)
        near_row.addStretch(1)
        sim_row = QHBoxLayout()
        sim_row.addWidget(self.similar_check)
        sim_row.addWidget(self.similar_spin)
        sim_row.addStretch(1)
        buttons = QHBoxLayout()
        buttons.addWidget(self.find_button)
        buttons.addWidget(self.cancel_button)
        buttons.addWidget(self.progress, 1)
        buttons.addWidget(self.export_button)
        close = QPushButton("Close")
        close.clicked.connect(self.close)
        buttons.addWidget(close)
        lay = QVBoxLayout(self)
        lay.addLayout(near_row)
        lay.addLayout(sim_row)
        lay.addLayout(buttons)
        lay.addWidget(self.summary)
        lay.addWidget(self.tree, 1)
        self.resize(960, 620)

    # -- the job ------------------------------------------------------------------------------
    def start(self) -> Job | None:
        near = self.near_spin.value() if self.near_check.isChecked() else None
        similar = float(self.similar_spin.value()) if self.similar_check.isChecked() else None
        try:
            make = self.backend.duplicates_job(near, similar)
        except LonglensError as exc:  # an engine refusal: the same message as the CLI's
            messages.show_error(self, "Duplicates", str(exc))
            return None
        self.find_button.setEnabled(False)
        self.export_button.setEnabled(False)
        self.cancel_button.setEnabled(True)
        self.progress.setVisible(True)
        self.progress.setRange(0, 0)
        self.summary.setText("Looking for duplicates…")
        self.job = self.hub.start_job(make, "duplicates", on_progress=self._progress, on_result=self._done,
                                      on_error=self._failed, on_cancelled=self._cancelled,
                                      on_finished=self._finished)
        return self.job

    def cancel(self) -> None:
        if self.job is not None:
            self.job.cancel()

    def _progress(self, p: Any) -> None:
        if p.total:
            self.progress.setRange(0, int(p.total))
            self.progress.setValue(int(p.done))
        else:
            self.progress.setRange(0, 0)
        if p.message:
            self.summary.setText(p.message)

    def _finished(self) -> None:
        self.find_button.setEnabled(True)
        self.cancel_button.setEnabled(False)
        self.progress.setVisible(False)

    def _failed(self, message: str) -> None:
        self.summary.setText(message)
        messages.show_error(self, "Duplicates", message)

    def _cancelled(self) -> None:
        self.summary.setText("Cancelled; nothing was changed.")

    def _done(self, last: Any) -> None:
        report = last.extra.get("report") if last is not None else None
        if report is None:
            return
        self.report = report
        self.show_report(report)

    # -- the list -------------------------------------------------------------------------------
    def show_report(self, report: Any) -> None:
        self.tree.clear()
        self._items_by_path.clear()
        self.loader.forget_pending()
        counts = " · ".join(f"{KIND_WORDS[k]}: {report.count(k)}" for k in KIND_WORDS)
        text = f"{counts} (among {report.looked_at} pictures). Nothing was deleted or changed."
        if report.notes:
            text += " " + " ".join(report.notes)
        self.summary.setText(text)
        for n, g in enumerate(report.groups, start=1):
            top = QTreeWidgetItem([f"{n}. {KIND_WORDS[g.kind]} · {len(g.files)} files", human_size(g.total_bytes),
                                   "", g.detail])
            top.setFirstColumnSpanned(False)
            for f in g.files:
                date = f.date.replace("T", " ") + (" (file time)" if f.date_source == "file time" else "")
                child = QTreeWidgetItem([display_text(os.path.basename(f.path)), human_size(f.size), date,
                                         display_text(f.path)])
                child.setData(0, PathRole, f.path)
                child.setToolTip(3, display_text(f.path))
                top.addChild(child)
                self._items_by_path.setdefault(f.path, []).append(child)
            self.tree.addTopLevelItem(top)
            top.setExpanded(n <= 20)  # the first groups open; the rest load thumbnails when opened
        for column in (1, 2):  # sizes and dates in full ("… (file time)"); the path takes the rest
            self.tree.resizeColumnToContents(column)
        self.export_button.setEnabled(bool(report.groups))

    def _request_thumbnails(self, top: QTreeWidgetItem) -> None:
        for i in range(top.childCount()):
            path = top.child(i).data(0, PathRole)
            if path and top.child(i).icon(0).isNull():
                self.loader.request(path)

    def _thumbnail_ready(self, path: object, image: QImage) -> None:
        icon = QIcon(QPixmap.fromImage(image))
        for item in self._items_by_path.get(str(path), ()):
            item.setIcon(0, icon)

    # -- export -------------------------------------------------------------------------------------
    def export_dialog(self) -> None:
        if self.report is None:
            return
        dest, _ = QFileDialog.getSaveFileName(self, "Export the duplicates list", "duplicates.csv",
                                              "CSV (*.csv);;JSON (*.json)")
        if dest:
            self.export_to(dest)

    def export_to(self, dest: str) -> Job:
        return self.hub.call(self.backend.export_duplicates, self.report, dest,
                             on_result=lambda path: self.summary.setText(f"Saved the list to {path}."),
                             on_error=lambda m: messages.show_error(self, "Cannot export the list", m))

    def done(self, result: int) -> None:  # closing: stop the job and the thumbnail threads
        self.cancel()
        self.loader.shutdown()
        super().done(result)

    def closeEvent(self, event) -> None:
        self.cancel()
        self.loader.shutdown()
        super().closeEvent(event)
