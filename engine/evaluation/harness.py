"""Evaluate Embedders on an EvalSet: Recall@1/5/10 in both directions at a token budget, the
truncation analysis (the same descriptions cut at 20/40/60/80/100/128 tokens), and reports
(JSON, Markdown, and a PNG line plot of R@1 against the budget, drawn with Pillow).

Image embeddings do not depend on the text tower, so callers comparing towers of one base
pass the same `image_emb` to every evaluation (the CLI does this per image model).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from engine.evaluation.loaders import EvalSet
from engine.evaluation.retrieval import recall_at_k
from engine.models.base import Embedder

TRUNCATION_BUDGETS = (20, 40, 60, 80, 100, 128)
KS = ("R@1", "R@5", "R@10")


def embed_images(embedder: Embedder, evalset: EvalSet, *, batch_size: int = 32) -> np.ndarray:
    """(N, D) image embeddings; files are decoded as the indexer does (upright, RGB)."""
    if evalset.embed_images is not None:
        return evalset.embed_images(embedder)
    from engine.indexing.decode import decode_image

    parts = []
    for start in range(0, len(evalset.images), batch_size):
        batch = [decode_image(p, target_size=embedder.image_size)[0]
                 for p in evalset.images[start : start + batch_size]]
        parts.append(embedder.encode_images(batch))
    if not parts:
        return np.zeros((0, embedder.dim), np.float32)
    return np.concatenate(parts)


def token_counts(embedder: Embedder, texts: Sequence[str]) -> np.ndarray:
    return np.asarray([embedder.token_count(t) for t in texts], dtype=np.int64)


def evaluate_set(
    embedder: Embedder,
    evalset: EvalSet,
    *,
    max_tokens: int | None = None,
    image_emb: np.ndarray | None = None,
    counts: np.ndarray | None = None,
) -> dict[str, Any]:
    """Recall@K of one model on one set at one budget (None: the benchmark's budget)."""
    budget = int(max_tokens or evalset.default_tokens)
    if image_emb is None:
        image_emb = embed_images(embedder, evalset)
    text_emb = embedder.encode_texts(evalset.texts, max_tokens=budget)
    counts = token_counts(embedder, evalset.texts) if counts is None else counts
    effective = min(budget, embedder.max_text_tokens)
    r = recall_at_k(image_emb, text_emb, evalset.owner)
    return {
        "benchmark": evalset.name,
        "split": evalset.split,
        "model": embedder.text_model_id,
        "image_model": embedder.model_id,
        "n_images": int(image_emb.shape[0]),
        "n_texts": len(evalset.texts),
        "max_tokens": budget,
        "effective_tokens": effective,
        "mean_text_tokens": float(counts.mean()) if len(counts) else 0.0,
        "truncated_texts": float((counts > effective).mean()) if len(counts) else 0.0,
        **r,
    }


def truncation_analysis(
    embedder: Embedder,
    evalset: EvalSet,
    budgets: Sequence[int] = TRUNCATION_BUDGETS,
    *,
    image_emb: np.ndarray | None = None,
) -> list[dict[str, Any]]:
    """evaluate_set at each budget (same images, same texts, only the cut moves)."""
    if image_emb is None:
        image_emb = embed_images(embedder, evalset)
    counts = token_counts(embedder, evalset.texts)
    return [evaluate_set(embedder, evalset, max_tokens=b, image_emb=image_emb, counts=counts) for b in budgets]


def build_report(evalset: EvalSet, results: list[dict], truncation: dict[str, list[dict]] | None = None) -> dict:
    return {
        "benchmark": evalset.name,
        "split": evalset.split,
        "source": evalset.source,
        "n_images": results[0]["n_images"] if results else evalset.n_images,
        "n_texts": len(evalset.texts),
        "results": results,
        "truncation": truncation,
    }


# -- Markdown ------------------------------------------------------------------------
def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def render_markdown(report: dict) -> str:
    """Recall in percent (as papers report it); the JSON keeps fractions."""
    split = f" ({report['split']})" if report.get("split") else ""
    lines = [
        f"## {report['benchmark']}{split}: {report['n_images']} images, {report['n_texts']} texts",
        "",
        f"Source: `{report['source']}`. Recall@K in %; image→text is a hit when any of the image's texts "
        "is in the top K.",
        "",
        "| model | tokens | truncated | I2T R@1 | I2T R@5 | I2T R@10 | T2I R@1 | T2I R@5 | T2I R@10 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in report["results"]:
        lines.append(f"| {r['model']} | {r['max_tokens']} | {_pct(r['truncated_texts'])}% | "
                     + " | ".join(_pct(r[d][k]) for d in ("i2t", "t2i") for k in KS) + " |")
    trunc = report.get("truncation")
    if trunc:
        budgets = [row["max_tokens"] for row in next(iter(trunc.values()))]
        lines += ["", "### Truncation analysis (R@1 in % by token budget)", "",
                  "| model | direction | " + " | ".join(str(b) for b in budgets) + " |",
                  "|---|---|" + "---:|" * len(budgets)]
        for label, rows in trunc.items():
            for d, name in (("i2t", "I2T"), ("t2i", "T2I")):
                lines.append(f"| {label} | {name} | " + " | ".join(_pct(r[d]["R@1"]) for r in rows) + " |")
        first = next(iter(trunc.values()))
        lines.append("| texts truncated | | " + " | ".join(f"{_pct(r['truncated_texts'])}%" for r in first) + " |")
    return "\n".join(lines) + "\n"


# -- PNG plot (Pillow; no plotting library needed) ---------------------------------------
_PALETTE = [(31, 119, 180), (214, 39, 40), (44, 160, 44), (255, 127, 14), (148, 103, 189),
            (140, 86, 75), (227, 119, 194), (127, 127, 127), (188, 189, 34), (23, 190, 207),
            (0, 0, 128), (128, 128, 0), (0, 128, 128), (255, 99, 71)]


def _dashed(draw: Any, p0: tuple[float, float], p1: tuple[float, float], fill: tuple, width: int,
            dash: float = 8.0) -> None:
    x0, y0 = p0
    x1, y1 = p1
    length = max(((x1 - x0) ** 2 + (y1 - y0) ** 2) ** 0.5, 1e-9)
    n = max(int(length // dash), 1)
    for i in range(0, n, 2):
        a, b = i / n, min((i + 1) / n, 1.0)
        draw.line([(x0 + (x1 - x0) * a, y0 + (y1 - y0) * a), (x0 + (x1 - x0) * b, y0 + (y1 - y0) * b)],
                  fill=fill, width=width)


def _frame(d: Any, box: tuple[float, float, float, float], x_ticks: Sequence[float], px: Any,
           y_range: tuple[float, float], py: Any, x_label: str, y_label: str, title: str) -> None:
    """Grid lines at round y values, x ticks, both axes, their labels and the title."""
    from PIL import ImageFont

    left, top, right, bottom = box
    font = ImageFont.load_default(size=14)
    small = ImageFont.load_default(size=12)
    y_lo, y_max = y_range
    # The range ends on multiples of 5: grid lines at round values.
    step = 10.0 if y_max - y_lo > 20 else (2.0 if y_max - y_lo > 6 else 1.0)
    for k in range(int((y_max - y_lo) / step) + 1):
        y = y_lo + k * step
        d.line([(left, py(y)), (right, py(y))], fill=(230, 230, 230))
        d.text((left - 8, py(y)), f"{y:.0f}", fill="black", font=small, anchor="rm")
    for b in x_ticks:
        d.line([(px(b), bottom), (px(b), bottom + 5)], fill="black")
        d.text((px(b), bottom + 8), f"{b:g}", fill="black", font=small, anchor="mt")
    d.line([(left, top), (left, bottom), (right, bottom)], fill="black", width=1)
    d.text(((left + right) / 2, bottom + 45), x_label, fill="black", font=font, anchor="mm")
    d.text((left, top - 14), y_label, fill="black", font=font, anchor="lb")
    d.text(((left + right) / 2, 18), title, fill="black", font=font, anchor="mm")


def plot_scatter(points: dict[str, tuple[float, float]], path: Path, *, x_label: str, y_label: str,
                 title: str = "", front: Sequence[str] = ()) -> Path:
    """Labelled points (x, y in %), with the labels in `front` joined by a line (a Pareto front)."""
    from PIL import Image, ImageDraw, ImageFont

    w, h = 960, 640
    left, right, top, bottom = 70, 40, 60, 80
    img = Image.new("RGB", (w, h), "white")
    d = ImageDraw.Draw(img)
    small = ImageFont.load_default(size=12)
    xs = [x for x, _ in points.values()]
    ys = [y for _, y in points.values()]
    x_lo = float(np.floor(min(xs, default=0) / 5) * 5)
    x_hi = max(float(np.ceil(max(xs, default=10) / 5) * 5), x_lo + 5)
    y_lo = float(np.floor(min(ys, default=0) / 5) * 5)
    y_max = max(float(np.ceil(max(ys, default=10) / 5) * 5), y_lo + 5)
    px = lambda x: left + (x - x_lo) / (x_hi - x_lo) * (w - left - right)  # noqa: E731
    py = lambda y: h - bottom - (y - y_lo) / (y_max - y_lo) * (h - top - bottom)  # noqa: E731
    ticks = np.arange(x_lo, x_hi + 1e-9, 5.0 if x_hi - x_lo > 10 else 1.0)
    _frame(d, (left, top, w - right, h - bottom), ticks, px, (y_lo, y_max), py, x_label, y_label,
           title or "short vs long")
    on_front = sorted(points[k] for k in front if k in points)
    if len(on_front) > 1:
        d.line([(px(x), py(y)) for x, y in on_front], fill=(200, 200, 200), width=2)
    for i, (label, (x, y)) in enumerate(points.items()):
        colour = _PALETTE[i % len(_PALETTE)]
        r = 6 if label in front else 4
        d.ellipse([px(x) - r, py(y) - r, px(x) + r, py(y) + r], fill=colour, outline="black" if label in front else None)
        d.text((px(x) + 8, py(y) - 8 + (i % 3) * 6), label, fill="black", font=small, anchor="lm")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path, format="PNG")
    return path


def plot_truncation(truncation: dict[str, list[dict]], path: Path, *, title: str = "") -> Path:
    """R@1 (%) against the token budget: one colour per model, I2T solid, T2I dashed."""
    from PIL import Image, ImageDraw, ImageFont

    w, h = 960, 600
    left, right, top, bottom = 70, 300, 60, 70
    img = Image.new("RGB", (w, h), "white")
    d = ImageDraw.Draw(img)
    small = ImageFont.load_default(size=12)
    budgets = [r["max_tokens"] for r in next(iter(truncation.values()))]
    values = [100 * r[dd]["R@1"] for rows in truncation.values() for r in rows for dd in ("i2t", "t2i")]
    y_max = max(10.0, float(np.ceil(max(values) / 10) * 10)) if values else 100.0
    x_lo, x_hi = 0, max(budgets)
    px = lambda x: left + (x - x_lo) / max(x_hi - x_lo, 1) * (w - left - right)  # noqa: E731
    py = lambda y: h - bottom - y / y_max * (h - top - bottom)  # noqa: E731
    _frame(d, (left, top, w - right, h - bottom), budgets, px, (0.0, y_max), py, "token budget", "R@1 (%)",
           title or "Recall@1 vs text token budget")
    ly = top
    for i, (label, rows) in enumerate(truncation.items()):
        colour = _PALETTE[i % len(_PALETTE)]
        for dd, dashed in (("i2t", False), ("t2i", True)):
            pts = [(px(r["max_tokens"]), py(100 * r[dd]["R@1"])) for r in rows]
            for a, b in zip(pts, pts[1:], strict=False):
                if dashed:
                    _dashed(d, a, b, fill=colour, width=3)
                else:
                    d.line([a, b], fill=colour, width=3)
            for x, y in pts:
                d.ellipse([x - 4, y - 4, x + 4, y + 4], fill=colour)
            seg = [(w - right + 20, ly + 8), (w - right + 55, ly + 8)]
            if dashed:
                _dashed(d, seg[0], seg[1], fill=colour, width=3, dash=6)
            else:
                d.line(seg, fill=colour, width=3)
            name = label if len(label) <= 26 else "…" + label[-25:]
            d.text((w - right + 62, ly + 8), f"{name} {dd.upper()}", fill="black", font=small, anchor="lm")
            ly += 22
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path, format="PNG")
    return path


def write_report(report: dict, out_dir: Path) -> dict[str, Path]:
    """out_dir/report.json, report.md and (with a truncation analysis) truncation.png."""
    from engine.fileutil import atomic_write_text

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {"json": out_dir / "report.json", "markdown": out_dir / "report.md"}
    md = render_markdown(report)
    if report.get("truncation"):
        files["plot"] = plot_truncation(report["truncation"], out_dir / "truncation.png",
                                        title=f"{report['benchmark']}: R@1 vs token budget")
        md += "\n![R@1 vs token budget](truncation.png)\n"
    atomic_write_text(files["json"], json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    atomic_write_text(files["markdown"], md)
    return files
