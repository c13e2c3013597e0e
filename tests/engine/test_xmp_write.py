"""Issue 20 item 3: review results merged into XMP sidecars (engine.metadata.xmp_write) and the
export job (engine.xmp_export): the hand-written Lightroom, darktable and digiKam sidecars keep
every other byte, the reader reads the merge back, re-exports change nothing, backups hold the
previous bytes, dry runs write nothing, read-only folders and other files' sidecars are refused,
and the pictures stay byte- and mtime-identical."""

from __future__ import annotations

import difflib
import json
import os
import shutil
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest
from PIL import Image

from engine import review
from engine.catalog import Catalog
from engine.metadata.xmp import RDF, XmpError, parse_xmp
from engine.metadata.xmp_write import (
    LONGLENS_NS,
    LONGLENS_OLD_NS,
    CaptionReview,
    SentenceReview,
    merge_sidecar,
)
from engine.xmp_export import XmpExportError, export_xmp_job, plan_xmp_export
from tests.reliability.test_originals_readonly import set_read_only

DATA = Path(__file__).resolve().parents[1] / "data" / "xmp"
SAMPLES = ("lightroom-classic.xmp", "darktable.xmp", "digikam.xmp")
REVIEW = CaptionReview("A ferry & <a> \"sky\".", "faithful", "looks right", 1_700_000_000.0,
                       (SentenceReview(0, "A ferry & <a> \"sky\".", "unsure", "which ferry?"),))
OWNED = {("http://purl.org/dc/elements/1.1/", "subject"), ("http://ns.adobe.com/lightroom/1.0/", "hierarchicalSubject"),
         (LONGLENS_NS, "Reviews")}


def _inserted_only(old: str, new: str) -> list[str]:
    """The chunks `new` adds to `old`; fails if any byte of `old` was deleted or replaced."""
    ops = difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes()
    assert [op for op in ops if op[0] in ("delete", "replace")] == []
    return [new[j1:j2] for tag, _, _, j1, j2 in ops if tag == "insert"]


def _other_elements(text: str) -> list[bytes]:
    """Every property of every rdf:Description that Longlens does not own, serialised, plus the
    Descriptions' attributes."""
    root = ET.fromstring(text.encode("utf-8"))
    out = []
    for desc in root.iter(f"{{{RDF}}}Description"):
        out.append(repr(sorted(desc.attrib.items())).encode())
        for child in desc:
            uri, _, local = child.tag[1:].partition("}")
            if (uri, local) not in OWNED:
                child.tail = None  # the whitespace after the last property is where ours go
                out.append(ET.tostring(child))
    return out


@pytest.mark.parametrize("name", SAMPLES)
def test_merging_into_a_tools_sidecar_only_adds_and_keeps_every_other_byte(name):
    old = (DATA / name).read_text(encoding="utf-8")
    merged = merge_sidecar(old, name, reviews=[REVIEW], subjects=["Longlens", "reviewed", "Places"],
                           paths=["Longlens|reviewed", "places|norway|oslo"])
    _inserted_only(old, merged.text)
    assert merged.text.count(f"<longlens:Reviews xmlns:longlens=\"{LONGLENS_NS}\">") == 1
    assert merged.text.count("<rdf:li>Longlens|reviewed</rdf:li>") == 1
    # A keyword already there in another case is not added again.
    for word in ("Places", "places|norway|oslo"):
        had = f">{word.casefold()}<" in old.casefold()
        assert merged.text.casefold().count(f"<rdf:li>{word.casefold()}</rdf:li>") == (1 if not had else
                                                                                       old.casefold().count(f"<rdf:li>{word.casefold()}</rdf:li>"))
    # Every property Longlens does not own, and the Descriptions' attributes, are as they were.
    assert _other_elements(old) == _other_elements(merged.text)
    # The reader sees the keywords; the other fields are as before.
    before, after = parse_xmp(old.encode(), name), parse_xmp(merged.text.encode(), name)
    subjects, paths = after.values["keywords"]
    assert "reviewed" in subjects and "Longlens|reviewed" in paths
    assert {k: v for k, v in after.values.items() if k != "keywords"} == \
           {k: v for k, v in before.values.items() if k != "keywords"}
    assert set(before.values["keywords"][0]) <= set(subjects)
    # Longlens' element reads back with escaping undone.
    root = ET.fromstring(merged.text.encode())
    ll = f"{{{LONGLENS_NS}}}"
    entry = root.find(f".//{ll}Reviews/{{{RDF}}}Bag/{{{RDF}}}li")
    assert entry.findtext(f"{ll}Caption") == REVIEW.caption and entry.findtext(f"{ll}Verdict") == "faithful"
    assert entry.findtext(f"{ll}ReviewedAt") == "2023-11-14T22:13:20Z"
    assert entry.find(f"{ll}Sentences/{{{RDF}}}Seq/{{{RDF}}}li").findtext(f"{ll}Note") == "which ferry?"
    # Exporting the same again changes nothing at all.
    again = merge_sidecar(merged.text, name, reviews=[REVIEW], subjects=["Longlens", "reviewed"],
                          paths=["Longlens|reviewed"])
    assert again.text == merged.text and again.changes == []


