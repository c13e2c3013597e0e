"""The CAFT-style sceneworld-mini variant (issue 21; design in docs/caft.md) and the experiment
that measures the seed's three claims against today's sceneworld-mini.

The variant is sceneworld-mini with
- region tokens at three scales (the 8 x 8 patches, 4 x 4 and 2 x 2 pools of them; fine to coarse),
- part-to-whole text pooling (a paragraph = the mean of its sentences, each the mean of its
  phrases; engine/grounding/parts.py), and
- the phrase-region alignment loss (engine/training/local_alignment.py) beside the global
  contrastive loss in both training stages,
trained on pictures and texts only, with the same data, schedule and steps as the baseline.

    python -m engine.training.caft --out build/caft --doc docs/caft.md      (make caft)

For each training-set size (default 2,000, 6,000, 20,000 scenes) it trains the baseline and the
variant with the same number of optimizer steps (the 2,000-scene schedule, 12 + 8 epochs of 128;
larger sets take fewer epochs: `equal_step_schedule`), so the sizes differ in data only and a run
stays within about an hour on 2 CPU cores. The shipped model (20,000 scenes, 12 + 8 epochs, ten
times the steps; `make demo-model` trains it with the same function) is measured beside them as
a reference, its weights without the matching head (trained with masks). Each model is measured on
the fixed test scenes: long and short split R@1, the truncation curve (seed 1000), and grounding
from its own phrase-region maps with no matching head (seed 2000; calibration fitted on
validation scenes of seed 1500). Each model's figures go to OUT/<name>/measurement.json; the
tables of docs/caft.md are rendered from them. Folders already trained are reused (delete one to
retrain it); `--kinds` picks which models a process trains, so two processes can share the work.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from engine import options
from engine.backends.sceneworld_mini.network import CONFIG_FILE, MODEL_FILE, MiniConfig

CAFT_CONFIG = MiniConfig(region_scales=(4, 2), text_pooling="part_to_whole")
#: Weight of the local loss beside the global one (both are InfoNCE at the same temperature).
LOCAL_WEIGHT = 1.0
SIZES = (2000, 6000, 20000)
#: The schedule every size's steps are matched to: 2,000 scenes, 12 + 8 epochs (the shipped epochs).
REFERENCE_SCENES, REFERENCE_EPOCHS = 2000, (12, 8)
#: baseline and caft: per size, at the reference steps; shipped: the shipped model (20,000 scenes,
#: 12 + 8 epochs), measured as is; baseline-/caft-shipped-schedule: per size, the shipped epochs
#: (12 + 8, so the steps grow with the data: 6,000 scenes take about an hour per run on 2 cores,
#: 20,000 about three), only when asked for.
PER_SIZE_KINDS = ("baseline", "caft", "baseline-shipped-schedule", "caft-shipped-schedule")
#: The kinds whose steps follow --steps-of (equal_step_schedule).
EQUAL_STEP_KINDS = ("baseline", "caft")
KINDS = (*PER_SIZE_KINDS, "shipped")
DEFAULT_KINDS = ("baseline", "caft", "shipped")
TRUNCATION_BUDGETS = (20, 40, 60, 80, 100, 128)
RETRIEVAL_SEED, GROUNDING_SEED, CALIBRATION_SEED = 1000, 2000, 1500
SHIPPED_TRAINING_SCENES = 20000


def train_variant(out_dir: Path, n_train: int, *, seed: int = 0, cfg: MiniConfig = CAFT_CONFIG, log=sys.stderr,
                  local_weight: float = LOCAL_WEIGHT, **schedule: int) -> dict:
    """Train the CAFT-style variant (both stages) into out_dir; texts and pictures only.
    `schedule`: epochs_a, epochs_b, batch_size (default: the baseline's)."""
    from engine.training.sceneworld_mini import train

    return train(out_dir, seed=seed, n_train=n_train, cfg=cfg, local_alignment=local_weight, log=log, **schedule)


def train_baseline(out_dir: Path, n_train: int, *, seed: int = 0, log=sys.stderr, **schedule: int) -> dict:
    from engine.training.sceneworld_mini import train

    return train(out_dir, seed=seed, n_train=n_train, log=log, **schedule)


def equal_step_schedule(n_train: int, steps_of: int = REFERENCE_SCENES) -> dict[str, int]:
    """Epochs of stages (a) and (b) for `n_train` scenes that give about as many optimizer steps as
    the reference epochs (12 + 8) on `steps_of` scenes (at least one epoch each). With the default
    2,000: 2,000 -> 12 + 8, 6,000 -> 4 + 3, 20,000 -> 1 + 1; with 6,000: 20,000 -> 4 + 2."""
    a, b = REFERENCE_EPOCHS
    scale = steps_of / n_train
    return {"epochs_a": max(1, round(a * scale)), "epochs_b": max(1, round(b * scale))}


def copy_shipped_baseline(shipped: Path, out_dir: Path) -> None:
    """The shipped model's two-tower weights without its matching head (trained with masks):
    the 20,000-scene baseline, unsupervised maps only."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in (MODEL_FILE, CONFIG_FILE):
        shutil.copy2(shipped / name, out_dir / name)


def _training_report(folder: Path) -> dict:
    from engine.jsonfile import read_json_file
    from engine.limits import MAX_SMALL_JSON_BYTES

    return read_json_file(folder / CONFIG_FILE, max_bytes=MAX_SMALL_JSON_BYTES).get("training_report", {})


def _epochs_of(report: dict) -> dict:
    return {"a": report.get("stage_a", {}).get("epochs"), "b": report.get("stage_b", {}).get("epochs")}


def read_measurement(folder: Path) -> dict:
    """The folder's measurement.json, with the epochs from its training report where it was
    measured before epochs were recorded."""
    from engine.jsonfile import read_json_file
    from engine.limits import MAX_SMALL_JSON_BYTES

    row = read_json_file(folder / "measurement.json", max_bytes=MAX_SMALL_JSON_BYTES)
    if not row.get("epochs") and (folder / CONFIG_FILE).is_file():
        row["epochs"] = _epochs_of(_training_report(folder))
    return row


def is_trained(folder: Path) -> bool:
    return (folder / MODEL_FILE).is_file() and (folder / CONFIG_FILE).is_file()


def measure(model_dir: Path, *, n_retrieval: int = 1000, n_grounding: int = 1000, n_calibration: int = 400,
            log=sys.stderr) -> dict:
    """Retrieval (long/short R@1 both ways, truncation curve) and unsupervised grounding."""
    from engine.backends.sceneworld_mini.embedder import SceneWorldMiniEmbedder
    from engine.evaluation.grounding_benchmark import evaluate_grounding
    from engine.evaluation.grounding_calibration import fit_calibration
    from engine.evaluation.sceneworld import embed_scenes, evaluate

    t0 = time.monotonic()
    embedder = SceneWorldMiniEmbedder(model_dir, device="cpu", model_id=model_dir.name)
    data = embed_scenes(embedder, RETRIEVAL_SEED, n_retrieval)
    retrieval = {}
    for split in ("long", "short"):
        r = evaluate(embedder, split, RETRIEVAL_SEED, n_retrieval, data=data)
        retrieval[split] = {"i2t_R@1": r["i2t"]["R@1"], "t2i_R@1": r["t2i"]["R@1"]}
    truncation = {str(b): evaluate(embedder, "long", RETRIEVAL_SEED, n_retrieval, max_tokens=b,
                                   data=data)["t2i"]["R@1"] for b in TRUNCATION_BUDGETS}
    print(f"[measure {model_dir.name}] retrieval {retrieval}", file=log, flush=True)
    calibration = fit_calibration(embedder, seed=CALIBRATION_SEED, n=n_calibration)
    g = evaluate_grounding(embedder, seed=GROUNDING_SEED, n=n_grounding, calibration=calibration,
                           timing_images=0)
    keep = ("method", "n_object_phrases", "pointing_game", "pointing_game_centre_baseline",
            "pointing_game_random_baseline", "mask_iou", "faithfulness_auc", "faithfulness_auc_by_error",
            "support_true_above_half", "support_wrong_below_half", "calibrated")
    report = _training_report(model_dir)
    return {
        "model": model_dir.name,
        "n_train_scenes": report.get("n_train_scenes"),
        "config": {"region_scales": list(embedder.cfg.region_scales), "text_pooling": embedder.cfg.text_pooling},
        "local_alignment": (report.get("stage_a", {}).get("extra", {}) or {}).get("local_alignment", 0.0),
        "epochs": _epochs_of(report),
        "training_seconds": report.get("seconds"),
        "retrieval": {"seed": RETRIEVAL_SEED, "n_scenes": n_retrieval, **retrieval},
        "truncation_t2i_R@1": truncation,
        "grounding": {"seed": GROUNDING_SEED, "n_scenes": n_grounding, "calibration_seed": CALIBRATION_SEED,
                      "n_calibration_scenes": n_calibration, **{k: g[k] for k in keep}},
        "seconds": round(time.monotonic() - t0),
    }


# -- the document ------------------------------------------------------------------------------
def _f(x: float | None) -> str:
    return "–" if x is None else f"{x:.3f}"


def _is_variant(m: dict) -> bool:
    # By its architecture: a variant trained with local weight 0 is the architecture alone.
    return m["local_alignment"] > 0 or (m.get("config") or {}).get("text_pooling") == "part_to_whole"


def _model_label(m: dict) -> str:
    if _is_variant(m):
        w = m["local_alignment"]
        return "CAFT-style variant" + ("" if w == LOCAL_WEIGHT else f" (local weight {w:g})")
    return "sceneworld-mini as shipped" if m["model"].startswith("shipped") else "sceneworld-mini (today's recipe)"


def _epochs(m: dict) -> str:
    e = m.get("epochs") or {}
    return f"{e.get('a', '?')} + {e.get('b', '?')}" if e else "–"


def render_tables(rows: Sequence[dict]) -> str:
    """docs/caft.md's measured tables from the measurement JSONs (baseline and variant per size)."""
    head = ("| scenes | epochs | model | long T2I | long I2T | short T2I | short I2T | pointing | centre | mask IoU "
            "| AUC | attribute | relation | count | object |\n|" + "---|" * 15)
    lines = [head]
    ordered = sorted(rows, key=lambda m: (m["n_train_scenes"] or 0, sum(v or 0 for v in (m.get("epochs") or {}).values()),
                                          _is_variant(m), m["local_alignment"]))
    for m in ordered:
        r, g = m["retrieval"], m["grounding"]
        e = g["faithfulness_auc_by_error"]
        name = _model_label(m)
        lines.append(f"| {m['n_train_scenes']:,} | {_epochs(m)} | {name} | {_f(r['long']['t2i_R@1'])} | {_f(r['long']['i2t_R@1'])} "
                     f"| {_f(r['short']['t2i_R@1'])} | {_f(r['short']['i2t_R@1'])} | {_f(g['pointing_game'])} "
                     f"| {_f(g['pointing_game_centre_baseline'])} | {_f(g['mask_iou'])} | {_f(g['faithfulness_auc'])} "
                     f"| {_f(e.get('attribute'))} | {_f(e.get('relation'))} | {_f(e.get('count'))} "
                     f"| {_f(e.get('object'))} |")
    budgets = [str(b) for b in TRUNCATION_BUDGETS]
    lines += ["", "Truncation curve (long split T2I R@1 at a token budget):", "",
              "| scenes | epochs | model | " + " | ".join(budgets) + " |", "|" + "---|" * (3 + len(budgets))]
    for m in ordered:
        lines.append(f"| {m['n_train_scenes']:,} | {_epochs(m)} | {_model_label(m)} | "
                     + " | ".join(_f(m["truncation_t2i_R@1"].get(b)) for b in budgets) + " |")
    return "\n".join(lines) + "\n"


def write_section(doc: Path, rows: Sequence[dict], command: str) -> None:
    from engine.bench.report import update_section

    body = (f"Regenerate: `{command}`. SceneWorld synthetic data, measured on this machine's CPU; "
            f"retrieval on {rows[0]['retrieval']['n_scenes']:,} test scenes (seed {RETRIEVAL_SEED}), grounding "
            f"on {rows[0]['grounding']['n_scenes']:,} (seed {GROUNDING_SEED}), from each model's own "
            "phrase-patch maps with no matching head.\n\n" + render_tables(rows))
    update_section(doc, "caft-measured", body)


def parse_sizes(parser: argparse.ArgumentParser, text: str) -> list[int]:
    """Comma-separated training-set sizes, each a number of scenes (options.SCENES)."""
    try:
        return [options.SCENES(part.strip()) for part in text.split(",")]
    except argparse.ArgumentTypeError as exc:
        parser.error(f"argument --sizes: {exc}")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="longlens dev caft", description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for the trained models and measurements")
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)),
                    help="training-set sizes in scenes, comma-separated (default 2000,6000,20000)")
    ap.add_argument("--local-weight", type=options.LOCAL_ALIGNMENT, default=LOCAL_WEIGHT,
                    help=f"the variant's local-loss weight beside the global loss (default {LOCAL_WEIGHT:g}; "
                         "another weight trains into caft-wW-SIZE)")
    ap.add_argument("--steps-of", type=options.SCENES, default=REFERENCE_SCENES,
                    help=f"baseline and caft train as many steps as {REFERENCE_EPOCHS[0]} + {REFERENCE_EPOCHS[1]} "
                         f"epochs on this many scenes (default {REFERENCE_SCENES:,}; another number trains into "
                         "KIND-SIZE-stepsN)")
    ap.add_argument("--n-retrieval", type=options.SCENES, default=1000)
    ap.add_argument("--n-grounding", type=options.SCENES, default=1000)
    ap.add_argument("--doc", type=Path, help="write the measured tables into this Markdown file's caft-measured section")
    ap.add_argument("--kinds", default=",".join(DEFAULT_KINDS),
                    help="which models this process trains and measures, comma-separated: baseline, caft (at each "
                         "size, the reference steps), shipped (once), baseline-shipped-schedule, "
                         f"caft-shipped-schedule (at each size, 12 + 8 epochs); default {','.join(DEFAULT_KINDS)}")
    ap.add_argument("--shipped", type=Path, default=Path("resources/models/sceneworld-mini"),
                    help=f"the shipped model folder (the {SHIPPED_TRAINING_SCENES:,}-scene reference)")
    return ap


