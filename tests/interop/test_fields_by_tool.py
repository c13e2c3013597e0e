"""Issue 28, point 4 (read side): every field the issue lists, written by every real tool that
writes it (exiftool, Debian's exiv2 CLI, darktable-cli, pidng; Photoshop CS5's own XMP in a real
file), then read by Longlens: engine.metadata.read_photo_metadata on the files, and the same
pictures through a real `longlens index` (the catalog's stored metadata and record, and what
`longlens search --json` shows). Each case is one proof of a cell of the fields x tools table that
this run writes into docs/xmp.md (tests/interop/interop_table.py); a failing case marks its cell
wrong there, and fails here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.interop import realfiles as rf
from tests.interop.interop_table import FIELDS

pytestmark = pytest.mark.interop

OSLO = (59.9139, 10.7522)
TREE = "Places|Norway|Oslo"


@dataclass
class View:
    """What Longlens makes of one picture: `meta` read from the files now, `stored` and `record`
    from the catalog after `longlens index`, `hit` as `longlens search --json` lists it."""

    picture: Path
    meta: object  # engine.types.PhotoMetadata
    stored: object  # engine.types.PhotoMetadata, or None when the catalog has none
    record: object  # engine.types.ImageRecord
    hit: dict


@dataclass(frozen=True)
class Case:
    id: str
    row: str
    column: str
    build: Callable[[Path, Path, str], Path]  # (its own folder, a work folder, its name) -> the picture
    check: Callable[[View], None]


CASES: list[Case] = []


def case(row: str, column: str, id: str):
    def register(fn):
        build, check = fn()
        CASES.append(Case(id, row, column, build, check))
        FIELDS.declare(id, row, column)
        return fn
    return register


# --- building blocks ---------------------------------------------------------------------------

def jpeg(photo: str = "astronaut.png"):
    return lambda folder, name: rf.write_jpeg(folder / f"{name}.jpg", photo)


def tiff(photo: str = "coffee.png"):
    return lambda folder, name: rf.write_tiff(folder / f"{name}.tif", photo)


def dng(photo: str = "chelsea.png", **kw):
    return lambda folder, name: rf.write_dng(folder / f"{name}.dng", photo, **kw)


def whole(picture: Path) -> Path:
    return picture.with_name(picture.name + ".xmp")


def stem(picture: Path) -> Path:
    return picture.with_suffix(".xmp")


def exiftool_into_picture(make, *tags):
    def build(folder, work, name):
        p = make(folder, name)
        rf.exiftool(p, *tags)
        return p
    return build


def exiftool_sidecar(make, *tags, where=whole):
    def build(folder, work, name):
        p = make(folder, name)
        rf.exiftool(where(p), *tags)
        return p
    return build


def exiv2_into_picture(make, *commands):
    def build(folder, work, name):
        p = make(folder, name)
        rf.exiv2(p, *commands)
        return p
    return build


def exiv2_sidecar(make, *commands, where=whole):
    def build(folder, work, name):
        p = make(folder, name)
        rf.exiv2(rf.new_sidecar(where(p)), *commands)
        return p
    return build


def darktable_over_exiftool_sidecar(make, *tags):
    """exiftool writes the picture's sidecar, then darktable-cli imports the picture (reading that
    sidecar) and writes it again in its own serialisation."""
    def build(folder, work, name):
        p = make(folder, name)
        sidecar = rf.exiftool(whole(p), *tags)
        before = sidecar.read_bytes()
        rf.darktable(p, work / "darktable" / name)
        assert sidecar.read_bytes() != before and b"darktable:history" in sidecar.read_bytes()
        return p
    return build


def fields(meta, key: str) -> list[str]:
    return [f.value for f in meta.fields if f.name == key]


def both(check_meta):
    """The same check on what read_photo_metadata reads now and on what the catalog stored."""
    def check(v: View):
        check_meta(v.meta)
        assert v.stored is not None, "the catalog has no metadata for the picture"
        check_meta(v.stored)
    return check


# --- dates -------------------------------------------------------------------------------------

R = "EXIF date (`DateTimeOriginal` with `SubSecTimeOriginal` and `OffsetTimeOriginal`)"
EXIF_DATE = ("-DateTimeOriginal=2021:07:14 18:03:52", "-SubSecTimeOriginal=25", "-OffsetTimeOriginal=+02:00")


def check_exif_date(v: View):
    # The local time as the camera wrote it: neither the offset nor the sub-seconds move it.
    assert v.hit["date"].startswith("2021-07-14T18:03:52"), v.hit
    assert v.hit["date_source"] == "exif", v.hit
    assert v.record.exif_date.startswith("2021-07-14T18:03:52"), v.record
    assert any(x.startswith(("2021:07:14 18:03:52", "2021-07-14T18:03:52"))
               for x in fields(v.meta, "Exif.Photo.DateTimeOriginal")), v.meta.fields


for _id, _make in (("exiftool-exif-date-jpeg", jpeg()), ("exiftool-exif-date-tiff", tiff()),
                   ("exiftool-exif-date-dng", dng())):
    case(R, "exiftool", _id)(lambda m=_make: (exiftool_into_picture(m, *EXIF_DATE), check_exif_date))
case(R, "exiv2", "exiv2-exif-date-jpeg")(lambda: (exiv2_into_picture(
    jpeg("rocket.jpg"), "set Exif.Photo.DateTimeOriginal Ascii 2021:07:14 18:03:52",
    "set Exif.Photo.SubSecTimeOriginal Ascii 25", "set Exif.Photo.OffsetTimeOriginal Ascii +02:00"),
    check_exif_date))

R = "XMP date (`xmp:CreateDate`, `photoshop:DateCreated`)"


def check_xmp_date(prefix: str):
    def check(v: View):
        assert v.meta.taken_at and v.meta.taken_at.startswith(prefix), v.meta
        assert v.meta.taken_from == "xmp", v.meta
        assert v.hit["date"].startswith(prefix) and v.hit["date_source"] == "xmp", v.hit
    return check


case(R, "exiftool", "exiftool-xmp-createdate-sidecar")(lambda: (
    exiftool_sidecar(jpeg("coffee.png"), "-XMP-xmp:CreateDate=2019:05:04 10:11:12"),
    check_xmp_date("2019-05-04T10:11:12")))
case(R, "exiv2", "exiv2-photoshop-datecreated-sidecar")(lambda: (
    exiv2_sidecar(jpeg("coffee.png"), "set Xmp.photoshop.DateCreated 2019-05-04T10:11:12"),
    check_xmp_date("2019-05-04T10:11:12")))
case(R, "Photoshop CS5", "photoshop-cs5-hubble-createdate")(lambda: (
    lambda folder, work, name: rf.copy_original(folder / f"{name}.jpg", "hubble_deep_field.jpg"),
    check_xmp_date("2012-06-29T09:29")))

R = "Partial XMP date (`photoshop:DateCreated` = `2023-06`)"


def check_partial(v: View):
    assert v.meta.taken_at == "2023-06", v.meta
    assert v.stored is not None and v.stored.taken_at == "2023-06", v.stored
    assert v.hit["date"] == "2023-06", v.hit  # shown as partial, not as midnight on the 1st
    assert v.hit["date_source"] == "xmp", v.hit


case(R, "exiftool", "exiftool-partial-date-sidecar")(lambda: (
    exiftool_sidecar(jpeg("chelsea.png"), "-XMP-photoshop:DateCreated=2023:06"), check_partial))
case(R, "exiv2", "exiv2-partial-date-sidecar")(lambda: (
    exiv2_sidecar(jpeg("chelsea.png"), "set Xmp.photoshop.DateCreated 2023-06"), check_partial))

R = "IPTC-IIM date (`DateCreated` + `TimeCreated`)"


def check_iptc_date(v: View):
    assert v.meta.taken_at and v.meta.taken_at.startswith("2019-05-04T10:11:12"), v.meta
    assert v.meta.taken_from == "iptc", v.meta
    assert v.hit["date"].startswith("2019-05-04T10:11:12"), v.hit


case(R, "exiftool", "exiftool-iptc-date")(lambda: (exiftool_into_picture(
    jpeg("retina.jpg"), "-IPTC:DateCreated=2019:05:04", "-IPTC:TimeCreated=10:11:12+02:00"), check_iptc_date))
case(R, "exiv2", "exiv2-iptc-date")(lambda: (exiv2_into_picture(
    jpeg("retina.jpg"), "set Iptc.Application2.DateCreated 2019-05-04",
    "set Iptc.Application2.TimeCreated 10:11:12+02:00"), check_iptc_date))

R = "darktable's invented `exif:DateTimeOriginal` (the file's time) recognised"
FILE_TIME = "2026-01-10 08:00:00"


def darktable_invents_a_date(make, *, lightroom_date: str | None = None, embedded_date: str | None = None):
    """A picture without an EXIF date (its file time FILE_TIME) through darktable-cli, which writes
    that time into its sidecar as exif:DateTimeOriginal; with a real date elsewhere: a Lightroom
    stem sidecar (photoshop:DateCreated) or the picture's embedded xmp:CreateDate, by exiftool."""
    def build(folder, work, name):
        p = make(folder, name)
        if embedded_date:
            rf.exiftool(p, f"-XMP-xmp:CreateDate={embedded_date}")
        if lightroom_date:
            rf.exiftool(stem(p), f"-XMP-photoshop:DateCreated={lightroom_date}",
                        f"-XMP-photoshop:SidecarForExtension={p.suffix.lstrip('.').upper()}")
        rf.set_mtime(p, FILE_TIME)
        sidecar = rf.darktable(p, work / "darktable" / name)
        text = sidecar.read_text(encoding="utf-8")
        assert 'exif:DateTimeOriginal="2026:01:10 08:00:00' in text, text[:800]  # what darktable does
        return p
    return build


