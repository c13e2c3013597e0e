"""Reading one XMP packet (a sidecar file's bytes, or the packet embedded in a picture).

The XML is parsed by defusedxml with DTDs forbidden: an XMP packet never needs a DTD, entity
declarations or external references, so a packet with any of them (a "billion laughs" bomb, an
external entity reaching for a local file) is refused before anything is expanded, with a reason
naming the file. A packet that is not well-formed, over MAX_XMP_BYTES or nested deeper than
engine.limits.MAX_NESTING_DEPTH elements is refused the same way; a field whose value
cannot be read (a rating of "five", a latitude of 95°) is a problem of that field only, the other
fields are kept.

Fields read (RDF/XML as Lightroom Classic, Capture One, darktable and digiKam write it: simple
values as attributes of rdf:Description or as elements, arrays as rdf:Bag/Seq/Alt):

  dc:title, dc:description          text (the x-default entry of an rdf:Alt)
  dc:subject                        flat keywords
  lr:hierarchicalSubject            keyword paths, '|' between levels ("Places|Norway|Oslo")
  digiKam:TagsList                  keyword paths, '/' between levels (stored with '|')
  xmp:Rating                        -1 (rejected) to 5
  xmp:Label                         colour label as written; darktable:colorlabels when absent
  exif:DateTimeOriginal, photoshop:DateCreated, xmp:CreateDate   the first that is set, in that order
  exif:GPSLatitude, exif:GPSLongitude   "DD,MM.mmmmN" or "DD,MM,SSN" (XMP's GPSCoordinate)
  photoshop:SidecarForExtension     which file of a shared stem a sidecar belongs to

darktable's own tags ("darktable|format|cr2", "darktable|changed") are its bookkeeping, not the
user's keywords: they are left out, and so are the flat subjects darktable derives from them alone.
"""

from __future__ import annotations

import datetime as dt
import math
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Any

from defusedxml import DefusedXmlException
from defusedxml import ElementTree as SafeET

from engine.errors import LonglensError
from engine.limits import MAX_NESTING_DEPTH

# Bounds on what a user's file can make us hold (reliability checklist 33; the nesting limit,
# checklist 43, is engine.limits.MAX_NESTING_DEPTH, checked while parsing). A Lightroom sidecar
# with many local adjustments and masks runs to a few MB; 32 MiB is far past any real one and
# keeps the parsed tree to a few hundred MB at worst.
MAX_XMP_BYTES = 32 * 1024 * 1024
# A title or description longer than this is not a caption but something else pasted in.
MAX_TEXT_CHARS = 20_000
MAX_KEYWORDS = 5_000
MAX_KEYWORD_CHARS = 1_000

RDF = "http://www.w3.org/1999/02/22-rdf-syntax-ns#"
XML_LANG = "{http://www.w3.org/XML/1998/namespace}lang"
NS = {
    "dc": "http://purl.org/dc/elements/1.1/",
    "xmp": "http://ns.adobe.com/xap/1.0/",
    "lr": "http://ns.adobe.com/lightroom/1.0/",
    "digiKam": "http://www.digikam.org/ns/1.0/",
    "exif": "http://ns.adobe.com/exif/1.0/",
    "photoshop": "http://ns.adobe.com/photoshop/1.0/",
    "darktable": "http://darktable.sf.net/",
}
# Which properties set a date, in order of preference: the moment the shutter fired, then the
# date the content was created (IPTC), then when the file was made.
DATE_PROPERTIES = ("exif:DateTimeOriginal", "photoshop:DateCreated", "xmp:CreateDate")
# darktable:colorlabels numbers, as darktable names them.
DARKTABLE_COLOURS = {"0": "Red", "1": "Yellow", "2": "Green", "3": "Blue", "4": "Purple"}

# The groups of values a picture's XMP sources are merged by: a group is taken whole from one source.
GROUPS = ("title", "description", "keywords", "rating", "label", "taken_at", "gps")


class XmpError(LonglensError):
    """An XMP packet that cannot be read at all; the message names its file and why."""


@dataclass
class XmpPacket:
    """The fields one packet holds (a group is in `values` only when the packet sets it)."""

    source: str
    values: dict[str, Any] = field(default_factory=dict)
    sidecar_for: str | None = None  # photoshop:SidecarForExtension, e.g. "CR2"
    problems: list[str] = field(default_factory=list)


