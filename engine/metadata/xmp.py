"""Reading one XMP packet (a sidecar file's bytes, or the packet embedded in a picture).

The XML is parsed by defusedxml with DTDs forbidden: an XMP packet never needs a DTD, entity
declarations or external references, so a packet with any of them (a "billion laughs" bomb, an
external entity reaching for a local file) is refused before anything is expanded, with a reason
naming the file. A packet that is not well-formed, over MAX_XMP_BYTES or nested deeper than
engine.limits.MAX_NESTING_DEPTH elements is refused the same way; a field whose value
cannot be read (a rating of "five", a latitude of 95°) is a problem of that field only, the other
fields are kept.

Fields read (RDF/XML as Lightroom Classic, Capture One, darktable, digiKam, exiftool and Windows
write it: simple values as attributes of rdf:Description or as elements, arrays as rdf:Bag/Seq/Alt,
structures in any of RDF's forms). Which of them wins inside one packet, and against IPTC-IIM and
EXIF, is engine.metadata.photo's table (docs/xmp.md, "Precedence").

  dc:title, dc:description          text in every language (x-default first)
  dc:subject                        flat keywords
  lr:hierarchicalSubject            keyword paths, '|' between levels ("Places|Norway|Oslo")
  digiKam:TagsList                  keyword paths, '/' between levels (stored with '|')
  mwg-kw:Keywords                   MWG keyword trees (Hierarchy > Keyword, Children), as paths
  xmp:Rating                        -1 (rejected) to 5; else MicrosoftPhoto:Rating (percent, 1..99)
  xmp:Label                         colour label as written; else digiKam:ColorLabel (0-9), else
                                    darktable:colorlabels, else photoshop:Urgency (digiKam's reading)
  digiKam:PickLabel                 0 none, 1 rejected, 2 pending, 3 accepted
  exif:DateTimeOriginal, photoshop:DateCreated, xmp:CreateDate   the first that is set, in that order
  exif:GPSLatitude, exif:GPSLongitude   "DD,MM.mmmmN" or "DD,MM,SSN" (XMP's GPSCoordinate)
  tiff:Make, tiff:Model             the camera (Lightroom's sidecars of RAWs, f-spot)
  exifEX:LensModel, aux:Lens        the lens
  photoshop:Headline, dc:creator, photoshop:City, photoshop:Country   listed in `fields` only
  photoshop:SidecarForExtension     which file of a shared stem a sidecar belongs to
  xmpNote:HasExtendedXMP            the GUID of a JPEG's extended packet (engine.metadata.embedded)

Every property read is also kept as a ReadField (exiv2's key form, "Xmp.dc.subject"; its value as
written), so the inspector can list what each source says and which value is in effect.

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
    "tiff": "http://ns.adobe.com/tiff/1.0/",
    "exifEX": "http://cipa.jp/exif/1.0/",
    "aux": "http://ns.adobe.com/exif/1.0/aux/",
    "MicrosoftPhoto": "http://ns.microsoft.com/photo/1.0/",
    "mwg-kw": "http://www.metadataworkinggroup.com/schemas/keywords/",
    "xmpNote": "http://ns.adobe.com/xmp/note/",
}
# The same namespaces as other writers spell them: exiftool writes Microsoft's without the final
# slash that Windows and exiv2 write (exiftool's XMP.pm, %nsURI, "MicrosoftPhoto").
NS_ALIASES = {"http://ns.microsoft.com/photo/1.0": "MicrosoftPhoto"}
_PREFIX_OF = {uri: prefix for prefix, uri in NS.items()} | NS_ALIASES
# Which properties set a date, in order of preference: the moment the shutter fired, then the
# date the content was created (IPTC), then when the file was made.
DATE_PROPERTIES = ("exif:DateTimeOriginal", "photoshop:DateCreated", "xmp:CreateDate")
# darktable:colorlabels numbers, as darktable names them (src/common/colorlabels.c).
DARKTABLE_COLOURS = {"0": "Red", "1": "Yellow", "2": "Green", "3": "Blue", "4": "Purple"}
# digiKam:ColorLabel numbers (digiKam's ColorLabel enum, core/libs/metadataengine/.../digikam_globals.h;
# 0 is "no label"). digiKam also writes the same number into photoshop:Urgency (Nikon NX's colour
# label) and reads it from there when digiKam:ColorLabel is absent (dmetadata_labels.cpp).
DIGIKAM_COLOURS = {1: "Red", 2: "Orange", 3: "Yellow", 4: "Green", 5: "Blue", 6: "Magenta", 7: "Gray",
                   8: "Black", 9: "White"}
# digiKam:PickLabel numbers (digiKam's PickLabel enum; 0 is "no pick label").
DIGIKAM_PICKS = {1: "rejected", 2: "pending", 3: "accepted"}
# MicrosoftPhoto:Rating (and EXIF RatingPercent) percent to stars, as digiKam maps it
# (dmetadatasettingscontainer.cpp: 0 1 25 50 75 99 are 0..5 stars; between two, the lower).
PERCENT_STARS = (0, 1, 25, 50, 75, 99)

# The groups of values a picture's sources are merged by: a group is taken whole from one source.
GROUPS = ("title", "description", "keywords", "rating", "label", "pick", "taken_at", "gps", "camera", "lens")


class XmpError(LonglensError):
    """An XMP packet that cannot be read at all; the message names its file and why."""


@dataclass
class ReadField:
    """One field as a source holds it: `name` in exiv2's key form ("Xmp.dc.subject"), `value` as
    written (array entries joined by ", "), `group` the group of GROUPS it sets (None: shown only),
    `used` False when another field of the same source set that group (with `note` saying which)
    or the value was not read (a problem says why)."""

    name: str
    value: str
    group: str | None
    used: bool = True
    note: str = ""


@dataclass
class XmpPacket:
    """The fields one packet holds (a group is in `values` only when the packet sets it)."""

    source: str
    values: dict[str, Any] = field(default_factory=dict)
    sidecar_for: str | None = None  # photoshop:SidecarForExtension, e.g. "CR2"
    # darktable:xmp_version is set: darktable wrote it (it always writes that property)
    by_darktable: bool = False
    problems: list[str] = field(default_factory=list)
    fields: list[ReadField] = field(default_factory=list)
    # Every date property set, in DATE_PROPERTIES order: (name, as written, ISO local time or None)
    dates: list[tuple[str, str, str | None]] = field(default_factory=list)
    extended_guid: str | None = None  # xmpNote:HasExtendedXMP (a JPEG's extended packet)
    # "title" / "description": every language's entry, ((language, text), ...), x-default first
    languages: dict[str, tuple[tuple[str, str], ...]] = field(default_factory=dict)


def parse_xmp(data: bytes, source: str, *, extended: bytes | None = None) -> XmpPacket:
    """The fields of one XMP packet. `source` names it in messages ("IMG_0001.xmp", "the XMP
    embedded in IMG_0001.jpg"). `extended`: a JPEG's extended packet (already joined and checked
    against the main packet's xmpNote:HasExtendedXMP), whose properties the main packet's complete.
    Raises XmpError for a packet that cannot be read at all (the main one; an extended packet that
    cannot be read is a problem, and the main packet's fields are kept)."""
    rdf = _rdf_root(data, source)
    props = _properties(rdf)
    packet = XmpPacket(source)
    if extended is not None:
        try:
            for name, value in _properties(_rdf_root(extended, f"{source} (extended XMP)")).items():
                props.setdefault(name, value)
        except XmpError as exc:
            packet.problems.append(str(exc))
    bad = packet.problems
    fields = packet.fields

    def note(prop: str, group: str | None, value: str | ET.Element | None = None, *, used: bool = True,
             why: str = "") -> None:
        shown = _shown(props.get(prop) if value is None else value)
        if shown:
            fields.append(ReadField(_key(prop), shown, group, used, why))

    for group, prop in (("title", "dc:title"), ("description", "dc:description")):
        entries = _languages(props.get(prop))
        kept = []
        for lang, text in entries:
            if len(text) > MAX_TEXT_CHARS:
                bad.append(f"{source}: {prop} ({lang}) is {len(text):,} characters long (the limit is "
                           f"{MAX_TEXT_CHARS:,}); not read")
                continue
            kept.append((lang, text))
        if prop in props:
            note(prop, group, used=bool(kept), why="" if kept else "not read (see the problems)")
        if kept:
            packet.values[group] = kept[0][1]
            packet.languages[group] = tuple(kept)

    subjects = _keywords(props.get("dc:subject"), prop="dc:subject", source=source, problems=bad)
    hierarchy = _keywords(props.get("lr:hierarchicalSubject"), prop="lr:hierarchicalSubject", source=source,
                          problems=bad, separator="|")
    tags_list = _keywords(props.get("digiKam:TagsList"), prop="digiKam:TagsList", source=source, problems=bad,
                          separator="/")
    mwg = _mwg_keywords(props.get("mwg-kw:Keywords"), source=source, problems=bad)
    for path in (*tags_list, *mwg):  # digiKam writes both lists; MWG trees are a third
        if path not in hierarchy:
            hierarchy.append(path)
    keyword_props = ("dc:subject", "lr:hierarchicalSubject", "digiKam:TagsList", "mwg-kw:Keywords")
    for prop in keyword_props:
        if prop == "mwg-kw:Keywords":
            if mwg:
                fields.append(ReadField("Xmp.mwg-kw.Keywords", ", ".join(mwg), "keywords"))
        else:
            note(prop, "keywords")
    if any(prop in props for prop in keyword_props):
        packet.values["keywords"] = _without_darktable_tags(subjects, hierarchy)

    rating_set = False
    for prop, percent in (("xmp:Rating", False), ("MicrosoftPhoto:Rating", True)):
        raw = _text(props.get(prop))
        if raw is None:
            continue
        rating = percent_stars(raw) if percent else _rating(raw)
        if rating is None:
            bad.append(f"{source}: {prop} {raw!r} is not a rating from "
                       f"{'0 to 100' if percent else '-1 to 5'}; not read")
            note(prop, "rating", used=False, why="not a rating")
        elif rating_set:
            note(prop, "rating", used=False, why="xmp:Rating is the rating")
        else:
            note(prop, "rating")
            packet.values["rating"] = rating
            rating_set = True

    packet.values.update(_label(props, note, bad, source))

    raw_pick = _text(props.get("digiKam:PickLabel"))
    if raw_pick is not None:
        pick = _number(raw_pick)
        if pick is None or not 0 <= pick <= 3:
            bad.append(f"{source}: digiKam:PickLabel {raw_pick!r} is not a pick label from 0 to 3; not read")
            note("digiKam:PickLabel", "pick", used=False, why="not a pick label")
        elif pick == 0:
            note("digiKam:PickLabel", "pick", used=False, why="0 is no pick label")
        else:
            note("digiKam:PickLabel", "pick")
            packet.values["pick"] = DIGIKAM_PICKS[pick]

    chosen_date = None
    for prop in DATE_PROPERTIES:
        raw = _text(props.get(prop))
        if raw is None:
            continue  # darktable writes exif:DateTimeOriginal="" when it has no date
        when = parse_xmp_date(raw)
        packet.dates.append((prop, raw, when))
        if when is None:
            bad.append(f"{source}: {prop} {raw!r} is not a date; not read")
            note(prop, "taken_at", used=False, why="not a date")
            continue
        if chosen_date is None:
            chosen_date = prop
            packet.values["taken_at"] = when
            note(prop, "taken_at")
        else:
            note(prop, "taken_at", used=False, why=f"{chosen_date} is the date")

    lat_raw, lon_raw = _text(props.get("exif:GPSLatitude")), _text(props.get("exif:GPSLongitude"))
    if lat_raw is not None or lon_raw is not None:
        lat = parse_gps_coordinate(lat_raw, "NS", 90.0) if lat_raw else None
        lon = parse_gps_coordinate(lon_raw, "EW", 180.0) if lon_raw else None
        ok = lat is not None and lon is not None
        if not ok:
            bad.append(f"{source}: exif:GPSLatitude {lat_raw!r} / exif:GPSLongitude {lon_raw!r} is not a "
                       "position; not read")
        else:
            packet.values["gps"] = (lat, lon)
        for prop in ("exif:GPSLatitude", "exif:GPSLongitude"):
            note(prop, "gps", used=ok, why="" if ok else "not a position")

    make, model = _short(props, "tiff:Make", bad, source), _short(props, "tiff:Model", bad, source)
    if make or model:
        packet.values["camera"] = (make, model)
    for prop in ("tiff:Make", "tiff:Model"):
        note(prop, "camera", used=bool(make or model) and prop in props)
    lens_prop = None
    for prop in ("exifEX:LensModel", "aux:Lens"):
        lens = _short(props, prop, bad, source)
        if lens and lens_prop is None:
            lens_prop = prop
            packet.values["lens"] = lens
            note(prop, "lens")
        elif prop in props:
            note(prop, "lens", used=False, why=f"{lens_prop} is the lens" if lens_prop else "not read")

    for prop in ("photoshop:Headline", "dc:creator", "photoshop:City", "photoshop:Country"):
        note(prop, None)
    packet.sidecar_for = _text(props.get("photoshop:SidecarForExtension"))
    packet.by_darktable = "darktable:xmp_version" in props
    packet.extended_guid = _text(props.get("xmpNote:HasExtendedXMP"))
    return packet


def percent_stars(text: str) -> int | None:
    """A rating in percent (MicrosoftPhoto:Rating, EXIF RatingPercent: Windows writes 1, 25, 50, 75,
    99 for one to five stars) as stars the way digiKam maps it; None when it is not 0..100."""
    value = _number(text)
    if value is None or not 0 <= value <= 100:
        return None
    return max(i for i, floor in enumerate(PERCENT_STARS) if value >= floor)


def _label(props: dict[str, str | ET.Element], note: Any, bad: list[str], source: str) -> dict[str, Any]:
    """The colour label: xmp:Label as written (Lightroom, darktable, digiKam's five names; "Rot"
    from a German Lightroom), else digiKam's number, else darktable's, else photoshop:Urgency read
    as digiKam reads it (a colour number, Nikon NX's convention) when nothing else names a colour."""
    out: dict[str, Any] = {}
    order = ("xmp:Label", "digiKam:ColorLabel", "darktable:colorlabels", "photoshop:Urgency")
    for prop in order:
        if prop not in props:
            continue
        if "label" in out:
            note(prop, "label", used=False, why=f"{out['_from']} is the colour label")
            continue
        if prop == "xmp:Label":
            label = _text(props.get(prop))
            if label is None:
                continue
            out.update(label=label[:MAX_KEYWORD_CHARS], _from=prop)
        elif prop == "darktable:colorlabels":
            colours = _items(props.get(prop))
            names = [DARKTABLE_COLOURS[c.strip()] for c in colours if c.strip() in DARKTABLE_COLOURS]
            if not names:
                continue
            out.update(label=names[0], _from=prop)
        else:
            raw = _text(props.get(prop))
            if raw is None:
                continue
            number = _number(raw)
            if number is None or not 0 <= number <= 9:
                if prop == "digiKam:ColorLabel":
                    bad.append(f"{source}: {prop} {raw!r} is not a colour label from 0 to 9; not read")
                note(prop, "label", used=False, why="not a colour label number")
                continue
            if number == 0:
                note(prop, "label", used=False, why="0 is no colour label")
                continue
            out.update(label=DIGIKAM_COLOURS[number], _from=prop)
        note(prop, "label")
    out.pop("_from", None)
    return out


def _short(props: dict[str, str | ET.Element], prop: str, bad: list[str], source: str) -> str | None:
    text = _text(props.get(prop))
    if text is not None and len(text) > MAX_KEYWORD_CHARS:
        bad.append(f"{source}: {prop} is {len(text):,} characters long (the limit is {MAX_KEYWORD_CHARS:,}); "
                   "not read")
        return None
    return text


def _number(text: str) -> int | None:
    try:
        value = float(text.strip())
    except ValueError:
        return None
    if not math.isfinite(value) or not value.is_integer():
        return None
    return int(value)


def _key(prop: str) -> str:
    """'dc:subject' in exiv2's key form, 'Xmp.dc.subject'."""
    prefix, _, local = prop.partition(":")
    return f"Xmp.{prefix}.{local}"


def _shown(value: str | ET.Element | None) -> str:
    """A property's value as the inspector lists it: array entries joined by ", ", a language
    alternative's entries as lang="de" text, like `exiv2 -pa`."""
    if value is None:
        return ""
    if isinstance(value, ET.Element):
        box = _container(value)
        if box is not None and box.tag == f"{{{RDF}}}Alt":
            entries = _languages(value)
            if len(entries) == 1 and entries[0][0] == "x-default":
                return entries[0][1][:MAX_TEXT_CHARS]
            return ", ".join(f'lang="{lang}" {text}' for lang, text in entries)[:MAX_TEXT_CHARS]
    return ", ".join(_items(value)[:MAX_KEYWORDS])[:MAX_TEXT_CHARS]


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
    prefix = _PREFIX_OF.get(uri)
    return None if prefix is None else f"{prefix}:{local}"


def _properties(rdf: ET.Element) -> dict[str, str | ET.Element]:
    """The top-level properties of every rdf:Description (attributes and child elements), by
    'prefix:Name'; the first occurrence wins. Structures nested inside a property (darktable's
    history, crs:Look) are not walked: their fields are not the picture's."""
    return _named_properties(rdf.findall(f"{{{RDF}}}Description"))


def _named_properties(nodes: list[ET.Element]) -> dict[str, str | ET.Element]:
    """The attributes and child elements of these nodes in the namespaces read here, by
    'prefix:Name'; the first occurrence wins."""
    props: dict[str, str | ET.Element] = {}
    for node in nodes:
        for attr, value in node.attrib.items():
            name = _qname(attr)
            if name is not None:
                props.setdefault(name, value)
        for child in node:
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


def _languages(value: str | ET.Element | None) -> list[tuple[str, str]]:
    """Every entry of a language alternative as (language, text), x-default first (an entry
    without xml:lang, or a simple value, counts as x-default); blanks and repeated languages dropped."""
    if value is None:
        return []
    if isinstance(value, str):
        return [("x-default", value.strip())] if value.strip() else []
    box = _container(value)
    if box is None:
        text = _element_text(value)
        return [("x-default", text)] if text else []
    out: list[tuple[str, str]] = []
    seen: set[str] = set()
    for li in box.findall(f"{{{RDF}}}li")[:MAX_KEYWORDS]:
        text = _element_text(li)
        lang = (li.get(XML_LANG) or "x-default").strip() or "x-default"
        if text and lang.casefold() not in seen:
            seen.add(lang.casefold())
            out.append((lang, text))
    out.sort(key=lambda entry: entry[0] != "x-default")
    return out


def _struct(el: ET.Element) -> dict[str, str | ET.Element]:
    """The fields of an RDF structure in any of its forms: attributes of the element, child
    elements (rdf:parseType="Resource"), or those of an rdf:Description inside it."""
    return _named_properties([el, *el.findall(f"{{{RDF}}}Description")])


def _mwg_keywords(value: str | ET.Element | None, *, source: str, problems: list[str]) -> list[str]:
    """The paths of an MWG keyword tree (mwg-kw:Keywords > Hierarchy > [Keyword, Applied,
    Children]): every leaf, and an inner node only when it says Applied="True"."""
    if not isinstance(value, ET.Element):
        return []
    out: list[str] = []
    full: list[bool] = []

    def walk(container: str | ET.Element | None, parents: list[str]) -> None:
        if not isinstance(container, ET.Element):
            return
        box = _container(container)
        for li in (box.findall(f"{{{RDF}}}li") if box is not None else []):
            if len(out) >= MAX_KEYWORDS:
                if not full:
                    full.append(True)
                    problems.append(f"{source}: mwg-kw:Keywords has over {MAX_KEYWORDS:,} entries; the first "
                                    f"{MAX_KEYWORDS:,} were read")
                return
            node = _struct(li)
            word = _text(node.get("mwg-kw:Keyword"))
            if not word or len(word) > MAX_KEYWORD_CHARS:
                continue
            path = [*parents, word.replace("|", "/")]
            children = node.get("mwg-kw:Children")
            applied = (_text(node.get("mwg-kw:Applied")) or "").casefold()
            has_children = isinstance(children, ET.Element) and _container(children) is not None and \
                len(_container(children).findall(f"{{{RDF}}}li")) > 0
            if (not has_children and applied != "false") or applied == "true":
                joined = normalise_keyword("|".join(path))
                if joined and joined not in out:
                    out.append(joined)
            walk(children, path)

    walk(_struct(value).get("mwg-kw:Hierarchy"), [])
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
