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
_PATTERN_P = (0.4, 0.2, 0.2, 0.2)

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

# Layout grid: 3 columns x 2 rows; each free-standing object owns one cell.
_COL_X: tuple[float, ...] = (1 / 6, 1 / 2, 5 / 6)
_ROW_Y: tuple[float, ...] = (0.28, 0.72)
_JITTER = 0.035
# Position words are decided by thirds (x) and halves (y) of the box centre; a centre is
# kept this far from a boundary so that the word is not a coin flip for the viewer.
_POS_MARGIN = 0.04

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


# --------------------------------------------------------------------------- sampling


@dataclass
class _Plan:
    kind: str
    colour: str
    size: str
    pattern: str
    count: int = 1
    role: str = "free"  # "free" | "inner" | "attached"
    anchor: int = -1  # plan index of the container / the object it overlaps


def _box_dims(kind: str, size: str, rng: np.random.Generator) -> tuple[float, float]:
    lo, hi = SIZE_RANGE[size]
    s = float(rng.uniform(lo, hi))
    aspect = KINDS[kind].aspect
    return (s, s / aspect) if aspect >= 1 else (s * aspect, s)


def _clamp_pos(c: float, bounds: tuple[float, ...]) -> float:
    # Nudge a centre away from a position boundary (1/3, 2/3 across or 1/2 down).
    for t in bounds:
        if abs(c - t) < _POS_MARGIN:
            c = t - _POS_MARGIN if c < t else t + _POS_MARGIN
    return c


def _place(cx: float, cy: float, w: float, h: float) -> tuple[float, float, float, float]:
    cx = min(max(cx, 0.01 + w / 2), 0.99 - w / 2)
    cy = min(max(cy, 0.01 + h / 2), 0.99 - h / 2)
    return (cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2)


def _sample_plans(rng: np.random.Generator, setting: str) -> list[_Plan]:
    n = int(rng.choice([2, 3, 4, 5, 6], p=[0.08, 0.2, 0.27, 0.25, 0.2]))
    colours = [c for c in COLOURS if c not in SETTING_FORBIDDEN_COLOURS[setting]]
    group = 0
    if n >= 3 and rng.random() < 0.35:
        group = int(rng.integers(2, min(3, n - 1) + 1))
    n_single = n - group
    n_entities = n_single + (1 if group else 0)
    want_inside = n_single >= 2 and rng.random() < 0.25
    kinds_pool = list(KIND_NAMES)
    kinds: list[str] = []
    if want_inside:
        kinds.append(str(rng.choice(CONTAINER_KINDS)))
        kinds_pool.remove(kinds[0])
    extra = rng.choice(len(kinds_pool), size=n_entities - len(kinds), replace=False)
    kinds += [kinds_pool[i] for i in extra]

    def attrs(kind: str) -> tuple[str, str]:
        colour = colours[int(rng.integers(len(colours)))]
        allowed = KINDS[kind].patterns
        if len(allowed) == 1:
            return colour, allowed[0]
        return colour, str(rng.choice(PATTERNS, p=_PATTERN_P))

    plans: list[_Plan] = []
    for kind in kinds[:n_single]:
        colour, pattern = attrs(kind)
        size = "large" if rng.random() < 0.5 else "small"
        plans.append(_Plan(kind, colour, size, pattern))
    if want_inside:
        plans[0].size = "large"
        # The inner object must not itself be a container (a box in a basket in a box...).
        inner = next((i for i in range(1, n_single) if not KINDS[plans[i].kind].container), -1)
        if inner > 0:
            plans[inner].size = "small"
            plans[inner].role = "inner"
            plans[inner].anchor = 0
    free_large = [i for i, p in enumerate(plans) if p.role == "free" and p.size == "large"
                  and not KINDS[p.kind].container]
    free_small = [i for i, p in enumerate(plans) if p.role == "free" and p.size == "small"]
    if free_large and free_small and rng.random() < 0.3:
        a = free_small[int(rng.integers(len(free_small)))]
        plans[a].role = "attached"
        plans[a].anchor = free_large[int(rng.integers(len(free_large)))]
    if group:
        kind = kinds[n_single]
        colour, pattern = attrs(kind)
        plans.append(_Plan(kind, colour, "small", pattern, count=group))
    return plans


