"""Texts of a SceneWorld scene: original caption, 5 positives, 5 hard negatives, a paragraph.

Every text is assembled from slots: literal words, noun phrases (NP), relation phrases
(Rel) and setting phrases (SettingRef). Each slot knows which objects it refers to, so the
phrase annotations (character spans, object ids) fall out of assembly, and a hard negative
is the same slot list with exactly one slot value changed and re-assembled: its wording is
otherwise identical to the positive it came from.

All choices are drawn from `default_rng([seed, index, 1])`; a text is true of the scene
because it only states attributes, positions (`SceneObject.hpos/vpos`), counts and
relations (`Scene.relations`) that the scene graph holds.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from engine.sceneworld.world import (
    COLOURS,
    INVERSE_RELATION,
    KIND_NAMES,
    KINDS,
    PATTERNS,
    SETTING_FORBIDDEN_COLOURS,
    Negative,
    Paragraph,
    Phrase,
    Scene,
    Span,
    Text,
    relation_holds,
)

__all__ = [
    "ATTRIBUTE_LEXICON",
    "NUMBER_WORDS",
    "PATTERN_ADJ",
    "PATTERN_NOUN",
    "POSITION_WORDS",
    "REL_EXTRA_WORDS",
    "REL_WORDS",
    "SIZE_WORDS",
    "describe_scene",
    "parse_object_phrase",
]

# --------------------------------------------------------------------------- lexicon

NUMBER_WORDS: dict[int, str] = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five", 6: "six"}
SIZE_WORDS: dict[str, tuple[str, ...]] = {"small": ("small", "little"), "large": ("large", "big")}
PATTERN_ADJ: dict[str, tuple[str, ...]] = {
    "plain": ("plain",),
    "striped": ("striped", "stripy"),
    "dotted": ("dotted", "spotted", "polka-dot"),
    "checked": ("checked", "checkered", "chequered"),
}
PATTERN_NOUN: dict[str, tuple[str, ...]] = {
    "plain": ("no pattern", "no markings"),
    "striped": ("stripes", "stripes"),
    "dotted": ("dots", "spots", "polka dots"),
    "checked": ("checks", "a check pattern", "a checkerboard pattern"),
}
REL_WORDS: dict[str, tuple[str, ...]] = {
    "left_of": ("to the left of", "left of", "on the left of"),
    "right_of": ("to the right of", "right of", "on the right of"),
    "above": ("above", "higher up than", "over"),
    "below": ("below", "beneath", "under", "underneath"),
    "next_to": ("next to", "beside", "close to"),
    "in_front_of": ("in front of", "partly covering", "partly hiding"),
    "behind": ("behind", "partly hidden behind", "partly covered by"),
    "inside": ("inside", "in", "within"),
    "contains": ("holding", "containing"),
}
# Relation wordings used only in a fixed frame ("a key peeks out of a box"), never after a verb.
REL_EXTRA_WORDS: dict[str, tuple[str, ...]] = {"inside": ("peeks out of", "sticks out of")}
POSITION_WORDS: dict[tuple[str, str], tuple[str, ...]] = {
    ("left", "top"): ("in the top left", "in the upper left", "at the top left", "in the top-left corner",
                      "up on the left"),
    ("middle", "top"): ("at the top in the middle", "in the upper middle", "at the top centre", "at the top"),
    ("right", "top"): ("in the top right", "in the upper right", "at the top right", "in the top-right corner",
                       "up on the right"),
    ("left", "bottom"): ("in the bottom left", "in the lower left", "at the bottom left",
                         "in the bottom-left corner", "down on the left"),
    ("middle", "bottom"): ("at the bottom in the middle", "in the lower middle", "at the bottom centre",
                           "at the bottom"),
    ("right", "bottom"): ("in the bottom right", "in the lower right", "at the bottom right",
                          "in the bottom-right corner", "down on the right"),
}
H_POSITION_WORDS: dict[str, tuple[str, ...]] = {
    "left": ("on the left", "on the left side", "at the left"),
    "middle": ("in the middle", "in the centre", "in the center"),
    "right": ("on the right", "on the right side", "at the right"),
}
ROW_WORDS: dict[str, tuple[str, ...]] = {
    "top": ("along the top", "in a row at the top", "across the top"),
    "bottom": ("along the bottom", "in a row at the bottom", "across the bottom"),
}
SCATTERED_WORDS: tuple[str, ...] = ("spread across the picture", "scattered around the scene", "in different places")

SETTING_FORMS: dict[str, tuple[tuple[str, str], ...]] = {
    "room": (("in", "a room"), ("in", "a cosy room"), ("inside", "a quiet room")),
    "beach": (("on", "a sandy beach"), ("on", "the beach"), ("at", "the seaside")),
    "street": (("on", "a city street"), ("on", "the street"), ("in", "a town street")),
    "forest": (("in", "a forest"), ("in", "the woods"), ("in", "a dark forest")),
    "night sky": (("under", "the night sky"), ("under", "a starry night sky"), ("against", "a dark night sky")),
    "snowfield": (("in", "a snowfield"), ("on", "a snowy field"), ("out in", "the snow")),
    "desert": (("in", "the desert"), ("among", "desert dunes"), ("in", "a sandy desert")),
    "meadow": (("in", "a meadow"), ("on", "a grassy meadow"), ("in", "a green field")),
}
SETTING_DEFINITE: dict[str, tuple[str, ...]] = {
    "room": ("the room",),
    "beach": ("the beach",),
    "street": ("the street",),
    "forest": ("the forest", "the woods"),
    "night sky": ("the night sky", "the sky"),
    "snowfield": ("the snowfield", "the snowy field"),
    "desert": ("the desert",),
    "meadow": ("the meadow",),
}
# What every render of a setting shows (render.py draws these for every variant).
SETTING_DESCRIPTIONS: dict[str, tuple[tuple[str, str], ...]] = {
    "room": (("", "has plain walls and a wooden floor"), ("A wooden floor runs below the plain walls of", "")),
    "beach": (("", "has pale sand, a strip of blue sea and a clear sky"),
              ("Calm blue water meets the sand of", "under a bright sky")),
    "street": (("", "has a grey road with a dashed white line, with buildings behind it"),
               ("A row of buildings stands along", "behind a grey road")),
    "forest": (("", "is full of dark tree trunks and green shade"), ("Dark trunks rise all around", "")),
    "night sky": (("", "is deep blue, with tiny specks of light above dark hills"),
                  ("Dark hills lie beneath", "")),
    "snowfield": (("", "is covered in white snow under a pale sky"), ("Soft white snow covers", "")),
    "desert": (("", "has orange sand dunes under a hazy sky"), ("Rolling orange dunes fill", "")),
    "meadow": (("", "is covered in green grass under a blue sky"), ("Green grass covers", "beneath a blue sky")),
}

V_SG = ("sits", "rests", "stands", "is", "appears", "can be seen", "is placed", "lies")
V_PL = ("sit", "rest", "stand", "are", "appear", "can be seen", "are placed", "lie")
V_INV_SG = ("sits", "stands", "is", "rests")
V_INV_PL = ("sit", "stand", "are", "rest")


def _build_lexicon() -> dict[str, tuple[str, str]]:
    lex: dict[str, tuple[str, str]] = {}
    for c in COLOURS:
        lex[c] = ("colour", c)
    for s, words in SIZE_WORDS.items():
        for w in words:
            lex[w] = ("size", s)
    for p in PATTERNS:
        for w in PATTERN_ADJ[p] + PATTERN_NOUN[p]:
            lex[w] = ("pattern", p)
    for k, spec in KINDS.items():
        lex[spec.noun] = ("kind", k)
        lex[spec.plural] = ("kind", k)
    for n, w in NUMBER_WORDS.items():
        lex[w] = ("number", str(n))
    return lex


# Surface form -> (family, value) for every attribute word the generator uses.
ATTRIBUTE_LEXICON: dict[str, tuple[str, str]] = _build_lexicon()
_LEX_KEYS = sorted(ATTRIBUTE_LEXICON, key=lambda w: -len(w))
_LEX_RE = re.compile(r"\b(" + "|".join(re.escape(w) for w in _LEX_KEYS) + r")\b")


def parse_object_phrase(text: str) -> dict[str, str | int | None]:
    """Attribute values an object phrase states: kind, colour, size, pattern, number.

    Unstated attributes are None; number is None only for a plural without a number word
    ("the yellow stars").
    """
    out: dict[str, str | int | None] = {"kind": None, "colour": None, "size": None, "pattern": None,
                                        "number": None}
    plural = False
    for m in _LEX_RE.finditer(text.lower()):
        word = m.group(1)
        fam, val = ATTRIBUTE_LEXICON[word]
        if fam == "number":
            out["number"] = out["number"] or int(val)
            continue
        if fam == "kind" and word == KINDS[val].plural != KINDS[val].noun:
            plural = True
        if out[fam] is None:
            out[fam] = val
    if out["number"] is None and not plural:
        out["number"] = 1
    return out


# --------------------------------------------------------------------------- slots


@dataclass
class NP:
    """A noun phrase for one object or a counted group; all wording choices are fixed here."""

    ids: list[int]
    kind: str
    colour: str
    size: str | None
    pattern: str | None
    number: int
    definite: bool = False
    form: int = 0  # 0: size pattern colour noun | 1: size colour pattern noun | 2: ... with <pattern> | 3: relative clause
    syn: int = 0
    collective: str = ""  # "a group of" etc., indefinite plural only
    show_number: bool = True  # definite plural: "the three stars" vs "the stars"
    bare: bool = False  # no determiner (alt-text style "red ball on the beach")
    agree: bool = False  # a verb in the sentence agrees with it: its number must not change

    def text(self) -> str:
        spec = KINDS[self.kind]
        noun = spec.plural if self.number > 1 else spec.noun
        size_w = SIZE_WORDS[self.size][self.syn % len(SIZE_WORDS[self.size])] if self.size else None
        pat_adj = PATTERN_ADJ[self.pattern][self.syn % len(PATTERN_ADJ[self.pattern])] if self.pattern else None
        if self.form == 3 and (size_w or pat_adj):
            tail = " and ".join(w for w in (size_w, pat_adj) if w)
            body = f"{self.colour} {noun} {'that are' if self.number > 1 else 'that is'} {tail}"
        elif self.form == 2 and self.pattern:
            pat_n = PATTERN_NOUN[self.pattern][self.syn % len(PATTERN_NOUN[self.pattern])]
            body = " ".join(w for w in (size_w, self.colour, noun) if w) + f" with {pat_n}"
        elif self.form == 1 and self.pattern and self.pattern != "plain":
            body = " ".join(w for w in (size_w, self.colour, pat_adj, noun) if w)
        else:
            body = " ".join(w for w in (size_w, pat_adj, self.colour, noun) if w)
        if self.bare:
            return body
        if self.definite:
            if self.number > 1 and self.show_number:
                return f"the {NUMBER_WORDS[self.number]} {body}"
            return f"the {body}"
        if self.number == 1:
            return f"{'an' if body[0] in 'aeiou' else 'a'} {body}"
        head = f"{self.collective} " if self.collective else ""
        return f"{head}{NUMBER_WORDS[self.number]} {body}"


@dataclass
class Rel:
    predicate: str
    subject: int
    object: int
    syn: int = 0
    surface: str = ""  # wording that only fits one sentence frame (REL_EXTRA_WORDS)

    def text(self) -> str:
        if self.surface:
            return self.surface
        words = REL_WORDS[self.predicate]
        return words[self.syn % len(words)]


@dataclass
class SettingRef:
    setting: str
    syn: int = 0
    definite: bool = False

    def text(self) -> str:
        if self.definite:
            forms = SETTING_DEFINITE[self.setting]
            return forms[self.syn % len(forms)]
        forms = SETTING_FORMS[self.setting]
        return forms[self.syn % len(forms)][1]

    def prep(self) -> str:
        forms = SETTING_FORMS[self.setting]
        return forms[self.syn % len(forms)][0]


Slot = str | NP | Rel | SettingRef


def _assemble(sentences: Sequence[Sequence[Slot]], *, prose: bool) -> tuple[str, list[Phrase], list[Span]]:
    """Join slots into text; prose capitalises sentence starts and ends them with a full stop."""
    text = ""
    phrases: list[Phrase] = []
    spans: list[Span] = []
    for si, sent in enumerate(sentences):
        if si:
            text += " "
        s_start = len(text)
        for k, slot in enumerate(sent):
            if isinstance(slot, str):
                piece, kind, ids, rel = slot, "", [], ""
            elif isinstance(slot, NP):
                piece, kind, ids, rel = slot.text(), "object", list(slot.ids), ""
            elif isinstance(slot, Rel):
                piece, kind, ids, rel = slot.text(), "relation", [slot.subject, slot.object], slot.predicate
            else:
                piece, kind, ids, rel = slot.text(), "setting", [], ""
            if not piece:
                continue
            if k == 0 and prose:
                piece = piece[0].upper() + piece[1:]
            if len(text) > s_start and piece[0] not in ",;.":
                text += " "
            start = len(text)
            text += piece
            if kind:
                phrases.append(Phrase(piece, start, len(text), kind, ids, rel))
        if prose:
            text += "."
        spans.append(Span(s_start, len(text)))
    return text, phrases, spans


def _to_text(slots: Sequence[Slot]) -> Text:
    text, phrases, _ = _assemble([slots], prose=False)
    return Text(text, phrases)


# --------------------------------------------------------------------------- entities


@dataclass
class _Entity:
    """One object, or a counted group of identical objects (kinds are unique per entity)."""

    idx: int
    ids: list[int]
    kind: str
    colour: str
    size: str
    pattern: str
    hpos: str
    vpos: str
    container: int | None = None  # entity index of the container this sits in
    inner: int | None = None  # entity index of what sits inside this
    cx: float = 0.0
    cy: float = 0.0
    area: float = 0.0
    rels: list[tuple[str, int]] = field(default_factory=list)  # (predicate, other entity index)

    @property
    def number(self) -> int:
        return len(self.ids)

    @property
    def is_group(self) -> bool:
        return len(self.ids) > 1


def _entities(scene: Scene) -> list[_Entity]:
    ents: list[_Entity] = []
    by_obj: dict[int, int] = {}
    for o in scene.objects:
        if o.group is not None and any(e.ids and scene.objects[e.ids[0]].group == o.group for e in ents):
            e = next(e for e in ents if scene.objects[e.ids[0]].group == o.group)
            e.ids.append(o.id)
            by_obj[o.id] = e.idx
            continue
        x0, y0, x1, y1 = o.box_norm
        e = _Entity(len(ents), [o.id], o.kind, o.colour, o.size, o.pattern, o.hpos, o.vpos,
                    cx=(x0 + x1) / 2, cy=(y0 + y1) / 2, area=(x1 - x0) * (y1 - y0))
        ents.append(e)
        by_obj[o.id] = e.idx
    for o in scene.objects:
        if o.container is not None:
            ents[by_obj[o.id]].container = by_obj[o.container]
            ents[by_obj[o.container]].inner = by_obj[o.id]
    for r in scene.relations:
        ents[by_obj[r.subject]].rels.append((r.predicate, by_obj[r.object]))
    return ents


def _group_position(scene: Scene, e: _Entity, syn: int) -> str:
    objs = [scene.objects[i] for i in e.ids]
    if len({o.vpos for o in objs}) == 1:
        words = ROW_WORDS[objs[0].vpos]
    elif len({o.hpos for o in objs}) == 1:
        words = H_POSITION_WORDS[objs[0].hpos]
    else:
        words = SCATTERED_WORDS
    return words[syn % len(words)]


class _Writer:
    """Wording choices for one scene, drawn from the scene's language stream."""

    def __init__(self, scene: Scene, rng: np.random.Generator) -> None:
        self.scene = scene
        self.rng = rng
        self.ents = _entities(scene)
        self.used: set[str] = set()

    # ---- small random helpers
    def pick(self, options: Sequence[str]) -> str:
        """A random option, avoiding ones this text already used (no "The picture shows" twice)."""
        fresh = [o for o in options if o not in self.used] or list(options)
        choice = fresh[int(self.rng.integers(len(fresh)))]
        self.used.add(choice)
        return choice

    def pick_slots(self, options: Sequence[Sequence[Slot]]) -> list[Slot]:
        return list(options[int(self.rng.integers(len(options)))])

    def chance(self, p: float) -> bool:
        return bool(self.rng.random() < p)

    def syn(self) -> int:
        return int(self.rng.integers(6))

    # ---- slots
    def full_np(self, e: _Entity) -> NP:
        """First mention: every attribute."""
        collective = ""
        if e.is_group and self.chance(0.3):
            collective = self.pick(("a group of", "a set of", "a row of" if self.row_group(e) else "a group of"))
        return NP(list(e.ids), e.kind, e.colour, e.size, e.pattern, e.number,
                  form=int(self.rng.integers(4)), syn=self.syn(), collective=collective)

    def caption_np(self, e: _Entity, detail: float = 0.65) -> NP:
        """Caption mention: colour always, size and pattern often."""
        size = e.size if self.chance(detail) else None
        pattern = e.pattern if self.chance(detail - (0.25 if e.pattern == "plain" else 0.0)) else None
        return NP(list(e.ids), e.kind, e.colour, size, pattern, e.number,
                  form=int(self.rng.integers(4)), syn=self.syn())

    def short_np(self, e: _Entity, detail: float = 0.2) -> NP:
        return NP(list(e.ids), e.kind, e.colour, e.size if self.chance(detail) else None, None, e.number,
                  syn=self.syn())

    def def_np(self, e: _Entity) -> NP:
        """Later mention: definite, colour + kind (+ size sometimes)."""
        return NP(list(e.ids), e.kind, e.colour, e.size if self.chance(0.3) else None, None, e.number,
                  definite=True, syn=self.syn(), show_number=self.chance(0.6))

    def rel(self, pred: str, a: _Entity, b: _Entity) -> Rel:
        return Rel(pred, a.ids[0], b.ids[0], self.syn())

    def setting(self, definite: bool = False) -> SettingRef:
        return SettingRef(self.scene.setting, self.syn(), definite)

    def row_group(self, e: _Entity) -> bool:
        return len({self.scene.objects[i].vpos for i in e.ids}) == 1

    def pos(self, e: _Entity) -> str:
        if e.is_group:
            return _group_position(self.scene, e, self.syn())
        if self.chance(0.78):
            return self.pick(POSITION_WORDS[(e.hpos, e.vpos)])
        return self.pick(H_POSITION_WORDS[e.hpos])

    def verb(self, e: _Entity, inverted: bool = False) -> str:
        if inverted:
            return self.pick(V_INV_PL if e.is_group else V_INV_SG)
        return self.pick(V_PL if e.is_group else V_SG)

    @staticmethod
    def be(e: _Entity) -> str:
        return "are" if e.is_group else "is"

    def relations_between(self, e: _Entity, others: Sequence[int]) -> list[tuple[str, int]]:
        # Plain spatial relations read best in prose; inside/contains have their own templates.
        return [(p, o) for p, o in e.rels if o in others and p not in ("inside", "contains")]