def test_a_new_review_of_a_caption_replaces_its_entry_and_keeps_the_others():
    old = (DATA / "darktable.xmp").read_text(encoding="utf-8")
    first = merge_sidecar(old, "x", reviews=[REVIEW, CaptionReview("Other caption.", "unfaithful", "", 5.0)])
    second = merge_sidecar(first.text, "x", reviews=[CaptionReview(REVIEW.caption, "unfaithful", "no", 9.0)])
    assert second.changes == ["longlens:Reviews: 1 caption review(s) written (0 new, 1 replaced; 1 kept)"]
    root = ET.fromstring(second.text.encode())
    ll = f"{{{LONGLENS_NS}}}"
    entries = root.findall(f".//{ll}Reviews/{{{RDF}}}Bag/{{{RDF}}}li")
    # The entry is replaced where it stands; the other caption's entry keeps its bytes.
    assert [(e.findtext(f"{ll}Caption"), e.findtext(f"{ll}Verdict")) for e in entries] == \
           [(REVIEW.caption, "unfaithful"), ("Other caption.", "unfaithful")]
    other = first.text[first.text.index("<rdf:li rdf:parseType=\"Resource\">\n      <longlens:Caption>Other"):]
    other = other[:other.index("</rdf:li>") + len("</rdf:li>")]
    assert other in second.text
    assert root.find(f".//{ll}Reviews").findall(f"{{{RDF}}}Bag") and len(root.findall(f".//{ll}Reviews")) == 1
    _inserted_only(old, second.text)  # the tool's bytes still all there


def test_self_closing_description_empty_bag_and_crlf_files():
    crlf = ('<x:xmpmeta xmlns:x="adobe:ns:meta/">\r\n <rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#">'
            '\r\n  <rdf:Description rdf:about="" xmlns:xmp="http://ns.adobe.com/xap/1.0/" xmp:Rating="2"/>\r\n'
            ' </rdf:RDF>\r\n</x:xmpmeta>\r\n')
    merged = merge_sidecar(crlf, "a.xmp", reviews=[REVIEW], subjects=["k"])
    assert "\n" not in merged.text.replace("\r\n", "")
    assert parse_xmp(merged.text.encode(), "a.xmp").values == {"rating": 2, "keywords": (("k",), ())}
    empty_bag = ('<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#">'
                 '<rdf:Description rdf:about="" xmlns:dc="http://purl.org/dc/elements/1.1/"><!-- a <comment> -->'
                 '<dc:subject><rdf:Bag/></dc:subject></rdf:Description></rdf:RDF></x:xmpmeta>')
    merged = merge_sidecar(empty_bag, "b.xmp", subjects=["one", "two"])
    assert parse_xmp(merged.text.encode(), "b.xmp").values["keywords"] == (("one", "two"), ())
    assert "<!-- a <comment> -->" in merged.text


