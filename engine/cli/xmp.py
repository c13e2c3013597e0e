"""`longlens xmp export`: write review verdicts, notes and chosen keywords to XMP sidecars.

    longlens xmp export CAPTIONS.jsonl --convention lightroom|darktable [--keyword PATH ...]
        [--description] [--title] [--language LANG] [--replace-description] [--replace-title] [--dry-run]

Its own verb rather than a flag of another command: it is the only command that writes into the
user's photo folders, so it is never a side effect of something else (there is no `review` verb
to hang it on either: review happens in the app, on caption files).
"""

from __future__ import annotations

import argparse
from typing import Any

from engine.cli import common

XMP_FLAGS = {"convention": "--convention", "keywords": "--keyword", "language": "--language",
             "replace_description": "--replace-description", "replace_title": "--replace-title"}


def register(sub: Any) -> None:
    sx = sub.add_parser("xmp", help="XMP sidecars: export review results into them (only when asked)")
    xsub = sx.add_subparsers(dest="xmp_command", required=True)
    se = xsub.add_parser("export", help="write the verdicts, notes and chosen keywords of a reviewed caption file "
                         "into the pictures' XMP sidecars, merging into existing ones (backed up)")
    se.add_argument("captions", help="the reviewed caption file (JSONL or CSV), as opened in Review")
    se.add_argument("--convention", required=True, choices=("lightroom", "darktable"),
                    help="lightroom: IMG_0001.xmp (the picture's stem), for RAW files only (CR2, NEF, ARW, RAF...): "
                         "Lightroom and Camera Raw read no sidecar for JPEG, TIFF, PSD, PNG, HEIC or DNG, only the "
                         "XMP inside them, so those are not written; darktable: IMG_0001.CR2.xmp (the whole name, "
                         "any picture), as darktable and digiKam read them")
    se.add_argument("--keyword", action="append", default=[], dest="keywords", metavar="PATH",
                    help="a keyword to add to every exported picture ('Places|Norway' for a hierarchy); repeat it")
    se.add_argument("--description", action="store_true",
                    help="write each accepted (faithful) caption into dc:description, where every photo tool "
                         "shows it; a different description already there is kept unless --replace-description")
    se.add_argument("--title", action="store_true",
                    help="write a title into dc:title: the caption file's own 'title' for the item, else the "
                         "caption's first sentence; a different title already there is kept unless --replace-title")
    se.add_argument("--language", default="x-default", metavar="LANG",
                    help="the language entry (xml:lang) of the description and title: en, de, nb-NO... "
                         "(default x-default, the one every tool shows; a new one gets an x-default too)")
    se.add_argument("--replace-description", action="store_true",
                    help="replace a different description already in the sidecar (backed up first)")
    se.add_argument("--replace-title", action="store_true",
                    help="replace a different title already in the sidecar (backed up first)")
    se.add_argument("--dry-run", action="store_true", help="list what would change; write nothing")
    se.add_argument("--json", action="store_true")
    se.set_defaults(func=cmd_xmp_export, flags=XMP_FLAGS)


def cmd_xmp_export(args: argparse.Namespace) -> int:
    from engine.xmp_export import XmpTextOptions, export_xmp_job, field_summary, plan_xmp_export

    texts = XmpTextOptions(description=args.description, title=args.title, language=args.language,
                           replace_description=args.replace_description, replace_title=args.replace_title)
    with common.services(args) as svc:
        plan = plan_xmp_export(svc.catalog, args.captions, convention=args.convention, keywords=args.keywords,
                               texts=texts)
        last = common.run_job(lambda tok: export_xmp_job(plan, backup_root=svc.paths.data, dry_run=args.dry_run,
                                                         cancel=tok), quiet=True)
    summary = last.extra["summary"] if last is not None and "summary" in last.extra else None
    if summary is None:
        print("interrupted; the sidecars written so far are whole and backed up; the rest were skipped, not written")
        return 130
    if args.json:
        common.print_json(summary.as_dict())
    else:
        verb = {"create": "would create" if args.dry_run else "created",
                "update": "would update" if args.dry_run else "updated",
                "unchanged": "unchanged", "refused": "REFUSED", "skipped": "SKIPPED"}
        for r in summary.results:
            print(f"{verb[r.action]:13} {r.sidecar}  (for {r.picture})")
            for c in r.changes:
                print(f"    {c}")
            if r.reason:
                print(f"    {r.reason}")
            if r.backup:
                print(f"    previous sidecar backed up to {r.backup}")
        counts = ", ".join(f"{k} {v}" for k, v in sorted(summary.counts().items()))
        print(("dry run, nothing written: " if args.dry_run else "") + counts
              + (f"; items without a verdict or note: {plan.items_without_review}" if plan.items_without_review else ""))
        replace_flag = {"dc:description": "--replace-description", "dc:title": "--replace-title"}
        for name, line in field_summary(summary):
            kept = summary.field_counts()[name].get("kept: differs")
            print(line + (f" ({replace_flag[name]} replaces the kept ones)" if kept and name in replace_flag else ""))
        skipped = summary.counts().get("skipped", 0)
        if summary.cancelled or skipped:
            written = sum(summary.counts().get(a, 0) for a in ("create", "update"))
            print(("interrupted: " if summary.cancelled else "stopped: ")
                  + f"{written} sidecar(s) written (each whole, and backed up), {skipped} skipped, not written")
    # Exit status: 130 for a cancelled run (Ctrl+C), 1 when any sidecar was refused or skipped.
    if summary.cancelled:
        return 130
    return 1 if any(r.action in ("refused", "skipped") for r in summary.results) else 0
