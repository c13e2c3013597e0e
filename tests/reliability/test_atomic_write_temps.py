"""Class 39 for every whole-file write outside the photo folders (engine.fileutil.atomic_write_bytes,
AtomicTextWriter: settings, reports, exports, data sets): a temporary file has a recognisable name
(TEMP_PREFIX and its writer's pid), a killed writer's leftovers are removed by the next write into that
folder, a live writer's never are, and a new file follows the umask. Real child processes, real SIGKILL."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from engine.fileutil import TEMP_PREFIX, AtomicTextWriter, atomic_write_text
from tests.reliability.test_checklist import child_env

# A writer that has written part of a big output and then waits (as a long export would), after
# saying so on stdout: the test kills it there, or leaves it alive.
WRITER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from engine.fileutil import AtomicTextWriter
    w = AtomicTextWriter(Path(sys.argv[1]))
    w.write("half of a big output\\n" * 1000)
    w._fh.flush()
    print("written", flush=True)
    sys.stdin.read()  # until the test closes it (or kills us)
""")


def start_writer(target: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(target)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=child_env())
    assert proc.stdout.readline().strip() == "written"
    return proc


def temps(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(TEMP_PREFIX))


@pytest.mark.timeout(120)
def test_a_killed_writers_temporary_file_is_removed_by_the_next_write_and_a_live_ones_is_kept(tmp_path):
    out = tmp_path / "reports"
    out.mkdir()
    killed = start_writer(out / "report.jsonl")
    (left,) = temps(out)
    assert left.startswith(f"{TEMP_PREFIX}{killed.pid}-") and left.endswith("-report.jsonl")
    os.kill(killed.pid, signal.SIGKILL)
    killed.wait(30)
    live = start_writer(out / "other.jsonl")
    try:
        (live_temp,) = [n for n in temps(out) if n != left]
        with AtomicTextWriter(out / "third.jsonl") as mine:  # this process's own temp, in flight
            atomic_write_text(out / "report.jsonl", "the next run's report\n")
            remaining = temps(out)
            assert left not in remaining  # the killed writer's leftover is gone
            assert live_temp in remaining  # another live writer's is kept
            assert mine._tmp.name in remaining  # and so is this process's own, in flight
            mine.write("x\n")
            mine.commit()
        assert (out / "report.jsonl").read_text() == "the next run's report\n"
    finally:
        live.stdin.close()
        live.wait(30)
    assert temps(out) == [live_temp]  # the live writer never committed: its discard is its own business


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077])
def test_a_new_file_follows_the_umask(tmp_path, umask):
    old = os.umask(umask)
    try:
        atomic_write_text(tmp_path / "a.json", "{}\n")
        with AtomicTextWriter(tmp_path / "b.jsonl") as w:
            w.write("{}\n")
            w.commit()
    finally:
        os.umask(old)
    for name in ("a.json", "b.jsonl"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o666 & ~umask
