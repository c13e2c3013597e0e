"""Issue 28 point 1: EXIF and IPTC-IIM read with python-exiv2 (files made here with Pillow and
python-exiv2), one precedence table with the XMP sources, darktable's invented sidecar date
recognised as a file time, and hostile files costing only the field they spoil."""

from __future__ import annotations

import os
import time
import warnings
from pathlib import Path

import exiv2
import pytest
from PIL import Image

from engine.metadata import display_keywords, read_photo_metadata
from engine.metadata.exif_iptc import read_exif_iptc
from engine.metadata.photo import READER_VERSION, sidecar_state
from tests.engine.test_xmp import sidecars_of


def _read(image: Path, **kw):
    return read_photo_metadata(image, sidecars_of(image), **kw)


def _jpeg(path: Path, *, exif: dict | None = None, photo: dict | None = None, gps: dict | None = None,
          xmp: bytes | None = None) -> Path:
    """A JPEG with the EXIF tags given (IFD0 `exif`, Exif IFD `photo`, GPS IFD `gps`), by Pillow."""
    e = Image.Exif()
    for tag, value in (exif or {}).items():
        e[tag] = value
    if photo:
        ifd = e.get_ifd(0x8769)
        ifd.update(photo)
    if gps:
        ifd = e.get_ifd(0x8825)
        ifd.update(gps)
    kw = {"xmp": xmp} if xmp is not None else {}
    Image.new("RGB", (48, 32), "teal").save(path, "JPEG", exif=e.tobytes(), **kw)
    return path


def _iptc(path: Path, entries: list[tuple[str, str | bytes]]) -> Path:
    """Write IPTC-IIM datasets into `path` with python-exiv2 (bytes: written as they are)."""
    image = exiv2.ImageFactory.open(str(path))
    image.readMetadata()
    data = image.iptcData()
    for key, value in entries:
        data.add(exiv2.IptcKey(key), _latin1_value(value) if isinstance(value, bytes) else exiv2.StringValue(value))
    image.writeMetadata()
    return path


def _latin1_value(raw: bytes):
    """A string value holding `raw` byte for byte (what an old tool writes without a charset)."""
    value = exiv2.Value.create(exiv2.TypeId.string)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # python-exiv2 frowns on raw bytes; we mean them
        value.read(raw, exiv2.ByteOrder.invalidByteOrder)
    return value


def _fields(meta, name: str) -> list:
    return [f for f in meta.fields if f.name == name]


CAMERA_EXIF = {0x010F: "NIKON CORPORATION", 0x0110: "NIKON D750", 0x0112: 6, 0x4746: 4, 0x4749: 75}
CAMERA_PHOTO = {0x9003: "2023:06:14 10:22:31", 0x9291: "123", 0x9011: "+02:00", 0xA434: "AF-S 50mm f/1.8G"}
CAMERA_GPS = {1: "S", 2: (33.0, 51.0, 24.0), 3: "W", 4: (151.0, 12.0, 30.0)}


# --------------------------------------------------------------------------- EXIF


def test_every_exif_field_is_read_with_its_subseconds_offset_and_refs(tmp_path):
    pic = _jpeg(tmp_path / "DSC_0001.jpg", exif=CAMERA_EXIF, photo=CAMERA_PHOTO, gps=CAMERA_GPS)
    meta = _read(pic)
    assert meta.problems == ()
    # As written (the store shows "NIKON D750" once): not joined, not trimmed of the maker's name.
    assert (meta.camera_make, meta.camera_model, meta.lens) == ("NIKON CORPORATION", "NIKON D750", "AF-S 50mm f/1.8G")
    assert meta.gps_lat == pytest.approx(-(33 + 51 / 60 + 24 / 3600))  # S and W are negative
    assert meta.gps_lon == pytest.approx(-(151 + 12 / 60 + 30 / 3600))
    assert meta.rating == 4  # Exif.Image.Rating; RatingPercent 75 (also 4) listed, not used
    # The EXIF date is the catalog's exif_date (from decoding), not taken_at: listed, with its parts.
    assert meta.taken_at is None and meta.taken_from is None
    by_name = {f.name: f for f in meta.fields}
    assert by_name["Exif.Photo.DateTimeOriginal"].value == "2023:06:14 10:22:31"
    assert by_name["Exif.Photo.SubSecTimeOriginal"].value == "123"
    assert by_name["Exif.Photo.OffsetTimeOriginal"].value == "+02:00"
    assert by_name["Exif.Image.Orientation"].value == "6"
    assert by_name["Exif.GPSInfo.GPSLatitudeRef"].value == "S"
    assert by_name["Exif.Image.RatingPercent"].used is False
    assert by_name["Exif.Image.RatingPercent"].note == "Exif.Image.Rating is the rating"
    assert {f.source for f in meta.fields} == {"DSC_0001.jpg (EXIF)"}
    assert "exif" in meta.sources


