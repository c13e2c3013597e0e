"""Issue 27 point 7 through the real `longlens index`, on generated DNGs (LibRaw opens them) and
JPEGs: a RAW+JPEG pair follows the state of the file indexed for it (an unreadable JPEG lets its
RAW stand in, with the pair's sidecars, until the JPEG can be read again; the same the other way
round when the RAW is the one indexed), and a change of the pairing setting reads the XMP of the
pictures it affects again."""

from __future__ import annotations

import shutil
from pathlib import Path

from engine.catalog import Catalog
from engine.samples import procedural_picture, write_dng, write_image
from engine.types import STATUS_OK
from tests.e2e.conftest import TINY_MODEL

MODEL = ("--model", TINY_MODEL)
DATA = Path(__file__).resolve().parents[1] / "data" / "xmp"
NOT_A_PICTURE = bytes(range(256)) * 40


def _shot(folder: Path, stem: str, seed: int) -> tuple[Path, Path]:
    import numpy as np

    picture = procedural_picture(np.random.default_rng(seed), (128, 96))
    raw = write_dng(folder / f"{stem}.DNG", picture, preview=picture)
    jpeg = write_image(folder / f"{stem}.JPG", picture, "JPEG", quality=90)
    return raw, jpeg


def _live(paths) -> dict[str, int]:
    with Catalog(paths.catalog) as cat:
        (lib,) = cat.libraries()
        return {r.rel_path: r.id for r in cat.image_records(lib.id) if r.status == STATUS_OK}


def _metadata(paths, image_id: int):
    with Catalog(paths.catalog) as cat:
        return cat.photo_metadata([image_id])[image_id]


def _found(cli) -> set[str]:
    return {Path(r["path"]).name for r in cli.json("search", "a picture", *MODEL, "--top", "50")["results"]}


def test_the_raw_stands_in_for_an_unreadable_jpeg_until_it_can_be_read_again(home, paths, tmp_path, cli):
    folder = tmp_path / "shoot"
    _raw, jpeg = _shot(folder, "IMG_0001", 1)
    good_jpeg = jpeg.read_bytes()
    shutil.copy(DATA / "digikam.xmp", folder / "IMG_0001.JPG.xmp")  # the pair's rating lives on the JPEG
    write_image(folder / "IMG_0002.JPG", procedural_picture(__import__("numpy").random.default_rng(2), (128, 96)),
                "JPEG")
    s = cli.json("index", str(folder), *MODEL)
    assert (s["pair_files_left_out"], s["pair_stand_ins"]) == (1, [])
    assert set(_live(paths)) == {"IMG_0001.JPG", "IMG_0002.JPG"}

    # The JPEG becomes unreadable (a failed copy, a broken card): the RAW stands in for the shot.
    jpeg.write_bytes(NOT_A_PICTURE)
    s = cli.json("index", str(folder), *MODEL)
    assert {u["path"] for u in s["unreadable"]} == {"IMG_0001.JPG"}
    assert s["pair_stand_ins"] == [{"path": "IMG_0001.DNG", "for": "IMG_0001.JPG"}]
    assert (s["pair_files_left_out"], s["new"], s["changed"], s["deleted"]) == (0, 1, 0, 0)
    live = _live(paths)
    assert set(live) == {"IMG_0001.DNG", "IMG_0002.JPG"}
    assert _metadata(paths, live["IMG_0001.DNG"]).rating == 5  # with the pair's sidecar
    assert _found(cli) == {"IMG_0001.DNG", "IMG_0002.JPG"}
    rc, out, _ = cli("index", str(folder), *MODEL)
    assert rc == 0 and ("RAW+JPEG pairs: 1 file indexed in place of its pair's unreadable file, until it can be "
                        "read again: IMG_0001.DNG for IMG_0001.JPG") in out

    # Nothing changed: the RAW stays, nothing is done again.
    s = cli.json("index", str(folder), *MODEL)
    assert (s["new"], s["changed"], s["deleted"], s["embedded"], s["unchanged"]) == (0, 0, 0, 0, 3)
    assert s["pair_stand_ins"] == [{"path": "IMG_0001.DNG", "for": "IMG_0001.JPG"}]

    # The JPEG is readable again: the RAW is left out again, like a deleted file.
    jpeg.write_bytes(good_jpeg)
    s = cli.json("index", str(folder), *MODEL)
    assert (s["pair_stand_ins"], s["pair_files_left_out"], s["deleted"]) == ([], 1, 1)
    assert set(_live(paths)) == {"IMG_0001.JPG", "IMG_0002.JPG"}
    assert _found(cli) == {"IMG_0001.JPG", "IMG_0002.JPG"}


def test_a_pair_unreadable_from_the_start_and_the_other_way_round(home, paths, tmp_path, cli):
    folder = tmp_path / "shoot"
    _shot(folder, "IMG_0001", 1)[1].write_bytes(NOT_A_PICTURE)  # the JPEG never could be read
    raw, _jpeg = _shot(folder, "IMG_0002", 2)
    raw.write_bytes(NOT_A_PICTURE)  # the RAW cannot be read
    s = cli.json("index", str(folder), *MODEL)
    assert s["pair_stand_ins"] == [{"path": "IMG_0001.DNG", "for": "IMG_0001.JPG"}]
    assert set(_live(paths)) == {"IMG_0001.DNG", "IMG_0002.JPG"}
    # The RAW indexed for each pair: the unreadable RAW's JPEG stands in, the other RAW is itself.
    s = cli.json("index", str(folder), *MODEL, "--raw-jpeg-pairs", "raw")
    assert s["pair_stand_ins"] == [{"path": "IMG_0002.JPG", "for": "IMG_0002.DNG"}]
    assert set(_live(paths)) == {"IMG_0001.DNG", "IMG_0002.JPG"}
    # Nothing embedded again; the unreadable JPEG of the first pair is left out now, its row swept.
    assert (s["new"], s["embedded"], s["deleted"]) == (0, 0, 1)


def test_a_pairing_change_reads_the_xmp_of_the_pair_again(home, paths, tmp_path, cli):
    folder = tmp_path / "shoot"
    _shot(folder, "DSC_4127", 3)
    # Lightroom's sidecar, marked for the RAW: it belongs to the JPEG only while the JPEG stands for the pair.
    (folder / "DSC_4127.xmp").write_text((DATA / "lightroom-classic.xmp").read_text(encoding="utf-8").replace(
        'photoshop:SidecarForExtension="NEF"', 'photoshop:SidecarForExtension="DNG"'), encoding="utf-8")
    expected = {"jpeg": {"DSC_4127.JPG": 4}, "both": {"DSC_4127.JPG": None, "DSC_4127.DNG": 4},
                "raw": {"DSC_4127.DNG": 4}}
    for n, pairs in enumerate(("jpeg", "both", "jpeg", "raw")):
        s = cli.json("index", str(folder), *MODEL, "--raw-jpeg-pairs", pairs)
        if n and pairs != "raw":  # the JPEG stays, unchanged: its XMP alone is read again, its pixels not
            assert s["xmp_reread"] == 1 and s["embedded"] == (1 if pairs == "both" else 0), pairs  # both: the new DNG
        live = _live(paths)
        got = {name: _metadata(paths, i).rating for name, i in live.items()}
        assert got == expected[pairs], pairs
        titles = {name: _metadata(paths, i).title for name, i in live.items()}
        assert {n for n, t in titles.items() if t == "Morning ferry, Oslofjord"} == {
            n for n, r in expected[pairs].items() if r == 4}, pairs
