"""Checklist class 40: an interrupted run never exits 0 and says what it did and what it skipped.

Real SIGINTs to real child processes, sent once the child's own progress output shows it is
working (a reader thread follows its stderr: no sleeps), and the general rule of main(): a job
cancelled by Ctrl+C makes the command's exit status 130 whatever the command returned.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from engine.cli import main as cli_main
from tests.e2e.conftest import TINY_MODEL

ROOT = Path(__file__).resolve().parents[2]
MODEL = ["--model", TINY_MODEL]


class ChildOutput:
    """A child process whose stderr is read as it comes (tqdm redraws with CR: split on CR or LF),
    with an event set when a line matches what the test waits for."""

    def __init__(self, argv: list[str], home: Path, ready: Callable[[str], bool]) -> None:
        env = {**os.environ, "LONGLENS_HOME": str(home),
               "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        self.proc = subprocess.Popen([sys.executable, "-m", "engine", *argv], cwd=ROOT, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.ready = threading.Event()
        self.err = bytearray()
        self.out = b""
        self._test = ready
        self._reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._reader.start()
        self._out_reader = threading.Thread(target=self._read_stdout, daemon=True)
        self._out_reader.start()

    def _read_stderr(self) -> None:
        pending = b""
        assert self.proc.stderr is not None
        while chunk := self.proc.stderr.read1(4096):
            self.err += chunk
            pending += chunk
            *lines, pending = re.split(rb"[\r\n]", pending)
            if any(self._test(line.decode("utf-8", "replace")) for line in lines):
                self.ready.set()
        self.ready.set()  # ended: the test sees it through poll()

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        self.out = self.proc.stdout.read()

    def interrupt_when_ready(self, timeout: float = 300) -> None:
        assert self.ready.wait(timeout), "the child never showed its progress"
        assert self.proc.poll() is None, f"the run ended before it could be interrupted: {self.err.decode()}"
        self.proc.send_signal(signal.SIGINT)

    def finish(self, timeout: float = 120) -> tuple[int, str, str]:
        try:
            code = self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(10)
        self._out_reader.join(10)
        return code, self.out.decode(), bytes(self.err).decode()


def _progress_at_least(stage: str, n: int) -> Callable[[str], bool]:
    """A tqdm line of `stage` that has counted n or more (e.g. 'index:  3%|▎ | 4/121 [...]')."""
    pattern = re.compile(rf"^{stage}:.*\|\s*(\d+)/(\d+)")

    def test(line: str) -> bool:
        m = pattern.search(line.strip())
        return m is not None and int(m.group(1)) >= n
    return test


def _committed(catalog: Path) -> int:
    con = sqlite3.connect(f"{catalog.absolute().as_uri()}?mode=ro", uri=True)
    try:
        return con.execute("SELECT count(*) FROM images").fetchone()[0]
    finally:
        con.close()


def test_ctrl_c_during_index_exits_130_says_what_was_left_and_starts_no_further_folder(home, paths, cli, tmp_path):
    from engine.samples import make_sample_folder

    first, second = tmp_path / "first", tmp_path / "second"
    make_sample_folder(first, n=120, seed=3)
    make_sample_folder(second, n=4, seed=4)
    n_files = sum(1 for p in first.rglob("*") if p.is_file())
    child = ChildOutput(["index", str(first), str(second), *MODEL, "--batch-size", "1"], home,
                        _progress_at_least("index", 3))
    child.interrupt_when_ready()
    code, out, err = child.finish()
    assert code == 130, err
    assert "stopping at the next checkpoint" in err
    rows = _committed(paths.catalog)
    assert 0 < rows < n_files
    # What it did (the counts) and what it did not: the files left in this folder, the folder not started.
    assert f"CANCELLED: {n_files - rows} files not indexed yet; committed batches are kept" in out
    assert f"not started: {second}" in out
    assert [lib["root"] for lib in cli.json("libraries")] == [str(first.resolve())]  # nothing of the second


def test_ctrl_c_during_check_exits_130_names_how_far_it_got_and_keeps_the_previous_report(home, tmp_path):
    from engine.samples import make_sample_folder

    photos = tmp_path / "photos"
    make_sample_folder(photos, n=6, seed=5)
    pictures = sorted(p for p in photos.rglob("*.jpg"))[:3]
    # Every other line names a missing picture: its error on stderr is the progress to wait for.
    lines = []
    for n in range(40):
        image = pictures[n % len(pictures)] if n % 2 == 0 else tmp_path / f"missing{n}.jpg"
        lines.append(json.dumps({"image": str(image), "caption": "A small picture. Some colours."}))
    caps = tmp_path / "caps.jsonl"
    caps.write_text("\n".join(lines) + "\n", encoding="utf-8")
    report = tmp_path / "report.jsonl"
    report.write_text('{"line": 1, "earlier": true}\n', encoding="utf-8")
    before = report.read_bytes()
    child = ChildOutput(["check", str(caps), "--out", str(report), *MODEL], home,
                        lambda line: line.startswith(f"{caps}:4: image not found"))
    child.interrupt_when_ready()
    code, out, err = child.finish()
    assert code == 130, err
    m = re.search(r"interrupted after checking (\d+) of 40 lines: no report was written", err)
    assert m is not None and 3 <= int(m.group(1)) < 40, err  # line 4 printed its error; its record may not be in
    assert "checked" not in out  # no success summary
    assert report.read_bytes() == before  # the previous report is whole and untouched
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".report.jsonl")]  # no temporary file left


def test_a_command_whose_job_was_cancelled_never_exits_0(monkeypatch, capsys):
    """The general rule in main(): a command that reports normally after its job was cancelled
    (here, one that ignores the cancel, as a command might) still exits 130 and says so. The
    interrupt is a real SIGINT to this process, caught by run_job's first-Ctrl+C handler."""
    from engine.cli import common, library
    from engine.jobs import Progress

    def job(token):
        yield Progress("work", 1, 3, "first")
        os.kill(os.getpid(), signal.SIGINT)  # handled at once by the first-interrupt handler
        assert token.cancelled
        yield Progress("done", 1, 3, "stopped")

    def careless_command(args):
        last = common.run_job(job, quiet=True)
        print(f"finished: {last.message}")
        return 0

    monkeypatch.setattr(library, "cmd_libraries", careless_command)
    assert cli_main(["libraries"]) == 130
    out, err = capsys.readouterr()
    assert "finished: stopped" in out and "interrupted: the run stopped before it finished" in err
    # The record is per command: the next command in this process exits 0 again.
    monkeypatch.setattr(library, "cmd_libraries", lambda args: 0)
    assert cli_main(["libraries"]) == 0
