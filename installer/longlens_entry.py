"""Entry point of the frozen app: one executable for the window and the command line.

    longlens                       opens the desktop app
    longlens --self-test           checks the installation and exits 0 (passed) or 1
    longlens gui [--self-test]     the same as the two above
    longlens models import DIR --name NAME, longlens index ..., longlens search ...   the CLI

A first argument (after an optional `--home DIR`) that is a word runs the `longlens` CLI;
options alone go to the desktop app.
"""

from __future__ import annotations

import multiprocessing
import sys


def route(argv: list[str]) -> tuple[str, list[str]]:
    """("app" or "cli", the arguments to pass on)."""
    home = argv[:2] if argv[:1] == ["--home"] and len(argv) >= 2 else []
    rest = argv[len(home):]
    if rest[:1] == ["gui"]:
        return "app", home + rest[1:]
    if rest and (not rest[0].startswith("-") or rest[0] in ("-h", "--help")):
        return "cli", argv
    return "app", argv


def main(argv: list[str]) -> int:
    where, args = route(argv)
    if where == "cli":
        from engine.cli import main as cli_main

        return cli_main(args)
    from desktop_app.app import main as app_main

    return app_main(args)


if __name__ == "__main__":
    multiprocessing.freeze_support()  # a frozen app must not re-run itself in worker processes
    sys.exit(main(sys.argv[1:]))
