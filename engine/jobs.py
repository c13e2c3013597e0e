"""Long-running work as generators of Progress, stoppable with a CancelToken.

The CLI drives a job with a progress bar, the GUI through desktop_app/background.py;
both run the same engine generator.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from engine.errors import JobCancelled


class CancelToken:
    """Thread-safe flag a job checks between units of work (batches, files)."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def cancel(self) -> None:
        self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def raise_if_cancelled(self) -> None:
        if self._event.is_set():
            raise JobCancelled("cancelled by the user")


@dataclass
class Progress:
    """One progress report. `total` is None while it is still unknown (e.g. during a scan)."""

    stage: str
    done: int = 0
    total: int | None = None
    message: str = ""
    rate: float | None = None  # units per second, over the current stage
    eta_s: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def fraction(self) -> float | None:
        if not self.total:
            return None
        return min(1.0, self.done / self.total)


class RateMeter:
    """Rate and ETA over a stage, from the wall clock."""

    def __init__(self, total: int | None = None) -> None:
        self.start = time.monotonic()
        self.total = total

    def progress(self, stage: str, done: int, message: str = "", **extra: Any) -> Progress:
        elapsed = max(time.monotonic() - self.start, 1e-9)
        rate = done / elapsed if done else None
        eta = None
        if rate and self.total is not None:
            eta = max(self.total - done, 0) / rate
        return Progress(stage, done, self.total, message, rate, eta, dict(extra))


def run_to_end(job: Iterator[Progress]) -> Progress | None:
    """Drain a job without showing progress; returns the last report."""
    last = None
    for report in job:
        last = report
    return last


@contextmanager
def first_interrupt_cancels(token: CancelToken, message: str) -> Iterator[None]:
    """Within the block, the first Ctrl+C cancels `token` (printing `message` to stderr) and a
    second one raises KeyboardInterrupt as usual. Why: a KeyboardInterrupt raised inside a job's
    generator would end it without its checkpoint; a cancel lets it stop cleanly. Signal handlers
    can only be set from the main thread; elsewhere the block runs unchanged."""
    import signal
    import sys

    def on_interrupt(signum: int, frame: Any) -> None:
        token.cancel()
        print(message, file=sys.stderr)
        signal.signal(signal.SIGINT, signal.default_int_handler)

    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, on_interrupt) if in_main else None
    try:
        yield
    finally:
        if in_main:
            signal.signal(signal.SIGINT, previous)
