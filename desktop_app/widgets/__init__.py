"""Reusable widgets: image canvas with overlays, thumbnail delegate, paragraph editor, progress."""
