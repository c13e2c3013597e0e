"""`longlens ground` and `longlens check`: grounding from the command line.

    longlens ground IMAGE "PARAGRAPH" --out DIR [--json] [--model NAME] [--method patch|align|gradcam]
    longlens check FILE --out REPORT.jsonl [--html REPORT.html] [--threshold 0.5] [--model NAME]

Heavy imports (torch, the models) happen inside the command functions.
"""

from __future__ import annotations

import argparse
import html
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from engine import limits
from engine.errors import LonglensError
from engine.fileutil import atomic_write_text
from engine.options import THRESHOLD

LOW_SUPPORT = 0.5
# Saved full-resolution maps are capped at this many pixels on the long side (a 24 MP photo
# would otherwise give a gigabyte of float32 per paragraph).
MAX_MAP_SIDE = 1024


def register(sub: Any) -> None:
    sg = sub.add_parser("ground", help="locate each phrase of a paragraph in an image (maps + supports)")
    sg.add_argument("image", type=Path)
    sg.add_argument("paragraph", help="the text to ground (or - to read it from stdin)")
    sg.add_argument("--out", type=Path, required=True, help="folder for overlays, arrays and grounding.json")
    sg.add_argument("--json", action="store_true", help="print grounding.json to stdout")
    _model_args(sg)
    sg.set_defaults(func=cmd_ground)

    sc = sub.add_parser("check", help="check captions against their images (support per sentence/phrase)")
    sc.add_argument("file", type=Path, help="JSONL or CSV with an image path and a caption per line")
    sc.add_argument("--out", type=Path, required=True, help="report: one JSON object per input line")
    sc.add_argument("--html", type=Path, help="also write an HTML report with the overlays")
    sc.add_argument("--threshold", type=THRESHOLD, default=LOW_SUPPORT,
                    help="supports below this are flagged low (default 0.5: undecided)")
    _model_args(sc)
    sc.set_defaults(func=cmd_check)


def _model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="model to ground with (default: the settings' model)")
    p.add_argument("--method", choices=["patch", "align", "gradcam"],
                   help="map method (default: gradcam for BLIP; for sceneworld-mini its matching head's "
                        "phrase-patch alignment, or shifted patch similarity when the head has none)")
    p.add_argument("--device", default="auto")


def _grounder(args: argparse.Namespace) -> Any:
    from engine.config import get_paths
    from engine.grounding import get_grounder
    from engine.services import Services

    with Services(get_paths(args.home)) as svc:
        embedder = svc.embedder(args.model, device=args.device)
    grounder = get_grounder(embedder, method=args.method)
    if grounder is None:
        raise LonglensError(f"grounding is not available for model {embedder.model_id!r}")
    return grounder


def _load_image(path: Path) -> Any:
    from engine.errors import DecodeError
    from engine.indexing.decode import decode_image

    if not path.exists():
        raise LonglensError(f"image not found: {path}")
    if not path.is_file():
        raise LonglensError(f"not a file: {path}")
    try:
        image, _ = decode_image(path)
    except DecodeError as exc:
        raise LonglensError(f"cannot read image {path}: {exc}") from None
    return image


def _check_text(text: str) -> str:
    if not isinstance(text, str) or not text.strip():
        raise LonglensError("the caption is empty")
    too_big = limits.caption_problem(text)
    if too_big is not None:
        raise LonglensError(too_big)
    if not any(ch.isalnum() for ch in text):
        raise LonglensError("the caption has no words")
    return text


def grounding_json(g: Any, threshold: float = LOW_SUPPORT) -> dict[str, Any]:
    sents = []
    for i, (s, e) in enumerate(g.sentences):
        sup = g.sentence_supports[i] if i < len(g.sentence_supports) else None
        sents.append({"index": i, "text": g.text[s:e], "start": s, "end": e,
                      "support": None if sup is None else round(float(sup), 4),
                      "low_support": bool(sup is not None and sup < threshold)})
    phrases = []
    for i, pm in enumerate(g.phrases):
        p = pm.phrase
        phrases.append({"index": i, "text": p.text, "kind": p.kind, "start": p.start, "end": p.end,
                        "sentence": pm.sentence, "claim": p.claim, "support": round(float(pm.support), 4),
                        "low_support": bool(pm.support < threshold)})
    supports = [s["support"] for s in sents if s["support"] is not None]
    if not supports:
        verdict = "no claims"
    elif all(s >= threshold for s in supports):
        verdict = "supported"
    elif all(s < threshold for s in supports):
        verdict = "not supported"
    else:
        verdict = "partly supported"
    return {"model": g.model_id, "method": g.method, "calibrated": g.calibrated, "verdict": verdict,
            "support": round(min(supports), 4) if supports else None, "sentences": sents, "phrases": phrases}


