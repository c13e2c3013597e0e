"""A picture's XMP metadata: which sidecar files belong to it, and how they combine with the
packet embedded in the picture.

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

Precedence, field group by field group (title, description, keywords, rating, label, date, GPS):

1. the whole-name sidecar (IMG_0001.CR2.xmp) when there is one (the picture's own first, then the
   one of the pair's file left out);
2. else the stem sidecar (IMG_0001.xmp) that belongs to the picture;
3. the packet embedded in the picture fills the groups the sidecar does not set.

Why: a whole-name sidecar names exactly one file, so it can never be the other half of a
RAW+JPEG pair's; and the tools that write it (darktable, digiKam) read the stem sidecar and the
embedded packet when they first import a picture, so theirs is the later, fuller view. When both
sidecars exist the stem one is not merged in: a keyword removed in darktable must not come back
from a Lightroom file left beside it. A sidecar is what the user's editor keeps; the embedded
packet is what the camera or an earlier tool wrote into the file, so the sidecar wins where both
set a group, and nothing the file says is lost where the sidecar is silent. Keywords are one
group (flat and hierarchical together), so the two lists always come from the same source.

A sidecar that cannot be read (malformed XML, an XML bomb, too large, unreadable) is a problem
naming the file; the next source in the order above is used instead, so nothing else is lost.
Nothing is ever written: sidecars and pictures are only read, through engine.fileutil.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.fileutil import FileTooLargeError, NotARegularFileError, read_user_file
from engine.metadata.embedded import read_embedded_xmp
from engine.metadata.xmp import GROUPS, MAX_XMP_BYTES, XmpError, XmpPacket, parse_xmp
from engine.types import PhotoMetadata

SIDECAR_SUFFIX = ".xmp"
WHOLE_NAME = "whole name"  # IMG_0001.CR2.xmp
STEM = "stem"  # IMG_0001.xmp
# Part of every stored state: a reader that learns new fields bumps it, and the next scan reads
# every picture's XMP again (without re-embedding any picture).
READER_VERSION = 1
EMBEDDED = "embedded"


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
    """The picture's XMP: its sidecars and its embedded packet, combined as the module says.
    `pair_of`: the files of a RAW+JPEG pair this picture stands for (indexed once): a stem sidecar
    marked for one of them belongs to this picture too, and their whole-name sidecars come after
    the picture's own. Never raises for a bad sidecar or packet: each is a problem in `problems`."""
    image_path = Path(image_path)
    problems: list[str] = []
    sources: list[str] = []
    extensions = {Path(name).suffix.lstrip(".").casefold() for name in (image_path.name, *pair_of)}
    chosen: XmpPacket | None = None
    for s in sorted(sidecars, key=lambda s: (s.kind != WHOLE_NAME, bool(s.pair_of))):
        packet = _read_sidecar(s, problems)
        if packet is None:
            continue
        marked = packet.sidecar_for.strip().lstrip(".").casefold() if packet.sidecar_for else None
        if s.kind == STEM and marked and marked not in extensions:
            continue  # Lightroom's sidecar of another file of that stem (IMG_0001.CR2 beside this JPEG)
        chosen = packet
        break
    embedded = _read_embedded(image_path, follow_symlinks, problems)

    values: dict[str, Any] = {}
    for packet in (chosen, embedded):
        if packet is None:
            continue
        taken = [g for g in GROUPS if g in packet.values and g not in values]
        for g in taken:
            values[g] = packet.values[g]
        if taken or packet is chosen:
            sources.append(EMBEDDED if packet is embedded else packet.source)
            problems.extend(packet.problems)
    subjects, hierarchy = values.get("keywords", ((), ()))
    lat, lon = values.get("gps", (None, None))
    return PhotoMetadata(
        title=values.get("title"), description=values.get("description"),
        subjects=tuple(subjects), hierarchy=tuple(hierarchy), rating=values.get("rating"),
        label=values.get("label"), taken_at=values.get("taken_at"), gps_lat=lat, gps_lon=lon,
        sources=tuple(sources), problems=tuple(problems), state=sidecar_state(sidecars, pair_of),
    )


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
        raw = read_embedded_xmp(image_path, follow_symlinks=follow_symlinks)
    except OSError as exc:
        problems.append(f"{source} was not read ({exc.strerror or exc})")
        return None
    if raw is None:
        return None
    try:
        return parse_xmp(raw, source)
    except XmpError as exc:
        problems.append(str(exc))
        return None


def display_keywords(meta: PhotoMetadata, separator: str = " › ") -> list[str]:
    """The keywords as a person reads them: each hierarchical path once ("Places › Norway ›
    Oslo"), then the flat keywords that are not already a level of one of those paths."""
    levels = {part.casefold() for path in meta.hierarchy for part in path.split("|")}
    out = [separator.join(path.split("|")) for path in meta.hierarchy]
    out += [s for s in meta.subjects if s.casefold() not in levels]
    return out