@pytest.mark.parametrize(("percent", "stars"), [(1, 1), (25, 2), (50, 3), (75, 4), (99, 5), (100, 5), (30, 2),
                                                (0, 0)])
def test_windows_rating_percent_counts_as_digikam_maps_it(tmp_path, percent, stars):
    pic = _jpeg(tmp_path / "win.jpg", exif={0x4749: percent})
    assert _read(pic).rating == stars


# --------------------------------------------------------------------------- IPTC-IIM


def test_every_iptc_field_is_read(tmp_path):
    pic = _iptc(_jpeg(tmp_path / "agency.jpg"), [
        ("Iptc.Envelope.CharacterSet", "\x1b%G"),
        ("Iptc.Application2.Keywords", "Oslo"), ("Iptc.Application2.Keywords", "ferry"),
        ("Iptc.Application2.Keywords", "Oslo"),
        ("Iptc.Application2.Caption", "Ferry leaving Aker Brygge"),
        ("Iptc.Application2.Headline", "Ferries return"),
        ("Iptc.Application2.ObjectName", "OSL-FERRY-01"),
        ("Iptc.Application2.DateCreated", "2019-05-04"), ("Iptc.Application2.TimeCreated", "12:13:14+02:00"),
        ("Iptc.Application2.Byline", "Kari Nordmann"), ("Iptc.Application2.City", "Oslo"),
        ("Iptc.Application2.CountryName", "Norway"),
    ])
    meta = _read(pic)
    assert meta.problems == ()
    assert meta.subjects == ("Oslo", "ferry") and meta.hierarchy == ()  # the repeated one once
    assert meta.description == "Ferry leaving Aker Brygge"
    assert meta.descriptions == (("x-default", "Ferry leaving Aker Brygge"),)
    assert meta.title == "OSL-FERRY-01"  # ObjectName is digiKam's title after dc:title
    assert meta.taken_at == "2019-05-04T12:13:14" and meta.taken_from == "iptc"
    shown = {f.name: f.value for f in meta.fields}
    assert shown["Iptc.Application2.Headline"] == "Ferries return"
    assert shown["Iptc.Application2.Byline"] == "Kari Nordmann"
    assert shown["Iptc.Application2.City"] == "Oslo" and shown["Iptc.Application2.CountryName"] == "Norway"
    assert shown["Iptc.Application2.TimeCreated"] == "12:13:14+02:00"
    assert "iptc" in meta.sources


def test_a_partial_iptc_date_stays_partial_and_latin1_text_is_read(tmp_path):
    pic = _iptc(_jpeg(tmp_path / "old.jpg"), [
        ("Iptc.Application2.DateCreated", "2023-06-00"),
        ("Iptc.Application2.Caption", b"Caf\xe9 at Gr\xfcnerl\xf8kka"),  # no CharacterSet: Latin-1
    ])
    meta = _read(pic)
    assert meta.taken_at == "2023-06" and meta.taken_from == "iptc"
    assert meta.description == "Café at Grünerløkka"


# --------------------------------------------------------------------------- precedence


EMBEDDED = b"""<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#">
<rdf:Description rdf:about="" xmlns:dc="http://purl.org/dc/elements/1.1/" xmlns:xmp="http://ns.adobe.com/xap/1.0/"
 xmlns:exif="http://ns.adobe.com/exif/1.0/" xmlns:tiff="http://ns.adobe.com/tiff/1.0/"
 xmp:Rating="2" xmp:CreateDate="2019-05-04T12:13:14" exif:GPSLatitude="59,54.5N" exif:GPSLongitude="10,45.0E"
 tiff:Make="Embedded make">
 <dc:subject><rdf:Bag><rdf:li>embedded word</rdf:li></rdf:Bag></dc:subject>
</rdf:Description></rdf:RDF></x:xmpmeta>"""

SIDECAR = """<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#">
<rdf:Description rdf:about="" xmlns:dc="http://purl.org/dc/elements/1.1/" xmlns:xmp="http://ns.adobe.com/xap/1.0/"
 xmlns:exif="http://ns.adobe.com/exif/1.0/" xmlns:tiff="http://ns.adobe.com/tiff/1.0/"
 xmlns:exifEX="http://cipa.jp/exif/1.0/" {attrs}>
 {body}
</rdf:Description></rdf:RDF></x:xmpmeta>"""