def _slug(text: str, n: int = 32) -> str:
    keep = "".join(ch if ch.isalnum() else "-" for ch in text.lower())
    return "-".join(x for x in keep.split("-") if x)[:n] or "phrase"


def write_outputs(image: Any, g: Any, out: Path, prefix: str = "") -> dict[str, Any]:
    """Overlay PNGs per phrase and the maps as arrays (patch and image resolution)."""
    import numpy as np

    from engine.grounding.maps import overlay, upsample

    out.mkdir(parents=True, exist_ok=True)
    w, h = image.size
    scale = min(1.0, MAX_MAP_SIDE / max(w, h))
    mw, mh = max(1, round(w * scale)), max(1, round(h * scale))
    files = []
    patch = np.stack([pm.heatmap for pm in g.phrases]) if g.phrases else np.zeros((0, 1, 1), np.float32)
    full = np.stack([upsample(m, mw, mh) for m in patch]) if len(patch) else np.zeros((0, mh, mw), np.float32)
    for i, pm in enumerate(g.phrases):
        name = f"{prefix}phrase_{i:02d}_{_slug(pm.phrase.text)}.png"
        overlay(image, pm.heatmap).save(out / name)
        files.append(name)
    arrays = f"{prefix}maps.npz"
    np.savez_compressed(out / arrays, patch=patch.astype(np.float32), image=full.astype(np.float16))
    return {"overlays": files, "arrays": arrays, "array_shapes": {"patch": list(patch.shape), "image": list(full.shape)}}


def _library_roots(args: argparse.Namespace) -> list[Path]:
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
    _check_text(text)
    check_output(args.out, what="output", kind="ground", folder=True, inputs=[args.image],
                 library_roots=_library_roots(args), own_files=GROUND_FILES)
    image = _load_image(args.image)
    grounder = _grounder(args)
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


# --------------------------------------------------------------------------- check


def read_items(path: Path) -> Iterator[tuple[int, dict[str, Any] | None, str | None]]:
    """(line number, {"image", "caption"} or None, error or None) for each data line, read by
    engine.text.captions (the one caption-file reader: its keys, bounds and messages)."""
    from engine.text.captions import RowProblem, read_captions

    # Image and caption are taken as found: a missing image or an empty caption is reported
    # when the line is checked.
    for row in read_captions(path, check_image=False, empty_ok=True, error=LonglensError):
        if isinstance(row, RowProblem):
            yield row.line_no, None, row.reason
        else:
            yield row.line_no, {"image": str(row.image), "caption": row.caption or ""}, None


def _check_outputs(args: argparse.Namespace, items: list[tuple[int, dict[str, Any] | None, str | None]]) -> Path | None:
    """Refuse outputs that would overwrite an input, a photo or a library file; the assets folder
    of the HTML report (REPORT_files) may only be an earlier report's."""
    from engine.outputs import OutputPathError, check_output

    inputs: list[Path] = [args.file] + [Path(item["image"]) for _, item, _ in items if item is not None]
    roots = _library_roots(args)
    check_output(args.out, what="report", kind="check-report", inputs=inputs, library_roots=roots)
    if args.html is None:
        return None
    check_output(args.html, what="HTML report", kind="check-html", inputs=inputs, library_roots=roots)
    if args.html.expanduser().resolve() == args.out.expanduser().resolve():
        raise OutputPathError(f"the report and the HTML report are the same file {args.out}; give two paths")
    html_dir = args.html.with_name(args.html.stem + "_files")
    resolved_dir = html_dir.expanduser().resolve()
    if args.out.expanduser().resolve().is_relative_to(resolved_dir):
        raise OutputPathError(f"the report {args.out} is inside the HTML report's asset folder {html_dir}, "
                              "which each run replaces; choose a path outside it")
    check_output(html_dir, what="HTML report's asset", kind="check-assets", folder=True, inputs=inputs,
                 library_roots=roots, own_files=("line[0-9][0-9][0-9][0-9][0-9]_*",))
    return html_dir


