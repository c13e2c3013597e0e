"""Search filters (folder, date range, camera): built and validated in one place for CLI and GUI.

A date is an ISO calendar date (2024-05-31); `after` is inclusive, `before` excludes that day
and later ones. A bad value raises FilterError naming the field, worded the same wherever the
filter comes from (no CLI flag names: the GUI shows the same message).
"""

from __future__ import annotations

import datetime as dt

from engine.catalog import ImageFilter
from engine.errors import LonglensError


class FilterError(LonglensError):
    """A search filter value is not valid."""


def _date(value: object, field: str) -> str | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, dt.datetime):
        return value.date().isoformat()
    if isinstance(value, dt.date):
        return value.isoformat()
    try:
        return dt.date.fromisoformat(str(value).strip()).isoformat()
    except ValueError:
        raise FilterError(f"the {field!r} date must be a date like 2024-05-31, got {value!r}",
                          settings=(field,)) from None


def _text(value: object, field: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise FilterError(f"the {field!r} filter must be text, got {value!r}", settings=(field,))
    return value.strip() or None


def build_filters(folder: object = None, after: object = None, before: object = None,
                  camera: object = None) -> ImageFilter:
    """An ImageFilter from user values (blank means no filter); FilterError names a bad field."""
    return ImageFilter(folder=_text(folder, "folder"), after=_date(after, "after"), before=_date(before, "before"),
                       camera=_text(camera, "camera"))
