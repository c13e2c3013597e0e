"""Drawing SceneWorld scenes: procedural settings and recognisable object figures.

Every figure is a short list of drawing operations in unit box coordinates (x, y in
[0, 1], y down), scaled to the object's pixel box at render time. Objects are composited
in draw order into an RGB canvas and a label map, so the masks returned are exactly the
visible pixels. Small renders (<= 160 px) are drawn at 2x and box-filtered down: without
that, 10-20 px figures lose their outline to aliasing.

The background's texture, horizon and light direction come from
`default_rng([seed, index, 2])`; the texts never mention them, so they can vary freely.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image, ImageDraw

from engine.sceneworld.world import COLOURS, SceneObject

if TYPE_CHECKING:
    from engine.sceneworld.world import Scene

__all__ = ["render_batch", "render_scene", "silhouettes", "SHAPES"]

SUPERSAMPLE_MAX = 160

Op = tuple  # ("poly"|"ellipse"|"rect"|"line"|"ring"|"arc"|"pieslice", part, geometry...)


# --------------------------------------------------------------------------- figures


def _normalise(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    xs = [p[0] for p in points]
    ys = [p[1] for p in points]
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    return [((x - x0) / (x1 - x0), (y - y0) / (y1 - y0)) for x, y in points]


def _star() -> list[tuple[float, float]]:
    pts = []
    for k in range(10):
        r = 1.0 if k % 2 == 0 else 0.45
        a = -math.pi / 2 + k * math.pi / 5
        pts.append((r * math.cos(a), r * math.sin(a)))
    return _normalise(pts)


def _heart() -> list[tuple[float, float]]:
    pts = []
    for k in range(28):
        t = 2 * math.pi * k / 28
        x = 16 * math.sin(t) ** 3
        y = -(13 * math.cos(t) - 5 * math.cos(2 * t) - 2 * math.cos(3 * t) - math.cos(4 * t))
        pts.append((x, y))
    return _normalise(pts)


def _crescent() -> list[tuple[float, float]]:
    # Outer unit circle minus a circle of radius r centred at (d, 0): the lit left part.
    d, r = 0.55, 0.9
    xi = (1 - r * r + d * d) / (2 * d)
    yi = math.sqrt(1 - xi * xi)
    a0 = math.atan2(yi, xi)
    b0 = math.atan2(yi, xi - d)
    pts = []
    for k in range(17):
        a = a0 + (2 * math.pi - 2 * a0) * k / 16
        pts.append((math.cos(a), math.sin(a)))
    for k in range(17):
        b = (2 * math.pi - b0) - (2 * math.pi - 2 * b0) * k / 16
        pts.append((d + r * math.cos(b), r * math.sin(b)))
    return _normalise(pts)


def _flower() -> list[Op]:
    ops: list[Op] = [
        ("rect", "detail", (0.45, 0.55, 0.55, 1.0)),
        ("ellipse", "detail", (0.5, 0.7, 0.85, 0.82)),
    ]
    for k in range(6):
        a = -math.pi / 2 + k * math.pi / 3
        cx, cy = 0.5 + 0.33 * math.cos(a), 0.36 + 0.19 * math.sin(a)
        ops.append(("ellipse", "body", (cx - 0.17, cy - 0.16, cx + 0.17, cy + 0.16)))
    ops.append(("ellipse", "detail", (0.37, 0.26, 0.63, 0.46)))
    return ops


# (back layer, front layer). Only containers have a front layer: it is drawn after the
# object inside them, which is how "a ball in a basket" hides the bottom of the ball.
SHAPES: dict[str, tuple[list[Op], list[Op]]] = {
    "ball": ([("ellipse", "body", (0, 0, 1, 1))], []),
    "star": ([("poly", "body", _star())], []),
    "heart": ([("poly", "body", _heart())], []),
    "house": (
        [
            ("rect", "body", (0.7, 0.08, 0.8, 0.35)),
            ("rect", "body", (0.1, 0.45, 0.9, 1.0)),
            ("poly", "body", [(0, 0.52), (0.5, 0.0), (1, 0.52)]),
            ("rect", "detail", (0.42, 0.68, 0.58, 1.0)),
            ("rect", "detail", (0.18, 0.6, 0.33, 0.74)),
            ("rect", "detail", (0.67, 0.6, 0.82, 0.74)),
        ],
        [],
    ),
    "tree": (
        [
            ("rect", "detail", (0.4, 0.55, 0.6, 1.0)),
            ("ellipse", "body", (0.0, 0.2, 0.6, 0.72)),
            ("ellipse", "body", (0.4, 0.2, 1.0, 0.72)),
            ("ellipse", "body", (0.15, 0.0, 0.85, 0.6)),
        ],
        [],
    ),
    "car": (
        [
            ("poly", "body", [(0, 0.45), (0.05, 0.38), (0.95, 0.38), (1, 0.5), (1, 0.8), (0, 0.8)]),
            ("poly", "body", [(0.18, 0.4), (0.3, 0.04), (0.7, 0.04), (0.84, 0.4)]),
            ("poly", "glass", [(0.3, 0.34), (0.37, 0.14), (0.47, 0.14), (0.47, 0.34)]),
            ("poly", "glass", [(0.53, 0.34), (0.53, 0.14), (0.65, 0.14), (0.72, 0.34)]),
            ("ellipse", "detail", (0.12, 0.64, 0.32, 1.0)),
            ("ellipse", "detail", (0.68, 0.64, 0.88, 1.0)),
        ],
        [],
    ),
    "cat": (
        [
            ("line", "body", [(0.7, 0.93), (0.9, 0.86), (0.96, 0.62), (0.9, 0.46)], 0.1),
            ("ellipse", "body", (0.08, 0.45, 0.8, 1.0)),
            ("ellipse", "body", (0.18, 0.12, 0.72, 0.56)),
            ("poly", "body", [(0.2, 0.32), (0.22, 0.0), (0.42, 0.17)]),
            ("poly", "body", [(0.48, 0.17), (0.68, 0.0), (0.7, 0.32)]),
            ("ellipse", "detail", (0.29, 0.26, 0.39, 0.35)),
            ("ellipse", "detail", (0.51, 0.26, 0.61, 0.35)),
            ("poly", "detail", [(0.41, 0.4), (0.49, 0.4), (0.45, 0.45)]),
        ],
        [],
    ),
    "fish": (
        [
            ("poly", "body", [(0.3, 0.2), (0.42, 0.0), (0.52, 0.2)]),
            ("ellipse", "body", (0.0, 0.12, 0.75, 0.88)),
            ("poly", "body", [(0.62, 0.5), (1.0, 0.1), (0.9, 0.5), (1.0, 0.9)]),
            ("ellipse", "detail", (0.11, 0.33, 0.21, 0.49)),
        ],
        [],
    ),
    "bird": (
        [
            ("poly", "body", [(0.25, 0.55), (0.0, 0.36), (0.0, 0.76)]),
            ("ellipse", "body", (0.12, 0.38, 0.78, 0.9)),
            ("ellipse", "body", (0.55, 0.1, 0.88, 0.52)),
            ("poly", "detail", [(0.86, 0.24), (1.0, 0.32), (0.86, 0.4)]),
            ("ellipse", "detail", (0.7, 0.22, 0.77, 0.31)),
            ("line", "detail", [(0.4, 0.86), (0.38, 1.0)], 0.05),
            ("line", "detail", [(0.52, 0.86), (0.54, 1.0)], 0.05),
        ],
        [],
    ),
    "flower": (_flower(), []),
    "umbrella": (
        [
            ("pieslice", "body", (0, 0, 1, 0.9), 180, 360),
            ("cut", "cut", (0.04, 0.39, 0.21, 0.51)),
            ("cut", "cut", (0.29, 0.39, 0.46, 0.51)),
            ("cut", "cut", (0.54, 0.39, 0.71, 0.51)),
            ("cut", "cut", (0.79, 0.39, 0.96, 0.51)),
            ("line", "detail", [(0.5, 0.4), (0.5, 0.88)], 0.06),
            ("arc", "detail", (0.5, 0.76, 0.74, 1.0), 0, 180, 0.06),
        ],
        [],
    ),
    "cup": (
        [
            ("ring", "body", (0.56, 0.22, 1.0, 0.75), 0.11),
            ("poly", "body", [(0.0, 0.05), (0.74, 0.05), (0.66, 1.0), (0.08, 1.0)]),
            ("ellipse", "detail", (0.03, 0.0, 0.71, 0.12)),
        ],
        [],
    ),
    "key": (
        [
            ("ellipse", "body", (0, 0.08, 0.42, 0.92)),
            ("cut", "cut", (0.12, 0.34, 0.27, 0.66)),
            ("rect", "body", (0.38, 0.38, 1.0, 0.62)),
            ("rect", "body", (0.72, 0.6, 0.8, 0.92)),
            ("rect", "body", (0.86, 0.6, 0.94, 0.82)),
        ],
        [],
    ),
    "boat": (
        [
            ("rect", "detail", (0.47, 0.0, 0.53, 0.64)),
            ("poly", "body", [(0.56, 0.02), (0.56, 0.54), (0.94, 0.54)]),
            ("poly", "body", [(0.44, 0.12), (0.44, 0.54), (0.1, 0.54)]),
            ("poly", "body", [(0, 0.64), (1, 0.64), (0.84, 1.0), (0.16, 1.0)]),
        ],
        [],
    ),
    "moon": ([("poly", "body", _crescent())], []),
    "bicycle": (
        [
            ("ring", "body", (0, 0.4, 0.38, 1.0), 0.11),
            ("ring", "body", (0.62, 0.4, 1.0, 1.0), 0.11),
            ("line", "body", [(0.19, 0.7), (0.44, 0.7), (0.72, 0.4), (0.36, 0.4), (0.19, 0.7)], 0.1),
            ("line", "body", [(0.44, 0.7), (0.32, 0.22)], 0.1),
            ("line", "body", [(0.81, 0.7), (0.7, 0.14)], 0.1),
            ("rect", "body", (0.2, 0.12, 0.42, 0.24)),
            ("rect", "body", (0.6, 0.06, 0.86, 0.16)),
        ],
        [],
    ),
    "hat": (
        [
            ("poly", "body", [(0.2, 0.0), (0.8, 0.0), (0.78, 0.85), (0.22, 0.85)]),
            ("ellipse", "body", (0, 0.72, 1, 1.0)),
            ("rect", "detail", (0.21, 0.55, 0.79, 0.7)),
        ],
        [],
    ),
    "lamp": (
        [
            ("rect", "body", (0.43, 0.4, 0.57, 0.9)),
            ("ellipse", "body", (0.1, 0.84, 0.9, 1.0)),
            ("poly", "body", [(0.22, 0.0), (0.78, 0.0), (1.0, 0.44), (0.0, 0.44)]),
        ],
        [],
    ),
    "kite": (
        [
            ("poly", "body", [(0.5, 0.0), (1.0, 0.3), (0.5, 0.72), (0.0, 0.3)]),
            ("line", "detail", [(0.5, 0.02), (0.5, 0.7)], 0.04),
            ("line", "detail", [(0.04, 0.3), (0.96, 0.3)], 0.04),
            ("line", "detail", [(0.5, 0.72), (0.4, 0.82), (0.6, 0.9), (0.5, 1.0)], 0.05),
            ("poly", "detail", [(0.32, 0.78), (0.48, 0.82), (0.32, 0.88)]),
            ("poly", "detail", [(0.68, 0.86), (0.52, 0.9), (0.68, 0.96)]),
        ],
        [],
    ),
    "book": (
        [
            ("rect", "body", (0.1, 0.0, 1.0, 0.9)),
            ("poly", "detail", [(0.16, 0.88), (1.0, 0.88), (0.96, 1.0), (0.16, 1.0)]),
            ("rect", "body", (0.0, 0.02, 0.17, 1.0)),
            ("rect", "detail", (0.36, 0.18, 0.86, 0.32)),
        ],
        [],
    ),
    "box": (
        [
            ("poly", "detail", [(0.0, 0.42), (0.14, 0.2), (1.0, 0.2), (0.86, 0.42)]),
            ("poly", "body", [(0.86, 0.42), (1.0, 0.2), (1.0, 0.8), (0.86, 1.0)]),
        ],
        [("rect", "body", (0.0, 0.42, 0.86, 1.0))],
    ),
    "basket": (
        [
            ("arc", "body", (0.12, 0.0, 0.88, 0.9), 180, 360, 0.08),
            ("ellipse", "detail", (0.0, 0.36, 1.0, 0.52)),
        ],
        [("poly", "body", [(0.0, 0.44), (1.0, 0.44), (0.86, 1.0), (0.14, 1.0)])],
    ),
}

# Pattern ink and detail colour (eyes, wheels, windows) are always two different neutrals,
# and both differ from the body colour: at any pattern the body's colour stays the most
# common colour of the figure, which is what its colour word promises.
_DARK_INK_COLOURS = frozenset({"white", "yellow"})
_WHITE = np.array((242, 242, 236), dtype=np.float32)
_DARK = np.array((38, 34, 34), dtype=np.float32)
_MID = np.array((120, 118, 116), dtype=np.float32)
_LIGHT_GREY = np.array((170, 170, 168), dtype=np.float32)
_GLASS = np.array((200, 222, 240), dtype=np.float32)


def _pattern_colour(colour: str) -> np.ndarray:
    return _DARK if colour in _DARK_INK_COLOURS else _WHITE


def _detail_colour(colour: str) -> np.ndarray:
    if colour in _DARK_INK_COLOURS:
        return _MID
    return _LIGHT_GREY if colour == "black" else _DARK


def _draw_ops(ops: list[Op], w: int, h: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Silhouette, detail and glass masks (h, w) bool of a figure's ops in a w x h tile."""
    sil = Image.new("L", (w, h), 0)
    det = Image.new("L", (w, h), 0)
    ds, dd = ImageDraw.Draw(sil), ImageDraw.Draw(det)
    sx, sy = w - 1, h - 1
    short = min(w, h)

    def bb(b: tuple[float, ...]) -> tuple[float, float, float, float]:
        return (b[0] * sx, b[1] * sy, b[2] * sx, b[3] * sy)

    for op in ops:
        shape, part = op[0], op[1]
        # body paints the silhouette and clears detail under it; detail (255) and glass
        # (128, a window's pale blue) paint both.
        dv = 255 if part == "detail" else (128 if part == "glass" else 0)
        sv = 0 if part == "cut" else 255
        if shape == "poly":
            pts = [(x * sx, y * sy) for x, y in op[2]]
            ds.polygon(pts, fill=sv)
            dd.polygon(pts, fill=dv)
        elif shape in ("ellipse", "cut"):
            ds.ellipse(bb(op[2]), fill=sv)
            dd.ellipse(bb(op[2]), fill=dv)
        elif shape == "rect":
            ds.rectangle(bb(op[2]), fill=sv)
            dd.rectangle(bb(op[2]), fill=dv)
        elif shape == "line":
            pts = [(x * sx, y * sy) for x, y in op[2]]
            width = max(1, round(op[3] * short))
            ds.line(pts, fill=sv, width=width, joint="curve")
            dd.line(pts, fill=dv, width=width, joint="curve")
        elif shape == "ring":
            width = max(1, round(op[3] * short))
            ds.ellipse(bb(op[2]), outline=sv, width=width)
            dd.ellipse(bb(op[2]), outline=dv, width=width)
        elif shape == "arc":
            width = max(1, round(op[5] * short))
            ds.arc(bb(op[2]), op[3], op[4], fill=sv, width=width)
            dd.arc(bb(op[2]), op[3], op[4], fill=dv, width=width)
        elif shape == "pieslice":
            ds.pieslice(bb(op[2]), op[3], op[4], fill=sv)
            dd.pieslice(bb(op[2]), op[3], op[4], fill=dv)
        else:  # pragma: no cover - a typo in SHAPES
            raise ValueError(f"unknown drawing op {shape!r}")
    s = np.asarray(sil) > 127
    d = np.asarray(det)
    glass = (s & (d > 64) & (d < 192)) if any(op[1] == "glass" for op in ops) else None
    return s, s & (d >= 192), glass


