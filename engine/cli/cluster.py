"""`longlens import-shards` and the `--cluster` branch of `longlens index`, which
engine/cli/library.py hands over to `cmd_cluster_index`.

    longlens index PATH... --cluster local|local:N|ADDRESS --out SHARDS_DIR [--model NAME]
    longlens import-shards SHARDS_DIR --library ROOT [--model NAME] [--source CLUSTER_ROOT]

Ray and pyarrow load inside the command functions only (they are the optional `cluster` extra).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from engine.cli import common
from engine.errors import JobCancelled, LonglensError
from engine.text.inert import inert


def cmd_cluster_index(args: argparse.Namespace) -> int:
    """`longlens index ... --cluster ADDRESS --out DIR`: one shards run per folder."""
    from engine.cluster.job import ClusterOptions, run_cluster_index
    from engine.services import Services

    if not args.cluster or not args.out:
        raise LonglensError("--cluster and --out go together: --cluster ADDRESS --out SHARDS_DIR")
    from engine.outputs import check_output

    paths = common.paths(args).ensure()
    with Services(paths) as svc:
        # Shards are extended by a resumed run; they must never land inside a photo folder.
        check_output(args.out, what="shards folder", kind="shards", folder=True, resumable=True,
                     inputs=[Path(p) for p in args.paths],
                     library_roots=[Path(lib.root) for lib in svc.catalog.libraries()])
        # The model is resolved here (clear error if missing) but loaded only on the workers.
        model = svc.default_model_name(args.model)
    from engine.models.registry import installed_model_dir

    if installed_model_dir(model, paths) is None:
        raise LonglensError(f"model {model!r} is not installed; `longlens models list` shows what is")
    options = ClusterOptions(address=args.cluster, device=args.device, raw_jpeg_pairs=args.raw_jpeg_pairs)
    out = Path(args.out)
    summaries = []
    for i, folder in enumerate(args.paths):
        # One shards folder per library: the import merges one folder into one library.
        target = out if len(args.paths) == 1 else out / f"{i:02d}-{Path(folder).name or 'root'}"
        last = common.run_job(lambda tok, f=folder, t=target: run_cluster_index(f, t, model, paths, options, tok),
                              quiet=args.json or args.quiet)
        if last is None or "summary" not in last.extra:
            raise JobCancelled("interrupted before the run could report; the shards written are kept, run again "
                               "to resume")
        s = last.extra["summary"].as_dict()
        summaries.append(s)
        if not args.json:
            print(_index_text(s))
        if s["cancelled"]:
            # Ctrl+C stops the whole command, not only this folder's run.
            left = [str(f) for f in args.paths[i + 1:]]
            if left and not args.json:
                print("not started: " + ", ".join(inert(f) for f in left))
            summaries += [{"root": f, "not_started": True, "cancelled": True} for f in left]
            break
    if args.json:
        common.print_json(summaries[0] if len(summaries) == 1 else summaries)
    return 130 if any(s["cancelled"] for s in summaries) else 0


def _index_text(s: dict) -> str:
    lines = [f"cluster run {s['run_id']}  {inert(s['root'])} -> {inert(s['out'])}  (model {inert(s['model_id'])}, "
             f"{inert(s['address'])})",
             f"  scanned {s['scanned']}  already in shards {s['already_in_shards']}  written {s['processed']}  "
             f"embedded {s['embedded']}  shards {s['shards_written']}  actors {s['actors']}  "
             f"in {s['elapsed_s']:.1f}s"]
    if s["cancelled"]:
        lines.append("  CANCELLED: the shards written are kept; run again to resume")
    lines += common.file_problem_lines(s)
    lines.append(f"  next: longlens import-shards {inert(s['out'])} --library {inert(s['root'])}")
    return "\n".join(lines)


def cmd_import_shards(args: argparse.Namespace) -> int:
    from engine.cluster.importer import import_shards
    from engine.errors import ModelNotInstalledError
    from engine.models.registry import installed_identity

    def identity_here(name: str) -> str | None:
        try:
            return installed_identity(name, svc.paths).image
        except ModelNotInstalledError:
            return None

    with common.services(args) as svc:
        expected = identity_here(args.model) or args.model if args.model else None
        last = common.run_job(
            lambda tok: import_shards(svc.catalog, svc.store, args.shards_dir, args.library, model_id=expected,
                                      source_root=args.source, cancel=tok, installed_identity=identity_here),
            quiet=args.json or args.quiet, bars=common.Bars(unit="file"))
    if last is None or "summary" not in last.extra:
        raise JobCancelled("interrupted before the import could report; run it again (importing twice changes "
                           "nothing)")
    s = last.extra["summary"].as_dict()
    if args.json:
        common.print_json(s)
    else:
        m = s["merge"]
        print(f"imported {s['shards_read']} shards of {inert(s['source_root'])} into {inert(s['library'])} "
              f"(model {inert(s['model_id'])})")
        print(f"  rows {s['rows']}  duplicates dropped {s['duplicate_rows']}  stale {s['stale_rows']}")
        print(f"  new {m['new']}  changed {m['changed']}  moved {m['moved']}  unchanged {m['unchanged']}  "
              f"deleted {m['deleted']}  unreadable {len(m['unreadable'])}")
        for b in s["bad_shards"]:
            print(f"  BAD SHARD skipped: {inert(b['reason'])}")
        for n in s["notes"] + m["index_notes"]:
            print(f"  note: {inert(n, layout=True)}")
        if m["cancelled"]:
            print("  CANCELLED: the files merged so far are kept; run the import again to finish it")
    if s["merge"]["cancelled"]:
        return 130
    return 2 if s["bad_shards"] else 0


def register(sub: Any) -> None:
    sp = sub.add_parser(
        "import-shards",
        help="merge the shards of `longlens index --cluster` into the catalog",
        description="Validate the Parquet shards of a cluster indexing run and merge them into the library "
        "ROOT with the rules of local indexing (new, changed, moved, deleted). Bad shards are reported and "
        "skipped; importing twice changes nothing. Needs longlens[cluster] (pyarrow). See docs/scale-out.md.",
    )
    sp.add_argument("shards_dir", help="the --out folder of `longlens index --cluster`")
    sp.add_argument("--library", required=True, help="the library folder as this machine sees it")
    sp.add_argument("--model", help="expected model id (default: the one the shards hold)")
    sp.add_argument("--source", help="the folder as the cluster saw it, when the shards hold several")
    sp.add_argument("--json", action="store_true", help="print the import summary as JSON")
    sp.add_argument("--quiet", action="store_true", help="no progress bar")
    sp.set_defaults(func=cmd_import_shards, flags={"source_root": "--source", "model_id": "--model", "model": "--model"})
