"""Models: what is installed, import from a folder, pull from the hub with progress."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Signal
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QDialog,
    QDialogButtonBox,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from desktop_app import theme
from desktop_app.background import Job, WorkerHub
from desktop_app.dialogs import messages
from desktop_app.facade import Backend, ModelInfo, human_size
from desktop_app.widgets.progress_panel import format_eta

COLUMNS = ("Model", "Status", "Size", "Description")
# The stages of a pull whose counts are bytes (the others count files or steps): the download, and
# the check of a converted checkpoint (Long-CLIP's .pt) right before it is unpickled.
_BYTE_STAGES = ("download", "verify")


def description_text(m: ModelInfo) -> str:
    """The description with the model's notice said once, in sentence case: a notice whose point
    (after its colon) the description already makes is not repeated before it."""
    desc = (m.description or "").strip()
    if not m.notice:
        return desc
    point = m.notice.rsplit(":", 1)[-1].strip().rstrip(".").lower()
    if point and point in desc.lower():
        return desc
    notice = m.notice.strip().rstrip(".")
    return f"{notice[:1].upper()}{notice[1:]}. {desc}".strip()


def _size(n: int | None) -> str:
    return human_size(n) if n else ""


class ModelsDialog(QDialog):
    models_changed = Signal()

    def __init__(self, backend: Backend, hub: WorkerHub, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Models")
        self.setObjectName("models-dialog")
        self.resize(860, 520)
        self.backend = backend
        self.hub = hub
        self.models: list[ModelInfo] = []
        self.pull: Job | None = None
        self.last_job: Job | None = None

        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.verticalHeader().setVisible(False)
        self.table.horizontalHeader().setSectionResizeMode(3, QHeaderView.ResizeMode.Stretch)
        self.table.setWordWrap(True)
        self.table.itemSelectionChanged.connect(self._update_buttons)

        self.use_button = QPushButton("Use this model")
        self.use_button.clicked.connect(self.use_selected)
        self.pull_button = QPushButton("Download (pull)")
        self.pull_button.clicked.connect(self.pull_selected)
        # Shown only for a model listing files without a pin: a fully pinned model downloads and is
        # checked without any question (see _update_buttons).
        self.trust = QCheckBox()
        self.trust.setObjectName("models-trust-unpinned")
        self.trust.setVisible(False)
        self._pull_sizes = ""  # the pull's "N files, X MB; Y to download" line, kept above the file names
        self.cancel_button = QPushButton("Cancel download")
        self.cancel_button.clicked.connect(self.cancel_pull)
        self.cancel_button.setVisible(False)
        self.bar = QProgressBar()
        self.bar.setVisible(False)
        self.status = QLabel("")
        self.status.setObjectName("models-status")
        self.status.setWordWrap(True)

        self.folder = QLineEdit()
        self.folder.setPlaceholderText("A Hugging Face-format folder (config.json, model.safetensors, tokenizer)")
        browse = QPushButton("Browse…")
        browse.clicked.connect(self._browse)
        self.name = QLineEdit()
        self.name.setPlaceholderText("install as (name)")
        self.name.setMaximumWidth(220)
        self.import_button = QPushButton("Import")
        self.import_button.clicked.connect(self.import_model)
        imp = QGroupBox("Import from a folder (offline)")
        il = QHBoxLayout(imp)
        il.addWidget(self.folder, 1)
        il.addWidget(browse)
        il.addWidget(self.name)
        il.addWidget(self.import_button)

        actions = QHBoxLayout()
        actions.addWidget(self.use_button)
        actions.addWidget(self.pull_button)
        actions.addWidget(self.cancel_button)
        actions.addStretch(1)
        close = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        close.rejected.connect(self.reject)
        lay = QVBoxLayout(self)
        lay.addWidget(self.table, 1)
        lay.addLayout(actions)
        lay.addWidget(self.trust)
        lay.addWidget(self.bar)
        lay.addWidget(self.status)
        lay.addWidget(imp)
        lay.addWidget(close)
        self.refresh()

    # -- listing --------------------------------------------------------------------------------
    def refresh(self) -> Job:
        self.last_job = self.hub.call(self.backend.list_models, on_result=self._fill,
                                      on_error=lambda m: self._say(m, error=True))
        return self.last_job

    def _fill(self, models: list[ModelInfo]) -> None:
        self.models = models
        default = self.backend.settings().get("default_model")
        self.table.setRowCount(len(models))
        for r, m in enumerate(models):
            status = "installed" if m.installed else ("bundled (not in this build)" if m.bundled else "not installed")
            if m.problem:
                status = "damaged"
            if m.name == default:
                status += " · default"
            desc = description_text(m)
            if m.problem:
                desc = f"{m.problem} {desc}"
            for c, text in enumerate((m.name, status, _size(m.size_bytes), desc)):
                item = QTableWidgetItem(text)
                item.setToolTip(text)
                if c == 0 and m.notice:
                    item.setForeground(self.palette().color(self.palette().ColorRole.Text))
                if c == 3 and desc != (m.description or "").strip():
                    # The notice leads the description: in the warning colour, not in capitals.
                    font = item.font()
                    font.setBold(True)
                    item.setFont(font)
                    item.setForeground(QColor(theme.warning_colour()))
                self.table.setItem(r, c, item)
        self.table.resizeColumnsToContents()
        self.table.horizontalHeader().setSectionResizeMode(3, QHeaderView.ResizeMode.Stretch)
        self.table.resizeRowsToContents()
        self._update_buttons()

    def row_of(self, name: str) -> int:
        return next((i for i, m in enumerate(self.models) if m.name == name), -1)

    def selected(self) -> ModelInfo | None:
        rows = self.table.selectionModel().selectedRows() if self.table.selectionModel() else []
        if not rows:
            return None
        r = rows[0].row()
        return self.models[r] if 0 <= r < len(self.models) else None

    def select(self, name: str) -> None:
        r = self.row_of(name)
        if r >= 0:
            self.table.selectRow(r)

    def _update_buttons(self) -> None:
        m = self.selected()
        busy = self.pull is not None
        self.use_button.setEnabled(m is not None and m.installed and not m.problem)
        self.pull_button.setEnabled(m is not None and m.pullable and not busy)
        unpinned = m.unpinned if m is not None and m.pullable else ()
        if unpinned:
            self.trust.setText(f"Accept {', '.join(unpinned)} as downloaded: no hash is known to check them "
                               "against (the hashes seen are recorded, so later changes are caught)")
        elif self.trust.isChecked():
            self.trust.setChecked(False)
        self.trust.setVisible(bool(unpinned))
        self.trust.setEnabled(not busy)

    def trust_needed(self) -> bool:
        """Whether the selected model can only be pulled after accepting unpinned files."""
        m = self.selected()
        return bool(m is not None and m.pullable and m.unpinned)

    def _say(self, text: str, error: bool = False) -> None:
        self.status.setText(text)
        self.status.setStyleSheet(f"color: {theme.warning_colour()};" if error else "")

    # -- actions ----------------------------------------------------------------------------------
    def use_selected(self) -> None:
        m = self.selected()
        if m is None or not m.installed:
            return
        self.backend.save_settings({"default_model": m.name})
        self._say(f"{m.name} is now the default model." + (f" Note: {m.notice}." if m.notice else ""))
        self.models_changed.emit()
        self.refresh()

    def _browse(self) -> None:
        path = messages.choose_folder(self, "Choose a model folder")
        if path:
            self.folder.setText(path)
            if not self.name.text().strip():
                self.name.setText(Path(path).name)

    def import_model(self) -> Job | None:
        folder, name = self.folder.text().strip(), self.name.text().strip()
        if not folder or not name:
            messages.show_error(self, "Import a model", "Choose the model folder and a name to install it as.")
            return None
        self.import_button.setEnabled(False)
        self._say(f"Importing {name} (checking and copying files)…")

        def done(dest: str) -> None:
            self._say(f"Imported {name} into {dest}.")
            self.models_changed.emit()
            self.refresh()

        def failed(msg: str) -> None:
            self._say(msg, error=True)
            messages.show_error(self, "Import failed", msg)

        job = self.hub.call(self.backend.import_model, folder, name, on_result=done, on_error=failed,
                            on_finished=lambda: self.import_button.setEnabled(True))
        self.last_job = job
        return job

    def pull_selected(self) -> Job | None:
        m = self.selected()
        if m is None or not m.pullable or self.pull is not None:
            return None
        if m.unpinned and not self.trust.isChecked():
            # The engine would refuse; say what to do here, in this window's words.
            self._say(f"{m.name} has files without a known hash ({', '.join(m.unpinned)}). Tick the box above "
                      "to accept them as downloaded, then download again.", error=True)
            return None
        self.bar.setRange(0, 0)
        self.bar.setVisible(True)
        self.cancel_button.setVisible(True)
        self._pull_sizes = ""
        self._say(f"Downloading {m.name}…")
        trust = bool(m.unpinned) and self.trust.isChecked()
        job = self.hub.start_job(
            self.backend.pull_job(m.name, trust), name=f"pull {m.name}",
            on_progress=self._pull_progress,
            on_result=lambda _p, n=m.name: self._pull_done(n),
            on_error=self._pull_failed,
            on_cancelled=lambda: self._say("Download cancelled; a later pull resumes where it stopped."),
            on_finished=self._pull_finished,
        )
        self.pull = job
        self.last_job = job
        self._update_buttons()
        return job

    def _pull_progress(self, p) -> None:
        if p.total:
            # Byte counts overflow a QProgressBar's int range for large files: show per mille.
            self.bar.setRange(0, 1000)
            self.bar.setValue(int(1000 * min(1.0, p.done / p.total)))
        else:
            self.bar.setRange(0, 0)
        if p.extra.get("sizes"):
            self._pull_sizes = p.message
        parts = [p.message or p.stage]
        if p.stage in _BYTE_STAGES:
            if self._pull_sizes and p.message != self._pull_sizes:
                parts.insert(0, self._pull_sizes)
            if p.total:
                parts.append(f"{human_size(p.done)} of {human_size(p.total)}")
            if p.rate:
                parts.append(f"{human_size(int(p.rate))}/s")
            eta = format_eta(p.eta_s)
            if eta:
                parts.append(eta)
        self._say(" · ".join(parts))

    def _pull_done(self, name: str) -> None:
        self._say(f"{name} is installed and verified.")
        self.models_changed.emit()
        self.refresh()

    def _pull_failed(self, message: str) -> None:
        self._say(message, error=True)
        messages.show_error(self, "Download failed", message)

    def _pull_finished(self) -> None:
        self.pull = None
        self.bar.setVisible(False)
        self.cancel_button.setVisible(False)
        self._update_buttons()

    def cancel_pull(self) -> None:
        if self.pull is not None:
            self.pull.cancel()
            self._say("Cancelling…")

    def reject(self) -> None:
        self.cancel_pull()
        super().reject()

