"""A picture's metadata as it is shown: one description for the inspector and `longlens search
--json`, so the app and the command line say the same thing.

Shown: the camera as photo tools name it (engine.catalog.camera), the date as much as it is known
and where it came from (engine.catalog.dates: a partial date stays partial, an IPTC date says so),
keywords once each, the GPS position, the pick label, the lens, every language's title and
description, and every field read with where it came from and whether it is the one in effect
(PhotoMetadata.fields; one not in effect carries its note, e.g. darktable's copy of the file time).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.catalog.camera import camera_display
from engine.catalog.dates import describe_date, picture_date
from engine.types import PhotoMetadata

# digiKam's pick label in words (PickLabel 1, 2, 3; the reader gives the name).
PICK_WORDS = {"rejected": "Rejected (pick label)", "pending": "Pending (pick label)",
              "accepted": "Accepted (pick label)"}


def unique_keywords(meta: PhotoMetadata) -> list[str]:
    """The keywords once each, case ignored, as paths with '|' between levels: a hierarchical
    path that is the start of a longer one is left out (Lightroom and darktable list the parents
    too: "Places|Norway" beside "Places|Norway|Oslo"), and a flat keyword that is a level of a path
    is left out (darktable lists every level in dc:subject as well). First spelling kept."""
    paths: list[str] = []
    seen: set[str] = set()
    for path in meta.hierarchy:
        key = path.casefold()
        if key not in seen:
            seen.add(key)
            paths.append(path)
    keys = [p.casefold() for p in paths]
    leaves = [p for p, k in zip(paths, keys, strict=True) if not any(o.startswith(k + "|") for o in keys)]
    levels = {part.casefold() for path in paths for part in path.split("|")}
    flat: list[str] = []
    for subject in meta.subjects:
        key = subject.casefold()
        if key not in levels:
            levels.add(key)
            flat.append(subject)
    return leaves + flat


def _texts(entries: tuple[tuple[str, str], ...]) -> list[dict[str, str]]:
    return [{"language": lang, "text": text} for lang, text in entries]


def metadata_view(meta: PhotoMetadata | None, *, exif_date: str | None = None, mtime_ns: int | None = None,
                  image_camera: tuple[str | None, str | None] = (None, None)) -> dict[str, Any]:
    """What to show of one picture's metadata, JSON-ready. `exif_date`, `mtime_ns` and
    `image_camera` are the catalog row's (what decoding read): the date and the camera shown are
    those every other display shows (the EXIF date first, the decoder's camera first)."""
    m = meta or PhotoMetadata()
    camera = camera_display(*image_camera) if any(image_camera) else None
    camera = camera or camera_display(m.camera_make, m.camera_model)
    date: dict[str, Any] | None = None
    if exif_date or m.taken_at or mtime_ns is not None:
        when = picture_date(exif_date, mtime_ns or 0, m.taken_at, m.taken_from)
        date = {"shown": when.shown, "source": when.source, "start": when.date,
                "text": describe_date(when.shown, when.source)}
    return {
        "title": m.title,
        "description": m.description,
        "titles": _texts(m.titles),
        "descriptions": _texts(m.descriptions),
        "keywords": unique_keywords(m),
        "rating": m.rating,
        "label": m.label,
        "pick": m.pick,
        "pick_text": PICK_WORDS.get(m.pick, m.pick) if m.pick else None,
        "camera": camera,
        "lens": m.lens,
        "date": date,
        # The metadata's own date as written (possibly partial) and its kind of source (xmp | iptc).
        "taken_at": m.taken_at,
        "taken_from": m.taken_from,
        "gps": {"lat": m.gps_lat, "lon": m.gps_lon} if m.gps_lat is not None and m.gps_lon is not None else None,
        "sources": list(m.sources),
        "problems": list(m.problems),
        "fields": [{"name": f.name, "value": f.value, "source": f.source, "used": f.used, "note": f.note}
                   for f in m.fields],
    }


def field_lines(view: dict[str, Any]) -> list[str]:
    """Every field read, one line each, as the inspector and `longlens show` list them:
    'Xmp.dc.subject = Oslo, ferry — IMG_1.jpg.xmp', and a field not in effect marked so, with
    its note: '… (not used: darktable's copy of the file time)'."""
    lines = []
    for f in view.get("fields") or ():
        line = f"{f['name']} = {f['value']} — {f['source']}"
        if not f.get("used", True):
            line += f" (not used{': ' + f['note'] if f.get('note') else ''})"
        lines.append(line)
    return lines


def gps_text(view: dict[str, Any]) -> str | None:
    """The position as a person reads it: '59.913900, 10.752200' (north and east positive)."""
    gps = view.get("gps")
    return f"{gps['lat']:.6f}, {gps['lon']:.6f}" if gps else None


def picture_view(catalog: Any, *, path: str | None = None, image_id: int | None = None) -> dict[str, Any] | None:
    """What the catalog knows about one picture (by id, else by its path), as metadata_view shows
    it, with `path`, `image_id` and `metadata_read` (False: indexed, but its metadata not read yet:
    only the decoder's date and camera are known); None when it is not an indexed picture.
    The inspector (desktop_app.facade) and `longlens show` both use it."""
    rec = catalog.images_by_id([image_id]).get(image_id) if image_id is not None else catalog.image_at(path)
    if rec is None:
        return None
    meta = catalog.photo_metadata([rec.id]).get(rec.id)
    view = metadata_view(meta, exif_date=rec.exif_date, mtime_ns=rec.mtime_ns,
                         image_camera=(rec.camera_make, rec.camera_model))
    root = next((lib.root for lib in catalog.libraries() if lib.id == rec.library_id), "")
    view.update(path=str(Path(root) / rec.rel_path), image_id=rec.id, metadata_read=meta is not None)
    return view


def _stars(rating: int) -> str:
    return "rejected" if rating < 0 else ("unrated" if rating == 0 else "★" * rating + "☆" * (5 - rating))


def view_lines(view: dict[str, Any]) -> list[str]:
    """The view as `longlens show` prints it: one line per thing known, then every field read."""
    lines = [f"date         {view['date']['text']}" if view.get("date") else "date         none"]
    gear = [x for x in (view.get("camera"), f"lens {view['lens']}" if view.get("lens") else None) if x]
    if gear:
        lines.append(f"camera       {' · '.join(gear)}")
    if view.get("gps"):
        lines.append(f"GPS          {gps_text(view)}")
    if not view.get("metadata_read", True):
        return [*lines, "metadata     not read yet (`longlens index` reads it; nothing is embedded again)"]
    for key, word in (("titles", "title"), ("descriptions", "description")):
        entries = view.get(key) or []
        if not entries and view.get(word):
            entries = [{"language": "x-default", "text": view[word]}]
        for e in entries:
            lang = "" if e["language"] == "x-default" else f" ({e['language']})"
            lines.append(f"{(word + lang):12} {e['text']}")
    if view.get("keywords"):
        lines.append("keywords     " + ", ".join(" › ".join(k.split("|")) for k in view["keywords"]))
    marks = [_stars(view["rating"]) if view.get("rating") is not None else None,
             f"{view['label']} label" if view.get("label") else None, view.get("pick_text")]
    if any(marks):
        lines.append("marks        " + " · ".join(m for m in marks if m))
    lines.append("sources      " + (", ".join(view.get("sources") or []) or "none"))
    lines += [f"problem      {p}" for p in view.get("problems") or []]
    fields = field_lines(view)
    if fields:
        lines.append("fields read (name = value — where):")
        lines += [f"  {line}" for line in fields]
    return lines