# --------------------------------------------------------------------------- paragraph


def _intro_sentence(w: _Writer, e: _Entity) -> list[Slot]:
    np_ = w.full_np(e)
    p = w.pos(e)
    t = int(w.rng.integers(8))
    if t == 0:
        return ["There", w.be(e), np_, p]
    if t == 1:
        return [p, ",", "there", w.be(e), np_]
    if t == 2:
        return [np_, w.verb(e), p]
    if t == 3:
        return [p, w.verb(e, inverted=True), np_]
    if t == 4:
        return [w.pick(("You can see", "We can see", "The picture shows", "One can spot", "I can see")), np_, p]
    if t == 5:
        return [np_, w.pick(("can be seen", "has been placed", "is shown") if not e.is_group
                            else ("can be seen", "have been placed", "are shown")), p]
    if t == 6:
        return [p, ",", w.pick(("you can see", "we see", "there is also" if not e.is_group else "there are also")),
                np_]
    return ["Look", p, "and you will find", np_]


def _pair_sentence(w: _Writer, a: _Entity, b: _Entity) -> list[Slot]:
    na, nb = w.full_np(a), w.full_np(b)
    pa, pb = w.pos(a), w.pos(b)
    t = int(w.rng.integers(5))
    if t == 0:
        return ["There", w.be(a), na, pa, ",", "and", nb, w.verb(b), pb]
    if t == 1:
        return [pa, w.be(a), na, ",", "while", nb, w.be(b), pb]
    if t == 2:
        return [w.pick(("You can see", "We see", "The picture shows")), na, pa, "and", nb, pb]
    if t == 3:
        return [na, w.verb(a), pa, ";", nb, w.verb(b), pb]
    return [w.pick(("The picture shows", "The scene holds", "This image contains")), na, pa, "as well as", nb, pb]