def parse_kinds(parser: argparse.ArgumentParser, text: str) -> list[str]:
    kinds = [part.strip() for part in text.split(",") if part.strip()]
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        parser.error(f"argument --kinds: {', '.join(bad) or 'nothing'} is not one of {', '.join(KINDS)}")
    return kinds


def _models(sizes: Sequence[int], kinds: Sequence[str]) -> list[tuple[str, int]]:
    """(kind, size) of every model to train and measure: baseline and variant per size, the shipped
    reference once."""
    out = [(kind, n) for n in sizes for kind in PER_SIZE_KINDS if kind in kinds]
    return out + ([("shipped", SHIPPED_TRAINING_SCENES)] if "shipped" in kinds else [])


def main(argv: Sequence[str] | None = None) -> int:
    from engine.fileutil import atomic_write_text

    parser = build_parser()
    args = parser.parse_args(argv)
    sizes, kinds = parse_sizes(parser, args.sizes), parse_kinds(parser, args.kinds)
    out: Path = args.out
    if "shipped" in kinds and not is_trained(args.shipped):
        parser.error(f"argument --shipped: {args.shipped} has no trained sceneworld-mini ({MODEL_FILE}, {CONFIG_FILE})")
    rows = []
    for kind, n in _models(sizes, kinds):
        weighted = kind.startswith("caft") and args.local_weight != LOCAL_WEIGHT
        folder = out / (f"{kind}-w{args.local_weight:g}-{n}" if weighted else f"{kind}-{n}")
        if kind in EQUAL_STEP_KINDS and args.steps_of != REFERENCE_SCENES:
            folder = folder.with_name(f"{folder.name}-steps{args.steps_of}")
        if not is_trained(folder):
            print(f"training {folder} ({n} scenes)", file=sys.stderr, flush=True)
            if kind == "caft":
                train_variant(folder, n, local_weight=args.local_weight, **equal_step_schedule(n, args.steps_of))
            elif kind == "shipped":
                copy_shipped_baseline(args.shipped, folder)
            elif kind == "caft-shipped-schedule":
                train_variant(folder, n, local_weight=args.local_weight)  # the shipped epochs (12 + 8)
            elif kind == "baseline-shipped-schedule":
                train_baseline(folder, n)
            else:
                train_baseline(folder, n, **equal_step_schedule(n, args.steps_of))
        result = folder / "measurement.json"
        if not result.exists():
            m = measure(folder, n_retrieval=args.n_retrieval, n_grounding=args.n_grounding)
            atomic_write_text(result, json.dumps(m, indent=2))
        rows.append(read_measurement(folder))
        print(json.dumps({k: rows[-1][k] for k in ("model", "retrieval")}), flush=True)
    if args.doc:
        others = [read_measurement(f.parent) for f in sorted(out.glob("*/measurement.json"))
                  if f.parent.name not in {r["model"] for r in rows}]
        write_section(args.doc, rows + others, "make caft")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
