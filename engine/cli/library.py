"""`longlens paths`, `index`, `libraries` and `check-catalog`: where the data lives, indexing
folders, and the catalog's state."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

from engine import options
from engine.cli import common
from engine.errors import JobCancelled
from engine.text.inert import inert


def cmd_paths(args: argparse.Namespace) -> int:
    paths = common.paths(args)
    if args.json:
        common.print_json(paths.as_dict())
    else:
        for k, v in paths.as_dict().items():
            print(f"{k:8} {inert(v)}")
    return 0


def summary_text(s: dict) -> str:
    lines = [
        f"library  {inert(s['root'])}  (model {inert(s['model_id'])})",
    ]
    if s["offline"]:
        lines.append("  OFFLINE: the folder is missing or unmounted; nothing was changed")
        return "\n".join(lines)
    lines.append(
        f"  scanned {s['scanned']}  new {s['new']}  changed {s['changed']}  moved {s['moved']}  "
        f"unchanged {s['unchanged']}  deleted {s['deleted']}  embedded {s['embedded']}  "
        f"reused {s['reused']}  in {s['elapsed_s']:.1f}s"
    )
    for m in s.get("merged_libraries") or ():
        n = m["pictures"]
        held = f", {m['already_held']} it held as well" if m.get("already_held") else ""
        lines.append(f"  merged: the library {m['root']} lies inside this folder; its {n} "
                     f"picture{' is' if n == 1 else 's are'} this library's now (nothing re-embedded{held})")
    if s.get("xmp_reread"):
        lines.append(f"  metadata: {s['xmp_reread']} pictures' XMP read again (sidecar added, edited or removed, "
                     "or a RAW+JPEG pair taken otherwise); "
                     "not re-embedded")
    if s["cancelled"]:
        pending = s.get("pending")
        left = f"{pending} file{'s' if pending != 1 else ''} not indexed yet; " if pending else ""
        lines.append(f"  CANCELLED: {left}committed batches are kept; run again to resume")
    if s.get("pair_files_left_out"):
        lines.append(pair_line(s))
    if s.get("pair_stand_ins"):
        lines.append(stand_in_line(s))
    lines += common.file_problem_lines(s)
    if s.get("xmp_problems"):
        lines.append(f"  metadata problems ({len(s['xmp_problems'])}; the rest of each picture's metadata was read):")
        lines += [f"    {inert(u['path'])}: {inert(u['reason'])}" for u in s["xmp_problems"][:50]]
    lines += [f"  note: {inert(n, layout=True)}" for n in s["index_notes"]]
    return "\n".join(lines)


def pair_line(s: dict) -> str:
    """What was done with RAW+JPEG pairs (same name, same folder), and how to change it."""
    n = s["pair_files_left_out"]
    if s["raw_jpeg_pairs"] == "raw":
        kept, left = "RAW", "JPEG/HEIF"
    else:
        kept, left = "JPEG/HEIF", "RAW"
    return (f"  RAW+JPEG pairs: {n} {left} file{'s' if n != 1 else ''} left out, the {kept} of each pair is "
            f"indexed (--raw-jpeg-pairs both indexes both)")


def stand_in_line(s: dict) -> str:
    """Files of RAW+JPEG pairs indexed in place of the pair's file that cannot be read."""
    items = s["pair_stand_ins"]
    n = len(items)
    listed = "; ".join(f"{i['path']} for {i['for']}" for i in items[:10]) + ("; ..." if n > 10 else "")
    return (f"  RAW+JPEG pairs: {n} file{'s' if n != 1 else ''} indexed in place of {'its' if n == 1 else 'their'} "
            f"pair's unreadable file, until it can be read again: {listed}")


def cmd_index(args: argparse.Namespace) -> int:
    args = common.with_settings(args)
    if args.cluster or args.out:
        from engine.cli.cluster import cmd_cluster_index

        return cmd_cluster_index(args)
    with common.services(args) as svc:
        embedder = svc.embedder(args.model, device=args.device, text_tower=args.text_tower)
        indexer = svc.indexer(embedder, batch_size=args.batch_size, decode_workers=args.decode_workers,
                              raw_jpeg_pairs=args.raw_jpeg_pairs)
        summaries = []
        for n, folder in enumerate(args.paths):
            last = common.run_job(lambda tok, f=folder: indexer.run(f, cancel=tok), quiet=args.json or args.quiet)
            if last is None or "summary" not in last.extra:
                # The run stopped before it could report; committed batches are kept.
                raise JobCancelled("interrupted; committed batches are kept, run again to resume"
                                   + not_started_text(args.paths[n + 1:]))
            summary = last.extra["summary"].as_dict()
            if summary["cancelled"] and summary.get("library_id") is not None:
                # What was not done: the files of this folder left to index.
                summary["pending"] = svc.catalog.library_state(summary["library_id"]).pending
            summaries.append(summary)
            if not args.json:
                print(summary_text(summary))
            if summary["cancelled"]:
                # Ctrl+C stops the whole command, not only this folder's run.
                left = [str(f) for f in args.paths[n + 1:]]
                if left and not args.json:
                    print(not_started_text(left).lstrip("; "))
                for f in left:
                    summaries.append({"root": f, "not_started": True, "cancelled": True, "offline": False})
                break
        if args.json:
            common.print_json(summaries[0] if len(summaries) == 1 else summaries)
        if any(s["cancelled"] for s in summaries):
            return 130
        if any(s["offline"] for s in summaries):
            return 3
        return 0


