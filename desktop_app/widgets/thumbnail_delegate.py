"""Paints one result tile: thumbnail, score badge and file name, at one fixed size."""

from __future__ import annotations

from PySide6.QtCore import QModelIndex, QRect, QSize, Qt
from PySide6.QtGui import QColor, QFont, QPainter, QPalette, QPen
from PySide6.QtWidgets import QStyle, QStyledItemDelegate, QStyleOptionViewItem

from desktop_app.views.results_model import ScoreRole, ThumbnailRole, ThumbnailStateRole

TILE_THUMB = 176
TILE_PAD = 8
TEXT_LINES = 1


class ThumbnailDelegate(QStyledItemDelegate):
    def __init__(self, parent=None, thumb: int = TILE_THUMB) -> None:
        super().__init__(parent)
        self.thumb = thumb

    def tile_size(self, fm) -> QSize:
        return QSize(self.thumb + 2 * TILE_PAD, self.thumb + 2 * TILE_PAD + fm.height() * TEXT_LINES + 4)

    def sizeHint(self, option: QStyleOptionViewItem, index: QModelIndex) -> QSize:
        return self.tile_size(option.fontMetrics)

    def paint(self, painter: QPainter, option: QStyleOptionViewItem, index: QModelIndex) -> None:
        painter.save()
        painter.setRenderHint(QPainter.RenderHint.Antialiasing, True)
        painter.setRenderHint(QPainter.RenderHint.SmoothPixmapTransform, True)
        r = option.rect.adjusted(3, 3, -3, -3)
        pal = option.palette
        selected = bool(option.state & QStyle.StateFlag.State_Selected)
        hover = bool(option.state & QStyle.StateFlag.State_MouseOver)
        bg = pal.color(QPalette.ColorRole.Highlight) if selected else pal.color(QPalette.ColorRole.AlternateBase)
        if hover and not selected:
            bg = bg.lighter(108) if bg.lightness() < 128 else bg.darker(104)
        painter.setPen(Qt.PenStyle.NoPen)
        painter.setBrush(bg)
        painter.drawRoundedRect(r, 6, 6)

        box = QRect(r.left() + TILE_PAD - 3, r.top() + TILE_PAD - 3, self.thumb, self.thumb)
        pix = index.data(ThumbnailRole)
        if pix is not None and not pix.isNull():
            scaled = pix.size().scaled(box.size(), Qt.AspectRatioMode.KeepAspectRatio)
            target = QRect(0, 0, scaled.width(), scaled.height())
            target.moveCenter(box.center())
            painter.drawPixmap(target, pix)
        else:
            state = index.data(ThumbnailStateRole) or "loading"
            painter.setBrush(pal.color(QPalette.ColorRole.Base))
            painter.drawRoundedRect(box, 4, 4)
            painter.setPen(pal.color(QPalette.ColorRole.PlaceholderText))
            text = "loading…" if state == "loading" else "unreadable\n" + state.removeprefix("failed: ")
            painter.drawText(box.adjusted(6, 6, -6, -6), Qt.AlignmentFlag.AlignCenter | Qt.TextFlag.TextWordWrap,
                             text)

        score = index.data(ScoreRole)
        if score is not None:
            badge_font = QFont(option.font)
            badge_font.setBold(True)
            badge_font.setPointSizeF(max(7.5, option.font.pointSizeF() - 1))
            painter.setFont(badge_font)
            text = f"{score:.3f}"
            fm = painter.fontMetrics()
            bw, bh = fm.horizontalAdvance(text) + 10, fm.height() + 2
            badge = QRect(box.right() - bw - 4, box.top() + 4, bw, bh)
            painter.setPen(Qt.PenStyle.NoPen)
            painter.setBrush(QColor(0, 0, 0, 170))
            painter.drawRoundedRect(badge, 4, 4)
            painter.setPen(QColor(255, 255, 255))
            painter.drawText(badge, Qt.AlignmentFlag.AlignCenter, text)

        painter.setFont(option.font)
        painter.setPen(QPen(pal.color(QPalette.ColorRole.HighlightedText if selected else QPalette.ColorRole.Text)))
        name = index.data(Qt.ItemDataRole.DisplayRole) or ""
        text_rect = QRect(r.left() + 4, box.bottom() + 4, r.width() - 8, option.fontMetrics.height())
        painter.drawText(text_rect, Qt.AlignmentFlag.AlignHCenter | Qt.AlignmentFlag.AlignVCenter,
                         option.fontMetrics.elidedText(name, Qt.TextElideMode.ElideMiddle, text_rect.width()))
        painter.restore()
