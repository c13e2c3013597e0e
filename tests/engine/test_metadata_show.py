"""Issue 28, "show it right", on a real SQLite catalog: schema 6 stores every field PhotoMetadata
gained (and a schema-5 file upgrades with a backup, keeping every row); partial dates are shown
partial and sorted and filtered by the start of their period; IPTC dates are labelled; the camera
is named as digiKam and darktable name it and `--camera` finds a camera known only from the
metadata; the GPS filter keeps exactly the pictures within the radius; labels match whatever
scheme wrote them; the view the inspector and `search --json` share."""

from __future__ import annotations

import math
import random
import shutil
import sqlite3
from pathlib import Path

import pytest

from engine.catalog import Catalog, ImageWrite, db
from engine.catalog.camera import camera_display, short_make
from engine.catalog.dates import (
    DATE_FROM_IPTC,
    DATE_FROM_XMP,
    describe_date,
    picture_date,
    whole_date,
)
from engine.catalog.geo import EARTH_RADIUS_KM, MAX_DISTANCE_KM, bounding_box, great_circle_km
from engine.metadata.showing import field_lines, metadata_view, unique_keywords
from engine.options import GPS_RADIUS_KM
from engine.search.filters import FilterError, build_filters
from engine.search.ordering import order_hits
from engine.search.searcher import gap_notes
from engine.types import STATUS_OK, MetadataField, PhotoMetadata, SearchHit
from tests.engine.catalog_versions import make_catalog_at

FULL = PhotoMetadata(
    title="Ferja", description="A ferry", subjects=("Oslo", "ferry"), hierarchy=("Places|Norway|Oslo",), rating=4,
    label="Magenta", taken_at="2023-06", gps_lat=59.9139, gps_lon=10.7522, camera_make="NIKON CORPORATION",
    camera_model="NIKON D750", lens="AF-S NIKKOR 24-70mm f/2.8G ED", pick="accepted", taken_from="iptc",
    titles=(("x-default", "Ferja"), ("de-DE", "Fähre"), ("ja", "フェリー")),
    descriptions=(("x-default", "A ferry"), ("nb-NO", "Ei ferje")),
    fields=(MetadataField("Iptc.Application2.DateCreated", "2023-06", "IMG_1.jpg (IPTC)"),
            MetadataField("Xmp.exif.DateTimeOriginal", "2026-01-02T03:04:05", "IMG_1.jpg.xmp", used=False,
                          note="darktable's copy of the file time"),
            MetadataField("Xmp.dc.subject", "ferry, Oslo", "IMG_1.jpg.xmp")),
    sources=("IMG_1.jpg.xmp", "embedded"), problems=("IMG_1.jpg.xmp: Xmp.xmp.Rating 'five' is not a number",),
    state="s1",
)


def _write(lib_id: int, rel: str, **kw) -> ImageWrite:
    base = dict(library_id=lib_id, rel_path=rel, size=10, mtime_ns=1_600_000_000 * 10**9, content_hash=f"h-{rel}",
                status=STATUS_OK)
    base.update(kw)
    return ImageWrite(**base)


# --------------------------------------------------------------------------- schema 6: storing it all


def test_every_new_field_goes_into_the_catalog_and_comes_back(tmp_path):
    with Catalog(tmp_path / "c.sqlite3") as cat:
        lib = cat.add_library(tmp_path)
        (image_id,) = cat.write_batch("m", [_write(lib.id, "IMG_1.jpg")])
        assert cat.write_metadata([(image_id, FULL)]) == 1
        back = cat.photo_metadata([image_id])[image_id]
        assert back == FULL  # every field, the lists in order, the field records whole
        # Replaced whole: a re-read without them leaves none behind.
        cat.write_metadata([(image_id, PhotoMetadata(state="s2"))])
        empty = cat.photo_metadata([image_id])[image_id]
        assert (empty.camera_make, empty.lens, empty.pick, empty.taken_from, empty.titles, empty.fields) == (
            None, None, None, None, (), ())
        assert cat.metadata_dates([image_id]) == {}


