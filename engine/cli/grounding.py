"""`longlens ground`: locate each phrase of a paragraph in an image (maps + supports), and
`longlens grounding calibrate`: fit a model's support calibration.

    longlens ground IMAGE "PARAGRAPH" --out DIR [--json] [--model NAME] [--method patch|align|gradcam|value]
    longlens grounding calibrate [--model NAME] (--data LABELLED.jsonl | --sceneworld N) [--seed S] [--json]

Heavy imports (torch, the models) happen inside the command functions.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from engine import limits
from engine.cli import common
from engine.errors import LonglensError
from engine.fileutil import atomic_write_text
from engine.grounding.items import check_caption, load_image
from engine.grounding.report import grounding_json, write_outputs
from engine.text.inert import inert, json_text


def register(sub: Any) -> None:
    sg = sub.add_parser("ground", help="locate each phrase of a paragraph in an image (maps + supports)")
    sg.add_argument("image", type=Path)
    sg.add_argument("paragraph", help="the text to ground (or - to read it from stdin)")
    sg.add_argument("--out", type=Path, required=True, help="folder for overlays, arrays and grounding.json")
    sg.add_argument("--json", action="store_true", help="print grounding.json to stdout")
    model_args(sg)
    sg.set_defaults(func=cmd_ground, flags=GROUND_FLAGS)

    from engine import options
    from engine.grounding.calibration import VALIDATION_SEED

    gp = sub.add_parser("grounding", help="fit a model's support calibration (grounding calibrate)")
    gsub = gp.add_subparsers(dest="grounding_cmd", metavar="{calibrate}", required=True)
    gc = gsub.add_parser(
        "calibrate", help="fit a model's support calibration on labelled captions or on SceneWorld",
        description="Fit the support calibration of a model's grounding (Platt scaling per level: phrase, "
        "relation, sentence, so that 0.5 means undecided) and store it in the Longlens home, keyed by the "
        "model's weights: `ground`, `check` and the app use it from then on. --data: a JSONL or CSV caption "
        "file (image, caption, label: true/false per caption; CSV needs a header). --sceneworld N: N "
        "generated SceneWorld validation scenes (true captions and one-detail-wrong ones). See docs/grounding.md.")
    gc.add_argument("--model", help="model to calibrate (default: the settings' model)")
    # One of the two is needed; the engine says so (naming both), argparse refuses both at once.
    source = gc.add_mutually_exclusive_group()
    source.add_argument("--data", type=Path, metavar="LABELLED", help="a caption file with a label per caption")
    source.add_argument("--sceneworld", type=options.SCENES, metavar="N", help="fit on N SceneWorld validation scenes")
    gc.add_argument("--seed", type=options.SEED, default=VALIDATION_SEED,
                    help=f"SceneWorld validation seed, 1000-1999 (default {VALIDATION_SEED})")
    gc.add_argument("--method", choices=METHODS, help="map method whose relation geometry is fitted (default: "
                    "the model's default method)")
    gc.add_argument("--device", help="auto, cpu, cuda, cuda:N or mps (default: the settings' device, auto)")
    gc.add_argument("--text-tower", type=Path, help="a paragraph-trained text tower folder (default: the settings')")
    gc.add_argument("--json", action="store_true", help="print the summary as JSON")
    gc.add_argument("--quiet", action="store_true", help="no progress bar")
    gc.set_defaults(func=cmd_calibrate, flags=CALIBRATE_FLAGS)


METHODS = ["patch", "align", "gradcam", "value", "context"]
GROUND_FLAGS = {"model": "--model", "method": "--method"}
CALIBRATE_FLAGS = {"model": "--model", "data": "--data", "scenes": "--sceneworld", "seed": "--seed",
                   "method": "--method"}


def model_args(p: argparse.ArgumentParser) -> None:
    """--model, --method, --device and --text-tower, as `ground` and `check` take them (the ones not
    given come from the settings, as in the app's Inspector and Review panel)."""
    p.add_argument("--model", help="model to ground with (default: the settings' model)")
    p.add_argument("--method", choices=METHODS,
                   help="map method (default: gradcam for BLIP; value, the value-path patch embeddings, for "
                        "CLIP models, which also take gradcam; for sceneworld-mini its matching head's "
                        "phrase-patch alignment, or shifted patch similarity when the head has none; "
                        "context, for the CAFT-style variant only: its phrases pooled in context)")
    p.add_argument("--device", help="auto, cpu, cuda, cuda:N or mps (default: the settings' device, auto)")
    p.add_argument("--text-tower", type=Path, help="a paragraph-trained text tower folder (default: the settings')")


def load_embedder(args: argparse.Namespace) -> Any:
    from engine.config import get_paths
    from engine.services import Services

    args = common.with_settings(args)
    with Services(get_paths(args.home)) as svc:
        return svc.embedder(args.model, device=args.device, text_tower=args.text_tower)


def load_grounder(args: argparse.Namespace) -> Any:
    """The grounder `ground` and `check` use: the settings' model unless named, with the
    calibrations fitted in this home (`grounding calibrate`) before the shipped ones."""
    from engine.config import get_paths
    from engine.grounding import get_grounder

    embedder = load_embedder(args)
    try:
        grounder = get_grounder(embedder, method=args.method, paths=get_paths(args.home))
    except ValueError as exc:  # a backend's refusal of a method it does not have
        raise LonglensError(str(exc), settings=("method",)) from None
    if grounder is None:
        raise LonglensError(f"grounding is not available for model {embedder.model_id!r}")
    return grounder


def uncalibrated_note(g: Any) -> str | None:
    """What `ground` and `check` print when supports are not calibrated for the model's weights."""
    if g.calibrated:
        return None
    return (f"note: supports are uncalibrated for model {g.model_id} (no calibration fitted for these weights, "
            f"so 0.5 is not 'undecided'); fit one with `longlens grounding calibrate --model {g.model_id} "
            "--data LABELLED.jsonl` or `--sceneworld N`")


def library_roots(args: argparse.Namespace) -> list[Path]:
    from engine.outputs import library_roots

    return library_roots(args.home)


GROUND_FILES = ("grounding.json", "phrase_*.png", "maps.npz")


def cmd_ground(args: argparse.Namespace) -> int:
    from engine.outputs import check_output, staged_folder

    # At most one character past the limit is read from stdin: enough to know it is too long.
    text = sys.stdin.read(limits.MAX_CAPTION_CHARS + 1) if args.paragraph == "-" else args.paragraph
    problem = limits.query_problem(text) if text.strip() else None
    if problem is not None:
        raise LonglensError(problem)
    check_caption(text)
    check_output(args.out, what="output", kind="ground", folder=True, inputs=[args.image],
                 library_roots=library_roots(args), own_files=GROUND_FILES)
    image = load_image(args.image)
    grounder = load_grounder(args)
    g = grounder.ground(image, text, image_path=str(args.image))
    report = {"image": str(args.image), "text": text, **grounding_json(g)}
    # The folder is one unit: overlays, arrays and grounding.json are written into a fresh
    # folder that replaces the old one whole, so a killed run never mixes two runs' files.
    with staged_folder(args.out, "ground") as stage:
        report["files"] = write_outputs(image, g, stage)
        atomic_write_text(stage / "grounding.json", json_text(report, indent=2) + "\n")
    if args.json:
        common.print_json(report)
    else:
        print(f"{len(g.phrases)} phrases, verdict: {report['verdict']}; model {inert(g.model_id)} ({g.method}"
              f"{'' if g.calibrated else ', uncalibrated'})")
        for s in report["sentences"]:
            flag = "  LOW" if s["low_support"] else ""
            print(f"  sentence {s['index']}: {s['support']:.2f}{flag}  {inert(s['text'])}")
        for p in report["phrases"]:
            flag = "  LOW" if p["low_support"] else ""
            print(f"    {p['kind']:11} {p['support']:.2f}{flag}  {inert(p['claim'])}")  # a relation's claim, not "on"
        print(f"overlays and maps in {inert(args.out)}")
    note = uncalibrated_note(g)
    if note is not None:
        print(note, file=sys.stderr)
    return 0


CALIBRATE_BARS = common.Bars(unit=lambda stage: "scene" if stage == "scenes" else "caption", need_total=True)


def cmd_calibrate(args: argparse.Namespace) -> int:
    from engine.config import get_paths
    from engine.evaluation.grounding_calibration import CalibrationRequest, calibrate_job
    from engine.grounding.calibration import user_calibration_file

    embedder = load_embedder(args)
    req = CalibrationRequest(data=args.data, scenes=args.sceneworld, seed=args.seed, method=args.method)
    out = user_calibration_file(get_paths(args.home))
    try:
        last = common.run_job(lambda tok: calibrate_job(embedder, req, out, tok), quiet=args.quiet or args.json,
                              bars=CALIBRATE_BARS, stopping="\nstopping: nothing will be stored (Ctrl+C again to abort) ...")
    except ValueError as exc:  # a backend's refusal of a method it does not have
        raise LonglensError(str(exc), settings=("method",)) from None
    summary = dict(last.extra) if last is not None else {}
    if args.json:
        common.print_json(summary)
    else:
        for text in summary.get("problems", [])[:20]:
            print(inert(text), file=sys.stderr)
        if summary.get("skipped", 0) > 20:
            print(f"... and {summary['skipped'] - 20} more (--json lists them all)", file=sys.stderr)
        for level, info in summary.get("levels", {}).items():
            counts = f"{info['positives']} true / {info['negatives']} false"
            state = f"fitted, AUC {info['auc']:.3f} on these data" if info.get("fitted") else f"not fitted: {info['why']}"
            print(f"  {level:9} {counts}: {state}")
        if last is not None:
            print(inert(last.message, layout=True))
    return 1 if summary.get("skipped") else 0