def _layout(plans: list[_Plan], rng: np.random.Generator) -> list[SceneObject]:
    """Boxes, draw order and ids for a plan list (one SceneObject per group member)."""
    cells = [(c, r) for r in range(2) for c in range(3)]
    order = [int(i) for i in rng.permutation(len(cells))]
    free_cells = [cells[i] for i in order]
    objects: list[SceneObject] = []
    plan_ids: list[list[int]] = [[] for _ in plans]
    group_id = 0

    def new_box(kind: str, size: str, cell: tuple[int, int]) -> tuple[float, float, float, float]:
        w, h = _box_dims(kind, size, rng)
        cx = _COL_X[cell[0]] + float(rng.uniform(-_JITTER, _JITTER))
        cy = _ROW_Y[cell[1]] + float(rng.uniform(-_JITTER, _JITTER))
        return _place(cx, cy, w, h)

    # Groups first so their members can share a row ("three stars along the top").
    for pi, p in enumerate(plans):
        if p.count > 1:
            row = int(rng.integers(2))
            in_row = [c for c in free_cells if c[1] == row]
            if len(in_row) >= p.count and rng.random() < 0.75:
                chosen = in_row[: p.count]
            else:
                chosen = free_cells[: p.count]
            for cell in chosen:
                free_cells.remove(cell)
                oid = len(objects)
                objects.append(SceneObject(oid, p.kind, p.colour, p.size, p.pattern, new_box(p.kind, p.size, cell),
                                           0, group=group_id))
                plan_ids[pi].append(oid)
            group_id += 1
    for pi, p in enumerate(plans):
        if p.count == 1 and p.role == "free":
            cell = free_cells.pop(0)
            oid = len(objects)
            objects.append(SceneObject(oid, p.kind, p.colour, p.size, p.pattern, new_box(p.kind, p.size, cell), 0))
            plan_ids[pi].append(oid)
    for pi, p in enumerate(plans):
        if p.role in ("inner", "attached"):
            anchor = objects[plan_ids[p.anchor][0]]
            ax0, ay0, ax1, ay1 = anchor.box_norm
            aw, ah = ax1 - ax0, ay1 - ay0
            w, h = _box_dims(p.kind, p.size, rng)
            if p.role == "inner":
                # Sits in the container's opening; the container's front face hides its bottom.
                cx = (ax0 + ax1) / 2 + float(rng.uniform(-0.06, 0.06)) * aw
                box = (cx - w / 2, ay0 + 0.03 * ah, cx + w / 2, ay0 + 0.03 * ah + h)
                if h > 0.62 * ah:  # a tall thing in a flat container: shrink to fit
                    f = 0.62 * ah / h
                    w, h = w * f, h * f
                    box = (cx - w / 2, ay0 + 0.03 * ah, cx + w / 2, ay0 + 0.03 * ah + h)
            else:
                # Overlaps the lower part of a large object, drawn in front of it.
                cx = (ax0 + ax1) / 2 + float(rng.uniform(-0.22, 0.22)) * aw
                cy = ay1 - 0.15 * h
                cx = _clamp_pos(cx, (1 / 3, 2 / 3))
                cy = _clamp_pos(cy, (0.5,))
                box = _place(cx, cy, w, h)
            oid = len(objects)
            objects.append(SceneObject(oid, p.kind, p.colour, p.size, p.pattern, box, 0,
                                       container=anchor.id if p.role == "inner" else None))
            plan_ids[pi].append(oid)

    # Draw order: large things at the back in random order, small ones in front; an inner
    # object right after its container so nothing else can slip between the two layers.
    large = [o.id for o in objects if o.size == "large"]
    small = [o.id for o in objects if o.size == "small" and o.container is None]
    seq = [large[i] for i in rng.permutation(len(large))] + [small[i] for i in rng.permutation(len(small))]
    for o in objects:
        if o.container is not None:
            seq.insert(seq.index(o.container) + 1, o.id)
    for depth, oid in enumerate(seq):
        objects[oid].depth = depth
    for o in objects:
        o.box_norm = tuple(round(float(v), 5) for v in o.box_norm)  # type: ignore[assignment]
        o.hpos, o.vpos = position_of(o.box_norm)
    return objects


def _relations(objects: list[SceneObject], full: np.ndarray, visible: np.ndarray) -> list[Relation]:
    rels: list[Relation] = []
    singles = [o for o in objects if o.group is None]
    area = full.reshape(len(objects), -1).sum(1)
    for a in singles:
        for b in singles:
            if a.id == b.id:
                continue
            for pred in ("left_of", "right_of", "above", "below", "next_to", "inside", "contains"):
                if relation_holds(pred, a, b):
                    rels.append(Relation(a.id, pred, b.id))
            if relation_holds("in_front_of", a, b) or relation_holds("behind", a, b):
                front, back = (a, b) if a.depth > b.depth else (b, a)
                # Visible overlap: pixels of the back object's silhouette now showing the front one.
                covered = int((full[back.id] & visible[front.id]).sum())
                if covered >= MIN_OCCLUSION * area[back.id] and covered >= 6:
                    rels.append(Relation(a.id, "in_front_of" if a is front else "behind", b.id))
    return rels


def sample_scene_graph(seed: int, index: int) -> Scene:
    """Setting, objects, relations and counts of scene (seed, index); texts left empty."""
    from engine.sceneworld.render import silhouettes  # render imports this module's types

    if seed < 0 or index < 0:
        raise ValueError(f"seed and index must be non-negative, got seed={seed}, index={index}")
    rng = np.random.default_rng([seed, index, 0])
    setting = SETTINGS[int(rng.integers(len(SETTINGS)))]
    for _attempt in range(40):
        plans = _sample_plans(rng, setting)
        objects = _layout(plans, rng)
        full, visible = silhouettes(objects, ANALYSIS_SIZE)
        area = full.reshape(len(objects), -1).sum(1)
        vis = visible.reshape(len(objects), -1).sum(1)
        need = np.array([MIN_VISIBLE_INNER if o.container is not None else MIN_VISIBLE for o in objects])
        if np.all(area > 0) and np.all(vis >= need * area):
            break
    else:  # pragma: no cover - 40 rejections in a row has not been observed
        raise RuntimeError(f"could not lay out scene ({seed}, {index})")
    counts: list[Count] = []
    seen: list[str] = []
    for o in objects:
        if o.kind not in seen:
            seen.append(o.kind)
            ids = [p.id for p in objects if p.kind == o.kind]
            counts.append(Count(o.kind, len(ids), ids))
    return Scene(seed, index, setting, objects, _relations(objects, full, visible), counts)


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
