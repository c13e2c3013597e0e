"""`longlens ground`: locate each phrase of a paragraph in an image (maps + supports).

    longlens ground IMAGE "PARAGRAPH" --out DIR [--json] [--model NAME] [--method patch|align|gradcam]

Heavy imports (torch, the models) happen inside the command functions.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from engine import limits
from engine.cli import common
from engine.errors import LonglensError
from engine.fileutil import atomic_write_text
from engine.grounding.items import check_caption, load_image
from engine.grounding.report import grounding_json, write_outputs


def register(sub: Any) -> None:
    sg = sub.add_parser("ground", help="locate each phrase of a paragraph in an image (maps + supports)")
    sg.add_argument("image", type=Path)
    sg.add_argument("paragraph", help="the text to ground (or - to read it from stdin)")
    sg.add_argument("--out", type=Path, required=True, help="folder for overlays, arrays and grounding.json")
    sg.add_argument("--json", action="store_true", help="print grounding.json to stdout")
    model_args(sg)
    sg.set_defaults(func=cmd_ground, flags={"model": "--model"})


def model_args(p: argparse.ArgumentParser) -> None:
    """--model, --method, --device and --text-tower, as `ground` and `check` take them (the ones not
    given come from the settings, as in the app's Inspector and Review panel)."""
    p.add_argument("--model", help="model to ground with (default: the settings' model)")
    p.add_argument("--method", choices=["patch", "align", "gradcam"],
                   help="map method (default: gradcam for BLIP; for sceneworld-mini its matching head's "
                        "phrase-patch alignment, or shifted patch similarity when the head has none)")
    p.add_argument("--device", help="auto, cpu, cuda, cuda:N or mps (default: the settings' device, auto)")
    p.add_argument("--text-tower", type=Path, help="a paragraph-trained text tower folder (default: the settings')")


def load_grounder(args: argparse.Namespace) -> Any:
    from engine.config import get_paths
    from engine.grounding import get_grounder
    from engine.services import Services

    args = common.with_settings(args)
    with Services(get_paths(args.home)) as svc:
        embedder = svc.embedder(args.model, device=args.device, text_tower=args.text_tower)
    grounder = get_grounder(embedder, method=args.method)
    if grounder is None:
        raise LonglensError(f"grounding is not available for model {embedder.model_id!r}")
    return grounder


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
        atomic_write_text(stage / "grounding.json", json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    if args.json:
        json.dump(report, sys.stdout, indent=2, ensure_ascii=False)
        sys.stdout.write("\n")
    else:
        print(f"{len(g.phrases)} phrases, verdict: {report['verdict']}; model {g.model_id} ({g.method}"
              f"{'' if g.calibrated else ', uncalibrated'})")
        for s in report["sentences"]:
            flag = "  LOW" if s["low_support"] else ""
            print(f"  sentence {s['index']}: {s['support']:.2f}{flag}  {s['text']}")
        for p in report["phrases"]:
            flag = "  LOW" if p["low_support"] else ""
            print(f"    {p['kind']:11} {p['support']:.2f}{flag}  {p['text']}")
        print(f"overlays and maps in {args.out}")
    return 0
