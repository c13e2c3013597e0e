"""Issue 28 point 3, the export (engine.xmp_export, `longlens xmp export`): the Lightroom-named
sidecar only beside proprietary RAW files (Lightroom reads the XMP inside JPEG, TIFF, PSD, HEIC,
PNG and DNG), the pair's RAW sidecar and an existing stem sidecar still merged into; the accepted
caption into dc:description and a title into dc:title, kept vs replaced as asked, counted in the
summary; keywords into digiKam:TagsList for new whole-name sidecars; the settings checked in the
engine, with the same words for the CLI and the app."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from engine import review
from engine.catalog import Catalog
from engine.metadata.xmp import parse_xmp
from engine.xmp_export import (
    NOT_FAITHFUL,
    XmpExportError,
    XmpTextOptions,
    export_xmp_job,
    field_summary,
    plan_xmp_export,
    title_of,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "xmp"


@pytest.fixture
def cat(tmp_path):
    c = Catalog(tmp_path / "home" / "catalog.sqlite3")
    yield c
    c.close()


def _library(folder: Path, names: list[str]) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for n, name in enumerate(names):
        if name.lower().endswith((".jpg", ".jpeg")):
            Image.new("RGB", (30 + n, 20), "navy").save(folder / name, "JPEG")
        else:
            (folder / name).write_bytes(b"stand-in for a " + name.encode() + bytes([n]))  # never decoded here
        out[name] = folder / name
    return out


def _review(cat: Catalog, folder: Path, items: list[dict], verdicts: dict[str, str]) -> Path:
    """A caption file of `items` (image names, captions, any other keys), each reviewed with the
    verdict named for its caption (default faithful)."""
    cat.add_library(folder)
    captions = folder.parent / "captions.jsonl"
    lines = [{**it, "image": str(folder / it["image"])} for it in items]
    captions.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    session = review.open_session(cat, captions)
    for item in review.session_items(cat, session):
        review.set_verdict(cat, item.id, None, verdicts.get(item.caption, "faithful"), "")
    return captions


def _run(plan, home: Path, dry_run: bool = False):
    *_, last = export_xmp_job(plan, backup_root=home, dry_run=dry_run)
    return last.extra["summary"]


def _by_name(summary) -> dict[str, object]:
    return {Path(r.sidecar).name: r for r in summary.results}


@pytest.mark.parametrize("name", ["IMG_1.jpg", "IMG_1.JPEG", "scan.tif", "scan.TIFF", "layers.psd", "phone.heic",
                                  "shot.png", "open.dng"])
def test_lightroom_writes_no_sidecar_for_files_it_reads_embedded_xmp_from(cat, tmp_path, name):
    folder = tmp_path / "lib"
    _library(folder, [name])
    captions = _review(cat, folder, [{"image": name, "caption": "A ferry."}], {})
    summary = _run(plan_xmp_export(cat, captions, convention="lightroom", texts=XmpTextOptions(description=True)),
                   tmp_path / "home")
    [result] = summary.results
    stem, ext = Path(name).stem, Path(name).suffix.lstrip(".").upper()
    assert result.action == "refused" and Path(result.sidecar).name == f"{stem}.xmp"
    assert result.reason.startswith(f"Lightroom reads no sidecar for a {ext} file: it reads the XMP embedded in "
                                    "JPEG, TIFF, PSD, PNG, HEIC and DNG files (Metadata > Read Metadata from Files)")
    assert result.reason.endswith(f"export with the darktable convention instead to write {name}.xmp, which "
                                  "darktable and digiKam read")
    assert sorted(p.name for p in folder.iterdir()) == [name]
    # The whole-name sidecar it offers is written.
    dark = _run(plan_xmp_export(cat, captions, convention="darktable", texts=XmpTextOptions(description=True)),
                tmp_path / "home")
    assert [r.action for r in dark.results] == ["create"]
    assert parse_xmp((folder / f"{name}.xmp").read_bytes(), "x").values["description"] == "A ferry."


@pytest.mark.parametrize("name", ["IMG_1.CR2", "IMG_1.cr3", "DSC_1.NEF", "DSC_1.ARW", "DSCF1.RAF", "P1.ORF",
                                  "P1.RW2", "IMGP1.PEF", "SAM_1.SRW"])
def test_lightroom_writes_the_stem_sidecar_of_a_raw_file(cat, tmp_path, name):
    folder = tmp_path / "lib"
    _library(folder, [name])
    captions = _review(cat, folder, [{"image": name, "caption": "A ferry."}], {})
    summary = _run(plan_xmp_export(cat, captions, convention="lightroom", keywords=["flat"]), tmp_path / "home")
    [result] = summary.results
    assert result.action == "create" and Path(result.sidecar).name == Path(name).stem + ".xmp"
    written = (folder / (Path(name).stem + ".xmp")).read_bytes()
    assert parse_xmp(written, "x").sidecar_for == Path(name).suffix.lstrip(".")
    # A flat keyword goes into lr:hierarchicalSubject too (digiKam reads that list before dc:subject).
    assert parse_xmp(written, "x").values["keywords"] == (("flat",), ("flat",))


def test_the_stem_sidecar_of_a_raw_pair_keeps_working(cat, tmp_path):
    """DSC_2.JPG + DSC_2.NEF indexed once (the JPEG): the Lightroom export writes the NEF's
    DSC_2.xmp, which Lightroom reads for the NEF and Longlens for the pair's JPEG; an existing
    one is merged into. A lone JPEG's stem sidecar that another tool already wrote for it is
    merged into too (refusing would leave it nowhere: the darktable convention refuses to hide it)."""
    folder = tmp_path / "lib"
    _library(folder, ["DSC_2.JPG", "DSC_2.NEF", "DSC_3.jpg"])
    lightroom = (DATA / "lightroom-classic.xmp").read_text(encoding="utf-8")
    (folder / "DSC_3.xmp").write_text(lightroom.replace('"NEF"', '"JPG"'), encoding="utf-8")
    captions = _review(cat, folder, [{"image": "DSC_2.JPG", "caption": "Pair."},
                                     {"image": "DSC_3.jpg", "caption": "Lone."}], {})
    plan = plan_xmp_export(cat, captions, convention="lightroom", keywords=["k"])
    first = _by_name(_run(plan, tmp_path / "home"))
    assert first["DSC_2.xmp"].action == "create" and first["DSC_3.xmp"].action == "update"
    assert "DSC_2.xmp is the sidecar of the pair's DSC_2.NEF, which Lightroom reads for it" in first["DSC_2.xmp"].changes[-1]
    assert "Lightroom itself reads the XMP inside a JPG file, not this sidecar" in first["DSC_3.xmp"].changes[-1]
    assert parse_xmp((folder / "DSC_2.xmp").read_bytes(), "x").sidecar_for == "NEF"
    again = _by_name(_run(plan_xmp_export(cat, captions, convention="lightroom", keywords=["k", "k2"]),
                          tmp_path / "home"))
    assert again["DSC_2.xmp"].action == "update"  # marked NEF, for the NEF: merged into, not refused


def test_description_and_title_from_accepted_captions_kept_or_replaced_as_asked(cat, tmp_path):
    folder = tmp_path / "lib"
    _library(folder, ["a.jpg", "b.jpg", "c.jpg", "d.jpg"])
    (folder / "b.jpg.xmp").write_bytes((DATA / "darktable.xmp").read_bytes())  # has a title and a description
    items = [{"image": "a.jpg", "caption": "A white ferry. It crosses the fjord.", "title": "  Morning  ferry "},
             {"image": "b.jpg", "caption": "Wooden houses by the harbour. Lights come on."},
             {"image": "c.jpg", "caption": "A cat on a sofa."},
             {"image": "d.jpg", "caption": "Not sure what this is."}]
    captions = _review(cat, folder, items, {"A cat on a sofa.": "unfaithful", "Not sure what this is.": "unsure"})
    home = tmp_path / "home"
    texts = XmpTextOptions(description=True, title=True)
    plan = plan_xmp_export(cat, captions, convention="darktable", texts=texts)
    dry = _run(plan, home, dry_run=True)
    got = _by_name(dry)
    assert got["a.jpg.xmp"].fields == {"dc:title": "written", "dc:description": "written"}
    assert got["b.jpg.xmp"].fields == {"dc:title": "kept: differs", "dc:description": "kept: differs"}
    assert got["c.jpg.xmp"].fields == {"dc:title": NOT_FAITHFUL, "dc:description": NOT_FAITHFUL}
    assert "dc:description [x-default]: kept: differs (the sidecar says 'Red and yellow wooden houses along the " \
           "harbour, lights comi…')" in got["b.jpg.xmp"].changes
    assert f"dc:description [x-default]: {NOT_FAITHFUL}" in got["d.jpg.xmp"].changes
    assert dict(field_summary(dry)) == {
        "dc:description": "dc:description: written 1, kept: differs 1, not written: the caption is not marked "
                          "faithful 2",
        "dc:title": "dc:title: written 1, kept: differs 1, not written: the caption is not marked faithful 2"}
    assert dry.as_dict()["fields"]["dc:description"] == {"written": 1, "kept: differs": 1, NOT_FAITHFUL: 2}
    assert not (folder / "a.jpg.xmp").exists()  # a dry run

    _run(plan, home)
    a = parse_xmp((folder / "a.jpg.xmp").read_bytes(), "a")
    assert a.values["description"] == "A white ferry. It crosses the fjord."
    assert a.values["title"] == "Morning ferry"  # the caption file's own title, spaces tidied
    b_before = (DATA / "darktable.xmp").read_bytes()
    assert (folder / "b.jpg.xmp").read_bytes() != b_before  # the review was added...
    assert parse_xmp((folder / "b.jpg.xmp").read_bytes(), "b").values["description"].startswith("Red and yellow")
    c = parse_xmp((folder / "c.jpg.xmp").read_bytes(), "c").values
    assert "description" not in c and "title" not in c  # an unfaithful caption is no description

    replaced = _by_name(_run(plan_xmp_export(cat, captions, convention="darktable", texts=XmpTextOptions(
        description=True, title=True, replace_description=True)), home))
    assert replaced["b.jpg.xmp"].fields == {"dc:title": "kept: differs", "dc:description": "written"}
    assert replaced["a.jpg.xmp"].fields == {"dc:title": "unchanged", "dc:description": "unchanged"}
    assert replaced["a.jpg.xmp"].action == "unchanged"
    b = parse_xmp((folder / "b.jpg.xmp").read_bytes(), "b").values
    assert b["description"] == "Wooden houses by the harbour. Lights come on." and b["title"] == "Bryggen at dusk"
    backup = Path(replaced["b.jpg.xmp"].backup)
    assert "Red and yellow" in backup.read_text(encoding="utf-8")  # what was replaced is backed up


def test_a_language_entry_and_darktables_one_language_reading_said(cat, tmp_path):
    folder = tmp_path / "lib"
    _library(folder, ["a.jpg"])
    captions = _review(cat, folder, [{"image": "a.jpg", "caption": "Ei ferje."}], {})
    texts = XmpTextOptions(description=True, language="nb")
    [r] = _run(plan_xmp_export(cat, captions, convention="darktable", texts=texts), tmp_path / "home").results
    assert "dc:description [nb]: written" in r.changes
    assert any(c.startswith("darktable (4.2) reads only one language") for c in r.changes)
    text = (folder / "a.jpg.xmp").read_text(encoding="utf-8")
    assert '<rdf:li xml:lang="x-default">Ei ferje.</rdf:li>' in text and '<rdf:li xml:lang="nb">Ei ferje.</rdf:li>' in text


def test_new_whole_name_sidecars_get_digikams_tagslist(cat, tmp_path):
    folder = tmp_path / "lib"
    _library(folder, ["a.jpg", "b.jpg"])
    (folder / "b.jpg.xmp").write_bytes((DATA / "darktable.xmp").read_bytes())
    captions = _review(cat, folder, [{"image": "a.jpg", "caption": "A."}, {"image": "b.jpg", "caption": "B."}], {})
    _run(plan_xmp_export(cat, captions, convention="darktable", keywords=["Places|Oslo", "flat"]), tmp_path / "home")
    new = (folder / "a.jpg.xmp").read_text(encoding="utf-8")
    assert "<digiKam:TagsList>\n    <rdf:Seq>\n     <rdf:li>Places/Oslo</rdf:li>\n     <rdf:li>flat</rdf:li>" in new
    # darktable's own sidecar had no TagsList: digiKam reads its lr:hierarchicalSubject, where they went.
    old = (folder / "b.jpg.xmp").read_text(encoding="utf-8")
    assert "TagsList" not in old and "<rdf:li>Places|Oslo</rdf:li>" in old and "<rdf:li>flat</rdf:li>" in old


@pytest.mark.parametrize(("texts", "setting", "message"), [
    (XmpTextOptions(description=True, language="en_GB"), "language", "'en_GB' is not a language tag"),
    (XmpTextOptions(language="de"), "language", "write the description or the title too"),
    (XmpTextOptions(replace_description=True), "replace_description", "replacing descriptions needs the description"),
    (XmpTextOptions(description=True, replace_title=True), "replace_title", "replacing titles needs the title"),
])
def test_bad_text_settings_are_refused_before_anything_is_read(cat, tmp_path, texts, setting, message):
    with pytest.raises(XmpExportError, match=message) as err:
        plan_xmp_export(cat, tmp_path / "nowhere.jsonl", convention="darktable", texts=texts)
    assert setting in err.value.settings


def test_title_of():
    assert title_of("A white ferry crosses the fjord. Gulls follow.") == "A white ferry crosses the fjord"
    assert title_of("Is it a ferry? Yes.") == "Is it a ferry?"
    assert title_of("Wait...") == "Wait..."
    assert title_of("Anything.", " The  title ") == "The title"


def test_the_cli_flags_listing_and_summary(cat, tmp_path, monkeypatch, capsys):
    from engine.cli import main as cli_main

    home = tmp_path / "clihome"
    monkeypatch.setenv("LONGLENS_HOME", str(home))
    from engine.config import get_paths

    folder = tmp_path / "lib"
    _library(folder, ["a.jpg", "b.jpg"])
    (folder / "b.jpg.xmp").write_bytes((DATA / "darktable.xmp").read_bytes())
    get_paths().catalog.parent.mkdir(parents=True, exist_ok=True)
    with Catalog(get_paths().catalog) as c:
        captions = _review(c, folder, [{"image": "a.jpg", "caption": "A ferry. Gulls."},
                                       {"image": "b.jpg", "caption": "Houses."}], {})
    rc = cli_main(["xmp", "export", str(captions), "--convention", "darktable", "--description", "--title",
                   "--dry-run"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "    dc:title [x-default]: written" in out and "    dc:description [x-default]: written" in out
    assert "dc:description: written 1, kept: differs 1 (--replace-description replaces the kept ones)" in out
    assert "dc:title: written 1, kept: differs 1 (--replace-title replaces the kept ones)" in out
    rc = cli_main(["xmp", "export", str(captions), "--convention", "darktable", "--description",
                   "--replace-description", "--language", "nb", "--json"])
    summary = json.loads(capsys.readouterr().out)
    assert rc == 0 and summary["fields"] == {"dc:description": {"written": 2}}
    assert parse_xmp((folder / "b.jpg.xmp").read_bytes(), "b").values["description"] == "Red and yellow wooden " \
        "houses along the harbour, lights coming on."  # x-default kept: only the nb entry was asked for
    assert '<rdf:li xml:lang="nb">Houses.</rdf:li>' in (folder / "b.jpg.xmp").read_text(encoding="utf-8")
    rc = cli_main(["xmp", "export", str(captions), "--convention", "darktable", "--description", "--language",
                   "en_GB"])
    err = capsys.readouterr().err
    assert rc == 2 and "'en_GB' is not a language tag" in err and "(--language)" in err
    rc = cli_main(["xmp", "export", str(captions), "--convention", "darktable", "--replace-title"])
    err = capsys.readouterr().err
    assert rc == 2 and "replacing titles needs the title written too (--replace-title)" in err


def test_a_read_only_library_is_refused_whole_before_any_pictures_own_reason(cat, tmp_path):
    """A read-only library refuses the export as a whole, also where each JPEG would be refused
    for the Lightroom convention anyway: the user learns the library is read-only first."""
    from tests.reliability.test_originals_readonly import set_read_only

    folder = tmp_path / "lib"
    _library(folder, ["a.jpg", "b.jpg"])
    captions = _review(cat, folder, [{"image": "a.jpg", "caption": "A."}, {"image": "b.jpg", "caption": "B."}], {})
    set_read_only(folder)
    try:
        for convention in ("lightroom", "darktable"):
            with pytest.raises(XmpExportError, match="refused: the library is read-only, so no sidecar is written"):
                plan_xmp_export(cat, captions, convention=convention)
    finally:
        set_read_only(folder, read_only=False)


def test_a_title_over_the_readers_bound_falls_back_to_the_first_sentence(cat, tmp_path):
    folder = tmp_path / "lib"
    _library(folder, ["a.jpg"])
    captions = _review(cat, folder, [{"image": "a.jpg", "caption": "A ferry. Gulls.", "title": "t" * 20_001}], {})
    _run(plan_xmp_export(cat, captions, convention="darktable", texts=XmpTextOptions(title=True)), tmp_path / "home")
    assert parse_xmp((folder / "a.jpg.xmp").read_bytes(), "a").values["title"] == "A ferry"
