"""Issue 20 items 2 and 4 through the real CLI: `longlens index` reads XMP sidecars (Lightroom,
darktable, digiKam, as they write them) and embedded packets, `longlens search --rating --label
--keyword` filters by them, a re-index picks up an edited sidecar without re-embedding, bad values
are refused naming the flag, and the photo folder (pictures and sidecars) stays byte- and
mtime-identical throughout."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from PIL import Image

from tests.e2e.conftest import TINY_MODEL
from tests.engine.test_xmp import DATA, EMBEDDED_PACKET
from tests.reliability.conftest import tree_snapshot
from tests.reliability.test_originals_readonly import assert_unchanged, set_read_only

QUERY = "A white ferry crosses the fjord in front of the opera house under a pale morning sky."
MODEL = ["--model", TINY_MODEL]


def make_library(folder: Path) -> dict[str, Path]:
    """Pictures with the sidecars the tools write beside them, and one packet embedded in a JPEG."""
    folder.mkdir(parents=True)
    pictures = {}
    for n, (name, colour) in enumerate((("DSC_4127.jpg", "navy"), ("IMG_2044.jpg", "orange"),
                                        ("P1030412.JPG", "olive"), ("lofoten.jpg", "white"),
                                        ("plain.jpg", "grey"))):
        kw = {"xmp": EMBEDDED_PACKET} if name == "lofoten.jpg" else {}
        Image.new("RGB", (64 + n, 48), colour).save(folder / name, "JPEG", quality=85, **kw)
        pictures[name] = folder / name
    lightroom = (DATA / "lightroom-classic.xmp").read_text(encoding="utf-8")
    # Lightroom's stem sidecar, written for this JPEG (SidecarForExtension names its extension).
    (folder / "DSC_4127.xmp").write_text(lightroom.replace('SidecarForExtension="NEF"', 'SidecarForExtension="JPG"'),
                                         encoding="utf-8")
    shutil.copy(DATA / "darktable.xmp", folder / "IMG_2044.jpg.xmp")
    shutil.copy(DATA / "digikam.xmp", folder / "P1030412.JPG.xmp")
    return pictures


def _names(results) -> set[str]:
    return {Path(r["path"]).name for r in results["results"]}


@pytest.mark.timeout(600)
def test_index_and_search_by_rating_label_and_keyword(home, cli, tmp_path):
    photos = tmp_path / "library"
    make_library(photos)
    set_read_only(photos)
    try:
        before = tree_snapshot(photos)
        summary = cli.json("index", str(photos), *MODEL)
        assert summary["new"] == 5 and summary["xmp_read"] == 5 and summary["xmp_problems"] == []
        assert_unchanged(photos, before, "longlens index")

        def search(*flags):
            return cli.json("search", QUERY, *MODEL, "--top", "10", *flags)

        assert _names(search("--keyword", "Places|Norway")) == {"DSC_4127.jpg", "IMG_2044.jpg", "P1030412.JPG",
                                                                "lofoten.jpg"}
        assert _names(search("--keyword", "places|norway|oslo")) == {"DSC_4127.jpg"}
        assert _names(search("--keyword", "Places|Norway|Flåm", "--keyword", "People|Family")) == {"P1030412.JPG"}
        assert _names(search("--keyword", "harbour")) == {"IMG_2044.jpg"}  # a one-level keyword
        assert _names(search("--rating", "4")) == {"DSC_4127.jpg", "P1030412.JPG"}
        assert _names(search("--label", "yellow")) == {"IMG_2044.jpg"}  # darktable's colour label 1
        assert _names(search("--label", "Red", "--keyword", "Places")) == {"lofoten.jpg"}  # the embedded packet
        assert len(search("--rating", "0")["results"]) == 5
        hit = search("--keyword", "Transport|ferry")["results"]
        assert [(h["title"], h["rating"], h["label"]) for h in hit] == [("Morning ferry, Oslofjord", 4, "Green")]
        # Once each: Lightroom's flat dc:subject repeats every level of its paths.
        assert hit[0]["keywords"] == ["Places|Norway|Oslo", "Transport|ferry"]
        assert hit[0]["gps"] == {"lat": pytest.approx(59.906890, abs=1e-6), "lon": pytest.approx(10.752013, abs=1e-6)}
        # The place filter (issue 28): within 1 km of the Oslo Opera house; the rest have no GPS position.
        rc, out, err = cli("search", QUERY, *MODEL, "--top", "10", "--near", "59.9075,10.7531", "--km", "1", "--json")
        assert rc == 0, err
        assert _names(json.loads(out)) == {"DSC_4127.jpg"}
        assert "note: place filter: 4 pictures with no GPS position left out" in err
        assert _names(search("--near", "59.9075, 10.7531", "--km", "0.05")) == set()  # 91 m away: outside 50 m
        rc, _out, err = cli("search", QUERY, *MODEL, "--near", "95,10", "--km", "5")
        assert rc == 2 and "the 'near' latitude must be from -90 to 90 degrees, got 95" in err and "--near" in err
        rc, _out, err = cli("search", QUERY, *MODEL, "--near", "59.9,10.7", "--km", "0")
        assert rc == 2 and "argument --km: the 'km' radius must be greater than 0, got 0" in err
        rc, _out, err = cli("search", QUERY, *MODEL, "--near", "59.9,10.7")
        assert rc == 2 and "needs a radius" in err and "(--km)" in err

        # One picture, as the inspector shows it: the same view as the search hits' metadata.
        shown = cli.json("show", str(photos / "DSC_4127.jpg"), "--json")
        assert {k: shown[k] for k in ("title", "keywords", "rating", "label", "gps")} == {
            k: hit[0][k] for k in ("title", "keywords", "rating", "label", "gps")}
        assert shown["metadata_read"] and shown["sources"] == ["DSC_4127.xmp"]
        rc, out, err = cli("show", str(photos / "DSC_4127.jpg"))
        assert rc == 0, err
        assert "  keywords     Places › Norway › Oslo, Transport › ferry\n" in out
        assert "  GPS          59.906890, 10.752013\n" in out and "  marks        ★★★★☆ · Green label\n" in out
        (tmp_path / "link").symlink_to(photos)  # through a link to the library: the same picture
        assert cli.json("show", str(tmp_path / "link" / "DSC_4127.jpg"), "--json")["image_id"] == shown["image_id"]
        rc, out, err = cli("show", str(tmp_path / "elsewhere.jpg"))
        assert rc != 0 and "is not a picture of an indexed library" in err

        rc, _out, err = cli("search", QUERY, *MODEL, "--rating", "7")
        assert rc == 2 and "--rating" in err and "minimum rating must be at most 5, got 7" in err
        rc, _out, err = cli("search", QUERY, *MODEL, "--keyword", " | ")
        assert rc == 2 and "has no keyword in it" in err and "--keyword" in err
        assert_unchanged(photos, before, "longlens search")
    finally:
        set_read_only(photos, read_only=False)


@pytest.mark.timeout(600)
def test_an_edited_or_malformed_sidecar_is_read_at_the_next_index_without_re_embedding(home, cli, tmp_path):
    photos = tmp_path / "library"
    make_library(photos)
    assert cli("index", str(photos), *MODEL, "--quiet")[0] == 0
    sidecar = photos / "IMG_2044.jpg.xmp"
    sidecar.write_text(sidecar.read_text(encoding="utf-8").replace('xmp:Rating="3"', 'xmp:Rating="5"'),
                       encoding="utf-8")
    (photos / "P1030412.JPG.xmp").write_bytes((DATA / "billion-laughs.xmp").read_bytes())
    set_read_only(photos)
    try:
        before = tree_snapshot(photos)
        rc, out, err = cli("index", str(photos), *MODEL, "--quiet")
        assert rc == 0, err
        assert "embedded 0" in out and "unchanged 5" in out
        assert ("metadata: 2 pictures' XMP read again (sidecar added, edited or removed, or a RAW+JPEG pair "
                "taken otherwise); not re-embedded") in out
        assert ("P1030412.JPG: P1030412.JPG.xmp: refused: it declares a DTD or entities (an XML bomb or an external "
                "reference, which XMP never needs); nothing of it was read") in out
        assert_unchanged(photos, before, "longlens index")
    finally:
        set_read_only(photos, read_only=False)
    found = cli.json("search", QUERY, *MODEL, "--rating", "5")
    assert _names(found) == {"IMG_2044.jpg"}  # digiKam's 5 stars went with its refused sidecar
    assert cli.json("search", QUERY, *MODEL, "--keyword", "People|Family")["results"] == []