def _relation_intro(w: _Writer, e: _Entity, pred: str, r: _Entity, with_pos: bool) -> list[Slot]:
    """First mention of e through its relation to an already mentioned r."""
    np_, nr = w.full_np(e), w.def_np(r)
    t = int(w.rng.integers(5))
    if t == 0:
        if with_pos:
            return [np_, w.verb(e), w.pos(e), ",", w.rel(pred, e, r), nr]
        return [np_, w.verb(e), w.rel(pred, e, r), nr]
    if t == 1:
        return [w.rel(pred, e, r), nr, w.verb(e, inverted=True), np_]
    if t == 2:
        return [np_, ",", "which", w.be(e), w.rel(pred, e, r), nr, ",", w.verb(e), w.pos(e)]
    if t == 3:
        inv = INVERSE_RELATION[pred]
        return [nr, w.be(r), w.rel(inv, r, e), np_]
    return ["There", w.be(e), np_, w.rel(pred, e, r), nr]


def _inside_sentence(w: _Writer, inner: _Entity, cont: _Entity, cont_new: bool) -> list[Slot]:
    ni = w.full_np(inner)
    nc = w.full_np(cont) if cont_new else w.def_np(cont)
    t = int(w.rng.integers(4 if cont_new else 3))
    if cont_new:
        if t == 0:
            return [nc, w.verb(cont), w.pos(cont), ",", w.rel("contains", cont, inner), ni]
        if t == 1:
            return ["There", "is", ni, w.rel("inside", inner, cont), nc, w.pos(cont)]
        if t == 2:
            return [w.pos(cont), "is", nc, "with", ni, "inside"]
        peek = Rel("inside", inner.ids[0], cont.ids[0], surface=w.pick(REL_EXTRA_WORDS["inside"]))
        return [w.pos(cont), ",", ni, peek, nc]
    if t == 0:
        return [ni, w.verb(inner), w.rel("inside", inner, cont), nc]
    if t == 1:
        return [Rel("inside", inner.ids[0], cont.ids[0], 0), nc, "there is", ni]
    return [nc, "is", Rel("contains", cont.ids[0], inner.ids[0], 0), ni]  # "is holding"


