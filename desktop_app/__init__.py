"""Longlens desktop app (PySide6). Displays and forwards; the engine does the work.

The engine is reached only through `desktop_app.workers`.
"""
