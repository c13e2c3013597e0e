"""Issue 28, acceptance: the search filters keep exactly the right pictures of a library whose
metadata only the real tools wrote (exiftool, Debian's exiv2, darktable-cli, pidng's DNG tags,
Photoshop CS5's own XMP), through the real CLI: `longlens index`, then `longlens search --json`
with `--camera`, `--keyword`, `--rating`, `--label`, `--after`/`--before` and `--near LAT,LON --km R`."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.interop import realfiles as rf

pytestmark = pytest.mark.interop

ALL = {"nikon.jpg", "canon.tif", "lightroom.dng", "darktable.jpg", "windows.jpg", "exiv2.jpg", "hubble.jpg",
       "camera.dng"}


def build(folder: Path, work: Path) -> None:
    """Eight pictures; every tag by a real tool (what each writes, and where, in the comments)."""
    # A Nikon JPEG: EXIF camera, date (sub-seconds, offset) and GPS (Oslo), IPTC keyword; exiftool.
    p = rf.write_jpeg(folder / "nikon.jpg", "astronaut.png")
    rf.exiftool(p, f"-Make={rf.NIKON_MAKE}", f"-Model={rf.NIKON_MODEL}", "-DateTimeOriginal=2021:07:14 18:03:52",
                "-SubSecTimeOriginal=25", "-OffsetTimeOriginal=+02:00", "-GPSLatitude=59.9139", "-GPSLatitudeRef=N",
                "-GPSLongitude=10.7522", "-GPSLongitudeRef=E", "-IPTC:Keywords=Oslo")
    # A Canon TIFF: EXIF camera, date and GPS (Bergen) by exiftool; digiKam's sidecar fields
    # (orange colour label, a tag under Places/Norway) by exiftool.
    p = rf.write_tiff(folder / "canon.tif", "coffee.png")
    rf.exiftool(p, "-Make=Canon", "-Model=Canon EOS 5D Mark IV", "-DateTimeOriginal=2019:05:04 10:11:12",
                "-GPSLatitude=60.3913", "-GPSLatitudeRef=N", "-GPSLongitude=5.3221", "-GPSLongitudeRef=E")
    rf.exiftool(p.with_name(p.name + ".xmp"), "-XMP-digiKam:ColorLabel=2", "-XMP-digiKam:TagsList=Places/Norway/Bergen")
    # A DNG from pidng with no camera tags; its Lightroom sidecar (IMG.xmp, SidecarForExtension DNG)
    # by exiftool: the camera (tiff:Make/Model), 5 stars, Red, the keyword tree, a partial date
    # (June 2023) and GPS by the Oslo opera.
    p = rf.write_dng(folder / "lightroom.dng", "chelsea.png", make=None, model=None)
    rf.exiftool(p.with_suffix(".xmp"), "-XMP-photoshop:SidecarForExtension=DNG", f"-XMP-tiff:Make={rf.NIKON_MAKE}",
                f"-XMP-tiff:Model={rf.NIKON_MODEL}", "-XMP-xmp:Rating=5", "-XMP-xmp:Label=Red",
                "-XMP-lr:HierarchicalSubject=Places|Norway|Oslo", "-XMP-dc:Subject=Places", "-XMP-dc:Subject=Norway",
                "-XMP-dc:Subject=Oslo", "-XMP-photoshop:DateCreated=2023:06", "-XMP-exif:GPSLatitude=59.9075",
                "-XMP-exif:GPSLongitude=10.7531")
    # A JPEG without an EXIF date (file time 2026-01-10) through darktable-cli: 3 stars, green and
    # the tag 'harbour' (exiftool wrote them into the sidecar; darktable re-serialised it, with its
    # invented exif:DateTimeOriginal = the file time).
    p = rf.write_jpeg(folder / "darktable.jpg", "rocket.jpg")
    rf.exiftool(p.with_name(p.name + ".xmp"), "-XMP-xmp:Rating=3", "-XMP-darktable:colorlabels=2",
                "-XMP-lr:HierarchicalSubject=harbour")
    rf.set_mtime(p, "2026-01-10 08:00:00")
    rf.darktable(p, work / "darktable")
    # What Windows Explorer writes: EXIF Rating and RatingPercent and MicrosoftPhoto:Rating (4
    # stars); a Fujifilm camera, a date and GPS (Tromsø); exiftool.
    p = rf.write_jpeg(folder / "windows.jpg", "retina.jpg")
    rf.exiftool(p, "-EXIF:Rating=4", "-EXIF:RatingPercent=75", "-XMP-microsoft:RatingPercent=75", "-Make=FUJIFILM",
                "-Model=X-T3", "-DateTimeOriginal=2022:12:24 15:00:00", "-GPSLatitude=69.6492", "-GPSLatitudeRef=N",
                "-GPSLongitude=18.9553", "-GPSLongitudeRef=E")
    # exiv2: IPTC keyword and EXIF date and GPS (New York) in the JPEG; a sidecar with Red and 2 stars.
    p = rf.write_jpeg(folder / "exiv2.jpg", "coffee.png")
    rf.exiv2(p, "add Iptc.Application2.Keywords String Fjord", "set Exif.Photo.DateTimeOriginal Ascii 2020:02:02 12:00:00",
             "set Exif.GPSInfo.GPSLatitudeRef Ascii N", "set Exif.GPSInfo.GPSLatitude Rational 40/1 42/1 46/1",
             "set Exif.GPSInfo.GPSLongitudeRef Ascii W", "set Exif.GPSInfo.GPSLongitude Rational 74/1 0/1 22/1")
    rf.exiv2(rf.new_sidecar(p.with_name(p.name + ".xmp")), "set Xmp.xmp.Label Red", "set Xmp.xmp.Rating 2")
    # Photoshop CS5's JPEG as scikit-image ships it: xmp:CreateDate 2012-06-29 (no EXIF date).
    rf.copy_original(folder / "hubble.jpg", "hubble_deep_field.jpg")
    # pidng's DNG with the camera's tags (NIKON CORPORATION / NIKON D750) and exiftool's EXIF date.
    p = rf.write_dng(folder / "camera.dng", "astronaut.png")
    rf.exiftool(p, "-DateTimeOriginal=2024:03:02 10:11:12")


@pytest.fixture(scope="module")
def longlens(tmp_path_factory, blip_tiny_checkpoint) -> rf.LonglensHome:
    root = tmp_path_factory.mktemp("interop-filters")
    build(root / "library", root / "work")
    ll = rf.LonglensHome(root / "home", blip_tiny_checkpoint)
    summary = ll.index(root / "library")
    assert summary["new"] == len(ALL), summary
    assert set(ll.search()) == ALL
    return ll


FILTERS = [
    (("--camera", "D750"), {"nikon.jpg", "lightroom.dng", "camera.dng"}),  # EXIF, XMP tiff:Model, pidng
    (("--camera", "NIKON D750"), {"nikon.jpg", "lightroom.dng", "camera.dng"}),  # as the camera is shown
    (("--camera", "canon"), {"canon.tif"}),
    (("--camera", "FUJIFILM X-T3"), {"windows.jpg"}),
    (("--keyword", "Places|Norway"), {"canon.tif", "lightroom.dng"}),  # digiKam's TagsList, Lightroom's tree
    (("--keyword", "Oslo"), {"nikon.jpg", "lightroom.dng"}),  # IPTC, dc:subject
    (("--keyword", "harbour"), {"darktable.jpg"}),
    (("--keyword", "Fjord"), {"exiv2.jpg"}),
    (("--rating", "4"), {"lightroom.dng", "windows.jpg"}),  # xmp:Rating 5; Windows' EXIF/Microsoft 4
    (("--rating", "3"), {"lightroom.dng", "windows.jpg", "darktable.jpg"}),
    (("--label", "red"), {"lightroom.dng", "exiv2.jpg"}),
    (("--label", "Orange"), {"canon.tif"}),  # digiKam:ColorLabel 2
    (("--label", "green"), {"darktable.jpg"}),  # darktable:colorlabels 2
    (("--after", "2021-01-01", "--before", "2023-01-01"), {"nikon.jpg", "windows.jpg"}),
    (("--after", "2023-01-01", "--before", "2024-01-01"), {"lightroom.dng"}),  # June 2023 (partial XMP date)
    (("--before", "2015-01-01"), {"hubble.jpg"}),  # Photoshop's xmp:CreateDate
    (("--after", "2024-01-01", "--before", "2025-01-01"), {"camera.dng"}),
    (("--near", "59.91,10.75", "--km", "5"), {"nikon.jpg", "lightroom.dng"}),  # EXIF GPS; XMP GPS
    (("--near", "60.39,5.32", "--km", "10"), {"canon.tif"}),
    (("--near", "59.91,10.75", "--km", "400"), {"nikon.jpg", "lightroom.dng", "canon.tif"}),  # Bergen: 305 km
    (("--near", "40.71,-74.01", "--km", "50"), {"exiv2.jpg"}),  # west and north refs
    (("--near", "69.65,18.96", "--km", "2", "--rating", "4"), {"windows.jpg"}),
]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("flags, expected", [pytest.param(f, e, id=" ".join(f)) for f, e in FILTERS])
def test_a_filter_keeps_exactly_the_right_pictures(longlens, flags, expected):
    assert set(longlens.search(*flags)) == expected
