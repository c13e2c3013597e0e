"""The `longlens` command: thin argument parsing over engine functions.

One module per area registers its subcommands (`register(sub)`); engine/cli/common.py holds
what they share. Heavy libraries (torch, transformers) load only inside the commands that
need them, so `longlens --help` answers at once.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from engine.cli import (
    bench,
    cluster,
    common,
    datagen,
    demo,
    dev,
    duplicates,
    evaluation,
    grounding,
    gui,
    library,
    models,
    review,
    search,
    training,
    xmp,
)
from engine.cli.common import flag_hint
from engine.errors import JobCancelled, LonglensError

# The areas in the order `longlens --help` lists their commands.
AREAS = (library, models, search, duplicates, xmp, gui, cluster, training, evaluation, grounding, review, datagen, bench, demo, dev)
# Every command module, by name (the installer bundles each: tests/installer checks the spec).
COMMAND_MODULES: tuple[str, ...] = tuple(m.__name__ for m in AREAS)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="longlens", description="Search photo collections with paragraphs.")
    p.add_argument("--home", help="keep all Longlens data under this folder (same as $LONGLENS_HOME)")
    sub = p.add_subparsers(dest="cmd", required=True)
    for area in AREAS:
        area.register(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    # POSIX file names are bytes: one that is not UTF-8 reaches Python as lone surrogates, which
    # a strict UTF-8 stdout (e.g. an en_US.UTF-8 terminal) refuses with a traceback. The output
    # net below shows such bytes as \xNN; what still reaches the stream raw (a progress bar's
    # own text) is written as its original bytes rather than refused.
    for stream in (sys.stdout, sys.stderr):
        if getattr(stream, "errors", None) == "strict" and hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="surrogateescape")
    # Whatever reaches the terminal is inert (engine.text.inert): file names, captions and the
    # messages quoting them can hold escape sequences. Left in place when an exception escapes,
    # so that its traceback is written through the net too.
    saved = common.inert_output()
    common.forget_cancelled_jobs()
    code = _run(argv)
    common.restore_output(saved)
    return code


def _run(argv: Sequence[str] | None) -> int:
    argv, job_args = dev.split_job_args(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # a usage error (exit 2, message printed) or --help (0): a return code
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    if job_args:
        args.job_args = job_args
    if args.home:
        os.environ["LONGLENS_HOME"] = args.home
    try:
        code = int(args.func(args) or 0)
    except JobCancelled as exc:
        # The job's own words when a command gave them (what was kept, what was not written).
        said = str(exc)
        print("cancelled" if said in ("", "cancelled by the user") else f"cancelled: {said}", file=sys.stderr)
        return 130
    except LonglensError as exc:
        print(f"longlens: error: {flag_hint(exc, getattr(args, 'flags', None))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    if code == 0 and common.jobs_cancelled():
        # A command whose job was cancelled but that reported as if it had finished: what it
        # printed is what was done, and the rest was not. Never exit 0 for an interrupted run.
        print("interrupted: the run stopped before it finished (Ctrl+C); what is listed above is what was "
              "done, the rest was not done", file=sys.stderr)
        return 130
    return code


__all__ = ["COMMAND_MODULES", "build_parser", "main"]