def _pattern_mask(pattern: str, w: int, h: int) -> np.ndarray | None:
    if pattern == "plain":
        return None
    # About three repeats across the longest side: bold enough to survive 64-96 px renders.
    p = max(4.0, max(w, h) / 3.3)
    ys = np.arange(h, dtype=np.float32)[:, None]
    xs = np.arange(w, dtype=np.float32)[None, :]
    if pattern == "striped":
        return ((xs + ys) / (p * 1.15)) % 1.0 < 0.36
    if pattern == "dotted":
        p *= 0.85
        dx = (xs / p) % 1.0 - 0.5
        dy = (ys / p) % 1.0 - 0.5
        return dx * dx + dy * dy < 0.31**2
    if pattern == "checked":
        p *= 0.75
        fx, fy = (xs / p) % 2.0, (ys / p) % 2.0
        # Inset squares keep the ink below half the area: the named colour stays dominant.
        inx = (fx % 1.0 > 0.1) & (fx % 1.0 < 0.9)
        iny = (fy % 1.0 > 0.1) & (fy % 1.0 < 0.9)
        return ((fx >= 1.0) ^ (fy >= 1.0)) & inx & iny
    raise ValueError(f"unknown pattern {pattern!r}")


# --------------------------------------------------------------------------- compositing


