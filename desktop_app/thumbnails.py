"""Thumbnails off the GUI thread, and PIL -> QImage.

`ThumbnailLoader` makes thumbnails in worker threads (the picture maker is passed in: the
facade's), most recent request first, and drops requests nobody is waiting for any more.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QObject, Signal
from PySide6.QtGui import QImage

from desktop_app.background import log, new_pool, user_message

# --------------------------------------------------------------------------- images


def pil_to_qimage(image: Any) -> QImage:
    """An RGB/RGBA PIL image -> an independent QImage (safe to create in a worker thread)."""
    if image.mode not in ("RGB", "RGBA"):
        image = image.convert("RGB")
    fmt = QImage.Format.Format_RGB888 if image.mode == "RGB" else QImage.Format.Format_RGBA8888
    data = image.tobytes()
    bpl = image.width * (3 if image.mode == "RGB" else 4)
    return QImage(data, image.width, image.height, bpl, fmt).copy()


class ThumbnailLoader(QObject):
    """Thumbnails off the GUI thread: newest request first, bounded queue, no duplicates.

    A results grid asks for the thumbnails of the tiles it paints; when the user scrolls
    fast, old requests fall off the end of the queue instead of delaying the visible ones.
    """

    # Paths travel as Python objects: a file name that is not valid UTF-8 holds lone
    # surrogates, which a QString round trip would not give back unchanged.
    ready = Signal(object, QImage)  # path, image
    failed = Signal(object, str)  # path, reason

    def __init__(self, make: Callable[[str, int], Any], size: int, *, threads: int = 2,
                 max_queue: int = 256, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._make = make
        self.size = size
        self._threads = threads
        self._pool = new_pool(self, threads)
        self._lock = threading.Lock()
        self._queue: OrderedDict[str, None] = OrderedDict()  # newest last
        self._in_flight: set[str] = set()
        self._drainers = 0
        self._max_queue = max_queue
        self._stopped = False
        self.requests = 0  # distinct requests accepted (tests check laziness with it)

    def request(self, path: str) -> None:
        with self._lock:
            if self._stopped or path in self._in_flight:
                return
            if path in self._queue:
                self._queue.move_to_end(path)
                return
            self.requests += 1
            self._queue[path] = None
            while len(self._queue) > self._max_queue:
                self._queue.popitem(last=False)  # nobody is looking at that one any more
            start = self._drainers < self._threads
            if start:
                self._drainers += 1
        if start:
            self._pool.start(self._drain)

    def forget_pending(self) -> None:
        """Drop queued requests (a new result set replaces the old one)."""
        with self._lock:
            self._queue.clear()

    def _drain(self) -> None:
        while True:
            with self._lock:
                if self._stopped or not self._queue:
                    self._drainers -= 1
                    return
                path, _ = self._queue.popitem(last=True)
                self._in_flight.add(path)
            try:
                try:
                    img = pil_to_qimage(self._make(path, self.size))
                except Exception as exc:
                    if not self._stopped:
                        self.failed.emit(path, getattr(exc, "reason", None) or user_message(exc))
                else:
                    if not self._stopped:
                        self.ready.emit(path, img)
            except Exception:  # never let one bad file stop this drainer
                log.exception("thumbnail of %r", path)
            finally:
                with self._lock:
                    self._in_flight.discard(path)

    def shutdown(self, timeout_s: float = 10.0) -> bool:
        with self._lock:
            self._stopped = True
            self._queue.clear()
        return self._pool.waitForDone(int(timeout_s * 1000))
