"""Issue 20 item 2: XMP read from sidecars (both naming conventions, photoshop:SidecarForExtension,
precedence) and from packets embedded in real JPEG, PNG, WebP, TIFF, DNG, HEIC and AVIF files;
hostile and malformed XML refused with a reason naming the file, nothing else lost."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import pytest
from PIL import Image, PngImagePlugin

from engine.metadata import SidecarFile, match_sidecars, parse_xmp, read_photo_metadata
from engine.metadata.embedded import read_embedded_xmp
from engine.metadata.photo import STEM, WHOLE_NAME, display_keywords
from engine.metadata.xmp import XmpError, parse_gps_coordinate, parse_xmp_date

DATA = Path(__file__).resolve().parents[1] / "data" / "xmp"

EMBEDDED_PACKET = b"""<?xpacket begin="\xef\xbb\xbf" id="W5M0MpCehiHzreSzNTczkc9d"?>
<x:xmpmeta xmlns:x="adobe:ns:meta/" x:xmptk="Adobe XMP Core 7.0-c000 1.000000, 0000/00/00-00:00:00        ">
 <rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#">
  <rdf:Description rdf:about=""
    xmlns:xmp="http://ns.adobe.com/xap/1.0/"
    xmlns:dc="http://purl.org/dc/elements/1.1/"
    xmlns:photoshop="http://ns.adobe.com/photoshop/1.0/"
    xmlns:lr="http://ns.adobe.com/lightroom/1.0/"
   xmp:Rating="2"
   xmp:Label="Red"
   photoshop:DateCreated="2020-02-29T07:15:00">
   <dc:title><rdf:Alt><rdf:li xml:lang="x-default">Embedded title</rdf:li></rdf:Alt></dc:title>
   <dc:subject><rdf:Bag><rdf:li>Lofoten</rdf:li><rdf:li>winter</rdf:li></rdf:Bag></dc:subject>
   <lr:hierarchicalSubject><rdf:Bag><rdf:li>Places|Norway|Lofoten</rdf:li></rdf:Bag></lr:hierarchicalSubject>
  </rdf:Description>
 </rdf:RDF>
