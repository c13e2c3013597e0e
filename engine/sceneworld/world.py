"""SceneWorld vocabulary, scene-graph types and layout sampling.

A scene graph is sampled from `numpy.random.default_rng([seed, index, 0])` only, so it is a
pure function of (seed, index). Texts (language.py) draw from stream 1 and the background
texture (render.py) from stream 2: changing the wording code never moves an object.

Geometry conventions: boxes are normalised (x0, y0, x1, y1) in [0, 1], y grows downwards;
`depth` is the draw order (0 = drawn first, i.e. furthest back).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

# --------------------------------------------------------------------------- vocabulary

SETTINGS: tuple[str, ...] = (
    "room",
    "beach",
    "street",
    "forest",
    "night sky",
    "snowfield",
    "desert",
    "meadow",
)

# Saturated, well separated colours: every pair is > 80 apart in RGB so a small model
# (and the nearest-colour check in the tests) can tell them apart after shading.
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (215, 35, 35),
    "orange": (245, 135, 20),
    "yellow": (245, 215, 30),
    "green": (40, 160, 60),
    "blue": (35, 85, 215),
    "purple": (130, 55, 175),
    "pink": (245, 130, 190),
    "white": (245, 245, 240),
    "black": (25, 25, 28),
    "brown": (125, 75, 35),
    "grey": (135, 135, 135),
}

# Object colours that would melt into a setting's background are never sampled there.
SETTING_FORBIDDEN_COLOURS: dict[str, tuple[str, ...]] = {
    "room": ("brown",),
    "beach": ("yellow",),
    "street": ("grey", "black"),
    "forest": ("green", "brown", "black"),
    "night sky": ("black", "purple"),
    "snowfield": ("white",),
    "desert": ("orange", "yellow", "brown"),
    "meadow": ("green",),
}

SIZES: tuple[str, ...] = ("small", "large")
# Longest side of the object's box as a fraction of the image side. Large is ~1.9x small.
SIZE_RANGE: dict[str, tuple[float, float]] = {"small": (0.21, 0.24), "large": (0.40, 0.45)}

PATTERNS: tuple[str, ...] = ("plain", "striped", "dotted", "checked")

RELATIONS: tuple[str, ...] = (
    "left_of",
    "right_of",
    "above",
    "below",
    "next_to",
    "in_front_of",
    "behind",
    "inside",
    "contains",
)
INVERSE_RELATION: dict[str, str] = {
    "left_of": "right_of",
    "right_of": "left_of",
    "above": "below",
    "below": "above",
    "next_to": "next_to",
    "in_front_of": "behind",
    "behind": "in_front_of",
    "inside": "contains",
    "contains": "inside",
}


@dataclass(frozen=True)
class KindSpec:
    noun: str
    plural: str
    aspect: float  # box width / height
    patterns: tuple[str, ...] = PATTERNS
    container: bool = False


# Thin figures (key, bicycle) cannot show a pattern at 64-96 px, so they are always plain.
KINDS: dict[str, KindSpec] = {
    "ball": KindSpec("ball", "balls", 1.0),
    "star": KindSpec("star", "stars", 1.05),
    "heart": KindSpec("heart", "hearts", 1.1),
    "house": KindSpec("house", "houses", 0.9),
    "tree": KindSpec("tree", "trees", 0.75),
    "car": KindSpec("car", "cars", 1.7),
    "cat": KindSpec("cat", "cats", 0.85),
    "fish": KindSpec("fish", "fish", 1.6),
    "bird": KindSpec("bird", "birds", 1.3),
    "flower": KindSpec("flower", "flowers", 0.75),
    "umbrella": KindSpec("umbrella", "umbrellas", 1.0),
    "cup": KindSpec("cup", "cups", 1.15),
    "key": KindSpec("key", "keys", 2.0, ("plain",)),
    "boat": KindSpec("boat", "boats", 1.15),
    "moon": KindSpec("moon", "moons", 0.72),
    "bicycle": KindSpec("bicycle", "bicycles", 1.55, ("plain",)),
    "hat": KindSpec("hat", "hats", 1.3),
    "lamp": KindSpec("lamp", "lamps", 0.75),
    "kite": KindSpec("kite", "kites", 0.75),
    "book": KindSpec("book", "books", 0.8),
    "box": KindSpec("box", "boxes", 1.05, container=True),
    "basket": KindSpec("basket", "baskets", 1.1, container=True),
}
KIND_NAMES: tuple[str, ...] = tuple(KINDS)
CONTAINER_KINDS: tuple[str, ...] = tuple(k for k, s in KINDS.items() if s.container)


# Render size of the occlusion analysis done while sampling (visibility, in-front-of).
ANALYSIS_SIZE = 64
MIN_VISIBLE = 0.6  # share of an object's silhouette that must stay visible
MIN_VISIBLE_INNER = 0.45  # an object inside a container is partly hidden by its front
MIN_OCCLUSION = 0.04  # share of the back object that must be covered to say "in front of"


# --------------------------------------------------------------------------- types


@dataclass
class Phrase:
    """A span of a text: `text == owner_text[start:end]`.

    kind: "object" (noun phrase for one object or a counted group), "relation" (the words
    linking two object phrases; object_ids = [subject, object] and `relation` names the
    predicate that the words assert) or "setting" (object_ids empty).
    """

    text: str
    start: int
    end: int
    kind: str
    object_ids: list[int]
    relation: str = ""


@dataclass
class Span:
    start: int
    end: int


@dataclass
class Text:
    text: str
    phrases: list[Phrase]


@dataclass
class Paragraph(Text):
    sentences: list[Span] = field(default_factory=list)


@dataclass
class Negative(Text):
    """A positive caption made false in exactly one detail.

    error_type: "attribute" | "relation" | "count" | "object"; source_index: index into
    Scene.positives; detail: "<field>: <true> -> <false>" for people reading the data.
    Phrases keep the object ids of the source phrase (the object the wrong words replaced).
    """

    error_type: str = ""
    source_index: int = 0
    detail: str = ""


@dataclass
class SceneObject:
    id: int
    kind: str
    colour: str
    size: str
    pattern: str
    box_norm: tuple[float, float, float, float]
    depth: int
    group: int | None = None  # members of a counted group share it (and all attributes)
    container: int | None = None  # id of the container this object sits inside
    hpos: str = ""  # "left" | "middle" | "right" (from the box centre)
    vpos: str = ""  # "top" | "bottom"

    def box_px(self, size: int) -> tuple[int, int, int, int]:
        """Pixel box at a square render size: the half-open range the renderer may paint."""
        x0, y0, x1, y1 = self.box_norm
        return (
            int(np.floor(x0 * size)),
            int(np.floor(y0 * size)),
            min(size, int(np.ceil(x1 * size))),
            min(size, int(np.ceil(y1 * size))),
        )


@dataclass
class Relation:
    subject: int
    predicate: str
    object: int


@dataclass
class Count:
    """How many objects of a kind the scene holds (kinds are unique per entity)."""

    kind: str
    number: int
    object_ids: list[int]


@dataclass
class Scene:
    seed: int
    index: int
    setting: str
    objects: list[SceneObject]
    relations: list[Relation]
    counts: list[Count]
    original_caption: Text = field(default_factory=lambda: Text("", []))
    positives: list[Text] = field(default_factory=list)
    negatives: list[Negative] = field(default_factory=list)
    paragraph: Paragraph = field(default_factory=lambda: Paragraph("", []))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Scene:
        def text(t: dict[str, Any]) -> Text:
            return Text(t["text"], [Phrase(**p) for p in t["phrases"]])

        objects = [SceneObject(**{**o, "box_norm": tuple(o["box_norm"])}) for o in d["objects"]]
        para = d["paragraph"]
        return cls(
            seed=d["seed"],
            index=d["index"],
            setting=d["setting"],
            objects=objects,
            relations=[Relation(**r) for r in d["relations"]],
            counts=[Count(**c) for c in d["counts"]],
            original_caption=text(d["original_caption"]),
            positives=[text(t) for t in d["positives"]],
            negatives=[
                Negative(
                    n["text"],
                    [Phrase(**p) for p in n["phrases"]],
                    n["error_type"],
                    n["source_index"],
                    n.get("detail", ""),
                )
                for n in d["negatives"]
            ],
            paragraph=Paragraph(
                para["text"], [Phrase(**p) for p in para["phrases"]], [Span(**s) for s in para["sentences"]]
            ),
        )

    def boxes_px(self, size: int) -> np.ndarray:
        """(n_objects, 4) int boxes x0, y0, x1, y1 at a square render size."""
        return np.array([o.box_px(size) for o in self.objects], dtype=np.int64).reshape(-1, 4)

    def object(self, object_id: int) -> SceneObject:
        return self.objects[object_id]


# --------------------------------------------------------------------------- geometry


def position_of(box: tuple[float, float, float, float]) -> tuple[str, str]:
    """Position words of a box centre: thirds across, halves down."""
    cx = (box[0] + box[2]) / 2
    cy = (box[1] + box[3]) / 2
    h = "left" if cx < 1 / 3 else ("right" if cx > 2 / 3 else "middle")
    v = "top" if cy < 0.5 else "bottom"
    return h, v


def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return min(a1, b1) - max(a0, b0)


def _left_of(a: SceneObject, b: SceneObject) -> bool:
    ax0, ay0, ax1, ay1 = a.box_norm
    bx0, by0, bx1, by1 = b.box_norm
    acx, bcx = (ax0 + ax1) / 2, (bx0 + bx1) / 2
    # Side by side: centres well apart, little horizontal overlap, rows overlapping.
    return (
        bcx - acx >= 0.2
        and ax1 - bx0 <= 0.12
        and _overlap(ay0, ay1, by0, by1) >= 0.25 * min(ay1 - ay0, by1 - by0)
    )


def _above(a: SceneObject, b: SceneObject) -> bool:
    ax0, ay0, ax1, ay1 = a.box_norm
    bx0, by0, bx1, by1 = b.box_norm
    acy, bcy = (ay0 + ay1) / 2, (by0 + by1) / 2
    return (
        bcy - acy >= 0.2
        and ay1 - by0 <= 0.12
        and _overlap(ax0, ax1, bx0, bx1) >= 0.25 * min(ax1 - ax0, bx1 - bx0)
    )


def _boxes_intersect(a: SceneObject, b: SceneObject) -> bool:
    ax0, ay0, ax1, ay1 = a.box_norm
    bx0, by0, bx1, by1 = b.box_norm
    return _overlap(ax0, ax1, bx0, bx1) > 0 and _overlap(ay0, ay1, by0, by1) > 0


def relation_holds(predicate: str, a: SceneObject, b: SceneObject) -> bool:
    """Whether `a predicate b` is true from boxes, draw order and containment alone.

    This is the permissive test used to make sure a negative is false; the relations
    stored on a Scene are the stricter subset that is also clearly visible (in-front-of
    needs real pixel overlap there).
    """
    if a.id == b.id:
        return False
    nested = a.container == b.id or b.container == a.id
    if predicate == "inside":
        return a.container == b.id
    if predicate == "contains":
        return b.container == a.id
    if nested:
        return False  # an object in a container has no other relation to it
    if predicate == "left_of":
        return _left_of(a, b)
    if predicate == "right_of":
        return _left_of(b, a)
    if predicate == "above":
        return _above(a, b)
    if predicate == "below":
        return _above(b, a)
    if predicate == "next_to":
        if not (_left_of(a, b) or _left_of(b, a)):
            return False
        gap = max(b.box_norm[0] - a.box_norm[2], a.box_norm[0] - b.box_norm[2])
        return gap <= 0.12
    if predicate == "in_front_of":
        return _boxes_intersect(a, b) and a.depth > b.depth
    if predicate == "behind":
        return _boxes_intersect(a, b) and a.depth < b.depth
    raise ValueError(f"unknown relation {predicate!r}")


def describe_world() -> dict[str, Any]:
    """The vocabulary, for documentation."""
    return {
        "settings": list(SETTINGS),
        "kinds": list(KIND_NAMES),
        "container_kinds": list(CONTAINER_KINDS),
        "colours": {k: list(v) for k, v in COLOURS.items()},
        "setting_forbidden_colours": {k: list(v) for k, v in SETTING_FORBIDDEN_COLOURS.items()},
        "sizes": list(SIZES),
        "size_range": {k: list(v) for k, v in SIZE_RANGE.items()},
        "patterns": list(PATTERNS),
        "relations": list(RELATIONS),
        "positions": {"horizontal": ["left", "middle", "right"], "vertical": ["top", "bottom"]},
        "objects_per_scene": [2, 6],
        "group_counts": [2, 3],
    }