def check_file_time(v: View):
    assert v.meta.taken_at is None, v.meta  # not a capture date
    assert v.hit["date_source"] == "file time", v.hit
    assert any(not f.used and f.note for f in v.meta.fields if f.name == "Xmp.exif.DateTimeOriginal"), v.meta.fields


def check_real_date_wins(v: View):
    assert v.meta.taken_at and v.meta.taken_at.startswith("2019-05-04"), v.meta
    assert v.hit["date"].startswith("2019-05-04") and v.hit["date_source"] == "xmp", v.hit


case(R, "darktable-cli", "darktable-file-time-alone")(lambda: (
    darktable_invents_a_date(jpeg("rocket.jpg")), check_file_time))
case(R, "darktable-cli", "darktable-file-time-vs-embedded-createdate")(lambda: (
    darktable_invents_a_date(jpeg("rocket.jpg"), embedded_date="2019:05:04 10:11:12"), check_real_date_wins))
case(R, "darktable-cli", "darktable-file-time-vs-lightroom-sidecar")(lambda: (
    darktable_invents_a_date(jpeg("rocket.jpg"), lightroom_date="2019:05:04 10:11:12"), check_real_date_wins))

# --- camera, lens, GPS, orientation ------------------------------------------------------------

R = "Camera, EXIF `Make` / `Model`"


