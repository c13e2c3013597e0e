"""Merging Longlens' review results into an XMP sidecar, at the text level.

Only what Longlens owns or is asked to write is written: its own property (`longlens:Reviews`,
namespace LONGLENS_NS), entries added to the keyword lists (dc:subject, lr:hierarchicalSubject,
digiKam:TagsList, an MWG keyword tree), and when asked the description and title (dc:description,
dc:title: one language entry of the rdf:Alt that is there). Every
other byte of an existing sidecar stays as it was: the packet is parsed (defusedxml, DTDs
forbidden) to check it and to read what is there, then edited as text: new rdf:li lines are
inserted into the keyword Bags after their last entry, and in Longlens' own element only the
entry (rdf:li) of each exported caption is replaced, or a new one appended. Why text and not parse +
re-serialise: ElementTree drops prefixes, comments, attribute order, the xpacket wrapper and
every whitespace choice of the tool that wrote the file, so darktable's history or Lightroom's
develop settings would come back rewritten; a text edit provably leaves them byte-identical
(tests/engine/test_xmp_write.py compares every other element of the sample sidecars).

Inserted elements declare the namespaces they use on themselves when the Description does not
already declare them, so the Description's start tag is never rewritten (except a self-closing
`<rdf:Description .../>`, which must be opened to take children).

`longlens:Reviews` is an rdf:Bag with one entry per reviewed caption of the picture
(Caption, Verdict, Note, ReviewedAt and the per-sentence Sentences Seq). Entries are recognised
in every form a tool writes them: element form (rdf:parseType="Resource"; Longlens, exiftool),
attribute form (`<rdf:li><rdf:Description longlens:Caption="..."/>`: exiv2, hence darktable) and
Adobe's full form. An export leaves an entry that already says the same as it is, replaces a
changed one where it stands (carrying over the fields it does not write, and comments), appends
new ones, and keeps every other entry byte for byte (a picture reviewed against two caption files
keeps both, whatever re-serialised the first).
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from xml.etree import ElementTree as ET
from xml.sax.saxutils import escape

from engine.metadata.xmp import NS, RDF, XmpError, rdf_root

# Longlens' own namespace: an identifier, never fetched (XMP namespaces are names; nothing reads
# the URI over the network). It is on a domain the project holds, so no other schema can take
# it; "/ns/xmp/1.0/" leaves room for a later version of the schema beside this one.
LONGLENS_NS = "https://longlens.app/ns/xmp/1.0/"
# The placeholder used before issue 28: entries in it are still read, and an export rewrites its
# declarations to LONGLENS_NS (migrate_namespace), so a sidecar carries one Longlens namespace.
LONGLENS_OLD_NS = "https://longlens.example/ns/1.0/"
LONGLENS_PREFIX = "longlens"
DIGIKAM_NS = "http://www.digikam.org/ns/1.0/"
MWG_KW_NS = "http://www.metadataworkinggroup.com/schemas/keywords/"
XML_NS = "http://www.w3.org/XML/1998/namespace"
ADOBE_META = "adobe:ns:meta/"


@dataclass(frozen=True)
class SentenceReview:
    index: int
    text: str
    verdict: str | None
    note: str = ""


@dataclass(frozen=True)
class CaptionReview:
    """One caption's review of a picture, as written into `longlens:Reviews`."""

    caption: str
    verdict: str | None
    note: str = ""
    reviewed_at: float | None = None  # seconds since the epoch (the latest verdict's time)
    sentences: tuple[SentenceReview, ...] = ()


@dataclass
class MergeResult:
    text: str
    changes: list[str] = field(default_factory=list)  # what differs, one line each
    # What happened to each text field asked for ("dc:description" -> WRITTEN, KEPT_DIFFERS,
    # UNCHANGED or KEPT_OTHER_FORM), for the listing and the summary's counts.
    outcomes: dict[str, str] = field(default_factory=dict)
    migrated: int = 0  # declarations of LONGLENS_OLD_NS rewritten to LONGLENS_NS


# What happened to a description or title asked for.
WRITTEN = "written"
KEPT_DIFFERS = "kept: differs"  # the sidecar holds another text for that language; not replaced unless asked
UNCHANGED = "unchanged"  # the sidecar already says exactly that
KEPT_OTHER_FORM = "kept: not a language alternative"  # a plain value where an rdf:Alt belongs: not rewritten
OUTCOMES: tuple[str, ...] = (WRITTEN, KEPT_DIFFERS, UNCHANGED, KEPT_OTHER_FORM)


# --------------------------------------------------------------------------- a minimal tag scanner

_TAG = re.compile(
    r"<(?P<close>/)?(?P<name>[A-Za-z_][\w.\-]*(?::[A-Za-z_][\w.\-]*)?)"
    r"(?P<attrs>(?:\s+[^\s=/>]+\s*=\s*(?:\"[^\"]*\"|'[^']*'))*)\s*(?P<empty>/)?>"
)
_ATTR = re.compile(r"([^\s=/>]+)\s*=\s*(?:\"([^\"]*)\"|'([^']*)')")


@dataclass
class _El:
    qname: str
    uri: str
    local: str
    start: int  # offset of '<' of the start tag
    start_end: int  # offset just past the start tag's '>'
    end: int = -1  # offset just past the end tag (or the empty tag)
    end_start: int = -1  # offset of the end tag's '<' (== start for an empty tag)
    empty: bool = False
    scope: dict[str, str] = field(default_factory=dict)  # prefix -> uri in scope inside the element
    attrs: dict[str, str] = field(default_factory=dict)  # qualified name -> raw value
    children: list[_El] = field(default_factory=list)


