"""The `longlens` command: thin argument parsing over engine functions.

Heavy libraries (torch, transformers) load only inside the commands that need them,
so `longlens --help` answers at once.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from engine import options
from engine.errors import JobCancelled, LonglensError
from engine.jobs import CancelToken, Progress, first_interrupt_cancels


def _paths(args: argparse.Namespace):
    from engine.config import get_paths

    return get_paths(args.home)


def _services(args: argparse.Namespace):
    from engine.services import Services

    return Services(_paths(args))


def _print_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=2, ensure_ascii=False, default=str)
    sys.stdout.write("\n")


def drive(job: Iterator[Progress], *, quiet: bool, unit: str = "img") -> Progress | None:
    """Run a job under a progress bar on stderr (count, rate, ETA); Ctrl+C cancels cleanly."""
    from tqdm import tqdm

    bars: dict[str, tqdm] = {}
    last = None
    try:
        for last in job:
            if quiet or last.stage == "done":
                continue
            bar = bars.get(last.stage)
            if bar is None:
                for b in bars.values():
                    b.close()
                bar = bars[last.stage] = tqdm(
                    total=last.total, desc=last.stage, unit=unit, file=sys.stderr, dynamic_ncols=True
                )
            if last.total is not None and bar.total != last.total:
                bar.total = last.total
            bar.update(max(last.done - bar.n, 0))
    finally:
        for b in bars.values():
            b.close()
    return last


def _run_cancellable(make_job, quiet: bool, unit: str = "img") -> Progress | None:
    """Run a job; the first Ctrl+C cancels it cleanly, a second one interrupts at once.

    A KeyboardInterrupt raised inside the job's generator would end the generator there, so its
    cancel path (commit what it has, record the library as partly indexed, save the index) would
    never run: the first Ctrl+C only sets the cancel token, which the job checks while it works.
    """
    token = CancelToken()
    job = make_job(token)
    try:
        # The first Ctrl+C only cancels: a KeyboardInterrupt raised inside the job's generator
        # (where it nearly always lands) would end it without its checkpoint, and wait for
        # workers in the middle of a file that never learn of the cancel.
        with first_interrupt_cancels(token, "\nstopping at the next checkpoint (Ctrl+C again to abort) ..."):
            return drive(job, quiet=quiet, unit=unit)
    except KeyboardInterrupt:
        token.cancel()
        # Let the job reach its next checkpoint, commit what it has and save the index.
        last = drive(job, quiet=True)
        if last is None:
            raise  # the interrupt ended the job itself: nothing to report
        return last


# -- commands ---------------------------------------------------------------------
def cmd_paths(args: argparse.Namespace) -> int:
    paths = _paths(args)
    if args.json:
        _print_json(paths.as_dict())
    else:
        for k, v in paths.as_dict().items():
            print(f"{k:8} {v}")
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from engine.models import registry

    paths = _paths(args).ensure()
    if args.models_cmd == "list":
        rows = registry.list_models(paths)
        if args.json:
            _print_json([dataclasses.asdict(r) for r in rows])
        else:
            for r in rows:
                state = "installed" if r.installed else "not installed"
                print(f"{r.name:24} {r.backend:16} {state:14} {r.description}")
        return 0
    if args.models_cmd == "pull":
        from engine.models.download import pull_model

        _run_cancellable(
            lambda tok: pull_model(args.name, paths, cancel=tok, trust_unpinned=args.trust_unpinned),
            quiet=False,
            unit="B",
        )
        print(f"installed {args.name} in {registry.installed_model_dir(args.name, paths)}")
        return 0
    if args.models_cmd == "import":
        from engine.models.download import import_model

        dest = import_model(Path(args.dir), args.name, paths, replace=args.replace)
        print(f"imported {args.name} into {dest}")
        return 0
    if args.models_cmd == "verify":
        from engine.models.download import verify_model

        report = verify_model(args.name, paths)
        if args.json:
            _print_json({"name": args.name, "ok": report.ok, "files": [dataclasses.asdict(f) for f in report.files]})
        else:
            print(report.summary())
        return 0 if report.ok else 1
    raise AssertionError(args.models_cmd)


def file_problem_lines(s: dict, limit: int = 50) -> list[str]:
    """The unreadable and skipped files of an index summary, `limit` of each, one per line."""
    lines: list[str] = []
    for key in ("unreadable", "skipped"):
        if s.get(key):
            lines.append(f"  {key} ({len(s[key])}):")
            lines += [f"    {u['path']}: {u['reason']}" for u in s[key][:limit]]
    return lines


def _summary_text(s: dict) -> str:
    lines = [
        f"library  {s['root']}  (model {s['model_id']})",
    ]
    if s["offline"]:
        lines.append("  OFFLINE: the folder is missing or unmounted; nothing was changed")
        return "\n".join(lines)
    lines.append(
        f"  scanned {s['scanned']}  new {s['new']}  changed {s['changed']}  moved {s['moved']}  "
        f"unchanged {s['unchanged']}  deleted {s['deleted']}  embedded {s['embedded']}  "
        f"reused {s['reused']}  in {s['elapsed_s']:.1f}s"
    )
    if s["cancelled"]:
        lines.append("  CANCELLED: committed batches are kept; run again to resume")
    lines += file_problem_lines(s)
    lines += [f"  note: {n}" for n in s["index_notes"]]
    return "\n".join(lines)


def _with_settings(args: argparse.Namespace) -> argparse.Namespace:
    """Options not given on the command line come from the settings file (the GUI's too)."""
    from engine.settings import fill_args, load_settings

    return fill_args(args, load_settings(_paths(args).config))


def cmd_index(args: argparse.Namespace) -> int:
    args = _with_settings(args)
    if args.cluster or args.out:
        from engine.cluster.cli import cmd_cluster_index

        return cmd_cluster_index(args)
    with _services(args) as svc:
        embedder = svc.embedder(args.model, device=args.device, text_tower=args.text_tower)
        indexer = svc.indexer(embedder, batch_size=args.batch_size, decode_workers=args.decode_workers)
        summaries = []
        for folder in args.paths:
            last = _run_cancellable(lambda tok, f=folder: indexer.run(f, cancel=tok), quiet=args.json or args.quiet)
            if last is None or "summary" not in last.extra:
                # A second Ctrl+C stopped the run before it could report; committed batches are kept.
                raise JobCancelled("interrupted; committed batches are kept, run again to resume")
            summary = last.extra["summary"].as_dict()
            summaries.append(summary)
            if not args.json:
                print(_summary_text(summary))
        if args.json:
            _print_json(summaries[0] if len(summaries) == 1 else summaries)
        if any(s["offline"] for s in summaries):
            return 3
        return 130 if any(s["cancelled"] for s in summaries) else 0


def _filter(args: argparse.Namespace):
    from engine.search.filters import build_filters

    return build_filters(args.folder, args.after, args.before, args.camera)


def cmd_search(args: argparse.Namespace) -> int:
    from engine.errors import QueryError

    if args.image is None and args.query is None:
        raise QueryError("give a paragraph to search for, or --image PATH")
    flt = _filter(args)  # cheap checks first: a typo in a date should not wait for a model to load
    args = _with_settings(args)
    with _services(args) as svc:
        embedder = svc.embedder(args.model, device=args.device, text_tower=args.text_tower)
        searcher = svc.searcher(embedder)
        if args.image is not None:
            result = searcher.search_image(args.image, top_k=args.top, flt=flt)
        else:
            text = sys.stdin.read() if args.query == "-" else args.query
            result = searcher.search_text(text, top_k=args.top, flt=flt, max_tokens=args.max_tokens,
                                          rerank=args.rerank, rerank_k=args.rerank_k)
        for note in result.notes:
            print(f"note: {note}", file=sys.stderr)
        if args.json:
            _print_json({
                "model": result.model_id,
                "tokens_used": result.tokens_used,
                "tokens_total": result.tokens_total,
                "truncated": result.truncated,
                "reranked": result.reranked,
                "timings_ms": result.timings_ms,
                "results": [h.to_json() for h in result.hits],
            })
            return 0
        if result.tokens_total is not None:
            note = " (TRUNCATED)" if result.truncated else ""
            print(f"query: {result.tokens_used}/{result.tokens_total} tokens used{note}; model {result.model_id}")
        if not result.hits:
            print("no results (is the folder indexed with this model? try `longlens index DIR`)")
        for h in result.hits:
            rr = h.extra.get("rerank_score")
            both = f"  itm {rr:6.4f} (ann #{h.extra['ann_rank']})" if rr is not None else ""
            print(f"{h.rank:4}  {h.score:8.4f}{both}  {h.path}")
        return 0


def cmd_libraries(args: argparse.Namespace) -> int:
    with _services(args) as svc:
        rows = []
        for lib in svc.catalog.libraries():
            state = svc.catalog.library_state(lib.id)
            rows.append({"id": lib.id, "root": lib.root, "status": lib.status, "state": state.label,
                         "pending": state.pending, "counts": svc.catalog.status_counts(lib.id)})
        if args.json:
            _print_json(rows)
        else:
            for r in rows:
                counts = ", ".join(f"{k} {v}" for k, v in sorted(r["counts"].items())) or "empty"
                print(f"{r['id']:3}  {r['state']:8} {r['root']}  ({counts})")
    return 0


def cmd_check_catalog(args: argparse.Namespace) -> int:
    from engine.catalog.repair import check_catalog, rebuild_catalog

    path = _paths(args).catalog
    report = check_catalog(path)
    if not report.ok and args.rebuild:
        rebuilt = rebuild_catalog(path)
        if args.json:
            _print_json({"catalog": str(path), "ok": False, "problems": report.problems,
                         "rebuilt": dataclasses.asdict(rebuilt)})
        else:
            print(report.text())
            print(rebuilt.text())
        return 0
    if args.json:
        _print_json({"catalog": str(path), "ok": report.ok, "problems": report.problems})
    else:
        print(report.text())
        if not report.ok:
            print("To recover: restore a backup of the catalog, or run `longlens check-catalog --rebuild` "
                  "to copy every readable row into a new catalog (the damaged file is kept beside it) and "
                  "then re-index the libraries to restore what was lost.")
    return 0 if report.ok else 1


def launch_gui(argv: Sequence[str] = ()) -> int:
    """Start the desktop app in this process and return its exit code.

    engine must never import desktop_app (an import-linter contract enforces the seam: the
    engine stays usable without Qt). So the app is run by module name through runpy, which
    the linter cannot see as an import, exactly as `python -m desktop_app` would run it.
    """
    import runpy

    saved = sys.argv[:]
    sys.argv = ["longlens gui", *argv]
    try:
        runpy.run_module("desktop_app", run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] in ("PySide6", "shiboken6"):
            raise LonglensError("the desktop app needs PySide6 (pip install pyside6-essentials)") from exc
        raise
    finally:
        sys.argv = saved
    return 0


def cmd_gui(args: argparse.Namespace) -> int:
    argv: list[str] = []
    if args.model:
        argv += ["--model", args.model]
    if args.query:
        argv += ["--query", args.query]
    if args.self_test:
        argv += ["--self-test"]
    return launch_gui(argv)


def cmd_demo(args: argparse.Namespace) -> int:
    from engine.demo import run_demo

    return run_demo(_paths(args), no_gui=args.no_gui, out=sys.stdout)


# Feature areas register their own subcommands (each module has `register(subparsers)` and imports
# its heavy dependencies lazily), so the areas evolve without editing this file.
COMMAND_MODULES: tuple[str, ...] = (
    "engine.cluster.cli", "engine.training.cli", "engine.evaluation.cli", "engine.grounding.cli",
    "engine.datagen.cli", "engine.bench.cli",
)


def _register_extra_commands(sub) -> None:
    import importlib

    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="longlens", description="Search photo collections with paragraphs.")
    p.add_argument("--home", help="keep all Longlens data under this folder (same as $LONGLENS_HOME)")
    sub = p.add_subparsers(dest="cmd", required=True)

    sp = sub.add_parser("paths", help="show where Longlens keeps its data")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(func=cmd_paths)

    sm = sub.add_parser("models", help="list, pull, import and verify models")
    msub = sm.add_subparsers(dest="models_cmd", required=True)
    ml = msub.add_parser("list")
    ml.add_argument("--json", action="store_true")
    mp = msub.add_parser("pull", help="download a registered model (pinned revision, SHA-256 checked)")
    mp.add_argument("name")
    mp.add_argument("--trust-unpinned", action="store_true",
                    help="accept files whose hash the registry does not pin (records the hash seen)")
    mi = msub.add_parser("import", help="install a local Hugging Face-format folder (the offline path)")
    mi.add_argument("dir")
    mi.add_argument("--name", required=True)
    mi.add_argument("--replace", action="store_true")
    mv = msub.add_parser("verify", help="re-check an installed model's files against its manifest")
    mv.add_argument("name")
    mv.add_argument("--json", action="store_true")
    sm.set_defaults(func=cmd_models)

    si = sub.add_parser("index", help="index (or re-index) photo folders incrementally")
    si.add_argument("paths", nargs="+")
    si.add_argument("--model")
    si.add_argument("--device", help="auto, cpu, cuda, cuda:N or mps (default: the settings' device, auto)")
    si.add_argument("--batch-size", type=options.BATCH_SIZE, help="images per batch (default: the settings', 16)")
    si.add_argument("--json", action="store_true", help="print a JSON summary")
    si.add_argument("--quiet", action="store_true", help="no progress bar")
    si.add_argument("--cluster", metavar="ADDRESS", help="embed on Ray ('local', 'local:N' or a Ray address) "
                    "into Parquet shards in --out; needs longlens[cluster] (docs/scale-out.md)")
    si.add_argument("--out", type=Path, help="shards folder for --cluster; merge with `longlens import-shards`")
    si.set_defaults(func=cmd_index)

    ss = sub.add_parser("search", help="search with a paragraph (or - to read it from stdin)")
    ss.add_argument("query", nargs="?")
    ss.add_argument("--top", type=options.TOP_K, default=20)
    ss.add_argument("--json", action="store_true")
    ss.add_argument("--image", help="search with an image instead of text")
    ss.add_argument("--folder", help="only images under this folder")
    ss.add_argument("--after", help="only images taken on or after this date (YYYY-MM-DD)")
    ss.add_argument("--before", help="only images taken before this date (YYYY-MM-DD)")
    ss.add_argument("--camera", help="only images whose camera make/model contains this text")
    ss.add_argument("--model")
    ss.add_argument("--text-tower", type=Path, help="a paragraph-trained text tower folder (default: the settings')")
    ss.add_argument("--max-tokens", type=options.TOKEN_BUDGET,
                    help="token budget for the query (default: the settings', else the model's)")
    ss.add_argument("--device", help="auto, cpu, cuda, cuda:N or mps (default: the settings' device, auto)")
    ss.add_argument("--rerank", action=argparse.BooleanOptionalAction, default=False,
                    help="re-score the top --rerank-k candidates with the model's matching head (BLIP: ITM; "
                         "sceneworld-mini: its matching head) and order by it (default: off, ANN order; "
                         "see docs/grounding.md)")
    ss.add_argument("--rerank-k", type=options.RERANK_K, default=32, help="candidates to re-rank (default 32)")
    ss.set_defaults(func=cmd_search)

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

    sg = sub.add_parser("gui", help="open the desktop app")
    sg.add_argument("--model", help="model to search with (default: the settings' model)")
    sg.add_argument("--query", help="run this search when the window opens")
    sg.add_argument("--self-test", action="store_true",
                    help="check this installation on temporary data and exit (0 passed, 1 failed)")
    sg.set_defaults(func=cmd_gui)

    _register_extra_commands(sub)

    sd = sub.add_parser("demo", help="index a generated sample collection and run a sample query")
    sd.add_argument("--no-gui", action="store_true")
    sd.set_defaults(func=cmd_demo)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    # POSIX file names are bytes: one that is not UTF-8 reaches Python as lone surrogates, which
    # a strict UTF-8 stdout (e.g. an en_US.UTF-8 terminal) refuses with a traceback. Print such
    # names as their original bytes, as `ls` does (Python already does this under the C locale).
    for stream in (sys.stdout, sys.stderr):
        if getattr(stream, "errors", None) == "strict" and hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="surrogateescape")
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # a usage error (exit 2, message printed) or --help (0): a return code
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    if args.home:
        os.environ["LONGLENS_HOME"] = args.home
    try:
        return int(args.func(args) or 0)
    except JobCancelled:
        print("cancelled", file=sys.stderr)
        return 130
    except LonglensError as exc:
        print(f"longlens: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