def _sidecar(path: Path, attrs: str = "", body: str = "") -> Path:
    path.write_text(SIDECAR.format(attrs=attrs, body=body), encoding="utf-8")
    return path


def test_sidecar_then_embedded_xmp_then_iptc_then_exif_group_by_group(tmp_path):
    pic = _jpeg(tmp_path / "IMG_1.jpg", exif={0x010F: "Canon", 0x0110: "Canon EOS R6", 0x4746: 1},
                photo={0xA434: "RF 35mm"}, gps={1: "N", 2: (1.0, 0.0, 0.0), 3: "E", 4: (2.0, 0.0, 0.0)},
                xmp=EMBEDDED)
    _iptc(pic, [("Iptc.Application2.Keywords", "iptc word"), ("Iptc.Application2.Caption", "IPTC caption"),
                ("Iptc.Application2.DateCreated", "2001-01-01")])
    _sidecar(tmp_path / "IMG_1.jpg.xmp", 'xmp:Rating="5" exifEX:LensModel="Sidecar lens"')
    meta = _read(pic)
    assert meta.rating == 5  # sidecar over embedded 2 and EXIF 1
    assert meta.subjects == ("embedded word",)  # embedded XMP over IPTC (the sidecar has none)
    assert meta.description == "IPTC caption"  # IPTC fills what no XMP sets
    assert meta.taken_at == "2019-05-04T12:13:14" and meta.taken_from == "xmp"  # embedded over IPTC 2001
    assert (meta.gps_lat, meta.gps_lon) == (pytest.approx(59 + 54.5 / 60), pytest.approx(10.75))  # XMP over EXIF
    assert (meta.camera_make, meta.camera_model) == ("Canon", "Canon EOS R6")  # EXIF over tiff:Make
    assert meta.lens == "RF 35mm"  # EXIF over exifEX:LensModel
    assert meta.sources == ("IMG_1.jpg.xmp", "embedded", "iptc", "exif")
    iptc_kw = _fields(meta, "Iptc.Application2.Keywords")[0]
    assert (iptc_kw.used, iptc_kw.note) == (False, "IMG_1.jpg (embedded XMP) sets the keywords")
    exif_rating = _fields(meta, "Exif.Image.Rating")[0]
    assert (exif_rating.used, exif_rating.note) == (False, "IMG_1.jpg.xmp sets the rating")
    assert _fields(meta, "Xmp.tiff.Make")[0].used is False
    assert [f.source for f in meta.fields][:2] == ["IMG_1.jpg.xmp", "IMG_1.jpg.xmp"]  # precedence order
    assert meta.fields[-1].source == "IMG_1.jpg (EXIF)"


def test_the_camera_of_a_lightroom_sidecar_of_a_raw_is_read_when_the_file_has_no_exif(tmp_path):
    raw = tmp_path / "DSC_4127.NEF"
    raw.write_bytes(b"not a raw exiv2 knows" * 200)
    _sidecar(tmp_path / "DSC_4127.xmp", 'tiff:Make="NIKON CORPORATION" tiff:Model="NIKON D750"')
    meta = _read(raw)
    assert (meta.camera_make, meta.camera_model) == ("NIKON CORPORATION", "NIKON D750")
    assert meta.problems == ()  # a format exiv2 does not know is not a problem


def test_iptc_keywords_equal_to_xmp_ones_and_darktables_double_listing_appear_once(tmp_path):
    pic = _jpeg(tmp_path / "dup.jpg")
    _iptc(pic, [("Iptc.Application2.Keywords", "sunset"), ("Iptc.Application2.Keywords", "Oslo")])
    _sidecar(tmp_path / "dup.jpg.xmp", body="""
 <dc:subject><rdf:Bag><rdf:li>sunset</rdf:li><rdf:li>Oslo</rdf:li><rdf:li>Sunset</rdf:li><rdf:li>Fjord</rdf:li>
 <rdf:li>fjord</rdf:li></rdf:Bag></dc:subject>
 <lr:hierarchicalSubject xmlns:lr="http://ns.adobe.com/lightroom/1.0/"><rdf:Bag><rdf:li>sunset</rdf:li>
 <rdf:li>Places|Norway|Oslo</rdf:li></rdf:Bag></lr:hierarchicalSubject>""")
    meta = _read(pic)
    assert display_keywords(meta) == ["sunset", "Places › Norway › Oslo", "Fjord"]  # case ignored, first kept