@pytest.mark.parametrize("name", ("billion-laughs.xmp", "external-entity.xmp"))
def test_hostile_sidecars_are_refused_and_never_edited(name):
    with pytest.raises(XmpError, match=f"{name}: refused"):
        merge_sidecar((DATA / name).read_text(encoding="utf-8"), name, subjects=["k"])


# --------------------------------------------------------------------------- the export job


@pytest.fixture
def cat(tmp_path):
    c = Catalog(tmp_path / "home" / "catalog.sqlite3")
    yield c
    c.close()


def _library(folder: Path) -> dict[str, Path]:
    folder.mkdir(parents=True)
    pics = {}
    for name, colour in (("DSC_4127.jpg", "navy"), ("IMG_2044.jpg", "orange"), ("plain.jpg", "grey"),
                         ("DSC_0001.JPG", "white")):
        Image.new("RGB", (40, 30), colour).save(folder / name, "JPEG", quality=85)
        pics[name] = folder / name
    (folder / "IMG_9000.CR2").write_bytes(b"II*\x00 a stand-in for a Canon RAW file")  # never decoded here
    pics["IMG_9000.CR2"] = folder / "IMG_9000.CR2"
    shutil.copy(DATA / "darktable.xmp", folder / "IMG_2044.jpg.xmp")
    lightroom = (DATA / "lightroom-classic.xmp").read_text(encoding="utf-8")
    (folder / "DSC_4127.xmp").write_text(lightroom.replace('"NEF"', '"JPG"'), encoding="utf-8")
    (folder / "DSC_0001.xmp").write_text(lightroom, encoding="utf-8")  # the NEF's, not the JPEG's
    return pics


def _reviewed(cat: Catalog, folder: Path, pics: dict[str, Path]) -> Path:
    cat.add_library(folder)  # sidecars are written only inside an indexed library
    captions = folder.parent / "captions.jsonl"
    lines = [{"image": str(p), "caption": f"Picture number {i}. It is plain."} for i, p in enumerate(pics.values())]
    lines.append({"image": str(pics["plain.jpg"]), "caption": "Never reviewed."})
    captions.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    session = review.open_session(cat, captions)
    for item in review.session_items(cat, session):
        if item.caption != "Never reviewed.":
            review.set_verdict(cat, item.id, None, "faithful", "fine")
            review.set_verdict(cat, item.id, 1, "unfaithful", "not plain")
    return captions


def _state(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(folder.iterdir())}


def _run(plan, home: Path, dry_run: bool = False):
    *_, last = export_xmp_job(plan, backup_root=home, dry_run=dry_run)
    return last.extra["summary"]


