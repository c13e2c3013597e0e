"""Status-bar panel for a background job: what it does, a bar, rate and ETA, and Cancel."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QProgressBar, QPushButton, QWidget


def format_eta(seconds: float | None) -> str:
    if seconds is None:
        return ""
    s = int(round(seconds))
    if s < 60:
        return f"{s} s left"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s left"
    return f"{s // 3600} h {(s % 3600) // 60:02d} min left"


class ProgressPanel(QWidget):
    cancel_requested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        lay = QHBoxLayout(self)
        lay.setContentsMargins(6, 0, 6, 0)
        lay.setSpacing(8)
        self.label = QLabel()
        self.bar = QProgressBar()
        self.bar.setFixedWidth(220)
        self.bar.setTextVisible(True)
        self.rate = QLabel()
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.clicked.connect(self._cancel)
        for w in (self.label, self.bar, self.rate, self.cancel_button):
            lay.addWidget(w)
        self.setVisible(False)

    def _cancel(self) -> None:
        self.cancel_button.setEnabled(False)
        self.label.setText("Cancelling after the current batch…")
        self.cancel_requested.emit()

    def begin(self, text: str) -> None:
        self.label.setText(text)
        self.bar.setRange(0, 0)  # busy until the total is known
        self.rate.setText("")
        self.cancel_button.setEnabled(True)
        self.setVisible(True)

    def update_progress(self, stage: str, done: int, total: int | None, message: str,
                        rate: float | None, eta_s: float | None, unit: str = "images") -> None:
        if self.cancel_button.isEnabled():
            self.label.setText(message or stage)
        if total:
            self.bar.setRange(0, total)
            self.bar.setValue(min(done, total))
        else:
            self.bar.setRange(0, 0)
        parts = []
        if rate:
            parts.append(f"{rate:.1f} {unit}/s")
        eta = format_eta(eta_s)
        if eta:
            parts.append(eta)
        self.rate.setText(" · ".join(parts))

    def end(self) -> None:
        self.setVisible(False)
