"""GUI test fixtures: one QApplication per session (pytest-qt's qapp), a fresh LONGLENS_HOME per
test, a Backend with a tiny random BLIP, and a teardown check that no worker thread is left."""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
pytest.importorskip("PySide6")

from PySide6.QtCore import QThreadPool  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

from desktop_app import background, facade  # noqa: E402

TINY_MODEL = "tiny"
# How long a GUI test waits for something that must happen: a guard against a hang, never a
# timing. On a loaded 2-core CI machine (make test runs two workers) a model load or a first
# thumbnail can take several seconds, so the guard is generous; a working run never waits it out.
WAIT_MS = 60_000


@pytest.fixture(autouse=True)
def longlens_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own catalog, settings and caches."""
    home = tmp_path / "longlens-home"
    monkeypatch.setenv("LONGLENS_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a GUI test never reaches for the network
    return home


def _python_threads() -> dict[int, threading.Thread]:
    # Qt's own pool threads show up as _DummyThread once they run Python code and are never
    # removed from the registry; they are checked through the pools instead.
    return {t.ident: t for t in threading.enumerate()
            if t.ident is not None and not isinstance(t, threading._DummyThread)}


@pytest.fixture(autouse=True)
def no_threads_left(qapp: QApplication):
    """Fail the test if it leaves background work running (checked after widgets are closed)."""
    before = set(_python_threads())
    yield
    deadline = time.monotonic() + 0.5  # a thread that is returning right now is not "left running"
    while True:
        qapp.processEvents()
        pools = background.active_thread_count() + QThreadPool.globalInstance().activeThreadCount()
        extra = [t for i, t in _python_threads().items() if i not in before and t.is_alive()]
        if pools == 0 and not extra:
            return
        if time.monotonic() > deadline:
            break
        time.sleep(0.02)
    pytest.fail(f"test left work running: {pools} pool thread(s) busy, Python threads "
                f"{[t.name for t in extra]}")


@pytest.fixture
def paths(longlens_home: Path):
    return facade.resolve_paths()


@pytest.fixture
def installed_tiny(paths, blip_tiny_checkpoint) -> str:
    from engine.models.download import import_model

    import_model(blip_tiny_checkpoint, TINY_MODEL, paths)
    return TINY_MODEL


@pytest.fixture
def backend(paths, installed_tiny):
    b = facade.Backend(paths)
    yield b
    b.close()


@pytest.fixture
def hub(qapp):
    """The test's WorkerHub. Work still running at teardown fails the test (after stopping it)."""
    h = background.WorkerHub()
    yield h
    qapp.processEvents()
    running = [j.name for j in h.jobs() if j.running]
    h.shutdown()
    if running:
        pytest.fail(f"test left background jobs running: {running}")


@pytest.fixture(scope="session")
def sample_master(tmp_path_factory) -> Path:
    from engine.samples import make_sample_folder

    folder = tmp_path_factory.mktemp("gui-master") / "photos"
    make_sample_folder(folder, n=12, seed=3)
    return folder


@pytest.fixture
def photos(tmp_path: Path, sample_master: Path) -> Path:
    dest = tmp_path / "photos"
    shutil.copytree(sample_master, dest)
    return dest


@pytest.fixture
def window(qtbot, backend, hub):
    from desktop_app.main_window import MainWindow

    w = MainWindow(backend, hub)
    qtbot.addWidget(w)
    w.show()
    return w


def settle(qtbot, job, timeout_ms: int = WAIT_MS) -> None:
    """Wait for a worker job and deliver the signals it queued for the GUI thread."""
    assert job is not None
    qtbot.waitUntil(lambda: not job.running, timeout=timeout_ms)
    for _ in range(3):
        QApplication.processEvents()


def index_folder(qtbot, window, folder: Path, timeout_ms: int = WAIT_MS):
    """Add a folder through the library view and wait until indexing and the refresh are done."""
    with qtbot.waitSignal(window.queue.finished, timeout=timeout_ms) as blocker:
        assert window.library_view.add_folder(str(folder))
    qtbot.waitUntil(lambda: any(i.root == str(folder.resolve()) for i in window.library_view.infos),
                    timeout=timeout_ms)
    return blocker.args
