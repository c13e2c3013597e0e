"""A picture's EXIF and IPTC-IIM, read with exiv2 (python-exiv2), the library digiKam and darktable
read them with; only reading, never writing.

EXIF (the camera's, and what Windows Explorer writes):
  Exif.Photo.DateTimeOriginal (+ SubSecTimeOriginal, OffsetTimeOriginal), Exif.Image.Make,
  Exif.Image.Model, Exif.Photo.LensModel, Exif.GPSInfo.GPSLatitude/Longitude (+ their refs),
  Exif.Image.Orientation, Exif.Image.Rating (0-5), Exif.Image.RatingPercent (1, 25, 50, 75, 99).
IPTC-IIM (Photo Mechanic, agency files, Photoshop's "File Info", older tools):
  Iptc.Application2.Keywords, Caption (Caption-Abstract), Headline, ObjectName (the title),
  DateCreated + TimeCreated, Byline, City, CountryName.

Each source comes back as an engine.metadata.xmp.XmpPacket (the same groups and ReadFields as an
XMP packet), so engine.metadata.photo combines them with the XMP ones by one table. The EXIF date
is not a value of the "taken_at" group: the catalog keeps it as the picture's EXIF date
(engine.catalog.dates prefers it), so it is listed as a field and tells photo.py that the picture
has an EXIF date (darktable's invented sidecar date is recognised by its absence).

The file is opened through engine.fileutil.open_user_file first (no link followed when the scan
did not follow one, nothing but a regular file, never blocking), and exiv2 reads that very open
file where the platform names it (/proc/self/fd/N, /dev/fd/N), else the same path just checked.
Any exiv2 error is a problem naming the file, never an exception; a value that cannot be read (a
date of "garbage", a latitude of 95°) is a problem naming the file and field, and only that field
is lost.
"""

from __future__ import annotations

import logging
import os
import threading
import warnings
from fractions import Fraction
from pathlib import Path
from typing import Any

import exiv2

from engine.fileutil import FileTooLargeError, NotARegularFileError, open_user_file
from engine.metadata.xmp import (
    MAX_KEYWORD_CHARS,
    MAX_KEYWORDS,
    MAX_TEXT_CHARS,
    ReadField,
    XmpPacket,
    parse_xmp_date,
    percent_stars,
)

# CR3, HEIC and AVIF are ISO base media files, which libexiv2 reads only once this is enabled
# (a no-op, with a DeprecationWarning, where it was built enabled, as the wheels are).
with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    exiv2.enableBMFF(True)
# exiv2's own warnings (a maker note it does not know) would go to the log for every such picture.
# Its errors (a damaged IFD it skips: "Directory Image with 65535 entries considered invalid; not
# read.") come to Python's "exiv2" logger while the read goes on; those of a read are collected
# and become problems naming the file.
exiv2.LogMsg.setLevel(exiv2.LogMsg.Level.error)


