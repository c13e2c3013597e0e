"""Heatmap arithmetic shared by the grounders: normalising, upsampling, colouring, overlays.

Only numpy and Pillow: the CLI writes overlays without matplotlib, and the GUI scales the
patch-resolution maps itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from PIL import Image


def normalise(m: np.ndarray) -> np.ndarray:
    """Min-max to [0, 1] as float32. A flat map (nothing stands out) becomes all zeros."""
    m = np.asarray(m, dtype=np.float32)
    m = np.nan_to_num(m, nan=0.0, posinf=0.0, neginf=0.0)
    if not m.size:
        return m.copy()
    lo, hi = float(m.min()), float(m.max())
    if hi - lo <= 1e-6 * max(1.0, abs(hi)):
        return np.zeros(m.shape, dtype=np.float32)
    return ((m - lo) / (hi - lo)).astype(np.float32)


def background_map(object_maps: Sequence[np.ndarray], shape: tuple[int, int]) -> np.ndarray:
    """A setting's map: where none of the picture's objects are, as float32 in [0, 1].

    A setting ("a beach", "the desert with orange dunes") is the picture's background, not a
    thing in one place: its own similarity map lights up whatever object shares its colours.
    So its map is one minus the strongest object map at each cell (scaled to peak 1), or the
    whole picture when the text names no object.
    """
    if not len(object_maps):
        return np.ones(shape, dtype=np.float32)
    stack = np.clip(np.nan_to_num(np.stack([np.asarray(m, dtype=np.float32) for m in object_maps])), 0.0, 1.0)
    bg = 1.0 - stack.max(axis=0)
    peak = float(bg.max())
    if peak <= 1e-6:  # the objects cover everything: the setting is all there is around them
        return np.ones(shape, dtype=np.float32)
    return (bg / peak).astype(np.float32)


def upsample(m: np.ndarray, width: int, height: int) -> np.ndarray:
    """Bilinear resize of a (h, w) map to (height, width), values kept in the input range."""
    from PIL import Image

    m = np.asarray(m, dtype=np.float32)
    if m.shape == (height, width):
        return m.copy()
    img = Image.fromarray(m, mode="F").resize((int(width), int(height)), Image.Resampling.BILINEAR)
    out = np.asarray(img, dtype=np.float32)
    # Bilinear interpolation cannot leave [min, max]; clip float rounding at the edges.
    return np.clip(out, float(m.min()), float(m.max())) if m.size else out


def colourise(m: np.ndarray) -> np.ndarray:
    """(h, w) in [0, 1] -> (h, w, 3) uint8 with a blue-cyan-yellow-red ("jet") colour map."""
    x = np.clip(np.asarray(m, dtype=np.float32), 0.0, 1.0)
    r = np.clip(1.5 - np.abs(4 * x - 3), 0, 1)
    g = np.clip(1.5 - np.abs(4 * x - 2), 0, 1)
    b = np.clip(1.5 - np.abs(4 * x - 1), 0, 1)
    return (np.stack([r, g, b], axis=-1) * 255 + 0.5).astype(np.uint8)


def overlay(image: Image.Image, heatmap: np.ndarray, alpha: float = 0.6) -> Image.Image:
    """The image with the map's colours blended in, opaque where the map is high.

    Per-pixel alpha = alpha * map, so the picture stays visible where the phrase is absent.
    """
    from PIL import Image

    from engine.models.base import to_rgb

    rgb = np.asarray(to_rgb(image), dtype=np.float32)
    h, w = rgb.shape[:2]
    m = upsample(heatmap, w, h)
    colours = colourise(m).astype(np.float32)
    a = (float(alpha) * m)[..., None]
    out = rgb * (1 - a) + colours * a
    return Image.fromarray(np.clip(out + 0.5, 0, 255).astype(np.uint8), mode="RGB")


def argmax_point(m: np.ndarray) -> tuple[int, int]:
    """(row, col) of the maximum; ties go to the first in row-major order (deterministic)."""
    m = np.asarray(m)
    idx = int(np.argmax(m))
    return idx // m.shape[1], idx % m.shape[1]


# Maps are sharpened before centroids are taken: the peak, not the background.
_CENTROID_POWER = 4.0


def centroid(m: np.ndarray) -> tuple[float, float]:
    """(x, y) of a map's sharpened mass in [0, 1] image units."""
    w = np.clip(np.asarray(m, np.float64), 0, None) ** _CENTROID_POWER
    h, wd = w.shape
    total = w.sum()
    if total <= 0:
        return 0.5, 0.5
    ys, xs = np.mgrid[0:h, 0:wd]
    return float(((xs + 0.5) * w).sum() / total / wd), float(((ys + 0.5) * w).sum() / total / h)


def relation_geometry(predicate: str | None, subj: np.ndarray, obj: np.ndarray) -> float:
    """Signed evidence (image-width units) that `subject predicate object` holds on the maps.

    Positive: the maps agree; 0: the predicate cannot be read from 2-D positions
    (in front of / behind) or is unknown.
    """
    if predicate is None:
        return 0.0
    sx, sy = centroid(subj)
    ox, oy = centroid(obj)
    dist = float(np.hypot(sx - ox, sy - oy))
    if predicate == "left_of":
        return ox - sx
    if predicate == "right_of":
        return sx - ox
    if predicate == "above":
        return oy - sy
    if predicate == "below":
        return sy - oy
    if predicate == "next_to":
        return 0.35 - dist
    if predicate in ("inside", "contains"):
        return 0.15 - dist
    return 0.0