def test_a_schema_5_catalog_upgrades_with_a_backup_keeping_every_row(tmp_path):
    """A real schema-5 file (the frozen steps 1-5) holding a picture and its XMP row: opened, it is
    backed up, then upgraded in place; nothing is lost, the new fields are empty until the next
    scan reads the metadata again (the reader's version), and they can be written."""
    path = tmp_path / "catalog.sqlite3"
    make_catalog_at(path, 5)
    con = sqlite3.connect(path)
    con.execute("INSERT INTO libraries (id, root, status, added_at) VALUES (1, ?, 'online', 1.0)", (str(tmp_path),))
    con.execute("INSERT INTO images (id, library_id, rel_path, size, mtime_ns, status, added_at, updated_at, "
                "camera_make) VALUES (7, 1, 'a.jpg', 1, 1, 'ok', 1.0, 1.0, 'Canon')")
    con.execute("INSERT INTO image_metadata (image_id, state, title, rating, label, label_key, taken_at, gps_lat, "
                "gps_lon, sources, problems, read_at) VALUES (7, 'v5', 'Old title', 3, 'Red', 'red', '2019-04', "
                "59.9, 10.7, '[\"a.jpg.xmp\"]', '[]', 1.0)")
    con.execute("INSERT INTO image_keywords VALUES (7, 'path', 'Places|Norway', 'places|norway')")
    con.commit()
    con.close()
    before = sqlite3.connect(path)
    v5_rows = before.execute("SELECT * FROM image_metadata").fetchall()
    before.close()

    with Catalog(path) as cat:
        assert cat.backup_path is not None
        bak = sqlite3.connect(cat.backup_path)
        assert bak.execute("PRAGMA user_version").fetchone()[0] == 5
        assert bak.execute("SELECT * FROM image_metadata").fetchall() == v5_rows  # the old file, as it was
        bak.close()
        with cat.read() as conn:
            assert db.user_version(conn) == db.SCHEMA_VERSION == 6
            indexes = {r[0] for r in conn.exec_driver_sql("SELECT name FROM sqlite_master WHERE type = 'index'")}
            assert "ix_image_metadata_gps" in indexes
        assert cat.integrity_check() == "ok"
        m = cat.photo_metadata([7])[7]
        assert (m.title, m.rating, m.label, m.taken_at, m.hierarchy, m.state) == (
            "Old title", 3, "Red", "2019-04", ("Places|Norway",), "v5")
        assert (m.camera_make, m.titles, m.descriptions, m.fields, m.taken_from) == (None, (), (), (), None)
        # Read before schema 6, the date's source kind is unknown: it is the XMP date it always was.
        when = picture_date(None, 1, *cat.metadata_dates([7])[7])
        assert (when.shown, when.source) == ("2019-04", DATE_FROM_XMP)
        assert cat.filtered_ids(1, build_filters(label="RED", near="59.9,10.7", km=1)) == {7}
        cat.write_metadata([(7, FULL)])
        assert cat.photo_metadata([7])[7] == FULL
    with Catalog(path) as again:  # opened again: nothing more to do, no second backup
        assert again.backup_path is None


# --------------------------------------------------------------------------- dates


