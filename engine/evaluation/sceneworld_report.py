"""Regenerate the measured part of docs/sceneworld.md: the stage-(a) (captions only) and
stage-(b) (paragraph fine-tuned, shipped) sceneworld-mini on a fixed SceneWorld test set.

`python -m engine.evaluation.sceneworld_report [--n 1000] [--seed 1000] [--out docs/sceneworld.md]`
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path

from engine import options
from engine.outputs import check_script_output


def measure(model_dir: Path, seed: int, n: int) -> dict:
    from engine.backends.sceneworld_mini.embedder import SceneWorldMiniEmbedder
    from engine.evaluation.sceneworld import embed_scenes, evaluate

    out: dict = {"seed": seed, "n": n, "models": {}}
    base = SceneWorldMiniEmbedder(model_dir, device="cpu")
    t = time.perf_counter()
    data = embed_scenes(base, seed, n)  # the vision tower is shared: images are embedded once
    out["image_embed_s"] = time.perf_counter() - t
    for label, tower in (("stage (a): captions only", model_dir / "captions-only"),
                         ("stage (b): C5 paragraph fine-tuned (shipped)", None)):
        emb = SceneWorldMiniEmbedder(model_dir, device="cpu", text_tower_dir=tower)
        out["models"][label] = {split: evaluate(emb, split, seed, n, data=data) for split in ("short", "long")}
    return out


def render(m: dict) -> str:
    lines = [
        f"Measured by `python -m engine.evaluation.sceneworld_report --n {m['n']} --seed {m['seed']}` on "
        f"{m['n']} generated test scenes (seed {m['seed']}; training used seed 0). Recall as fractions; "
        f"chance R@1 = {1 / m['n']:.3f}. These are numbers on SceneWorld, not on real photos.",
        "",
        "| model | split | I2T R@1 | I2T R@5 | I2T R@10 | T2I R@1 | T2I R@5 | T2I R@10 |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for label, by_split in m["models"].items():
        for split in ("short", "long"):
            r = by_split[split]
            lines.append(
                f"| {label} | {split} | " + " | ".join(f"{r[d][k]:.3f}" for d in ("i2t", "t2i")
                                                    for k in ("R@1", "R@5", "R@10")) + " |"
            )
    a, b = list(m["models"].values())
    for split in ("long", "short"):
        lines.append("")
        lines.append(
            f"- {split} split, R@1 change from stage (a) to stage (b): "
            f"I2T {100 * (b[split]['i2t']['R@1'] - a[split]['i2t']['R@1']):+.1f} points, "
            f"T2I {100 * (b[split]['t2i']['R@1'] - a[split]['t2i']['R@1']):+.1f} points."
        )
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m engine.evaluation.sceneworld_report")
    ap.add_argument("--model-dir", type=Path, default=None, help="default: the bundled sceneworld-mini")
    ap.add_argument("--seed", type=options.SEED, default=1000)
    ap.add_argument("--n", type=options.SCENES, default=1000)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--json", action="store_true")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_script_output(parser, args.out, what="report", inputs=[args.model_dir] if args.model_dir else [])
    from engine.models.registry import bundled_model_dir

    model_dir = args.model_dir or bundled_model_dir("sceneworld-mini")
    m = measure(model_dir, args.seed, args.n)
    text = render(m)
    if args.out:
        from engine.bench.report import update_section

        update_section(args.out, "sceneworld-eval", text)
    print(json.dumps(m, indent=2) if args.json else text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
