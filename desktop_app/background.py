"""Background work: the one thread adapter between Qt and the engine's jobs.

`WorkerHub` runs engine work off the GUI thread: a plain call, or an engine job (a generator
of Progress that checks a CancelToken), in a QThreadPool. A `Job` handle emits progress /
succeeded / failed / finished signals in the GUI thread and forwards cancel to the engine's
CancelToken. Workers never touch widgets.

Tests check `active_thread_count()` at teardown: every hub and loader registers its pool
here (`new_pool`) so a thread left running fails the test.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from PySide6.QtCore import QObject, QThreadPool, Signal

from engine.errors import JobCancelled, LonglensError
from engine.jobs import CancelToken, Progress

log = logging.getLogger("longlens.gui")

_LIVE_POOLS: weakref.WeakSet[QThreadPool] = weakref.WeakSet()


def active_thread_count() -> int:
    """Threads of every pool the app created that are running work right now."""
    n = 0
    for pool in list(_LIVE_POOLS):
        try:
            n += pool.activeThreadCount()
        except RuntimeError:  # the C++ pool is gone
            continue
    return n


def new_pool(parent: QObject, threads: int) -> QThreadPool:
    pool = QThreadPool(parent)
    pool.setMaxThreadCount(threads)
    _LIVE_POOLS.add(pool)
    return pool


# --------------------------------------------------------------------------- jobs


def user_message(exc: BaseException) -> str:
    """A message a person can act on: engine errors carry one; anything else is a bug report."""
    if isinstance(exc, LonglensError):
        return str(exc)
    if isinstance(exc, MemoryError):
        return "out of memory"
    return f"unexpected error ({type(exc).__name__}: {exc}); please report it"


class Job(QObject):
    """Handle on one piece of background work. Signals arrive in the GUI thread."""

    progress = Signal(object)  # engine.jobs.Progress
    succeeded = Signal(object)  # the call's return value, or a job's last Progress
    failed = Signal(object)  # a message for a person (str; object so any path in it survives)
    cancelled = Signal()
    finished = Signal()  # always last, whatever happened

    def __init__(self, fn: Callable[..., Any], *, generator: bool, name: str = "", parent: QObject | None = None):
        super().__init__(parent)
        self.name = name or getattr(fn, "__name__", "job")
        self.token = CancelToken()
        self._fn = fn
        self._generator = generator
        self._done = threading.Event()
        self.started = False
        self.result: Any = None
        self.error: str | None = None
        self.was_cancelled = False

    # -- control (GUI thread) ------------------------------------------------
    def cancel(self) -> None:
        self.token.cancel()

    @property
    def running(self) -> bool:
        return not self._done.is_set()

    def wait(self, timeout_s: float | None = None) -> bool:
        return self._done.wait(timeout_s)

    def _abandon(self) -> None:
        """Never started (cleared from the queue at shutdown)."""
        self.was_cancelled = True
        self._done.set()

    # -- body (worker thread) --------------------------------------------------
    def _run(self) -> None:
        self.started = True
        if self._generator:
            _lower_thread_priority()
        try:
            if self.token.cancelled:
                raise JobCancelled("cancelled before it started")
            if self._generator:
                value = self._drain(self._fn(self.token))
            else:
                value = self._fn()
            self.result = value
            self.succeeded.emit(value)
        except JobCancelled:
            self.was_cancelled = True
            self.cancelled.emit()
        except BaseException as exc:  # a worker must never take the app down
            if not isinstance(exc, LonglensError):
                log.exception("background job %s failed", self.name)
            self.error = user_message(exc)
            self.failed.emit(self.error)
        finally:
            self.finished.emit()
            self._done.set()

    def _drain(self, gen: Iterator[Progress]) -> Progress | None:
        # At most ~20 progress signals a second reach the GUI, plus every stage change and
        # the last report, so a chatty job (a download) cannot flood the event loop.
        last: Progress | None = None
        sent_at = 0.0
        sent_stage = None
        for p in gen:
            last = p
            now = time.monotonic()
            if p.stage != sent_stage or now - sent_at >= 0.05 or p.stage == "done":
                self.progress.emit(p)
                sent_at, sent_stage = now, p.stage
        if last is not None and last.extra.get("summary") is not None and getattr(
            last.extra["summary"], "cancelled", False
        ):
            self.was_cancelled = True
        return last


BACKGROUND_NICENESS = 5


def _lower_thread_priority() -> None:
    """Long jobs (indexing, downloads) yield the CPU to the GUI thread.

    On Linux the nice value is per thread and inherited by threads it starts (the engine's
    decode pool), so the event loop gets the CPU first when both want it, even on two cores.
    Only ever lowered (raising it back would need privileges), and long jobs have their own
    pool, so no other work runs on a lowered thread.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        tid = threading.get_native_id()
        if os.getpriority(os.PRIO_PROCESS, tid) < BACKGROUND_NICENESS:
            os.setpriority(os.PRIO_PROCESS, tid, BACKGROUND_NICENESS)
    except OSError:
        pass


