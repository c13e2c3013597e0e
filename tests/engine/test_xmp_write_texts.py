"""Issue 28 point 3, the merge (engine.metadata.xmp_write): the caption and a title written into
dc:description / dc:title in the rdf:Alt a tool wrote, in whatever form (one Description or
Adobe's one per schema, exiv2/darktable's re-serialisation, an empty entry, rdf:value), per
language, kept unless replacing is asked for; keywords into every scheme the sidecar uses
(digiKam:TagsList with '/'); Longlens' namespace moved from the placeholder to
https://longlens.app/ns/xmp/1.0/ with old sidecars read and migrated. Every other byte stays."""

from __future__ import annotations

import difflib
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest

from engine.metadata.xmp import RDF, parse_xmp
from engine.metadata.xmp_write import (
    KEPT_DIFFERS,
    KEPT_OTHER_FORM,
    LONGLENS_NS,
    LONGLENS_OLD_NS,
    UNCHANGED,
    WRITTEN,
    CaptionReview,
    language_problem,
    merge_sidecar,
    migrate_namespace,
)
from tests.engine.test_xmp_write import CAPTION_A
from tests.reliability.sidecar_fixtures import reviews_in

DATA = Path(__file__).resolve().parents[1] / "data" / "xmp"
DC = "http://purl.org/dc/elements/1.1/"
XML_LANG = "{http://www.w3.org/XML/1998/namespace}lang"
CAPTION = "A ferry & <two> \"gulls\" over the fjord."


def _changed_spans(old: str, new: str) -> list[tuple[str, str, str]]:
    """(kind, old text, new text) for every part of `old` that `new` does not keep."""
    ops = difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes()
    return [(tag, old[i1:i2], new[j1:j2]) for tag, i1, i2, j1, j2 in ops if tag != "equal"]


def _alt(text: str, local: str) -> dict[str, str]:
    """xml:lang -> text of dc:<local>'s entries (the first property found, any Description)."""
    root = ET.fromstring(text.encode("utf-8"))
    prop = next(root.iter(f"{{{DC}}}{local}"))
    out = {}
    for li in prop.iter(f"{{{RDF}}}li"):
        value = li.find(f"{{{RDF}}}value")
        out[li.get(XML_LANG)] = (value.text if value is not None else "".join(li.itertext())) or ""
    return out


def _others(text: str) -> list[bytes]:
    """Every top-level property except dc:description and dc:title, serialised."""
    root = ET.fromstring(text.encode("utf-8"))
    out = []
    for desc in root.iter(f"{{{RDF}}}Description"):
        out.append(repr(sorted(desc.attrib.items())).encode())
        for child in desc:
            if child.tag not in (f"{{{DC}}}description", f"{{{DC}}}title"):
                child.tail = None
                out.append(ET.tostring(child))
    return out


# The forms a tool writes an rdf:Alt in (the x-default entry says OLD).
ADOBE_PER_SCHEMA = """<?xpacket begin="\ufeff" id="W5M0MpCehiHzreSzNTczkc9d"?>
<x:xmpmeta xmlns:x="adobe:ns:meta/" x:xmptk="Adobe XMP Core 5.0-c060 61.134777, 2010/02/12-17:32:00        ">
   <rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#">
      <rdf:Description rdf:about=""
            xmlns:xmp="http://ns.adobe.com/xap/1.0/">
         <xmp:CreatorTool>Adobe Photoshop CS5 Macintosh</xmp:CreatorTool>
      </rdf:Description>
      <rdf:Description rdf:about=""
            xmlns:dc="http://purl.org/dc/elements/1.1/">
         <dc:format>image/jpeg</dc:format>
         <dc:description>
            <rdf:Alt>
               <rdf:li xml:lang="x-default">OLD</rdf:li>
            </rdf:Alt>
         </dc:description>
      </rdf:Description>
   </rdf:RDF>
</x:xmpmeta>
<?xpacket end="w"?>"""
ONE_LINE = ('<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#">'
            "<rdf:Description rdf:about='' xmlns:dc='http://purl.org/dc/elements/1.1/'>"
            "<dc:description><rdf:Alt><rdf:li xml:lang='X-Default'>OLD</rdf:li></rdf:Alt></dc:description>"
            "</rdf:Description></rdf:RDF></x:xmpmeta>")