def parse_xmp(data: bytes, source: str) -> XmpPacket:
    """The fields of one XMP packet. `source` names it in messages ("IMG_0001.xmp", "the XMP
    embedded in IMG_0001.jpg"). Raises XmpError for a packet that cannot be read at all."""
    rdf = _rdf_root(data, source)
    props = _properties(rdf)
    packet = XmpPacket(source)
    bad = packet.problems

    for group, prop in (("title", "dc:title"), ("description", "dc:description")):
        text = _text(props.get(prop))
        if text is None:
            continue
        if len(text) > MAX_TEXT_CHARS:
            bad.append(f"{source}: {prop} is {len(text):,} characters long (the limit is {MAX_TEXT_CHARS:,}); "
                       "not read")
            continue
        packet.values[group] = text

    subjects = _keywords(props.get("dc:subject"), prop="dc:subject", source=source, problems=bad)
    hierarchy = _keywords(props.get("lr:hierarchicalSubject"), prop="lr:hierarchicalSubject", source=source,
                          problems=bad, separator="|")
    tags_list = _keywords(props.get("digiKam:TagsList"), prop="digiKam:TagsList", source=source, problems=bad,
                          separator="/")
    hierarchy += [path for path in tags_list if path not in hierarchy]  # digiKam writes both lists
    if "dc:subject" in props or "lr:hierarchicalSubject" in props or "digiKam:TagsList" in props:
        packet.values["keywords"] = _without_darktable_tags(subjects, hierarchy)

    raw_rating = _text(props.get("xmp:Rating"))
    if raw_rating is not None:
        rating = _rating(raw_rating)
        if rating is None:
            bad.append(f"{source}: xmp:Rating {raw_rating!r} is not a rating from -1 to 5; not read")
        else:
            packet.values["rating"] = rating

    label = _text(props.get("xmp:Label"))
    if label is None:
        colours = _items(props.get("darktable:colorlabels"))
        names = [DARKTABLE_COLOURS[c.strip()] for c in colours if c.strip() in DARKTABLE_COLOURS]
        label = names[0] if names else None
    if label is not None:
        packet.values["label"] = label[:MAX_KEYWORD_CHARS]

    for prop in DATE_PROPERTIES:
        raw = _text(props.get(prop))
        if raw is None:
            continue  # darktable writes exif:DateTimeOriginal="" when it has no date
        when = parse_xmp_date(raw)
        if when is None:
            bad.append(f"{source}: {prop} {raw!r} is not a date; not read")
            continue
        packet.values["taken_at"] = when
        break

    lat_raw, lon_raw = _text(props.get("exif:GPSLatitude")), _text(props.get("exif:GPSLongitude"))
    if lat_raw is not None or lon_raw is not None:
        lat = parse_gps_coordinate(lat_raw, "NS", 90.0) if lat_raw else None
        lon = parse_gps_coordinate(lon_raw, "EW", 180.0) if lon_raw else None
        if lat is None or lon is None:
            bad.append(f"{source}: exif:GPSLatitude {lat_raw!r} / exif:GPSLongitude {lon_raw!r} is not a "
                       "position; not read")
        else:
            packet.values["gps"] = (lat, lon)

    packet.sidecar_for = _text(props.get("photoshop:SidecarForExtension"))
    return packet


# --------------------------------------------------------------------------- the XML


class _TooDeep(Exception):
    pass


class _DepthLimitedTreeBuilder(ET.TreeBuilder):
    """ElementTree's tree builder, stopping the parse at the first element deeper than
    MAX_NESTING_DEPTH. expat itself parses any depth, but what walks the tree afterwards
    (ElementTree's serialiser when a sidecar is written back, copies, our own readers) recurses
    once per level, and a packet nested 100,000 deep would end there in a RecursionError."""

    def __init__(self) -> None:
        super().__init__()
        self._depth = 0

    def start(self, tag: str, attrs: dict[str, str]) -> ET.Element:
        self._depth += 1
        if self._depth > MAX_NESTING_DEPTH:
            raise _TooDeep
        return super().start(tag, attrs)

    def end(self, tag: str) -> ET.Element:
        self._depth -= 1
        return super().end(tag)