class WorkerHub(QObject):
    """Runs engine calls and jobs in thread pools; `shutdown` cancels and joins them all."""

    def __init__(self, threads: int = 3, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.pool = new_pool(self, threads)
        # Catalog writes from the GUI (verdicts, positions) go through one thread, in order.
        self.serial = new_pool(self, 1)
        # Long jobs (indexing, pulls) run on their own, lower-priority threads.
        self.background = new_pool(self, 2)
        self._jobs: set[Job] = set()
        self._closed = False

    def _submit(self, job: Job, serial: bool) -> Job:
        if self._closed:
            job._abandon()
            return job
        self._jobs.add(job)
        job.finished.connect(lambda j=job: self._jobs.discard(j))
        pool = self.serial if serial else (self.background if job._generator else self.pool)
        pool.start(job._run)
        return job

    @staticmethod
    def _connect(job: Job, on_result=None, on_error=None, on_progress=None, on_cancelled=None,
                 on_finished=None) -> None:
        # Connected before the job is submitted: a fast job could otherwise emit before anyone listens.
        for signal, slot in ((job.succeeded, on_result), (job.failed, on_error), (job.progress, on_progress),
                             (job.cancelled, on_cancelled), (job.finished, on_finished)):
            if slot is not None:
                signal.connect(slot)

    def call(
        self,
        fn: Callable[..., Any],
        *args: Any,
        on_result: Callable[[Any], None] | None = None,
        on_error: Callable[[str], None] | None = None,
        on_finished: Callable[[], None] | None = None,
        serial: bool = False,
        **kwargs: Any,
    ) -> Job:
        """Run fn(*args, **kwargs) in a worker; the callbacks run in the GUI thread."""
        job = Job(lambda: fn(*args, **kwargs), generator=False, name=getattr(fn, "__name__", "call"), parent=self)
        self._connect(job, on_result, on_error, on_finished=on_finished)
        return self._submit(job, serial)

    def start_job(
        self,
        make: Callable[[CancelToken], Iterator[Progress]],
        name: str = "job",
        *,
        on_progress: Callable[[Progress], None] | None = None,
        on_result: Callable[[Any], None] | None = None,
        on_error: Callable[[str], None] | None = None,
        on_cancelled: Callable[[], None] | None = None,
        on_finished: Callable[[], None] | None = None,
    ) -> Job:
        """Run an engine job: `make(token)` returns its Progress generator (on a lower-priority thread)."""
        job = Job(make, generator=True, name=name, parent=self)
        self._connect(job, on_result, on_error, on_progress, on_cancelled, on_finished)
        return self._submit(job, serial=False)

    @property
    def busy(self) -> bool:
        return bool(self._jobs)

    def jobs(self) -> list[Job]:
        return list(self._jobs)

    def wait_idle(self, timeout_s: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout_s
        for job in list(self._jobs):
            if not job.wait(max(0.0, deadline - time.monotonic())):
                return False
        return all(p.waitForDone(int(max(0.0, deadline - time.monotonic()) * 1000))
                   for p in (self.pool, self.background, self.serial))

    def shutdown(self, timeout_s: float = 15.0) -> bool:
        """Cancel everything, drop queued work, wait for running work. True if all stopped."""
        self._closed = True
        for job in list(self._jobs):
            job.cancel()
        self.pool.clear()
        self.background.clear()
        for job in list(self._jobs):
            if not job.started:
                job._abandon()
        ok = self.wait_idle(timeout_s)
        if not ok:
            log.error("background work still running after %.0f s at shutdown", timeout_s)
        return ok