def check_camera(make: str, model: str, shown: str):
    def check(v: View):
        for m in (v.meta, v.stored):
            assert m is not None and (m.camera_make, m.camera_model) == (make, model), m
        # As the tools show it: a model that already names the make is shown alone.
        assert v.hit["camera"] == shown, v.hit
    return check


case(R, "exiftool", "exiftool-camera-nikon-jpeg")(lambda: (exiftool_into_picture(
    jpeg(), f"-Make={rf.NIKON_MAKE}", f"-Model={rf.NIKON_MODEL}"),
    check_camera(rf.NIKON_MAKE, rf.NIKON_MODEL, "NIKON D750")))
case(R, "exiftool", "exiftool-camera-canon-tiff")(lambda: (exiftool_into_picture(
    tiff(), "-Make=Canon", "-Model=Canon EOS 5D Mark IV"),
    check_camera("Canon", "Canon EOS 5D Mark IV", "Canon EOS 5D Mark IV")))
case(R, "exiftool", "exiftool-camera-fujifilm-jpeg")(lambda: (exiftool_into_picture(
    jpeg("coffee.png"), "-Make=FUJIFILM", "-Model=X-T3"), check_camera("FUJIFILM", "X-T3", "FUJIFILM X-T3")))
case(R, "exiv2", "exiv2-camera-nikon-jpeg")(lambda: (exiv2_into_picture(
    jpeg(), f"set Exif.Image.Make Ascii {rf.NIKON_MAKE}", f"set Exif.Image.Model Ascii {rf.NIKON_MODEL}"),
    check_camera(rf.NIKON_MAKE, rf.NIKON_MODEL, "NIKON D750")))
case(R, "pidng", "pidng-camera-nikon-dng")(lambda: (
    lambda folder, work, name: dng()(folder, name), check_camera(rf.NIKON_MAKE, rf.NIKON_MODEL, "NIKON D750")))

R = "Camera only in XMP (`tiff:Make` / `tiff:Model` in a RAW's sidecar)"
TIFF_CAMERA = (f"-XMP-tiff:Make={rf.NIKON_MAKE}", f"-XMP-tiff:Model={rf.NIKON_MODEL}")


def check_xmp_camera(v: View):
    assert (v.meta.camera_make, v.meta.camera_model) == (rf.NIKON_MAKE, rf.NIKON_MODEL), v.meta
    assert v.hit["camera"] == "NIKON D750", v.hit


case(R, "exiftool", "exiftool-tiff-make-lightroom-sidecar")(lambda: (exiftool_sidecar(
    dng(make=None, model=None), *TIFF_CAMERA, "-XMP-photoshop:SidecarForExtension=DNG", where=stem),
    check_xmp_camera))
case(R, "exiv2", "exiv2-tiff-make-sidecar")(lambda: (exiv2_sidecar(
    dng(make=None, model=None), f"set Xmp.tiff.Make {rf.NIKON_MAKE}", f"set Xmp.tiff.Model {rf.NIKON_MODEL}"),
    check_xmp_camera))

R = "Lens (EXIF `LensModel`)"
LENS = "AF-S NIKKOR 24-120mm f/4G ED VR"
case(R, "exiftool", "exiftool-lens")(lambda: (exiftool_into_picture(jpeg(), f"-LensModel={LENS}"),
                                              both(lambda m: _eq(m.lens, LENS))))
case(R, "exiv2", "exiv2-lens")(lambda: (exiv2_into_picture(jpeg(), f"set Exif.Photo.LensModel Ascii {LENS}"),
                                        both(lambda m: _eq(m.lens, LENS))))


def _eq(got, want):
    assert got == want, (got, want)