def test_a_partial_date_is_shown_partial_and_sorted_and_filtered_by_its_start(tmp_path):
    month = picture_date(None, 0, "2023-06", "xmp")
    assert (month.date, month.shown, month.source) == ("2023-06-01T00:00:00", "2023-06", DATE_FROM_XMP)
    year = picture_date(None, 0, "2023", "iptc")
    assert (year.date, year.shown, year.source) == ("2023-01-01T00:00:00", "2023", DATE_FROM_IPTC)
    whole = picture_date(None, 0, "2023-06-14T10:22:31", "xmp")
    assert whole.shown == whole.date == "2023-06-14T10:22:31"
    assert picture_date("2020-01-01T08:00:00", 0, "2023", "iptc").shown == "2020-01-01T08:00:00"  # EXIF first
    assert describe_date(year.shown, year.source) == "taken 2023 (IPTC date)"
    assert describe_date(month.shown, month.source) == "taken 2023-06 (XMP date)"
    assert whole_date("2023-06") == "2023-06-01T00:00:00" and whole_date("2023-06-14T10:22:31") == "2023-06-14T10:22:31"

    hits = [SearchHit(rank=i, image_id=i, path=f"/p/{i}", score=1.0, library_id=1, rel_path=str(i), date=d,
                      date_source="xmp") for i, d in enumerate(("2023-05-31T23:00:00", "2023-06", "2023-06-01T00:30:00",
                                                                "2023"), start=1)]
    assert [h.date for h in order_hits(hits, "date-old")] == ["2023", "2023-05-31T23:00:00", "2023-06",
                                                               "2023-06-01T00:30:00"]

    with Catalog(tmp_path / "c.sqlite3") as cat:
        lib = cat.add_library(tmp_path)
        ids = cat.write_batch("m", [_write(lib.id, n) for n in ("june.jpg", "may.jpg")])
        cat.write_metadata([(ids[0], PhotoMetadata(taken_at="2023-06", taken_from="iptc", state="s")),
                            (ids[1], PhotoMetadata(taken_at="2023-05-31", state="s"))])
        assert cat.filtered_ids(lib.id, build_filters(after="2023-06-01")) == {ids[0]}
        assert cat.filtered_ids(lib.id, build_filters(before="2023-06-01")) == {ids[1]}
        assert cat.metadata_dates(ids) == {ids[0]: ("2023-06", "iptc"), ids[1]: ("2023-05-31", None)}


# --------------------------------------------------------------------------- camera


@pytest.mark.parametrize("make,model,shown", [
    ("NIKON CORPORATION", "NIKON D750", "NIKON D750"),
    ("Canon", "Canon EOS 5D Mark IV", "Canon EOS 5D Mark IV"),
    ("SONY", "ILCE-7M3", "SONY ILCE-7M3"),
    ("OLYMPUS IMAGING CORP.", "E-M5", "OLYMPUS E-M5"),
    ("EASTMAN KODAK COMPANY", "KODAK DC4800 ZOOM DIGITAL CAMERA", "KODAK DC4800 ZOOM DIGITAL CAMERA"),
    ("PENTAX Corporation", "PENTAX K-5", "PENTAX K-5"),
    ("Minolta Co., Ltd.", "DiMAGE 7", "Minolta DiMAGE 7"),
    ("Leica Camera AG", "LEICA Q2", "LEICA Q2"),
    ("Canon", "Canonet QL17", "Canon Canonet QL17"),  # a word that starts with the maker is not the maker
    ("Apple", "iPhone 12", "Apple iPhone 12"),
    (None, "X100V", "X100V"),
    ("FUJIFILM", "  ", "FUJIFILM"),
    ("", None, None),
])
def test_the_camera_is_named_as_the_tools_name_it(make, model, shown):
    assert camera_display(make, model) == shown


def test_short_make_drops_company_words_only():
    assert short_make("SAMSUNG TECHWIN CO., LTD.") == "SAMSUNG"
    assert short_make("CASIO COMPUTER CO.,LTD.") == "CASIO"
    assert short_make("Corporation") == "Corporation"  # nothing would be left: kept as written


@pytest.fixture
def cameras(tmp_path):
    cat = Catalog(tmp_path / "c.sqlite3")
    lib = cat.add_library(tmp_path)
    ids = cat.write_batch("m", [
        _write(lib.id, "decoded.jpg", camera_make="NIKON CORPORATION", camera_model="NIKON D750"),
        _write(lib.id, "raw.cr2"),  # the decoder read no camera; its Lightroom sidecar has tiff:Make/Model
        _write(lib.id, "olympus.jpg"),
        _write(lib.id, "none.jpg"),
    ])
    cat.write_metadata([(ids[1], PhotoMetadata(camera_make="Canon", camera_model="Canon EOS R5", state="s")),
                        (ids[2], PhotoMetadata(camera_make="OLYMPUS IMAGING CORP.", camera_model="E-M5", state="s")),
                        (ids[3], PhotoMetadata(state="s"))])
    yield cat, lib, dict(zip(("decoded", "raw", "olympus", "none"), ids, strict=True))
    cat.close()