def _rdf_root(data: bytes, source: str) -> ET.Element:
    if len(data) > MAX_XMP_BYTES:
        raise XmpError(f"{source}: the XMP is {len(data):,} bytes (the limit is {MAX_XMP_BYTES:,}); not read")
    # Embedded packets are often padded with NULs or spaces after the closing processing instruction.
    data = data.strip(b"\x00 \t\r\n")
    if not data:
        raise XmpError(f"{source}: empty; no XMP in it")
    try:
        parser = SafeET.XMLParser(target=_DepthLimitedTreeBuilder(), forbid_dtd=True)
        parser.feed(data)
        root = parser.close()
    except _TooDeep:
        raise XmpError(f"{source}: elements nest deeper than {MAX_NESTING_DEPTH} levels (the limit for XMP); "
                       "nothing of it was read") from None
    except DefusedXmlException:
        raise XmpError(f"{source}: refused: it declares a DTD or entities (an XML bomb or an external "
                       "reference, which XMP never needs); nothing of it was read") from None
    except ET.ParseError as exc:
        raise XmpError(f"{source}: not well-formed XML ({exc}); nothing of it was read") from None
    rdf = root if root.tag == f"{{{RDF}}}RDF" else root.find(f".//{{{RDF}}}RDF")
    if rdf is None:
        raise XmpError(f"{source}: no rdf:RDF element, so not an XMP packet; nothing of it was read")
    return rdf


def _qname(tag: str) -> str | None:
    """'{namespace}Local' as 'prefix:Local' for the namespaces read here, else None."""
    if not tag.startswith("{"):
        return None
    uri, _, local = tag[1:].partition("}")
    for prefix, ns in NS.items():
        if ns == uri:
            return f"{prefix}:{local}"
    return None


def _properties(rdf: ET.Element) -> dict[str, str | ET.Element]:
    """The top-level properties of every rdf:Description (attributes and child elements), by
    'prefix:Name'; the first occurrence wins. Structures nested inside a property (darktable's
    history, crs:Look) are not walked: their fields are not the picture's."""
    props: dict[str, str | ET.Element] = {}
    for desc in rdf.findall(f"{{{RDF}}}Description"):
        for attr, value in desc.attrib.items():
            name = _qname(attr)
            if name is not None:
                props.setdefault(name, value)
        for child in desc:
            name = _qname(child.tag)
            if name is not None:
                props.setdefault(name, child)
    return props


def _container(el: ET.Element) -> ET.Element | None:
    for kind in ("Alt", "Bag", "Seq"):
        found = el.find(f"{{{RDF}}}{kind}")
        if found is not None:
            return found
    return None