def _setting_open(w: _Writer) -> list[Slot]:
    t = int(w.rng.integers(7))
    st = w.setting()
    if t == 0:
        return ["This is a picture of", st]
    if t == 1:
        return ["The scene is set", st.prep(), st]
    if t == 2:
        return ["The picture shows", st]
    if t == 3:
        return ["Everything takes place", st.prep(), st]
    if t == 4:
        return ["It is a view of", st]
    if t == 5:
        return ["We are looking at", st]
    return ["Here we have", st]


def _setting_close(w: _Writer) -> list[Slot]:
    st = w.setting()
    t = int(w.rng.integers(4))
    if t == 0:
        return ["All of this is", st.prep(), st]
    if t == 1:
        return ["The whole scene takes place", st.prep(), st]
    if t == 2:
        return ["Everything is set", st.prep(), st]
    return [st, "forms the background"]


def _setting_describe(w: _Writer) -> list[Slot]:
    before, after = w.pick_slots(SETTING_DESCRIPTIONS[w.scene.setting])
    return [s for s in (before, w.setting(definite=True), after) if s]


def _summary(w: _Writer) -> list[Slot]:
    n = NUMBER_WORDS[len(w.scene.objects)]
    return w.pick_slots((
        ["Altogether there are", n, "objects"],
        ["In total,", n, "things can be seen"],
        ["The picture contains", n, "objects in all"],
    ))