def _scan(text: str) -> _El:
    """The element structure of an already well-formed packet, with offsets into `text`.
    Comments, processing instructions and CDATA are stepped over (never looked into)."""
    root = _El("", "", "", 0, 0)
    root.scope = {"xml": XML_NS}
    stack = [root]
    pos = 0
    n = len(text)
    while True:
        lt = text.find("<", pos)
        if lt < 0 or lt >= n:
            break
        for opener, closer in (("<!--", "-->"), ("<?", "?>"), ("<![CDATA[", "]]>"), ("<!", ">")):
            if text.startswith(opener, lt):
                stop = text.find(closer, lt + len(opener))
                pos = (stop + len(closer)) if stop >= 0 else n
                break
        else:
            m = _TAG.match(text, lt)
            if m is None:
                raise XmpError("the packet has a tag Longlens cannot follow; not changed")
            pos = m.end()
            if m.group("close"):
                el = stack.pop()
                el.end_start, el.end = lt, m.end()
                continue
            parent = stack[-1]
            scope = dict(parent.scope)
            attrs = {a.group(1): (a.group(2) if a.group(2) is not None else a.group(3))
                     for a in _ATTR.finditer(m.group("attrs"))}
            for k, v in attrs.items():
                if k == "xmlns":
                    scope[""] = v
                elif k.startswith("xmlns:"):
                    scope[k[6:]] = v
            qname = m.group("name")
            prefix, _, local = qname.rpartition(":")
            el = _El(qname, scope.get(prefix, ""), local, lt, m.end(), scope=scope, attrs=attrs)
            parent.children.append(el)
            if m.group("empty"):
                el.empty, el.end_start, el.end = True, lt, m.end()
            else:
                stack.append(el)
    return root


def _find(el: _El, uri: str, local: str) -> _El | None:
    for c in el.children:
        if c.uri == uri and c.local == local:
            return c
    return None


def _walk(el: _El):
    for c in el.children:
        yield c
        yield from _walk(c)


def _indent_before(text: str, offset: int) -> str:
    """The whitespace between the start of the line and `offset` (empty if not only whitespace)."""
    line_start = text.rfind("\n", 0, offset) + 1
    lead = text[line_start:offset]
    return lead if lead.strip() == "" else ""


def _prefix_for(scope: dict[str, str], uri: str) -> str | None:
    for p, u in scope.items():
        if u == uri and p:
            return p
    return None


def _attr_escape(value: str) -> str:
    return escape(value, {'"': "&quot;"})


# --------------------------------------------------------------------------- the merge


def new_sidecar_text(sidecar_for: str | None, *, tags_list: bool = False) -> str:
    """An empty sidecar shaped as the Adobe toolkit writes one; `sidecar_for` is the picture's
    extension (photoshop:SidecarForExtension) for a stem-named (Lightroom) sidecar. The
    namespaces Longlens may write are declared on the Description, as the tools do (digiKam's
    only when its TagsList is wanted)."""
    mark = ""
    if sidecar_for:
        mark = (f'\n    xmlns:photoshop="{NS["photoshop"]}"\n'
                f'   photoshop:SidecarForExtension="{_attr_escape(sidecar_for)}"')
    spaces = [("dc", NS["dc"]), ("lr", NS["lr"])] + ([("digiKam", DIGIKAM_NS)] if tags_list else []) + \
        [(LONGLENS_PREFIX, LONGLENS_NS)]
    decls = "".join(f'\n    xmlns:{p}="{u}"' for p, u in spaces)
    return (
        '<?xpacket begin="\ufeff" id="W5M0MpCehiHzreSzNTczkc9d"?>\n'
        f'<x:xmpmeta xmlns:x="{ADOBE_META}" x:xmptk="Longlens">\n'
        f' <rdf:RDF xmlns:rdf="{RDF}">\n'
        f'  <rdf:Description rdf:about=""{decls}{mark}>\n'
        "  </rdf:Description>\n"
        " </rdf:RDF>\n"
        "</x:xmpmeta>\n"
        '<?xpacket end="w"?>\n'
    )


_KNOWN_FIELDS = frozenset({"Caption", "Verdict", "Note", "ReviewedAt", "Sentences"})


def _fields(el: ET.Element) -> dict[str, ET.Element | str]:
    """The Longlens fields of one struct, in whichever form the writer chose: attributes on the
    element (exiv2's `<rdf:li longlens:Index="0"/>`), child elements (rdf:parseType="Resource",
    as Longlens and exiftool write it), or either of those on an rdf:Description inside it
    (exiv2's `<rdf:li><rdf:Description longlens:Caption="..."/></rdf:li>`)."""
    ll = f"{{{LONGLENS_NS}}}"
    holders = [el, *el.findall(f"{{{RDF}}}Description")]
    out: dict[str, ET.Element | str] = {}
    for h in holders:
        for k, v in h.attrib.items():
            if k.startswith(ll):
                out.setdefault(k[len(ll):], v)
        for c in h:
            if c.tag.startswith(ll):
                out.setdefault(c.tag[len(ll):], c)
    return out


def _value(v: ET.Element | str | None) -> str | None:
    if v is None or isinstance(v, str):
        return v
    inner = v.find(f"{{{RDF}}}Description")  # a value written as a resource: its rdf:value
    if inner is not None and inner.get(f"{{{RDF}}}value") is not None:
        return inner.get(f"{{{RDF}}}value")
    return v.text or ""


