"""TRAIN_TABLE: a training-time paraphrase table, disjoint from the lexical-shift TEST table.

Training data, not a test set: `longlens dev train-lm-tower --paraphrase-train K` adds K
rewrites of each training paragraph made with this table (engine.sceneworld.lexical_shift's
`rewrite_paragraph(..., table=TRAIN_TABLE)`). No content word of an alternative here (as it is or
by the crude stem of lexical_shift) is a content word of any TEST alternative, nor one the grammar
produces (tests/engine/test_train_paraphrase.py), so the lexical-shift test still measures words a
tower never saw in training.

Covered classes: kind, colour, size, pattern, count (with the summary sentence), setting (with
the setting-description sentences). Not covered: relation, position (their tables are empty;
those words stay the grammar's own in the training rewrites).
"""

from __future__ import annotations

from engine.sceneworld.lexical_shift import ParaphraseTable

__all__ = ["TRAIN_TABLE"]

_KIND: dict[str, tuple[tuple[str, str], ...]] = {
    "ball": (("marble", "marbles"), ("bauble", "baubles"), ("bead", "beads")),
    "star": (("asterisk", "asterisks"), ("sparkle", "sparkles")),
    "heart": (("cardioid", "cardioids"), ("cupid token", "cupid tokens")),
    "house": (("cabin", "cabins"), ("hut", "huts"), ("villa", "villas")),
    "tree": (("pine", "pines"), ("willow", "willows"), ("birch", "birches")),
    "car": (("coupe", "coupes"), ("limousine", "limousines"), ("jeep", "jeeps")),
    "cat": (("moggy", "moggies"), ("tabby", "tabbies"), ("mouser", "mousers")),
    "fish": (("trout", "trout"), ("perch", "perch"), ("tuna", "tuna")),
    "bird": (("robin", "robins"), ("pigeon", "pigeons"), ("wren", "wrens")),
    "flower": (("tulip", "tulips"), ("lily", "lilies"), ("orchid", "orchids")),
    "umbrella": (("gamp", "gamps"), ("bumbershoot", "bumbershoots")),
    "cup": (("goblet", "goblets"), ("chalice", "chalices"), ("tankard", "tankards")),
    "key": (("passkey", "passkeys"), ("unlocking tool", "unlocking tools")),
    "boat": (("canoe", "canoes"), ("yacht", "yachts"), ("raft", "rafts")),
    "moon": (("satellite", "satellites"), ("sickle motif", "sickle motifs")),
    "bicycle": (("tandem", "tandems"), ("velocipede", "velocipedes")),
    "hat": (("beret", "berets"), ("beanie", "beanies"), ("sombrero", "sombreros")),
    "lamp": (("torch", "torches"), ("chandelier", "chandeliers")),
    "kite": (("windborne plaything", "windborne playthings"), ("breeze rider", "breeze riders")),
    "book": (("tome", "tomes"), ("manuscript", "manuscripts")),
    "box": (("casket", "caskets"), ("coffer", "coffers")),
    "basket": (("creel", "creels"), ("wicker tote", "wicker totes"), ("punnet", "punnets")),
}

_COLOUR: dict[str, tuple[str, ...]] = {
    "red": ("ruby", "vermilion", "carmine"),
    "orange": ("saffron", "pumpkin", "persimmon"),
    "yellow": ("mustard", "buttercup", "citrine"),
    "green": ("olive", "mint", "sage"),
    "blue": ("sapphire", "cerulean", "denim"),
    "purple": ("lavender", "lilac", "amethyst"),
    "pink": ("salmon", "fuchsia", "magenta"),
    "white": ("pearl", "alabaster", "chalky"),
    "black": ("onyx", "sable", "sooty"),
    "brown": ("coffee", "walnut", "cinnamon"),
    "grey": ("pewter", "charcoal", "graphite"),
}

_SIZE: dict[str, tuple[str, ...]] = {
    "small": ("diminutive", "compact", "dinky"),
    "large": ("massive", "hefty", "jumbo", "colossal"),
}

_PATTERN: dict[str, tuple[str, ...]] = {
    "plain": ("uniform", "monotone", "featureless"),
    "striped": ("streaked", "ribbed", "hooped"),
    "dotted": ("flecked", "stippled", "peppered"),
    "checked": ("houndstooth", "argyle"),
}
_PATTERN_NOUN: dict[str, tuple[str, ...]] = {
    "plain": ("lacking ornament", "devoid of motifs"),
    "striped": ("with streaks", "with hoops"),
    "dotted": ("with flecks", "with stipples"),
    "checked": ("with a houndstooth weave", "with an argyle motif"),
}

_COUNT: dict[int, tuple[str, ...]] = {
    2: ("a duo of", "a twosome of", "a brace of"),
    3: ("a triad of", "a threesome of"),
    4: ("a foursome of", "a tetrad of"),
    5: ("a pentad of", "a fivesome of"),
    6: ("a hexad of", "a sixsome of"),
}
_DEFINITE_COUNT: dict[int, tuple[str, ...]] = {
    2: ("the duo of", "the twosome of"),
    3: ("the triad of",),
    4: ("the tetrad of",),
}

_SETTING: dict[str, tuple[tuple[str, str, str], ...]] = {
    "room": (("in", "a den", "the den"), ("in", "a study", "the study"), ("in", "a salon", "the salon")),
    "beach": (("on", "a strand", "the strand"), ("at", "the waterfront", "the waterfront"),
              ("by", "a bay", "the bay")),
    "street": (("on", "a thoroughfare", "the thoroughfare"), ("in", "an alley", "the alley"),
               ("on", "a roadway", "the roadway")),
    "forest": (("in", "a copse", "the copse"), ("in", "a timberland", "the timberland"),
               ("in", "a spinney", "the spinney")),
    "night sky": (("under", "the celestial dome", "the celestial dome"), ("under", "the cosmos", "the cosmos")),
    "snowfield": (("on", "a glacier", "the glacier"), ("on", "an ice sheet", "the ice sheet"),
                  ("on", "a polar waste", "the polar waste")),
    "desert": (("in", "the sahara", "the sahara"), ("in", "a scorched dustbowl", "the scorched dustbowl")),
    "meadow": (("in", "a paddock", "the paddock"), ("in", "a hayfield", "the hayfield"),
               ("on", "a sward", "the sward")),
}
_SCENERY: dict[str, tuple[str, ...]] = {
    "room": ("{s} boasts whitewashed partitions and timber planking", "Timber planking decks {s}"),
    "beach": ("{s} offers sunlit grit and surf", "Surf washes onto {s}"),
    "street": ("{s} boasts tarmac and tenements", "Tenements flank {s}"),
    "forest": ("{s} is thick with gnarled timber", "Gnarled timber throngs {s}"),
    "night sky": ("{s} glitters with constellations", "Constellations spangle {s}"),
    "snowfield": ("{s} is coated in frost", "Frost coats {s}"),
    "desert": ("{s} boasts tawny hummocks", "Tawny hummocks stud {s}"),
    "meadow": ("{s} is verdant with clover", "Clover mantles {s}"),
}
_SUMMARY: tuple[str, ...] = ("Overall, {n} pieces feature", "Enumerated, {n} pieces")

TRAIN_TABLE = ParaphraseTable(_KIND, _COLOUR, _SIZE, _PATTERN, _PATTERN_NOUN, _COUNT, _DEFINITE_COUNT,
                              relation={}, inside_verb=(), position={}, setting=_SETTING, scenery=_SCENERY,
                              summary=_SUMMARY)
