"""Turning region maps into coloured overlays, and the legend that explains them.

Display only: the maps and support scores come from the engine's grounding; this module
just colours them (a perceptual ramp for one phrase, one hue per phrase for all phrases).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from PySide6.QtCore import QRect, QRectF, QSize, Qt
from PySide6.QtGui import QColor, QFont, QFontMetrics, QImage, QLinearGradient, QPainter, QPen
from PySide6.QtWidgets import QSizePolicy, QWidget

# A short perceptual ramp (dark violet -> magenta -> orange -> yellow), like "inferno".
_RAMP_STOPS = np.array([0.0, 0.35, 0.65, 1.0], dtype=np.float32)
_RAMP_RGB = np.array([[40, 11, 84], [187, 55, 84], [249, 142, 9], [252, 255, 164]], dtype=np.float32)

# Distinct hues for "all phrases" (Okabe–Ito / Tableau-like, readable on photos).
PHRASE_COLOURS: tuple[str, ...] = (
    "#e6194b", "#3cb44b", "#4363d8", "#f58231", "#911eb4",
    "#42d4f4", "#f032e6", "#bfef45", "#fabed4", "#469990",
)

LEGEND_ROWS = 4  # the most rows the on-screen legend takes
REGION_THRESHOLD = 0.6  # "strongest region": where a map reaches 60% of its own peak


def phrase_colour(i: int) -> QColor:
    return QColor(PHRASE_COLOURS[i % len(PHRASE_COLOURS)])


def ramp_rgb(values: np.ndarray) -> np.ndarray:
    """Values in [0, 1] -> uint8 RGB through the ramp."""
    v = np.clip(np.nan_to_num(values.astype(np.float32)), 0.0, 1.0)
    out = np.empty(v.shape + (3,), dtype=np.float32)
    for c in range(3):
        out[..., c] = np.interp(v, _RAMP_STOPS, _RAMP_RGB[:, c])
    return out.astype(np.uint8)


def _to_qimage(rgba: np.ndarray) -> QImage:
    rgba = np.ascontiguousarray(rgba, dtype=np.uint8)
    h, w = rgba.shape[:2]
    return QImage(rgba.data, w, h, 4 * w, QImage.Format.Format_RGBA8888).copy()


MAX_ALPHA = 235  # the most opaque an overlay gets: a region with full support


def support_strength(support: float) -> float:
    """How strongly a phrase's map is drawn: its support, in [0, 1].

    A region map is normalised to its own peak, so without this every phrase, even one the
    picture does not support at all (support 0.00), would light up as brightly as the best one.
    """
    s = float(np.nan_to_num(support))
    return max(0.0, min(1.0, s))


def heatmap_image(heatmap: np.ndarray, support: float) -> QImage:
    """One phrase's map -> RGBA at map resolution. Where in the picture: the map (weak regions
    fade to transparent); how bright: the phrase's support (0 draws nothing)."""
    h = np.clip(np.nan_to_num(np.asarray(heatmap, dtype=np.float32)), 0.0, 1.0)
    rgba = np.zeros(h.shape + (4,), dtype=np.uint8)
    rgba[..., :3] = ramp_rgb(h * support_strength(support))
    t = np.clip((h - 0.1) / 0.8, 0.0, 1.0)
    rgba[..., 3] = (t * t * (3 - 2 * t) * MAX_ALPHA * support_strength(support)).astype(np.uint8)
    return _to_qimage(rgba)


def strongest_regions(heatmaps: Sequence[np.ndarray]) -> np.ndarray:
    """Label map (h, w): index of the phrase whose strongest region covers the cell, or -1."""
    if not heatmaps:
        return np.zeros((0, 0), dtype=np.int32)
    stack = np.stack([np.clip(np.nan_to_num(np.asarray(m, dtype=np.float32)), 0, 1) for m in heatmaps])
    peaks = stack.reshape(len(heatmaps), -1).max(axis=1)
    inside = stack >= (REGION_THRESHOLD * peaks)[:, None, None]
    inside &= (peaks > 0)[:, None, None]
    masked = np.where(inside, stack, -1.0)
    label = masked.argmax(axis=0).astype(np.int32)
    label[masked.max(axis=0) < 0] = -1
    return label


def all_phrases_image(heatmaps: Sequence[np.ndarray], supports: Sequence[float],
                      colours: Sequence[QColor] | None = None) -> QImage:
    """Each phrase's strongest region in its own colour, as opaque as the phrase is supported."""
    label = strongest_regions(heatmaps)
    rgba = np.zeros(label.shape + (4,), dtype=np.uint8)
    for i in range(len(heatmaps)):
        c = colours[i] if colours is not None else phrase_colour(i)
        sel = label == i
        rgba[sel] = (c.red(), c.green(), c.blue(), int(200 * support_strength(supports[i])))
    return _to_qimage(rgba)


def compose(base: QImage, overlay: QImage, opacity: float) -> QImage:
    """The base image with the overlay scaled over it (smoothly) at `opacity`: what Export saves."""
    out = base.convertToFormat(QImage.Format.Format_ARGB32)
    p = QPainter(out)
    p.setRenderHint(QPainter.RenderHint.SmoothPixmapTransform, True)
    p.setOpacity(max(0.0, min(1.0, opacity)))
    p.drawImage(QRectF(0, 0, out.width(), out.height()), overlay)
    p.end()
    return out


BAND_BACKGROUND = QColor(32, 33, 36)
BAND_TEXT = QColor(255, 255, 255)