def _draw_order(objects: Sequence[SceneObject]) -> list[tuple[SceneObject, int]]:
    """(object, layer) pairs in paint order; layer 0 = back/whole figure, 1 = container front."""
    by_depth = sorted(objects, key=lambda o: o.depth)
    inner_of = {o.container: o.id for o in objects if o.container is not None}
    seq: list[tuple[SceneObject, int]] = []
    pending: dict[int, SceneObject] = {}
    for o in by_depth:
        seq.append((o, 0))
        if o.id in inner_of:
            pending[inner_of[o.id]] = o
        else:
            seq.append((o, 1))
        if o.id in pending:
            seq.append((pending.pop(o.id), 1))
    for o in pending.values():  # pragma: no cover - an inner object always exists
        seq.append((o, 1))
    return seq


def _paint(
    objects: Sequence[SceneObject],
    size: int,
    canvas: np.ndarray | None,
    light: tuple[float, float] = (-1.0, -1.0),
) -> tuple[np.ndarray, np.ndarray]:
    """Composite objects; returns (label map (size, size) uint8: id+1 or 0, full silhouettes)."""
    label = np.zeros((size, size), dtype=np.uint8)
    full = np.zeros((len(objects), size, size), dtype=bool)
    lx, ly = light
    for o, layer in _draw_order(objects):
        ops = SHAPES[o.kind][layer]
        if not ops:
            continue
        x0, y0, x1, y1 = o.box_px(size)
        w, h = x1 - x0, y1 - y0
        if w < 2 or h < 2:
            continue
        sil, det, glass = _draw_ops(ops, w, h)
        full[o.id, y0:y1, x0:x1] |= sil
        label[y0:y1, x0:x1][sil] = o.id + 1
        if canvas is None:
            continue
        if layer == 0:
            # Soft drop shadow away from the light: separates figures from the ground.
            off = max(1, round(0.06 * min(w, h)))
            sx0, sy0 = x0 + (off if lx < 0 else -off), y0 + off
            cx0, cy0 = max(sx0, 0), max(sy0, 0)
            cx1, cy1 = min(sx0 + w, size), min(sy0 + h, size)
            if cx1 > cx0 and cy1 > cy0:
                m = sil[cy0 - sy0 : cy1 - sy0, cx0 - sx0 : cx1 - sx0]
                region = canvas[cy0:cy1, cx0:cx1]
                region[m] = (region[m] * 0.72).astype(np.uint8)
        base = np.array(COLOURS[o.colour], dtype=np.float32)
        u = np.linspace(-0.5, 0.5, w, dtype=np.float32)[None, :]
        v = np.linspace(-0.5, 0.5, h, dtype=np.float32)[:, None]
        shade = 1.0 - 0.16 * (lx * u + ly * v)  # brighter on the side facing the light
        tile = shade[..., None] * base
        pm = _pattern_mask(o.pattern, w, h)
        if pm is not None:
            tile[pm] = shade[pm][:, None] * _pattern_colour(o.colour)
        tile[det] = _detail_colour(o.colour)
        if glass is not None:
            tile[glass] = _GLASS
        region = canvas[y0:y1, x0:x1]
        region[sil] = np.clip(tile[sil], 0, 255).astype(np.uint8)
    return label, full


