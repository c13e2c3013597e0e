"""Issue 28 point 1: the XMP vocabulary the ecosystem writes (digiKam's colour and pick labels,
photoshop:Urgency as digiKam reads it, MWG keyword trees, the camera and lens in XMP, Windows'
percent rating, titles and descriptions in every language), and JPEG extended XMP joined."""

from __future__ import annotations

import hashlib
import io
import struct
from pathlib import Path

import pytest
from PIL import Image

from engine.metadata import parse_xmp, read_photo_metadata
from engine.metadata.embedded import MAX_EXTENDED_GUIDS, read_embedded_xmp_parts

NAMESPACES = (
    'xmlns:dc="http://purl.org/dc/elements/1.1/" xmlns:xmp="http://ns.adobe.com/xap/1.0/" '
    'xmlns:digiKam="http://www.digikam.org/ns/1.0/" xmlns:photoshop="http://ns.adobe.com/photoshop/1.0/" '
    'xmlns:darktable="http://darktable.sf.net/" xmlns:tiff="http://ns.adobe.com/tiff/1.0/" '
    'xmlns:exifEX="http://cipa.jp/exif/1.0/" xmlns:aux="http://ns.adobe.com/exif/1.0/aux/" '
    'xmlns:MicrosoftPhoto="http://ns.microsoft.com/photo/1.0/" '
    'xmlns:mwg-kw="http://www.metadataworkinggroup.com/schemas/keywords/" '
    'xmlns:lr="http://ns.adobe.com/lightroom/1.0/" xmlns:xmpNote="http://ns.adobe.com/xmp/note/"'
)


def _packet(attrs: str = "", body: str = "") -> bytes:
    return (f'<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#">'
            f'<rdf:Description rdf:about="" {NAMESPACES} {attrs}>{body}</rdf:Description></rdf:RDF></x:xmpmeta>'
            ).encode()


def _parse(attrs: str = "", body: str = ""):
    return parse_xmp(_packet(attrs, body), "IMG.jpg.xmp")


def _field(packet, name):
    return next(f for f in packet.fields if f.name == name)


# --------------------------------------------------------------------------- labels and picks


@pytest.mark.parametrize(("number", "name"), [(1, "Red"), (2, "Orange"), (3, "Yellow"), (4, "Green"), (5, "Blue"),
                                              (6, "Magenta"), (7, "Gray"), (8, "Black"), (9, "White")])
def test_digikams_colour_label_numbers_are_named(number, name):
    assert _parse(f'digiKam:ColorLabel="{number}"').values["label"] == name


def test_the_colour_label_schemes_in_order_xmp_label_digikam_darktable_urgency():
    both = _parse('xmp:Label="Rot" digiKam:ColorLabel="2" photoshop:Urgency="2"')
    assert both.values["label"] == "Rot"  # as written, a German Lightroom's name
    assert _field(both, "Xmp.digiKam.ColorLabel").used is False
    assert _field(both, "Xmp.digiKam.ColorLabel").note == "xmp:Label is the colour label"
    dk = _parse('digiKam:ColorLabel="7"', "<darktable:colorlabels><rdf:Seq><rdf:li>3</rdf:li></rdf:Seq>"
                "</darktable:colorlabels>")
    assert dk.values["label"] == "Gray"
    assert _parse("", "<darktable:colorlabels><rdf:Seq><rdf:li>3</rdf:li></rdf:Seq></darktable:colorlabels>"
                  ).values["label"] == "Blue"
    # Nikon NX's colour label, which digiKam reads when it has no ColorLabel of its own.
    assert _parse('photoshop:Urgency="6"').values["label"] == "Magenta"
    none = _parse('digiKam:ColorLabel="0" photoshop:Urgency="0"')
    assert "label" not in none.values and _field(none, "Xmp.digiKam.ColorLabel").note == "0 is no colour label"