R = "GPS, EXIF (`GPSLatitude` / `GPSLongitude` with their refs)"
EXIF_GPS = ("-GPSLatitude=59.9139", "-GPSLatitudeRef=N", "-GPSLongitude=10.7522", "-GPSLongitudeRef=E")


def near_oslo(m):
    assert m is not None and m.gps_lat is not None and m.gps_lon is not None, m
    assert abs(m.gps_lat - OSLO[0]) < 1e-4 and abs(m.gps_lon - OSLO[1]) < 1e-4, (m.gps_lat, m.gps_lon)


case(R, "exiftool", "exiftool-exif-gps-jpeg")(lambda: (exiftool_into_picture(jpeg(), *EXIF_GPS), both(near_oslo)))
case(R, "exiftool", "exiftool-exif-gps-dng")(lambda: (exiftool_into_picture(dng(), *EXIF_GPS), both(near_oslo)))
case(R, "exiv2", "exiv2-exif-gps-jpeg")(lambda: (exiv2_into_picture(
    jpeg(), "set Exif.GPSInfo.GPSLatitudeRef Ascii N", "set Exif.GPSInfo.GPSLatitude Rational 59/1 54/1 5004/100",
    "set Exif.GPSInfo.GPSLongitudeRef Ascii E", "set Exif.GPSInfo.GPSLongitude Rational 10/1 45/1 795/100"),
    both(near_oslo)))

R = "GPS, XMP (`exif:GPSLatitude` / `exif:GPSLongitude`)"


def darktable_copies_gps(make):
    """darktable-cli copies the picture's EXIF GPS into its sidecar; the EXIF GPS is then removed
    from the picture (exiftool), so only darktable's serialisation is left to read."""
    def build(folder, work, name):
        p = make(folder, name)
        rf.exiftool(p, *EXIF_GPS)
        sidecar = rf.darktable(p, work / "darktable" / name)
        assert "exif:GPSLatitude=" in sidecar.read_text(encoding="utf-8")
        rf.exiftool(p, "-GPS:all=")
        return p
    return build


case(R, "exiftool", "exiftool-xmp-gps-sidecar")(lambda: (exiftool_sidecar(
    jpeg(), "-XMP-exif:GPSLatitude=59.9139", "-XMP-exif:GPSLongitude=10.7522"), both(near_oslo)))
case(R, "exiv2", "exiv2-xmp-gps-sidecar")(lambda: (exiv2_sidecar(
    jpeg(), "set Xmp.exif.GPSLatitude 59,54.834N", "set Xmp.exif.GPSLongitude 10,45.132E"), both(near_oslo)))
case(R, "darktable-cli", "darktable-xmp-gps-sidecar")(lambda: (darktable_copies_gps(jpeg()), both(near_oslo)))

R = "Orientation (EXIF `Orientation`)"


def check_orientation(v: View):
    assert v.record.orientation == 6, v.record


case(R, "exiftool", "exiftool-orientation")(lambda: (exiftool_into_picture(jpeg(), "-Orientation#=6"),
                                                     check_orientation))
case(R, "exiv2", "exiv2-orientation")(lambda: (exiv2_into_picture(jpeg(), "set Exif.Image.Orientation Short 6"),
                                               check_orientation))
case(R, "pidng", "pidng-orientation")(lambda: (lambda folder, work, name: dng(orientation=6)(folder, name),
                                               check_orientation))

# --- ratings -----------------------------------------------------------------------------------


def rated(n: int):
    def check(v: View):
        for m in (v.meta, v.stored):
            assert m is not None and m.rating == n, m
        assert v.hit["rating"] == n, v.hit
    return check


R = "Rating `xmp:Rating`"
case(R, "exiftool", "exiftool-xmp-rating-sidecar")(lambda: (exiftool_sidecar(jpeg(), "-XMP-xmp:Rating=3"), rated(3)))
case(R, "exiftool", "exiftool-xmp-rating-rejected")(lambda: (exiftool_sidecar(jpeg(), "-XMP-xmp:Rating=-1"),
                                                             rated(-1)))
case(R, "exiv2", "exiv2-xmp-rating-sidecar")(lambda: (exiv2_sidecar(jpeg(), "set Xmp.xmp.Rating 2"), rated(2)))
case(R, "darktable-cli", "darktable-rating-reserialised")(lambda: (
    darktable_over_exiftool_sidecar(jpeg(), "-XMP-xmp:Rating=4"), rated(4)))

R = "Rating, EXIF `Rating` / `RatingPercent` (Windows)"
case(R, "exiftool", "exiftool-exif-rating")(lambda: (exiftool_into_picture(
    jpeg(), "-EXIF:Rating=4", "-EXIF:RatingPercent=75"), rated(4)))
case(R, "exiv2", "exiv2-exif-rating")(lambda: (exiv2_into_picture(
    jpeg(), "set Exif.Image.Rating Short 4", "set Exif.Image.RatingPercent Short 75"), rated(4)))

