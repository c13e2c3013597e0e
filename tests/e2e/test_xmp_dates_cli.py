"""Issue 20 items 2 and 5 together, through the real CLI: a picture without an EXIF date is dated by
the date its XMP gives (a Lightroom stem sidecar's photoshop:DateCreated, a darktable whole-name
sidecar's xmp:CreateDate), not marked as a file time, and sorted and filtered by it; the EXIF date
still wins over an XMP date; only a picture with neither is dated (and marked) by its file time.
The pictures and sidecars stay byte- and mtime-identical."""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path

import numpy as np
import pytest

from engine.samples import procedural_picture, write_image
from tests.dated_pictures import file_state
from tests.e2e.conftest import TINY_MODEL

QUERY = "An old photograph of a harbour with boats under a grey sky."
MODEL = ("--model", TINY_MODEL)
NS = 1_000_000_000

LIGHTROOM_SCAN = """<x:xmpmeta xmlns:x="adobe:ns:meta/" x:xmptk="Adobe XMP Core 7.0-c000 1.000000, 0000/00/00-00:00:00        ">
 <rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#">
  <rdf:Description rdf:about=""
    xmlns:xmp="http://ns.adobe.com/xap/1.0/"
    xmlns:photoshop="http://ns.adobe.com/photoshop/1.0/"
    xmlns:xmpMM="http://ns.adobe.com/xap/1.0/mm/"
    xmlns:dc="http://purl.org/dc/elements/1.1/"
   xmp:MetadataDate="2024-02-02T20:11:05+01:00"
   xmp:Rating="3"
   photoshop:DateCreated="1994-08"
   photoshop:SidecarForExtension="JPG"
   xmpMM:DocumentID="xmp.did:0b1c7e52-91d4-4f6e-a3c8-5d2e19f0a6b3"
   dc:format="image/jpeg">
   <dc:title>
    <rdf:Alt>
     <rdf:li xml:lang="x-default">Grandfather's boat, scanned</rdf:li>
    </rdf:Alt>
   </dc:title>
  </rdf:Description>
 </rdf:RDF>
</x:xmpmeta>
"""

DARKTABLE_EXPORT = """<?xml version="1.0" encoding="UTF-8"?>
<x:xmpmeta xmlns:x="adobe:ns:meta/" x:xmptk="XMP Core 4.4.0-Exiv2">
 <rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#">
  <rdf:Description rdf:about=""
    xmlns:exif="http://ns.adobe.com/exif/1.0/"
    xmlns:xmp="http://ns.adobe.com/xap/1.0/"
    xmlns:xmpMM="http://ns.adobe.com/xap/1.0/mm/"
    xmlns:darktable="http://darktable.sf.net/"
   exif:DateTimeOriginal=""
   xmp:Rating="1"
   xmp:CreateDate="2016-05-20T14:00:00"
   xmpMM:DerivedFrom="export2016.jpg"
   darktable:import_timestamp="63857301227000000"
   darktable:change_timestamp="-1"
   darktable:export_timestamp="-1"
   darktable:print_timestamp="-1"
   darktable:xmp_version="5"
   darktable:raw_params="0"
   darktable:auto_presets_applied="1"
   darktable:history_end="0"
   darktable:iop_order_version="4">
  </rdf:Description>
 </rdf:RDF>
</x:xmpmeta>
"""

# A camera picture whose sidecar also holds a (different) date: the EXIF date wins.
CAMERA_SIDECAR = LIGHTROOM_SCAN.replace('photoshop:DateCreated="1994-08"', 'photoshop:DateCreated="2011-01-01"')


def _ns(when: str) -> int:
    return int(dt.datetime.fromisoformat(when).timestamp()) * NS