def test_a_bad_colour_label_number_is_a_problem_of_that_field_only():
    p = _parse('digiKam:ColorLabel="12" xmp:Rating="3" digiKam:PickLabel="7"')
    assert p.problems == ["IMG.jpg.xmp: digiKam:ColorLabel '12' is not a colour label from 0 to 9; not read",
                          "IMG.jpg.xmp: digiKam:PickLabel '7' is not a pick label from 0 to 3; not read"]
    assert "label" not in p.values and "pick" not in p.values and p.values["rating"] == 3


@pytest.mark.parametrize(("number", "pick"), [(1, "rejected"), (2, "pending"), (3, "accepted")])
def test_digikams_pick_label(number, pick):
    assert _parse(f'digiKam:PickLabel="{number}"').values["pick"] == pick
    assert "pick" not in _parse('digiKam:PickLabel="0"').values


# --------------------------------------------------------------------------- ratings, camera, lens, text


def test_microsoft_photos_percent_rating_is_read_when_there_is_no_xmp_rating():
    assert _parse('MicrosoftPhoto:Rating="75"').values["rating"] == 4
    both = _parse('xmp:Rating="2" MicrosoftPhoto:Rating="99"')
    assert both.values["rating"] == 2 and _field(both, "Xmp.MicrosoftPhoto.Rating").used is False


def test_microsofts_namespace_as_exiftool_spells_it_without_the_final_slash():
    packet = (b'<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#">'
              b'<rdf:Description rdf:about="" xmlns:MicrosoftPhoto="http://ns.microsoft.com/photo/1.0">'
              b'<MicrosoftPhoto:Rating>50</MicrosoftPhoto:Rating></rdf:Description></rdf:RDF></x:xmpmeta>')
    parsed = parse_xmp(packet, "IMG.jpg")
    assert parsed.values["rating"] == 3
    assert _field(parsed, "Xmp.MicrosoftPhoto.Rating").value == "50"


def test_camera_and_lens_in_xmp():
    p = _parse('tiff:Make="FUJIFILM" tiff:Model="X-T4" aux:Lens="XF23mmF1.4 R"')
    assert p.values["camera"] == ("FUJIFILM", "X-T4") and p.values["lens"] == "XF23mmF1.4 R"
    both = _parse('exifEX:LensModel="RF24-70mm F2.8 L IS USM" aux:Lens="24-70"')
    assert both.values["lens"] == "RF24-70mm F2.8 L IS USM"
    assert _field(both, "Xmp.aux.Lens").used is False


def test_titles_and_descriptions_in_every_language_x_default_first(tmp_path):
    body = ('<dc:title><rdf:Alt><rdf:li xml:lang="nb-NO">Ferja</rdf:li><rdf:li xml:lang="x-default">The ferry'
            '</rdf:li></rdf:Alt></dc:title><dc:description><rdf:Alt><rdf:li xml:lang="de">Die Fähre</rdf:li>'
            '</rdf:Alt></dc:description><dc:creator><rdf:Seq><rdf:li>Kari</rdf:li><rdf:li>Ola</rdf:li></rdf:Seq>'
            '</dc:creator>')
    pic = tmp_path / "f.jpg"
    Image.new("RGB", (8, 8)).save(pic)
    (tmp_path / "f.jpg.xmp").write_bytes(_packet('photoshop:Headline="Ferries" photoshop:City="Oslo" '
                                                 'photoshop:Country="Norway"', body))
    from engine.metadata import SidecarFile
    st = (tmp_path / "f.jpg.xmp").stat()
    meta = read_photo_metadata(pic, [SidecarFile("f.jpg.xmp", tmp_path / "f.jpg.xmp", st.st_size, st.st_mtime_ns,
                                                 kind="whole name")])
    assert meta.title == "The ferry" and meta.titles == (("x-default", "The ferry"), ("nb-NO", "Ferja"))
    assert meta.description == "Die Fähre" and meta.descriptions == (("de", "Die Fähre"),)
    shown = {f.name: f.value for f in meta.fields}
    assert shown["Xmp.dc.title"] == 'lang="x-default" The ferry, lang="nb-NO" Ferja'
    assert shown["Xmp.dc.creator"] == "Kari, Ola"
    assert shown["Xmp.photoshop.Headline"] == "Ferries"
    assert (shown["Xmp.photoshop.City"], shown["Xmp.photoshop.Country"]) == ("Oslo", "Norway")