R = "Rating `MicrosoftPhoto:Rating` (percent, Windows)"
case(R, "exiftool", "exiftool-microsoft-rating")(lambda: (exiftool_into_picture(
    jpeg(), "-XMP-microsoft:RatingPercent=75"), rated(4)))
case(R, "exiv2", "exiv2-microsoft-rating")(lambda: (exiv2_into_picture(
    jpeg(), "set Xmp.MicrosoftPhoto.Rating 99"), rated(5)))

# --- IPTC-IIM ----------------------------------------------------------------------------------


def has_keywords(*words: str):
    def check(v: View):
        for m in (v.meta, v.stored):
            assert m is not None and set(words) <= set(m.subjects) | set(m.hierarchy), m
        assert set(words) <= set(v.hit["keywords"]), v.hit
    return check


R = "IPTC-IIM `Keywords`"
case(R, "exiftool", "exiftool-iptc-keywords-jpeg")(lambda: (exiftool_into_picture(
    jpeg(), "-IPTC:Keywords=Oslo", "-IPTC:Keywords=Fjord"), has_keywords("Oslo", "Fjord")))
case(R, "exiftool", "exiftool-iptc-keywords-utf8")(lambda: (exiftool_into_picture(
    jpeg(), "-charset", "iptc=UTF8", "-IPTC:CodedCharacterSet=UTF8", "-IPTC:Keywords=Flåm"), has_keywords("Flåm")))
case(R, "exiftool", "exiftool-iptc-keywords-latin1")(lambda: (exiftool_into_picture(
    jpeg(), "-charset", "iptc=Latin", "-IPTC:Keywords=Flåm"), has_keywords("Flåm")))
case(R, "exiftool", "exiftool-iptc-keywords-tiff")(lambda: (exiftool_into_picture(
    tiff(), "-IPTC:Keywords=Oslo"), has_keywords("Oslo")))
case(R, "exiv2", "exiv2-iptc-keywords")(lambda: (exiv2_into_picture(
    jpeg(), "add Iptc.Application2.Keywords String Oslo", "add Iptc.Application2.Keywords String Fjord"),
    has_keywords("Oslo", "Fjord")))

R = "IPTC-IIM `Caption-Abstract`"
CAPTION = "A white ferry crosses the fjord."
case(R, "exiftool", "exiftool-iptc-caption")(lambda: (exiftool_into_picture(
    jpeg(), f"-IPTC:Caption-Abstract={CAPTION}"), both(lambda m: _eq(m.description, CAPTION))))
case(R, "exiv2", "exiv2-iptc-caption")(lambda: (exiv2_into_picture(
    jpeg(), f"set Iptc.Application2.Caption String {CAPTION}"), both(lambda m: _eq(m.description, CAPTION))))


def has_field(key: str, value: str):
    def check(v: View):
        assert value in fields(v.meta, key), v.meta.fields
    return check


for _tag, _key, _value in (("Headline", "Iptc.Application2.Headline", "Ferry day"),
                           ("By-line", "Iptc.Application2.Byline", "Kari Nordmann"),
                           ("City", "Iptc.Application2.City", "Oslo"),
                           ("Country-PrimaryLocationName", "Iptc.Application2.CountryName", "Norway")):
    R = {"Headline": "IPTC-IIM `Headline`", "By-line": "IPTC-IIM `By-line`"}.get(
        _tag, "IPTC-IIM `City` / `Country-PrimaryLocationName`")
    case(R, "exiftool", f"exiftool-iptc-{_tag.lower()}")(lambda t=_tag, k=_key, v=_value: (
        exiftool_into_picture(jpeg(), f"-IPTC:{t}={v}"), has_field(k, v)))
    case(R, "exiv2", f"exiv2-iptc-{_tag.lower()}")(lambda k=_key, v=_value: (
        exiv2_into_picture(jpeg(), f"set {k} String {v}"), has_field(k, v)))

# --- XMP keywords ------------------------------------------------------------------------------


def has_tree(path: str):
    def check(v: View):
        for m in (v.meta, v.stored):
            assert m is not None and path in m.hierarchy, m
        assert path in v.hit["keywords"], v.hit
    return check


R = "Keywords `dc:subject`"
case(R, "exiftool", "exiftool-dc-subject-sidecar")(lambda: (exiftool_sidecar(
    jpeg(), "-XMP-dc:Subject=Oslo", "-XMP-dc:Subject=Fjord"), has_keywords("Oslo", "Fjord")))
case(R, "exiftool", "exiftool-dc-subject-embedded-jpeg")(lambda: (exiftool_into_picture(
    jpeg(), "-XMP-dc:Subject=Oslo"), has_keywords("Oslo")))
case(R, "exiftool", "exiftool-dc-subject-embedded-tiff")(lambda: (exiftool_into_picture(
    tiff(), "-XMP-dc:Subject=Oslo"), has_keywords("Oslo")))
case(R, "exiftool", "exiftool-dc-subject-embedded-dng")(lambda: (exiftool_into_picture(
    dng(), "-XMP-dc:Subject=Oslo"), has_keywords("Oslo")))
