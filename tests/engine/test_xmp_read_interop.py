"""Issue 28 point 1 against the real tools (make test-interop): darktable-cli's invented sidecar
date, exiftool's extended XMP and IPTC-IIM, read back by Longlens."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from PIL import Image

from engine.metadata import SidecarFile, display_keywords, read_photo_metadata

pytestmark = pytest.mark.interop


def _tool(name: str) -> str:
    path = shutil.which(name)
    assert path, f"{name} is not installed (make test-interop installs it)"
    return path


def _exiftool(*args: str | Path) -> None:
    subprocess.run([_tool("exiftool"), "-q", "-overwrite_original", *map(str, args)], check=True, timeout=120)


def _whole_name_sidecar(pic: Path) -> list[SidecarFile]:
    side = pic.with_name(pic.name + ".xmp")
    st = side.stat()
    return [SidecarFile(side.name, side, st.st_size, st.st_mtime_ns, kind="whole name")]


def test_darktable_clis_invented_date_gives_way_to_the_embedded_create_date(tmp_path):
    pic = tmp_path / "pic.jpg"
    Image.new("RGB", (64, 48), "teal").save(pic)
    _exiftool("-XMP-xmp:CreateDate=2019:05:04 12:13:14", "-IPTC:Keywords=alpha", "-IPTC:Keywords=beta",
              "-XMP-dc:Subject=alpha", "-XMP-dc:Subject=beta", pic)
    stamp = time.mktime((2026, 11, 1, 10, 0, 0, 0, 0, -1))
    os.utime(pic, (stamp, stamp))
    subprocess.run([_tool("darktable-cli"), str(pic), str(tmp_path / "out.jpg"), "--core", "--configdir",
                    str(tmp_path / "dt"), "--library", ":memory:", "--conf", "write_sidecar_files=on import"],
                   check=True, timeout=300, capture_output=True)
    sidecar = (tmp_path / "pic.jpg.xmp").read_text(encoding="utf-8")
    assert 'exif:DateTimeOriginal="2026:11:01 10:00:00' in sidecar  # what darktable invents
    meta = read_photo_metadata(pic, _whole_name_sidecar(pic))
    assert meta.taken_at == "2019-05-04T12:13:14" and meta.taken_from == "xmp"
    invented = next(f for f in meta.fields if f.name == "Xmp.exif.DateTimeOriginal")
    assert invented.used is False and "file time" in invented.note
    # darktable lists each tag in dc:subject and lr:hierarchicalSubject, and IPTC has them too: once each.
    assert display_keywords(meta) == ["alpha", "beta"]


def test_exiftools_extended_xmp_is_joined(tmp_path):
    pic = tmp_path / "ext.jpg"
    Image.new("RGB", (64, 48), "teal").save(pic)
    words = [f"keyword-{i:04d}-" + "x" * 40 for i in range(2500)]
    args = tmp_path / "args.txt"
    args.write_text("".join(f"-XMP-dc:Subject={w}\n" for w in words) + "-XMP-dc:Title=Main title\n", encoding="utf-8")
    _exiftool("-@", args, pic)
    out = subprocess.run([_tool("exiftool"), "-s3", "-XMP-xmpNote:HasExtendedXMP", str(pic)], check=True,
                         capture_output=True, text=True).stdout.strip()
    assert len(out) == 32  # exiftool did move dc:subject into the extended packet
    meta = read_photo_metadata(pic)
    assert meta.problems == () and meta.subjects == tuple(words) and meta.title == "Main title"


def test_exiftools_iptc_and_exif_are_read(tmp_path):
    pic = tmp_path / "agency.jpg"
    Image.new("RGB", (64, 48), "teal").save(pic)
    _exiftool("-IPTC:Keywords=Oslo", "-IPTC:Caption-Abstract=Ferry at Aker Brygge", "-IPTC:Headline=Ferries",
              "-IPTC:DateCreated=2019:05:04", "-IPTC:TimeCreated=12:13:14+02:00", "-IPTC:By-line=Kari",
              "-IPTC:City=Oslo", "-IPTC:Country-PrimaryLocationName=Norway", "-EXIF:Make=NIKON CORPORATION",
              "-EXIF:Model=NIKON D750", "-EXIF:GPSLatitude=59.9", "-EXIF:GPSLatitudeRef=N",
              "-EXIF:GPSLongitude=10.75", "-EXIF:GPSLongitudeRef=E", "-EXIF:Rating=3", pic)
    meta = read_photo_metadata(pic)
    assert meta.problems == ()
    assert meta.subjects == ("Oslo",) and meta.description == "Ferry at Aker Brygge"
    assert meta.taken_at == "2019-05-04T12:13:14" and meta.taken_from == "iptc"
    assert (meta.camera_make, meta.camera_model) == ("NIKON CORPORATION", "NIKON D750")
    assert (meta.gps_lat, meta.gps_lon) == (pytest.approx(59.9), pytest.approx(10.75))
    assert meta.rating == 3
    shown = {f.name: f.value for f in meta.fields}
    assert shown["Iptc.Application2.Headline"] == "Ferries" and shown["Iptc.Application2.Byline"] == "Kari"
    assert shown["Iptc.Application2.CountryName"] == "Norway"
