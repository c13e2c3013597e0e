"""The GUI suite's fixtures for reliability tests that drive the real window (tests/desktop_app's
conftest only applies under its own folder). Import the names a test module uses from here."""

from __future__ import annotations

import pytest

pytest.importorskip("PySide6")

from tests.desktop_app import conftest as gui  # noqa: E402

# Fixtures, for `from tests.reliability.gui_fixtures import *` (names pytest injects, which an explicit
# import would shadow); the helpers settle and index_folder are imported by name where used.
__all__ = ["backend", "hub", "installed_tiny", "longlens_home", "no_threads_left", "paths", "window"]

longlens_home = gui.longlens_home
no_threads_left = gui.no_threads_left
installed_tiny = gui.installed_tiny
backend = gui.backend
hub = gui.hub
window = gui.window
index_folder = gui.index_folder
settle = gui.settle


@pytest.fixture
def paths(longlens_home):
    """The GUI suite's data folders (this package's conftest provides the CLI's)."""
    from desktop_app import facade

    return facade.resolve_paths()