def cmd_check(args: argparse.Namespace) -> int:
    from engine.outputs import ReportAssets

    THRESHOLD.check(args.threshold)
    items = list(read_items(args.file))
    if not items:
        raise LonglensError(f"{args.file} holds no lines to check")
    html_dir = _check_outputs(args, items)
    grounder = _grounder(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    # A report is one unit: this run's overlays and arrays go into a folder of their own under
    # REPORT_files/, which the page names only once it is complete (see engine/outputs.py).
    assets = ReportAssets.begin(html_dir, "check-assets") if html_dir is not None else None
    try:
        counts, records, errors = _check_lines(args, items, grounder, assets)
        # The reports are written whole at the end (temp file + rename): an interrupted check
        # leaves the previous report, never half of a new one.
        if assets is not None:
            assets.commit()
        atomic_write_text(args.out, "".join(json.dumps(rec, ensure_ascii=False) + "\n" for rec in records))
        if assets is not None:
            atomic_write_text(args.html, _html_report(records, html_dir.name, args.threshold, assets.run_id))
            assets.prune()
    except BaseException:
        if assets is not None:
            assets.abort()
        raise
    summary = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
    print(f"checked {len(items)} lines: {summary}; report in {args.out}"
          + (f", HTML in {args.html}" if args.html else ""))
    return 1 if errors else 0


def _check_lines(args: argparse.Namespace, items: list[tuple[int, dict[str, Any] | None, str | None]],
                 grounder: Any, assets: Any) -> tuple[dict[str, int], list[dict[str, Any]], int]:
    errors = 0
    counts: dict[str, int] = {}
    records = []
    for line, item, error in items:
        rec: dict[str, Any] = {"line": line}
        image = None
        if item is not None:
            rec.update(item)
            try:
                _check_text(item["caption"])
                image = _load_image(Path(item["image"]))
                g = grounder.ground(image, item["caption"], image_path=item["image"])
                rec.update(grounding_json(g, args.threshold))
                if assets is not None:
                    files = write_outputs(image, g, assets.staging, prefix=f"line{line:05d}_")
                    # Named relative to REPORT_files/, as the page links them.
                    run = assets.folder_name
                    files["overlays"] = [f"{run}/{name}" for name in files["overlays"]]
                    files["arrays"] = f"{run}/{files['arrays']}"
                    rec["files"] = files
            except LonglensError as exc:
                error = str(exc)
        if error is not None:
            rec.update({"verdict": "error", "error": error})
            errors += 1
            print(f"{args.file}:{line}: {error}", file=sys.stderr)
        counts[rec["verdict"]] = counts.get(rec["verdict"], 0) + 1
        records.append(rec)
    return counts, records, errors


def _tint(support: float | None) -> str:
    if support is None:
        return "#ddd"
    s = max(0.0, min(1.0, float(support)))
    return f"hsl({int(120 * s)}, 70%, 80%)"


def _html_report(records: list[dict[str, Any]], files_dir: str, threshold: float, run_id: str = "") -> str:
    parts = ["<!doctype html><meta charset='utf-8'><title>Longlens caption check</title>",
             f"<meta name='longlens-run' content='{html.escape(run_id)}'>",
             "<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto}"
             ".item{border-top:1px solid #ccc;padding:1em 0}.ov{display:inline-block;margin:4px;"
             "font-size:12px;width:200px;vertical-align:top}.ov img{width:200px}"
             "span.s{padding:1px 2px;border-radius:3px}.err{color:#b00}</style>",
             f"<h1>Caption check</h1><p>Tint: support (red low, green high); threshold {threshold}.</p>"]
    for r in records:
        parts.append(f"<div class='item'><h3>line {r['line']}: {html.escape(str(r.get('image', '')))}"
                     f" &mdash; {html.escape(r['verdict'])}</h3>")
        if r["verdict"] == "error":
            parts.append(f"<p class='err'>{html.escape(r.get('error', ''))}</p></div>")
            continue
        parts.append("<p>" + " ".join(
            f"<span class='s' style='background:{_tint(s['support'])}' title='support {s['support']}'>"
            f"{html.escape(s['text'])}</span>" for s in r["sentences"]) + "</p>")
        for p, f in zip(r["phrases"], r.get("files", {}).get("overlays", []), strict=False):
            parts.append(f"<div class='ov'><img src='{html.escape(files_dir)}/{html.escape(f)}'><br>"
                         f"<span class='s' style='background:{_tint(p['support'])}'>{html.escape(p['text'])}"
                         f"</span> {p['support']:.2f}</div>")
        parts.append("</div>")
    return "\n".join(parts) + "\n"