def _entry_review(li: ET.Element) -> CaptionReview | None:
    """One longlens:Reviews entry read back, in any serialisation; None when it is not one of ours
    (no Caption): such an entry is kept as it is."""
    f = _fields(li)
    caption = _value(f.get("Caption"))
    if caption is None:
        return None
    sentences = []
    seq = f.get("Sentences")
    if isinstance(seq, ET.Element):
        for sli in seq.iter(f"{{{RDF}}}li"):
            sf = _fields(sli)
            try:
                idx = int((_value(sf.get("Index")) or "").strip())
            except ValueError:
                continue
            sentences.append(SentenceReview(idx, _value(sf.get("Text")) or "", _value(sf.get("Verdict")) or None,
                                            _value(sf.get("Note")) or ""))
    return CaptionReview(caption, _value(f.get("Verdict")) or None, _value(f.get("Note")) or "",
                         _parse_time(_value(f.get("ReviewedAt"))), tuple(sentences))


def _fragment(text: str, el: _El) -> ET.Element:
    """`el` (from the already checked packet) parsed on its own, with the namespaces in scope."""
    decls = "".join(f' xmlns:{p}="{_attr_escape(u)}"' for p, u in el.scope.items() if p and p != "xml")
    default = f' xmlns="{_attr_escape(el.scope[""])}"' if el.scope.get("") else ""
    wrapper = ET.fromstring(f"<w{decls}{default}>{text[el.start:el.end]}</w>".encode())
    return wrapper[0]