</x:xmpmeta>
""" + b" " * 200 + b'\n<?xpacket end="w"?>'


def sidecars_of(image: Path) -> tuple[SidecarFile, ...]:
    """What the scan attaches to `image` (the .xmp files of its folder, matched by name)."""
    found: dict[str, list[SidecarFile]] = {}
    for p in image.parent.iterdir():
        if p.name.lower().endswith(".xmp"):
            st = p.stat()
            found.setdefault(p.name.casefold(), []).append(SidecarFile(p.name, p, st.st_size, st.st_mtime_ns))
    return match_sidecars(image.name, found)


def _jpeg(path: Path, xmp: bytes | None = None, colour: str = "teal") -> Path:
    kw = {"xmp": xmp} if xmp is not None else {}
    Image.new("RGB", (48, 32), colour).save(path, "JPEG", quality=85, **kw)
    return path


# --------------------------------------------------------------------------- sidecars as the tools write them


def test_a_lightroom_classic_sidecar_gives_every_field():
    p = parse_xmp((DATA / "lightroom-classic.xmp").read_bytes(), "DSC_4127.xmp")
    assert p.problems == []
    assert p.sidecar_for == "NEF"
    v = p.values
    assert v["title"] == "Morning ferry, Oslofjord"
    assert v["description"].startswith("A white ferry crosses the fjord")
    assert v["keywords"] == (("Norway", "Oslo", "Places", "Transport", "ferry"),
                             ("Places|Norway|Oslo", "Transport|ferry"))
    assert v["rating"] == 4 and v["label"] == "Green"
    # Local time as written, like the catalog's EXIF dates (the +02:00 offset is not applied).
    assert v["taken_at"] == "2023-06-14T10:22:31"
    lat, lon = v["gps"]
    assert lat == pytest.approx(59 + 54.4134 / 60) and lon == pytest.approx(10 + 45.1208 / 60)


def test_a_darktable_sidecar_without_darktables_own_tags():
    p = parse_xmp((DATA / "darktable.xmp").read_bytes(), "IMG_2044.jpg.xmp")
    assert p.problems == [] and p.sidecar_for is None
    v = p.values
    assert v["title"] == "Bryggen at dusk"
    subjects, hierarchy = v["keywords"]
    assert hierarchy == ("Places|Norway|Bergen", "harbour")  # darktable|format|jpg, darktable|changed left out
    assert subjects == ("Bergen", "Norway", "Places", "harbour")  # "darktable", "format", "jpg", "changed" too
    assert v["rating"] == 3
    assert v["label"] == "Yellow"  # darktable:colorlabels 1
    assert v["taken_at"] == "2022-08-03T19:41:07"  # EXIF's own form, as darktable writes it
    assert "gps" not in v


def test_a_digikam_sidecar_tagslist_levels_become_paths():
    p = parse_xmp((DATA / "digikam.xmp").read_bytes(), "P1030412.JPG.xmp")
    assert p.problems == []
    subjects, hierarchy = p.values["keywords"]
    assert hierarchy == ("Places|Norway|Flåm", "People|Family")  # lr: and digiKam:TagsList, once each
    assert subjects == ("Flåm", "Family")
    assert p.values["rating"] == 5 and "label" not in p.values  # digiKam:ColorLabel 0 is "no label"
    assert p.values["description"].startswith("The train at Flåm station")


@pytest.mark.timeout(30)
@pytest.mark.parametrize("name", ["billion-laughs.xmp", "external-entity.xmp"])
def test_xml_bombs_and_external_entities_are_refused_before_any_expansion(name):
    with pytest.raises(XmpError, match=rf"^{name}: refused: it declares a DTD or entities") as err:
        parse_xmp((DATA / name).read_bytes(), name)
    assert "lol" not in str(err.value) and Path("/etc/hostname").name not in str(err.value)


def test_malformed_packets_name_the_file_and_why():
    lightroom = (DATA / "lightroom-classic.xmp").read_bytes()
    with pytest.raises(XmpError, match=r"^DSC_4127\.xmp: not well-formed XML \(.*line \d+"):
        parse_xmp(lightroom[: len(lightroom) // 2], "DSC_4127.xmp")  # a sidecar cut short by a full disk
    with pytest.raises(XmpError, match="empty"):
        parse_xmp(b"\x00\x00  \n", "blank.xmp")
    with pytest.raises(XmpError, match="no rdf:RDF element"):
        parse_xmp(b"<html><body>not xmp</body></html>", "page.xmp")


def test_a_bad_field_is_a_problem_of_that_field_only():
    packet = (DATA / "lightroom-classic.xmp").read_text(encoding="utf-8")
    packet = packet.replace('xmp:Rating="4"', 'xmp:Rating="five"').replace("59,54.4134N", "95,10.0N")
    p = parse_xmp(packet.encode(), "DSC_4127.xmp")
    assert p.problems == [
        "DSC_4127.xmp: xmp:Rating 'five' is not a rating from -1 to 5; not read",
        "DSC_4127.xmp: exif:GPSLatitude '95,10.0N' / exif:GPSLongitude '10,45.1208E' is not a position; not read",
    ]
    assert "rating" not in p.values and "gps" not in p.values
    assert p.values["title"] == "Morning ferry, Oslofjord" and p.values["label"] == "Green"


def test_date_and_gps_forms():
    assert parse_xmp_date("2023-06-14T10:22:31.40+02:00") == "2023-06-14T10:22:31"
    assert parse_xmp_date("2023-06-14T10:22Z") == "2023-06-14T10:22:00"
    assert parse_xmp_date("2023-06-14") == "2023-06-14"
    assert parse_xmp_date("2023-06") == "2023-06" and parse_xmp_date("2023") == "2023"
    assert parse_xmp_date("2023:06:14 10:22:31") == "2023-06-14T10:22:31"
    for bad in ("", "yesterday", "2023-13-01", "2023-02-30T10:00:00", "0000"):
        assert parse_xmp_date(bad) is None, bad
    assert parse_gps_coordinate("59,54,24.8N", "NS", 90) == pytest.approx(59 + 54 / 60 + 24.8 / 3600)
    assert parse_gps_coordinate("33,51.5S", "NS", 90) == pytest.approx(-(33 + 51.5 / 60))
    assert parse_gps_coordinate("151,12.5W", "EW", 180) == pytest.approx(-(151 + 12.5 / 60))
    assert parse_gps_coordinate("-33.8583", "NS", 90) == pytest.approx(-33.8583)
    for bad, refs in (("59,54.4E", "NS"), ("59,61.0N", "NS"), ("181,0.0E", "EW"), ("north", "NS")):
        assert parse_gps_coordinate(bad, refs, 180 if refs == "EW" else 90) is None, bad


# --------------------------------------------------------------------------- which sidecar belongs to which picture


def test_both_naming_conventions_are_matched_in_any_case(tmp_path):
    for name in ("IMG_1.CR2", "IMG_1.xmp", "IMG_1.CR2.XMP", "img_2.jpg", "IMG_2.XMP", "IMG_10.jpg.xmp"):
        (tmp_path / name).write_bytes(b"x")
    got = sidecars_of(tmp_path / "IMG_1.CR2")
    assert [(s.name, s.kind) for s in got] == [("IMG_1.CR2.XMP", WHOLE_NAME), ("IMG_1.xmp", STEM)]
    assert [(s.name, s.kind) for s in sidecars_of(tmp_path / "img_2.jpg")] == [("IMG_2.XMP", STEM)]
    assert sidecars_of(tmp_path / "IMG_1.jpg") == (SidecarFile("IMG_1.xmp", tmp_path / "IMG_1.xmp", 1,
                                                                (tmp_path / "IMG_1.xmp").stat().st_mtime_ns, STEM),)


def test_sidecar_for_extension_gives_lightrooms_sidecar_to_the_raw_not_the_jpeg_beside_it(tmp_path):
    raw = tmp_path / "DSC_4127.NEF"
    Image.new("RGB", (16, 16)).save(raw, "TIFF")  # NEFs are TIFF files; this one holds no XMP
    jpeg = _jpeg(tmp_path / "DSC_4127.JPG")
    shutil.copy(DATA / "lightroom-classic.xmp", tmp_path / "DSC_4127.xmp")
    m = read_photo_metadata(raw, sidecars_of(raw))
    assert m.title == "Morning ferry, Oslofjord" and m.rating == 4 and m.sources == ("DSC_4127.xmp",)
    assert m.hierarchy == ("Places|Norway|Oslo", "Transport|ferry")
    other = read_photo_metadata(jpeg, sidecars_of(jpeg))
    assert other.is_empty() and other.sources == () and other.problems == ()
    # A stem sidecar that names no file belongs to every picture of that stem (Capture One, older tools).
    packet = (DATA / "lightroom-classic.xmp").read_text(encoding="utf-8")
    (tmp_path / "DSC_4127.xmp").write_text(packet.replace('photoshop:SidecarForExtension="NEF"', ""), encoding="utf-8")
    assert read_photo_metadata(jpeg, sidecars_of(jpeg)).title == "Morning ferry, Oslofjord"


def test_the_whole_name_sidecar_wins_and_the_embedded_packet_fills_the_rest(tmp_path):
    """Precedence: IMG.jpg.xmp (darktable) over IMG.xmp (not merged at all), both over the packet in
    the file, which still gives what no sidecar sets."""
    image = _jpeg(tmp_path / "IMG_2044.jpg", EMBEDDED_PACKET)
    shutil.copy(DATA / "darktable.xmp", tmp_path / "IMG_2044.jpg.xmp")
    lightroom = (DATA / "lightroom-classic.xmp").read_text(encoding="utf-8")
    (tmp_path / "IMG_2044.xmp").write_text(lightroom.replace('photoshop:SidecarForExtension="NEF"', ""),
                                           encoding="utf-8")
    m = read_photo_metadata(image, sidecars_of(image))
    assert m.sources == ("IMG_2044.jpg.xmp",)  # darktable's sets every group the file's packet has
    assert m.title == "Bryggen at dusk" and m.rating == 3 and m.label == "Yellow"  # darktable's
    assert m.hierarchy == ("Places|Norway|Bergen", "harbour")  # not Lightroom's Oslo, not the file's Lofoten
    assert m.taken_at == "2022-08-03T19:41:07"
    assert m.gps_lat is None  # Lightroom's stem sidecar has GPS, but it is not merged in
    (tmp_path / "IMG_2044.jpg.xmp").unlink()
    m = read_photo_metadata(image, sidecars_of(image))
    assert m.sources == ("IMG_2044.xmp",) and m.title == "Morning ferry, Oslofjord"
    (tmp_path / "IMG_2044.xmp").unlink()
    m = read_photo_metadata(image, sidecars_of(image))
    assert m.sources == ("embedded",) and m.title == "Embedded title" and m.rating == 2 and m.label == "Red"
    assert m.hierarchy == ("Places|Norway|Lofoten",) and m.taken_at == "2020-02-29T07:15:00"


def test_a_sidecar_silent_on_a_group_leaves_it_to_the_embedded_packet(tmp_path):
    image = _jpeg(tmp_path / "IMG_7.jpg", EMBEDDED_PACKET)
    (tmp_path / "IMG_7.jpg.xmp").write_text(
        '<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#">'
        '<rdf:Description rdf:about="" xmlns:xmp="http://ns.adobe.com/xap/1.0/" xmp:Rating="5"/>'
        "</rdf:RDF></x:xmpmeta>", encoding="utf-8")
    m = read_photo_metadata(image, sidecars_of(image))
    assert m.rating == 5 and m.title == "Embedded title" and m.subjects == ("Lofoten", "winter")
    assert m.sources == ("IMG_7.jpg.xmp", "embedded")


@pytest.mark.parametrize("bad", ["billion-laughs.xmp", "truncated", "folder", "too large"])
def test_an_unreadable_sidecar_is_a_problem_naming_it_and_nothing_else_is_lost(tmp_path, bad, monkeypatch):
    image = _jpeg(tmp_path / "IMG_2044.jpg", EMBEDDED_PACKET)
    whole = tmp_path / "IMG_2044.jpg.xmp"
    if bad == "truncated":
        whole.write_bytes((DATA / "darktable.xmp").read_bytes()[:900])
    elif bad == "folder":
        whole.mkdir()
    elif bad == "too large":
        import engine.metadata.photo as photo

        monkeypatch.setattr(photo, "MAX_XMP_BYTES", 3000)  # over darktable's, under digiKam's
        shutil.copy(DATA / "darktable.xmp", whole)
    else:
        shutil.copy(DATA / bad, whole)
    (tmp_path / "IMG_2044.xmp").write_bytes((DATA / "digikam.xmp").read_bytes())
    sidecars = sidecars_of(image)
    m = read_photo_metadata(image, sidecars)
    assert len(m.problems) == 1 and m.problems[0].startswith("IMG_2044.jpg.xmp: "), m.problems
    # The next source takes over: the stem sidecar, then the embedded packet for what it lacks.
    assert m.sources == ("IMG_2044.xmp", "embedded")
    assert m.hierarchy == ("Places|Norway|Flåm", "People|Family") and m.rating == 5
    assert m.title == "Embedded title" and m.label == "Red"


def test_display_keywords_show_each_path_once_and_the_other_flat_keywords():
    from engine.types import PhotoMetadata

    meta = PhotoMetadata(subjects=("Norway", "Oslo", "Places", "Transport", "ferry", "sunrise"),
                         hierarchy=("Places|Norway|Oslo", "Transport|ferry"))
    assert display_keywords(meta) == ["Places › Norway › Oslo", "Transport › ferry", "sunrise"]


# --------------------------------------------------------------------------- embedded packets in real files


def _save(fmt: str, path: Path, xmp: bytes) -> None:
    im = Image.new("RGB", (40, 30), "orange")
    if fmt == "PNG":
        info = PngImagePlugin.PngInfo()
        info.add_itxt("XML:com.adobe.xmp", xmp.decode("utf-8"), zip=True)
        im.save(path, "PNG", pnginfo=info)
    elif fmt == "TIFF":
        im.save(path, "TIFF", tiffinfo={700: xmp})
    else:
        if fmt == "HEIF":
            from engine.indexing.decode import ensure_heif

            ensure_heif()
        im.save(path, fmt, xmp=xmp, **({"quality": 70} if fmt in ("HEIF", "AVIF") else {}))


@pytest.mark.parametrize("fmt,suffix", [("JPEG", ".jpg"), ("PNG", ".png"), ("WEBP", ".webp"), ("TIFF", ".tif"),
                                        ("HEIF", ".heic"), ("AVIF", ".avif")])
def test_the_packet_embedded_in_each_format_is_read(tmp_path, fmt, suffix):
    path = tmp_path / f"picture{suffix}"
    _save(fmt, path, EMBEDDED_PACKET)
    assert read_embedded_xmp(path) == EMBEDDED_PACKET
    m = read_photo_metadata(path)
    assert m.title == "Embedded title" and m.rating == 2 and m.sources == ("embedded",) and not m.problems


def write_dng(path: Path, xmp: bytes, big_endian: bool = False) -> None:
    """A minimal DNG written tag by tag: IFD0 holds a 16x16 16-bit CFA (Bayer RGGB) raw image, the
    DNGVersion 1.4 tag and the XMP packet in tag 700, as Lightroom writes XMP into DNGs."""
    import struct

    e = ">" if big_endian else "<"
    w = h = 16
    pixels = bytes(w * h * 2)
    tags = [  # (tag, type, count, value or bytes): 3 SHORT, 4 LONG, 1 BYTE, 7 UNDEFINED
        (254, 4, 1, 0), (256, 4, 1, w), (257, 4, 1, h), (258, 3, 1, 16), (259, 3, 1, 1), (262, 3, 1, 32803),
        (273, 4, 1, None), (277, 3, 1, 1), (278, 4, 1, h), (279, 4, 1, len(pixels)), (700, 7, len(xmp), xmp),
        (33421, 3, 2, struct.pack(e + "HH", 2, 2)), (33422, 1, 4, bytes([0, 1, 1, 2])),
        (50706, 1, 4, bytes([1, 4, 0, 0])),
    ]
    ifd_size = 2 + 12 * len(tags) + 4
    data_at = 8 + ifd_size
    blobs, entries = b"", []
    for tag, kind, count, value in tags:
        if isinstance(value, bytes) and len(value) > 4:
            entries.append(struct.pack(e + "HHII", tag, kind, count, data_at + len(blobs)))
            blobs += value + (b"\0" if len(value) % 2 else b"")
        elif isinstance(value, bytes):
            entries.append(struct.pack(e + "HHI", tag, kind, count) + value.ljust(4, b"\0"))
        else:
            entries.append((tag, kind, count, value))
    strip_at = data_at + len(blobs)
    ifd = struct.pack(e + "H", len(tags))
    for entry in entries:
        if isinstance(entry, tuple):
            tag, kind, count, value = entry
            value = strip_at if value is None else value
            fmt = "HH" if kind == 3 else "I"
            packed = struct.pack(e + fmt, value, 0) if kind == 3 else struct.pack(e + fmt, value)
            entry = struct.pack(e + "HHI", tag, kind, count) + packed
        ifd += entry
    ifd += struct.pack(e + "I", 0)
    header = (b"MM\x00*" if big_endian else b"II*\x00") + struct.pack(e + "I", 8)
    path.write_bytes(header + ifd + blobs + pixels)


@pytest.mark.parametrize("big_endian", [False, True])
def test_the_packet_embedded_in_a_dng_is_read(tmp_path, big_endian):
    path = tmp_path / "IMG_0001.dng"
    write_dng(path, EMBEDDED_PACKET, big_endian)
    from PIL import TiffImagePlugin

    with open(path, "rb") as f:  # a well-formed TIFF directory: Pillow's own IFD reader reads the tags back
        ifd = TiffImagePlugin.ImageFileDirectory_v2(f.read(8))
        ifd.load(f)
    assert ifd[50706] == b"\x01\x04\x00\x00" and ifd[262] == 32803 and ifd[700] == (EMBEDDED_PACKET,)
    assert read_embedded_xmp(path) == EMBEDDED_PACKET
    assert read_photo_metadata(path).hierarchy == ("Places|Norway|Lofoten",)


def test_no_packet_damaged_containers_and_a_bomb_inside_a_jpeg(tmp_path):
    plain = _jpeg(tmp_path / "plain.jpg")
    assert read_embedded_xmp(plain) is None and read_photo_metadata(plain).is_empty()
    data = (tmp_path / "plain.jpg").read_bytes()
    for name, blob in (("cut.jpg", data[:40]), ("zero.jpg", b""), ("text.jpg", b"hello"),
                       ("bad-tiff.tif", b"II*\x00\xff\xff\xff\x7f" + b"\x00" * 8),
                       ("bad-box.heic", b"\x00\x00\x00\x18ftypheic" + b"\xff" * 16)):
        (tmp_path / name).write_bytes(blob)
        assert read_embedded_xmp(tmp_path / name) is None, name
    bomb = _jpeg(tmp_path / "bomb.jpg", (DATA / "billion-laughs.xmp").read_bytes())
    m = read_photo_metadata(bomb)
    assert m.problems == ("the XMP embedded in bomb.jpg: refused: it declares a DTD or entities (an XML bomb "
                          "or an external reference, which XMP never needs); nothing of it was read",)
    assert m.is_empty()


def test_an_iso_media_uuid_box_packet_is_read(tmp_path):
    """CR3 and other ISO base media files keep XMP in a uuid box (exiftool's QuickTime XMP tag)."""
    from engine.metadata.embedded import XMP_UUID, find_xmp

    ftyp = b"\x00\x00\x00\x18ftypcrx \x00\x00\x00\x01crx isom"
    uuid_box = (8 + 16 + len(EMBEDDED_PACKET)).to_bytes(4, "big") + b"uuid" + XMP_UUID + EMBEDDED_PACKET
    moov = (8 + len(uuid_box)).to_bytes(4, "big") + b"moov" + uuid_box
    blob = ftyp + moov + b"\x00\x00\x00\x10mdat" + b"\x00" * 8
    assert find_xmp(io.BytesIO(blob), len(blob)) == EMBEDDED_PACKET


def test_the_scan_attaches_each_pictures_sidecars(tmp_path):
    from engine.indexing.decode import SUPPORTED_EXTENSIONS
    from engine.indexing.scanner import FileEntry, scan_folder

    (tmp_path / "trip").mkdir()
    for name in ("trip/DSC_1.jpg", "trip/DSC_1.JPG.xmp", "trip/DSC_1.xmp", "trip/.DSC_2.jpg.xmp", "trip/DSC_2.jpg",
                 "IMG_3.png", "notes.xmp"):
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / "IMG_3.png.xmp").symlink_to(tmp_path / "notes.xmp")
    found = {e.rel_path: e for e in scan_folder(tmp_path, SUPPORTED_EXTENSIONS) if isinstance(e, FileEntry)}
    assert set(found) == {"trip/DSC_1.jpg", "trip/DSC_2.jpg", "IMG_3.png"}  # sidecars are not pictures
    assert [(s.name, s.kind) for s in found["trip/DSC_1.jpg"].sidecars] == [("DSC_1.JPG.xmp", WHOLE_NAME),
                                                                            ("DSC_1.xmp", STEM)]
    assert found["trip/DSC_2.jpg"].sidecars == ()  # hidden files are skipped, sidecars too
    (link,) = found["IMG_3.png"].sidecars
    assert link.name == "IMG_3.png.xmp" and link.followed_link and link.path == tmp_path / "IMG_3.png.xmp"