def test_a_darktable_sidecar_holds_every_keyword_title_and_label_so_the_pictures_own_do_not_come_back(tmp_path):
    # darktable copies the picture's own XMP and IPTC into its sidecar at import (checked with
    # darktable-cli); a keyword or description missing from its sidecar was removed in darktable.
    pic = _jpeg(tmp_path / "IMG_2.jpg", xmp=EMBEDDED)
    _iptc(pic, [("Iptc.Application2.Caption", "IPTC caption")])
    _sidecar(tmp_path / "IMG_2.jpg.xmp", 'xmp:Rating="1" darktable:xmp_version="5" '
                                         'xmlns:darktable="http://darktable.sf.net/"')
    meta = _read(pic)
    assert (meta.subjects, meta.description, meta.rating) == ((), None, 1)
    dropped = _fields(meta, "Xmp.dc.subject")[0]
    assert dropped.used is False and "darktable's sidecar" in dropped.note
    assert meta.taken_at == "2019-05-04T12:13:14"  # dates, GPS and camera still come from the picture
    assert meta.gps_lat == pytest.approx(59 + 54.5 / 60)
    # Any other sidecar (Lightroom's, Longlens's own) leaves the picture's values in place.
    _sidecar(tmp_path / "IMG_2.jpg.xmp", 'xmp:Rating="1"')
    assert _read(pic).subjects == ("embedded word",)


# --------------------------------------------------------------------------- darktable's invented date


def _darktable_sidecar(pic: Path, when: float | None = None) -> Path:
    """A sidecar as darktable-cli writes it for a picture without an EXIF date: the file's mtime
    (local time) as exif:DateTimeOriginal, with milliseconds."""
    mtime = pic.stat().st_mtime if when is None else when
    stamp = time.strftime("%Y:%m:%d %H:%M:%S", time.localtime(mtime)) + ".000"
    return _sidecar(pic.with_name(pic.name + ".xmp"), f'exif:DateTimeOriginal="{stamp}" xmp:Rating="1"')


def _aged(pic: Path) -> Path:
    stamp = time.mktime((2026, 11, 1, 10, 0, 0, 0, 0, -1))
    os.utime(pic, (stamp, stamp))
    return pic


def test_darktables_file_time_gives_way_to_the_embedded_create_date(tmp_path):
    pic = _aged(_jpeg(tmp_path / "pic.jpg", xmp=EMBEDDED))
    _darktable_sidecar(pic)
    meta = _read(pic)
    assert meta.taken_at == "2019-05-04T12:13:14" and meta.taken_from == "xmp"  # not 2026
    dt_date = _fields(meta, "Xmp.exif.DateTimeOriginal")[0]
    assert dt_date.value == "2026:11:01 10:00:00.000" and dt_date.used is False
    assert "modification time" in dt_date.note and "darktable" in dt_date.note
    assert meta.rating == 1  # the rest of darktable's sidecar still counts


def test_darktables_file_time_gives_way_to_a_lightroom_stem_sidecars_date(tmp_path):
    pic = _aged(_jpeg(tmp_path / "IMG_7.jpg"))
    _darktable_sidecar(pic)
    _sidecar(tmp_path / "IMG_7.xmp", 'exif:DateTimeOriginal="2019-05-04T12:13:14" xmp:Rating="3" '
                                     'tiff:Make="Leica"')
    meta = _read(pic)
    assert meta.taken_at == "2019-05-04T12:13:14" and meta.taken_from == "xmp"
    assert meta.rating == 1  # only the date falls through: the whole-name sidecar is still the one used
    assert meta.camera_make is None
    assert "IMG_7.xmp" in meta.sources
    make = _fields(meta, "Xmp.tiff.Make")[0]
    assert (make.source, make.used) == ("IMG_7.xmp", False)
    assert make.note == "IMG_7.jpg.xmp is the picture's sidecar (this one is read for the date only)"


def test_darktables_file_time_gives_way_to_the_iptc_date_and_else_leaves_no_date(tmp_path):
    pic = _aged(_iptc(_jpeg(tmp_path / "a.jpg"), [("Iptc.Application2.DateCreated", "2019-05-04")]))
    _darktable_sidecar(pic)
    meta = _read(pic)
    assert meta.taken_at == "2019-05-04" and meta.taken_from == "iptc"
    bare = _aged(_jpeg(tmp_path / "b.jpg"))
    _darktable_sidecar(bare)
    meta = _read(bare)
    assert meta.taken_at is None and meta.taken_from is None  # the catalog falls back to the file time