def _entity_order(w: _Writer) -> list[int]:
    ents = w.ents
    how = int(w.rng.integers(4))
    idx = [e.idx for e in ents if e.container is None]
    if how == 0:
        idx = [idx[i] for i in w.rng.permutation(len(idx))]
    elif how == 1:
        idx.sort(key=lambda i: (ents[i].cx, ents[i].cy))
    elif how == 2:
        idx.sort(key=lambda i: (ents[i].cy > 0.5, ents[i].cx))
    else:
        idx.sort(key=lambda i: -ents[i].area * len(ents[i].ids))
    out: list[int] = []
    for i in idx:
        out.append(i)
        if ents[i].inner is not None:
            out.append(ents[i].inner)
    return out


def _relation_sentence(w: _Writer, used_rel: set[tuple[int, int]]) -> list[Slot] | None:
    """A relation between two already described objects, preferring an unused pair."""
    ents = w.ents
    cands = [(e.idx, p, o) for e in ents if not e.is_group
             for p, o in w.relations_between(e, [x.idx for x in ents]) if not ents[o].is_group]
    if not cands:
        return None
    fresh = [c for c in cands if (min(c[0], c[2]), max(c[0], c[2])) not in used_rel]
    a, pred, b = (fresh or cands)[int(w.rng.integers(len(fresh or cands)))]
    ea, eb = ents[a], ents[b]
    t = int(w.rng.integers(3))
    if t == 0:
        return [w.def_np(ea), "is", w.rel(pred, ea, eb), w.def_np(eb)]
    if t == 1:
        return [w.pick(("Note that", "Notice that", "Also,")), w.def_np(ea), "is", w.rel(pred, ea, eb), w.def_np(eb)]
    return [w.rel(pred, ea, eb), w.def_np(eb), w.verb(ea, inverted=True), w.def_np(ea)]


