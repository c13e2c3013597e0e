"""Settings: device, model, query reader (text-tower override), index parameters, thumbnail cache, theme."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QMenu,
    QPushButton,
    QSpinBox,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from desktop_app.background import WorkerHub
from desktop_app.dialogs import messages
from desktop_app.facade import Backend, LonglensError, ModelInfo

THEME_LABELS = {"system": "Follow the system", "light": "Light", "dark": "Dark"}
DEVICE_LABELS = {"auto": "Automatic (best available)", "cuda": "CUDA (NVIDIA GPU)", "mps": "MPS (Apple GPU)",
                 "cpu": "CPU"}
# A RAW file and a JPEG (or HEIF) of the same name in one folder: the camera's RAW+JPEG mode.
# The "text_tower" setting in a photographer's words: what it does, not how it is built.
QUERY_READER_LABEL = "Query reader (paragraph-trained text model)"
QUERY_READER_TIP = ("A text model trained to read long, paragraph-length descriptions, used instead of the "
                    "model's own to read your queries: one included with a model (Included…) or the output "
                    "folder of `longlens train`. Leave it empty to use the model's own. The pictures are not "
                    "re-indexed.")
RAW_JPEG_PAIR_LABELS = {"jpeg": "Index the JPEG only", "raw": "Index the RAW only", "both": "Index both files"}


class SettingsDialog(QDialog):
    saved = Signal(dict)

    def __init__(self, backend: Backend, hub: WorkerHub, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Settings")
        self.setObjectName("settings-dialog")
        self.backend = backend
        self.hub = hub
        s = backend.settings()
        self._initial = s

        # Only the devices this machine has (engine.models.device decides, from a worker: it
        # imports torch); until it answers, "Automatic" and the saved choice.
        self.device = QComboBox()
        self.device.setObjectName("settings-device")
        self._fill_devices(("auto", "cpu"))
        self._devices_job = hub.call(backend.available_devices, on_result=self._fill_devices)

        self.model = QComboBox()
        self.model.setMinimumWidth(320)
        self.model.addItem("Automatic (the only installed model)", None)
        self._models_job = hub.call(backend.list_models, on_result=self._fill_models)

        self.tower = QLineEdit(s.get("text_tower") or "")
        self.tower.setObjectName("settings-query-reader")
        self.tower.setPlaceholderText("the model's own")
        self.tower.setToolTip(QUERY_READER_TIP)
        browse = QPushButton("Browse…")
        browse.clicked.connect(self._browse_tower)
        clear = QPushButton("Clear")
        clear.clicked.connect(self.tower.clear)
        # The query readers installed models include (text-towers/NAME), chosen by name; filled with the models.
        self._included_towers: dict[str, list[str]] = {}
        self.included = QToolButton()
        self.included.setObjectName("settings-query-reader-included")
        self.included.setText("Included…")
        self.included.setToolTip("Query readers that come with an installed model")
        self.included.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        self.included.setMenu(QMenu(self.included))
        self.included.setEnabled(False)
        tower_row = QHBoxLayout()
        tower_row.addWidget(self.tower, 1)
        tower_row.addWidget(self.included)
        tower_row.addWidget(browse)
        tower_row.addWidget(clear)

        self.max_tokens = QSpinBox()
        # One below the engine's minimum is the "model default" entry (saved as None).
        lo, hi = backend.setting_range("max_tokens")
        self.max_tokens.setRange(lo - 1, hi)
        self.max_tokens.setSpecialValueText("model default")
        self.max_tokens.setValue(int(s.get("max_tokens") or lo - 1))
        self.top_k = QSpinBox()
        self.top_k.setRange(*backend.setting_range("top_k"))
        self.top_k.setValue(int(s.get("top_k") or 200))

        self.batch = QSpinBox()
        self.batch.setRange(*backend.setting_range("batch_size"))
        self.batch.setValue(int(s.get("batch_size") or 32))
        self.workers = QSpinBox()
        self.workers.setRange(*backend.setting_range("decode_workers"))
        self.workers.setValue(int(s.get("decode_workers") or 2))
        self.raw_pairs = QComboBox()
        for key in backend.setting_choices("raw_jpeg_pairs"):
            self.raw_pairs.addItem(RAW_JPEG_PAIR_LABELS.get(key, key), key)
        self.raw_pairs.setCurrentIndex(max(0, self.raw_pairs.findData(s.get("raw_jpeg_pairs") or "jpeg")))
        self.raw_pairs.setToolTip("A RAW file and a JPEG or HEIF with the same name in the same folder are one "
                                  "shot. Applies from the next indexing run; the file left out is removed "
                                  "from the library.")

        self.cache_mb = QSpinBox()
        self.cache_mb.setRange(*backend.setting_range("thumbnail_cache_mb"))
        self.cache_mb.setSuffix(" MB")
        self.cache_mb.setValue(int(s.get("thumbnail_cache_mb") or 512))
        clear_cache = QPushButton("Clear cache")
        clear_cache.clicked.connect(lambda: hub.call(backend.clear_thumbnail_cache))
        cache_row = QHBoxLayout()
        cache_row.addWidget(self.cache_mb, 1)
        cache_row.addWidget(clear_cache)

        self.theme = QComboBox()
        for key, label in THEME_LABELS.items():
            self.theme.addItem(label, key)
        self.theme.setCurrentIndex(max(0, self.theme.findData(s.get("theme") or "system")))

        model_box = QGroupBox("Model")
        mf = QFormLayout(model_box)
        mf.addRow("Device", self.device)
        mf.addRow("Model", self.model)
        mf.addRow(QUERY_READER_LABEL, tower_row)
        mf.labelForField(tower_row).setToolTip(QUERY_READER_TIP)
        mf.addRow("Query token budget", self.max_tokens)
        mf.addRow("Results per search", self.top_k)
        index_box = QGroupBox("Indexing")
        inf = QFormLayout(index_box)
        inf.addRow("Batch size", self.batch)
        inf.addRow("Decoding threads", self.workers)
        inf.addRow("RAW+JPEG pairs", self.raw_pairs)
        look_box = QGroupBox("Display")
        lf = QFormLayout(look_box)
        lf.addRow("Thumbnail cache", cache_row)
        lf.addRow("Theme", self.theme)
        note = QLabel("Model and device changes apply to the next search or indexing run.")
        note.setEnabled(False)

        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Save | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        lay = QVBoxLayout(self)
        lay.addWidget(model_box)
        lay.addWidget(index_box)
        lay.addWidget(look_box)
        lay.addWidget(note)
        lay.addWidget(buttons)

    def _fill_models(self, models: list[ModelInfo]) -> None:
        current = self._initial.get("default_model")
        for m in models:
            if not m.installed:
                continue
            label = m.name + (f"  —  {m.notice}" if m.notice else "")
            self.model.addItem(label, m.name)
            for tower in m.text_towers:
                self._included_towers.setdefault(tower, []).append(m.name)
        menu = self.included.menu()
        for tower, owners in sorted(self._included_towers.items()):
            action = menu.addAction(f"{tower}  (with {', '.join(owners)})")
            action.triggered.connect(lambda _=False, t=tower: self.tower.setText(t))
        self.included.setEnabled(bool(self._included_towers))
        idx = self.model.findData(current)
        if current and idx < 0:
            self.model.addItem(f"{current} (not installed)", current)
            idx = self.model.count() - 1
        self.model.setCurrentIndex(max(0, idx))

    def _fill_devices(self, devices: tuple[str, ...]) -> None:
        saved = self._initial.get("device") or "auto"
        self.device.clear()
        for d in devices:
            self.device.addItem(DEVICE_LABELS.get(d, d), d)
        if self.device.findData(saved) < 0:
            # Kept as it is (the settings file may be shared with another machine), but said plainly.
            self.device.addItem(f"{DEVICE_LABELS.get(saved, saved)}: not available on this computer", saved)
        self.device.setCurrentIndex(self.device.findData(saved))

    def _browse_tower(self) -> None:
        path = messages.choose_folder(self, "Choose the query reader's folder")
        if path:
            self.tower.setText(path)

    def values(self) -> dict[str, Any]:
        return {
            "device": self.device.currentData(),
            "default_model": self.model.currentData(),
            "text_tower": self.tower.text().strip() or None,
            # The spin box's minimum (one below the engine's) is its "model default" entry.
            "max_tokens": None if self.max_tokens.value() == self.max_tokens.minimum() else self.max_tokens.value(),
            "top_k": self.top_k.value(),
            "batch_size": self.batch.value(),
            "decode_workers": self.workers.value(),
            "raw_jpeg_pairs": self.raw_pairs.currentData(),
            "thumbnail_cache_mb": self.cache_mb.value(),
            "theme": self.theme.currentData(),
        }

    def accept(self) -> None:
        values = self.values()
        tower = values["text_tower"]
        if tower:
            from pathlib import Path

            if tower not in self._included_towers and not Path(tower).expanduser().is_dir():
                included = ", ".join(sorted(self._included_towers)) or "none"
                messages.show_error(self, "Query reader", f"{tower} is not a folder, nor a query reader "
                                                          f"included with an installed model ({included}).")
                return
        try:
            self.backend.save_settings(values)
        except OSError as exc:
            messages.show_error(self, "Settings not saved", f"Cannot write the settings file: {exc}")
            return
        except LonglensError as exc:  # a value outside the engine's range (same check as the file's)
            messages.show_error(self, "Settings not saved", str(exc))
            return
        self.saved.emit(values)
        super().accept()
