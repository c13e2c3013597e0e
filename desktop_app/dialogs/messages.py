"""Telling and asking the user without blocking the event loop.

Message boxes are opened window-modal with `open()`, never `exec()`, so background work
keeps reporting while one is shown (and tests can find and close them). File pickers are
plain functions here so tests can replace them.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFileDialog, QMessageBox, QWidget

ERROR_OBJECT_NAME = "longlens-error"
INFO_OBJECT_NAME = "longlens-info"


def show_error(parent: QWidget | None, title: str, text: str, details: str | None = None) -> QMessageBox:
    box = QMessageBox(QMessageBox.Icon.Warning, title, text, QMessageBox.StandardButton.Ok, parent)
    box.setObjectName(ERROR_OBJECT_NAME)
    if details:
        box.setDetailedText(details)
    box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose, True)
    box.open()
    return box


def show_info(parent: QWidget | None, title: str, text: str) -> QMessageBox:
    box = QMessageBox(QMessageBox.Icon.Information, title, text, QMessageBox.StandardButton.Ok, parent)
    box.setObjectName(INFO_OBJECT_NAME)
    box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose, True)
    box.open()
    return box


def choose_folder(parent: QWidget | None, title: str = "Choose a folder") -> str | None:
    path = QFileDialog.getExistingDirectory(parent, title)
    return path or None


def choose_file(parent: QWidget | None, title: str, filters: str) -> str | None:
    path, _ = QFileDialog.getOpenFileName(parent, title, "", filters)
    return path or None


def choose_save_file(parent: QWidget | None, title: str, filters: str, suggested: str = "") -> str | None:
    path, _ = QFileDialog.getSaveFileName(parent, title, suggested, filters)
    return path or None


def confirm(parent: QWidget | None, title: str, text: str) -> bool:
    """Yes/No question. Blocking: only used for destructive actions started by the user."""
    answer = QMessageBox.question(parent, title, text)
    return answer == QMessageBox.StandardButton.Yes
