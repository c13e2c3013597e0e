"""What every `longlens` command shares: paths and services from --home, JSON output, the one
progress driver with its Ctrl+C rule, the list of problem files, and starting the desktop app.

Nothing here imports a heavy library at module level: `longlens --help` must answer at once.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine.errors import LonglensError
from engine.jobs import CancelToken, Progress, first_interrupt_cancels
from engine.text.inert import InertStream, inert, json_text, unwrapped

STOPPING = "\nstopping at the next checkpoint (Ctrl+C again to abort) ..."


def paths(args: argparse.Namespace):
    """The data folders of this run (--home, else $LONGLENS_HOME, else the platform's)."""
    from engine.config import get_paths

    return get_paths(args.home)


def services(args: argparse.Namespace):
    from engine.services import Services

    svc = Services(paths(args))
    for note in svc.recovered:  # an interrupted swap settled at this start (engine.swap_journal)
        print(f"longlens: {note}", file=sys.stderr)
    return svc


def print_json(obj: Any, *, indent: int | None = 2) -> None:
    """`obj` as JSON on stdout: valid JSON whose strings hold no raw control, bidi or separator
    character (each is a \\uXXXX escape; engine.text.inert.json_text), the same values read back."""
    sys.stdout.write(json_text(obj, indent=indent, default=str) + "\n")


def file_problem_lines(s: dict, limit: int = 50) -> list[str]:
    """The unreadable and skipped files of an index summary, `limit` of each, one per line."""
    lines: list[str] = []
    for key in ("unreadable", "skipped"):
        if s.get(key):
            lines.append(f"  {key} ({len(s[key])}):")
            lines += [f"    {inert(u['path'])}: {inert(u['reason'])}" for u in s[key][:limit]]
    return lines


# -- what every command writes to the terminal is inert ----------------------------------
def inert_output() -> tuple[Any, Any]:
    """Route sys.stdout and sys.stderr through engine.text.inert.InertStream: whatever any
    command, error message or traceback writes reaches the terminal with its control characters
    escaped (newlines and tabs kept). Returns the streams it replaced, for restore_output.
    Values a command prints on one line (paths, captions) go through `inert` as well, which
    also escapes a newline inside them, so no file name can forge a line of the output."""
    saved = sys.stdout, sys.stderr
    if not isinstance(sys.stdout, InertStream):
        sys.stdout = InertStream(sys.stdout)  # type: ignore[assignment]
    if not isinstance(sys.stderr, InertStream):
        sys.stderr = InertStream(sys.stderr)  # type: ignore[assignment]
    return saved


def restore_output(saved: tuple[Any, Any]) -> None:
    sys.stdout, sys.stderr = saved


# -- interrupted runs ----------------------------------------------------------------------
_cancelled_jobs: list[str] = []  # the stages at which this process's jobs were cancelled


def jobs_cancelled() -> bool:
    """Whether a job run by run_job in this command was cancelled (Ctrl+C): main() then never
    exits 0, whatever the command returned."""
    return bool(_cancelled_jobs)


def forget_cancelled_jobs() -> None:
    _cancelled_jobs.clear()


# -- the progress driver ------------------------------------------------------------
@dataclass(frozen=True)
class Bars:
    """How a job's progress is drawn on stderr: one tqdm bar per stage (count, rate, ETA)."""

    unit: str | Callable[[str], str] = "img"  # a unit, or the unit of a stage
    postfix: Callable[[Progress], str | None] | None = None  # e.g. loss and learning rate
    need_total: bool = False  # draw no bar for a stage whose total is not known yet
    announce: bool = False  # write the stage's first message above its bar
    scaled_units: frozenset[str] = frozenset()  # units shown with k/M/G prefixes (bytes: "B")

    def unit_of(self, stage: str) -> str:
        return self.unit(stage) if callable(self.unit) else self.unit


def run_job(make_job: Callable[[CancelToken], Iterator[Progress]], *, quiet: bool, bars: Bars = Bars(),
            stopping: str = STOPPING, on_progress: Callable[[Progress], None] | None = None) -> Progress | None:
    """Run make_job(token) under progress bars on stderr and return its last Progress.

    The Ctrl+C rule of every command: the first Ctrl+C only cancels the token (printing
    `stopping`), and the job stops at its next checkpoint, keeping what it committed; a second
    Ctrl+C aborts: the job is closed (its cleanup runs) and KeyboardInterrupt goes on to main().
    A cancelled job is remembered (jobs_cancelled): the command's exit status is then never 0.
    Why not let the first one raise: a KeyboardInterrupt raised inside the job's generator (where
    it nearly always lands) would end it without its checkpoint, and workers in the middle of a
    file would never learn of the cancel.
    """
    from tqdm import tqdm

    token = CancelToken()
    terminal = unwrapped(sys.stderr)
    job = make_job(token)
    shown: dict[str, Any] = {}
    last = None
    try:
        with first_interrupt_cancels(token, stopping):
            for last in job:
                if on_progress is not None:
                    on_progress(last)
                if quiet or last.stage == "done" or (bars.need_total and last.total is None):
                    continue
                bar = shown.get(last.stage)
                if bar is None:
                    for b in shown.values():
                        b.close()
                    unit = bars.unit_of(last.stage)
                    # The bar draws with \r on the terminal itself (not through InertStream);
                    # the text in it is made inert here.
                    bar = shown[last.stage] = tqdm(total=last.total, desc=inert(last.stage), unit=unit,
                                                   unit_scale=unit in bars.scaled_units, file=terminal,
                                                   dynamic_ncols=True)
                    if bars.announce and last.message:
                        bar.write(inert(last.message, layout=True), file=terminal)
                if last.total is not None and bar.total != last.total:
                    bar.total = last.total
                if bars.postfix is not None:
                    text = bars.postfix(last)
                    if text is not None:
                        bar.set_postfix_str(inert(text), refresh=False)
                bar.update(max(last.done - bar.n, 0))
    except KeyboardInterrupt:
        token.cancel()
        close = getattr(job, "close", None)
        if close is not None:
            close()  # the generator's finally blocks run: files closed, locks released
        raise
    finally:
        for b in shown.values():
            b.close()
        if token.cancelled:
            _cancelled_jobs.append(last.stage if last is not None else "start")
    return last


# -- engine errors in this command's words ----------------------------------------------
def flag_hint(exc: LonglensError, flags: Mapping[str, str] | None) -> str:
    """The message of `exc`, naming the flags of the settings it says to change.

    Engine errors speak of settings (`exc.settings`, e.g. ("resume", "out_dir")), never of flags:
    the GUI shows them too. A command maps those settings to its flags (set_defaults(flags=...)).
    """
    names = [flags[s] for s in getattr(exc, "settings", ()) if flags and s in flags]
    return f"{exc} ({', '.join(names)})" if names else str(exc)


# -- the desktop app -------------------------------------------------------------------
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


def with_settings(args: argparse.Namespace) -> argparse.Namespace:
    """Options not given on the command line come from the settings file (the GUI's too)."""
    from engine.settings import fill_args, load_settings

    return fill_args(args, load_settings(paths(args).config))
