"""The results grid's model: any number of hits, thumbnails only for the tiles being painted.

The view (uniform item sizes) asks for ThumbnailRole only when it paints a tile, so only
visible tiles cause thumbnail requests; pixmaps are kept in a bounded LRU here (the disk
cache lives in the engine).
"""

from __future__ import annotations

import os
from collections import OrderedDict
from typing import Any

from PySide6.QtCore import QAbstractListModel, QModelIndex, QPersistentModelIndex, Qt
from PySide6.QtGui import QImage, QPixmap

from desktop_app.facade import date_text, display_text
from desktop_app.thumbnails import ThumbnailLoader

HitRole = Qt.ItemDataRole.UserRole + 1
ScoreRole = Qt.ItemDataRole.UserRole + 2
ThumbnailRole = Qt.ItemDataRole.UserRole + 3  # QPixmap, or None while loading
ThumbnailStateRole = Qt.ItemDataRole.UserRole + 4  # "ready" | "loading" | "failed: reason"
PathRole = Qt.ItemDataRole.UserRole + 5

PIXMAP_CACHE_ITEMS = 800


class ResultsModel(QAbstractListModel):
    def __init__(self, loader: ThumbnailLoader | None, parent=None) -> None:
        super().__init__(parent)
        self._hits: list[Any] = []
        self._rows_by_path: dict[str, list[int]] = {}
        self._pixmaps: OrderedDict[str, QPixmap] = OrderedDict()
        self._failed: dict[str, str] = {}
        self._loader = loader
        if loader is not None:
            loader.ready.connect(self._on_ready)
            loader.failed.connect(self._on_failed)

    # -- content ------------------------------------------------------------------
    def set_hits(self, hits: list[Any]) -> None:
        self.beginResetModel()
        self._hits = list(hits)
        self._rows_by_path = {}
        for row, h in enumerate(self._hits):
            self._rows_by_path.setdefault(h.path, []).append(row)
        self._failed.clear()
        if self._loader is not None:
            self._loader.forget_pending()
        self.endResetModel()

    def hit(self, row: int) -> Any:
        return self._hits[row]

    def hits(self) -> list[Any]:
        return self._hits

    # -- Qt model -------------------------------------------------------------------
    def rowCount(self, parent: QModelIndex | QPersistentModelIndex = QModelIndex()) -> int:
        return 0 if parent.isValid() else len(self._hits)

    def data(self, index: QModelIndex | QPersistentModelIndex, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid() or not 0 <= index.row() < len(self._hits):
            return None
        h = self._hits[index.row()]
        if role == Qt.ItemDataRole.DisplayRole:
            return display_text(os.path.basename(h.path))
        if role == ScoreRole:
            return h.score
        if role == HitRole:
            return h
        if role == PathRole:
            return h.path
        if role == Qt.ItemDataRole.ToolTipRole:
            parts = [display_text(h.path), f"score {h.score:.4f} (rank {h.rank})"]
            when = date_text(h)
            if when:
                parts.append(when)
            if getattr(h, "camera", None):
                parts.append(h.camera)
            return "\n".join(parts)
        if role == ThumbnailRole:
            pix = self._pixmaps.get(h.path)
            if pix is not None:
                self._pixmaps.move_to_end(h.path)
                return pix
            if h.path not in self._failed and self._loader is not None:
                self._loader.request(h.path)
            return None
        if role == ThumbnailStateRole:
            if h.path in self._pixmaps:
                return "ready"
            if h.path in self._failed:
                return f"failed: {self._failed[h.path]}"
            return "loading"
        return None

    # -- thumbnails arriving ------------------------------------------------------------
    def _changed(self, path: str) -> None:
        for row in self._rows_by_path.get(path, ()):
            idx = self.index(row)
            self.dataChanged.emit(idx, idx, [ThumbnailRole, ThumbnailStateRole])

    def _on_ready(self, path: object, image: QImage) -> None:
        if path not in self._rows_by_path:
            return
        self._pixmaps[path] = QPixmap.fromImage(image)
        while len(self._pixmaps) > PIXMAP_CACHE_ITEMS:
            self._pixmaps.popitem(last=False)
        self._changed(path)

    def _on_failed(self, path: object, reason: str) -> None:
        if path not in self._rows_by_path:
            return
        self._failed[path] = reason
        self._changed(path)