def test_the_camera_filter_finds_a_camera_known_only_from_the_metadata(cameras):
    cat, lib, i = cameras

    def ids(text):
        return cat.filtered_ids(lib.id, build_filters(camera=text))

    assert ids("eos r5") == {i["raw"]}
    assert ids("canon") == {i["raw"]}
    assert ids("nikon d750") == {i["decoded"]}
    assert ids("OLYMPUS E-M5") == {i["olympus"]}  # the name as shown, not as stored
    assert cat.filter_gaps(lib.id, build_filters(camera="canon")) == {"camera": 1}  # only none.jpg lacks one
    assert cat.metadata_cameras(i.values()) == {i["raw"]: ("Canon", "Canon EOS R5"),
                                                i["olympus"]: ("OLYMPUS IMAGING CORP.", "E-M5")}


# --------------------------------------------------------------------------- GPS


def test_great_circle_distances_match_known_ones():
    assert great_circle_km(59.9139, 10.7522, 59.9139, 10.7522) == 0
    # Oslo - Bergen, 305 km as the crow flies; a quarter of the equator.
    assert great_circle_km(59.9139, 10.7522, 60.3913, 5.3221) == pytest.approx(305.0, abs=1.0)
    assert great_circle_km(0, 0, 0, 90) == pytest.approx(math.pi / 2 * EARTH_RADIUS_KM)
    assert great_circle_km(0, 179.9, 0, -179.9) == pytest.approx(22.24, abs=0.01)  # across the 180th meridian
    assert great_circle_km(90, 0, 90, 120) == pytest.approx(0, abs=1e-9)  # the pole has every longitude
    assert great_circle_km(None, 0, 0, 0) is None
    south, north, lons = bounding_box(0, 179.9, 50)
    assert len(lons) == 2 and lons[0][1] == 180.0 and lons[1][0] == -180.0
    assert bounding_box(89.9, 0, 50)[2] == [(-180.0, 180.0)]


def test_the_gps_filter_keeps_exactly_the_pictures_within_the_radius(tmp_path):
    """Random positions everywhere, with more near the centres (the antimeridian and a pole among
    them): the filter's pictures are exactly those the distance puts within the radius."""
    rng = random.Random(28)
    points = [(rng.uniform(-90, 90), rng.uniform(-180, 180)) for _ in range(300)]
    centres = [(59.9139, 10.7522, 25.0), (-16.5, 179.95, 300.0), (52.0, -179.9, 150.0), (89.5, 0.0, 200.0),
               (0.0, 0.0, 5000.0), (-33.86, 151.21, 0.5)]
    for lat, lon, km in centres:
        for _ in range(60):
            d = km * rng.uniform(0.5, 1.5) / 111.2
            points.append((max(-90.0, min(90.0, lat + rng.uniform(-d, d))),
                           (lon + rng.uniform(-d, d) * 3 + 180) % 360 - 180))
    points.append((-33.86, 151.21))  # exactly at a centre
    with Catalog(tmp_path / "c.sqlite3") as cat:
        lib = cat.add_library(tmp_path)
        ids = cat.write_batch("m", [_write(lib.id, f"p{n}.jpg") for n in range(len(points) + 2)])
        cat.write_metadata([(i, PhotoMetadata(gps_lat=lat, gps_lon=lon, state="s"))
                            for i, (lat, lon) in zip(ids, points, strict=False)]
                           + [(ids[-2], PhotoMetadata(state="s"))])  # no GPS; ids[-1]: metadata never read
        for lat, lon, km in centres:
            want = {i for i, (plat, plon) in zip(ids, points, strict=False) if great_circle_km(lat, lon, plat, plon) <= km}
            got = cat.filtered_ids(lib.id, build_filters(near=f"{lat},{lon}", km=str(km)))
            assert got == want and want, (lat, lon, km)
            # Those without a position are left out, and counted.
            assert cat.filter_gaps(lib.id, build_filters(near=(lat, lon), km=km)) == {"gps": 2}
        every = cat.filtered_ids(lib.id, build_filters(near="0,0", km=MAX_DISTANCE_KM))
        assert MAX_DISTANCE_KM <= GPS_RADIUS_KM.hi < MAX_DISTANCE_KM + 0.1  # the option's range reaches it
        assert every == set(ids[:-2])
    assert gap_notes({"gps": 2}) == ["place filter: 2 pictures with no GPS position left out"]