# --------------------------------------------------------------------------- MWG keyword trees


MWG_ELEMENTS = """<mwg-kw:Keywords rdf:parseType="Resource"><mwg-kw:Hierarchy><rdf:Bag>
 <rdf:li rdf:parseType="Resource"><mwg-kw:Keyword>Places</mwg-kw:Keyword><mwg-kw:Children><rdf:Bag>
  <rdf:li rdf:parseType="Resource"><mwg-kw:Keyword>Norway</mwg-kw:Keyword><mwg-kw:Applied>True</mwg-kw:Applied>
   <mwg-kw:Children><rdf:Bag><rdf:li rdf:parseType="Resource"><mwg-kw:Keyword>Oslo</mwg-kw:Keyword></rdf:li>
   </rdf:Bag></mwg-kw:Children></rdf:li></rdf:Bag></mwg-kw:Children></rdf:li>
 <rdf:li rdf:parseType="Resource"><mwg-kw:Keyword>ferry</mwg-kw:Keyword></rdf:li>
 <rdf:li rdf:parseType="Resource"><mwg-kw:Keyword>draft</mwg-kw:Keyword><mwg-kw:Applied>False</mwg-kw:Applied></rdf:li>
</rdf:Bag></mwg-kw:Hierarchy></mwg-kw:Keywords>"""

# The same tree as exiv2 (and so darktable) serialises structures: fields as attributes.
MWG_ATTRIBUTES = """<mwg-kw:Keywords><rdf:Description><mwg-kw:Hierarchy><rdf:Bag>
 <rdf:li><rdf:Description mwg-kw:Keyword="Places"><mwg-kw:Children><rdf:Bag>
  <rdf:li><rdf:Description mwg-kw:Keyword="Norway" mwg-kw:Applied="True"><mwg-kw:Children><rdf:Bag>
   <rdf:li mwg-kw:Keyword="Oslo"/></rdf:Bag></mwg-kw:Children></rdf:Description></rdf:li>
 </rdf:Bag></mwg-kw:Children></rdf:Description></rdf:li>
 <rdf:li mwg-kw:Keyword="ferry"/><rdf:li mwg-kw:Keyword="draft" mwg-kw:Applied="False"/>
</rdf:Bag></mwg-kw:Hierarchy></rdf:Description></mwg-kw:Keywords>"""


@pytest.mark.parametrize("tree", [MWG_ELEMENTS, MWG_ATTRIBUTES], ids=["elements", "attributes"])
def test_mwg_keyword_trees_become_paths(tree):
    p = _parse(body=tree)
    assert p.problems == []
    # Leaves, and inner nodes marked Applied; not a leaf marked Applied="False".
    assert p.values["keywords"] == ((), ("Places|Norway", "Places|Norway|Oslo", "ferry"))


def test_mwg_paths_join_the_other_keyword_lists_once():
    p = _parse(body=MWG_ELEMENTS + "<lr:hierarchicalSubject><rdf:Bag><rdf:li>Places|Norway|Oslo</rdf:li>"
               "</rdf:Bag></lr:hierarchicalSubject>")
    assert p.values["keywords"][1] == ("Places|Norway|Oslo", "Places|Norway", "ferry")


# --------------------------------------------------------------------------- JPEG extended XMP


def _segment(payload: bytes) -> bytes:
    return b"\xff\xe1" + struct.pack(">H", len(payload) + 2) + payload