def _make_folder(root: Path) -> dict[str, Path]:
    rng = np.random.default_rng(11)
    files = {
        "camera2020": write_image(root / "camera2020.jpg", procedural_picture(rng, (160, 120)), "JPEG",
                                  date="2020:07:15 09:30:00", make="Canon", model="EOS R6", quality=90),
        "scan1994": write_image(root / "scan1994.jpg", procedural_picture(rng, (160, 120)), "JPEG", quality=90),
        "export2016": write_image(root / "export2016.jpg", procedural_picture(rng, (160, 120)), "JPEG", quality=90),
        "plain2021": write_image(root / "plain2021.jpg", procedural_picture(rng, (160, 120)), "JPEG", quality=90),
    }
    (root / "camera2020.xmp").write_text(CAMERA_SIDECAR, encoding="utf-8")
    (root / "scan1994.xmp").write_text(LIGHTROOM_SCAN, encoding="utf-8")  # Lightroom: the stem's sidecar
    (root / "export2016.jpg.xmp").write_text(DARKTABLE_EXPORT, encoding="utf-8")  # darktable: the whole name
    # File times far from the XMP dates: sorting or filtering by them would put these elsewhere.
    for name, when in (("camera2020", "2025-03-03T12:00:00"), ("scan1994", "2024-02-02T12:00:00"),
                       ("export2016", "2025-01-01T12:00:00"), ("plain2021", "2021-06-06T12:00:00")):
        os.utime(files[name], ns=(_ns(when), _ns(when)))
    for sidecar in root.glob("*.xmp"):
        files[sidecar.name] = sidecar
    return files


@pytest.mark.timeout(600)
def test_a_picture_with_only_an_xmp_date_is_dated_sorted_and_filtered_by_it(home, cli, tmp_path):
    root = tmp_path / "scans"
    files = _make_folder(root)
    before = file_state(files)
    summary = cli.json("index", str(root), *MODEL)
    assert summary["new"] == 4 and summary["xmp_problems"] == []
    by_path = {str(p.resolve()): k for k, p in files.items()}

    res = cli.json("search", QUERY, *MODEL)
    got = {by_path[h["path"]]: (h["date"], h["date_source"]) for h in res["results"]}
    assert got == {
        "camera2020": ("2020-07-15T09:30:00", "exif"),  # not its sidecar's 2011, not its file time
        "scan1994": ("1994-08", "xmp"),  # as known: a month, never a made-up midnight (issue 28)
        "export2016": ("2016-05-20T14:00:00", "xmp"),
        "plain2021": ("2021-06-06T12:00:00", "file time"),
    }

    # Sorted by the XMP dates, not by the file times (2024, 2025).
    new = cli.json("search", QUERY, *MODEL, "--sort", "date-new")
    assert [by_path[h["path"]] for h in new["results"]] == ["plain2021", "camera2020", "export2016", "scan1994"]
    rc, out, err = cli("search", QUERY, *MODEL, "--sort", "date-old")
    assert rc == 0, err
    lines = [ln for ln in out.splitlines() if ln.strip()[:1].isdigit()]
    assert [ln.rsplit("/", 1)[-1] for ln in lines] == ["scan1994.jpg", "export2016.jpg", "camera2020.jpg",
                                                        "plain2021.jpg"]
    # Only the picture with neither date is marked as a file time.
    # Sorted by the start of its month, shown as the month.
    assert "  1994-08           " in lines[0] and "00:00" not in lines[0] and "2016-05-20 14:00 " in lines[1]
    assert "2021-06-06 12:00*" in lines[3]
    assert "* no EXIF, XMP or IPTC date: the date shown is the file's modification time" in out

    # The date filter uses the XMP date, and says nothing about file times when none was used.
    rc, out, err = cli("search", QUERY, *MODEL, "--before", "2000-01-01", "--json")
    assert rc == 0, err
    assert [by_path[h["path"]] for h in json.loads(out)["results"]] == ["scan1994"]
    assert "date filter" not in err
    rc, out, err = cli("search", QUERY, *MODEL, "--after", "2016-05-01", "--before", "2016-05-31", "--json")
    assert [by_path[h["path"]] for h in json.loads(out)["results"]] == ["export2016"]
    assert "date filter" not in err
    rc, out, err = cli("search", QUERY, *MODEL, "--after", "2021-01-01", "--json")
    assert [by_path[h["path"]] for h in json.loads(out)["results"]] == ["plain2021"]
    assert "note: date filter: 1 picture with no EXIF, XMP or IPTC date dated by the file's modification time instead" in err

    assert file_state(files) == before  # pictures and sidecars untouched
