"""`longlens duplicates`: exact copies, near-duplicates and visually similar pictures in the
indexed libraries (engine.duplicates). Nothing is deleted: the groups are listed, and exported
with --out."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from engine import options
from engine.cli import common
from engine.text.inert import inert

DEFAULT_NEAR_DISTANCE = 6  # engine.duplicates.DEFAULT_NEAR_DISTANCE (a test checks they agree)
KIND_WORDS = {"exact": "exact copies", "near": "near-duplicates", "similar": "visually similar"}


def cmd_duplicates(args: argparse.Namespace) -> int:
    from engine.duplicates import PhashCache, check_export_path, export_report, find_duplicates
    from engine.models.download import human_size

    with common.services(args) as svc:
        roots = [lib.root for lib in svc.catalog.libraries()]
        if args.out is not None:
            check_export_path(args.out, roots)  # before any work: a bad path is refused at once
        identity = name = None
        if args.similar is not None:
            from engine.models.registry import installed_identity

            name = svc.default_model_name(args.model)
            identity = installed_identity(name, svc.paths).image
        cache = PhashCache(svc.paths.cache / "phash.sqlite3")
        from engine.errors import JobCancelled

        try:
            last = common.run_job(
                lambda tok: find_duplicates(svc.catalog, svc.store, library_roots=args.library,
                                            near_distance=args.near, similar=args.similar,
                                            model_identity=identity, model_name=name, phash_cache=cache,
                                            cancel=tok),
                quiet=args.json or args.quiet, bars=common.Bars(unit="img", need_total=True))
        except JobCancelled:
            raise JobCancelled(_not_done(args)) from None
        finally:
            cache.close()
        report = last.extra["report"] if last is not None and "report" in last.extra else None
        if report is None:
            raise JobCancelled(_not_done(args))
        if args.out is not None:
            dest = export_report(report, args.out, roots)
        if args.json:
            common.print_json(report.as_dict())
        else:
            counts = " · ".join(f"{KIND_WORDS[k]}: {report.count(k)}" for k in KIND_WORDS)
            print(f"{counts} group(s), among {report.looked_at} pictures in {len(report.libraries)} "
                  f"librar{'y' if len(report.libraries) == 1 else 'ies'}")
            for n, g in enumerate(report.groups, start=1):
                print(f"[{n}] {KIND_WORDS[g.kind]} · {len(g.files)} files · {human_size(g.total_bytes)} · {inert(g.detail)}")
                for f in g.files:
                    mark = "*" if f.date_source == "file time" else " "
                    print(f"    {human_size(f.size):>10}  {f.date[:16].replace('T', ' '):16}{mark}  {inert(f.path)}")
            if any(f.date_source == "file time" for g in report.groups for f in g.files):
                print("* no EXIF, XMP or IPTC date: the date shown is the file's modification time")
            for u in report.unreadable:
                print(f"  unreadable (no perceptual hash): {inert(u['path'])}: {inert(u['reason'])}")
            for note in report.notes:
                print(f"note: {inert(note, layout=True)}")
            print("Nothing was deleted or changed: Longlens only lists duplicates.")
        if args.out is not None:
            print(f"wrote the list to {inert(dest)}", file=sys.stderr)
    return 0


def _not_done(args: argparse.Namespace) -> str:
    """What an interrupted `duplicates` did and did not do."""
    written = f"; no list was written to {inert(args.out)}" if args.out is not None else ""
    return f"stopped before the groups were complete: none is listed{written} (nothing was changed)"


DUPLICATES_FLAGS = {"library": "--library", "model": "--model", "out": "--out", "near_distance": "--near",
                    "similar": "--similar"}


def register(sub: Any) -> None:
    sd = sub.add_parser("duplicates", help="list exact copies, near-duplicates and visually similar pictures "
                        "(nothing is deleted)")
    sd.add_argument("--library", action="append", metavar="FOLDER",
                    help="an indexed folder to look in (repeat for several; default: every library)")
    sd.add_argument("--near", type=options.PHASH_DISTANCE, default=DEFAULT_NEAR_DISTANCE, metavar="BITS",
                    help="near-duplicates: perceptual hashes (64 bits, of the upright picture) at most BITS apart "
                         f"(default {DEFAULT_NEAR_DISTANCE})")
    sd.add_argument("--similar", type=options.SIMILARITY_THRESHOLD, metavar="THRESHOLD",
                    help="also group visually similar pictures: embedding cosine similarity at least THRESHOLD "
                         "(e.g. 0.9), with the model in use (default: not looked for)")
    sd.add_argument("--model", help="the model whose vectors --similar compares (default: the settings')")
    sd.add_argument("--out", help="export the list to FILE.csv or FILE.json (written atomically)")
    sd.add_argument("--json", action="store_true")
    sd.add_argument("--quiet", action="store_true", help="no progress bar")
    sd.set_defaults(func=cmd_duplicates, flags=DUPLICATES_FLAGS)