def test_export_both_conventions_with_backups_dry_run_and_refusals(cat, tmp_path):
    folder = tmp_path / "library"
    pics = _library(folder)
    captions = _reviewed(cat, folder, pics)
    home = tmp_path / "home"
    before = _state(folder)

    plan = plan_xmp_export(cat, captions, convention="lightroom", keywords=["Longlens|reviewed"])
    assert plan.items_without_review == 1
    dry = _run(plan, home, dry_run=True)
    assert _state(folder) == before and not (home / "xmp-backups").exists()
    actions = {Path(r.sidecar).name: r.action for r in dry.results}
    # Lightroom reads IMG_0001.xmp for RAW files only: the CR2 gets one; a JPEG gets none, unless a
    # stem sidecar already holds its metadata (DSC_4127.xmp, marked for it by another tool).
    assert actions == {"DSC_4127.xmp": "update", "IMG_2044.xmp": "refused", "plain.xmp": "refused",
                       "DSC_0001.xmp": "refused", "IMG_9000.xmp": "create"}
    reasons = {Path(r.sidecar).name: r.reason for r in dry.results}
    assert "belongs to the NEF file" in reasons["DSC_0001.xmp"]
    assert reasons["plain.xmp"] == (
        "Lightroom reads no sidecar for a JPG file: it reads the XMP embedded in JPEG, TIFF, PSD, PNG, HEIC and DNG "
        "files (Metadata > Read Metadata from Files), and plain.xmp only for a proprietary RAW file. Not written; "
        "export with the darktable convention instead to write plain.jpg.xmp, which darktable and digiKam read")
    assert any("Lightroom itself reads the XMP inside a JPG file" in c
               for c in next(r.changes for r in dry.results if r.sidecar.endswith("DSC_4127.xmp")))

    done = _run(plan, home)
    assert [(Path(r.sidecar).name, r.action) for r in done.results] == \
           [(Path(r.sidecar).name, r.action) for r in dry.results]
    after = _state(folder)
    for name in pics:  # pictures byte- and mtime-identical
        assert after[name] == before[name]
    assert after["DSC_0001.xmp"] == before["DSC_0001.xmp"] and after["IMG_2044.jpg.xmp"] == before["IMG_2044.jpg.xmp"]
    assert "IMG_2044.xmp" not in after and "plain.xmp" not in after
    _inserted_only(before["DSC_4127.xmp"][0].decode(), after["DSC_4127.xmp"][0].decode())
    backup = Path(next(r.backup for r in done.results if r.backup))
    assert backup.read_bytes() == before["DSC_4127.xmp"][0]
    assert json.loads((backup.parent / "manifest.json").read_text()) == {backup.name: str(folder / "DSC_4127.xmp")}
    created = parse_xmp(after["IMG_9000.xmp"][0], "IMG_9000.xmp")
    assert created.sidecar_for == "CR2"
    assert created.values["keywords"] == (("Longlens", "reviewed"), ("Longlens|reviewed",))
    assert "TagsList" not in after["IMG_9000.xmp"][0].decode()  # a Lightroom sidecar: digiKam reads whole names
    assert not [p for p in folder.iterdir() if p.name.endswith(".tmp")]

    # Again: nothing changes, nothing is backed up.
    again = _run(plan_xmp_export(cat, captions, convention="lightroom", keywords=["Longlens|reviewed"]), home)
    assert {r.action for r in again.results} == {"unchanged", "refused"}
    assert _state(folder) == after

    # darktable's convention: whole-name sidecars, its own file merged into; none is created
    # where the picture's stem sidecar holds its metadata (the reader would then ignore that one).
    dark = _run(plan_xmp_export(cat, captions, convention="darktable"), home)
    assert {Path(r.sidecar).name: r.action for r in dark.results} == {
        "DSC_4127.jpg.xmp": "refused", "IMG_2044.jpg.xmp": "update", "plain.jpg.xmp": "create",
        "DSC_0001.JPG.xmp": "create", "IMG_9000.CR2.xmp": "refused"}
    assert "would hide it" in next(r.reason for r in dark.results if Path(r.sidecar).name == "IMG_9000.CR2.xmp")
    _inserted_only(before["IMG_2044.jpg.xmp"][0].decode(), (folder / "IMG_2044.jpg.xmp").read_text(encoding="utf-8"))
    assert all(_state(folder)[n] == before[n] for n in pics)


def test_a_read_only_library_is_refused_before_anything_is_written(cat, tmp_path):
    folder = tmp_path / "library"
    pics = _library(folder)
    captions = _reviewed(cat, folder, pics)
    set_read_only(folder)
    try:
        before = _state(folder)
        with pytest.raises(XmpExportError, match=r"refused: the library is read-only.*library is read-only \(perm"):
            plan_xmp_export(cat, captions, convention="darktable")
        assert _state(folder) == before
    finally:
        set_read_only(folder, read_only=False)


