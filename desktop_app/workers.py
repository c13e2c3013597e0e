"""The one seam between the Qt front end and the engine.

Everything the views need from the engine goes through this module:

* `Backend` forwards to engine objects (catalog, searcher, indexer, review, models, ...).
  It holds no logic of its own beyond choosing which engine function to call with which
  settings; views never import `engine`.
* `WorkerHub` runs engine work off the GUI thread: a plain call, or an engine job (a
  generator of Progress that checks a CancelToken), in a QThreadPool. A `Job` handle
  emits progress / succeeded / failed / finished signals in the GUI thread and forwards
  cancel to the engine's CancelToken. Workers never touch widgets.
* `ThumbnailLoader` makes thumbnails in worker threads, most recent request first, and
  drops requests nobody is waiting for any more.

Tests check `active_thread_count()` at teardown: every hub and loader registers itself
here so a thread left running fails the test.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, QThreadPool, Signal
from PySide6.QtGui import QImage

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


def _new_pool(parent: QObject, threads: int) -> QThreadPool:
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
        self.pool = _new_pool(self, threads)
        # Catalog writes from the GUI (verdicts, positions) go through one thread, in order.
        self.serial = _new_pool(self, 1)
        # Long jobs (indexing, pulls) run on their own, lower-priority threads.
        self.background = _new_pool(self, 2)
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
        self._pool = _new_pool(self, threads)
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


# --------------------------------------------------------------------------- the engine facade

DEFAULT_SETTINGS: dict[str, Any] = {
    "device": "auto",  # auto | cuda | mps | cpu
    "default_model": None,
    "text_tower": None,  # folder of a paragraph-trained text tower, overriding the model's
    # Smaller than the CLI's 32: the engine checks for cancel between batches, so the batch
    # size bounds how long Cancel takes; 16 keeps it under a second for typical files.
    "batch_size": 16,
    "decode_workers": 2,
    "thumbnail_cache_mb": 512,
    "theme": "system",  # system | light | dark
    "top_k": 200,
    "max_tokens": None,  # None: the model's default budget
}
DEVICES = ("auto", "cuda", "mps", "cpu")
THUMBNAIL_PX = 256


@dataclass
class LibraryInfo:
    id: int
    root: str
    status: str  # "online" | "offline" | "partial" (the last run did not complete)
    indexed: int
    unreadable: int
    deleted: int
    scanned: bool  # a full scan has completed at least once (else: pending)
    pending: int | None = None  # partial: files the interrupted run left to index (None: unknown)
    state: str = ""  # the engine's words for the state, as `longlens libraries` prints them

    @property
    def partial(self) -> bool:
        return self.status == "partial"

    @property
    def offline(self) -> bool:
        return self.status == "offline"


@dataclass
class ModelInfo:
    name: str
    backend: str
    installed: bool
    registered: bool
    bundled: bool
    description: str
    size_bytes: int | None
    problem: str | None
    notice: str | None  # e.g. "random, untrained weights"
    pullable: bool


@dataclass
class ModelState:
    name: str | None
    notice: str | None  # shown plainly next to the model name (untrained demo model)
    problem: str | None  # why there is no usable model


class Backend:
    """Engine services for the GUI, safe to call from worker threads."""

    def __init__(self, paths: Any = None, *, model: str | None = None) -> None:
        from engine.config import get_paths
        from engine.services import Services

        self.paths = (paths or get_paths()).ensure()
        self.services = Services(self.paths)
        try:
            self.services.settings()  # a bad value stops here with the file and key, not mid-run
        except Exception:
            self.services.close()
            raise
        self.session_model = model  # --model for this run only
        self._lock = threading.RLock()
        self._thumbs = None
        from engine.grounding import get_grounder

        # Replaceable (tests plug in a fake grounder to exercise the overlay UI).
        self.grounder_factory: Callable[[Any], Any] = get_grounder

    def close(self) -> None:
        self.services.close()

    # -- settings -----------------------------------------------------------
    def settings(self) -> dict[str, Any]:
        return {**DEFAULT_SETTINGS, **self.services.settings()}

    @staticmethod
    def setting_range(key: str) -> tuple[int, int]:
        """The valid range of a numeric setting, from the engine's validators (spin boxes use it)."""
        from engine.options import SETTINGS_NUMBERS

        number = SETTINGS_NUMBERS[key][0]
        return int(number.lo), int(number.hi)

    def save_settings(self, values: dict[str, Any]) -> None:
        """Raises a LonglensError naming the setting when a value is out of range; nothing is written."""
        self.services.save_settings(values)
        with self._lock:
            self._thumbs = None  # the cache size may have changed

    # -- models -------------------------------------------------------------
    def model_state(self) -> ModelState:
        from engine.errors import ModelError

        try:
            name = self._model_name()
        except ModelError as exc:
            return ModelState(None, None, str(exc))
        return ModelState(name, self.model_notice(name), None)

    def _model_name(self) -> str:
        from engine.errors import ModelNotInstalledError
        from engine.models.registry import installed_model_dir

        name = self.services.default_model_name(self.session_model)
        if installed_model_dir(name, self.paths) is None:
            from engine.models.registry import how_to_get

            raise ModelNotInstalledError(f"the model {name!r} is not installed. {how_to_get(name)}")
        return name

    @staticmethod
    def model_notice(name: str | None) -> str | None:
        from engine.demo import model_notice

        return model_notice(name)

    def embedder(self):
        s = self.settings()
        name = self._model_name()
        tower = Path(s["text_tower"]) if s.get("text_tower") else None
        with self._lock:
            return self.services.embedder(name, device=s.get("device") or "auto", text_tower=tower)

    def list_models(self) -> list[ModelInfo]:
        from engine.models.registry import get_spec, list_models

        out = []
        for m in list_models(self.paths):
            try:
                spec = get_spec(m.name) if m.registered else None
            except LonglensError:
                spec = None
            out.append(ModelInfo(
                name=m.name, backend=m.backend, installed=m.installed, registered=m.registered,
                bundled=m.bundled, description=m.description, size_bytes=m.size_bytes, problem=m.problem,
                notice=self.model_notice(m.name),
                pullable=bool(spec is not None and spec.repo_id and not spec.bundled),
            ))
        return out

    def import_model(self, folder: str, name: str) -> str:
        from engine.models.download import import_model

        return str(import_model(Path(folder), name, self.paths))

    def pull_job(self, name: str, trust_unpinned: bool = False) -> Callable[[CancelToken], Iterator[Progress]]:
        from engine.models.download import pull_model

        return lambda token: pull_model(name, self.paths, cancel=token, trust_unpinned=trust_unpinned)

    # -- libraries ------------------------------------------------------------
    def libraries(self) -> list[LibraryInfo]:
        cat = self.services.catalog
        out = []
        for lib in cat.libraries():
            counts = cat.status_counts(lib.id)
            state = cat.library_state(lib.id)
            status = lib.status
            if not Path(lib.root).is_dir():
                status = "offline"  # unmounted since the last scan; nothing is deleted
            out.append(LibraryInfo(lib.id, lib.root, status, counts.get("ok", 0), counts.get("unreadable", 0),
                                   counts.get("deleted", 0), lib.last_scan_at is not None,
                                   pending=state.pending, state=state.label))
        return out

    def unreadable(self, library_id: int) -> list[tuple[str, str]]:
        from engine.catalog.paths import for_display

        return [(for_display(r.rel_path), r.reason or "unreadable")
                for r in self.services.catalog.unreadable(library_id)]

    def remove_library(self, library_id: int) -> None:
        """Forget a folder: its catalog rows and derived indexes. The photos are not touched."""
        self.services.catalog.remove_library(library_id)
        self.services.store.drop(library_id)

    @staticmethod
    def check_folder(path: str) -> str | None:
        """A message when `path` cannot be added as a library folder, else None."""
        p = Path(path).expanduser()
        if not str(path).strip():
            return "no folder given"
        if not p.exists():
            return f"{p} does not exist"
        if not p.is_dir():
            return f"{p} is a file, not a folder: add the folder that holds your photos"
        try:
            next(iter(p.iterdir()), None)
        except PermissionError:
            return f"{p} cannot be read (permission denied)"
        except OSError as exc:
            return f"{p} cannot be read ({exc.strerror or exc})"
        return None

    def index_job(self, root: str) -> Callable[[CancelToken], Iterator[Progress]]:
        def job(token: CancelToken) -> Iterator[Progress]:
            yield Progress("load", message="loading the model")
            embedder = self.embedder()
            token.raise_if_cancelled()
            s = self.settings()
            indexer = self.services.indexer(embedder, batch_size=int(s["batch_size"]),
                                            decode_workers=int(s["decode_workers"]))
            yield from indexer.run(root, cancel=token)

        return job

    # -- search ---------------------------------------------------------------
    @staticmethod
    def image_suffixes() -> frozenset[str]:
        from engine.indexing.decode import SUPPORTED_EXTENSIONS

        return SUPPORTED_EXTENSIONS

    @staticmethod
    def _filter(filters: dict[str, Any] | None):
        from engine.catalog import ImageFilter

        f = filters or {}
        return ImageFilter(folder=f.get("folder") or None, after=f.get("after") or None,
                           before=f.get("before") or None, camera=f.get("camera") or None)

    def search_text(self, text: str, top_k: int, filters: dict[str, Any] | None = None,
                    max_tokens: int | None = None):
        embedder = self.embedder()
        return self.services.searcher(embedder).search_text(text, top_k=top_k, flt=self._filter(filters),
                                                            max_tokens=max_tokens)

    def search_image(self, path: str, top_k: int, filters: dict[str, Any] | None = None):
        embedder = self.embedder()
        return self.services.searcher(embedder).search_image(path, top_k=top_k, flt=self._filter(filters))

    def token_budget(self, text: str, max_tokens: int | None = None):
        from engine.query_budget import token_budget

        return token_budget(self.embedder(), text, max_tokens)

    # -- images -----------------------------------------------------------------
    def thumbnail(self, path: str, size: int):
        from engine.thumbnails import ThumbnailCache, make_thumbnail

        with self._lock:
            if self._thumbs is None:
                mb = int(self.settings().get("thumbnail_cache_mb") or DEFAULT_SETTINGS["thumbnail_cache_mb"])
                self._thumbs = ThumbnailCache(self.paths.thumbnails, max_bytes=mb * 1024 * 1024)
            cache = self._thumbs
        return make_thumbnail(path, size, cache)

    def clear_thumbnail_cache(self) -> None:
        from engine.thumbnails import ThumbnailCache

        ThumbnailCache(self.paths.thumbnails).clear()

    @staticmethod
    def display_image(path: str, max_side: int = 4096) -> QImage:
        """The picture upright, at most max_side pixels on its longer side, as a QImage."""
        from engine.thumbnails import render_thumbnail

        return pil_to_qimage(render_thumbnail(path, max_side))

    # -- grounding --------------------------------------------------------------
    def grounder(self):
        try:
            embedder = self.embedder()
        except LonglensError:
            return None
        return self.grounder_factory(embedder)

    def ground(self, image_path: str, text: str, sentences: list[tuple[int, int]] | None = None):
        """The grounding of `text` in the image, or None when the model has no grounder.

        `sentences`: the caller's sentence spans (the Review panel's rows), so that
        sentence_supports[i] belongs to the caller's sentence i."""
        grounder = self.grounder()
        if grounder is None:
            return None
        from engine.indexing.decode import decode_image

        image, _ = decode_image(Path(image_path))
        if sentences is None:
            return grounder.ground(image, text)
        return grounder.ground(image, text, sentences=list(sentences))

    # -- review -----------------------------------------------------------------
    def open_review(self, path: str):
        from engine import review

        return review.open_session(self.services.catalog, path)

    def review_item(self, session, index: int):
        from engine import review

        return review.get_item(self.services.catalog, session, index)

    def set_verdict(self, item_id: int, sentence_index: int | None, verdict: str | None, note: str = "") -> None:
        from engine import review

        review.set_verdict(self.services.catalog, item_id, sentence_index, verdict, note)

    def set_review_position(self, session, position: int) -> None:
        from engine import review

        review.set_position(self.services.catalog, session, position)

    def review_progress(self, session) -> tuple[int, int]:
        from engine import review

        return review.progress(self.services.catalog, session)

    def check_export_path(self, dest: str, inputs: list[str] = ()) -> str:
        """The export path when it may be written (not an input, a photo or inside a library),
        else the engine's OutputPathError naming it: the same guard as the CLI's outputs."""
        from engine.outputs import check_output

        roots = [lib.root for lib in self.services.catalog.libraries()]
        return str(check_output(dest, what="export", kind="export", inputs=inputs, library_roots=roots))

    def export_review(self, session, dest: str) -> int:
        from engine import review

        self.check_export_path(dest, [session.caption_file])
        return review.export_session(self.services.catalog, session, dest)

    @staticmethod
    def verdict_names() -> tuple[str, ...]:
        from engine.review import VERDICTS

        return VERDICTS

    # -- demo -----------------------------------------------------------------
    def demo_setup(self) -> str:
        """Install the demo model and photos; make the demo model the default if none works."""
        from engine.demo import demo_setup

        model, photos, self._demo_query = demo_setup(self.paths)
        if self.model_state().name is None:
            self.save_settings({"default_model": model})
        return str(photos)

    def demo_query(self) -> str:
        from engine.demo import DEMO_QUERY

        return getattr(self, "_demo_query", DEMO_QUERY)


def resolve_paths(home: str | None = None):
    """The engine's data locations ($LONGLENS_HOME or the platform's folders)."""
    from engine.config import get_paths

    return get_paths(home).ensure()


def display_text(path: str) -> str:
    """A path as text Qt can show: undecodable bytes of a file name become U+FFFD."""
    from engine.catalog.paths import for_display

    return for_display(path)


def installation_self_test(home: str, cancel: CancelToken | None = None) -> Iterator[Progress]:
    """The engine's installation self-test (engine.selftest) for `--self-test`, all data under `home`.

    The last Progress carries the report in extra["report"]; a failure raises a LonglensError
    whose message says which step failed.
    """
    from engine.selftest import self_test_job

    return self_test_job(Path(home), cancel=cancel)