def _parse_time(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _format_time(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def _entry_xml(r: CaptionReview, ll: str, rdf: str, indent: str, step: str, nl: str, *, decl: str = "",
               carried: Sequence[str] = ()) -> str:
    """One longlens:Reviews entry (an rdf:li) in element form; `carried`: what an earlier entry of
    the caption held that Longlens does not write (unknown fields, comments), kept verbatim."""
    i1, i2, i3, i4, i5 = (indent + step * k for k in range(1, 6))
    lines = [f'<{rdf}:li {rdf}:parseType="Resource"{decl}>']
    lines.append(f"{i1}<{ll}:Caption>{escape(r.caption)}</{ll}:Caption>")
    if r.verdict:
        lines.append(f"{i1}<{ll}:Verdict>{escape(r.verdict)}</{ll}:Verdict>")
    if r.note:
        lines.append(f"{i1}<{ll}:Note>{escape(r.note)}</{ll}:Note>")
    if r.reviewed_at is not None:
        lines.append(f"{i1}<{ll}:ReviewedAt>{_format_time(r.reviewed_at)}</{ll}:ReviewedAt>")
    if r.sentences:
        lines += [f"{i1}<{ll}:Sentences>", f"{i2}<{rdf}:Seq>"]
        for s in r.sentences:
            lines.append(f'{i3}<{rdf}:li {rdf}:parseType="Resource">')
            lines.append(f"{i4}<{ll}:Index>{s.index}</{ll}:Index>")
            lines.append(f"{i4}<{ll}:Text>{escape(s.text)}</{ll}:Text>")
            if s.verdict:
                lines.append(f"{i4}<{ll}:Verdict>{escape(s.verdict)}</{ll}:Verdict>")
            if s.note:
                lines.append(f"{i4}<{ll}:Note>{escape(s.note)}</{ll}:Note>")
            lines.append(f"{i3}</{rdf}:li>")
        lines += [f"{i2}</{rdf}:Seq>", f"{i1}</{ll}:Sentences>"]
    lines += [f"{i1}{c}" for c in carried]
    lines.append(f"{indent}</{rdf}:li>")
    return nl.join(lines)


def _reviews_xml(reviews: Sequence[CaptionReview], ll: str, rdf: str, indent: str, step: str, nl: str,
                 declare: bool) -> str:
    decl = f' xmlns:{ll}="{LONGLENS_NS}"' if declare else ""
    lines = [f"<{ll}:Reviews{decl}>", f"{indent}{step}<{rdf}:Bag>"]
    lines += [f"{indent}{step * 2}{_entry_xml(r, ll, rdf, indent + step * 2, step, nl)}" for r in reviews]
    lines += [f"{indent}{step}</{rdf}:Bag>", f"{indent}</{ll}:Reviews>"]
    return nl.join(lines)


def _carried(text: str, li: _El) -> tuple[list[str], str]:
    """What an entry being replaced holds that Longlens does not write: unknown fields (as written;
    an unknown attribute becomes the equivalent element) and comments, and the namespace
    declarations they need (those made on the entry itself or its inner rdf:Description)."""
    holders = [li] + [c for c in li.children if c.uri == RDF and c.local == "Description"]
    decls = "".join(f' {k}="{v}"' for h in holders for k, v in h.attrs.items() if k.startswith("xmlns:"))
    kept: list[str] = []
    for h in holders:
        for k, v in h.attrs.items():
            prefix, _, local = k.rpartition(":")
            uri = h.scope.get(prefix, "") if prefix else ""
            if k.startswith("xmlns") or not prefix or uri == RDF or (uri == LONGLENS_NS and local in _KNOWN_FIELDS):
                continue
            kept.append(f"<{k}>{v}</{k}>")
        if h.empty:
            continue
        pos = h.start_end
        for c in h.children:
            gap = text[pos:c.start].strip()
            if gap:
                kept.append(gap)  # comments between fields
            if not (c.uri == RDF and c.local == "Description" and h is li) and \
                    not (c.uri == LONGLENS_NS and c.local in _KNOWN_FIELDS):
                kept.append(text[c.start:c.end])
            pos = c.end
        gap = text[pos:h.end_start].strip()
        if gap:
            kept.append(gap)
    return kept, decls


def _as_written(r: CaptionReview) -> CaptionReview:
    """`r` as the sidecar holds it (times to the second, as _format_time writes them)."""
    at = _parse_time(_format_time(r.reviewed_at)) if r.reviewed_at is not None else None
    return CaptionReview(r.caption, r.verdict or None, r.note or "", at,
                         tuple(sorted((SentenceReview(s.index, s.text, s.verdict or None, s.note or "")
                                       for s in r.sentences), key=lambda s: s.index)))


def _merge_reviews(text: str, prop: _El, reviews: Sequence[CaptionReview], rdf_prefix: str, step: str, nl: str,
                   source: str, changes: list[str]) -> list[tuple[int, int, str]]:
    box = next((c for c in prop.children if c.uri == RDF and c.local in ("Bag", "Seq")), None)
    if box is None or any(not (c.uri == RDF and c.local == "li") for c in box.children):
        raise XmpError(f"{source}: longlens:Reviews is not a list Longlens can edit; not changed")
    rp = _prefix_for(box.scope, RDF) or rdf_prefix
    llp = _prefix_for(box.scope, LONGLENS_NS)
    entries: dict[str, tuple[_El, CaptionReview]] = {}
    for li in box.children:
        review = _entry_review(_fragment(text, li))
        if review is not None and review.caption not in entries:
            entries[review.caption] = (li, review)
    edits: list[tuple[int, int, str]] = []
    appended: list[CaptionReview] = []
    replaced = 0
    for r in reviews:
        if r.caption not in entries:
            appended.append(r)
            continue
        li, old = entries[r.caption]
        if _as_written(old) == _as_written(r):
            continue  # already there (in whatever form): left as it is
        carried, decls = _carried(text, li)
        if llp is None and LONGLENS_NS not in decls:
            decls += f' xmlns:{LONGLENS_PREFIX}="{LONGLENS_NS}"'
        li_indent = _indent_before(text, li.start)
        edits.append((li.start, li.end, _entry_xml(r, llp or LONGLENS_PREFIX, rp, li_indent, step, nl, decl=decls,
                                                   carried=carried)))
        replaced += 1
    if appended:
        decl = "" if llp else f' xmlns:{LONGLENS_PREFIX}="{LONGLENS_NS}"'
        lis = box.children
        if lis:
            li_indent = _indent_before(text, lis[-1].start)
            edits.append((lis[-1].end, lis[-1].end, "".join(
                nl + li_indent + _entry_xml(r, llp or LONGLENS_PREFIX, rp, li_indent, step, nl, decl=decl)
                for r in appended)))
        else:
            bi = _indent_before(text, box.start)
            items = "".join(nl + bi + step + _entry_xml(r, llp or LONGLENS_PREFIX, rp, bi + step, step, nl, decl=decl)
                            for r in appended)
            if box.empty:
                edits.append((box.start, box.end, f"<{box.qname}>{items}{nl}{bi}</{box.qname}>"))
            else:
                edits.append((box.start_end, box.start_end, items))
    if edits:
        written = replaced + len(appended)
        changes.append(f"longlens:Reviews: {written} caption review(s) written ({len(appended)} new, {replaced} "
                       f"replaced; {len(box.children) - replaced} kept)")
    return edits


_OLD_NS_DECL = re.compile(r"(\bxmlns(?::[A-Za-z_][\w.\-]*)?\s*=\s*)([\"'])" + re.escape(LONGLENS_OLD_NS) + r"\2")


def migrate_namespace(text: str) -> tuple[str, int]:
    """`text` with every declaration of the old placeholder namespace (LONGLENS_OLD_NS) pointing
    at LONGLENS_NS, and how many were changed. Only the URI inside the declarations changes: the
    prefix, the entries (in whatever form a tool re-serialised them) and every other byte stay,
    and everything in the old namespace was Longlens' own, so all of it moves. Declarations are
    looked for in start tags only (never in comments or text)."""
    spans: list[tuple[int, int]] = []

    def collect(el: _El) -> None:
        for c in el.children:
            spans.append((c.start, c.start_end))
            collect(c)

    collect(_scan(text))
    out, count, last = [], 0, 0
    for start, end in spans:
        tag = text[start:end]
        new, n = _OLD_NS_DECL.subn(lambda m: f"{m.group(1)}{m.group(2)}{LONGLENS_NS}{m.group(2)}", tag)
        if n:
            out += [text[last:start], new]
            last, count = end, count + n
    out.append(text[last:])
    return "".join(out), count


_LANG_TAG = re.compile(r"^(x-default|[A-Za-z]{1,8}(-[A-Za-z0-9]{1,8})*)$")


def language_problem(language: str) -> str | None:
    """Why `language` cannot be an xml:lang of a description or title, or None (RFC 3066 / BCP 47
    shape: "x-default", "en", "en-GB", "nb-NO", "zh-Hant-TW")."""
    if not _LANG_TAG.match(language or ""):
        return (f"{language!r} is not a language tag; use one like en, en-GB, de or nb-NO "
                "(or x-default, the entry every tool shows by default)")
    return None


def _lang_of(li: _El) -> str:
    for k, v in li.attrs.items():
        prefix, _, local = k.rpartition(":")
        if local == "lang" and prefix and li.scope.get(prefix) == XML_NS:
            return v
    return ""


def _li_text(text: str, li: _El) -> tuple[str | None, tuple[int, int] | None]:
    """One rdf:Alt entry's text and the span of `text` that holds it (to replace it), in the forms
    tools write: `<rdf:li xml:lang="x-default">text</rdf:li>` (Adobe, exiv2, darktable, exiftool),
    an empty `<rdf:li .../>` (span None: the entry is rewritten whole), or the qualified form
    `<rdf:li rdf:parseType="Resource"><rdf:value>text</rdf:value>...` / rdf:value as an
    attribute. (None, None) for a shape Longlens does not edit."""
    if li.empty:
        value = li.attrs.get(next((k for k in li.attrs if k.endswith(":value") and li.scope.get(k.split(":")[0]) == RDF),
                                  ""), "")
        return value, None
    if not li.children:
        return "".join(_fragment(text, li).itertext()), (li.start_end, li.end_start)
    value_el = next((c for c in li.children if c.uri == RDF and c.local == "value"), None)
    if value_el is not None and not value_el.children:
        if value_el.empty:
            return "", None
        return "".join(_fragment(text, value_el).itertext()), (value_el.start_end, value_el.end_start)
    return None, None


def _merge_lang_alt(text: str, descs: list[_El], uri: str, local: str, prefix: str, value: str, language: str,
                    replace: bool, rdf_prefix: str, step: str, nl: str
                    ) -> tuple[str, list[tuple[int, int, str]], str | None, str]:
    """dc:title / dc:description: the entry of `language` set to `value` in the rdf:Alt that is
    there (whichever Description holds it, whatever its formatting), or a new property (returned
    as a block for the main Description). Returns (outcome, edits, new block or None, detail).
    An entry of that language with another text is kept unless `replace`. Like Adobe's XMP
    Toolkit (SetLocalizedText), an Alt that has no x-default entry gets one with the same text,
    first, so tools that show only x-default (darktable, exiftool's default) show it."""
    canonical = f"{prefix}:{local}"
    lang = language.casefold()
    for d in descs:
        for k, v in d.attrs.items():
            p, _, loc = k.rpartition(":")
            if p and d.scope.get(p) == uri and loc == local:
                if v.strip() == value.strip():
                    return UNCHANGED, [], None, ""
                return KEPT_OTHER_FORM, [], None, f"written as a plain attribute ({canonical}=\"...\"), not changed"
    prop = next((p for d in descs if (p := _find(d, uri, local)) is not None), None)
    if prop is None:
        return WRITTEN, [], "new", ""
    alt = next((c for c in prop.children if c.uri == RDF and c.local == "Alt"), None)
    if alt is None:
        old = "".join(_fragment(text, prop).itertext()) if not prop.children else None
        if old is not None and old.strip() == value.strip():
            return UNCHANGED, [], None, ""
        return KEPT_OTHER_FORM, [], None, "holds no rdf:Alt (a plain value), not changed"
    lis = [c for c in alt.children if c.uri == RDF and c.local == "li"]
    rp = _prefix_for(alt.scope, RDF) or rdf_prefix
    entry = next((li for li in lis if _lang_of(li).casefold() == lang), None)
    edits: list[tuple[int, int, str]] = []
    detail = ""
    if entry is not None:
        old, span = _li_text(text, entry)
        if old is None:
            return KEPT_OTHER_FORM, [], None, f"its {language} entry has a form Longlens does not edit; not changed"
        if old.strip() == value.strip():
            return UNCHANGED, [], None, ""
        if not replace and old.strip():  # an empty entry holds nothing to keep: filled in
            return KEPT_DIFFERS, [], None, f"the sidecar says {_short(old)}"
        detail = f"replaced {_short(old)}" if old.strip() else ""
        if span is not None:
            edits.append((span[0], span[1], escape(value)))
        else:
            start_tag = text[entry.start:entry.end].rstrip("/> \t\r\n")
            start_tag = re.sub(r"\s+\S+:value\s*=\s*(\"[^\"]*\"|'[^']*')", "", start_tag)
            edits.append((entry.start, entry.end, f"{start_tag}>{escape(value)}</{entry.qname}>"))
    new_langs = [] if entry is not None else [language]
    if lang != "x-default" and not any(_lang_of(li).casefold() == "x-default" for li in lis):
        new_langs.insert(0, "x-default")
    if new_langs:
        first = [w for w in new_langs if w.casefold() == "x-default"]
        rest = [w for w in new_langs if w.casefold() != "x-default"]

        def li_xml(lg: str) -> str:
            return f'<{rp}:li xml:lang="{_attr_escape(lg)}">{escape(value)}</{rp}:li>'

        if lis:
            ind = _indent_before(text, lis[0].start)
            if first:  # x-default first, as the XMP specification asks
                edits.append((lis[0].start, lis[0].start, "".join(li_xml(lg) + nl + ind for lg in first)))
            if rest:
                ind_last = _indent_before(text, lis[-1].start)
                edits.append((lis[-1].end, lis[-1].end, "".join(nl + ind_last + li_xml(lg) for lg in rest)))
        else:
            ai = _indent_before(text, alt.start)
            items = "".join(f"{nl}{ai}{step}{li_xml(lg)}" for lg in first + rest)
            if alt.empty:
                edits.append((alt.start, alt.end, f"<{alt.qname}>{items}{nl}{ai}</{alt.qname}>"))
            else:
                edits.append((alt.start_end, alt.start_end, items))
    return WRITTEN, edits, None, detail


def _short(text: str, limit: int = 60) -> str:
    one = " ".join(text.split())
    return repr(one if len(one) <= limit else one[: limit - 1] + "…")


def _lang_alt_block(name: str, decl: str, value: str, language: str, rdf_prefix: str, indent: str, step: str,
                    nl: str) -> str:
    langs = ["x-default"] if language.casefold() == "x-default" else ["x-default", language]
    items = "".join(f'{nl}{indent}{step * 2}<{rdf_prefix}:li xml:lang="{_attr_escape(lg)}">{escape(value)}'
                    f"</{rdf_prefix}:li>" for lg in langs)
    return f"<{name}{decl}>{nl}{indent}{step}<{rdf_prefix}:Alt>{items}{nl}{indent}{step}</{rdf_prefix}:Alt>{nl}{indent}</{name}>"


def _attr_named(el: _El, uri: str, local: str) -> str | None:
    for k, v in el.attrs.items():
        prefix, _, loc = k.rpartition(":")
        if loc == local and prefix and el.scope.get(prefix) == uri:
            return v
    return None


def _mwg_node(text: str, li: _El) -> tuple[str | None, _El | None]:
    """One node of an MWG keyword tree: its Keyword and its Children's rdf:Bag, in the forms tools
    write (exiftool: `<rdf:li rdf:parseType="Resource"><mwg-kw:Keyword>..`; exiv2: `<rdf:li><rdf:
    Description mwg-kw:Keyword="..">` or, for a leaf, `<rdf:li mwg-kw:Keyword=".."/>`)."""
    holders = [li] + [c for c in li.children if c.uri == RDF and c.local == "Description"]
    keyword, bag = None, None
    for h in holders:
        keyword = keyword or _attr_named(h, MWG_KW_NS, "Keyword")
        for c in h.children:
            if c.uri == MWG_KW_NS and c.local == "Keyword" and keyword is None:
                keyword = "".join(_fragment(text, c).itertext())
            if c.uri == MWG_KW_NS and c.local == "Children":
                bag = next((b for b in c.children if b.uri == RDF and b.local in ("Bag", "Seq")), bag)
    return (keyword.strip() if keyword is not None else None), bag


def _mwg_add_path(text: str, levels: list[str], nl: str, step: str) -> tuple[str, str | None]:
    """`text` with the keyword path added to the MWG keyword tree (mwg-kw:Keywords/Hierarchy), the
    levels already there matched case-insensitively and the rest inserted as new nodes in element
    form; and None, or why the tree is not edited. Only the node that gets children changes (an
    exiv2 leaf `<rdf:li mwg-kw:Keyword="A"/>` becomes `<rdf:li><rdf:Description mwg-kw:Keyword="A">`,
    its attributes as written); every other byte stays."""
    root = _scan(text)
    prop = next((e for e in _walk(root) if e.uri == MWG_KW_NS and e.local == "Keywords"), None)
    if prop is None:
        return text, None
    holders = [prop] + [c for c in prop.children if c.uri == RDF and c.local == "Description"]
    hierarchy = next((c for h in holders for c in h.children if c.uri == MWG_KW_NS and c.local == "Hierarchy"), None)
    bag = next((b for b in (hierarchy.children if hierarchy else []) if b.uri == RDF and b.local in ("Bag", "Seq")),
               None)
    if bag is None:
        return text, "mwg-kw:Keywords has no Hierarchy list; not changed"
    node: _El | None = None
    found = 0  # levels of the path already in the tree
    for level in levels:
        lis = [c for c in bag.children if c.uri == RDF and c.local == "li"] if bag is not None else []
        match = next((li for li in lis if (_mwg_node(text, li)[0] or "").casefold() == level.casefold()), None)
        if match is None:
            break
        node, found = match, found + 1
        bag = _mwg_node(text, match)[1]
    if found == len(levels):
        return text, None  # the whole path is there
    rest = levels[found:]
    scope_el = bag if bag is not None else (node if node is not None else prop)
    rp = _prefix_for(scope_el.scope, RDF) or "rdf"
    mp = _prefix_for(scope_el.scope, MWG_KW_NS)
    decl = "" if mp else f' xmlns:mwg-kw="{MWG_KW_NS}"'
    mp = mp or "mwg-kw"

    def chain(names: list[str], first: bool) -> str:
        inner = f"<{mp}:Keyword>{escape(names[0])}</{mp}:Keyword>"
        if names[1:]:
            inner += f"<{mp}:Children><{rp}:Bag>{chain(names[1:], False)}</{rp}:Bag></{mp}:Children>"
        return f'<{rp}:li {rp}:parseType="Resource"{decl if first else ""}>{inner}</{rp}:li>'

    if bag is not None:  # the first missing level goes into this list
        lis = [c for c in bag.children if c.uri == RDF and c.local == "li"]
        if lis:
            ind = _indent_before(text, lis[-1].start)
            at, new = lis[-1].end, (nl + ind if ind else "") + chain(rest, True)
            return text[:at] + new + text[at:], None
        if bag.empty:
            return text[:bag.start] + f"<{bag.qname}>{chain(rest, True)}</{bag.qname}>" + text[bag.end:], None
        return text[:bag.start_end] + chain(rest, True) + text[bag.start_end:], None
    # A node without children gets them.
    assert node is not None
    children = f"<{mp}:Children{decl}><{rp}:Bag>{chain(rest, False)}</{rp}:Bag></{mp}:Children>"
    desc = next((c for c in node.children if c.uri == RDF and c.local == "Description"), None)
    holder = desc if desc is not None else (node if not node.empty else None)
    if holder is None:  # <rdf:li mwg-kw:Keyword="A"/>: its attributes move to an inner Description
        attrs = text[node.start + 1 + len(node.qname):node.end].rstrip()
        attrs = attrs[:-2].rstrip() if attrs.endswith("/>") else attrs
        return (text[:node.start] + f"<{node.qname}><{rp}:Description{attrs}>{children}</{rp}:Description>"
                f"</{node.qname}>" + text[node.end:]), None
    if holder.empty:
        start_tag = text[holder.start:holder.end].rstrip()
        start_tag = start_tag[:-2].rstrip() if start_tag.endswith("/>") else start_tag
        return text[:holder.start] + f"{start_tag}>{children}</{holder.qname}>" + text[holder.end:], None
    if holder.children:
        last = holder.children[-1]
        ind = _indent_before(text, last.start)
        at, new = last.end, (nl + ind if ind else "") + children
    else:
        at, new = holder.start_end, children
    return text[:at] + new + text[at:], None


def merge_sidecar(old: str | None, source: str, *, reviews: Sequence[CaptionReview] = (),
                  subjects: Sequence[str] = (), paths: Sequence[str] = (), tags: Sequence[str] = (),
                  tags_list: bool = False, description: str | None = None, title: str | None = None,
                  language: str = "x-default", replace_description: bool = False, replace_title: bool = False,
                  sidecar_for: str | None = None) -> MergeResult:
    """The sidecar text with Longlens' results merged in, and what changed.

    `old`: the sidecar's current text (None: no sidecar yet, one is made). `reviews` replace the
    entries of the same captions in longlens:Reviews; `subjects` (flat) and `paths` ('|' between
    levels) are added to dc:subject and lr:hierarchicalSubject unless already there (case
    ignored); `tags` ('|' between levels) to digiKam:TagsList ('/' between levels, as digiKam
    writes it) when the sidecar has one, or `tags_list` asks for a new one; nothing is ever
    removed. `description` / `title` go into the `language` entry of dc:description / dc:title
    (see _merge_lang_alt): an entry with another text is kept unless `replace_description` /
    `replace_title`. Declarations of the old Longlens namespace are migrated (migrate_namespace).
    Raises XmpError (naming `source`) for a packet that cannot be read or edited safely; then
    nothing may be written."""
    fresh = new_sidecar_text(sidecar_for, tags_list=tags_list)
    text = old if old is not None else fresh
    rdf_root(text.encode("utf-8"), source)  # defusedxml: DTDs and entities refused
    nl = "\r\n" if "\r\n" in text else "\n"
    changes: list[str] = []
    outcomes: dict[str, str] = {}
    try:
        text, migrated = migrate_namespace(text)
        root = _scan(text)
    except XmpError as exc:
        raise XmpError(f"{source}: {exc}") from None
    if migrated:
        changes.append(f"Longlens namespace: migrated ({LONGLENS_OLD_NS} -> {LONGLENS_NS}; the entries as they were)")
    # An MWG keyword tree, when there is one, gets each path (before the other edits: it is edited
    # path by path, read again after each, so two paths sharing a new parent make one node).
    added: list[str] = []
    for path in tags:
        try:
            new_text, why = _mwg_add_path(text, [lv for lv in path.split("|") if lv], nl, " ")
        except XmpError as exc:
            raise XmpError(f"{source}: {exc}") from None
        if why:
            changes.append(why)
            break
        if new_text != text:
            text = new_text
            added.append(path)
    if added:
        changes.append("mwg-kw:Keywords: add " + ", ".join(repr(p) for p in added))
    root = _scan(text)
    rdf_el = next((e for e in _walk(root) if e.uri == RDF and e.local == "RDF"), None)
    descs = [c for c in (rdf_el.children if rdf_el else []) if c.uri == RDF and c.local == "Description"]
    if not descs:
        raise XmpError(f"{source}: no rdf:Description to add to; not changed")
    main = descs[0]
    rdf_prefix = _prefix_for(main.scope, RDF)
    if rdf_prefix is None:
        raise XmpError(f"{source}: the RDF namespace has no prefix; Longlens does not edit such a packet")

    edits: list[tuple[int, int, str]] = []  # (start, end, replacement), never overlapping
    blocks: list[str] = []  # new properties for the end of the main Description
    if main.children:
        indent = _indent_before(text, main.children[-1].start) or (_indent_before(text, main.start) + " ")
    else:
        indent = _indent_before(text, main.start) + " "
    step = " "

    # Titles and descriptions: the entry of the language asked for, in the Alt that is there.
    for uri, local, prefix, value, replace in ((NS["dc"], "title", "dc", title, replace_title),
                                               (NS["dc"], "description", "dc", description, replace_description)):
        if value is None:
            continue
        canonical = f"{prefix}:{local}"
        outcome, alt_edits, new, detail = _merge_lang_alt(text, descs, uri, local, prefix, value, language, replace,
                                                          rdf_prefix, step, nl)
        if new is not None:
            p = _prefix_for(main.scope, uri)
            blocks.append(_lang_alt_block(f"{p or prefix}:{local}", "" if p else f' xmlns:{prefix}="{uri}"', value,
                                          language, rdf_prefix, indent, step, nl))
        edits += alt_edits
        outcomes[canonical] = outcome
        changes.append(f"{canonical} [{language}]: {outcome}" + (f" ({detail})" if detail else ""))

    # Keywords, into every list the sidecar already has (whichever Description holds it), else a
    # new one where that scheme is wanted: digiKam reads digiKam:TagsList first and stops there,
    # so a keyword missing from it is one digiKam never shows.
    has_tags_list = any(_find(d, DIGIKAM_NS, "TagsList") is not None for d in descs)
    tag_entries: list[str] = []
    for t in tags:
        levels = t.split("|")
        if any("/" in level for level in levels):
            changes.append(f"digiKam:TagsList: {t!r} not added ('/' separates digiKam's levels)")
            continue
        tag_entries.append("/".join(levels))
    schemes = [(NS["dc"], "subject", "dc", subjects), (NS["lr"], "hierarchicalSubject", "lr", paths)]
    if has_tags_list or tags_list:
        schemes.append((DIGIKAM_NS, "TagsList", "digiKam", tag_entries))
    for uri, local, prefix, wanted in schemes:
        canonical = f"{prefix}:{local}"
        if not wanted:
            continue
        if any(d.scope.get(k.rpartition(":")[0]) == uri and k.rpartition(":")[2] == local
               for d in descs for k in d.attrs):
            raise XmpError(f"{source}: {canonical} is written as a single attribute value, not a list; not changed")
        prop = next((p for d in descs if (p := _find(d, uri, local)) is not None), None)
        box = None
        lis: list[_El] = []
        if prop is not None:
            box = next((c for c in prop.children if c.uri == RDF and c.local in ("Bag", "Seq")), None)
            if box is None:
                raise XmpError(f"{source}: {canonical} holds no rdf:Bag; not changed")
            lis = [c for c in box.children if c.uri == RDF and c.local == "li"]
        present = {"".join(_fragment(text, li).itertext()).strip().casefold() for li in lis if not li.empty}
        new: list[str] = []
        for w in wanted:
            if w.casefold() not in present and w.casefold() not in {x.casefold() for x in new}:
                new.append(w)
        if not new:
            continue
        changes.append(f"{canonical}: add " + ", ".join(repr(w) for w in new))
        if box is not None:
            rp = _prefix_for(box.scope, RDF) or rdf_prefix
            if lis:
                li_indent = _indent_before(text, lis[-1].start)
                edits.append((lis[-1].end, lis[-1].end,
                              "".join(f"{nl}{li_indent}<{rp}:li>{escape(w)}</{rp}:li>" for w in new)))
            else:
                bi = _indent_before(text, box.start)
                items = "".join(f"{nl}{bi}{step}<{rp}:li>{escape(w)}</{rp}:li>" for w in new)
                if box.empty:  # <rdf:Bag/>
                    edits.append((box.start, box.end, f"<{box.qname}>{items}{nl}{bi}</{box.qname}>"))
                else:
                    edits.append((box.start_end, box.start_end, items))
        else:
            p = _prefix_for(main.scope, uri)
            name = f"{p or prefix}:{local}"
            decl = "" if p else f' xmlns:{prefix}="{uri}"'
            container = "Seq" if uri == DIGIKAM_NS else "Bag"  # as digiKam writes its TagsList
            items = "".join(f"{nl}{indent}{step * 2}<{rdf_prefix}:li>{escape(w)}</{rdf_prefix}:li>" for w in new)
            blocks.append(f"<{name}{decl}>{nl}{indent}{step}<{rdf_prefix}:{container}>{items}{nl}{indent}{step}"
                          f"</{rdf_prefix}:{container}>{nl}{indent}</{name}>")
    # Longlens' own property: only the entry of each exported caption is replaced, or a new one is
    # appended; every other entry (another caption's, in whatever form a tool re-serialised it, or
    # one Longlens does not recognise) and everything around it keeps its bytes.
    found = next(((d, p) for d in descs if (p := _find(d, LONGLENS_NS, "Reviews")) is not None), None)
    if reviews:
        if found is None:
            p = _prefix_for(main.scope, LONGLENS_NS)
            blocks.append(_reviews_xml(reviews, p or LONGLENS_PREFIX, rdf_prefix, indent, step, nl,
                                       declare=p is None))
            changes.append(f"longlens:Reviews: {len(reviews)} caption review(s) written "
                           f"({len(reviews)} new, 0 replaced; 0 kept)")
        else:
            edits += _merge_reviews(text, found[1], reviews, rdf_prefix, step, nl, source, changes)

    if blocks:
        joined = "".join(f"{nl}{indent}{b}" for b in blocks)
        if main.children:
            edits.append((main.children[-1].end, main.children[-1].end, joined))
        elif main.empty:
            # <rdf:Description .../> must be opened to hold children.
            di = _indent_before(text, main.start)
            edits.append((main.start_end - 2, main.start_end, f">{joined}{nl}{di}</{main.qname}>"))
        else:
            # Only whitespace between the tags: ours go after the start tag, before the end tag's line.
            edits.append((main.start_end, main.start_end, joined))

    out = text
    for start, end, repl in sorted(edits, key=lambda e: e[0], reverse=True):
        out = out[:start] + repl + out[end:]
    if out != (old if old is not None else fresh):
        try:
            rdf_root(out.encode("utf-8"), source)  # what is written must read back
        except XmpError as exc:
            raise XmpError(f"{source}: the merged sidecar would not read back ({exc}); a text holds something "
                           "XML cannot carry (a control character?); not changed") from None
    return MergeResult(out, changes, outcomes, migrated)
