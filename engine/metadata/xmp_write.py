"""Merging Longlens' review results into an XMP sidecar, at the text level.

Only what Longlens owns is written: its own property (`longlens:Reviews`, namespace
LONGLENS_NS) and entries added to the keyword lists (dc:subject, lr:hierarchicalSubject). Every
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

LONGLENS_NS = "https://longlens.example/ns/1.0/"
LONGLENS_PREFIX = "longlens"
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


def new_sidecar_text(sidecar_for: str | None) -> str:
    """An empty sidecar shaped as the Adobe toolkit writes one; `sidecar_for` is the picture's
    extension (photoshop:SidecarForExtension) for a stem-named (Lightroom) sidecar."""
    mark = ""
    if sidecar_for:
        mark = (f'\n    xmlns:photoshop="{NS["photoshop"]}"\n'
                f'   photoshop:SidecarForExtension="{_attr_escape(sidecar_for)}"')
    return (
        '<?xpacket begin="\ufeff" id="W5M0MpCehiHzreSzNTczkc9d"?>\n'
        f'<x:xmpmeta xmlns:x="{ADOBE_META}" x:xmptk="Longlens">\n'
        f' <rdf:RDF xmlns:rdf="{RDF}">\n'
        f'  <rdf:Description rdf:about=""{mark}>\n'
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


def merge_sidecar(old: str | None, source: str, *, reviews: Sequence[CaptionReview] = (),
                  subjects: Sequence[str] = (), paths: Sequence[str] = (),
                  sidecar_for: str | None = None) -> MergeResult:
    """The sidecar text with Longlens' results merged in, and what changed.

    `old`: the sidecar's current text (None: no sidecar yet, one is made). `reviews` replace the
    entries of the same captions in longlens:Reviews; `subjects` (flat) and `paths` ('|' between
    levels) are added to dc:subject and lr:hierarchicalSubject unless already there (case
    ignored); nothing is ever removed. Raises XmpError (naming `source`) for a packet that cannot
    be read or edited safely; then nothing may be written."""
    text = old if old is not None else new_sidecar_text(sidecar_for)
    rdf_root(text.encode("utf-8"), source)  # defusedxml: DTDs and entities refused
    nl = "\r\n" if "\r\n" in text else "\n"
    try:
        root = _scan(text)
    except XmpError as exc:
        raise XmpError(f"{source}: {exc}") from None
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
    changes: list[str] = []
    if main.children:
        indent = _indent_before(text, main.children[-1].start) or (_indent_before(text, main.start) + " ")
    else:
        indent = _indent_before(text, main.start) + " "
    step = " "

    # Keywords, into the list that is there (whichever Description holds it), else a new one.
    for uri, local, prefix, wanted in ((NS["dc"], "subject", "dc", subjects),
                                       (NS["lr"], "hierarchicalSubject", "lr", paths)):
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
        present = {text[li.start_end:li.end_start].strip().casefold() for li in lis if not li.empty}
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
            items = "".join(f"{nl}{indent}{step * 2}<{rdf_prefix}:li>{escape(w)}</{rdf_prefix}:li>" for w in new)
            blocks.append(f"<{name}{decl}>{nl}{indent}{step}<{rdf_prefix}:Bag>{items}{nl}{indent}{step}"
                          f"</{rdf_prefix}:Bag>{nl}{indent}</{name}>")

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
    if out != text:
        rdf_root(out.encode("utf-8"), source)  # what is written must read back
    return MergeResult(out, changes)
