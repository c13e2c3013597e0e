"""The paragraph query editor: Ctrl+Enter submits, the unread part is marked, images dropped become queries."""

from __future__ import annotations

from PySide6.QtCore import QMimeData, Qt, Signal
from PySide6.QtGui import QColor, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import QPlainTextEdit, QTextEdit, QWidget


class ParagraphEdit(QPlainTextEdit):
    submitted = Signal()
    image_dropped = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setPlaceholderText(
            "Describe the photo you are looking for. Several sentences are fine: what is in it, "
            "where, next to what, colours, light…   (Ctrl+Enter to search, or drop an image here)"
        )
        self.setTabChangesFocus(True)
        self.image_suffixes: frozenset[str] = frozenset()
        self._cut_at: int | None = None

    def keyPressEvent(self, event) -> None:
        if event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter) and (
            event.modifiers() & Qt.KeyboardModifier.ControlModifier
        ):
            self.submitted.emit()
            event.accept()
            return
        super().keyPressEvent(event)

    # -- truncation marker -----------------------------------------------------------------
    def mark_truncation(self, cut_at: int | None) -> None:
        """Shade the text from `cut_at` on: the model does not read it."""
        self._cut_at = cut_at
        if cut_at is None or cut_at >= len(self.toPlainText()):
            self.setExtraSelections([])
            return
        sel = QTextEdit.ExtraSelection()
        fmt = QTextCharFormat()
        fmt.setBackground(QColor(220, 60, 60, 70))
        fmt.setForeground(QColor(160, 160, 160) if self.palette().base().color().lightness() < 128
                          else QColor(120, 120, 120))
        fmt.setFontStrikeOut(False)
        fmt.setToolTip("past the token budget: the model does not read this part")
        sel.format = fmt
        cursor = QTextCursor(self.document())
        cursor.setPosition(cut_at)
        cursor.movePosition(QTextCursor.MoveOperation.End, QTextCursor.MoveMode.KeepAnchor)
        sel.cursor = cursor
        self.setExtraSelections([sel])

    def truncation_offset(self) -> int | None:
        return self._cut_at

    # -- drops ------------------------------------------------------------------------------
    def _image_path(self, mime: QMimeData) -> str | None:
        if not mime.hasUrls():
            return None
        for url in mime.urls():
            if url.isLocalFile():
                path = url.toLocalFile()
                if not self.image_suffixes or path.lower().endswith(tuple(self.image_suffixes)):
                    return path
        return None

    def canInsertFromMimeData(self, source: QMimeData) -> bool:
        return self._image_path(source) is not None or super().canInsertFromMimeData(source)

    def insertFromMimeData(self, source: QMimeData) -> None:
        path = self._image_path(source)
        if path is not None:
            self.image_dropped.emit(path)
            return
        if source.hasUrls() and not source.hasText():
            return  # a non-image file: nothing to type
        super().insertFromMimeData(source)
