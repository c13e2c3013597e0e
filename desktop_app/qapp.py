"""The process's one QApplication (shared by the app, its self-test and the screenshot script).

Its own module so that desktop_app.selftest needs nothing from desktop_app.app (which starts
the self-test): no import circle.
"""

from __future__ import annotations

import sys

from PySide6.QtWidgets import QApplication


def ensure_app() -> QApplication:
    app = QApplication.instance()
    if app is None:
        app = QApplication(sys.argv[:1])
    app.setApplicationName("Longlens")
    app.setOrganizationName("Longlens")
    app.setApplicationDisplayName("Longlens")
    return app
