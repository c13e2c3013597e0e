"""`longlens gui`: the desktop app, started by module name (engine never imports desktop_app)."""

from __future__ import annotations

import argparse
from typing import Any

from engine.cli import common


def cmd_gui(args: argparse.Namespace) -> int:
    argv: list[str] = []
    if args.model:
        argv += ["--model", args.model]
    if args.query:
        argv += ["--query", args.query]
    if args.self_test:
        argv += ["--self-test"]
    return common.launch_gui(argv)


def register(sub: Any) -> None:
    sg = sub.add_parser("gui", help="open the desktop app")
    sg.add_argument("--model", help="model to search with (default: the settings' model)")
    sg.add_argument("--query", help="run this search when the window opens")
    sg.add_argument("--self-test", action="store_true",
                    help="check this installation on temporary data and exit (0 passed, 1 failed)")
    sg.set_defaults(func=cmd_gui)
