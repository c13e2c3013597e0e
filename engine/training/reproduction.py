"""The paragraph-supervision study in miniature on SceneWorld (docs/reproduction.md).

From one stage-(a) sceneworld-mini text tower (captions only, the analogue of BLIP0), fine-tune
C1–C10 with the vision tower frozen on the same training scenes, evaluate each on the short and
long SceneWorld test splits, run the truncation analysis on the long split, add two ablations
(number of hard negatives for C7; fraction of paragraph data for C5), and write a Markdown
report with a table, a truncation plot and a Pareto plot (short vs long R@1).

    make reproduction
    python -m engine.training.reproduction --out docs/reproduction.md [--n-train 2000] [--quick]

Trained towers and a results cache live in --work (default: the user cache folder), so an
interrupted run resumes at the next untrained configuration.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from engine import options
from engine.jsonfile import read_json_file
from engine.limits import MAX_REPORT_JSON_BYTES, MAX_SMALL_JSON_BYTES
from engine.outputs import check_script_output

CONFIGS = tuple(f"C{i}" for i in range(1, 11))
BASELINE = "BLIP0*"  # the stage-(a) tower, not fine-tuned (BLIP0's role in the paper)
BUDGETS = (20, 40, 60, 80, 100, 128)
PARAGRAPH_CONFIGS = ("C4", "C5", "C6", "C9", "C10")
CAPTION_ONLY_CONFIGS = ("C1", "C2", "C3", "C7", "C8")


@dataclass(frozen=True)
class StudySettings:
    n_train: int = 2000
    epochs: int = 3
    lr: float = 5e-4
    batch_size: int = 128
    warmup_steps: int = 50
    eval_seed: int = 1000
    eval_n: int = 1000
    seed: int = 0

    def key(self) -> str:
        return "-".join(f"{k}{v}" for k, v in asdict(self).items())


@dataclass(frozen=True)
class Run:
    """One trained tower: a preset, optionally with fewer hard negatives or less paragraph data."""

    config: str
    hard_negatives: int | None = None
    data_fraction: float = 1.0

    @property
    def label(self) -> str:
        if self.hard_negatives is not None:
            return f"{self.config} ({self.hard_negatives} hard neg.)"
        if self.data_fraction < 1.0:
            return f"{self.config} ({round(100 * self.data_fraction)}% data)"
        return self.config

    @property
    def folder(self) -> str:
        return self.label.replace(" ", "_").replace("(", "").replace(")", "").replace("%", "pct").replace(".", "")


def study_runs(ablations: bool = True) -> list[Run]:
    runs = [Run(c) for c in CONFIGS]
    if ablations:
        runs += [Run("C7", hard_negatives=1), Run("C7", hard_negatives=3),
                 Run("C5", data_fraction=0.25), Run("C5", data_fraction=0.5)]
    return runs


def _json_config(run: Run, folder: Path) -> str:
    """A custom config file for ablation runs (presets need none)."""
    if run.hard_negatives is None:
        return run.config
    path = folder / "config.json"
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"base": run.config, "name": run.label, "hard_negatives": run.hard_negatives}),
                    encoding="utf-8")
    return str(path)


def evaluate_tower(base: Path, tower: Path | None, s: StudySettings) -> dict[str, Any]:
    """R@K on both splits at the default budgets plus the long-split truncation curve."""
    from engine.training.study import evaluate_on_sceneworld

    return evaluate_on_sceneworld(base, tower, seed=s.eval_seed, n=s.eval_n, truncation_budgets=BUDGETS)


def run_study(base: Path, work: Path, s: StudySettings, runs: Sequence[Run], log=sys.stderr) -> dict[str, Any]:
    """Train (or reuse) every run's tower and evaluate it; results are cached per run in `work`."""
    from engine.training.study import CAPTIONS_ONLY, train_config_on_sceneworld

    base = Path(base).resolve()
    work = Path(work) / s.key()
    work.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"settings": asdict(s), "base": str(base), "runs": {}}
    t0 = time.monotonic()
    baseline_tower = base / CAPTIONS_ONLY if (base / CAPTIONS_ONLY).is_dir() else None
    results["runs"][BASELINE] = _cached(work / "baseline-eval.json", lambda: {
        "config": None, **evaluate_tower(base, baseline_tower, s)})
    for run in runs:
        folder = work / run.folder
        print(f"[reproduction] {run.label}", file=log, flush=True)

        def train_and_eval(run: Run = run, folder: Path = folder) -> dict[str, Any]:
            if not (folder / "study.json").is_file():
                train_config_on_sceneworld(
                    base, _json_config(run, folder), folder,
                    n_train=max(int(round(s.n_train * run.data_fraction)), s.batch_size),
                    seed=s.seed, epochs=s.epochs, lr=s.lr, batch_size=s.batch_size,
                    warmup_steps=s.warmup_steps, cache_dir=work / ".embeddings", log=log)
            meta = read_json_file(folder / "study.json", max_bytes=MAX_SMALL_JSON_BYTES)
            return {"config": run.config, "hard_negatives": run.hard_negatives,
                    "data_fraction": run.data_fraction, "train_seconds": meta["seconds"]["train"],
                    "final_loss": meta["final_loss"], **evaluate_tower(base, folder, s)}

        results["runs"][run.label] = _cached(folder / "eval.json", train_and_eval)
    results["seconds"] = round(time.monotonic() - t0, 1)
    return results