@pytest.mark.timeout(60)
@pytest.mark.skipif(not hasattr(__import__("os"), "mkfifo"), reason="FIFOs are POSIX")
def test_a_sidecar_that_became_a_fifo_is_refused_without_blocking(tmp_path):
    import os

    image = _jpeg(tmp_path / "IMG_9.jpg", EMBEDDED_PACKET)
    shutil.copy(DATA / "darktable.xmp", tmp_path / "IMG_9.jpg.xmp")
    sidecars = sidecars_of(image)  # as scanned: a regular file
    (tmp_path / "IMG_9.jpg.xmp").unlink()
    os.mkfifo(tmp_path / "IMG_9.jpg.xmp")  # swapped after the scan: a plain open() would wait forever
    m = read_photo_metadata(image, sidecars)
    assert m.problems == ("IMG_9.jpg.xmp: not read, it is a FIFO (named pipe)",)
    assert m.title == "Embedded title" and m.sources == ("embedded",)


def test_the_jpeg_standing_for_a_raw_jpeg_pair_gets_the_raws_sidecars(tmp_path):
    """A pair indexed once (the JPEG, by default) is one shot: Lightroom's IMG.xmp marked for the RAW
    and darktable's IMG.RAW.xmp describe it, after the JPEG's own whole-name sidecar."""
    from engine.indexing.decode import RAW_EXTENSIONS, SUPPORTED_EXTENSIONS
    from engine.indexing.scanner import FileEntry, scan_folder, split_raw_pairs, with_pair_sidecars

    (tmp_path / "DSC_4127.NEF").write_bytes(b"left out: never read")
    jpeg = _jpeg(tmp_path / "DSC_4127.JPG", EMBEDDED_PACKET)
    shutil.copy(DATA / "lightroom-classic.xmp", tmp_path / "DSC_4127.xmp")  # SidecarForExtension="NEF"

    def scanned(keep: str) -> dict[str, FileEntry]:
        entries = [e for e in scan_folder(tmp_path, SUPPORTED_EXTENSIONS) if isinstance(e, FileEntry)]
        kept, left_out = split_raw_pairs(entries, keep, RAW_EXTENSIONS)
        return {e.rel_path: e for e in with_pair_sidecars(kept, left_out)}

    def read(e: FileEntry):
        return read_photo_metadata(e.abs_path, e.sidecars, pair_of=e.pair_of)

    (entry,) = scanned("jpeg").values()
    assert entry.rel_path == "DSC_4127.JPG" and entry.pair_of == ("DSC_4127.NEF",)
    m = read(entry)
    assert m.title == "Morning ferry, Oslofjord" and m.rating == 4 and m.sources == ("DSC_4127.xmp",)
    # darktable's sidecar of the RAW outranks Lightroom's stem sidecar; the JPEG's own outranks both.
    shutil.copy(DATA / "darktable.xmp", tmp_path / "DSC_4127.NEF.xmp")
    (entry,) = scanned("jpeg").values()
    assert [s.name for s in entry.sidecars] == ["DSC_4127.xmp", "DSC_4127.NEF.xmp"]
    assert read(entry).title == "Bryggen at dusk" and read(entry).sources[0] == "DSC_4127.NEF.xmp"
    shutil.copy(DATA / "digikam.xmp", tmp_path / "DSC_4127.JPG.xmp")
    (entry,) = scanned("jpeg").values()
    assert read(entry).sources[0] == "DSC_4127.JPG.xmp" and read(entry).rating == 5
    # Both files indexed: each has its own sidecars; Lightroom's stays with the NEF.
    (tmp_path / "DSC_4127.JPG.xmp").unlink()
    (tmp_path / "DSC_4127.NEF.xmp").unlink()
    both = scanned("both")
    assert both["DSC_4127.JPG"].pair_of == () and read(both["DSC_4127.JPG"]).title == "Embedded title"
    assert read(both["DSC_4127.NEF"]).title == "Morning ferry, Oslofjord"
    assert jpeg.exists()