case(R, "exiv2", "exiv2-dc-subject-sidecar")(lambda: (exiv2_sidecar(
    jpeg(), "set Xmp.dc.subject XmpBag Oslo", "set Xmp.dc.subject XmpBag Fjord"), has_keywords("Oslo", "Fjord")))
case(R, "exiv2", "exiv2-dc-subject-embedded")(lambda: (exiv2_into_picture(
    jpeg(), "set Xmp.dc.subject XmpBag Oslo"), has_keywords("Oslo")))
case(R, "darktable-cli", "darktable-dc-subject-reserialised")(lambda: (darktable_over_exiftool_sidecar(
    jpeg(), "-XMP-dc:Subject=Oslo"), has_keywords("Oslo")))

R = "Keyword tree `lr:hierarchicalSubject`"
case(R, "exiftool", "exiftool-lr-hierarchy")(lambda: (exiftool_sidecar(
    jpeg(), f"-XMP-lr:HierarchicalSubject={TREE}"), has_tree(TREE)))
case(R, "exiv2", "exiv2-lr-hierarchy")(lambda: (exiv2_sidecar(
    jpeg(), f"set Xmp.lr.hierarchicalSubject XmpBag {TREE}"), has_tree(TREE)))
case(R, "darktable-cli", "darktable-lr-hierarchy-reserialised")(lambda: (darktable_over_exiftool_sidecar(
    jpeg(), f"-XMP-lr:HierarchicalSubject={TREE}"), has_tree(TREE)))

R = "Keyword tree `digiKam:TagsList`"
case(R, "exiftool", "exiftool-digikam-tagslist")(lambda: (exiftool_sidecar(
    jpeg(), "-XMP-digiKam:TagsList=Places/Norway/Oslo"), has_tree(TREE)))
case(R, "exiv2", "exiv2-digikam-tagslist")(lambda: (exiv2_sidecar(
    jpeg(), "set Xmp.digiKam.TagsList XmpSeq Places/Norway/Oslo"), has_tree(TREE)))

R = "Keyword tree `mwg-kw:Keywords` (MWG)"
case(R, "exiftool", "exiftool-mwg-keywords")(lambda: (exiftool_sidecar(
    jpeg(), "-XMP-mwg-kw:KeywordInfo={Hierarchy=[{Keyword=Places,Children=[{Keyword=Norway,"
            "Children=[{Keyword=Oslo}]}]}]}"), has_tree(TREE)))
H = "Xmp.mwg-kw.Keywords/mwg-kw:Hierarchy[1]"  # exiv2's path to the struct (it writes attribute form)
case(R, "exiv2", "exiv2-mwg-keywords")(lambda: (exiv2_sidecar(
    jpeg(), "set Xmp.mwg-kw.Keywords XmpText type=Struct", "set Xmp.mwg-kw.Keywords/mwg-kw:Hierarchy XmpText type=Bag",
    f"set {H}/mwg-kw:Keyword Places", f"set {H}/mwg-kw:Children XmpText type=Bag",
    f"set {H}/mwg-kw:Children[1]/mwg-kw:Keyword Norway", f"set {H}/mwg-kw:Children[1]/mwg-kw:Children XmpText type=Bag",
    f"set {H}/mwg-kw:Children[1]/mwg-kw:Children[1]/mwg-kw:Keyword Oslo"), has_tree(TREE)))


def shown_once(v: View):
    from engine.metadata.photo import display_keywords

    for listed in (v.hit["keywords"], display_keywords(v.meta)):
        folded = [k.casefold() for k in listed]
        assert len(folded) == len(set(folded)), listed
    assert "harbour" in v.hit["keywords"] and TREE in v.hit["keywords"], v.hit


R = "The same keyword in `dc:subject` and `lr:hierarchicalSubject` (shown once)"
case(R, "darktable-cli", "darktable-keywords-shown-once")(lambda: (darktable_over_exiftool_sidecar(
    jpeg(), "-XMP-lr:HierarchicalSubject=harbour", f"-XMP-lr:HierarchicalSubject={TREE}"), shown_once))
case(R, "exiftool", "exiftool-keywords-shown-once")(lambda: (exiftool_sidecar(
    jpeg(), "-XMP-dc:Subject=harbour", "-XMP-dc:Subject=Places", "-XMP-dc:Subject=Norway", "-XMP-dc:Subject=Oslo",
    "-XMP-lr:HierarchicalSubject=harbour", f"-XMP-lr:HierarchicalSubject={TREE}"), shown_once))

# --- labels and picks --------------------------------------------------------------------------


def labelled(*names: str):
    def check(v: View):
        for m in (v.meta, v.stored):
            assert m is not None and m.label in names, m
        assert v.hit["label"] in names, v.hit
    return check


R = "Colour label `xmp:Label` (as written)"
case(R, "exiftool", "exiftool-xmp-label")(lambda: (exiftool_sidecar(jpeg(), "-XMP-xmp:Label=Red"), labelled("Red")))
case(R, "exiftool", "exiftool-xmp-label-german")(lambda: (exiftool_into_picture(jpeg(), "-XMP-xmp:Label=Rot"),
                                                          labelled("Rot")))