def with_legend(picture: QImage, title: str, entries: Sequence[tuple[QColor, str]] = (),
                support: float | None = None) -> QImage:
    """The composed picture with a band below it that says what the overlay shows: `title` (the
    phrase and its support), then the support ramp with the phrase's support marked (one phrase)
    or a colour swatch per phrase (all phrases). The picture itself is left whole, at full size;
    the title is also stored as the PNG's Description text."""
    w = picture.width()
    px = max(12, min(32, round(w / 45)))
    font = QFont()
    font.setPixelSize(px)
    fm = QFontMetrics(font)
    pad = max(6, px // 2)
    inner = QRect(0, 0, max(1, w - 2 * pad), 100_000)
    title_h = fm.boundingRect(inner, int(Qt.TextFlag.TextWordWrap), title).height()
    row_h = fm.height() + pad // 2
    legend_h = (px + fm.height() + pad) if not entries else row_h * len(entries)
    out = QImage(w, picture.height() + pad + title_h + pad + legend_h + pad, QImage.Format.Format_ARGB32)
    out.fill(BAND_BACKGROUND)
    p = QPainter(out)
    p.drawImage(0, 0, picture)
    p.setFont(font)
    p.setPen(QPen(BAND_TEXT))
    y = picture.height() + pad
    p.drawText(QRect(pad, y, inner.width(), title_h), int(Qt.TextFlag.TextWordWrap), title)
    y += title_h + pad
    if not entries:
        bar = QRectF(pad, y, w - 2 * pad, px * 0.7)
        g = QLinearGradient(bar.topLeft(), bar.topRight())
        for stop, rgb in zip(_RAMP_STOPS, _RAMP_RGB, strict=True):
            g.setColorAt(float(stop), QColor(int(rgb[0]), int(rgb[1]), int(rgb[2])))
        p.fillRect(bar, g)
        if support is not None:
            x = bar.left() + bar.width() * support_strength(support)
            p.fillRect(QRectF(x - 1.5, bar.top() - 3, 3, bar.height() + 6), BAND_TEXT)
        ty = int(bar.bottom()) + 2
        p.drawText(QRect(pad, ty, inner.width(), fm.height()), int(Qt.AlignmentFlag.AlignLeft), "weak")
        p.drawText(QRect(pad, ty, inner.width(), fm.height()), int(Qt.AlignmentFlag.AlignRight), "strong support")
    else:
        for colour, name in entries:
            p.fillRect(QRect(pad, y + (row_h - px) // 2, px, px), colour)
            text = fm.elidedText(name, Qt.TextElideMode.ElideRight, inner.width() - px - pad)
            p.drawText(QRect(2 * pad + px, y, inner.width() - px - pad, row_h),
                       int(Qt.AlignmentFlag.AlignVCenter), text)
            y += row_h
    p.end()
    out.setText("Description", title)
    return out


class Legend(QWidget):
    """A support ramp (single phrase) or a list of phrase swatches (all phrases)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._entries: list[tuple[QColor, str]] = []
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Fixed)
        self.setMinimumHeight(38)

    def show_ramp(self) -> None:
        self._entries = []
        self.setMinimumHeight(38)
        self.updateGeometry()
        self.update()

    def show_phrases(self, names: Sequence[str]) -> None:
        self._entries = [(phrase_colour(i), n) for i, n in enumerate(names)]
        # At most LEGEND_ROWS rows: the phrase list above shows every phrase's colour too, and a
        # legend as long as the list took its place in a small window.
        self.setMinimumHeight(max(38, 20 * min(len(self._entries), LEGEND_ROWS) + 6))
        self.updateGeometry()
        self.update()

    def entries(self) -> list[tuple[str, str]]:
        return [(c.name(), n) for c, n in self._entries]

    def sizeHint(self) -> QSize:
        return QSize(220, self.minimumHeight())

    def paintEvent(self, _event) -> None:
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing, True)
        fg = self.palette().color(self.foregroundRole())
        fm = self.fontMetrics()
        if not self._entries:
            bar = QRectF(4, 4, self.width() - 8, 12)
            g = QLinearGradient(bar.topLeft(), bar.topRight())
            for stop, rgb in zip(_RAMP_STOPS, _RAMP_RGB, strict=True):
                g.setColorAt(float(stop), QColor(int(rgb[0]), int(rgb[1]), int(rgb[2])))
            p.fillRect(bar, g)
            p.setPen(QPen(fg))
            y = int(bar.bottom()) + 4 + fm.ascent()
            p.drawText(4, y, "weak")
            strong = "strong support"
            p.drawText(int(bar.right()) - fm.horizontalAdvance(strong), y, strong)
        else:
            y = 3
            shown = self._entries if len(self._entries) <= LEGEND_ROWS else self._entries[:LEGEND_ROWS - 1]
            for colour, name in shown:
                p.fillRect(QRectF(4, y + 2, 14, 14), colour)
                p.setPen(QPen(fg))
                text = fm.elidedText(name, Qt.TextElideMode.ElideRight, self.width() - 28)
                p.drawText(24, y + 2 + fm.ascent(), text)
                y += 20
            if len(shown) < len(self._entries):
                p.setPen(QPen(fg))
                p.drawText(24, y + 2 + fm.ascent(),
                           f"… {len(self._entries) - len(shown)} more: each row of the list has its colour")
        p.end()


def support_tint(support: float, alpha: int = 90) -> QColor:
    """Background tint for text by support: red (contradicted/unsupported) through amber to green."""
    s = max(0.0, min(1.0, float(support)))
    if s < 0.5:
        t = s / 0.5
        r, g, b = 220, int(70 + (190 - 70) * t), 60
    else:
        t = (s - 0.5) / 0.5
        r, g, b = int(220 - (220 - 60) * t), int(190 - (190 - 170) * t), int(60 + (90 - 60) * t)
    return QColor(r, g, b, alpha)