def test_links_and_read_only_sidecars_are_not_written_through(cat, tmp_path):
    folder = tmp_path / "library"
    pics = _library(folder)
    elsewhere = tmp_path / "elsewhere.xmp"
    shutil.copy(DATA / "digikam.xmp", elsewhere)
    (folder / "plain.jpg.xmp").symlink_to(elsewhere)
    (folder / "DSC_4127.jpg.xmp").write_bytes((DATA / "digikam.xmp").read_bytes())
    os.chmod(folder / "DSC_4127.jpg.xmp", 0o444)
    captions = _reviewed(cat, folder, pics)
    summary = _run(plan_xmp_export(cat, captions, convention="darktable"), tmp_path / "home")
    reasons = {Path(r.sidecar).name: r.reason for r in summary.results if r.action == "refused"}
    assert "is a link" in reasons["plain.jpg.xmp"] and "read-only" in reasons["DSC_4127.jpg.xmp"]
    assert elsewhere.read_bytes() == (DATA / "digikam.xmp").read_bytes()
    assert (folder / "DSC_4127.jpg.xmp").read_bytes() == (DATA / "digikam.xmp").read_bytes()


# --------------------------------------------------------------------------- issue 27: own entries, any form

CAPTION_A = CaptionReview("Caption A & <b>.", "faithful", "note a", 1_700_000_000.0,
                          (SentenceReview(0, "Caption A & <b>.", "unsure", "which?"),))
CAPTION_B = CaptionReview("Caption B.", "unfaithful", "wrong boat", 1_700_000_500.0)


def _entries(text: str) -> dict[str, tuple[str | None, str | None]]:
    from tests.reliability.sidecar_fixtures import reviews_in

    return reviews_in(text.encode("utf-8"))


@pytest.mark.parametrize("name", ["longlens-after-exiv2.xmp", "longlens-after-exiftool.xmp"])
def test_entries_a_tool_re_serialised_are_recognised_and_kept_byte_for_byte(name):
    """Caption A's review after exiv2 (attribute form: `<rdf:li><rdf:Description longlens:Caption=...>`,
    as darktable writes it) or exiftool (own rdf:Description, single quotes, fields reordered)
    re-serialised the sidecar: exporting B keeps A's entry byte for byte; re-exporting A unchanged
    changes nothing; re-exporting A changed replaces that entry only."""
    # The fixtures are what the tools made of a sidecar in the old namespace; with the URI of today
    # they are what they make of one now (a tool copies the declaration as it is).
    old = (DATA / name).read_text(encoding="utf-8").replace(LONGLENS_OLD_NS, LONGLENS_NS)
    assert _entries(old) == {CAPTION_A.caption: ("faithful", "note a")}
    same = merge_sidecar(old, name, reviews=[CAPTION_A])
    assert same.text == old and same.changes == []  # recognised as already there
    with_b = merge_sidecar(old, name, reviews=[CAPTION_B])
    _inserted_only(old, with_b.text)  # A's entry (and everything else) keeps every byte
    assert _entries(with_b.text) == {CAPTION_A.caption: ("faithful", "note a"), "Caption B.": ("unfaithful", "wrong boat")}
    assert with_b.changes == ["longlens:Reviews: 1 caption review(s) written (1 new, 0 replaced; 1 kept)"]
    changed_a = merge_sidecar(with_b.text, name, reviews=[CaptionReview(CAPTION_A.caption, "unfaithful", "no", 9.0)])
    assert _entries(changed_a.text) == {CAPTION_A.caption: ("unfaithful", "no"), "Caption B.": ("unfaithful", "wrong boat")}
    b_entry = with_b.text[with_b.text.rindex("<rdf:li", 0, with_b.text.index("Caption B.")):]
    assert b_entry[:b_entry.index("</rdf:li>")] in changed_a.text  # B untouched by A's re-export
    assert parse_xmp(changed_a.text.encode(), name).values == parse_xmp(old.encode(), name).values


