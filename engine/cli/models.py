"""`longlens models list|pull|import|verify`."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

from engine.cli import common


def cmd_models(args: argparse.Namespace) -> int:
    from engine.models import registry

    paths = common.paths(args).ensure()
    if args.models_cmd == "list":
        rows = registry.list_models(paths)
        if args.json:
            common.print_json([dataclasses.asdict(r) for r in rows])
        else:
            for r in rows:
                state = "installed" if r.installed else "not installed"
                print(f"{r.name:24} {r.backend:16} {state:14} {r.description}")
        return 0
    if args.models_cmd == "pull":
        from engine.models.download import pull_model

        # One bar per stage: looking files up counts files; the download counts bytes (and checks
        # each file against its pin) with tqdm's size, rate and time left; its first report, the
        # sizes in all and still to fetch, is written above its bar.
        common.run_job(
            lambda tok: pull_model(args.name, paths, cancel=tok, trust_unpinned=args.trust_unpinned),
            quiet=False,
            bars=common.Bars(unit=lambda stage: "B" if stage == "download" else "file", announce=True,
                             scaled_units=frozenset({"B"})),
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
            common.print_json({"name": args.name, "ok": report.ok,
                               "files": [dataclasses.asdict(f) for f in report.files]})
        else:
            print(report.summary())
        return 0 if report.ok else 1
    raise AssertionError(args.models_cmd)


def register(sub: Any) -> None:
    sm = sub.add_parser("models", help="list, pull, import and verify models")
    msub = sm.add_subparsers(dest="models_cmd", required=True)
    ml = msub.add_parser("list")
    ml.add_argument("--json", action="store_true")
    mp = msub.add_parser("pull", help="download a registered model (pinned revision, every file checked against "
                         "its pin; an interrupted pull resumes)")
    mp.add_argument("name")
    mp.add_argument("--trust-unpinned", action="store_true",
                    help="only for a model listing files without a pin (`models list --json`: unpinned): accept "
                         "them as downloaded and record their hashes; fully pinned models never need it")
    mp.set_defaults(flags={"trust_unpinned": "--trust-unpinned"})
    mi = msub.add_parser("import", help="install a local Hugging Face-format folder (the offline path)")
    mi.add_argument("dir")
    mi.add_argument("--name", required=True)
    mi.add_argument("--replace", action="store_true")
    mi.set_defaults(flags={"replace": "--replace"})
    mv = msub.add_parser("verify", help="re-check an installed model's files against its manifest")
    mv.add_argument("name")
    mv.add_argument("--json", action="store_true")
    sm.set_defaults(func=cmd_models)