def _paragraph(w: _Writer) -> Paragraph:
    w.used.clear()
    ents = w.ents
    order = _entity_order(w)
    k = len(order)
    # Entity sentences first (one or two entities each), then setting and extra sentences
    # chosen so that the paragraph has 3-6 sentences.
    units = int(w.rng.integers((k + 1) // 2, k + 1))
    merges = k - units
    sentences: list[list[Slot]] = []
    mentioned: list[int] = []
    used_rel: set[tuple[int, int]] = set()
    i = 0
    while i < len(order):
        e = ents[order[i]]
        nxt = ents[order[i + 1]] if i + 1 < len(order) else None
        left = len(order) - i
        can_merge = nxt is not None and e.container is None and (nxt.container in (None, e.idx))
        if can_merge and merges > 0 and (left - 1 < 2 * merges or w.chance(0.5)):
            assert nxt is not None
            if nxt.container == e.idx:
                sentences.append(_inside_sentence(w, nxt, e, cont_new=True))
            else:
                sentences.append(_pair_sentence(w, e, nxt))
            merges -= 1
            mentioned += [e.idx, nxt.idx]
            i += 2
            continue
        if e.container is not None:
            sentences.append(_inside_sentence(w, e, ents[e.container], cont_new=False))
        else:
            rels = w.relations_between(e, mentioned) if not e.is_group else []
            rels = [(p, o) for p, o in rels if not ents[o].is_group]
            if rels and w.chance(0.65):
                pred, o = rels[int(w.rng.integers(len(rels)))]
                sentences.append(_relation_intro(w, e, pred, ents[o], with_pos=w.chance(0.7)))
                used_rel.add((min(e.idx, o), max(e.idx, o)))
            else:
                sentences.append(_intro_sentence(w, e))
        mentioned.append(e.idx)
        i += 1

    n = len(sentences)
    merge_setting = n >= 6 or w.chance(0.25)
    budget = 6 - n - (0 if merge_setting else 1)
    # Small scenes get the optional sentences more often, so that paragraphs stay paragraphs.
    small = k <= 3
    p_extra = {"describe": 0.9 if small else 0.45, "relation": 0.8 if small else 0.35, "summary": 0.25}
    extras = [x for x in ("describe", "relation", "summary") if w.chance(p_extra[x])]
    relation = _relation_sentence(w, used_rel)
    if relation is None and "relation" in extras:
        extras.remove("relation")
    minimum = 3 - n - (0 if merge_setting else 1)
    for x in ("describe", "relation", "summary"):
        if len(extras) >= minimum:
            break
        if x not in extras and (x != "relation" or relation is not None):
            extras.append(x)
    extras = extras[: max(0, budget)]

    if merge_setting:
        st = w.setting()
        first = sentences[0][0]
        if isinstance(first, str) and not first.startswith("I "):
            sentences[0][0] = first[0].lower() + first[1:]  # no longer starts the sentence
        sentences[0] = [st.prep(), st, ","] + sentences[0]
    elif w.chance(0.65):
        sentences.insert(0, _setting_open(w))
    else:
        sentences.append(_setting_close(w))
    if "describe" in extras:
        at = 1 if not merge_setting and w.chance(0.5) else len(sentences)
        sentences.insert(at, _setting_describe(w))
    if "relation" in extras and relation is not None:
        sentences.append(relation)
    if "summary" in extras:
        sentences.append(_summary(w))
    text, phrases, spans = _assemble(sentences, prose=True)
    return Paragraph(text, phrases, spans)


# --------------------------------------------------------------------------- captions


def _word_count(t: Text) -> int:
    return len(re.findall(r"[a-z0-9'-]+", t.text.lower()))


def _caption_candidates(w: _Writer, e: _Entity) -> dict[str, list[Slot]]:
    """One caption per template family about entity e (and a partner where needed)."""
    ents = w.ents
    out: dict[str, list[Slot]] = {}
    st = w.setting()
    if e.container is None:
        np_ = w.caption_np(e)
        p = w.pos(e)
        t = int(w.rng.integers(5))
        if t == 0:
            out["position"] = [np_, p, ",", st.prep(), st]
        elif t == 1:
            out["position"] = [st, "with", np_, p]
        elif t == 2:
            out["position"] = [st.prep(), st, ",", np_, p]
        elif t == 3:
            out["position"] = [w.pick(("a picture of", "a photo of", "an image of")), np_, p]
        else:
            np_.agree = True
            out["position"] = ["there", w.be(e), np_, p, st.prep(), st]
    if e.is_group:
        np_ = w.caption_np(e, detail=0.8)
        p = w.pos(e)
        out["count"] = w.pick_slots(([np_, p, st.prep(), st], [st, "with", np_, p], [np_, p]))
    rels = [(pr, o) for pr, o in e.rels if not ents[o].is_group]
    if rels and not e.is_group:
        pred, o = rels[int(w.rng.integers(len(rels)))]
        na, nb = w.caption_np(e, 0.5), w.caption_np(ents[o], 0.4)
        t = int(w.rng.integers(4))
        if t == 0:
            out["relation"] = [na, w.rel(pred, e, ents[o]), nb]
        elif t == 1:
            na.agree = True
            out["relation"] = [na, "is", w.rel(pred, e, ents[o]), nb]
        elif t == 2:
            out["relation"] = [na, w.rel(pred, e, ents[o]), nb, st.prep(), st]
        else:
            out["relation"] = [st.prep(), st, ",", na, w.rel(pred, e, ents[o]), nb]
    others = [x for x in ents if x.idx != e.idx]
    if others:
        o = others[int(w.rng.integers(len(others)))]
        out["pair"] = [w.caption_np(e, 0.5), "and", w.caption_np(o, 0.5), st.prep(), st]
    if len(ents) >= 3:
        rest = [x for x in ents if x.idx != e.idx]
        chosen = [rest[i] for i in w.rng.permutation(len(rest))[:2]]
        items = [w.short_np(x) for x in [e, *chosen]]
        out["list"] = [st, "with", items[0], ",", items[1], "and", items[2]]
    out["attributes"] = [NP(list(e.ids), e.kind, e.colour, e.size, e.pattern, e.number, form=3, syn=w.syn()),
                         st.prep(), st]
    return out


def _positives(w: _Writer) -> list[tuple[str, list[Slot]]]:
    ents = w.ents
    order = [ents[i] for i in w.rng.permutation(len(ents))]
    families = ["position", "relation", "count", "pair", "list", "attributes"]
    chosen: list[tuple[str, list[Slot]]] = []
    used_fam: list[str] = []
    # Pass 1: a new family and a new entity each time; pass 2 a new family; pass 3 anything.
    for level in (0, 1, 2):
        for e in order:
            if len(chosen) == 5:
                break
            if level == 0 and any(e.idx in _slot_entities(s, ents) for _, s in chosen):
                continue
            cands = _caption_candidates(w, e)
            fams = [f for f in families if f in cands and (level == 2 or f not in used_fam)]
            fams = [fams[i] for i in w.rng.permutation(len(fams))]
            # Relations and counts are the scarce families: take them when offered.
            fams.sort(key=lambda f: 0 if f in ("relation", "count") and f not in used_fam else 1)
            for f in fams:
                t = _to_text(cands[f])
                if 6 <= _word_count(t) <= 20 and t.text not in {_to_text(s).text for _, s in chosen}:
                    chosen.append((f, cands[f]))
                    used_fam.append(f)
                    break
        if len(chosen) == 5:
            break
    tries = 0
    while len(chosen) < 5:  # tiny scenes: more wordings of some entity
        tries += 1
        e = ents[int(w.rng.integers(len(ents)))]
        cands = _caption_candidates(w, e)
        f = w.pick([f for f in families if f in cands])
        t = _to_text(cands[f])
        if (6 <= _word_count(t) <= 20 or tries > 200) and t.text not in {_to_text(s).text for _, s in chosen}:
            chosen.append((f, cands[f]))
    return chosen


def _slot_entities(slots: Sequence[Slot], ents: Sequence[_Entity]) -> set[int]:
    out: set[int] = set()
    for s in slots:
        if isinstance(s, NP):
            out |= {e.idx for e in ents if e.ids[0] in s.ids}
    return out


def _original_caption(w: _Writer) -> Text:
    ents = sorted(w.ents, key=lambda e: -e.area * len(e.ids))
    e = ents[0] if w.chance(0.7) else ents[int(w.rng.integers(len(ents)))]
    np_ = NP(list(e.ids), e.kind, e.colour, None, None, e.number, syn=w.syn())
    st = w.setting()
    t = int(w.rng.integers(4))
    if t == 1:
        np_.bare = True
    if t == 2:
        return _to_text([w.pick(("photo of", "a picture of", "image of")), np_, st.prep(), st])
    if t == 3:
        return _to_text([np_, ",", st])
    return _to_text([np_, st.prep(), st])


# --------------------------------------------------------------------------- negatives


def _nps(slots: Sequence[Slot]) -> list[int]:
    return [i for i, s in enumerate(slots) if isinstance(s, NP)]


def _rels(slots: Sequence[Slot]) -> list[int]:
    return [i for i, s in enumerate(slots) if isinstance(s, Rel)]


def _supports(kind: str, slots: Sequence[Slot]) -> bool:
    if kind == "relation":
        return bool(_rels(slots))
    if kind == "count":
        return any(not s.definite and not s.agree and not s.bare for s in slots if isinstance(s, NP))
    return bool(_nps(slots))


def _corrupt(w: _Writer, slots: list[Slot], kind: str) -> tuple[list[Slot], str] | None:
    """A copy of slots made false in one detail of the given kind, or None if impossible."""
    scene = w.scene
    new = copy.deepcopy(slots)
    present_kinds = {o.kind for o in scene.objects}
    if kind == "relation":
        i = _rels(new)[int(w.rng.integers(len(_rels(new))))]
        r = new[i]
        assert isinstance(r, Rel)
        a, b = scene.objects[r.subject], scene.objects[r.object]
        if r.predicate in ("inside", "contains"):
            options = ["next_to", "below", "left_of", "right_of"]
        else:
            inv = INVERSE_RELATION[r.predicate]
            rest = ["left_of", "right_of", "above", "below", "next_to", "in_front_of", "behind"]
            rest = [p for p in rest if p not in (r.predicate, inv)]
            options = ([inv] if inv != r.predicate else []) + [rest[j] for j in w.rng.permutation(len(rest))]
        for p in options:
            if not relation_holds(p, a, b):
                detail = f"relation: {r.predicate} -> {p}"
                r.predicate = p
                r.surface = ""
                return new, detail
        return None
    nps = _nps(new)
    if kind == "count":
        nps = [i for i in nps if not new[i].definite and not new[i].agree and not new[i].bare]  # type: ignore[union-attr]
    i = nps[int(w.rng.integers(len(nps)))]
    np_ = new[i]
    assert isinstance(np_, NP)
    if kind == "attribute":
        fams = ["colour"] + (["size"] if np_.size else []) + (["pattern"] if np_.pattern else [])
        fam = fams[int(w.rng.integers(len(fams)))]
        if fam == "colour":
            # Prefer a colour some other object has: the binding error a model must not make.
            others = sorted({o.colour for o in scene.objects if o.colour != np_.colour})
            allowed = [c for c in COLOURS if c != np_.colour and c not in SETTING_FORBIDDEN_COLOURS[scene.setting]]
            pool = others if others and w.chance(0.6) else allowed
            new_c = pool[int(w.rng.integers(len(pool)))]
            detail = f"colour: {np_.colour} -> {new_c}"
            np_.colour = new_c
        elif fam == "size":
            new_s = "large" if np_.size == "small" else "small"
            detail = f"size: {np_.size} -> {new_s}"
            np_.size = new_s
        else:
            opts = [p for p in PATTERNS if p != np_.pattern]
            new_p = opts[int(w.rng.integers(len(opts)))]
            detail = f"pattern: {np_.pattern} -> {new_p}"
            np_.pattern = new_p
        return new, detail
    if kind == "object":
        absent = [k for k in KIND_NAMES if k not in present_kinds
                  and (np_.pattern is None or np_.pattern in KINDS[k].patterns)]
        new_k = absent[int(w.rng.integers(len(absent)))]
        detail = f"kind: {np_.kind} -> {new_k}"
        np_.kind = new_k
        return new, detail
    if kind == "count":
        true_n = sum(1 for o in scene.objects if o.kind == np_.kind)
        opts = [n for n in (1, 2, 3, 4) if n != true_n and abs(n - true_n) <= 2 and not (np_.collective and n == 1)]
        new_n = opts[int(w.rng.integers(len(opts)))]
        detail = f"count: {np_.number} -> {new_n}"
        np_.number = new_n
        return new, detail
    raise ValueError(f"unknown error type {kind!r}")


def _negatives(w: _Writer, positives: list[list[Slot]]) -> list[Negative]:
    schedule = ["attribute", "attribute", "relation", "count", "object"]
    schedule = [schedule[i] for i in w.rng.permutation(5)]
    # Constrained kinds pick their source first.
    plan = sorted(range(5), key=lambda j: {"relation": 0, "count": 1}.get(schedule[j], 2))
    used: set[int] = set()
    out: dict[int, Negative] = {}
    for j in plan:
        kind = schedule[j]
        srcs = [i for i in range(len(positives)) if _supports(kind, positives[i])]
        if not srcs:
            kind = "object" if w.chance(0.5) else "attribute"
            srcs = list(range(len(positives)))
        fresh = [i for i in srcs if i not in used]
        pool = fresh or srcs
        src = pool[int(w.rng.integers(len(pool)))]
        res = _corrupt(w, positives[src], kind)
        if res is None:  # no false relation for this pair: fall back to an attribute
            kind = "attribute"
            res = _corrupt(w, positives[src], kind)
            assert res is not None
        slots, detail = res
        used.add(src)
        t = _to_text(slots)
        out[j] = Negative(t.text, t.phrases, kind, src, detail)
    return [out[j] for j in range(5)]


# --------------------------------------------------------------------------- entry point


def describe_scene(scene: Scene) -> Scene:
    """Fill the scene's texts in place (and return it)."""
    w = _Writer(scene, np.random.default_rng([scene.seed, scene.index, 1]))
    scene.original_caption = _original_caption(w)
    pos = _positives(w)
    pos = [pos[i] for i in w.rng.permutation(len(pos))]
    scene.positives = [_to_text(s) for _, s in pos]
    scene.negatives = _negatives(w, [s for _, s in pos])
    scene.paragraph = _paragraph(w)
    return scene