def _cached(path: Path, compute) -> dict[str, Any]:
    if path.is_file():
        return read_json_file(path, max_bytes=MAX_REPORT_JSON_BYTES)
    value = compute()
    from engine.fileutil import atomic_write_text

    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(value, indent=1) + "\n")
    return value


# -- findings ------------------------------------------------------------------------
def _r1(res: dict, split: str, direction: str) -> float:
    return 100 * res[split][direction]["R@1"]


def _mean_r1(res: dict, split: str) -> float:
    return (_r1(res, split, "i2t") + _r1(res, split, "t2i")) / 2


def _values(runs: dict, labels: Sequence[str], split: str = "long") -> str:
    return ", ".join(f"{_mean_r1(runs[c], split):.1f}" for c in labels)


def findings(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The paper's findings (research brief §1), each checked against the measured numbers."""
    runs = results["runs"]
    base = runs[BASELINE]
    out: list[dict[str, Any]] = []

    best_para = max(PARAGRAPH_CONFIGS, key=lambda c: _mean_r1(runs[c], "long"))
    best_cap = max(CAPTION_ONLY_CONFIGS, key=lambda c: _mean_r1(runs[c], "long"))
    out.append({
        "claim": "Paragraph supervision is the key factor for long descriptions.",
        "reproduced": _mean_r1(runs[best_para], "long") > _mean_r1(runs[best_cap], "long") + 2
        and min(_mean_r1(runs[c], "long") for c in PARAGRAPH_CONFIGS)
        > max(_mean_r1(runs[c], "long") for c in CAPTION_ONLY_CONFIGS),
        "evidence": (f"long-split mean R@1: every paragraph config (C4, C5, C6, C9, C10: "
                     f"{_values(runs, PARAGRAPH_CONFIGS)}) vs every caption-only config (C1, C2, C3, C7, "
                     f"C8: {_values(runs, CAPTION_ONLY_CONFIGS)}); best {best_para} "
                     f"{_mean_r1(runs[best_para], 'long'):.1f} vs {best_cap} {_mean_r1(runs[best_cap], 'long'):.1f}"),
    })
    cap_deltas = {c: _mean_r1(runs[c], "long") - _mean_r1(base, "long") for c in ("C1", "C2", "C3", "C8")}
    out.append({
        "claim": "Caption-only fine-tuning hurts long-text retrieval (relative to BLIP0).",
        "reproduced": all(d < 0 for d in cap_deltas.values()),
        "evidence": "long-split mean R@1 change vs the stage-(a) tower: "
        + ", ".join(f"{c} {d:+.1f}" for c, d in cap_deltas.items()),
    })
    hn = [(label, runs[label]) for label in ("C7 (1 hard neg.)", "C7 (3 hard neg.)", "C7") if label in runs]
    if hn:
        c1 = _mean_r1(runs["C1"], "long"), _mean_r1(runs["C1"], "short")
        vals = [(_mean_r1(r, "long"), _mean_r1(r, "short")) for _, r in hn]
        monotone = all(a[0] >= b[0] for a, b in zip(vals, vals[1:], strict=False))
        out.append({
            "claim": "Hard negatives with a frozen vision tower are harmful, more so with more of them.",
            "reproduced": vals[-1][0] < c1[0] and vals[-1][1] < c1[1] and monotone,
            "evidence": f"C1 (same captions, no hard negatives): long {c1[0]:.1f}, short {c1[1]:.1f}; "
            + "; ".join(f"{label}: long {v[0]:.1f}, short {v[1]:.1f}" for (label, _), v in zip(hn, vals, strict=True)),
        })
    fr = [label for label in ("C5 (25% data)", "C5 (50% data)") if label in runs]
    if fr:
        gain_full = _mean_r1(runs["C5"], "long") - _mean_r1(base, "long")
        gains = {label: _mean_r1(runs[label], "long") - _mean_r1(base, "long") for label in fr}
        share = gains.get("C5 (25% data)", 0.0) / gain_full if gain_full > 0 else float("nan")
        out.append({
            "claim": "25% of the paragraph data captures about 75% of the gain.",
            "reproduced": gain_full > 0 and share >= 0.6,
            "evidence": f"long-split mean R@1 gain over the stage-(a) tower: 100% data {gain_full:+.1f}; "
            + ", ".join(f"{k} {v:+.1f}" for k, v in gains.items())
            + (f" (25% of the data gives {100 * share:.0f}% of the gain)" if gain_full > 0 else ""),
        })
    para_monotone = {c: _monotone([100 * r["t2i"]["R@1"] for r in runs[c]["truncation"]]) for c in PARAGRAPH_CONFIGS}
    cap_peak = {c: _peak_budget(runs[c]["truncation"]) for c in ("C1", "C2", "C3", "C8")}
    out.append({
        "claim": "Paragraph-trained models improve monotonically with the token budget; caption-trained ones "
                 "plateau at 40–60 tokens and then degrade.",
        "reproduced": all(para_monotone.values()) and all(p <= 80 for p in cap_peak.values()),
        "evidence": "T2I R@1 non-decreasing from 20 to 128 tokens: "
        + ", ".join(f"{c} {'yes' if m else 'no'}" for c, m in para_monotone.items())
        + "; caption-only configs peak (mean R@1) at "
        + ", ".join(f"{c} {p}" for c, p in cap_peak.items()) + " tokens",
    })
    short_t2i = {c: _r1(runs[c], "short", "t2i") - _r1(base, "short", "t2i") for c in PARAGRAPH_CONFIGS}
    out.append({
        "claim": "Text→image on short captions degrades by a few points vs BLIP0 after paragraph fine-tuning.",
        "reproduced": all(d < 0 for d in short_t2i.values()),
        "evidence": "short-split T2I R@1 change vs the stage-(a) tower: "
        + ", ".join(f"{c} {d:+.1f}" for c, d in short_t2i.items()),
    })
    return out


def _monotone(values: Sequence[float], tolerance: float = 0.5) -> bool:
    return all(b >= a - tolerance for a, b in zip(values, values[1:], strict=False))


def _peak_budget(curve: list[dict]) -> int:
    best = max(curve, key=lambda r: r["i2t"]["R@1"] + r["t2i"]["R@1"])
    return int(best["max_tokens"])


# -- report --------------------------------------------------------------------------
def pareto_front(points: dict[str, tuple[float, float]]) -> list[str]:
    """Labels not dominated on (short, long) — higher is better on both."""
    return [a for a, (x, y) in points.items()
            if not any((x2 >= x and y2 >= y) and (x2 > x or y2 > y) for b, (x2, y2) in points.items() if b != a)]


def render(results: dict[str, Any], plots: dict[str, str], command: str) -> str:
    s = results["settings"]
    runs = results["runs"]
    lines = [
        "# The paragraph-supervision study, reproduced in miniature on SceneWorld",
        "",
        f"Regenerate this whole document (tables, plots, verdicts) with `{command}`.",
        "",
        "These are measurements on SceneWorld (a procedural long-caption world, docs/sceneworld.md) with "
        "the small sceneworld-mini model, not numbers on real photos and not the paper's BLIP/CC3M setup. "
        "What carries over is the design of the experiment: one caption-trained model (stage (a), BLIP0's "
        "role), the vision tower frozen, the ten text-supervision configurations of the research brief, "
        "the same losses, the same evaluation protocol.",
        "",
        "## Setup",
        "",
        "- Base: the bundled sceneworld-mini; every run starts from its stage-(a) text tower "
        "(`captions-only/`), vision tower frozen (image embeddings computed once).",
        f"- Training data: {s['n_train']:,} SceneWorld scenes (seed {s['seed']}), each with an original caption, "
        "5 generated captions, 5 one-detail-wrong hard negatives and a 3–6 sentence paragraph.",
        f"- {s['epochs']} epochs, batch {s['batch_size']}, AdamW lr {s['lr']:g} (scaled to this small tower; the "
        f"paper's 1e-5 is for BERT-base), cosine schedule, {s['warmup_steps']} warm-up steps, the base's "
        "temperature; captions at 77 tokens, paragraphs at 128.",
        f"- Test: {s['eval_n']:,} unseen scenes (seed {s['eval_seed']}). Short split: 5 captions per image "
        "(an I2T hit if any is in the top K). Long split: one paragraph per image at 128 tokens. "
        f"Chance R@1 = {100 / s['eval_n']:.1f}%.",
        f"- Training time summed over the {len(runs) - 1} runs: "
        f"{sum(r.get('train_seconds') or 0 for r in runs.values()) / 60:.0f} min on this machine (2 CPU cores, "
        "shared with other jobs); rendering, embedding and evaluation come on top.",
        "",
        "## C1–C10 (R@1 in %)",
        "",
        "| config | texts per image | loss | short I2T | short T2I | long I2T | long T2I | train s* |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    from engine.training.configs import PRESETS

    for label, r in runs.items():
        cfg = PRESETS.get(r["config"]) if r["config"] else None
        desc = cfg.description if cfg else "stage (a): captions only, no fine-tuning"
        loss = cfg.loss if cfg else "—"
        if r.get("hard_negatives") is not None:
            desc = f"original caption with {r['hard_negatives']} hard negatives"
        if r.get("data_fraction", 1.0) < 1.0:
            desc += f" ({round(100 * r['data_fraction'])}% of the scenes)"
        secs = f"{r['train_seconds']:.0f}" if r.get("train_seconds") is not None else "—"
        lines.append(f"| {label} | {desc} | {loss} | " + " | ".join(
            f"{_r1(r, sp, d):.1f}" for sp in ("short", "long") for d in ("i2t", "t2i")) + f" | {secs} |")
    lines += ["", "\\* wall seconds on a machine shared with other jobs: not comparable between rows.",
              "", "R@5 and R@10 for every run are in "
              f"[{plots['json']}]({plots['json']}).", ""]

    lines += ["## Truncation analysis (long split)", "",
              "The same paragraphs cut at 20/40/60/80/100/128 tokens (R@1 in %, I2T / T2I):", "",
              "| run | " + " | ".join(str(b) for b in BUDGETS) + " |",
              "|---|" + "---:|" * len(BUDGETS)]
    for label, r in runs.items():
        lines.append(f"| {label} | " + " | ".join(
            f"{100 * row['i2t']['R@1']:.1f} / {100 * row['t2i']['R@1']:.1f}" for row in r["truncation"]) + " |")
    lines += ["", f"![R@1 against the token budget]({plots['truncation']})", ""]

    points = {label: (_mean_r1(r, "short"), _mean_r1(r, "long")) for label, r in runs.items()}
    front = pareto_front(points)
    lines += ["## Short vs long (Pareto)", "",
              "Mean of I2T and T2I R@1 on each split; the Pareto front (no other run is better on both) is "
              f"{', '.join(front)}.", "", f"![short vs long R@1]({plots['pareto']})", ""]

    lines += ["## The paper's findings, checked", "",
              "| finding (research brief §1) | reproduced here? | evidence (R@1 in %) |", "|---|---|---|"]
    for f in findings(results):
        lines.append(f"| {f['claim']} | {'yes' if f['reproduced'] else '**no**'} | {f['evidence']} |")
    lines += ["", WHY.format(n_train=s["n_train"]), ""]
    return "\n".join(lines)


WHY = """### Why results differ from the paper where they do

- Scale and model: {n_train:,}-scene training sets and a 2-layer, 128-wide text tower over a 64-pixel
  vision tower, against 500K CC3M images and BLIP ViT-B/BERT-base. Differences of one or two points
  between runs are within the spread of a single seed here.
- Data efficiency: here a quarter of the scenes is also a quarter of the optimiser steps (as in the
  paper, which kept the epoch count), and on a training set this small the tower is still far from
  converged at full size, so the curve is closer to linear than the paper's.
- Truncation: every tower here, the caption-trained ones included, keeps improving up to 128 tokens.
  SceneWorld paragraphs add one more object per sentence, so later tokens carry information that
  separates scenes; and sceneworld-mini pools the mean of its token states, so positions it never
  trained on (beyond 77 for the stage-(a) tower) dilute the embedding rather than replace a [CLS]
  summary as in BLIP. The caption-trained towers gain much less after 60 tokens than the
  paragraph-trained ones, which is the part of the finding that does carry over.
- Short captions: paragraph fine-tuning costs short-caption *image→text* R@1 here (see the table)
  while text→image stays level; the paper saw the loss on text→image. SceneWorld's short captions are
  sentences of the same grammar as its paragraphs, so a paragraph-trained tower still reads them well
  as queries; as targets among 5,000 captions they lose to the paragraph-like captions of other images.
- SceneWorld's "generated captions" are ground-truth templates of the scene, so C2/C8's captions are
  as faithful as the original caption; in the paper they come from a VLM and are noisier.
- Hard negatives (reproduced, strongly): each changes exactly one detail (an attribute, a relation, a
  count or an object kind). With a frozen vision tower that cannot see the detail (docs/grounding.md:
  it separates object kinds poorly), pushing those texts away teaches the text tower to discard the
  words that describe details, which also wrecks ordinary retrieval."""


def write_report(results: dict[str, Any], out: Path, command: str) -> dict[str, Path]:
    from engine.evaluation.harness import plot_scatter, plot_truncation
    from engine.fileutil import atomic_write_text

    out = Path(out)
    assets = out.parent / out.stem
    assets.mkdir(parents=True, exist_ok=True)
    runs = results["runs"]
    main_labels = [BASELINE, *CONFIGS]
    trunc = {label: runs[label]["truncation"] for label in main_labels if label in runs}
    files = {
        "json": assets / "results.json",
        "truncation": plot_truncation(trunc, assets / "truncation.png",
                                      title="SceneWorld long split: R@1 vs token budget"),
        "pareto": plot_scatter({label: (_mean_r1(r, "short"), _mean_r1(r, "long")) for label, r in runs.items()},
                               assets / "pareto.png", x_label="short-caption R@1 (%, mean of I2T and T2I)",
                               y_label="long-paragraph R@1 (%)", title="C1-C10 on SceneWorld: short vs long R@1",
                               front=pareto_front({label: (_mean_r1(r, "short"), _mean_r1(r, "long"))
                                                   for label, r in runs.items()})),
    }
    atomic_write_text(files["json"], json.dumps(results, indent=1) + "\n")
    rel = {k: f"{assets.name}/{p.name}" for k, p in files.items()}
    atomic_write_text(out, render(results, rel, command) + "\n")
    files["markdown"] = out
    return files


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m engine.training.reproduction",
                                 description="Train C1–C10 on SceneWorld and write docs/reproduction.md.")
    ap.add_argument("--base", type=Path, help="base model folder (default: the bundled sceneworld-mini)")
    ap.add_argument("--out", type=Path, default=Path("docs/reproduction.md"))
    ap.add_argument("--work", type=Path, help="trained towers and cached results (default: user cache)")
    ap.add_argument("--n-train", type=options.SCENES, default=StudySettings.n_train)
    ap.add_argument("--epochs", type=options.EPOCHS, default=StudySettings.epochs)
    ap.add_argument("--eval-n", type=options.SCENES, default=StudySettings.eval_n)
    ap.add_argument("--no-ablations", action="store_true", help="only C1–C10")
    ap.add_argument("--quick", action="store_true", help="a tiny run to check the pipeline (minutes)")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_script_output(parser, args.out, what="report", inputs=[args.base] if args.base else [])
    from engine.config import get_paths
    from engine.models.registry import bundled_model_dir

    base = args.base or bundled_model_dir("sceneworld-mini")
    s = StudySettings(n_train=args.n_train, epochs=args.epochs, eval_n=args.eval_n)
    if args.quick:
        s = StudySettings(n_train=256, epochs=1, batch_size=64, warmup_steps=2, eval_n=100)
    work = args.work or get_paths().cache / "reproduction"
    import torch

    torch.manual_seed(0)
    results = run_study(base, work, s, study_runs(not args.no_ablations))
    command = "make reproduction" if not args.quick else "python -m engine.training.reproduction --quick"
    files = write_report(results, args.out, command)
    print(f"wrote {files['markdown']} (this invocation: {results['seconds'] / 60:.1f} min; finished runs are "
          f"cached in {work})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