def silhouettes(objects: Sequence[SceneObject], size: int) -> tuple[np.ndarray, np.ndarray]:
    """(full, visible) masks (n, size, size) bool: each figure alone, and what stays visible."""
    label, full = _paint(objects, size, None)
    ids = np.arange(1, len(objects) + 1, dtype=np.uint8)[:, None, None]
    return full, label[None] == ids


# --------------------------------------------------------------------------- settings


def _value_noise(rng: np.random.Generator, size: int, cells: int) -> np.ndarray:
    grid = rng.random((cells, cells), dtype=np.float32)
    img = Image.fromarray(grid).resize((size, size), Image.Resampling.BILINEAR)
    return np.asarray(img, dtype=np.float32) - 0.5


def _rows(top: Sequence[float], bottom: Sequence[float], t: np.ndarray) -> np.ndarray:
    """Per-row colours (n, 3) of a vertical gradient at positions t in [0, 1]."""
    a = np.asarray(top, dtype=np.float32)
    b = np.asarray(bottom, dtype=np.float32)
    return a + (b - a) * t[:, None]


def _jitter(rng: np.random.Generator, c: Sequence[float], amount: float = 10) -> np.ndarray:
    return np.asarray(c, dtype=np.float32) + rng.uniform(-amount, amount, 3).astype(np.float32)