def test_a_sidecar_date_that_is_not_the_file_time_or_beside_an_exif_date_is_the_date(tmp_path):
    pic = _aged(_jpeg(tmp_path / "c.jpg", xmp=EMBEDDED))
    _darktable_sidecar(pic, when=pic.stat().st_mtime - 3600)  # an hour off: a real date someone set
    assert _read(pic).taken_at == "2026-11-01T09:00:00"
    with_exif = _aged(_jpeg(tmp_path / "d.jpg", photo={0x9003: "2026:11:01 10:00:00"}, xmp=EMBEDDED))
    _darktable_sidecar(with_exif)  # darktable copied the EXIF date, which happens to equal the mtime
    meta = _read(with_exif)
    assert meta.taken_at == "2026-11-01T10:00:00"
    assert _fields(meta, "Xmp.exif.DateTimeOriginal")[0].used is True


def test_a_darktable_sidecar_with_another_date_property_uses_that_one(tmp_path):
    pic = _aged(_jpeg(tmp_path / "e.jpg", xmp=EMBEDDED))
    stamp = time.strftime("%Y:%m:%d %H:%M:%S", time.localtime(pic.stat().st_mtime))
    _sidecar(tmp_path / "e.jpg.xmp", f'exif:DateTimeOriginal="{stamp}.000" '
                                     'xmlns:photoshop="http://ns.adobe.com/photoshop/1.0/" '
                                     'photoshop:DateCreated="2018-02-03"')
    meta = _read(pic)
    assert meta.taken_at == "2018-02-03" and meta.taken_from == "xmp"
    assert _fields(meta, "Xmp.photoshop.DateCreated")[0].used is True


# --------------------------------------------------------------------------- hostile and odd files


def test_a_bad_exif_field_drops_only_that_field(tmp_path):
    pic = _jpeg(tmp_path / "bad.jpg", exif={0x010F: "Canon", 0x0112: 42}, photo={0x9003: "garbage"},
                gps={1: "X", 2: (1.0, 0.0, 0.0), 3: "E", 4: (2.0, 0.0, 0.0)})
    meta = _read(pic)
    assert meta.camera_make == "Canon"
    assert meta.gps_lat is None and meta.gps_lon is None
    problems = "\n".join(meta.problems)
    assert "bad.jpg: Exif.Photo.DateTimeOriginal 'garbage' is not a date; not read" in problems
    assert "bad.jpg: Exif.Image.Orientation '42' is not 1 to 8; not read" in problems
    assert "bad.jpg: Exif.GPSInfo.GPSLatitude / GPSLongitude" in problems
    assert _fields(meta, "Exif.Photo.DateTimeOriginal")[0].used is False


def test_a_damaged_exif_block_is_a_problem_naming_the_file_and_the_xmp_is_still_read(tmp_path):
    good = _jpeg(tmp_path / "good.jpg", xmp=EMBEDDED).read_bytes()
    app1 = b"Exif\x00\x00MM\x00*\x00\x00\x00\x08" + b"\xff\xff" + b"\x00" * 6  # 65535 entries, none there
    damaged = good[:2] + b"\xff\xe1" + (len(app1) + 2).to_bytes(2, "big") + app1 + good[2:]
    (tmp_path / "damaged.jpg").write_bytes(damaged)
    meta = _read(tmp_path / "damaged.jpg")
    assert meta.rating == 2 and meta.subjects == ("embedded word",)
    assert meta.problems == ("damaged.jpg: exiv2: Directory Image with 65535 entries considered invalid; not read.",)


def test_a_link_is_not_followed_when_the_scan_did_not_follow_it(tmp_path):
    target = _jpeg(tmp_path / "real.jpg", exif={0x010F: "Canon"})
    link = tmp_path / "link.jpg"
    link.symlink_to(target)
    exif, iptc, problems = read_exif_iptc(link, follow_symlinks=False)
    assert exif is None and iptc is None
    assert len(problems) == 1 and problems[0].startswith("link.jpg: EXIF and IPTC not read")
    exif, _, problems = read_exif_iptc(link, follow_symlinks=True)
    assert exif is not None and exif.values["camera"] == ("Canon", None) and problems == []


def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "pipe.jpg"
    os.mkfifo(fifo)
    exif, iptc, problems = read_exif_iptc(fifo)
    assert exif is None and iptc is None and "pipe.jpg" in problems[0]


def test_the_reader_version_is_part_of_the_stored_state_so_every_picture_is_read_again():
    assert READER_VERSION == 2
    assert sidecar_state(()).startswith("[2,")