QUALIFIED = ('<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#">'
             '<rdf:Description rdf:about="" xmlns:dc="http://purl.org/dc/elements/1.1/" xmlns:q="urn:q">'
             '<dc:description><rdf:Alt><rdf:li xml:lang="x-default" rdf:parseType="Resource">'
             "<rdf:value>OLD</rdf:value><q:by>Ane</q:by></rdf:li></rdf:Alt></dc:description>"
             "</rdf:Description></rdf:RDF></x:xmpmeta>")
FORMS = {
    "darktable (one Description, exiv2's layout)": (DATA / "darktable.xmp").read_text(encoding="utf-8").replace(
        "Red and yellow wooden houses along the harbour, lights coming on.", "OLD"),
    "exiv2 re-serialised Longlens sidecar": (DATA / "longlens-after-exiv2.xmp").read_text(encoding="utf-8"),
    "Adobe, one Description per schema": ADOBE_PER_SCHEMA,
    "one line, single quotes, X-Default in capitals": ONE_LINE,
    "qualified entry (rdf:value)": QUALIFIED,
}
FORMS["exiv2 re-serialised Longlens sidecar"] = FORMS["exiv2 re-serialised Longlens sidecar"].replace(
    _alt(FORMS["exiv2 re-serialised Longlens sidecar"], "description")["x-default"], "OLD")


@pytest.mark.parametrize("form", list(FORMS))
def test_a_different_description_is_kept_and_replaced_only_when_asked_in_every_form(form):
    old = migrate_namespace(FORMS[form])[0]
    assert next(v for k, v in _alt(old, "description").items() if k.casefold() == "x-default") == "OLD"
    kept = merge_sidecar(old, "s.xmp", description=CAPTION)
    assert kept.text == old and kept.outcomes == {"dc:description": KEPT_DIFFERS}
    assert kept.changes == ["dc:description [x-default]: kept: differs (the sidecar says 'OLD')"]

    replaced = merge_sidecar(old, "s.xmp", description=CAPTION, replace_description=True)
    assert replaced.outcomes == {"dc:description": WRITTEN}
    assert replaced.changes == ["dc:description [x-default]: written (replaced 'OLD')"]
    # Only the entry's text changed, escaped; everything else keeps its bytes.
    assert _changed_spans(old, replaced.text) == [
        ("replace", "OLD", "A ferry &amp; &lt;two&gt; \"gulls\" over the fjord.")]
    assert next(v for k, v in _alt(replaced.text, "description").items() if k.casefold() == "x-default") == CAPTION
    assert parse_xmp(replaced.text.encode(), "s.xmp").values["description"] == CAPTION
    again = merge_sidecar(replaced.text, "s.xmp", description=CAPTION)
    assert again.text == replaced.text and again.outcomes == {"dc:description": UNCHANGED}


def test_empty_entries_and_an_empty_alt_are_filled_in_place():
    base = ('<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#">'
            '<rdf:Description rdf:about="" xmlns:dc="http://purl.org/dc/elements/1.1/">{}'
            "</rdf:Description></rdf:RDF></x:xmpmeta>")
    empty_li = base.format('<dc:title><rdf:Alt><rdf:li xml:lang="x-default"/></rdf:Alt></dc:title>')
    merged = merge_sidecar(empty_li, "e.xmp", title="Ferry")
    # An empty entry holds no text to keep: written without asking to replace.
    assert merged.outcomes == {"dc:title": WRITTEN}
    assert merged.text == base.format('<dc:title><rdf:Alt><rdf:li xml:lang="x-default">Ferry</rdf:li></rdf:Alt>'
                                      "</dc:title>")
    empty_alt = base.format("<dc:title><rdf:Alt/></dc:title>")
    merged = merge_sidecar(empty_alt, "e.xmp", title="Ferry")
    assert _alt(merged.text, "title") == {"x-default": "Ferry"}
    assert merged.text.startswith(empty_alt[:empty_alt.index("<rdf:Alt/>")])