HAND_EDITED = """<x:xmpmeta xmlns:x="adobe:ns:meta/">
 <rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#">
  <rdf:Description rdf:about="" xmlns:longlens="https://longlens.app/ns/xmp/1.0/" xmlns:my="urn:my-tool">
   <longlens:Reviews>
    <rdf:Bag>
     <!-- reviewed on the train -->
     <rdf:li rdf:parseType="Resource">
      <longlens:Caption>Caption A &amp; &lt;b&gt;.</longlens:Caption>
      <longlens:Verdict>faithful</longlens:Verdict>
      <longlens:Mood>calm</longlens:Mood>
      <!-- checked twice -->
      <my:Reviewer>Ane</my:Reviewer>
     </rdf:li>
     <rdf:li>a plain entry someone added</rdf:li>
     <rdf:li><rdf:Description my:Kind="not ours" xmlns:q="urn:q"><q:Thing>x</q:Thing></rdf:Description></rdf:li>
     <rdf:li longlens:Caption="Caption C." longlens:Verdict="unsure" my:Flag="1"/>
    </rdf:Bag>
   </longlens:Reviews>
  </rdf:Description>
 </rdf:RDF>
</x:xmpmeta>
"""


def test_unknown_fields_comments_and_foreign_entries_survive_every_export():
    with_b = merge_sidecar(HAND_EDITED, "h.xmp", reviews=[CAPTION_B])
    _inserted_only(HAND_EDITED, with_b.text)  # every entry, field and comment byte for byte
    assert _entries(with_b.text)["Caption B."] == ("unfaithful", "wrong boat")
    assert with_b.changes == ["longlens:Reviews: 1 caption review(s) written (1 new, 0 replaced; 4 kept)"]
    # Re-exporting A changes A's entry and carries what Longlens does not write into the new one.
    again = merge_sidecar(with_b.text, "h.xmp", reviews=[CaptionReview(CAPTION_A.caption, "unfaithful", "", None)])
    assert _entries(again.text)[CAPTION_A.caption] == ("unfaithful", None)
    a_entry = again.text[again.text.index("<rdf:li", again.text.index("reviewed on the train")):]
    a_entry = a_entry[:a_entry.index("</rdf:li>")]
    for kept in ("<longlens:Mood>calm</longlens:Mood>", "<!-- checked twice -->", "<my:Reviewer>Ane</my:Reviewer>"):
        assert kept in a_entry
    for untouched in ("<!-- reviewed on the train -->", "<rdf:li>a plain entry someone added</rdf:li>",
                      '<rdf:li><rdf:Description my:Kind="not ours" xmlns:q="urn:q"><q:Thing>x</q:Thing>'
                      "</rdf:Description></rdf:li>",
                      '<rdf:li longlens:Caption="Caption C." longlens:Verdict="unsure" my:Flag="1"/>'):
        assert untouched in again.text
    # Caption C (attribute form on the rdf:li itself) re-exported: my:Flag is carried as an element.
    c = merge_sidecar(again.text, "h.xmp", reviews=[CaptionReview("Caption C.", "faithful", "", None)])
    assert "<my:Flag>1</my:Flag>" in c.text and _entries(c.text)["Caption C."] == ("faithful", None)
    ET.fromstring(c.text.encode())


def test_adobe_full_form_entries_are_recognised():
    full = HAND_EDITED.replace(
        '<rdf:li longlens:Caption="Caption C." longlens:Verdict="unsure" my:Flag="1"/>',
        "<rdf:li><rdf:Description><longlens:Caption>Caption C.</longlens:Caption>"
        "<longlens:Verdict>unsure</longlens:Verdict></rdf:Description></rdf:li>")
    merged = merge_sidecar(full, "f.xmp", reviews=[CaptionReview("Caption C.", "unsure", "", None)])
    assert merged.text == full  # the same review: recognised, nothing rewritten
    merged = merge_sidecar(full, "f.xmp", reviews=[CaptionReview("Caption C.", "faithful", "", None)])
    assert merged.text.count("Caption C.") == 1 and _entries(merged.text)["Caption C."] == ("faithful", None)
