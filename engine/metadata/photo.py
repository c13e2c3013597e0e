"""A picture's metadata: which XMP sidecar files belong to it, and how they combine with the
XMP packet embedded in the picture, its IPTC-IIM and its EXIF (engine.metadata.exif_iptc).

Sidecar names (both conventions are found; the scan lists the .xmp files of each folder):

  IMG_0001.CR2.xmp   the picture's whole name + ".xmp": darktable, digiKam (and many tools for JPEGs)
  IMG_0001.xmp       the picture's stem + ".xmp": Lightroom Classic, Camera Raw, Capture One.
                     Several pictures may share a stem (IMG_0001.CR2 beside IMG_0001.JPG). When
                     the sidecar names its file with photoshop:SidecarForExtension (Lightroom
                     writes it), it belongs to the picture with that extension only; without it,
                     to every picture of that stem.

The ".xmp" is matched in any case, and so is the name (IMG_0001.XMP belongs to img_0001.cr2), as
on the case-insensitive disks most photo libraries live on.

A RAW+JPEG pair indexed once (engine.indexing.scanner.split_raw_pairs) is one shot: the picture
indexed also gets the sidecars of the file left out, and a stem sidecar marked for that file
(SidecarForExtension="CR2" on IMG_0001.xmp) belongs to it, since that is where Lightroom keeps the
keywords of the pair while the JPEG is what Longlens indexes by default.

Precedence, group by group (docs/xmp.md "Precedence" has the table and the tools' code it follows):
the sidecar (the whole-name one when there is one, the picture's own first, then the one of the
pair's file left out; else the stem sidecar that belongs to the picture) sets the groups it has;
the packet embedded in the picture, then IPTC-IIM, then EXIF fill the others (the order of
darktable's dt_exif_read and of digiKam's read mappings). Camera and lens come from EXIF first
(digiKam's getPhotographInformation); the EXIF date is the catalog's exif_date, not taken_at.

Why the sidecar first: a whole-name sidecar names exactly one file, so it can never be the other
half of a RAW+JPEG pair's; and the tools that write it (darktable, digiKam) read the stem sidecar
and the embedded packet when they first import a picture, so theirs is the later, fuller view.
When both sidecars exist the stem one is not merged in: a keyword removed in darktable must not
come back from a Lightroom file left beside it. Keywords are one group (flat and hierarchical
together), so the two lists always come from the same source.

darktable's invented date: a sidecar's exif:DateTimeOriginal equal to the picture file's
modification time (local time, to the second) while the picture has no EXIF date is the file time
darktable writes for such a picture, not its date: it is kept as a field with used=False, and the
date group falls through to the sidecar's next date property, the stem sidecar, the embedded
packet, IPTC.

A sidecar that cannot be read (malformed XML, an XML bomb, too large, unreadable) is a problem
naming the file; the next source in the order above is used instead, so nothing else is lost.
Nothing is ever written: sidecars and pictures are only read, through engine.fileutil.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.fileutil import FileTooLargeError, NotARegularFileError, read_user_file
from engine.metadata.embedded import read_embedded_xmp_parts
from engine.metadata.exif_iptc import read_exif_iptc
from engine.metadata.xmp import GROUPS, MAX_XMP_BYTES, XmpError, XmpPacket, parse_xmp
from engine.types import MetadataField, PhotoMetadata

SIDECAR_SUFFIX = ".xmp"
WHOLE_NAME = "whole name"  # IMG_0001.CR2.xmp
STEM = "stem"  # IMG_0001.xmp
# Part of every stored state: a reader that learns new fields bumps it, and the next scan reads
# every picture's metadata again (without re-embedding any picture). 2: EXIF, IPTC-IIM, extended
# XMP and the wider XMP vocabulary (issue 28).
READER_VERSION = 2
EMBEDDED = "embedded"
IPTC = "iptc"
EXIF = "exif"


@dataclass(frozen=True)
class SidecarFile:
    """An .xmp file beside a picture, as the scan saw it."""

    name: str  # file name, in the picture's folder
    path: Path
    size: int
    mtime_ns: int
    kind: str = ""  # WHOLE_NAME or STEM, relative to the picture it was matched to
    followed_link: bool = False  # the name was a symbolic link at scan time
    # Set when the sidecar is another file's of a RAW+JPEG pair indexed once (that file's name)
    pair_of: str = ""


def is_sidecar_name(name: str) -> bool:
    return len(name) > len(SIDECAR_SUFFIX) and name.casefold().endswith(SIDECAR_SUFFIX)


def match_sidecars(image_name: str, sidecars: Mapping[str, Sequence[SidecarFile]]) -> tuple[SidecarFile, ...]:
    """The sidecars named after `image_name` in its folder. `sidecars`: the folder's .xmp files
    by casefolded name. Whole-name sidecars come first; within a kind, an exact-case name first."""
    out: list[SidecarFile] = []
    stem = os.path.splitext(image_name)[0]
    for kind, base in ((WHOLE_NAME, image_name), (STEM, stem)):
        if not base:
            continue
        found = sidecars.get(f"{base}{SIDECAR_SUFFIX}".casefold(), ())
        exact = f"{base}{SIDECAR_SUFFIX}"
        for s in sorted(found, key=lambda s: (s.name != exact, s.name)):
            out.append(dataclasses.replace(s, kind=kind))
    return tuple(out)


def sidecar_state(sidecars: Iterable[SidecarFile], pair_of: Sequence[str] = ()) -> str:
    """What the metadata of a picture was read from, as stored in the catalog: a re-scan that
    finds another state (a sidecar added, edited, removed) reads the metadata again. `pair_of`
    (the files of a RAW+JPEG pair this picture stands for) is part of it: which sidecars belong
    to a picture depends on the pairing (a stem sidecar marked for the RAW belongs to the JPEG only
    while the JPEG stands for the pair), so a change of the pairing setting, or a RAW that starts or
    stops standing in for an unreadable JPEG, reads the metadata again. A picture outside any pair
    keeps the state it always had (no re-read of every picture after an upgrade)."""
    files = sorted([s.name, int(s.size), int(s.mtime_ns)] for s in sidecars)
    state: list[Any] = [READER_VERSION, files]
    if pair_of:
        state.append({"pair_of": sorted(pair_of)})
    return json.dumps(state, separators=(",", ":"))


def read_photo_metadata(image_path: Path, sidecars: Sequence[SidecarFile] = (), *,
                        follow_symlinks: bool = True, pair_of: Sequence[str] = ()) -> PhotoMetadata:
    """The picture's metadata: its sidecars, its embedded XMP packet, its IPTC-IIM and EXIF,
    combined as the module says. `pair_of`: the files of a RAW+JPEG pair this picture stands for
    (indexed once): a stem sidecar marked for one of them belongs to this picture too, and their
    whole-name sidecars come after the picture's own. Never raises for a bad sidecar, packet or
    field: each is a problem in `problems`."""
    image_path = Path(image_path)
    problems: list[str] = []
    extensions = {Path(name).suffix.lstrip(".").casefold() for name in (image_path.name, *pair_of)}
    ordered = sorted(sidecars, key=lambda s: (s.kind != WHOLE_NAME, bool(s.pair_of)))
    chosen: XmpPacket | None = None
    chosen_file: SidecarFile | None = None
    for s in ordered:
        packet = _read_sidecar(s, problems)
        if packet is None or not _belongs(s, packet, extensions):
            continue
        chosen, chosen_file = packet, s
        break
    embedded = _read_embedded(image_path, follow_symlinks, problems)
    exif, iptc, exif_problems = read_exif_iptc(image_path, follow_symlinks=follow_symlinks)
    problems.extend(exif_problems)

    # darktable's invented date: a file time, not the picture's; the date group falls through.
    date_sources: list[XmpPacket | None] = [chosen]
    if chosen is not None and chosen_file is not None and _is_darktable_file_time(chosen, chosen_file, image_path,
                                                                                  exif):
        if chosen_file.kind == WHOLE_NAME:
            date_sources.append(_stem_sidecar(ordered, chosen_file, extensions, problems))
    date_sources += [embedded, iptc]

    xmp_first = [chosen, embedded, iptc, exif]
    order: dict[str, list[XmpPacket | None]] = {g: xmp_first for g in GROUPS}
    if chosen is not None and chosen.by_darktable:
        for group in DARKTABLE_COMPLETE_GROUPS:
            order[group] = [chosen]
    order["taken_at"] = date_sources
    order["camera"] = order["lens"] = [exif, chosen, embedded]
    winner: dict[str, XmpPacket] = {}
    for group, candidates in order.items():
        for packet in candidates:
            if packet is not None and group in packet.values:
                winner[group] = packet
                break
    values = {g: p.values[g] for g, p in winner.items()}

    sources: list[str] = []
    fields: list[MetadataField] = []
    labels = {id(embedded): f"{image_path.name} (embedded XMP)"}
    everyone: list[XmpPacket] = []
    for packet in (chosen, *date_sources, embedded, iptc, exif):
        if packet is not None and not any(packet is p for p in everyone):
            everyone.append(packet)
    for packet in everyone:
        contributed = any(p is packet for p in winner.values())
        if contributed or packet is chosen:
            sources.append(_source_name(packet, chosen, embedded, exif, iptc))
            if packet is not exif and packet is not iptc:  # theirs are already in `problems`
                problems.extend(packet.problems)
        label = labels.get(id(packet), packet.source)
        for f in packet.fields:
            used, note = f.used, f.note
            if f.group is not None and used and winner.get(f.group) is not packet:
                used = False
                other = winner.get(f.group)
                if other is not None:
                    note = f"{labels.get(id(other), other.source)} sets the {_GROUP_NAMES[f.group]}"
                if other is None and not any(packet is p for p in order[f.group]) and chosen is not None:
                    if chosen.by_darktable and f.group in DARKTABLE_COMPLETE_GROUPS:
                        note = (f"{chosen.source} is darktable's sidecar, which holds every "
                                f"{_GROUP_NAMES[f.group]} darktable keeps for the picture (here none)")
                    else:
                        note = f"{chosen.source} is the picture's sidecar (this one is read for the date only)"
            fields.append(MetadataField(f.name, f.value, label, used, note))

    subjects, hierarchy = values.get("keywords", ((), ()))
    lat, lon = values.get("gps", (None, None))
    make, model = values.get("camera", (None, None))
    date_from = winner.get("taken_at")
    return PhotoMetadata(
        title=values.get("title"), description=values.get("description"),
        subjects=_unique(subjects), hierarchy=_unique(hierarchy), rating=values.get("rating"),
        label=values.get("label"), taken_at=values.get("taken_at"), gps_lat=lat, gps_lon=lon,
        camera_make=make, camera_model=model, lens=values.get("lens"), pick=values.get("pick"),
        taken_from=None if date_from is None else ("iptc" if date_from is iptc else "xmp"),
        titles=winner["title"].languages.get("title", ()) if "title" in winner else (),
        descriptions=winner["description"].languages.get("description", ()) if "description" in winner else (),
        fields=tuple(fields), sources=tuple(sources), problems=tuple(problems),
        state=sidecar_state(sidecars, pair_of),
    )


_GROUP_NAMES = {"title": "title", "description": "description", "keywords": "keywords", "rating": "rating",
                "label": "colour label", "pick": "pick label", "taken_at": "date", "gps": "position",
                "camera": "camera", "lens": "lens"}


def _source_name(packet: XmpPacket, chosen: XmpPacket | None, embedded: XmpPacket | None,
                 exif: XmpPacket | None, iptc: XmpPacket | None) -> str:
    if packet is embedded:
        return EMBEDDED
    if packet is exif:
        return EXIF
    if packet is iptc:
        return IPTC
    return packet.source


def _belongs(s: SidecarFile, packet: XmpPacket, extensions: set[str]) -> bool:
    marked = packet.sidecar_for.strip().lstrip(".").casefold() if packet.sidecar_for else None
    # Lightroom's sidecar of another file of that stem (IMG_0001.CR2 beside this JPEG) is not this picture's.
    return not (s.kind == STEM and marked and marked not in extensions)


def _stem_sidecar(ordered: Sequence[SidecarFile], chosen: SidecarFile, extensions: set[str],
                  problems: list[str]) -> XmpPacket | None:
    """The stem sidecar that belongs to the picture, read for its date only (the chosen
    whole-name sidecar's date was darktable's copy of the file time)."""
    for s in ordered:
        if s is chosen or s.kind != STEM:
            continue
        packet = _read_sidecar(s, problems)
        if packet is not None and _belongs(s, packet, extensions):
            return packet
    return None


def _is_darktable_file_time(packet: XmpPacket, sidecar: SidecarFile, image_path: Path,
                            exif: XmpPacket | None) -> bool:
    """Whether the sidecar's date is the one darktable invents for a picture without an EXIF
    date: exif:DateTimeOriginal equal, to the second, to the picture file's modification time in
    local time (darktable's dt_exif_read starts from the file's mtime, src/common/exif.cc, and
    writes it into the sidecar). When it is, the sidecar's date property is marked as a file
    time and left out of `packet.values` (its next date property, if any, takes its place)."""
    if exif is not None and "exif_date" in exif.values:
        return False
    valid = [(name, raw, when) for name, raw, when in packet.dates if when is not None]
    if not valid or valid[0][0] != "exif:DateTimeOriginal" or "T" not in valid[0][2]:
        return False
    name, raw, when = valid[0]
    pictures = {image_path}
    if sidecar.kind == WHOLE_NAME:
        pictures.add(sidecar.path.with_name(sidecar.name[:-len(SIDECAR_SUFFIX)]))
    times = set()
    for picture in pictures:
        try:
            mtime = os.stat(picture).st_mtime
        except (OSError, ValueError):
            continue
        times.add(dt.datetime.fromtimestamp(int(mtime)).strftime("%Y-%m-%dT%H:%M:%S"))
    if when not in times:
        return False
    packet.values.pop("taken_at", None)
    packet.fields[:] = [
        dataclasses.replace(f, used=False, note=FILE_TIME_NOTE) if f.name == "Xmp.exif.DateTimeOriginal" else f
        for f in packet.fields]
    if len(valid) > 1:  # the sidecar's next date property (photoshop:DateCreated, xmp:CreateDate)
        nxt = valid[1]
        packet.values["taken_at"] = nxt[2]
        packet.fields[:] = [
            dataclasses.replace(f, used=True, note="") if f.name == "Xmp." + nxt[0].replace(":", ".") else f
            for f in packet.fields]
        return False
    return True


# darktable copies what it reads of a picture at import (its EXIF, IPTC and embedded XMP: title,
# description, tags, rating, colour labels) into the sidecar it writes, and clears those before it
# reads a sidecar back (src/common/exif.cc, dt_exif_xmp_read; checked with darktable-cli 4.2.1). So
# in its sidecar a group left out means none: a keyword removed in darktable must not come back from
# the picture's own XMP or IPTC.
DARKTABLE_COMPLETE_GROUPS = ("title", "description", "keywords", "rating", "label")


FILE_TIME_NOTE = ("the picture file's modification time, which darktable writes as the date of a picture "
                  "without an EXIF date: a file time, not the picture's date")


def _unique(items: Sequence[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


def _read_sidecar(s: SidecarFile, problems: list[str]) -> XmpPacket | None:
    try:
        data = read_user_file(s.path, max_bytes=MAX_XMP_BYTES, follow_symlinks=s.followed_link)
    except FileTooLargeError as exc:
        problems.append(f"{s.name}: the sidecar is {exc.size:,} bytes (the limit is {exc.limit:,}); not read")
        return None
    except NotARegularFileError as exc:
        problems.append(f"{s.name}: not read, it is {exc.kind}")
        return None
    except OSError as exc:
        problems.append(f"{s.name}: the sidecar cannot be read ({exc.strerror or exc})")
        return None
    try:
        return parse_xmp(data, s.name)
    except XmpError as exc:
        problems.append(str(exc))
        return None


def _read_embedded(image_path: Path, follow_symlinks: bool, problems: list[str]) -> XmpPacket | None:
    source = f"the XMP embedded in {image_path.name}"
    try:
        found = read_embedded_xmp_parts(image_path, follow_symlinks=follow_symlinks)
    except OSError as exc:
        problems.append(f"{source} was not read ({exc.strerror or exc})")
        return None
    if found is None:
        return None
    try:
        packet = parse_xmp(found.packet, source, extended=found.extended)
    except XmpError as exc:
        problems.append(str(exc))
        return None
    packet.problems[:0] = found.problems
    return packet


def display_keywords(meta: PhotoMetadata, separator: str = " › ") -> list[str]:
    """The keywords as a person reads them: each hierarchical path once ("Places › Norway ›
    Oslo"), then the flat keywords that are not already a level of one of those paths."""
    levels = {part.casefold() for path in meta.hierarchy for part in path.split("|")}
    out: dict[str, str] = {}  # casefolded -> as first written: each keyword once
    for path in meta.hierarchy:
        out.setdefault(path.casefold(), separator.join(path.split("|")))
    for s in meta.subjects:
        if s.casefold() not in levels:
            out.setdefault(s.casefold(), s)
    return list(out.values())