def test_languages_an_entry_per_language_with_an_x_default_first():
    old = (DATA / "darktable.xmp").read_text(encoding="utf-8")
    merged = merge_sidecar(old, "d.xmp", description="Fargerike trehus.", title="Bryggen", language="nb-NO")
    assert _alt(merged.text, "description") == {
        "x-default": "Red and yellow wooden houses along the harbour, lights coming on.", "nb-NO": "Fargerike trehus."}
    assert merged.outcomes == {"dc:title": WRITTEN, "dc:description": WRITTEN}
    assert [k for k, *_ in _changed_spans(old, merged.text)] == ["insert", "insert"]  # only two new entries
    # The same language in another case is the same entry (RFC 3066 tags ignore case).
    same = merge_sidecar(merged.text, "d.xmp", description="Fargerike trehus.", language="NB-no")
    assert same.text == merged.text and same.outcomes == {"dc:description": UNCHANGED}
    kept = merge_sidecar(merged.text, "d.xmp", description="Noe annet.", language="nb-NO")
    assert kept.outcomes == {"dc:description": KEPT_DIFFERS} and kept.text == merged.text
    # An Alt without x-default gets one, first, with the same text (as Adobe's toolkit does).
    only_de = ('<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#">'
               '<rdf:Description rdf:about="" xmlns:dc="http://purl.org/dc/elements/1.1/">\n <dc:title>\n  <rdf:Alt>\n'
               '   <rdf:li xml:lang="de">Fähre</rdf:li>\n  </rdf:Alt>\n </dc:title>\n</rdf:Description></rdf:RDF>'
               "</x:xmpmeta>")
    merged = merge_sidecar(only_de, "t.xmp", title="Ferry", language="en")
    assert list(_alt(merged.text, "title").items()) == [("x-default", "Ferry"), ("de", "Fähre"), ("en", "Ferry")]
    # A new property in a language: x-default and that language.
    new = merge_sidecar(None, "n.xmp", description="Ferje.", language="nb")
    assert list(_alt(new.text, "description").items()) == [("x-default", "Ferje."), ("nb", "Ferje.")]


@pytest.mark.parametrize("tag", ["en", "en-GB", "nb-NO", "zh-Hant-TW", "x-default", "i-klingon"])
def test_language_tags_accepted(tag):
    assert language_problem(tag) is None


@pytest.mark.parametrize("tag", ["", "en_GB", "english language", "e\u0301n", "en-", "-en", "x" * 9])
def test_language_tags_refused_with_the_reason(tag):
    assert "is not a language tag; use one like en, en-GB" in language_problem(tag)


def test_a_description_written_as_a_plain_value_is_not_rewritten():
    attr = ('<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#">'
            '<rdf:Description rdf:about="" xmlns:dc="http://purl.org/dc/elements/1.1/" dc:description="OLD"/>'
            "</rdf:RDF></x:xmpmeta>")
    merged = merge_sidecar(attr, "a.xmp", description=CAPTION, replace_description=True)
    assert merged.text == attr and merged.outcomes == {"dc:description": KEPT_OTHER_FORM}
    assert merge_sidecar(attr, "a.xmp", description="OLD").outcomes == {"dc:description": UNCHANGED}
    plain = attr.replace(' dc:description="OLD"/>', "><dc:description>OLD</dc:description></rdf:Description>")
    merged = merge_sidecar(plain, "p.xmp", description=CAPTION, replace_description=True)
    assert merged.text == plain and merged.outcomes == {"dc:description": KEPT_OTHER_FORM}


@pytest.mark.parametrize("name", ["lightroom-classic.xmp", "darktable.xmp", "digikam.xmp"])
def test_texts_and_keywords_into_a_tools_sidecar_keep_every_other_property(name):
    old = (DATA / name).read_text(encoding="utf-8")
    merged = merge_sidecar(old, name, description=CAPTION, title="Ferry", subjects=["Longlens", "checked"],
                           paths=["Longlens|checked"], tags=["Longlens|checked"], replace_title=True)
    assert merged.outcomes == {"dc:title": WRITTEN, "dc:description": KEPT_DIFFERS}
    assert _others(old)[0] == _others(merged.text)[0]  # the Descriptions' attributes
    before, after = parse_xmp(old.encode(), name), parse_xmp(merged.text.encode(), name)
    assert after.values["title"] == "Ferry" and after.values["description"] == before.values["description"]
    assert {k: v for k, v in after.values.items() if k not in ("title", "keywords")} == \
           {k: v for k, v in before.values.items() if k not in ("title", "keywords")}
    assert "Longlens|checked" in after.values["keywords"][1]
    # With the old title put back, what is left are insertions only (the keywords).
    undone = merged.text
    if before.values.get("title"):  # digiKam's sample has none: the new dc:title is an insertion
        undone = merged.text.replace('<rdf:li xml:lang="x-default">Ferry</rdf:li>',
                                     f'<rdf:li xml:lang="x-default">{before.values["title"]}</rdf:li>')
    assert {kind for kind, *_ in _changed_spans(old, undone)} == {"insert"}


