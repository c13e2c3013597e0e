"""Starting and stopping the desktop app: one QApplication, one Backend, one window, one instance."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from PySide6.QtCore import QLockFile
from PySide6.QtWidgets import QMessageBox

from desktop_app import theme
from desktop_app.background import WorkerHub, user_message
from desktop_app.facade import Backend, resolve_paths
from desktop_app.main_window import MainWindow
from desktop_app.qapp import ensure_app

LOCK_NAME = "longlens-gui.lock"


class AlreadyRunning(Exception):
    pass


def acquire_instance_lock(data_dir: Path) -> QLockFile:
    """Refuse a second window on the same catalog (checklist 14). The lock dies with the process."""
    data_dir.mkdir(parents=True, exist_ok=True)
    lock = QLockFile(str(data_dir / LOCK_NAME))
    lock.setStaleLockTime(0)  # only a lock whose process is gone is stale, however old
    if lock.tryLock(0):
        return lock
    info = lock.getLockInfo()  # (pid, host, app) when readable
    who = f" (process {info[0]} on {info[1]})" if isinstance(info, tuple) and len(info) >= 2 and info[0] else ""
    raise AlreadyRunning(
        f"Longlens is already running on this catalog{who}.\n\nSwitch to the open window, or close it "
        f"first. Two windows on one catalog would compete for the same files.\n\nCatalog: {data_dir}"
    )


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="longlens gui", description="Longlens desktop app")
    p.add_argument("--model", help="model for this session (default: the settings' model)")
    p.add_argument("--query", help="search for this paragraph when the window opens")
    p.add_argument("--home", help="keep all Longlens data under this folder (same as $LONGLENS_HOME)")
    p.add_argument("--self-test", action="store_true",
                   help="check this installation (demo model, indexing, search, window) on temporary "
                        "data, print the result and exit: 0 passed, 1 failed")
    return p.parse_args(list(argv))


def _fatal(title: str, text: str) -> None:
    print(f"longlens: {text}", file=sys.stderr)
    QMessageBox.critical(None, title, text)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.self_test:
        from desktop_app.selftest import run_self_test

        return run_self_test()  # on its own temporary data: --home and the user's catalog stay untouched
    if args.home:
        import os

        os.environ["LONGLENS_HOME"] = args.home
    app = ensure_app()
    paths = resolve_paths()
    try:
        lock = acquire_instance_lock(paths.data)
    except AlreadyRunning as exc:
        _fatal("Longlens is already running", str(exc))
        return 3
    try:
        try:
            backend = Backend(paths, model=args.model)
        except Exception as exc:  # e.g. a catalog from a newer Longlens: say so and stop
            _fatal("Cannot open the catalog", user_message(exc))
            return 2
        mode = backend.settings().get("theme") or "system"
        theme.apply_theme(app, mode)
        theme.follow_system(app)
        hub = WorkerHub()
        window = MainWindow(backend, hub, initial_query=args.query)
        window.show()
        rc = app.exec()
        window.shutdown()
        backend.close()
        return int(rc)
    finally:
        lock.unlock()