def _background(setting: str, size: int, rng: np.random.Generator, light: tuple[float, float]) -> np.ndarray:
    """uint8 (size, size, 3) setting picture: sky/wall gradient over ground, setting props,
    light falloff, vignette and texture noise."""
    s = size
    y = (np.arange(s, dtype=np.float32) + 0.5) / s
    yy, xx = y[:, None], y[None, :]
    hz = float(rng.uniform(0.42, 0.58))  # horizon / floor line
    sky_rows = y < hz
    sky_t = np.clip(y / hz, 0, 1)
    gnd_t = np.clip((y - hz) / (1 - hz), 0, 1)

    def base(sky_top, sky_bottom, gnd_far, gnd_near) -> np.ndarray:
        rows = np.where(sky_rows[:, None], _rows(sky_top, sky_bottom, sky_t), _rows(gnd_far, gnd_near, gnd_t))
        return np.repeat(rows[:, None, :], s, axis=1)

    noise = _value_noise(rng, s, 7)
    tex = 0.6  # amplitude of the coarse texture, in colour units x 10
    hzi = int(hz * s)  # first ground row

    if setting == "room":
        wall = [(232, 222, 200), (205, 225, 210), (205, 215, 235), (232, 212, 218)][int(rng.integers(4))]
        img = base(_jitter(rng, wall), _jitter(rng, wall) * 0.92, (120, 80, 48), (160, 108, 64))
        # Floor boards: lines closer together towards the back wall.
        boards = ((np.sqrt(gnd_t) * 7) % 1.0 < 0.12) & ~sky_rows
        img[boards] *= 0.8
        img[hzi : hzi + max(1, int(0.025 * s))] = (245, 242, 235)  # skirting board
        tex = 0.4
    elif setting == "beach":
        img = base((105, 165, 228), (190, 218, 242), (236, 214, 166), (226, 198, 148))
        sea = (y >= hz) & (y < hz + 0.09)
        img[sea] = _rows((45, 115, 190), (70, 150, 205), np.clip((y[sea] - hz) / 0.09, 0, 1))[:, None, :]
        foam = np.abs(yy - (hz + 0.09 + 0.01 * np.sin(xx * 40))) < 0.008
        img[foam] = (248, 248, 245)
    elif setting == "street":
        img = base((165, 192, 222), (214, 224, 236), (88, 88, 92), (62, 62, 66))
        x = 0.0
        while x < 1.0:  # a skyline of blocks along the horizon
            bw = float(rng.uniform(0.08, 0.2))
            bh = float(rng.uniform(0.08, 0.3))
            palette = [(176, 150, 132), (150, 160, 176), (190, 170, 140), (160, 120, 110)]
            col = _jitter(rng, palette[int(rng.integers(4))])
            img[int((hz - bh) * s) : hzi, int(x * s) : int((x + bw) * s)] = col
            x += bw
        img[hzi : int((hz + 0.07) * s)] = (186, 182, 174)  # pavement
        ly_ = hz + 0.55 * (1 - hz)
        dash = (np.abs(yy - ly_) < 0.012) & ((xx * 6) % 1.0 < 0.55)
        img[dash] = (240, 240, 235)
    elif setting == "forest":
        img = base((70, 112, 78), (38, 82, 50), (52, 70, 38), (40, 58, 30))
        for _ in range(int(rng.integers(5, 9))):
            tx = float(rng.uniform(0, 1))
            tw = float(rng.uniform(0.025, 0.06))
            bottom = int((hz + float(rng.uniform(0.0, 0.08))) * s)
            img[:bottom, max(0, int((tx - tw / 2) * s)) : int((tx + tw / 2) * s)] = _jitter(rng, (66, 48, 34), 6)
        tex = 1.2
    elif setting == "night sky":
        img = base((8, 12, 40), (44, 40, 96), (22, 26, 36), (14, 16, 22))
        hill = yy > hz + 0.05 * np.sin(xx * float(rng.uniform(4, 9)) + float(rng.uniform(0, 6)))
        img[hill] = (18, 21, 29)
        n = int(rng.integers(25, 45))
        px = (rng.random(n) * s).astype(int)
        py = (rng.random(n) * hz * s * 0.95).astype(int)
        r = max(1, s // 128)
        for x_, y_ in zip(px, py, strict=True):
            img[y_ : y_ + r, x_ : x_ + r] = (235, 235, 210)
        tex = 0.3
    elif setting == "snowfield":
        img = base((190, 205, 228), (228, 232, 242), (232, 238, 248), (208, 218, 236))
        tex = 0.8
    elif setting == "desert":
        img = base((238, 214, 170), (250, 234, 204), (226, 172, 98), (214, 156, 84))
        for k in range(3):  # dune ridges
            edge = hz + 0.12 * (k + 1) + 0.04 * np.sin(xx * float(rng.uniform(3, 7)) + float(rng.uniform(0, 6)))
            img[(yy > edge) & (yy < edge + 0.06)] *= 0.9
    elif setting == "meadow":
        img = base((110, 172, 232), (198, 222, 244), (104, 170, 74), (70, 140, 52))
        blades = _value_noise(rng, s, max(8, s // 3))
        img[hzi:] *= (1 + 0.25 * blades[hzi:])[..., None]
        tex = 1.0
    else:
        raise ValueError(f"unknown setting {setting!r}")

    lx, ly = light
    # Light falls from one upper corner; a vignette darkens the edges.
    shade = (1.0 + 0.14 * (-(lx * (xx - 0.5)) - ly * (yy - 0.5))) * (1.0 - 0.45 * ((xx - 0.5) ** 2 + (yy - 0.5) ** 2))
    grain = rng.random((s, s), dtype=np.float32)
    img *= shade[..., None]
    img += (noise * (tex * 10) + (grain - 0.5) * 6)[..., None]
    np.clip(img, 0, 255, out=img)
    return img.astype(np.uint8)


# --------------------------------------------------------------------------- public API


def render_scene(scene: Scene, size: int) -> tuple[Image.Image, np.ndarray]:
    """RGB image (size x size) and visible masks (n_objects, size, size) bool."""
    if size < 16:
        raise ValueError(f"render size must be at least 16 px, got {size}")
    ss = 2 if size <= SUPERSAMPLE_MAX else 1
    rng = np.random.default_rng([scene.seed, scene.index, 2])
    light = (-1.0 if rng.random() < 0.5 else 1.0, -1.0)
    canvas = _background(scene.setting, size, rng, light)
    if ss == 1:
        label, _ = _paint(scene.objects, size, canvas, light)
        ids = np.arange(1, len(scene.objects) + 1, dtype=np.uint8)[:, None, None]
        return Image.fromarray(canvas), label[None] == ids
    # The background is smooth: drawing it at the final size and repeating pixels gives the
    # same result after the 2x box filter, at a quarter of the cost.
    canvas = np.repeat(np.repeat(canvas, 2, axis=0), 2, axis=1)
    label, _ = _paint(scene.objects, size * 2, canvas, light)
    image = Image.fromarray(canvas).reduce(2)
    # A pixel belongs to the object covering most of its four sub-pixels (at least two;
    # a 2-2 tie goes to the one in front), so masks stay disjoint.
    n = len(scene.objects)
    counts = np.empty((n, size, size), dtype=np.uint8)
    for k in range(n):
        eq = (label == k + 1).view(np.uint8)
        counts[k] = eq[0::2, 0::2] + eq[1::2, 0::2] + eq[0::2, 1::2] + eq[1::2, 1::2]
    depth = np.array([o.depth for o in scene.objects], dtype=np.int16)[:, None, None]
    winner = np.argmax(counts.astype(np.int16) * 16 + depth, axis=0)
    masks = (counts >= 2) & (winner[None] == np.arange(n)[:, None, None])
    return image, masks


def render_batch(scenes: Sequence[Scene], size: int) -> np.ndarray:
    """uint8 (n, size, size, 3)."""
    out = np.empty((len(scenes), size, size, 3), dtype=np.uint8)
    for i, sc in enumerate(scenes):
        out[i] = np.asarray(render_scene(sc, size)[0])
    return out
