"""`longlens check`: check captions against their images (support per sentence and phrase).

    longlens check FILE --out REPORT.jsonl [--html REPORT.html] [--threshold 0.5] [--model NAME]
    longlens check --from-catalog [--library FOLDER] --out REPORT.jsonl ...   (the XMP descriptions)

Heavy imports (torch, the models) happen inside the command functions.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from engine.cli.grounding import GROUND_FLAGS, library_roots, load_grounder, model_args, uncalibrated_note
from engine.errors import LonglensError
from engine.fileutil import atomic_write_text
from engine.grounding.items import check_caption, load_image, read_items
from engine.grounding.report import LOW_SUPPORT, grounding_json, html_report, write_outputs
from engine.options import THRESHOLD
from engine.text.inert import inert, json_text


def register(sub: Any) -> None:
    sc = sub.add_parser("check", help="check captions against their images (support per sentence/phrase)")
    sc.add_argument("file", type=Path, nargs="?", help="JSONL or CSV with an image path and a caption per line")
    sc.add_argument("--from-catalog", action="store_true",
                    help="check the captions already in the catalogue instead of a file: each indexed picture's "
                         "XMP description (else its title), as Lightroom, darktable or digiKam wrote it")
    sc.add_argument("--library", action="append", default=[], metavar="FOLDER",
                    help="with --from-catalog: only this indexed library (repeat it); default all")
    sc.add_argument("--out", type=Path, required=True, help="report: one JSON object per input line")
    sc.add_argument("--html", type=Path, help="also write an HTML report with the overlays")
    sc.add_argument("--threshold", type=THRESHOLD, default=LOW_SUPPORT,
                    help="supports below this are flagged low (default 0.5: undecided)")
    model_args(sc)
    sc.set_defaults(func=cmd_check, flags={**GROUND_FLAGS, "library": "--library"})


def _check_outputs(args: argparse.Namespace, items: list[tuple[int, dict[str, Any] | None, str | None]]) -> Path | None:
    """Refuse outputs that would overwrite an input, a photo or a library file; the assets folder
    of the HTML report (REPORT_files) may only be an earlier report's."""
    from engine.outputs import OutputPathError, check_output

    inputs: list[Path] = ([args.file] if args.file is not None else []) + [Path(item["image"]) for _, item, _ in items if item is not None]
    roots = library_roots(args)
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
    items = _items(args)
    args.source_name = "the catalogue" if args.from_catalog else str(args.file)
    if not items:
        raise LonglensError(f"{args.source_name} holds no lines to check")
    html_dir = _check_outputs(args, items)
    grounder = load_grounder(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    # A report is one unit: this run's overlays and arrays go into a folder of their own under
    # REPORT_files/, which the page names only once it is complete (see engine/outputs.py).
    assets = ReportAssets.begin(html_dir, "check-assets") if html_dir is not None else None
    records: list[dict[str, Any]] = []
    writing = False
    try:
        counts, errors = _check_lines(args, items, grounder, assets, records)
        # The reports are written whole at the end (temp file + rename): an interrupted check
        # leaves the previous report, never half of a new one.
        writing = True
        if assets is not None:
            assets.commit()
        atomic_write_text(args.out, "".join(json_text(rec) + "\n" for rec in records))
        if assets is not None:
            atomic_write_text(args.html, html_report(records, html_dir.name, args.threshold, assets.run_id))
            assets.prune()
    except BaseException as exc:
        if assets is not None:
            assets.abort()
        if isinstance(exc, KeyboardInterrupt):
            # What was done and what was not, before main() exits 130.
            if writing:
                print("interrupted while writing the reports: each is whole, this run's or the one before",
                      file=sys.stderr)
            else:
                print(f"interrupted after checking {len(records)} of {len(items)} lines: no report was written "
                      f"({inert(args.out)} is as it was)", file=sys.stderr)
        raise
    summary = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
    print(f"checked {len(items)} lines: {summary}; report in {inert(args.out)}"
          + (f", HTML in {inert(args.html)}" if args.html else ""))
    note = uncalibrated_note(grounder)
    if note is not None and any(rec.get("calibrated") is False for rec in records):
        print(note, file=sys.stderr)
    return 1 if errors else 0


def _items(args: argparse.Namespace) -> list[tuple[int, dict[str, Any] | None, str | None]]:
    """The captions to check: the file's lines, or (--from-catalog) the XMP descriptions in the
    catalogue, numbered 1.. in library and path order."""
    if args.from_catalog == (args.file is not None):
        raise LonglensError("give a caption file or --from-catalog (one of the two)")
    if args.library and not args.from_catalog:
        raise LonglensError("--library goes with --from-catalog")
    if args.file is not None:
        return list(read_items(args.file))
    from engine.cli import common
    from engine.metadata.captions import require_catalog_captions

    with common.services(args) as svc:
        captions = require_catalog_captions(svc.catalog, args.library)  # the app's Review checks the same
    return [(n, {"image": str(c.image), "caption": c.caption, "caption_source": c.field}, None)
            for n, c in enumerate(captions, 1)]


def _check_lines(args: argparse.Namespace, items: list[tuple[int, dict[str, Any] | None, str | None]],
                 grounder: Any, assets: Any, records: list[dict[str, Any]]) -> tuple[dict[str, int], int]:
    """Check each line, appending its record to `records` (so an interrupted run knows how far it
    got); returns the counts per verdict and the number of lines in error."""
    errors = 0
    counts: dict[str, int] = {}
    for line, item, error in items:
        rec: dict[str, Any] = {"line": line}
        image = None
        if item is not None:
            rec.update(item)
            try:
                check_caption(item["caption"])
                image = load_image(Path(item["image"]))
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
            print(f"{inert(args.source_name)}:{line}: {inert(error)}", file=sys.stderr)
        counts[rec["verdict"]] = counts.get(rec["verdict"], 0) + 1
        records.append(rec)
    return counts, errors
