"""Distances on the Earth for the GPS filter (`near` a point, within `km`).

The distance is the great-circle distance on a sphere of the Earth's mean radius (IUGG, 6371.0088
km), by the haversine formula, which stays exact for small distances (the law of cosines loses
them to rounding below a few metres). The sphere is off the ellipsoid by at most 0.5%: a
photograph's GPS position is rarely better than that at the distances people filter by.

In SQL the filter is a bounding box first (plain comparisons on image_metadata.gps_lat/gps_lon,
which an index serves), then the exact distance, computed by GREAT_CIRCLE_KM, a function the
catalog registers on every connection (engine.catalog.db): SQLite's own math functions
(sin, cos, asin) exist only when it was built with SQLITE_ENABLE_MATH_FUNCTIONS, which Python's
bundled SQLite is not on every platform.
"""

from __future__ import annotations

import math

EARTH_RADIUS_KM = 6371.0088
# The farthest two points can be: half the circumference. A larger radius keeps every picture.
MAX_DISTANCE_KM = math.pi * EARTH_RADIUS_KM
GREAT_CIRCLE_KM = "longlens_great_circle_km"  # the SQL function's name
# The bounding box is widened by this much (degrees) so that rounding never drops a picture that
# the exact distance keeps: the box only prefilters.
_BOX_MARGIN_DEG = 1e-9


def great_circle_km(lat1: float | None, lon1: float | None, lat2: float | None, lon2: float | None) -> float | None:
    """The great-circle distance in km between two points given in decimal degrees; None when a
    coordinate is missing (SQL NULL)."""
    if lat1 is None or lon1 is None or lat2 is None or lon2 is None:
        return None
    p1, p2 = math.radians(lat1), math.radians(lat2)
    dp, dl = p2 - p1, math.radians(lon2 - lon1)
    h = math.sin(dp / 2) ** 2 + math.cos(p1) * math.cos(p2) * math.sin(dl / 2) ** 2
    return 2 * EARTH_RADIUS_KM * math.asin(min(1.0, math.sqrt(h)))


def bounding_box(lat: float, lon: float, km: float) -> tuple[float, float, list[tuple[float, float]]]:
    """(south, north, [(west, east), ...]): every point within `km` of (lat, lon) lies in it.
    Longitudes come as one or two ranges (two where the box crosses the 180th meridian); a box
    that reaches a pole covers every longitude. After J. P. Matuschek, "Finding Points Within a
    Distance of a Latitude/Longitude Using Bounding Coordinates" (2010)."""
    angle = km / EARTH_RADIUS_KM  # radians of arc
    dlat = math.degrees(angle) + _BOX_MARGIN_DEG
    south, north = lat - dlat, lat + dlat
    if south <= -90 or north >= 90 or angle >= math.pi / 2:
        return max(south, -90.0), min(north, 90.0), [(-180.0, 180.0)]
    dlon = math.degrees(math.asin(min(1.0, math.sin(angle) / math.cos(math.radians(lat))))) + _BOX_MARGIN_DEG
    west, east = lon - dlon, lon + dlon
    if west < -180:
        return south, north, [(west + 360, 180.0), (-180.0, east)]
    if east > 180:
        return south, north, [(west, 180.0), (-180.0, east - 360)]
    return south, north, [(west, east)]