def test_keywords_go_into_every_scheme_the_sidecar_uses_digikams_taglist_included():
    old = (DATA / "digikam.xmp").read_text(encoding="utf-8")
    merged = merge_sidecar(old, "p.xmp", subjects=["Longlens", "checked", "flat"], paths=["Longlens|checked", "flat"],
                           tags=["Longlens|checked", "flat", "a/b|c"])
    assert [k for k, *_ in _changed_spans(old, merged.text)] == ["insert"] * 3
    root = ET.fromstring(merged.text.encode())
    tags = [li.text for li in root.iter("{http://www.digikam.org/ns/1.0/}TagsList") for li in li.iter(f"{{{RDF}}}li")]
    assert tags == ["Places/Norway/Flåm", "People/Family", "Longlens/checked", "flat"]
    assert "digiKam:TagsList: 'a/b|c' not added ('/' separates digiKam's levels)" in merged.changes
    assert "digiKam:TagsList: add 'Longlens/checked', 'flat'" in merged.changes
    # Exported again: already there (case ignored), nothing added.
    again = merge_sidecar(merged.text, "p.xmp", subjects=["longlens"], paths=["LONGLENS|checked"],
                          tags=["longlens|Checked"])
    assert again.text == merged.text
    # A sidecar without TagsList gets none unless a new one is asked for; a new one is a Seq.
    dark = (DATA / "darktable.xmp").read_text(encoding="utf-8")
    assert "TagsList" not in merge_sidecar(dark, "d.xmp", tags=["Longlens|checked"]).text
    new = merge_sidecar(None, "n.xmp", subjects=["k"], paths=["k"], tags=["Places|Oslo"], tags_list=True)
    assert "<digiKam:TagsList>\n    <rdf:Seq>\n     <rdf:li>Places/Oslo</rdf:li>" in new.text


MWG = "http://www.metadataworkinggroup.com/schemas/keywords/"


def _mwg_paths(text: str) -> set[str]:
    """Every path of the MWG keyword tree ('|' between levels), in any of the tools' forms."""
    root = ET.fromstring(text.encode("utf-8"))

    def walk(bag, prefix):
        for li in bag.findall(f"{{{RDF}}}li"):
            holders = [li, *li.findall(f"{{{RDF}}}Description")]
            word = next((h.get(f"{{{MWG}}}Keyword") or h.findtext(f"{{{MWG}}}Keyword") for h in holders
                         if h.get(f"{{{MWG}}}Keyword") or h.find(f"{{{MWG}}}Keyword") is not None), None)
            path = f"{prefix}|{word}" if prefix else word
            yield path
            for h in holders:
                for child_bag in h.findall(f"{{{MWG}}}Children/{{{RDF}}}Bag"):
                    yield from walk(child_bag, path)

    return set(walk(root.find(f".//{{{MWG}}}Hierarchy/{{{RDF}}}Bag"), ""))


@pytest.mark.parametrize("name", ["mwg-keywords-exiftool.xmp", "mwg-keywords-exiv2.xmp"])
def test_an_mwg_keyword_tree_gets_each_path_in_the_form_the_tool_wrote(name):
    """exiftool's element form and exiv2's (a parent as `<rdf:li><rdf:Description mwg-kw:Keyword=..>`,
    a leaf as `<rdf:li mwg-kw:Keyword="People"/>`): the levels already there are found (case
    ignored), the rest inserted under them; two new paths under one new parent make one node."""
    old = (DATA / name).read_text(encoding="utf-8")
    assert _mwg_paths(old) == {"Places", "Places|Norway", "Places|Norway|Oslo", "People"}
    merged = merge_sidecar(old, name, tags=["places|NORWAY|Bergen", "People|Family|Kids", "New|A", "New|B",
                                            "Places|Norway|oslo"])
    assert _mwg_paths(merged.text) == {"Places", "Places|Norway", "Places|Norway|Oslo", "Places|Norway|Bergen",
                                       "People", "People|Family", "People|Family|Kids", "New", "New|A", "New|B"}
    assert "mwg-kw:Keywords: add 'places|NORWAY|Bergen', 'People|Family|Kids', 'New|A', 'New|B'" in merged.changes
    kinds = {kind for kind, *_ in _changed_spans(old, merged.text)}
    if name.endswith("exiftool.xmp"):
        assert kinds == {"insert"}  # every node there keeps its bytes
    else:  # exiv2's leaf People gets children: only its tag is rewritten around its attribute
        leaf = '<rdf:li\n       mwg-kw:Keyword="People"/>'
        assert leaf in old and leaf not in merged.text
        assert '<rdf:li><rdf:Description\n       mwg-kw:Keyword="People"><mwg-kw:Children>' in merged.text
        assert {kind for kind, *_ in _changed_spans(old.replace(leaf, ""), merged.text)} <= {"insert"}
    again = merge_sidecar(merged.text, name, tags=["PLACES|norway|bergen", "new|b"])
    assert again.text == merged.text


