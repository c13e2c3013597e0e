"""Search filters (folder, date range, camera, and what XMP says: rating, label, keywords): built
and validated in one place for CLI and GUI.

A date is an ISO calendar date (2024-05-31); `after` is inclusive, `before` excludes that day
and later ones. The rating is a minimum, 0 to 5 stars (engine.options.MIN_RATING). A keyword is a
path with '|' between its levels ("Places|Norway"): it matches that keyword and every keyword
under it ("Places|Norway|Oslo"); a one-level keyword ("Oslo") also matches the flat keyword.
Several keywords must all match. A GPS filter is a position `near` ("59.91,10.75": latitude and
longitude in decimal degrees, north and east positive) and a radius `km` (more than 0): it keeps
the pictures whose GPS position is within that great-circle distance (engine.catalog.geo). A bad
value raises FilterError naming the field, worded the same wherever the filter comes from (no
CLI flag names: the GUI shows the same message).
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Iterable

from engine.catalog import ImageFilter
from engine.errors import LonglensError
from engine.metadata import normalise_keyword
from engine.options import GPS_RADIUS_KM, MIN_RATING, OptionError


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


def _rating(value: object) -> int | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    try:
        return int(MIN_RATING.parse(value) if isinstance(value, str) else MIN_RATING.check(value))
    except OptionError as exc:
        raise FilterError(str(exc), settings=("rating",)) from None


def _keywords(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    values: Iterable[object] = [value] if isinstance(value, str) else value  # type: ignore[assignment]
    if not isinstance(values, (list, tuple)):
        raise FilterError(f"the 'keyword' filter must be text, got {value!r}", settings=("keyword",))
    out: list[str] = []
    for v in values:
        text = _text(v, "keyword")
        if text is None:
            continue
        keyword = normalise_keyword(text)
        if not keyword:
            raise FilterError(f"the 'keyword' filter {text!r} has no keyword in it (levels are separated "
                              "by '|', like Places|Norway)", settings=("keyword",))
        if keyword not in out:
            out.append(keyword)
    return tuple(out)


def _blank(value: object) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def _number(value: object) -> float | None:
    """A finite number from a number or its text ("59.91", "1e3"); None when it is neither."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            return None
    else:
        return None
    return number if math.isfinite(number) else None


_POSITION_EXAMPLE = "a latitude and a longitude in decimal degrees, like 59.91,10.75 (south and west negative)"


def _near(value: object) -> tuple[float, float] | None:
    if _blank(value):
        return None
    if isinstance(value, str):
        parts = [p for p in re.split(r"[,;\s]+", value.strip()) if p]
    elif isinstance(value, (list, tuple)):
        parts = list(value)
    else:
        parts = []
    numbers = [_number(p) for p in parts]
    if len(numbers) != 2 or None in numbers:
        raise FilterError(f"the 'near' position must be {_POSITION_EXAMPLE}, got {value!r}", settings=("near",))
    lat, lon = numbers
    assert lat is not None and lon is not None
    if not -90 <= lat <= 90:
        raise FilterError(f"the 'near' latitude must be from -90 to 90 degrees, got {lat:g} (the position is "
                          "latitude first, then longitude)", settings=("near",))
    if not -180 <= lon <= 180:
        raise FilterError(f"the 'near' longitude must be from -180 to 180 degrees, got {lon:g}", settings=("near",))
    return lat, lon


def _km(value: object) -> float | None:
    if _blank(value):
        return None
    try:
        return float(GPS_RADIUS_KM.parse(value) if isinstance(value, str) else GPS_RADIUS_KM.check(value))
    except OptionError as exc:
        raise FilterError(str(exc), settings=("km",)) from None


def build_filters(folder: object = None, after: object = None, before: object = None,
                  camera: object = None, rating: object = None, label: object = None,
                  keyword: object = None, near: object = None, km: object = None) -> ImageFilter:
    """An ImageFilter from user values (blank means no filter); FilterError names a bad field.
    `keyword`: one keyword or a list of them (all must match). `near` ("lat,lon" or a pair of
    numbers) and `km` go together: the pictures within km of that position."""
    position, radius = _near(near), _km(km)
    if position is not None and radius is None:
        raise FilterError("the 'near' position needs a radius: give 'km', the distance from it in kilometres",
                          settings=("km",))
    if radius is not None and position is None:
        raise FilterError(f"the 'km' radius needs a 'near' position to measure from: {_POSITION_EXAMPLE}",
                          settings=("near",))
    return ImageFilter(folder=_text(folder, "folder"), after=_date(after, "after"), before=_date(before, "before"),
                       camera=_text(camera, "camera"), min_rating=_rating(rating), label=_text(label, "label"),
                       keywords=_keywords(keyword), near=position, km=radius)