@pytest.mark.parametrize("kw,message,setting", [
    ({"near": "95,10", "km": 5}, "the 'near' latitude must be from -90 to 90 degrees, got 95", "near"),
    ({"near": "59.9, 190", "km": 5}, "the 'near' longitude must be from -180 to 180 degrees, got 190", "near"),
    ({"near": "Oslo", "km": 5}, "the 'near' position must be a latitude and a longitude in decimal degrees", "near"),
    ({"near": "59,91 10,75", "km": 5}, "the 'near' position must be a latitude and a longitude", "near"),
    ({"near": "nan,10", "km": 5}, "the 'near' position must be", "near"),
    ({"near": (59.9,), "km": 5}, "the 'near' position must be", "near"),
    ({"near": "59.9,10.7", "km": "0"}, "the 'km' radius must be greater than 0, got 0", "km"),
    ({"near": "59.9,10.7", "km": -3}, "the 'km' radius must be greater than 0, got -3", "km"),
    ({"near": "59.9,10.7", "km": "five"}, "the 'km' radius must be a number greater than 0 and at most 20015.2, "
     "got 'five'", "km"),
    ({"near": "59.9,10.7", "km": "inf"}, "the 'km' radius must be a number greater than 0", "km"),
    ({"near": "59.9,10.7", "km": 30000}, "the 'km' radius must be at most 20015.2, got 30000", "km"),
    ({"near": "59.9,10.7"}, "the 'near' position needs a radius: give 'km'", "km"),
    ({"km": 5}, "the 'km' radius needs a 'near' position to measure from", "near"),
])
def test_bad_gps_filter_values_name_the_field(kw, message, setting):
    with pytest.raises(FilterError) as err:
        build_filters(**kw)
    assert str(err.value).startswith(message)
    assert err.value.settings == (setting,) and "--" not in str(err.value)


def test_gps_filter_values_in_every_form():
    assert build_filters(near=" -33.86 , 151.21 ", km=" 0.5 ").near == (-33.86, 151.21)
    assert build_filters(near=[-33.86, 151.21], km=0.5).km == 0.5
    assert build_filters(near="  ", km="").is_empty()
    assert not build_filters(near="0 0", km=1).is_empty()


# --------------------------------------------------------------------------- labels


def test_a_label_matches_whichever_scheme_wrote_it_case_ignored(tmp_path):
    """The reader gives every scheme's label as its name (digiKam's 5 and darktable's 4 as
    "Magenta" / "Purple"; Lightroom's as written): the filter compares names, case ignored."""
    with Catalog(tmp_path / "c.sqlite3") as cat:
        lib = cat.add_library(tmp_path)
        ids = cat.write_batch("m", [_write(lib.id, f"{n}.jpg") for n in range(4)])
        cat.write_metadata([(ids[0], PhotoMetadata(label="Magenta", state="s")),
                            (ids[1], PhotoMetadata(label="MAGENTA", state="s")),
                            (ids[2], PhotoMetadata(label="Purple", state="s")),
                            (ids[3], PhotoMetadata(label="Gray", state="s"))])
        assert cat.filtered_ids(lib.id, build_filters(label="magenta")) == {ids[0], ids[1]}
        assert cat.filtered_ids(lib.id, build_filters(label=" gray ")) == {ids[3]}
        assert cat.filtered_ids(lib.id, build_filters(label="Grey")) == set()  # another word, not another case


# --------------------------------------------------------------------------- the shared view


def test_keywords_are_shown_once_each():
    m = PhotoMetadata(hierarchy=("Places|Norway", "Places|Norway|Oslo", "places|norway|oslo", "Transport|ferry"),
                      subjects=("Places", "Norway", "Oslo", "ferry", "Ferry", "harbour", "HARBOUR"))
    assert unique_keywords(m) == ["Places|Norway|Oslo", "Transport|ferry", "harbour"]
    assert unique_keywords(PhotoMetadata(subjects=("b", "a", "B"))) == ["b", "a"]


