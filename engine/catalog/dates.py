"""A picture's date: the EXIF capture date, else the file's modification time, marked as such.

Why computed here and not stored: the catalog already keeps every file's mtime (mtime_ns), so
the fallback needs no new column and no migration; the date filter (SQL, `picture_date_sql`)
and every display (`picture_date`) compute it the same way, in the machine's local time (EXIF
dates are the camera's local time too). A picture therefore always has a date, and the date
filter never drops a picture for lacking one: it is dated by its file time instead, and every
place that shows the date says which one it is (`source`).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from sqlalchemy import ColumnElement, func

from engine.catalog.schema import images

DATE_FROM_EXIF = "exif"
DATE_FROM_FILE_TIME = "file time"
DATE_SOURCES = (DATE_FROM_EXIF, DATE_FROM_FILE_TIME)

_ISO = "%Y-%m-%dT%H:%M:%S"
_NS = 1_000_000_000


@dataclass(frozen=True)
class PictureDate:
    date: str  # ISO 8601 local time, 'YYYY-MM-DDTHH:MM:SS'
    source: str  # DATE_FROM_EXIF | DATE_FROM_FILE_TIME


def _whole_seconds(mtime_ns: int) -> int:
    # Truncated toward zero, as SQLite's integer division does (picture_date_sql), so that the
    # filter and the display agree to the second for every file time, before 1970 too.
    q = abs(int(mtime_ns)) // _NS
    return q if mtime_ns >= 0 else -q


def file_time_date(mtime_ns: int) -> str:
    """A file's modification time as an ISO local date-time, like an EXIF date."""
    return dt.datetime.fromtimestamp(_whole_seconds(mtime_ns)).strftime(_ISO)


def picture_date(exif_date: str | None, mtime_ns: int) -> PictureDate:
    """The date a picture is shown, sorted and filtered by."""
    if exif_date:
        return PictureDate(exif_date, DATE_FROM_EXIF)
    return PictureDate(file_time_date(mtime_ns), DATE_FROM_FILE_TIME)


def picture_date_sql() -> ColumnElement[str]:
    """`picture_date(...).date` as an SQL expression over the images table."""
    file_time = func.strftime(_ISO, images.c.mtime_ns.op("/")(_NS), "unixepoch", "localtime")
    return func.coalesce(images.c.exif_date, file_time)


def describe_date(date: str | None, source: str | None) -> str:
    """A date as a person reads it, saying where it came from: 'taken 2024-05-31 10:00:00' or
    'file time 2025-01-02 08:00:00 (no EXIF date)'."""
    if not date:
        return "no date"
    text = date.replace("T", " ")
    if source == DATE_FROM_FILE_TIME:
        return f"file time {text} (no EXIF date)"
    return f"taken {text}"
