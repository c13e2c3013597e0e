"""A large image with zoom (wheel, +/-, 0 to fit, 1 for 100%) and pan (drag), plus an overlay layer."""

from __future__ import annotations

from PySide6.QtCore import QRectF, Qt, Signal
from PySide6.QtGui import QBrush, QImage, QPainter, QPixmap, QTransform
from PySide6.QtWidgets import QGraphicsPixmapItem, QGraphicsScene, QGraphicsView, QWidget

MIN_ZOOM, MAX_ZOOM = 0.02, 32.0


class ImageCanvas(QGraphicsView):
    zoom_changed = Signal(float)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setScene(QGraphicsScene(self))
        self.setRenderHints(QPainter.RenderHint.SmoothPixmapTransform | QPainter.RenderHint.Antialiasing)
        self.setDragMode(QGraphicsView.DragMode.ScrollHandDrag)
        self.setTransformationAnchor(QGraphicsView.ViewportAnchor.AnchorUnderMouse)
        self.setResizeAnchor(QGraphicsView.ViewportAnchor.AnchorViewCenter)
        self.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        self.setBackgroundBrush(QBrush(self.palette().color(self.backgroundRole()).darker(115)))
        self._image_item = QGraphicsPixmapItem()
        self._image_item.setTransformationMode(Qt.TransformationMode.SmoothTransformation)
        self._overlay_item = QGraphicsPixmapItem()
        self._overlay_item.setTransformationMode(Qt.TransformationMode.SmoothTransformation)
        self._overlay_item.setZValue(1)
        self.scene().addItem(self._image_item)
        self.scene().addItem(self._overlay_item)
        self._image = QImage()
        self._overlay = QImage()
        self._fit = True
        self._message = ""

    # -- content ------------------------------------------------------------------
    def set_image(self, image: QImage | None) -> None:
        self._image = image if image is not None else QImage()
        self._image_item.setPixmap(QPixmap.fromImage(self._image) if not self._image.isNull() else QPixmap())
        self.clear_overlay()
        self.scene().setSceneRect(QRectF(0, 0, max(1, self._image.width()), max(1, self._image.height())))
        self._fit = True
        self.fit()

    def image(self) -> QImage:
        return self._image

    def set_message(self, text: str) -> None:
        """Text drawn in the middle while there is no image (loading, unreadable)."""
        self._message = text
        self.viewport().update()

    def set_overlay(self, overlay: QImage | None, opacity: float | None = None) -> None:
        """An overlay at any resolution, stretched over the whole image (smoothly)."""
        self._overlay = overlay if overlay is not None else QImage()
        if self._overlay.isNull() or self._image.isNull():
            self._overlay_item.setPixmap(QPixmap())
            return
        self._overlay_item.setPixmap(QPixmap.fromImage(self._overlay))
        sx = self._image.width() / self._overlay.width()
        sy = self._image.height() / self._overlay.height()
        self._overlay_item.setTransform(QTransform.fromScale(sx, sy))
        if opacity is not None:
            self.set_overlay_opacity(opacity)

    def clear_overlay(self) -> None:
        self.set_overlay(None)

    def overlay(self) -> QImage:
        return self._overlay

    def has_overlay(self) -> bool:
        return not self._overlay.isNull() and not self._image.isNull()

    def set_overlay_opacity(self, opacity: float) -> None:
        self._overlay_item.setOpacity(max(0.0, min(1.0, opacity)))

    def overlay_opacity(self) -> float:
        return self._overlay_item.opacity()

    # -- zoom -------------------------------------------------------------------------
    def zoom(self) -> float:
        return self.transform().m11()

    def set_zoom(self, factor: float) -> None:
        factor = max(MIN_ZOOM, min(MAX_ZOOM, factor))
        self._fit = False
        self.setTransform(QTransform.fromScale(factor, factor))
        self.zoom_changed.emit(factor)

    def zoom_by(self, step: float) -> None:
        self.set_zoom(self.zoom() * step)

    def fit(self) -> None:
        self._fit = True
        if self._image.isNull():
            self.resetTransform()
            self.zoom_changed.emit(1.0)
            return
        self.fitInView(self._image_item, Qt.AspectRatioMode.KeepAspectRatio)
        self.zoom_changed.emit(self.zoom())

    def actual_size(self) -> None:
        self.set_zoom(1.0)

    # -- events -----------------------------------------------------------------------
    def wheelEvent(self, event) -> None:
        if self._image.isNull():
            return
        steps = event.angleDelta().y() / 120.0
        if steps:
            self.zoom_by(1.25 ** steps)
        event.accept()

    def keyPressEvent(self, event) -> None:
        key = event.key()
        if key in (Qt.Key.Key_Plus, Qt.Key.Key_Equal):
            self.zoom_by(1.25)
        elif key == Qt.Key.Key_Minus:
            self.zoom_by(0.8)
        elif key == Qt.Key.Key_0:
            self.fit()
        elif key == Qt.Key.Key_1 and event.modifiers() & Qt.KeyboardModifier.ControlModifier:
            self.actual_size()
        else:
            super().keyPressEvent(event)

    def mouseDoubleClickEvent(self, event) -> None:
        if self._fit:
            self.actual_size()
        else:
            self.fit()

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        if self._fit:
            self.fit()

    def drawForeground(self, painter: QPainter, rect: QRectF) -> None:
        super().drawForeground(painter, rect)
        if self._image.isNull() and self._message:
            painter.save()
            painter.resetTransform()
            painter.setPen(self.palette().color(self.foregroundRole()))
            painter.drawText(self.viewport().rect(), Qt.AlignmentFlag.AlignCenter | Qt.TextFlag.TextWordWrap,
                             self._message)
            painter.restore()