def test_the_view_shows_every_field_and_where_it_came_from():
    view = metadata_view(FULL, mtime_ns=0)
    assert view["camera"] == "NIKON D750" and view["lens"] == "AF-S NIKKOR 24-70mm f/2.8G ED"
    assert view["date"] == {"shown": "2023-06", "source": "iptc", "start": "2023-06-01T00:00:00",
                            "text": "taken 2023-06 (IPTC date)"}
    assert view["gps"] == {"lat": 59.9139, "lon": 10.7522}
    assert view["pick"] == "accepted" and view["pick_text"] == "Accepted (pick label)"
    assert view["titles"][1] == {"language": "de-DE", "text": "Fähre"}
    assert view["descriptions"] == [{"language": "x-default", "text": "A ferry"},
                                    {"language": "nb-NO", "text": "Ei ferje"}]
    assert view["keywords"] == ["Places|Norway|Oslo", "ferry"]
    assert field_lines(view) == [
        "Iptc.Application2.DateCreated = 2023-06 — IMG_1.jpg (IPTC)",
        "Xmp.exif.DateTimeOriginal = 2026-01-02T03:04:05 — IMG_1.jpg.xmp (not used: darktable's copy of the file time)",
        "Xmp.dc.subject = ferry, Oslo — IMG_1.jpg.xmp",
    ]
    # The decoder's camera and EXIF date come first, as in every other display.
    view = metadata_view(FULL, exif_date="2020-01-01T08:00:00", image_camera=("SONY", "ILCE-7M3"))
    assert view["camera"] == "SONY ILCE-7M3" and view["date"]["source"] == "exif"
    assert metadata_view(None)["keywords"] == [] and metadata_view(None)["date"] is None


def test_the_backup_of_a_schema_5_catalog_opens_as_schema_6_too(tmp_path):
    """The backup is a plain schema-5 catalog: restoring it (a copy over the catalog) upgrades again."""
    path = tmp_path / "catalog.sqlite3"
    make_catalog_at(path, 5)
    with Catalog(path) as cat:
        backup = cat.backup_path
    assert backup is not None
    restored = tmp_path / "restored.sqlite3"
    shutil.copy(backup, restored)
    with Catalog(Path(restored)) as again:
        assert again.backup_path is not None and again.integrity_check() == "ok"


def test_one_pictures_view_from_the_catalog_as_longlens_show_prints_it(tmp_path):
    from engine.metadata.showing import picture_view, view_lines

    with Catalog(tmp_path / "c.sqlite3") as cat:
        lib = cat.add_library(tmp_path)
        read, unread = cat.write_batch("m", [_write(lib.id, "IMG_1.jpg"),
                                             _write(lib.id, "new.jpg", exif_date="2021-02-03T04:05:06",
                                                    camera_make="SONY", camera_model="ILCE-7M3")])
        cat.write_metadata([(read, FULL)])
        view = picture_view(cat, path=str(tmp_path / "IMG_1.jpg"))
        assert view["image_id"] == read and view["metadata_read"] and view["path"] == str(tmp_path / "IMG_1.jpg")
        assert picture_view(cat, image_id=read) == view
        lines = view_lines(view)
        assert lines[:4] == ["date         taken 2023-06 (IPTC date)",
                             "camera       NIKON D750 · lens AF-S NIKKOR 24-70mm f/2.8G ED",
                             "GPS          59.913900, 10.752200", "title        Ferja"]
        assert "title (de-DE) Fähre" in lines and "description (nb-NO) Ei ferje" in lines
        assert "marks        ★★★★☆ · Magenta label · Accepted (pick label)" in lines
        assert lines[-2] == ("  Xmp.exif.DateTimeOriginal = 2026-01-02T03:04:05 — IMG_1.jpg.xmp (not used: "
                             "darktable's copy of the file time)")
        # Indexed, metadata not read yet: what the decoder read, and why there is no more.
        assert view_lines(picture_view(cat, image_id=unread)) == [
            "date         taken 2021-02-03 04:05:06", "camera       SONY ILCE-7M3",
            "metadata     not read yet (`longlens index` reads it; nothing is embedded again)"]
        assert picture_view(cat, path=str(tmp_path / "elsewhere.jpg")) is None
