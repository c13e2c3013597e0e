"""Merging Longlens' review results into an XMP sidecar, at the text level.

Only what Longlens owns is written: its own property (`longlens:Reviews`, namespace
LONGLENS_NS) and entries added to the keyword lists (dc:subject, lr:hierarchicalSubject). Every
other byte of an existing sidecar stays as it was: the packet is parsed (defusedxml, DTDs
forbidden) to check it and to read what is there, then edited as text: new rdf:li lines are
inserted into the keyword Bags after their last entry, and Longlens' own element is replaced
whole or inserted after the last property of the rdf:Description. Why text and not parse +
re-serialise: ElementTree drops prefixes, comments, attribute order, the xpacket wrapper and
every whitespace choice of the tool that wrote the file, so darktable's history or Lightroom's
develop settings would come back rewritten; a text edit provably leaves them byte-identical
(tests/engine/test_xmp_write.py compares every other element of the sample sidecars).

Inserted elements declare the namespaces they use on themselves when the Description does not
already declare them, so the Description's start tag is never rewritten (except a self-closing
`<rdf:Description .../>`, which must be opened to take children).

`longlens:Reviews` is an rdf:Bag with one entry per reviewed caption of the picture
(Caption, Verdict, Note, ReviewedAt and the per-sentence Sentences Seq). An export replaces the
entries of the captions it exports and keeps the others (a picture reviewed against two caption
files keeps both).
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


def _existing_reviews(tree: ET.Element) -> list[CaptionReview]:
    """The entries of a longlens:Reviews already in the packet (read back to keep the others)."""
    out: list[CaptionReview] = []
    ll = f"{{{LONGLENS_NS}}}"
    for desc in tree.findall(f"{{{RDF}}}Description"):
        prop = desc.find(f"{ll}Reviews")
        if prop is None:
            continue
        for li in prop.iter(f"{{{RDF}}}li"):
            cap = li.find(f"{ll}Caption")
            if cap is None:
                continue  # a sentence entry, or not ours
            sentences = []
            for sli in li.findall(f"{ll}Sentences/{{{RDF}}}Seq/{{{RDF}}}li"):
                try:
                    idx = int((sli.findtext(f"{ll}Index") or "").strip())
                except ValueError:
                    continue
                sentences.append(SentenceReview(idx, sli.findtext(f"{ll}Text") or "",
                                                (sli.findtext(f"{ll}Verdict") or None), sli.findtext(f"{ll}Note") or ""))
            out.append(CaptionReview(cap.text or "", li.findtext(f"{ll}Verdict") or None, li.findtext(f"{ll}Note") or "",
                                     _parse_time(li.findtext(f"{ll}ReviewedAt")), tuple(sentences)))
        break
    return out


def _parse_time(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _format_time(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def _reviews_xml(reviews: Sequence[CaptionReview], ll: str, rdf: str, indent: str, step: str, nl: str,
                 declare: bool) -> str:
    i0, i1, i2, i3, i4, i5, i6 = (indent + step * k for k in range(7))
    decl = f' xmlns:{ll}="{LONGLENS_NS}"' if declare else ""
    lines = [f"<{ll}:Reviews{decl}>", f"{i1}<{rdf}:Bag>"]
    for r in reviews:
        lines.append(f'{i2}<{rdf}:li {rdf}:parseType="Resource">')
        lines.append(f"{i3}<{ll}:Caption>{escape(r.caption)}</{ll}:Caption>")
        if r.verdict:
            lines.append(f"{i3}<{ll}:Verdict>{escape(r.verdict)}</{ll}:Verdict>")
        if r.note:
            lines.append(f"{i3}<{ll}:Note>{escape(r.note)}</{ll}:Note>")
        if r.reviewed_at is not None:
            lines.append(f"{i3}<{ll}:ReviewedAt>{_format_time(r.reviewed_at)}</{ll}:ReviewedAt>")
        if r.sentences:
            lines += [f"{i3}<{ll}:Sentences>", f"{i4}<{rdf}:Seq>"]
            for s in r.sentences:
                lines.append(f'{i5}<{rdf}:li {rdf}:parseType="Resource">')
                lines.append(f"{i6}<{ll}:Index>{s.index}</{ll}:Index>")
                lines.append(f"{i6}<{ll}:Text>{escape(s.text)}</{ll}:Text>")
                if s.verdict:
                    lines.append(f"{i6}<{ll}:Verdict>{escape(s.verdict)}</{ll}:Verdict>")
                if s.note:
                    lines.append(f"{i6}<{ll}:Note>{escape(s.note)}</{ll}:Note>")
                lines.append(f"{i5}</{rdf}:li>")
            lines += [f"{i4}</{rdf}:Seq>", f"{i3}</{ll}:Sentences>"]
        lines.append(f"{i2}</{rdf}:li>")
    lines += [f"{i1}</{rdf}:Bag>", f"{i0}</{ll}:Reviews>"]
    return nl.join(lines)


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
    tree = rdf_root(text.encode("utf-8"), source)  # defusedxml: DTDs and entities refused
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

    # Longlens' own property: replaced whole (keeping other captions' entries) or added.
    found = next(((d, p) for d in descs if (p := _find(d, LONGLENS_NS, "Reviews")) is not None), None)
    if reviews:
        kept = _existing_reviews(tree)
        exported = {r.caption for r in reviews}
        merged = [r for r in kept if r.caption not in exported] + list(reviews)
        if merged != kept or found is None:
            replaced = sum(1 for r in kept if r.caption in exported)
            changes.append(f"longlens:Reviews: {len(reviews)} caption review(s) written "
                           f"({len(reviews) - replaced} new, {replaced} replaced; {len(kept) - replaced} kept)")
            if found is not None:
                holder, prop = found
                llp = prop.qname.partition(":")[0]
                rp = _prefix_for(prop.scope, RDF) or rdf_prefix
                declare = _prefix_for(holder.scope, LONGLENS_NS) != llp
                xml = _reviews_xml(merged, llp, rp, _indent_before(text, prop.start), step, nl, declare=declare)
                edits.append((prop.start, prop.end, xml))
            else:
                p = _prefix_for(main.scope, LONGLENS_NS)
                blocks.append(_reviews_xml(merged, p or LONGLENS_PREFIX, rdf_prefix, indent, step, nl,
                                           declare=p is None))

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
