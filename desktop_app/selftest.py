"""`--self-test`: proves an installed (or frozen) Longlens works, then exits 0, or 1 with the reason.

Two parts, both on a temporary LONGLENS_HOME that is removed afterwards, so the user's catalog,
settings and models are never touched, and neither needs a network:
1. the engine's self-test (desktop_app.facade.installation_self_test): verifies and loads the
   bundled demo model, indexes the bundled sample, and checks every sample paragraph ranks its
   picture first;
2. the desktop app itself: opens the real main window on that catalog, runs one search through
   the same workers the app uses, and checks the described picture comes first.
Output is plain text on stdout (failures on stderr), for installers and support requests.
"""

from __future__ import annotations

import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, TextIO

# The GUI search of part 2 normally takes a second; a slow, busy machine gets ample margin.
GUI_TIMEOUT_S = 120.0


class _Failed(Exception):
    pass


def _say(out: TextIO, text: str) -> None:
    out.write(text + "\n")
    out.flush()


def describe_build() -> str:
    frozen = "frozen app" if getattr(sys, "frozen", False) else "Python install"
    return f"Longlens self-test: {frozen}, Python {platform.python_version()}, {platform.platform()}"


def run_self_test(*, keep: str | None = None, gui: bool = True, out: TextIO | None = None,
                  err: TextIO | None = None) -> int:
    """Run both parts; returns the process exit code (0 passed, 1 failed)."""
    out = out or sys.stdout or open(os.devnull, "w")  # a windowed build has no stdout
    err = err or sys.stderr or out
    home = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="longlens-selftest-"))
    home.mkdir(parents=True, exist_ok=True)
    saved_home = os.environ.get("LONGLENS_HOME")
    # Everything below (engine and GUI) resolves its folders from here: never the user's data.
    os.environ["LONGLENS_HOME"] = str(home)
    try:
        _say(out, describe_build())
        _say(out, f"temporary data folder: {home}")
        report = _engine_part(home, out)
        if gui:
            _gui_part(report, out)
        _say(out, "self-test passed")
        return 0
    except _Failed as exc:
        _say(err, f"longlens self-test FAILED: {exc}")
        return 1
    finally:
        if saved_home is None:
            os.environ.pop("LONGLENS_HOME", None)
        else:
            os.environ["LONGLENS_HOME"] = saved_home
        if not keep:
            shutil.rmtree(home, ignore_errors=True)


def _engine_part(home: Path, out: TextIO) -> Any:
    from desktop_app.background import user_message
    from desktop_app.facade import installation_self_test

    t0 = time.monotonic()
    stage = ""
    last = None
    try:
        for last in installation_self_test(str(home)):
            if last.stage != stage and last.stage != "done":
                stage = last.stage
                _say(out, f"  {stage}: {last.message}")
    except Exception as exc:  # any failure, expected or not, must end in a readable message
        raise _Failed(f"during '{stage or 'start'}': {user_message(exc)}") from exc
    report = last.extra["report"]
    _say(out, f"  engine: {report.summary()} ({time.monotonic() - t0:.1f}s)")
    return report


def _gui_part(report: Any, out: TextIO) -> None:
    """Open the real window on the self-test catalog and search through the app's own workers."""
    if sys.platform.startswith("linux") and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        # No screen (a server, CI without Xvfb): Qt's offscreen platform still runs the whole window.
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    try:
        from PySide6.QtCore import QEventLoop, QTimer

        from desktop_app.background import WorkerHub
        from desktop_app.facade import Backend, resolve_paths
        from desktop_app.main_window import MainWindow
        from desktop_app.qapp import ensure_app
    except ImportError as exc:
        raise _Failed(f"the desktop app cannot start: {exc}") from exc

    check = report.checks[0]
    app = ensure_app()
    _say(out, f"  gui: Qt platform {app.platformName()}, searching for {check.image}")
    backend = Backend(resolve_paths(), model=report.model)
    hub = WorkerHub()
    window = MainWindow(backend, hub, initial_query=check.paragraph)
    loop = QEventLoop()
    shown: list[int] = []

    def on_results(n: int) -> None:
        shown.append(n)
        loop.quit()

    window.search_view.results_shown.connect(on_results)
    timer = QTimer()
    timer.setSingleShot(True)
    timer.timeout.connect(loop.quit)
    try:
        window.show()
        timer.start(int(GUI_TIMEOUT_S * 1000))
        loop.exec()
        result = window.search_view.last_result if shown else None
        if result is None:
            status = window.search_view.status.text()
            raise _Failed(f"the window showed no results within {GUI_TIMEOUT_S:.0f}s (status: {status!r})")
        first = Path(result.hits[0].path).name if result.hits else None
        if first != check.image:
            raise _Failed(f"the window's first result is {first}, expected {check.image}")
        _say(out, f"  gui: window search ranked {first} first of {len(result.hits)}")
    finally:
        timer.stop()
        window.shutdown()  # also stops the hub's threads
        window.close()
        backend.close()
