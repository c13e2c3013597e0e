"""Sampling a scene graph: plans, layout, and the relations read off the rendered silhouettes.

Apart from world.py (the vocabulary and the scene types) because it needs the renderer's
silhouettes, and the renderer needs the scene types: world <- render <- layout, no circle.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.sceneworld.render import silhouettes
from engine.sceneworld.world import (
    ANALYSIS_SIZE,
    COLOURS,
    CONTAINER_KINDS,
    KIND_NAMES,
    KINDS,
    MIN_OCCLUSION,
    MIN_VISIBLE,
    MIN_VISIBLE_INNER,
    PATTERNS,
    SETTING_FORBIDDEN_COLOURS,
    SETTINGS,
    SIZE_RANGE,
    Count,
    Relation,
    Scene,
    SceneObject,
    position_of,
    relation_holds,
)

# Share of each pattern (plain, striped, dotted, checked) among sampled objects.
_PATTERN_P = (0.4, 0.2, 0.2, 0.2)
# Layout grid: 3 columns x 2 rows; each free-standing object owns one cell.
_COL_X: tuple[float, ...] = (1 / 6, 1 / 2, 5 / 6)
_ROW_Y: tuple[float, ...] = (0.28, 0.72)
_JITTER = 0.035
# Position words are decided by thirds (x) and halves (y) of the box centre; a centre is
# kept this far from a boundary so that the word is not a coin flip for the viewer.
_POS_MARGIN = 0.04


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