def _items(value: str | ET.Element | None) -> list[str]:
    """The entries of an array property (or the one value of a simple one), stripped, blanks dropped."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value.strip()] if value.strip() else []
    box = _container(value)
    if box is None:
        text = _element_text(value)
        return [text] if text else []
    out = []
    for li in box.findall(f"{{{RDF}}}li"):
        text = _element_text(li)
        if text:
            out.append(text)
    return out


def _element_text(el: ET.Element) -> str | None:
    inner = el.find(f"{{{RDF}}}value")  # rdf:parseType="Resource" with an rdf:value
    text = (inner if inner is not None else el).text
    text = text.strip() if text else ""
    return text or None


def _text(value: str | ET.Element | None) -> str | None:
    """A simple value, or the x-default (else the first) entry of a language alternative."""
    if value is None:
        return None
    if isinstance(value, str):
        return value.strip() or None
    box = _container(value)
    if box is None:
        return _element_text(value)
    entries = box.findall(f"{{{RDF}}}li")
    for li in entries:
        if li.get(XML_LANG) == "x-default":
            return _element_text(li)
    return _element_text(entries[0]) if entries else None


# --------------------------------------------------------------------------- field values


def _keywords(value: str | ET.Element | None, *, prop: str, source: str, problems: list[str],
              separator: str | None = None) -> list[str]:
    out: list[str] = []
    items = _items(value)
    if len(items) > MAX_KEYWORDS:
        problems.append(f"{source}: {prop} has {len(items):,} entries (the limit is {MAX_KEYWORDS:,}); "
                        f"the first {MAX_KEYWORDS:,} were read")
        items = items[:MAX_KEYWORDS]
    for item in items:
        if len(item) > MAX_KEYWORD_CHARS:
            problems.append(f"{source}: a {prop} entry of {len(item):,} characters (the limit is "
                            f"{MAX_KEYWORD_CHARS:,}) was not read")
            continue
        keyword = normalise_keyword(item, separator) if separator else item
        if keyword and keyword not in out:
            out.append(keyword)
    return out


def normalise_keyword(text: str, separator: str = "|") -> str:
    """A keyword path with '|' between its levels, each level stripped, empty levels dropped."""
    return "|".join(part.strip() for part in text.split(separator) if part.strip())


def _without_darktable_tags(subjects: list[str], hierarchy: list[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    internal = [h for h in hierarchy if h.split("|", 1)[0] == "darktable"]
    if not internal:
        return tuple(subjects), tuple(hierarchy)
    kept = [h for h in hierarchy if h not in internal]
    users_words = {part for h in kept for part in h.split("|")}
    internal_words = {part for h in internal for part in h.split("|")} - users_words
    return tuple(s for s in subjects if s not in internal_words), tuple(kept)


def _rating(text: str) -> int | None:
    try:
        value = float(text)
    except ValueError:
        return None
    if not math.isfinite(value) or not value.is_integer() or not -1 <= value <= 5:
        return None
    return int(value)


_DATE = re.compile(
    r"^(\d{4})(?:[-:](\d{2})(?:[-:](\d{2})(?:[T ](\d{2}):(\d{2})(?::(\d{2})(?:[.,]\d+)?)?)?)?)?"
    r"(?:Z|[+-]\d{2}:?\d{2})?$"
)


def parse_xmp_date(text: str) -> str | None:
    """An XMP date (ISO 8601, any precision from the year to fractions of a second, with or
    without a time zone; or EXIF's 2023:06:14 10:22:31) as local time the way the catalog keeps
    EXIF dates: 2023-06-14T10:22:31, or 2023-06-14 / 2023-06 / 2023 when only that much is known.
    None when it is not a date."""
    m = _DATE.match(text.strip())
    if m is None:
        return None
    year, month, day, hour, minute, second = m.groups()
    try:
        if hour is not None:
            d = dt.datetime(int(year), int(month), int(day), int(hour), int(minute), int(second or 0))
            return d.strftime("%Y-%m-%dT%H:%M:%S")
        if day is not None:
            return dt.date(int(year), int(month), int(day)).isoformat()
        if month is not None:
            return f"{int(year):04d}-{dt.date(int(year), int(month), 1).month:02d}"
        return f"{int(year):04d}" if int(year) >= 1 else None
    except ValueError:
        return None


_GPS = re.compile(r"^(\d{1,3})(?:,(\d{1,2}(?:\.\d+)?)(?:,(\d{1,2}(?:\.\d+)?))?)?([NSEW])$")


def parse_gps_coordinate(text: str, refs: str, limit: float) -> float | None:
    """XMP's GPSCoordinate ("59,54.9134N", "59,54,54.8N"; also plain signed decimal degrees) as
    decimal degrees, negative to the south and west; None when it is not one (or past `limit`)."""
    raw = text.strip().upper().replace(" ", "")
    m = _GPS.match(raw)
    if m is not None:
        deg, minutes, seconds, ref = m.groups()
        if ref not in refs:
            return None
        mins, secs = float(minutes or 0), float(seconds or 0)
        if mins >= 60 or secs >= 60:
            return None
        value = int(deg) + mins / 60 + secs / 3600
        value = -value if ref in "SW" else value
    else:
        try:
            value = float(raw)
        except ValueError:
            return None
        if not math.isfinite(value):
            return None
    return round(value, 7) if abs(value) <= limit else None


def rdf_root(data: bytes, source: str) -> ET.Element:
    """The packet's rdf:RDF element, parsed with DTDs forbidden (engine.metadata.xmp_write reads
    a sidecar through it before editing it). Raises XmpError as parse_xmp does."""
    return _rdf_root(data, source)