def _extended_jpeg(path: Path, *, extended: bytes, guid: str | None = None, chunk: int = 60_000,
                   drop: int | None = None, full: int | None = None) -> Path:
    """A JPEG with a main packet naming `guid` (the MD5 of `extended` unless given) and `extended`
    split into APP1 extension segments of `chunk` bytes (`drop`: the index of one left out)."""
    real = hashlib.md5(extended).hexdigest().upper()
    guid = guid or real
    main = _packet(f'xmp:Rating="4" xmpNote:HasExtendedXMP="{guid}"',
                   "<dc:title><rdf:Alt><rdf:li xml:lang='x-default'>Main title</rdf:li></rdf:Alt></dc:title>")
    segments = [_segment(b"http://ns.adobe.com/xap/1.0/\x00" + main)]
    parts = [extended[i:i + chunk] for i in range(0, len(extended), chunk)]
    for i, part in enumerate(parts):
        if i == drop:
            continue
        header = guid.encode() + struct.pack(">II", full or len(extended), i * chunk)
        segments.append(_segment(b"http://ns.adobe.com/xmp/extension/\x00" + header + part))
    buf = io.BytesIO()
    Image.new("RGB", (16, 16), "navy").save(buf, "JPEG")
    jpeg = buf.getvalue()
    path.write_bytes(jpeg[:2] + b"".join(segments) + jpeg[2:])
    return path


def _keywords(n: int) -> bytes:
    items = "".join(f"<rdf:li>keyword {i:05d} {'x' * 40}</rdf:li>" for i in range(n))
    return _packet(body=f"<dc:subject><rdf:Bag>{items}</rdf:Bag></dc:subject>"
                        "<dc:title><rdf:Alt><rdf:li xml:lang='x-default'>Extended title</rdf:li></rdf:Alt></dc:title>")


def test_a_jpegs_extended_xmp_is_joined_and_merged_with_the_main_packet(tmp_path):
    pic = _extended_jpeg(tmp_path / "big.jpg", extended=_keywords(2500))
    meta = read_photo_metadata(pic)
    assert meta.problems == ()
    assert len(meta.subjects) == 2500 and meta.subjects[0].startswith("keyword 00000")
    assert meta.title == "Main title"  # the main packet wins where both say something
    assert meta.rating == 4


@pytest.mark.parametrize(("kind", "message"), [
    ("md5", "does not match its MD5"),
    ("missing part", "is incomplete"),
    ("no extension", "names an extended packet"),
])
def test_an_extended_packet_that_does_not_add_up_is_a_problem_and_the_main_packet_is_kept(tmp_path, kind, message):
    extended = _keywords(2500)
    if kind == "md5":
        pic = _extended_jpeg(tmp_path / "x.jpg", extended=extended, guid="0" * 32)
    elif kind == "missing part":
        pic = _extended_jpeg(tmp_path / "x.jpg", extended=extended, drop=1)
    else:
        pic = _extended_jpeg(tmp_path / "x.jpg", extended=extended)
        signature = b"http://ns.adobe.com/xmp/extension/\x00"
        pic.write_bytes(pic.read_bytes().replace(signature, b"http://example.org/".ljust(len(signature) - 1, b"x")
                                                 + b"\x00"))
    meta = read_photo_metadata(pic)
    assert meta.subjects == () and meta.title == "Main title" and meta.rating == 4
    assert len(meta.problems) == 1 and "x.jpg" in meta.problems[0] and message in meta.problems[0]


def test_extended_parts_past_their_bounds_are_left_out(tmp_path):
    # A part claiming a full length over the limit, and more GUIDs than are gathered.
    pic = _extended_jpeg(tmp_path / "huge.jpg", extended=_keywords(10), full=1 << 31)
    found = read_embedded_xmp_parts(pic)
    assert found is not None and found.extended is None
    assert any("past its bounds" in p for p in found.problems)
    extended = _keywords(10)
    pieces = [_segment(b"http://ns.adobe.com/xmp/extension/\x00" + f"{i:032X}".encode() + struct.pack(">II", 10, 0)
                       + b"0123456789") for i in range(MAX_EXTENDED_GUIDS + 3)]
    pic = _extended_jpeg(tmp_path / "many.jpg", extended=extended)
    data = pic.read_bytes()
    pic.write_bytes(data[:2] + b"".join(pieces) + data[2:])
    found = read_embedded_xmp_parts(pic)
    assert found.extended == extended  # the right one is still joined
    assert sum("past its bounds" in p for p in found.problems) == 3
