"""Issue 20 items 3 and 4 through the real CLI, on pictures whose sidecars (as Lightroom, darktable
and digiKam write them) and embedded packet hold descriptions and titles:

- `longlens check --from-catalog` checks the captions already in the catalogue (the XMP
  description, else the title), touching no file in the library;
- the same captions open as a Review caption file; verdicts set on them are written by
  `longlens xmp export` only: refused on the read-only library, listed by --dry-run, then merged
  into the sidecars (the tools' bytes kept, the old files backed up), and read back by a re-index
  as keywords; the pictures stay byte- and mtime-identical throughout."""

from __future__ import annotations

import difflib
import json
from pathlib import Path

import pytest

from engine import review
from engine.catalog import Catalog
from engine.config import get_paths
from engine.metadata.captions import catalog_captions, write_catalog_caption_file
from tests.e2e.conftest import TINY_MODEL
from tests.e2e.test_xmp_cli import QUERY, make_library
from tests.reliability.conftest import tree_snapshot
from tests.reliability.test_originals_readonly import assert_unchanged, set_read_only

MODEL = ["--model", TINY_MODEL]
DESCRIPTIONS = {
    "DSC_4127.jpg": ("A white ferry crosses the fjord in front of the Opera house under a pale morning sky.",
                     "dc:description"),
    "IMG_2044.jpg": ("Red and yellow wooden houses along the harbour, lights coming on.", "dc:description"),
    "P1030412.JPG": ("The train at Flåm station, steam from the waterfall behind it.", "dc:description"),
    "lofoten.jpg": ("Embedded title", "dc:title"),  # the packet inside the JPEG has a title only
}


def _pictures(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in folder.iterdir() if not p.name.endswith(".xmp")}


@pytest.mark.timeout(900)
def test_catalogue_captions_checked_reviewed_and_exported_to_sidecars(home, cli, tmp_path):
    photos = tmp_path / "library"
    make_library(photos)
    pictures_before = _pictures(photos)
    set_read_only(photos)
    try:
        before = tree_snapshot(photos)
        assert cli.json("index", str(photos), *MODEL)["xmp_read"] == 5

        # Item 4: check the captions already in the catalogue.
        report = tmp_path / "report.jsonl"
        rc, out, err = cli("check", "--from-catalog", "--library", str(photos), "--out", str(report), *MODEL)
        assert rc == 0, err
        records = [json.loads(line) for line in report.read_text(encoding="utf-8").splitlines()]
        got = {Path(r["image"]).name: (r["caption"], r["caption_source"]) for r in records}
        assert got == DESCRIPTIONS  # plain.jpg has no XMP text, so no line
        assert all(r["sentences"] and r["verdict"] != "error" for r in records)
        assert "checked 4 lines" in out
        rc, _out, err = cli("check", "--from-catalog", "--library", str(tmp_path / "nowhere"), "--out",
                            str(report), *MODEL)
        assert rc == 2 and "is not an indexed library" in err and "--library" in err
        rc, _out, err = cli("check", "--out", str(report), *MODEL)
        assert rc == 2 and "give a caption file or --from-catalog" in err
        assert_unchanged(photos, before, "longlens check --from-catalog")

        # The same captions as a Review caption file (what the Review view opens), reviewed.
        with Catalog(get_paths().catalog) as cat:
            captions = write_catalog_caption_file(catalog_captions(cat), tmp_path / "catalogue-captions.jsonl")
            session = review.open_session(cat, captions)
            for item in review.session_items(cat, session):
                verdict = "unfaithful" if item.image_path.endswith("lofoten.jpg") else "faithful"
                review.set_verdict(cat, item.id, None, verdict, f"checked {Path(item.image_path).name}")
        assert_unchanged(photos, before, "reviewing the catalogue's captions")

        # Item 3: refused on the read-only library, with nothing written.
        rc, _out, err = cli("xmp", "export", str(captions), "--convention", "darktable")
        assert rc == 2 and "refused: the library is read-only" in err and str(photos) in err
        assert_unchanged(photos, before, "a refused xmp export")
    finally:
        set_read_only(photos, read_only=False)

    sidecars_before = {p.name: p.read_bytes() for p in photos.glob("*.xmp")}
    rc, out, err = cli("xmp", "export", str(captions), "--convention", "darktable", "--keyword", "Longlens|checked",
                       "--dry-run")
    assert rc == 1, err
    assert "would update  " + str(photos / "IMG_2044.jpg.xmp") in out
    assert "would create  " + str(photos / "lofoten.jpg.xmp") in out
    # DSC_4127.jpg's metadata is in Lightroom's DSC_4127.xmp: a new DSC_4127.jpg.xmp would hide it.
    assert "REFUSED       " + str(photos / "DSC_4127.jpg.xmp") in out and "would hide it" in out
    assert "dc:subject: add 'Longlens', 'checked'" in out and "dry run, nothing written" in out
    assert {p.name: p.read_bytes() for p in photos.glob("*.xmp")} == sidecars_before
    assert not (get_paths().data / "xmp-backups").exists()

    rc, out, err = cli("xmp", "export", str(captions), "--convention", "darktable", "--keyword", "Longlens|checked",
                       "--json")
    summary = json.loads(out)
    assert rc == 1 and summary["counts"] == {"create": 1, "update": 2, "refused": 1}
    # The Lightroom-convention export merges into DSC_4127.xmp (marked for this JPEG by another
    # tool); for the other JPEGs it writes no IMG.xmp, which Lightroom would never read.
    rc, out, err = cli("xmp", "export", str(captions), "--convention", "lightroom", "--keyword", "Longlens|checked",
                       "--json")
    lightroom = json.loads(out)
    assert rc == 1 and {Path(s["sidecar"]).name: s["action"] for s in lightroom["sidecars"]} == {
        "DSC_4127.xmp": "update", "IMG_2044.xmp": "refused", "P1030412.xmp": "refused", "lofoten.xmp": "refused"}
    assert all("Lightroom reads no sidecar for a JPG file" in s["reason"] for s in lightroom["sidecars"]
               if s["action"] == "refused")
    assert not (photos / "IMG_2044.xmp").exists() and not (photos / "lofoten.xmp").exists()
    assert _only_insertions(sidecars_before["DSC_4127.xmp"].decode(), (photos / "DSC_4127.xmp").read_text("utf-8"))
    assert _pictures(photos) == pictures_before  # no picture touched, bytes or mtime
    for name in ("IMG_2044.jpg.xmp", "P1030412.JPG.xmp"):  # the tools' sidecars: only additions
        new = (photos / name).read_text(encoding="utf-8")
        old = sidecars_before[name].decode("utf-8")
        assert _only_insertions(old, new)
        backup = next(Path(s["backup"]) for s in summary["sidecars"] if Path(s["sidecar"]).name == name)
        assert backup.read_bytes() == sidecars_before[name] and backup.is_relative_to(home)

    # A re-index reads the exported keywords back (without re-embedding), and search filters by them.
    summary = cli.json("index", str(photos), *MODEL)
    assert summary["embedded"] == 0 and summary["xmp_reread"] == 4
    hits = cli.json("search", QUERY, *MODEL, "--keyword", "Longlens|checked", "--top", "10")["results"]
    assert {Path(h["path"]).name for h in hits} == set(DESCRIPTIONS)
    assert _pictures(photos) == pictures_before


