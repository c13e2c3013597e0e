"""Longlens desktop app (PySide6). Displays and forwards; the engine does the work.

The engine is reached only through `desktop_app.facade` (the engine facade) and
`desktop_app.background` (the thread adapter that runs engine jobs); views, widgets and dialogs
never import engine (an import-linter contract in pyproject.toml checks it).
"""