def not_started_text(folders: list) -> str:
    """"; not started: FOLDER, ..." for the folders an interrupted `index` did not reach ("" if none)."""
    if not folders:
        return ""
    return "; not started: " + ", ".join(inert(f) for f in folders)


def cmd_libraries(args: argparse.Namespace) -> int:
    with common.services(args) as svc:
        rows = []
        for lib in svc.catalog.libraries():
            state = svc.catalog.library_state(lib.id)
            # The folder is looked at now: offline when it is missing, online again when it is back.
            rows.append({"id": lib.id, "root": lib.root, "status": state.status, "state": state.label,
                         "pending": state.pending, "counts": svc.catalog.status_counts(lib.id)})
        if args.json:
            common.print_json(rows)
        else:
            for r in rows:
                counts = ", ".join(f"{k} {v}" for k, v in sorted(r["counts"].items())) or "empty"
                print(f"{r['id']:3}  {r['state']:8} {inert(r['root'])}  ({counts})")
    return 0


def cmd_check_catalog(args: argparse.Namespace) -> int:
    from engine.catalog.db import recover_interrupted_rebuild
    from engine.catalog.repair import check_catalog, rebuild_catalog

    path = common.paths(args).catalog
    # A rebuild killed last time is finished or rolled back first, so what is checked is the catalog.
    recovered = recover_interrupted_rebuild(path)
    for note in recovered:
        print(f"longlens: {note}", file=sys.stderr)
    try:
        report = check_catalog(path)
    except KeyboardInterrupt:
        print("interrupted during the integrity check; nothing was changed", file=sys.stderr)
        return 130
    if not report.ok and args.rebuild:
        try:
            rebuilt = rebuild_catalog(path)
        except JobCancelled as exc:
            # Ctrl+C: the rebuild settled its swap (finished or rolled back) and says which.
            if args.json:
                common.print_json({"catalog": str(path), "ok": False, "problems": report.problems,
                                   "recovered": recovered, "interrupted": str(exc)})
            else:
                print(report.text())
            print(f"{exc}", file=sys.stderr)
            return 130
        if args.json:
            common.print_json({"catalog": str(path), "ok": False, "problems": report.problems,
                               "recovered": recovered, "rebuilt": dataclasses.asdict(rebuilt)})
        else:
            print(report.text())
            print(rebuilt.text())
        return 0
    if args.json:
        common.print_json({"catalog": str(path), "ok": report.ok, "problems": report.problems,
                           "recovered": recovered})
    else:
        print(report.text())
        if not report.ok:
            print("To recover: restore a backup of the catalog, or run `longlens check-catalog --rebuild` "
                  "to copy every readable row into a new catalog (the damaged file is kept beside it) and "
                  "then re-index the libraries to restore what was lost.")
    return 0 if report.ok else 1


INDEX_FLAGS = {"model": "--model", "batch_size": "--batch-size", "cluster": "--cluster", "out": "--out",
               "raw_jpeg_pairs": "--raw-jpeg-pairs"}


def register(sub: Any) -> None:
    sp = sub.add_parser("paths", help="show where Longlens keeps its data")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(func=cmd_paths)

    si = sub.add_parser("index", help="index (or re-index) photo folders incrementally")
    si.add_argument("paths", nargs="+")
    si.add_argument("--model")
    si.add_argument("--device", help="auto, cpu, cuda, cuda:N or mps (default: the settings' device, auto)")
    si.add_argument("--batch-size", type=options.BATCH_SIZE, help="images per batch (default: the settings', 16)")
    si.add_argument("--raw-jpeg-pairs", type=options.RAW_JPEG_PAIRS, metavar="{jpeg,raw,both}",
                    help="a RAW file and a JPEG/HEIF of the same name in one folder are one shot: index the "
                         "JPEG (default, from the settings), the RAW, or both")
    si.add_argument("--json", action="store_true", help="print a JSON summary")
    si.add_argument("--quiet", action="store_true", help="no progress bar")
    si.add_argument("--cluster", metavar="ADDRESS", help="embed on Ray ('local', 'local:N' or a Ray address) "
                    "into Parquet shards in --out; needs longlens[cluster] (docs/scale-out.md)")
    si.add_argument("--out", type=Path, help="shards folder for --cluster; merge with `longlens import-shards`")
    si.set_defaults(func=cmd_index, flags=INDEX_FLAGS)

    sl = sub.add_parser("libraries", help="list indexed folders and their status")
    sl.add_argument("--json", action="store_true")
    sl.set_defaults(func=cmd_libraries)

    sc = sub.add_parser("check-catalog", help="run SQLite's full integrity check on the catalog; "
                        "--rebuild recovers a damaged one")
    sc.add_argument("--rebuild", action="store_true",
                    help="when damaged: copy every readable row into a fresh catalog and swap it in, "
                         "keeping the damaged file beside it as catalog.sqlite3.damaged-<time>")
    sc.add_argument("--json", action="store_true")
    sc.set_defaults(func=cmd_check_catalog)