def _only_insertions(old: str, new: str) -> bool:
    ops = difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes()
    return all(op[0] in ("equal", "insert") for op in ops)


def test_exporting_for_a_raw_jpeg_pair_keeps_the_raw_sidecars_keywords_and_rating_findable(home, cli, tmp_path):
    """Issue 27 point 7, through the real index and search: a pair IMG_0001.CR2 + IMG_0001.JPG indexed
    once (the JPEG), whose darktable sidecar IMG_0001.CR2.xmp holds keywords and a rating. A darktable
    export for the JPEG merges into that sidecar (the one the reader uses) instead of creating
    IMG_0001.JPG.xmp, which would hide it: after a re-index the picture is still found by the RAW
    sidecar's keyword and rating, and by the exported keyword."""
    photos = tmp_path / "pair"
    photos.mkdir()
    jpeg = photos / "IMG_0001.JPG"
    from PIL import Image

    Image.new("RGB", (64, 48), "navy").save(jpeg, "JPEG", quality=85)
    (photos / "IMG_0001.CR2").write_bytes(b"II*\x00" + b"\x00" * 64)  # left out of the pair: never decoded
    raw_sidecar = photos / "IMG_0001.CR2.xmp"
    darktable = (Path(__file__).resolve().parents[1] / "data" / "xmp" / "darktable.xmp").read_text(encoding="utf-8")
    raw_sidecar.write_text(darktable, encoding="utf-8")  # xmp:Rating 3, keywords Places|Norway|Bergen, harbour
    assert cli.json("index", str(photos), *MODEL)["xmp_read"] == 1

    def found(*flags: str) -> set[str]:
        hits = cli.json("search", "a harbour", *MODEL, *flags, "--top", "5")["results"]
        return {Path(h["path"]).name for h in hits}

    assert found("--keyword", "harbour", "--rating", "3") == {"IMG_0001.JPG"}
    captions = tmp_path / "captions.jsonl"
    captions.write_text(json.dumps({"image": str(jpeg), "caption": "Boats in the harbour."}) + "\n", encoding="utf-8")
    with Catalog(get_paths().catalog) as cat:
        session = review.open_session(cat, captions)
        for item in review.session_items(cat, session):
            review.set_verdict(cat, item.id, None, "faithful", "")
    rc, out, err = cli("xmp", "export", str(captions), "--convention", "darktable", "--keyword", "Longlens|checked")
    assert rc == 0, out + err
    assert "updated       " + str(raw_sidecar) in out and not (photos / "IMG_0001.JPG.xmp").exists()
    assert cli.json("index", str(photos), *MODEL)["xmp_reread"] == 1
    assert found("--keyword", "harbour", "--rating", "3") == {"IMG_0001.JPG"}
    assert found("--keyword", "Longlens|checked") == {"IMG_0001.JPG"}
