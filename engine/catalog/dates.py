"""A picture's date: the EXIF capture date, else the date its metadata gives (as the index stored
it in image_metadata.taken_at: exif:DateTimeOriginal, photoshop:DateCreated or xmp:CreateDate of
a sidecar or an embedded packet, or IPTC-IIM's Date Created; image_metadata.taken_from says which
kind), else the file's modification time, marked as such.

Why this order: the EXIF date is the camera's own record; an XMP date is what the user's photo
tool says (often the same date, or one set by hand for a scan, which has no EXIF date); the file
time is only when the file was last written. Why computed here and not stored: the catalog already
keeps every file's mtime (mtime_ns) and the XMP date, so the fallback needs no new column and no
migration; the date filter (SQL, `picture_date_sql`) and every display (`picture_date`) compute
it the same way, in the machine's local time (EXIF dates are the camera's local time too, and the
XMP reader turns dates into local time). A picture therefore always has a date, and the date
filter never drops a picture for lacking one: it is dated by its file time instead, and every
place that shows the date says which one it is (`source`).

A date known only to the day, month or year (2023-06-14, 2023-06, 2023) is filtered and sorted
at the start of that period (2023-06-01T00:00:00), but shown as it is known ("2023-06"), never as
an exact midnight it does not say (`PictureDate.shown`). A date from IPTC-IIM (no EXIF or XMP date;
PhotoMetadata.taken_from "iptc") is labelled as such: DATE_FROM_IPTC.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from sqlalchemy import ColumnElement, func, select

from engine.catalog.schema import image_metadata, images

DATE_FROM_EXIF = "exif"
DATE_FROM_XMP = "xmp"
DATE_FROM_IPTC = "iptc"
DATE_FROM_FILE_TIME = "file time"
DATE_SOURCES = (DATE_FROM_EXIF, DATE_FROM_XMP, DATE_FROM_IPTC, DATE_FROM_FILE_TIME)
# How each source is named where a date is described ("taken 2023-06 (IPTC date)").
_SOURCE_WORDS = {DATE_FROM_XMP: "XMP date", DATE_FROM_IPTC: "IPTC date"}

_ISO = "%Y-%m-%dT%H:%M:%S"
_NS = 1_000_000_000


@dataclass(frozen=True)
class PictureDate:
    date: str  # ISO 8601 local time, 'YYYY-MM-DDTHH:MM:SS': what filters and sorting use
    source: str  # DATE_FROM_EXIF | DATE_FROM_XMP | DATE_FROM_IPTC | DATE_FROM_FILE_TIME
    known: str | None = None  # the date as written when only part of it is known ("2023-06")

    @property
    def shown(self) -> str:
        """The date as a person should see it: as much as is known ("2023-06", "2023-06-14"),
        else the whole date."""
        return self.known or self.date


def _whole_seconds(mtime_ns: int) -> int:
    # Truncated toward zero, as SQLite's integer division does (picture_date_sql), so that the
    # filter and the display agree to the second for every file time, before 1970 too.
    q = abs(int(mtime_ns)) // _NS
    return q if mtime_ns >= 0 else -q


def file_time_date(mtime_ns: int) -> str:
    """A file's modification time as an ISO local date-time, like an EXIF date."""
    return dt.datetime.fromtimestamp(_whole_seconds(mtime_ns)).strftime(_ISO)


# What completes a partial XMP date ("2023-06") to a whole one: its tail from the date's length on.
_START_OF_PERIOD = "0000-01-01T00:00:00"


def whole_xmp_date(taken_at: str) -> str:
    """A metadata date as stored (2023-06-14T10:22:31, or only 2023-06-14 / 2023-06 / 2023) as a
    whole date-time, the start of the period it names."""
    return taken_at + _START_OF_PERIOD[len(taken_at):]


def whole_date(date: str) -> str:
    """Any date a picture is shown with (whole, or partial as `PictureDate.shown` gives it) as the
    whole date-time it is sorted by: the start of its period."""
    return whole_xmp_date(date) if len(date) < len(_START_OF_PERIOD) else date


def is_partial(date: str | None) -> bool:
    """A date known only to the day, month or year (no time of day)."""
    return bool(date) and "T" not in str(date)


def picture_date(exif_date: str | None, mtime_ns: int, xmp_date: str | None = None,
                 xmp_from: str | None = None) -> PictureDate:
    """The date a picture is shown, sorted and filtered by: EXIF, else the metadata's date (XMP,
    or IPTC when `xmp_from` says so: PhotoMetadata.taken_from), else the file time."""
    if exif_date:
        return PictureDate(exif_date, DATE_FROM_EXIF)
    if xmp_date:
        source = DATE_FROM_IPTC if xmp_from == DATE_FROM_IPTC else DATE_FROM_XMP
        whole = whole_xmp_date(xmp_date)
        return PictureDate(whole, source, known=xmp_date if whole != xmp_date else None)
    return PictureDate(file_time_date(mtime_ns), DATE_FROM_FILE_TIME)


def xmp_date_sql() -> ColumnElement[str]:
    """The picture's stored XMP date (NULL when none), over the images table."""
    return (select(image_metadata.c.taken_at)
            .where(image_metadata.c.image_id == images.c.id, image_metadata.c.taken_at != "")
            .scalar_subquery())


def picture_date_sql() -> ColumnElement[str]:
    """`picture_date(...).date` as an SQL expression over the images table."""
    xmp = xmp_date_sql()
    whole_xmp = xmp.op("||")(func.substr(_START_OF_PERIOD, func.length(xmp) + 1))
    file_time = func.strftime(_ISO, images.c.mtime_ns.op("/")(_NS), "unixepoch", "localtime")
    return func.coalesce(images.c.exif_date, whole_xmp, file_time)


def describe_date(date: str | None, source: str | None) -> str:
    """A date as a person reads it, saying where it came from: 'taken 2024-05-31 10:00:00',
    'taken 2023-06-14 10:22:31 (XMP date)', 'taken 2023-06 (IPTC date)' (a partial date stays
    partial: give PictureDate.shown) or 'file time 2025-01-02 08:00:00 (no EXIF, XMP or IPTC date)'."""
    if not date:
        return "no date"
    text = date.replace("T", " ")
    if source == DATE_FROM_FILE_TIME:
        return f"file time {text} (no EXIF, XMP or IPTC date)"
    if source in _SOURCE_WORDS:
        return f"taken {text} ({_SOURCE_WORDS[source]})"
    return f"taken {text}"