case(R, "exiv2", "exiv2-xmp-label")(lambda: (exiv2_sidecar(jpeg(), "set Xmp.xmp.Label Green"), labelled("Green")))

R = "Colour label `darktable:colorlabels`"
case(R, "exiftool", "exiftool-darktable-colorlabels")(lambda: (exiftool_sidecar(
    jpeg(), "-XMP-darktable:colorlabels=2"), labelled("Green")))
case(R, "exiv2", "exiv2-darktable-colorlabels")(lambda: (exiv2_sidecar(
    jpeg(), "reg darktable http://darktable.sf.net/", "set Xmp.darktable.colorlabels XmpSeq 3"), labelled("Blue")))
case(R, "darktable-cli", "darktable-colorlabels-reserialised")(lambda: (darktable_over_exiftool_sidecar(
    jpeg(), "-XMP-darktable:colorlabels=4"), labelled("Purple", "Magenta")))

R = "Colour label `digiKam:ColorLabel`"
for _n, _name, _tool in ((2, "Orange", "exiftool"), (8, "Black", "exiftool"), (7, "Gray", "exiv2"),
                         (9, "White", "exiv2")):
    if _tool == "exiftool":
        case(R, _tool, f"exiftool-digikam-colorlabel-{_n}")(lambda n=_n, name=_name: (exiftool_sidecar(
            jpeg(), f"-XMP-digiKam:ColorLabel={n}"), labelled(name)))
    else:
        case(R, _tool, f"exiv2-digikam-colorlabel-{_n}")(lambda n=_n, name=_name: (exiv2_sidecar(
            jpeg(), f"set Xmp.digiKam.ColorLabel {n}"), labelled(name)))

# digiKam reads photoshop:Urgency as the colour label when there is no digiKam:ColorLabel (Nikon
# NX writes it; digiKam's DMetadata::getItemColorLabel), with the same numbers.
R = "Colour label `photoshop:Urgency` (digiKam's fallback, Nikon NX)"
case(R, "exiftool", "exiftool-urgency")(lambda: (exiftool_sidecar(jpeg(), "-XMP-photoshop:Urgency=4"),
                                                 labelled("Green")))
case(R, "exiv2", "exiv2-urgency")(lambda: (exiv2_sidecar(jpeg(), "set Xmp.photoshop.Urgency 1"), labelled("Red")))

R = "Pick label `digiKam:PickLabel`"
for _n, _pick, _tool in ((1, "rejected", "exiftool"), (2, "pending", "exiftool"), (3, "accepted", "exiv2")):
    if _tool == "exiftool":
        case(R, _tool, f"exiftool-picklabel-{_n}")(lambda n=_n, pick=_pick: (exiftool_sidecar(
            jpeg(), f"-XMP-digiKam:PickLabel={n}"), both(lambda m: _eq(m.pick, pick))))
    else:
        case(R, _tool, f"exiv2-picklabel-{_n}")(lambda n=_n, pick=_pick: (exiv2_sidecar(
            jpeg(), f"set Xmp.digiKam.PickLabel {n}"), both(lambda m: _eq(m.pick, pick))))

# --- titles and descriptions -------------------------------------------------------------------


def per_language(attr: str, default: str, other: tuple[str, str] | None):
    def check_meta(m):
        assert m is not None and getattr(m, attr[:-1]) == default, m
        entries = getattr(m, attr)
        assert entries and entries[0] == ("x-default", default), entries
        if other:
            assert other in entries, entries
    return both(check_meta)


R = "Title per language `dc:title`"
case(R, "exiftool", "exiftool-title-languages")(lambda: (exiftool_sidecar(
    jpeg(), "-XMP-dc:Title-x-default=Morning ferry", "-XMP-dc:Title-de=Morgenfähre"),
    per_language("titles", "Morning ferry", ("de", "Morgenfähre"))))
case(R, "exiv2", "exiv2-title-languages")(lambda: (exiv2_sidecar(
    jpeg(), 'set Xmp.dc.title lang="x-default" Morning ferry', 'set Xmp.dc.title lang="de" Morgenfähre'),
    per_language("titles", "Morning ferry", ("de", "Morgenfähre"))))
case(R, "darktable-cli", "darktable-title-reserialised")(lambda: (darktable_over_exiftool_sidecar(
    jpeg(), "-XMP-dc:Title-x-default=Morning ferry"), per_language("titles", "Morning ferry", None)))

R = "Description per language `dc:description`"
case(R, "exiftool", "exiftool-description-languages")(lambda: (exiftool_sidecar(
    jpeg(), f"-XMP-dc:Description-x-default={CAPTION}", "-XMP-dc:Description-nb=En hvit ferje krysser fjorden."),
    per_language("descriptions", CAPTION, ("nb", "En hvit ferje krysser fjorden."))))