# --------------------------------------------------------------------------- the namespace

def test_the_namespace_is_the_real_one():
    assert LONGLENS_NS == "https://longlens.app/ns/xmp/1.0/"
    new = merge_sidecar(None, "n.xmp", reviews=[CaptionReview("C.", "faithful")])
    assert f'xmlns:longlens="{LONGLENS_NS}"' in new.text and "longlens.example" not in new.text


@pytest.mark.parametrize("name", ["longlens-after-exiv2.xmp", "longlens-after-exiftool.xmp"])
def test_old_sidecars_are_read_and_migrated_on_their_next_export_nothing_else_changing(name):
    old = (DATA / name).read_text(encoding="utf-8")
    assert LONGLENS_OLD_NS in old
    entries = reviews_in(old.encode())
    assert entries == {CAPTION_A.caption: ("faithful", "note a")}
    caption = CAPTION_A.caption
    # Exporting the same review: recognised in the old namespace, only the declaration changes.
    merged = merge_sidecar(old, name, reviews=[CAPTION_A])
    assert merged.migrated == 1
    assert merged.changes == [f"Longlens namespace: migrated ({LONGLENS_OLD_NS} -> {LONGLENS_NS}; "
                              "the entries as they were)"]
    assert old.replace(LONGLENS_OLD_NS, LONGLENS_NS) == merged.text  # that URI, and not one other byte
    root = ET.fromstring(merged.text.encode())
    assert root.iter(f"{{{LONGLENS_NS}}}Reviews") and not list(root.iter(f"{{{LONGLENS_OLD_NS}}}Reviews"))
    assert reviews_in(merged.text.encode()) == entries
    assert parse_xmp(merged.text.encode(), name).values == parse_xmp(old.encode(), name).values
    # Migrated once: the next export finds nothing to migrate.
    assert merge_sidecar(merged.text, name).migrated == 0
    # A changed review of an old entry is replaced where it stands, in the new namespace.
    changed = merge_sidecar(old, name, reviews=[CaptionReview(caption, "unfaithful", "no", 9.0)])
    assert reviews_in(changed.text.encode()) == {caption: ("unfaithful", "no")}
    assert LONGLENS_OLD_NS not in changed.text


def test_migration_touches_declarations_only_never_text_or_comments():
    old = ('<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#">'
           f"<!-- xmlns:longlens=\"{LONGLENS_OLD_NS}\" -->"
           f'<rdf:Description rdf:about="" xmlns:ll=\'{LONGLENS_OLD_NS}\' xmlns:dc="http://purl.org/dc/elements/1.1/">'
           f"<dc:description><rdf:Alt><rdf:li xml:lang=\"x-default\">see xmlns:a=\"{LONGLENS_OLD_NS}\"</rdf:li>"
           f"</rdf:Alt></dc:description><ll:Reviews><rdf:Bag><rdf:li ll:Caption=\"C.\" ll:Verdict=\"faithful\"/>"
           "</rdf:Bag></ll:Reviews></rdf:Description></rdf:RDF></x:xmpmeta>")
    text, n = migrate_namespace(old)
    assert n == 1 and text.count(LONGLENS_OLD_NS) == 2 and f"xmlns:ll='{LONGLENS_NS}'" in text
    assert reviews_in(text.encode()) == {"C.": ("faithful", None)}


def test_a_text_xml_cannot_carry_refuses_the_sidecar_with_the_reason():
    from engine.metadata.xmp import XmpError

    old = (DATA / "darktable.xmp").read_text(encoding="utf-8")
    with pytest.raises(XmpError, match=r"d.xmp: the merged sidecar would not read back .*control character"):
        merge_sidecar(old, "d.xmp", description="a vertical\x0btab", replace_description=True)
