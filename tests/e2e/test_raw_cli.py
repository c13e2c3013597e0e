"""A photographer's RAW folder through the real `longlens index`: generated DNGs (LibRaw opens
them), a RAW+JPEG pair indexed once by default and both when asked, unreadable RAWs with their
reasons, the RAW's own date/camera/orientation in the catalog, the same choice and message from
the flag and the settings file, and the originals untouched."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from engine.catalog import Catalog
from engine.samples import marker_picture, stored_for_orientation, write_dng, write_image
from engine.types import STATUS_OK

MESSAGE = "RAW+JPEG pairs must be one of jpeg, raw, both, got 'jpg'"


def _fingerprints(folder: Path) -> dict[str, tuple[str, int]]:
    return {str(p.relative_to(folder)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def raw_folder(tmp_path) -> Path:
    folder = tmp_path / "shoot"
    upright = marker_picture((256, 192))
    # RAW+JPEG: the camera's DNG (held upright, orientation 6) and its JPEG of the same name.
    stored = stored_for_orientation(upright, 6)
    write_dng(folder / "IMG_0001.DNG", stored, orientation=6, preview=stored.resize((96, 128)),
              date="2024:03:02 10:11:12", make="Longlens", model="LL-1")
    write_image(folder / "IMG_0001.JPG", stored, "JPEG", orientation=6, date="2024:03:02 10:11:12",
                make="Longlens", model="LL-1", quality=90)
    # A RAW alone (orientation 8, no preview: demosaiced), and a JPEG alone.
    write_dng(folder / "trip" / "IMG_0002.dng", stored_for_orientation(upright, 8), orientation=8,
              date="2024:03:03 09:00:00", make="Longlens", model="LL-2")
    write_image(folder / "IMG_0003.JPG", upright, "JPEG", quality=90)
    # What LibRaw cannot read: a RAW cut short by a failed copy, and noise under a RAW name.
    whole = write_dng(folder / "cut.dng", stored).read_bytes()
    (folder / "cut.dng").unlink()
    (folder / "broken.nef").write_bytes(whole[: len(whole) // 2])
    (folder / "noise.cr3").write_bytes(bytes(range(256)) * 40)
    return folder


def _rows(paths) -> dict[str, object]:
    with Catalog(paths.catalog) as cat:
        (lib,) = cat.libraries()
        return {r.rel_path: r for r in cat.image_records(lib.id)}


def test_raw_jpeg_pair_is_indexed_once_then_both_then_the_raw(home, paths, raw_folder, cli):
    before = _fingerprints(raw_folder)
    s = cli.json("index", str(raw_folder))
    assert s["raw_jpeg_pairs"] == "jpeg" and s["pair_files_left_out"] == 1
    assert s["scanned"] == 5 and s["new"] == 3
    assert {u["path"]: u["reason"] for u in s["unreadable"]} == {"broken.nef": "truncated",
                                                                 "noise.cr3": "unsupported RAW"}
    rows = _rows(paths)
    assert "IMG_0001.DNG" not in rows and rows["IMG_0001.JPG"].status == STATUS_OK
    raw = rows["trip/IMG_0002.dng"]
    assert raw.status == STATUS_OK
    assert (raw.width, raw.height, raw.orientation) == (256, 192, 8)  # upright size, the RAW's orientation
    assert (raw.exif_date, raw.camera_make, raw.camera_model) == ("2024-03-03T09:00:00", "Longlens", "LL-2")

    # The text summary says what was left out and how to change it.
    rc, out, _ = cli("index", str(raw_folder))
    assert rc == 0
    assert "RAW+JPEG pairs: 1 RAW file left out, the JPEG/HEIF of each pair is indexed" in out

    # Both, by the flag: the RAW of the pair is added from its preview, nothing else changes.
    s = cli.json("index", str(raw_folder), "--raw-jpeg-pairs", "both")
    assert s["raw_jpeg_pairs"] == "both" and s["pair_files_left_out"] == 0
    assert (s["new"], s["deleted"]) == (1, 0)
    pair_raw = _rows(paths)["IMG_0001.DNG"]
    assert (pair_raw.status, pair_raw.width, pair_raw.height, pair_raw.orientation) == (STATUS_OK, 256, 192, 6)

    # The RAW, by the settings file (the GUI's): the JPEG of the pair leaves the library.
    (paths.config / "settings.json").write_text(json.dumps({"raw_jpeg_pairs": "raw"}), encoding="utf-8")
    s = cli.json("index", str(raw_folder))
    assert s["raw_jpeg_pairs"] == "raw" and s["pair_files_left_out"] == 1 and s["deleted"] == 1
    live = {k for k, r in _rows(paths).items() if r.status == STATUS_OK}
    assert live == {"IMG_0001.DNG", "trip/IMG_0002.dng", "IMG_0003.JPG"}
    # An explicit flag still wins over the file.
    s = cli.json("index", str(raw_folder), "--raw-jpeg-pairs", "jpeg")
    assert (s["new"], s["deleted"]) == (1, 1)

    assert _fingerprints(raw_folder) == before  # nothing written to, nothing touched


def test_a_bad_pair_choice_is_refused_with_one_message(home, paths, raw_folder, cli):
    rc, _, err = cli("index", str(raw_folder), "--raw-jpeg-pairs", "jpg")
    assert rc == 2 and MESSAGE in err and "Traceback" not in err
    settings = paths.config / "settings.json"
    settings.parent.mkdir(parents=True, exist_ok=True)
    settings.write_text(json.dumps({"raw_jpeg_pairs": "jpg"}), encoding="utf-8")
    rc, _, err = cli("index", str(raw_folder))
    assert rc == 2 and MESSAGE in err and str(settings) in err and "'raw_jpeg_pairs'" in err
    assert not paths.catalog.exists() or _libraries(paths) == []


def _libraries(paths) -> list:
    with Catalog(paths.catalog) as cat:
        return cat.libraries()