case(R, "exiv2", "exiv2-description-languages")(lambda: (exiv2_sidecar(
    jpeg(), f'set Xmp.dc.description lang="x-default" {CAPTION}',
    'set Xmp.dc.description lang="nb" En hvit ferje krysser fjorden.'),
    per_language("descriptions", CAPTION, ("nb", "En hvit ferje krysser fjorden."))))
case(R, "darktable-cli", "darktable-description-reserialised")(lambda: (darktable_over_exiftool_sidecar(
    jpeg(), f"-XMP-dc:Description-x-default={CAPTION}"), per_language("descriptions", CAPTION, None)))

# --- JPEG extended XMP -------------------------------------------------------------------------

R = "JPEG extended XMP (a packet over 64 KB, split by exiftool)"
MANY = [f"extended-keyword-{i:04d}" for i in range(3000)]


def extended_xmp(folder, work, name):
    """Photoshop CS5's JPEG (hubble_deep_field.jpg) with 3,000 keywords added by exiftool: the XMP
    no longer fits one segment, so exiftool writes the standard packet (Photoshop's own fields and
    xmpNote:HasExtendedXMP) and moves the largest property into extended-XMP segments."""
    p = rf.copy_original(folder / f"{name}.jpg", "hubble_deep_field.jpg")
    args = work / f"{name}.args"
    args.parent.mkdir(parents=True, exist_ok=True)
    args.write_text("".join(f"-XMP-dc:Subject={k}\n" for k in MANY), encoding="utf-8")
    rf.exiftool(p, "-@", str(args))
    assert b"http://ns.adobe.com/xmp/extension/" in p.read_bytes()
    return p


def check_extended(v: View):
    assert set(MANY) <= set(v.meta.subjects), len(v.meta.subjects)
    assert v.meta.taken_at and v.meta.taken_at.startswith("2012-06-29T09:29"), v.meta  # the standard packet's
    assert not v.meta.problems, v.meta.problems


case(R, "exiftool", "exiftool-extended-xmp")(lambda: (extended_xmp, check_extended))


# --- the run -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def library(tmp_path_factory, blip_tiny_checkpoint):
    """Every case's picture (each in its own folder, its sidecars beside it), indexed once by the
    real `longlens index`. A case whose tool failed is remembered with the error: its test fails."""
    root = tmp_path_factory.mktemp("interop-fields")
    folder, work = root / "library", root / "work"
    def build(c: Case) -> Path | str:
        try:
            return c.build(folder / c.id, work, c.id)
        except Exception as exc:  # noqa: BLE001 - reported by that case's test, not by every test
            return f"{type(exc).__name__}: {exc}"

    # Each case has its own folders (and darktable its own config folder): the tools' processes
    # run side by side.
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=4) as pool:
        built = dict(zip((c.id for c in CASES), pool.map(build, CASES), strict=True))
    ll = rf.LonglensHome(root / "home", blip_tiny_checkpoint)
    summary = ll.index(folder)
    hits = ll.search()
    return ll, built, hits, summary


def _read_now(picture: Path):
    from engine.metadata.photo import SidecarFile, is_sidecar_name, match_sidecars, read_photo_metadata

    by_name: dict[str, list[SidecarFile]] = {}
    for p in picture.parent.iterdir():
        if is_sidecar_name(p.name):
            st = p.stat()
            by_name.setdefault(p.name.casefold(), []).append(SidecarFile(p.name, p, st.st_size, st.st_mtime_ns))
    return read_photo_metadata(picture, match_sidecars(picture.name, by_name))


@pytest.mark.timeout(600)
@pytest.mark.parametrize("c", [pytest.param(c, id=c.id, marks=pytest.mark.interop_cell(c.id)) for c in CASES])
def test_a_field_written_by_a_real_tool_is_read(library, c: Case):
    from engine.catalog import Catalog
    from engine.config import get_paths

    ll, built, hits, _summary = library
    picture = built[c.id]
    assert isinstance(picture, Path), f"{c.column} could not write the case: {picture}"
    meta = _read_now(picture)
    assert picture.name in hits, f"{picture.name} is not in the index: {sorted(hits)[:5]}..."
    with Catalog(get_paths(str(ll.home)).catalog) as cat:
        record = cat.image_at(picture)
        assert record is not None, picture
        stored = cat.photo_metadata([record.id]).get(record.id)
    c.check(View(picture, meta, stored, record, hits[picture.name]))


def test_every_row_has_a_tool_and_the_table_has_its_markers():
    """The table is generated into docs/xmp.md between its markers (conftest.py, at the end of
    the run); every row of it is proven by at least one tool."""
    from tests.interop.interop_table import DOC

    text = DOC.read_text(encoding="utf-8")
    assert f"<!-- {FIELDS.key}:start -->" in text and f"<!-- {FIELDS.key}:end -->" in text
    assert len(FIELDS.rows) >= 25 and all(any(FIELDS.cell(r, col) != "n.a." for col in FIELDS.columns)
                                          for r in FIELDS.rows)
