"""Lexical shift: SceneWorld paragraphs re-worded with everyday words the grammar never uses.

A test set for one question: does a text tower trained on SceneWorld's grammar understand a
paragraph that says the same true things in other words ("a crimson kitten" for "a red cat",
"a pair of" for "two", "on the seashore" for "on the beach")?

The rewrite works on the grammar's own paragraph through its phrase annotations, so it stays
true of the picture:

- every object phrase (`Phrase.kind == "object"`) is rebuilt from the scene graph objects its
  ids point at: the same attributes the original phrase states (parsed with
  `language.parse_object_phrase`), the same definiteness and number, each said with an
  alternative from the tables below;
- every relation phrase is replaced by an alternative for its predicate (`Phrase.relation`);
- every setting phrase (and the preposition before it) by an alternative for the scene's setting;
- position words, which the grammar writes as plain words between phrases, are looked up in the
  grammar's position tables and replaced by an alternative for the same position;
- the setting-description and summary sentences (fixed wordings in language.py) are replaced
  whole by sentences of this module saying the same thing.

Frame words (verbs such as "sits", "There is", "The picture shows") are left as they are: they
carry no fact about the picture. `grammar_words()` collects every word the grammar can produce;
`table_conflicts()` says which alternatives share a content word with it (the tests assert none).

All choices come from `numpy.random.default_rng([rng_seed, scene.seed, scene.index, variant])`,
so a rewrite is a pure function of (rng_seed, seed, index, variant).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from engine.sceneworld import language as lang
from engine.sceneworld import world
from engine.sceneworld.world import KINDS, Paragraph, Phrase, Scene, Span

__all__ = [
    "CLASSES",
    "TEST_TABLE",
    "ParaphraseTable",
    "COLOUR_ALT",
    "COUNT_ALT",
    "DEFINITE_COUNT_ALT",
    "KIND_ALT",
    "PATTERN_ALT",
    "PATTERN_NOUN_ALT",
    "POSITION_ALT",
    "RELATION_ALT",
    "SETTING_ALT",
    "SIZE_ALT",
    "STOP_WORDS",
    "VARIANTS",
    "alternatives",
    "content_words",
    "grammar_words",
    "lexical_shift_paragraph",
    "lexical_shift_set",
    "merge_sentences",
    "parse_shifted_phrase",
    "reorder_sentences",
    "rewrite_paragraph",
    "table_conflicts",
    "table_overlap",
    "table_size",
]

# --------------------------------------------------------------------------- the table

# kind -> (singular, plural) alternatives
KIND_ALT: dict[str, tuple[tuple[str, str], ...]] = {
    "ball": (("sphere", "spheres"), ("orb", "orbs"), ("globe", "globes")),
    "star": (("pentagram", "pentagrams"), ("pentacle", "pentacles"), ("spiky emblem", "spiky emblems")),
    "heart": (("valentine", "valentines"), ("love symbol", "love symbols"), ("love emblem", "love emblems")),
    "house": (("cottage", "cottages"), ("dwelling", "dwellings"), ("bungalow", "bungalows"), ("home", "homes")),
    "tree": (("sapling", "saplings"), ("oak", "oaks"), ("elm", "elms")),
    "car": (("automobile", "automobiles"), ("sedan", "sedans"), ("motorcar", "motorcars"),
            ("hatchback", "hatchbacks")),
    "cat": (("kitten", "kittens"), ("kitty", "kitties"), ("feline", "felines"), ("pussycat", "pussycats")),
    "fish": (("minnow", "minnows"), ("guppy", "guppies"), ("carp", "carp")),
    "bird": (("sparrow", "sparrows"), ("finch", "finches"), ("budgie", "budgies")),
    "flower": (("blossom", "blossoms"), ("bloom", "blooms"), ("daisy", "daisies")),
    "umbrella": (("parasol", "parasols"), ("brolly", "brollies"), ("sunshade", "sunshades")),
    "cup": (("mug", "mugs"), ("beaker", "beakers"), ("tumbler", "tumblers")),
    "key": (("latchkey", "latchkeys"), ("door opener", "door openers")),
    "boat": (("ship", "ships"), ("dinghy", "dinghies"), ("vessel", "vessels")),
    "moon": (("crescent", "crescents"), ("lunar crescent", "lunar crescents")),
    "bicycle": (("bike", "bikes"), ("cycle", "cycles"), ("pushbike", "pushbikes")),
    "hat": (("cap", "caps"), ("bonnet", "bonnets"), ("fedora", "fedoras")),
    "lamp": (("lantern", "lanterns"), ("sconce", "sconces"), ("luminaire", "luminaires")),
    "kite": (("flying toy", "flying toys"), ("paper flyer", "paper flyers"), ("diamond glider", "diamond gliders")),
    "book": (("novel", "novels"), ("volume", "volumes"), ("paperback", "paperbacks"), ("hardback", "hardbacks")),
    "box": (("crate", "crates"), ("carton", "cartons"), ("chest", "chests")),
    "basket": (("hamper", "hampers"), ("pannier", "panniers"), ("trug", "trugs")),
}

COLOUR_ALT: dict[str, tuple[str, ...]] = {
    "red": ("crimson", "scarlet", "cherry"),
    "orange": ("tangerine", "amber", "apricot"),
    "yellow": ("lemon", "canary", "golden"),
    "green": ("emerald", "lime", "jade"),
    "blue": ("navy", "azure", "cobalt"),
    "purple": ("violet", "plum", "mauve"),
    "pink": ("rosy", "bubblegum", "blush"),
    "white": ("ivory", "milky", "cream"),
    "black": ("jet", "ebony", "inky"),
    "brown": ("chocolate", "chestnut", "mocha"),
    "grey": ("silver", "ashen", "slate"),
}

SIZE_ALT: dict[str, tuple[str, ...]] = {
    "small": ("teeny", "miniature", "petite", "wee"),
    "large": ("huge", "giant", "oversized", "enormous"),
}

# pattern -> adjectives (before the colour) and "with ..." nouns (after the noun)
PATTERN_ALT: dict[str, tuple[str, ...]] = {
    "plain": ("unpatterned", "unadorned", "single-hued"),
    "striped": ("pinstriped", "banded", "barred"),
    "dotted": ("speckled", "freckled", "dappled"),
    "checked": ("plaid", "tartan", "gingham"),
}
PATTERN_NOUN_ALT: dict[str, tuple[str, ...]] = {
    "plain": ("without any decoration", "without any print"),
    "striped": ("with pinstripes", "with bands"),
    "dotted": ("with speckles", "with freckles"),
    "checked": ("with a plaid print", "with a tartan design"),
}

# number -> indefinite counted forms ("a pair of kittens"); digits are words the grammar never writes
COUNT_ALT: dict[int, tuple[str, ...]] = {
    2: ("a pair of", "a couple of", "2"),
    3: ("a trio of", "a triplet of", "3"),
    4: ("a quartet of", "4"),
    5: ("a quintet of", "5"),
    6: ("half a dozen", "a sextet of", "6"),
}
# number -> definite counted forms ("both kittens", "the trio of mugs")
DEFINITE_COUNT_ALT: dict[int, tuple[str, ...]] = {
    2: ("both", "the pair of"),
    3: ("the trio of", "all 3"),
    4: ("the quartet of", "all 4"),
}

# relation -> alternatives that read in every frame the grammar puts a relation in:
# "A is REL B", "A sits REL B", "REL B sits A", "There is A REL B".
RELATION_ALT: dict[str, tuple[str, ...]] = {
    "left_of": ("west of", "to the west of", "farther west than"),
    "right_of": ("east of", "to the east of", "farther east than"),
    "above": ("north of", "farther north than"),
    "below": ("south of", "farther south than"),
    "next_to": ("alongside", "adjacent to", "near"),
    "in_front_of": ("overlapping", "concealing some of", "screening"),
    "behind": ("partially obscured by", "half-concealed by", "screened by"),
    "inside": ("nestled in", "tucked into", "lodged in"),
    "contains": ("cradling", "harbouring", "enclosing"),
}
# The grammar's "X peeks out of Y" is a finite verb, not a preposition: its own alternatives.
INSIDE_VERB_ALT: tuple[str, ...] = ("protrudes from", "juts from", "emerges from")

# (hpos, vpos) -> alternatives; ("left", "") etc. for a horizontal position alone;
# ("row", "top") for a group in one row; ("scattered", "") for a spread-out group.
POSITION_ALT: dict[tuple[str, str], tuple[str, ...]] = {
    ("left", "top"): ("in the northwest", "toward the northwest", "in the northwestern quadrant"),
    ("middle", "top"): ("in the north", "toward the northern edge", "in the north-central area"),
    ("right", "top"): ("in the northeast", "toward the northeast", "in the northeastern quadrant"),
    ("left", "bottom"): ("in the southwest", "toward the southwest", "in the southwestern quadrant"),
    ("middle", "bottom"): ("in the south", "toward the southern edge", "in the south-central area"),
    ("right", "bottom"): ("in the southeast", "toward the southeast", "in the southeastern quadrant"),
    ("left", ""): ("toward the west", "in the western third"),
    ("middle", ""): ("centrally", "in the central third", "midway between west and east"),
    ("right", ""): ("toward the east", "in the eastern third"),
    ("row", "top"): ("abreast in the north", "arrayed through the north"),
    ("row", "bottom"): ("abreast in the south", "arrayed through the south"),
    ("scattered", ""): ("strewn about the frame", "dispersed throughout the frame", "sprinkled about"),
}

# setting -> (preposition, indefinite noun phrase, definite noun phrase)
SETTING_ALT: dict[str, tuple[tuple[str, str, str], ...]] = {
    "room": (("in", "a lounge", "the lounge"), ("in", "a parlour", "the parlour"),
             ("in", "a chamber", "the chamber")),
    "beach": (("on", "the seashore", "the seashore"), ("on", "a coast", "the coast"),
              ("by", "the shoreline", "the shoreline")),
    "street": (("on", "an avenue", "the avenue"), ("on", "a boulevard", "the boulevard"),
               ("in", "a downtown lane", "the downtown lane")),
    "forest": (("in", "a woodland", "the woodland"), ("in", "a grove", "the grove"),
               ("in", "a thicket", "the thicket")),
    "night sky": (("under", "the starlit heavens", "the starlit heavens"),
                  ("under", "a midnight firmament", "the midnight firmament"),
                  ("against", "the nocturnal heavens", "the nocturnal heavens")),
    "snowfield": (("on", "a frozen tundra", "the frozen tundra"), ("in", "a wintry expanse", "the wintry expanse"),
                  ("on", "an icy steppe", "the icy steppe")),
    "desert": (("in", "an arid wasteland", "the arid wasteland"), ("in", "the parched badlands", "the parched badlands"),
               ("in", "a barren erg", "the barren erg")),
    "meadow": (("on", "a pasture", "the pasture"), ("in", "an open prairie", "the open prairie"),
               ("on", "a lawn", "the lawn")),
}
# setting -> description sentences ("{s}": the definite setting phrase), true of every render
SCENERY_ALT: dict[str, tuple[str, ...]] = {
    "room": ("{s} features bare plaster and parquet underfoot",
             "Parquet boards stretch underfoot, ringed by the bare plaster of {s}"),
    "beach": ("{s} features a bleached shoreline, a band of ocean and a cloudless horizon",
              "Ocean waves lap at {s} toward a cloudless horizon"),
    "street": ("{s} features asphalt paving with tall facades beyond it",
               "Tall facades loom beyond the asphalt of {s}"),
    "forest": ("{s} is crowded with shadowy boles and leafy gloom",
               "Shadowy boles soar throughout {s}"),
    "night sky": ("{s} is an indigo vault, with pinpricks of starlight atop murky ridges",
                  "Murky ridges crouch under {s}"),
    "snowfield": ("{s} is blanketed in powder under a wan overcast",
                  "Fresh powder blankets {s}"),
    "desert": ("{s} features rippled ochre mounds under a dusty glare",
               "Ochre mounds ripple through {s}"),
    "meadow": ("{s} is carpeted with lush turf under sunshine",
               "Lush turf carpets {s} in the sunshine"),
}
# summary sentences ("{n}": a counted form of the number of objects)
SUMMARY_ALT: tuple[str, ...] = ("Tallying it all, there are {n} items", "In sum, {n} items are visible",
                                "{n} items are present")

# Words that carry no fact about the picture: the only words an alternative may share with the grammar.
STOP_WORDS: frozenset[str] = frozenset({
    "a", "an", "the", "of", "in", "on", "at", "to", "by", "is", "are", "and", "with", "it", "there",
    "than", "under", "against", "into", "from", "all", "any", "without", "half",
})

CLASSES: tuple[str, ...] = ("kind", "colour", "size", "pattern", "count", "relation", "position", "setting")


@dataclass(frozen=True)
class ParaphraseTable:
    """One paraphrase table: the same shapes as the module-level tables above. A class whose
    tables are empty is not covered (`covered()`); rewriting with it raises ValueError."""

    kind: dict[str, tuple[tuple[str, str], ...]]
    colour: dict[str, tuple[str, ...]]
    size: dict[str, tuple[str, ...]]
    pattern: dict[str, tuple[str, ...]]
    pattern_noun: dict[str, tuple[str, ...]]
    count: dict[int, tuple[str, ...]]
    definite_count: dict[int, tuple[str, ...]]
    relation: dict[str, tuple[str, ...]]
    inside_verb: tuple[str, ...]
    position: dict[tuple[str, str], tuple[str, ...]]
    setting: dict[str, tuple[tuple[str, str, str], ...]]
    scenery: dict[str, tuple[str, ...]]
    summary: tuple[str, ...]

    def covered(self) -> tuple[str, ...]:
        """The vocabulary classes this table can rewrite."""
        alts = alternatives(self)
        return tuple(c for c in CLASSES if alts[c])


# The test table (the lexical-shift test set's wording).
TEST_TABLE = ParaphraseTable(KIND_ALT, COLOUR_ALT, SIZE_ALT, PATTERN_ALT, PATTERN_NOUN_ALT, COUNT_ALT,
                             DEFINITE_COUNT_ALT, RELATION_ALT, INSIDE_VERB_ALT, POSITION_ALT, SETTING_ALT,
                             SCENERY_ALT, SUMMARY_ALT)

# variant name -> stream number (the last entry of the rng seed)
VARIANTS: dict[str, int] = {"shift": 0, "reordered": 1, "merged": 2, "shift+reordered": 3, "shift+merged": 4}


def alternatives(table: ParaphraseTable | None = None) -> dict[str, list[str]]:
    """Every alternative of the table (default: the test table), by vocabulary class."""
    t = table or TEST_TABLE
    return {
        "kind": [w for alts in t.kind.values() for pair in alts for w in pair],
        "colour": [w for alts in t.colour.values() for w in alts],
        "size": [w for alts in t.size.values() for w in alts],
        "pattern": [w for d in (t.pattern, t.pattern_noun) for alts in d.values() for w in alts],
        "count": [w for d in (t.count, t.definite_count) for alts in d.values() for w in alts],
        "relation": [w for alts in t.relation.values() for w in alts] + list(t.inside_verb),
        "position": [w for alts in t.position.values() for w in alts],
        "setting": [w for alts in t.setting.values() for tr in alts for w in tr]
                   + [w for alts in t.scenery.values() for w in alts] + list(t.summary),
    }


def table_size(table: ParaphraseTable | None = None) -> dict[str, int]:
    """Number of distinct alternatives per class."""
    return {k: len(set(v)) for k, v in alternatives(table).items()}


# --------------------------------------------------------------------------- the mechanical check

_TOKEN = re.compile(r"[a-z0-9]+")


def _tokens(text: str) -> list[str]:
    return _TOKEN.findall(text.lower())


def _stem(word: str) -> str:
    """A crude stem, so that the check also catches inflections ("stripes"/"striped", "sits"/"sitting")."""
    for suffix in ("ing", "ed", "es", "s", "ly"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[: -len(suffix)]
    return word


def content_words(text: str) -> set[str]:
    """The words of text, lower-cased, stop words left out."""
    return {t for t in _tokens(text) if t not in STOP_WORDS}


def _strings(value: object) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(k)
            yield from _strings(v)
    elif isinstance(value, (tuple, list, set, frozenset)):
        for v in value:
            yield from _strings(v)
    elif isinstance(value, world.KindSpec):
        yield value.noun
        yield value.plural


def _table_strings() -> Iterable[str]:
    """Every string in the module-level vocabulary tables of world.py and language.py.

    ATTRIBUTE_LEXICON contributes its words only (its values are family tags such as "colour").
    """
    for module in (world, lang):
        for name, value in vars(module).items():
            if name.startswith("__") or callable(value) or isinstance(value, re.Pattern):
                continue
            if name == "ATTRIBUTE_LEXICON":
                value = list(value)
            if name == "_LEX_KEYS" or isinstance(value, (int, float)):
                continue
            yield from _strings(value)
    for r in world.RELATIONS:
        yield r.replace("_", " ")


@lru_cache(maxsize=4)
def grammar_words(n_scenes: int = 5000) -> frozenset[str]:
    """Every word SceneWorld's grammar can produce: the words of language.py's and world.py's
    vocabulary tables and templates, and those of every text (original caption, positives,
    negatives, paragraph) of n_scenes generated scenes (half training seed 0, half test seed 1000)."""
    from engine.sceneworld import generate_scene

    words: set[str] = set()
    for s in _table_strings():
        words.update(_tokens(s))
    for i in range(n_scenes):
        scene = generate_scene(0 if i % 2 == 0 else 1000, i // 2)
        for t in [scene.original_caption, *scene.positives, *scene.negatives, scene.paragraph]:
            words.update(_tokens(t.text))
    return frozenset(words)


def table_conflicts(n_scenes: int = 5000, table: ParaphraseTable | None = None) -> dict[str, list[tuple[str, str]]]:
    """class -> [(alternative, grammar word it shares)]: a content word of an alternative that the
    grammar produces, as it is or inflected (same crude stem). Empty lists when the table is clean."""
    grammar = grammar_words(n_scenes) - STOP_WORDS
    stems = {_stem(w): w for w in grammar}
    out: dict[str, list[tuple[str, str]]] = {}
    for cls, alts in alternatives(table).items():
        bad = []
        for alt in alts:
            for w in content_words(alt.replace("{s}", "").replace("{n}", "")):
                if w in grammar:
                    bad.append((alt, w))
                elif _stem(w) in stems:
                    bad.append((alt, stems[_stem(w)]))
        out[cls] = bad
    return out


def table_overlap(a: ParaphraseTable, b: ParaphraseTable) -> list[tuple[str, str]]:
    """[(alternative of a, content word of b it shares)]: a content word of an alternative of a that
    is a content word of an alternative of b, as it is or inflected (same crude stem). Empty when the
    two tables are disjoint (a training table against the test table)."""
    theirs = {w for alts in alternatives(b).values() for alt in alts
              for w in content_words(alt.replace("{s}", "").replace("{n}", ""))}
    stems = {_stem(w): w for w in theirs}
    bad = []
    for alts in alternatives(a).values():
        for alt in alts:
            for w in content_words(alt.replace("{s}", "").replace("{n}", "")):
                if w in theirs:
                    bad.append((alt, w))
                elif _stem(w) in stems:
                    bad.append((alt, stems[_stem(w)]))
    return bad


# --------------------------------------------------------------------------- reading a shifted phrase

def _phrase_lexicon() -> dict[str, tuple[str, str]]:
    lex: dict[str, tuple[str, str]] = {}
    for k, alts in KIND_ALT.items():
        for sg, pl in alts:
            lex[sg] = ("kind", k)
            lex[pl] = ("kind", k)
    for fam, table in (("colour", COLOUR_ALT), ("size", SIZE_ALT), ("pattern", PATTERN_ALT)):
        for v, alts in table.items():
            for w in alts:
                lex[w] = (fam, v)
    for p, alts in PATTERN_NOUN_ALT.items():
        for w in alts:
            lex[w] = ("pattern", p)
    for table in (COUNT_ALT, DEFINITE_COUNT_ALT):
        for n, alts in table.items():
            for w in alts:
                lex[w] = ("number", str(n))
    return lex


_LEX = _phrase_lexicon()
_LEX_RE = re.compile(r"(?<![\w-])(" + "|".join(re.escape(w) for w in sorted(_LEX, key=lambda w: -len(w)))
                     + r")(?![\w-])")


def parse_shifted_phrase(text: str) -> dict[str, list[str]]:
    """Every value a shifted object phrase names, by family: {"kind": [...], "colour": [...], ...}.

    A well-formed phrase names exactly one kind and one colour; "number" holds the counted form's
    number ("1" when there is none and the noun is singular).
    """
    out: dict[str, list[str]] = {"kind": [], "colour": [], "size": [], "pattern": [], "number": []}
    plural = False
    for m in _LEX_RE.finditer(text.lower()):
        fam, val = _LEX[m.group(1)]
        out[fam].append(val)
        if fam == "kind":
            plural = m.group(1) in {pl for sg, pl in KIND_ALT[val] if pl != sg}
    if not out["number"] and not plural:
        out["number"] = ["1"]
    out["definite"] = ["yes"] if re.match(r"(the|both|all)\b", text.lower()) else []
    return out


# --------------------------------------------------------------------------- rewriting

_POSITION_SOURCES: dict[str, tuple[str, str]] = {}
for _key, _words in lang.POSITION_WORDS.items():
    for _w in _words:
        _POSITION_SOURCES[_w] = _key
for _h, _words in lang.H_POSITION_WORDS.items():
    for _w in _words:
        _POSITION_SOURCES[_w] = (_h, "")
for _v, _words in lang.ROW_WORDS.items():
    for _w in _words:
        _POSITION_SOURCES[_w] = ("row", _v)
for _w in lang.SCATTERED_WORDS:
    _POSITION_SOURCES[_w] = ("scattered", "")
_POSITION_RE = re.compile(
    r"\b(" + "|".join(re.escape(w) for w in sorted(_POSITION_SOURCES, key=lambda w: -len(w))) + r")\b",
    re.IGNORECASE,
)
_SETTING_PREPS = sorted({prep for forms in lang.SETTING_FORMS.values() for prep, _ in forms}, key=lambda p: -len(p))
_SUMMARY_RE = re.compile(r"^(Altogether there are|In total,|The picture contains) (\w+) "
                         r"(objects|things can be seen|objects in all)\.$")
_NUMBER_OF_WORD = {w: n for n, w in lang.NUMBER_WORDS.items()}


def _cap(s: str) -> str:
    return s[:1].upper() + s[1:] if s else s


class _Shifter:
    def __init__(self, scene: Scene, rng: np.random.Generator, classes: Sequence[str],
                 table: ParaphraseTable = TEST_TABLE) -> None:
        unknown = set(classes) - set(CLASSES)
        if unknown:
            raise ValueError(f"unknown vocabulary classes {sorted(unknown)}; known: {', '.join(CLASSES)}")
        if table is not TEST_TABLE:
            missing = set(classes) - set(table.covered())
            if missing:
                raise ValueError(f"the paraphrase table does not cover {sorted(missing)}")
        self.t = table
        self.scene = scene
        self.rng = rng
        self.classes = set(classes)
        self.fixed: dict[tuple[str, str], int] = {}

    def pick(self, options: Sequence[str]) -> str:
        return options[int(self.rng.integers(len(options)))]

    def choice(self, family: str, value: str, n: int) -> int:
        """One alternative per value and paragraph: a kitten stays a kitten, the seashore the seashore."""
        key = (family, value)
        if key not in self.fixed:
            self.fixed[key] = int(self.rng.integers(n))
        return self.fixed[key]

    # ---- object phrases
    def object_phrase(self, phrase: Phrase) -> str:
        stated = lang.parse_object_phrase(phrase.text)
        obj = self.scene.objects[phrase.object_ids[0]]
        number = len(phrase.object_ids)
        low = phrase.text.lower()
        definite = low.startswith("the ")
        shows_number = any(re.search(rf"\b{w}\b", low) for w in _NUMBER_OF_WORD)
        c = self.classes
        # Attribute words, each either shifted or the grammar's own first wording.
        size = None
        if stated["size"]:
            size = self.pick(self.t.size[obj.size]) if "size" in c else lang.SIZE_WORDS[obj.size][0]
        colour = (self.t.colour[obj.colour][self.choice("colour", obj.colour, len(self.t.colour[obj.colour]))]
                  if "colour" in c else obj.colour)
        if "kind" in c:
            sg, pl = self.t.kind[obj.kind][self.choice("kind", obj.kind, len(self.t.kind[obj.kind]))]
        else:
            sg, pl = KINDS[obj.kind].noun, KINDS[obj.kind].plural
        noun = pl if number > 1 else sg
        pattern_adj = pattern_tail = None
        if stated["pattern"]:
            if "pattern" in c:
                if self.rng.random() < 0.3:
                    pattern_tail = self.pick(self.t.pattern_noun[obj.pattern])
                else:
                    pattern_adj = self.pick(self.t.pattern[obj.pattern])
            else:
                pattern_adj = lang.PATTERN_ADJ[obj.pattern][0]
        body = " ".join(w for w in (size, pattern_adj, colour, noun) if w)
        if pattern_tail:
            body += f" {pattern_tail}"
        if definite:
            if number > 1 and shows_number:
                head = (self.pick(self.t.definite_count[number]) if "count" in c and number in self.t.definite_count
                        else f"the {lang.NUMBER_WORDS[number]}")
                return f"{head} {body}"
            return f"the {body}"
        if number == 1:
            return f"{'an' if body[0] in 'aeiou' else 'a'} {body}"
        head = self.pick(self.t.count[number]) if "count" in c else lang.NUMBER_WORDS[number]
        return f"{head} {body}"

    def relation_phrase(self, phrase: Phrase) -> str:
        if "relation" not in self.classes:
            return phrase.text
        if phrase.text in lang.REL_EXTRA_WORDS.get(phrase.relation, ()):
            return self.pick(self.t.inside_verb)
        return self.pick(self.t.relation[phrase.relation])

    def setting_form(self) -> tuple[str, str, str]:
        forms = self.t.setting[self.scene.setting]
        return forms[self.choice("setting", self.scene.setting, len(forms))]

    def gap(self, text: str) -> str:
        """Literal words between phrases: position words are replaced."""
        if "position" not in self.classes:
            return text

        def sub(m: re.Match[str]) -> str:
            key = _POSITION_SOURCES[m.group(1).lower()]
            alt = self.pick(self.t.position[key])
            return _cap(alt) if m.group(1)[0].isupper() else alt

        return _POSITION_RE.sub(sub, text)

    # ---- sentences
    def sentence(self, text: str, phrases: list[Phrase]) -> tuple[str, list[Phrase]]:
        """One sentence (text relative to its own start, phrases relative likewise) -> shifted."""
        setting_shift = "setting" in self.classes
        if setting_shift and any(b and b in text or a and a in text
                                 for b, a in lang.SETTING_DESCRIPTIONS[self.scene.setting]):
            _, _, definite = self.setting_form()
            template = self.pick(self.t.scenery[self.scene.setting])
            at = template.index("{s}")
            out = _cap(template.format(s=definite)) + "."
            start = at if at else 0
            shown = out[start : start + len(definite)]
            return out, [Phrase(shown, start, start + len(definite), "setting", [])]
        m = _SUMMARY_RE.match(text)
        if m and "count" in self.classes:
            n = _NUMBER_OF_WORD[m.group(2)]
            return _cap(self.pick(self.t.summary).format(n=self.pick(self.t.count[n]))) + ".", []
        out = ""
        new_phrases: list[Phrase] = []
        pos = 0
        for p in sorted(phrases, key=lambda p: p.start):
            gap = text[pos : p.start]
            if p.kind == "object":
                piece = self.object_phrase(p)
            elif p.kind == "relation":
                piece = self.relation_phrase(p)
            elif setting_shift:
                prep, indef, _ = self.setting_form()
                piece = indef
                stripped = gap.rstrip()
                own = {prep for prep, form in lang.SETTING_FORMS[self.scene.setting] if form == p.text.lower()}
                for old in _SETTING_PREPS:
                    if old in own and stripped.lower().endswith(old) and (
                            len(stripped) == len(old) or not stripped[-len(old) - 1].isalpha()) \
                            and not stripped.lower().endswith("looking at"):
                        cap = stripped[-len(old)].isupper()
                        gap = stripped[: -len(old)] + (_cap(prep) if cap else prep) + " "
                        break
            else:
                piece = p.text
            out += self.gap(gap)
            if p.text[:1].isupper():
                piece = _cap(piece)
            new_phrases.append(Phrase(piece, len(out), len(out) + len(piece), p.kind, list(p.object_ids), p.relation))
            out += piece
            pos = p.end
        tail = text[pos:]
        if "relation" in self.classes and re.fullmatch(r" inside\.", tail):
            tail = " in it."  # "... with a key inside." (the grammar's only relation word outside a phrase)
        out += self.gap(tail)
        return _cap(out), new_phrases


def _sentences(paragraph: Paragraph) -> list[tuple[str, list[Phrase]]]:
    out = []
    for sp in paragraph.sentences:
        ps = [Phrase(p.text, p.start - sp.start, p.end - sp.start, p.kind, list(p.object_ids), p.relation)
              for p in paragraph.phrases if sp.start <= p.start and p.end <= sp.end]
        out.append((paragraph.text[sp.start : sp.end], ps))
    return out


def _join(sentences: Sequence[tuple[str, list[Phrase]]], sep: str = " ") -> Paragraph:
    text = ""
    phrases: list[Phrase] = []
    spans: list[Span] = []
    for i, (s, ps) in enumerate(sentences):
        if i:
            text += sep
        start = len(text)
        text += s
        spans.append(Span(start, len(text)))
        phrases += [Phrase(p.text, p.start + start, p.end + start, p.kind, list(p.object_ids), p.relation)
                    for p in ps]
    return Paragraph(text, phrases, spans)


def _rng(scene: Scene, rng_seed: int, variant: str) -> np.random.Generator:
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; known: {', '.join(VARIANTS)}")
    return np.random.default_rng([rng_seed, scene.seed, scene.index, VARIANTS[variant]])


def rewrite_paragraph(scene: Scene, rng_seed: int = 0, *, classes: Sequence[str] | None = None,
                      variant: str = "shift", table: ParaphraseTable | None = None) -> Paragraph:
    """The scene's paragraph with every word of the given vocabulary classes (default: every class
    the table covers) shifted, with the words of `table` (default: the test table), as a Paragraph
    whose phrases and sentence spans point into the new text."""
    table = table or TEST_TABLE
    sh = _Shifter(scene, _rng(scene, rng_seed, variant), table.covered() if classes is None else classes, table)
    return _join([sh.sentence(s, ps) for s, ps in _sentences(scene.paragraph)])


def reorder_sentences(paragraph: Paragraph, rng: np.random.Generator) -> Paragraph:
    """The same sentences in another order (never the original order when there are two or more)."""
    sents = _sentences(paragraph)
    order = list(rng.permutation(len(sents)))
    if len(sents) > 1 and order == sorted(order):
        order = order[1:] + order[:1]
    return _join([sents[i] for i in order])


MERGE_JOINERS: tuple[str, ...] = ("; ", ", and ")


def merge_sentences(paragraph: Paragraph, rng: np.random.Generator) -> Paragraph:
    """Neighbouring sentences joined in pairs (1+2, 3+4, ...) with a semicolon or ", and"."""
    sents = _sentences(paragraph)
    merged: list[tuple[str, list[Phrase]]] = []
    for i in range(0, len(sents), 2):
        if i + 1 == len(sents):
            merged.append(sents[i])
            break
        (a, pa), (b, pb) = sents[i], sents[i + 1]
        joiner = MERGE_JOINERS[int(rng.integers(len(MERGE_JOINERS)))]
        head = a[:-1] if a.endswith(".") else a
        b2 = b if b.startswith("I ") else b[:1].lower() + b[1:]
        off = len(head) + len(joiner)
        pb2 = [Phrase(b2[p.start : p.end], p.start + off, p.end + off, p.kind, list(p.object_ids), p.relation)
               for p in pb]
        merged.append((head + joiner + b2, pa + pb2))
    return _join(merged)


def shifted_paragraph(scene: Scene, rng_seed: int = 0, variant: str = "shift",
                      classes: Sequence[str] = CLASSES) -> Paragraph:
    """One variant of the scene's paragraph: "shift" (lexical shift), "reordered" / "merged" (the
    grammar's own words, sentences reordered / merged), "shift+reordered", "shift+merged"."""
    rng = _rng(scene, rng_seed, variant)
    para = rewrite_paragraph(scene, rng_seed, classes=classes, variant=variant) if variant.startswith("shift") \
        else scene.paragraph
    if variant.endswith("reordered"):
        para = reorder_sentences(para, rng)
    elif variant.endswith("merged"):
        para = merge_sentences(para, rng)
    return para


def lexical_shift_paragraph(scene: Scene, rng_seed: int = 0, variant: str = "shift") -> str:
    """The scene's paragraph in shifted words (or another variant, see shifted_paragraph)."""
    return shifted_paragraph(scene, rng_seed, variant).text


@dataclass
class ShiftItem:
    scene: Scene
    texts: dict[str, str]  # "grammar" and every VARIANTS name -> paragraph text

    def __iter__(self):  # (scene, texts) unpacking
        return iter((self.scene, self.texts))


def lexical_shift_set(seed: int = 1000, n: int = 1000, rng_seed: int = 0) -> list[ShiftItem]:
    """The fixed lexical-shift test set: scenes (seed, 0..n-1) with the grammar's paragraph and each variant."""
    from engine.sceneworld import check_eval_seed, generate_scenes

    check_eval_seed(seed)
    out = []
    for scene in generate_scenes(seed, 0, n):
        texts = {"grammar": scene.paragraph.text}
        texts.update({v: lexical_shift_paragraph(scene, rng_seed, v) for v in VARIANTS})
        out.append(ShiftItem(scene, texts))
    return out