class _ExivErrors(logging.Handler):
    """Collects the exiv2 log's errors while a read holds _EXIV2_LOCK (a bounded list), else drops
    them (a handler of its own keeps Python's last-resort handler from printing them)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if self.messages is not None and len(self.messages) < MAX_LOGGED:
            self.messages.append(record.getMessage().strip()[:500])


MAX_LOGGED = 5
_EXIV_ERRORS = _ExivErrors()
logging.getLogger("exiv2").addHandler(_EXIV_ERRORS)
# The XMP toolkit inside libexiv2 must be initialised once before threads use it, and darktable
# reads metadata under a lock (src/common/exif.cc, read_metadata_threadsafe): so do we.
exiv2.XmpParser.initialize()
_EXIV2_LOCK = threading.Lock()

# exiv2's codes for "not a picture it knows" (a format exiv2 does not read is not a problem).
_UNKNOWN_TYPE = {exiv2.ErrorCode.kerFileContainsUnknownImageType, exiv2.ErrorCode.kerMemoryContainsUnknownImageType}
# IPTC's "ESC % G": the dataset's strings are UTF-8. Without it they are usually Latin-1/Windows-1252.
_IPTC_UTF8 = "\x1b%G"

EXIF_DATE = "Exif.Photo.DateTimeOriginal"
EXIF_SUBSEC = "Exif.Photo.SubSecTimeOriginal"
EXIF_OFFSET = "Exif.Photo.OffsetTimeOriginal"


def read_exif_iptc(path: os.PathLike[str] | str, *, follow_symlinks: bool = True
                   ) -> tuple[XmpPacket | None, XmpPacket | None, list[str]]:
    """(EXIF, IPTC, problems) of the picture at `path`: each an XmpPacket whose source is
    "NAME (EXIF)" / "NAME (IPTC)", or None when the picture has none. Never raises for the file's
    content; an OSError opening it is a problem too."""
    name = Path(path).name
    target = os.fspath(path)
    try:
        with open_user_file(path, follow_symlinks=follow_symlinks) as f:
            target = _descriptor_path(f.fileno()) or target
            with _EXIV2_LOCK:
                _EXIV_ERRORS.messages = logged = []
                try:
                    image = exiv2.ImageFactory.open(target)
                    image.readMetadata()
                    exif = [(d.key(), d) for d in image.exifData()]
                    iptc = [(d.key(), d) for d in image.iptcData()]
                    exif_packet = _exif(exif, name) if exif else None
                    iptc_packet = _iptc(iptc, name) if iptc else None
                finally:
                    _EXIV_ERRORS.messages = None
    except (NotARegularFileError, FileTooLargeError) as exc:
        return None, None, [f"{name}: EXIF and IPTC not read ({exc})"]
    except OSError as exc:
        return None, None, [f"{name}: EXIF and IPTC not read ({exc.strerror or exc})"]
    except exiv2.Exiv2Error as exc:
        if getattr(exc, "code", None) in _UNKNOWN_TYPE:
            return None, None, []
        message = str(getattr(exc, "message", exc)).replace(f"{target}: ", "").replace(target, name)
        return None, None, [f"{name}: EXIF and IPTC not read (exiv2: {message})"]
    # exiv2 parses the embedded XMP too; what is wrong there engine.metadata.embedded and xmp say,
    # with their own bounds and words, so the XMP toolkit's complaints are not repeated.
    problems = [f"{name}: exiv2: {m.replace(target, name)}" for m in logged if not m.startswith("XMP Toolkit")]
    problems += [*(exif_packet.problems if exif_packet else ()), *(iptc_packet.problems if iptc_packet else ())]
    return exif_packet, iptc_packet, problems


def _descriptor_path(fd: int) -> str | None:
    """A path naming the open file itself, so exiv2 reads what was checked even if the name is
    swapped for a link meanwhile; None where the platform has none (Windows)."""
    for folder in ("/proc/self/fd", "/dev/fd"):
        candidate = f"{folder}/{fd}"
        if os.path.exists(candidate):
            return candidate
    return None


# --------------------------------------------------------------------------- EXIF


def _exif(data: list[tuple[str, Any]], name: str) -> XmpPacket:
    packet = XmpPacket(f"{name} (EXIF)")
    first: dict[str, Any] = {}
    for key, datum in data:
        first.setdefault(key, datum)  # a second IFD's copy (a thumbnail's) does not override
    bad = packet.problems

    def text(key: str) -> str | None:
        datum = first.get(key)
        if datum is None:
            return None
        value = _string(datum).strip().strip("\x00").strip()
        if len(value) > MAX_KEYWORD_CHARS:
            bad.append(f"{name}: {key} is {len(value):,} characters long (the limit is {MAX_KEYWORD_CHARS:,}); "
                       "not read")
            return None
        return value or None

    def field(key: str, group: str | None, used: bool = True, note: str = "", value: str | None = None) -> None:
        shown = value if value is not None else text(key)
        if shown:
            packet.fields.append(ReadField(key, shown, group, used, note))

    # The date, with its sub-seconds and offset as written (the ISO value keeps local time).
    raw_date = text(EXIF_DATE)
    if raw_date is not None:
        iso = parse_xmp_date(raw_date)
        if iso is None or "T" not in iso:
            bad.append(f"{name}: {EXIF_DATE} {raw_date!r} is not a date; not read")
            field(EXIF_DATE, None, False, "not a date", raw_date)
        else:
            packet.values["exif_date"] = iso
            field(EXIF_DATE, None, True, "the picture's EXIF date", raw_date)
    for key in (EXIF_SUBSEC, EXIF_OFFSET):
        field(key, None)

    make, model = text("Exif.Image.Make"), text("Exif.Image.Model")
    if make or model:
        packet.values["camera"] = (make, model)
    field("Exif.Image.Make", "camera", value=make)
    field("Exif.Image.Model", "camera", value=model)
    lens = text("Exif.Photo.LensModel")
    if lens:
        packet.values["lens"] = lens
        field("Exif.Photo.LensModel", "lens", value=lens)

    gps = _gps(first, name, bad)
    if gps is not None:
        packet.values["gps"] = gps
    for key in ("Exif.GPSInfo.GPSLatitudeRef", "Exif.GPSInfo.GPSLatitude", "Exif.GPSInfo.GPSLongitudeRef",
                "Exif.GPSInfo.GPSLongitude"):
        if key in first:
            field(key, "gps", gps is not None, "" if gps is not None else "not a position",
                  value=_string(first[key]).strip("\x00 ") or None)

    orientation = first.get("Exif.Image.Orientation")
    if orientation is not None:
        value = _integer(orientation)
        if value is None or not 1 <= value <= 8:
            bad.append(f"{name}: Exif.Image.Orientation {_string(orientation)!r} is not 1 to 8; not read")
            field("Exif.Image.Orientation", None, False, "not 1 to 8", _string(orientation))
        else:
            field("Exif.Image.Orientation", None, value=str(value))

    rated_by = None
    for key, convert in (("Exif.Image.Rating", _stars), ("Exif.Image.RatingPercent", percent_stars)):
        datum = first.get(key)
        if datum is None:
            continue
        raw = _string(datum).strip()
        stars = convert(raw)
        if stars is None:
            bad.append(f"{name}: {key} {raw!r} is not a rating; not read")
            field(key, "rating", False, "not a rating", raw)
        elif rated_by is not None:
            field(key, "rating", False, f"{rated_by} is the rating", raw)
        else:
            rated_by = key
            packet.values["rating"] = stars
            field(key, "rating", value=raw)
    return packet


def _stars(text: str) -> int | None:
    try:
        value = int(text.strip())
    except ValueError:
        return None
    return value if -1 <= value <= 5 else None


def _gps(first: dict[str, Any], name: str, bad: list[str]) -> tuple[float, float] | None:
    lat, lon = first.get("Exif.GPSInfo.GPSLatitude"), first.get("Exif.GPSInfo.GPSLongitude")
    if lat is None and lon is None:
        return None
    lat_ref = _string(first["Exif.GPSInfo.GPSLatitudeRef"]).strip("\x00 ").upper() \
        if "Exif.GPSInfo.GPSLatitudeRef" in first else ""
    lon_ref = _string(first["Exif.GPSInfo.GPSLongitudeRef"]).strip("\x00 ").upper() \
        if "Exif.GPSInfo.GPSLongitudeRef" in first else ""
    a = _degrees(lat, lat_ref, "NS", 90.0) if lat is not None else None
    b = _degrees(lon, lon_ref, "EW", 180.0) if lon is not None else None
    if a is None or b is None:
        shown = f"{_string(lat) if lat is not None else None!r} {lat_ref} / " \
                f"{_string(lon) if lon is not None else None!r} {lon_ref}"
        bad.append(f"{name}: Exif.GPSInfo.GPSLatitude / GPSLongitude {shown} is not a position; not read")
        return None
    return a, b


def _degrees(datum: Any, ref: str, refs: str, limit: float) -> float | None:
    """EXIF's three rationals (degrees, minutes, seconds) and its N/S or E/W reference as decimal
    degrees, negative to the south and west; None when they are not a coordinate."""
    if ref not in refs or len(ref) != 1:
        return None
    try:
        if datum.count() != 3:
            return None
        parts = []
        for i in range(3):
            num, den = datum.toRational(i)
            if den == 0 or num < 0 or den < 0:
                return None
            parts.append(Fraction(num, den))
    except (exiv2.Exiv2Error, ValueError, TypeError, OverflowError):
        return None
    # No check that minutes and seconds are under 60: exiftool rounds 59.9° to 59/1 53/1 60/1.
    deg, minutes, seconds = parts
    value = float(deg + minutes / 60 + seconds / 3600)
    if value > limit:
        return None
    return round(-value if ref in "SW" else value, 7)


# --------------------------------------------------------------------------- IPTC-IIM


IPTC_KEYWORDS = "Iptc.Application2.Keywords"
IPTC_CAPTION = "Iptc.Application2.Caption"
IPTC_TITLE = "Iptc.Application2.ObjectName"
IPTC_DATE = "Iptc.Application2.DateCreated"
IPTC_TIME = "Iptc.Application2.TimeCreated"
IPTC_SHOWN = ("Iptc.Application2.Headline", "Iptc.Application2.Byline", "Iptc.Application2.City",
              "Iptc.Application2.CountryName")


def _iptc(data: list[tuple[str, Any]], name: str) -> XmpPacket:
    packet = XmpPacket(f"{name} (IPTC)")
    bad = packet.problems
    utf8 = any(key == "Iptc.Envelope.CharacterSet" and _string(d) == _IPTC_UTF8 for key, d in data)
    values: dict[str, list[str]] = {}
    for key, datum in data:
        if key.startswith("Iptc.Application2.") and len(values.setdefault(key, [])) < MAX_KEYWORDS:
            values[key].append(_iptc_text(datum, utf8).strip())

    def one(key: str, limit: int = MAX_KEYWORD_CHARS) -> str | None:
        entries = [v for v in values.get(key, ()) if v]
        if not entries:
            return None
        if len(entries[0]) > limit:
            bad.append(f"{name}: {key} is {len(entries[0]):,} characters long (the limit is {limit:,}); not read")
            packet.fields.append(ReadField(key, entries[0][:200] + "…", None, False, "too long"))
            return None
        return entries[0]

    keywords: list[str] = []
    for word in values.get(IPTC_KEYWORDS, ()):
        if len(word) > MAX_KEYWORD_CHARS:
            bad.append(f"{name}: an {IPTC_KEYWORDS} entry of {len(word):,} characters (the limit is "
                       f"{MAX_KEYWORD_CHARS:,}) was not read")
        elif word and word not in keywords:
            keywords.append(word)
    if keywords:
        packet.values["keywords"] = (tuple(keywords), ())
        packet.fields.append(ReadField(IPTC_KEYWORDS, ", ".join(keywords), "keywords"))

    for group, key, limit in (("title", IPTC_TITLE, MAX_KEYWORD_CHARS), ("description", IPTC_CAPTION, MAX_TEXT_CHARS)):
        text = one(key, limit)
        if text:
            packet.values[group] = text
            packet.languages[group] = (("x-default", text),)
            packet.fields.append(ReadField(key, text, group))

    raw_date = one(IPTC_DATE)
    if raw_date is not None:
        raw_time = one(IPTC_TIME)
        when = _iptc_date(raw_date, raw_time)
        shown = f"{raw_date} {raw_time}" if raw_time else raw_date
        packet.dates.append((IPTC_DATE, shown, when))
        if when is None:
            bad.append(f"{name}: {IPTC_DATE} {raw_date!r} is not a date; not read")
        else:
            packet.values["taken_at"] = when
        packet.fields.append(ReadField(IPTC_DATE, raw_date, "taken_at", when is not None,
                                       "" if when is not None else "not a date"))
        if raw_time:
            packet.fields.append(ReadField(IPTC_TIME, raw_time, "taken_at", when is not None))

    for key in IPTC_SHOWN:
        text = one(key)
        if text:
            packet.fields.append(ReadField(key, text, None))
    return packet


def _iptc_text(datum: Any, utf8: bool) -> str:
    """An IPTC string: UTF-8 when the envelope says so (or when it is valid UTF-8, as most tools
    now write without saying), else Windows-1252/Latin-1, as exiftool reads it by default."""
    raw = _string(datum).encode("utf-8", "surrogateescape")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        if utf8:
            return raw.decode("utf-8", "replace")
        try:
            return raw.decode("cp1252")
        except UnicodeDecodeError:
            return raw.decode("latin-1")


def _iptc_date(date: str, time: str | None) -> str | None:
    """IPTC's DateCreated (exiv2 shows it 2023-06-14; a partial one as 2023-06-00 or 2023-00-00)
    and TimeCreated (10:22:31+02:00) as ISO local time, partial stays partial."""
    date = date.strip()
    digits = date.replace("-", "")
    if len(digits) == 8 and digits.isdigit():
        year, month, day = digits[:4], digits[4:6], digits[6:]
        if month == "00":
            return parse_xmp_date(year)
        if day == "00":
            return parse_xmp_date(f"{year}-{month}")
        date = f"{year}-{month}-{day}"
    if time:
        clock = time.strip()[:8]
        if len(clock) == 8 and clock[2] == ":" and clock[5] == ":":
            return parse_xmp_date(f"{date}T{clock}")
    return parse_xmp_date(date)


# --------------------------------------------------------------------------- values


def _string(datum: Any) -> str:
    try:
        return datum.toString()[:MAX_TEXT_CHARS * 2]
    except (exiv2.Exiv2Error, UnicodeError, ValueError):
        return ""


def _integer(datum: Any) -> int | None:
    try:
        return int(_string(datum).split()[0])
    except (ValueError, IndexError):
        return None
