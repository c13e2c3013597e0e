"""`longlens eval`.

    longlens eval sceneworld [--split long|short --seed 1000 --n 1000 --model M --json]
    longlens eval BENCHMARK --root DIR [--split test] [--model M] [--compare M1 M2 ...]
                  [--text-tower DIR] [--max-tokens N] [--truncation] [--out REPORT_DIR] [--json]
    longlens eval grounding [--model M --seed --n --json]

BENCHMARK: flickr30k, coco, sharegpt4v, docci, sceneworld. A model is an installed name or a
model folder; in --compare, NAME@TOWER_DIR adds a text-tower override. The plain SceneWorld
form prints exactly what it always has; --compare/--truncation/--out use the report harness.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

from engine import options
from engine.cli import common
from engine.errors import LonglensError
from engine.text.inert import inert

GROUNDING = "grounding"
DEFAULT_REAL_MODEL = "blip-itm-base-coco"
DEFAULT_SCENEWORLD_MODEL = "sceneworld-mini"


def register(sub: Any) -> None:
    from engine.evaluation.loaders import BENCHMARKS

    se = sub.add_parser(
        "eval",
        help="measure retrieval Recall@K on a benchmark",
        description="Recall@1/5/10 (image→text and text→image) on a benchmark. Token budgets follow the "
        "paper: 77 for Flickr30k, COCO and ShareGPT4V (pass --max-tokens 128 for its data-efficiency "
        "table), 128 for DOCCI and SceneWorld.",
    )
    se.add_argument("benchmark", choices=[*BENCHMARKS, GROUNDING])
    se.add_argument("--root", type=Path, help="dataset folder (not for sceneworld/grounding)")
    se.add_argument("--split", help="sceneworld: long (default) or short; flickr30k/coco/docci: default test")
    se.add_argument("--seed", type=options.SEED, default=1000, help="scene seed (≥ 1000: never used in training)")
    se.add_argument("--n", type=options.SCENES, default=1000, help="number of test scenes")
    se.add_argument("--model", help="installed model name or model folder "
                    f"(default: {DEFAULT_SCENEWORLD_MODEL} for sceneworld/grounding, else {DEFAULT_REAL_MODEL})")
    se.add_argument("--compare", nargs="+", metavar="MODEL", help="more models (NAME or NAME@TEXT_TOWER_DIR) in one table")
    se.add_argument("--text-tower", type=Path, help="text-tower override for --model")
    se.add_argument("--max-tokens", type=options.TOKEN_BUDGET, help="token budget (default: the benchmark's)")
    se.add_argument("--truncation", action="store_true", help="also evaluate at 20/40/60/80/100/128 tokens")
    se.add_argument("--budgets", help="token budgets for --truncation, comma-separated")
    se.add_argument("--out", type=Path, help="write report.json, report.md (and truncation.png) here")
    se.add_argument("--annotations", type=Path, help="annotation file, if not the benchmark's usual name in --root")
    se.add_argument("--images", type=Path, help="image folder, if not the usual one under --root")
    se.add_argument("--limit", type=options.count("number of entries", 1, 100_000_000), help="sharegpt4v: only the first N entries (Long-CLIP protocol: 1000)")
    se.add_argument("--device", default="auto")
    se.add_argument("--json", action="store_true")
    se.set_defaults(func=cmd_eval, flags={"root": "--root", "annotations": "--annotations", "n": "--n", "model": "--model"})


def _load_model(ref: str, paths: Any, device: str, text_tower: Path | None) -> Any:
    """An installed name goes through the registry (files verified); otherwise a model folder."""
    from engine.models.registry import load_embedder
    from engine.training.bases import installed_dir, load_embedder_for, resolve_base

    if installed_dir(ref, paths) is None and Path(ref).expanduser().is_dir():
        return load_embedder_for(resolve_base(ref, paths), paths, device=device, text_tower_dir=text_tower)

    return load_embedder(ref, paths, device=device, text_tower_dir=text_tower)


def _model_specs(args: argparse.Namespace, default: str) -> list[tuple[str, Path | None]]:
    specs: list[tuple[str, Path | None]] = []
    if args.model or not args.compare:
        specs.append((args.model or default, args.text_tower))
    elif args.text_tower is not None:
        raise LonglensError("--text-tower applies to --model; in --compare write NAME@TEXT_TOWER_DIR")
    for item in args.compare or []:
        name, sep, tower = item.partition("@")
        if sep and not tower:
            raise LonglensError(f"--compare {item!r}: expected NAME@TEXT_TOWER_DIR")
        specs.append((name, Path(tower) if sep else None))
    return specs


EVAL_FILES = ("report.json", "report.md", "truncation.png", "grounding.json")


def _check_out(args: argparse.Namespace) -> None:
    from engine.outputs import check_output, library_roots

    if args.out is None:
        return
    inputs = [p for p in (args.root, args.annotations, args.images, args.text_tower) if p is not None]
    inputs += [Path(ref) for ref in [args.model, *(args.compare or [])] if ref and Path(ref).expanduser().exists()]
    check_output(args.out, what="report", kind="eval", folder=True, inputs=inputs,
                 library_roots=library_roots(args.home), own_files=EVAL_FILES)


def cmd_eval(args: argparse.Namespace) -> int:
    _check_out(args)
    if args.benchmark == GROUNDING:
        return _cmd_grounding(args)
    if args.benchmark == "sceneworld" and not (args.compare or args.truncation or args.out):
        return _cmd_sceneworld(args)
    return _cmd_harness(args)


def _cmd_sceneworld(args: argparse.Namespace) -> int:
    """The original `longlens eval sceneworld`: same output, same JSON."""
    from engine.evaluation.sceneworld import SPLITS

    split = args.split or "long"
    if split not in SPLITS:
        raise LonglensError(f"--split for sceneworld must be one of {', '.join(SPLITS)}, got {split!r}")
    paths = common.paths(args).ensure()
    from engine.evaluation.sceneworld import evaluate

    embedder = _load_model(args.model or DEFAULT_SCENEWORLD_MODEL, paths, args.device, args.text_tower)
    try:
        result = evaluate(embedder, split, args.seed, args.n, max_tokens=args.max_tokens)
    except ValueError as exc:
        raise LonglensError(str(exc)) from None
    if args.json:
        common.print_json(result)
    else:
        print(f"SceneWorld {result['split']} split, seed {result['seed']}, {result['n_images']} images, "
              f"model {result['model']} ({result['max_tokens']} tokens)")
        for d in ("i2t", "t2i"):
            print(f"  {d}: " + "  ".join(f"{k} {v:.3f}" for k, v in result[d].items()))
    return 0


def _budgets(text: str | None) -> tuple[int, ...]:
    from engine.evaluation.harness import TRUNCATION_BUDGETS

    if not text:
        return TRUNCATION_BUDGETS
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise LonglensError(f"--budgets expects comma-separated integers, got {text!r}") from None
    if not values or min(values) < 2:
        raise LonglensError("--budgets: every budget must be at least 2 tokens")
    return values


def _cmd_harness(args: argparse.Namespace) -> int:
    from engine.evaluation.harness import (
        build_report,
        embed_images,
        evaluate_set,
        render_markdown,
        truncation_analysis,
        write_report,
    )
    from engine.evaluation.loaders import load_benchmark

    budgets = _budgets(args.budgets)
    default = DEFAULT_SCENEWORLD_MODEL if args.benchmark == "sceneworld" else DEFAULT_REAL_MODEL
    specs = _model_specs(args, default)
    evalset = load_benchmark(args.benchmark, args.root, args.split, seed=args.seed, n=args.n,
                             annotations=args.annotations, images=args.images, limit=args.limit)
    paths = common.paths(args).ensure()
    say = (lambda msg: None) if args.json else (lambda msg: print(msg, file=sys.stderr, flush=True))
    image_cache: dict[str, Any] = {}  # the image tower does not change with a text-tower override
    results, truncation = [], {}
    for ref, tower in specs:
        embedder = _load_model(ref, paths, args.device, tower)
        if ref not in image_cache:
            say(f"embedding {evalset.n_images} images with {embedder.model_id} ...")
            image_cache[ref] = embed_images(embedder, evalset)
        say(f"encoding {len(evalset.texts)} texts with {embedder.text_model_id} ...")
        res = evaluate_set(embedder, evalset, max_tokens=args.max_tokens, image_emb=image_cache[ref])
        label = res["model"]
        if any(r["model"] == label for r in results):
            label = res["model"] = f"{label} ({ref}{'@' + str(tower) if tower else ''})"
        results.append(res)
        if args.truncation:
            truncation[label] = truncation_analysis(embedder, evalset, budgets, image_emb=image_cache[ref])
        del embedder
    report = build_report(evalset, results, truncation or None)
    files: dict[str, Path] = {}
    if args.out:
        from engine.outputs import staged_folder

        # report.json, report.md and the plot are one unit: written together, swapped in whole.
        with staged_folder(args.out, "eval") as stage:
            written = write_report(report, stage)
        files = {kind: Path(args.out) / path.name for kind, path in written.items()}
    if args.json:
        common.print_json({**report, "files": {k: str(v) for k, v in files.items()}})
    else:
        print(render_markdown(report))
        for kind, path in files.items():
            print(f"{kind}: {inert(path)}")
    return 0


def _cmd_grounding(args: argparse.Namespace) -> int:

    try:
        from engine.evaluation.grounding_benchmark import evaluate_grounding
    except ImportError as exc:
        raise LonglensError(f"grounding evaluation is not available in this build "
                            f"(engine.evaluation.grounding_benchmark cannot be imported: {exc})") from None
    paths = common.paths(args).ensure()
    embedder = _load_model(args.model or DEFAULT_SCENEWORLD_MODEL, paths, args.device, args.text_tower)
    result = evaluate_grounding(embedder, seed=args.seed, n=args.n)
    if dataclasses.is_dataclass(result) and not isinstance(result, type):
        result = dataclasses.asdict(result)
    if args.out:
        import json

        from engine.fileutil import atomic_write_text
        from engine.outputs import staged_folder

        with staged_folder(args.out, "eval") as stage:
            atomic_write_text(stage / "grounding.json", json.dumps(result, indent=2, default=str) + "\n")
    if args.json or not isinstance(result, dict):
        common.print_json(result)
    else:
        print(f"grounding on SceneWorld, seed {args.seed}, {args.n} scenes, model {embedder.text_model_id}")
        for k, v in result.items():
            print(f"  {k}: {v:.3f}" if isinstance(v, float) else f"  {k}: {v}")
    return 0
