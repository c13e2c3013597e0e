"""Multi-step swaps are journalled and settled at the next start (issue 27 point 4; checklist class 39).

`check-catalog --rebuild` swaps a rebuilt catalog in with more than one rename (the catalog's
-wal/-shm aside, the damaged file aside, the rebuilt file in). A real child process runs it and is
stopped with SIGKILL (or SIGINT) exactly at each step boundary: the child writes a file when it
reaches the step named by LONGLENS_TEST_SWAP_PAUSE and waits there; the parent waits for the file,
then signals. The next real command (`python -m engine libraries` / `check-catalog`) must settle
the swap (finish it once the damaged file is aside, roll it back before), keep every row, leave no
temporary file, and never start an empty catalog.

The damaged catalog has committed rows still in its -wal (written by a process that was killed),
so a swap that loses the -wal loses rows, and the rows are compared after every recovery.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pytest

from engine.catalog.db import FINISHED, ROLLED_BACK
from tests.reliability.conftest import corrupt_table_page

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(600)

# Each step boundary of a rebuild, and what the next start must do after a kill there.
STEPS = {
    "rebuild-copying": "stopped",  # rows half copied into the hidden copy: the copy goes
    "rebuild-journal-written": "rolled back",  # nothing moved yet
    "rebuild-sides-moved": "rolled back",  # -wal/-shm aside: they go back
    "rebuild-damaged-moved": "finished",  # no file at the catalog's name: the rebuilt one takes it
    "rebuild-swapped": "finished",  # only the journal was left
}
IMAGES = 5000  # enough that copying them is a stretch of the run a random kill can land in
WAL_IMAGES = 5  # rows committed into the damaged catalog's -wal, never checkpointed

_WRITE_INTO_WAL_AND_DIE = r"""
import os, signal, sqlite3, sys
con = sqlite3.connect(sys.argv[1])
con.execute("PRAGMA journal_mode=WAL")
con.execute("PRAGMA wal_autocheckpoint=0")
for i in range(int(sys.argv[2])):
    con.execute("INSERT INTO images (library_id, rel_path, size, mtime_ns, status, added_at, updated_at) "
                "VALUES (1, ?, 1, 1, 'ok', 2.0, 2.0)", (f"wal{i}.jpg",))
con.execute("INSERT INTO meta (key, value) VALUES ('written-to-the-wal', 'yes')")
con.commit()
os.kill(os.getpid(), signal.SIGKILL)  # dies holding the WAL: committed rows only in catalog.sqlite3-wal
"""


def child_env(home: Path, **extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "LONGLENS_HOME": str(home), **extra}
    env.pop("LONGLENS_TEST_SWAP_PAUSE", None)
    env.update(extra)
    return env


def run_cli(home: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "engine", *args], cwd=ROOT, env=child_env(home),
                          capture_output=True, text=True, timeout=120)


def sha256(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def catalog_of(home: Path) -> Path:
    return home / "data" / "catalog.sqlite3"


def rows_of(catalog: Path) -> dict[str, set]:
    """The rows of the tables the damage did not touch (every one must survive any interruption)."""
    con = sqlite3.connect(f"{catalog.absolute().as_uri()}?mode=ro", uri=True)
    try:
        return {
            "libraries": set(con.execute("SELECT id, root FROM libraries")),
            "images": set(con.execute("SELECT id, library_id, rel_path FROM images")),
            "meta": set(con.execute("SELECT key, value FROM meta")),
        }
    finally:
        con.close()


@dataclass(frozen=True)
class Master:
    """A damaged catalog (with committed rows in its -wal) and what it holds."""

    folder: Path  # catalog.sqlite3, catalog.sqlite3-wal, catalog.sqlite3-shm
    rows: dict[str, set]
    main_sha: str
    wal_sha: str

    def install(self, home: Path) -> Path:
        data = home / "data"
        data.mkdir(parents=True)
        for p in self.folder.iterdir():
            shutil.copy2(p, data / p.name)
        return data / "catalog.sqlite3"


@pytest.fixture(scope="module")
def master(tmp_path_factory) -> Master:
    from engine.catalog import Catalog

    folder = tmp_path_factory.mktemp("damaged")
    cat = folder / "catalog.sqlite3"
    Catalog(cat).close()
    con = sqlite3.connect(cat)
    for i in range(3):
        con.execute("INSERT INTO libraries (id, root, status, added_at) VALUES (?, ?, 'online', 1.0)",
                    (i + 1, f"/photos/lib{i}"))
    for i in range(IMAGES):
        con.execute("INSERT INTO images (library_id, rel_path, size, mtime_ns, status, added_at, updated_at) "
                    "VALUES (?, ?, ?, ?, 'ok', 1.0, 1.0)", (i % 3 + 1, f"p{i}.jpg", i, i))
    for i in range(40):
        con.execute("INSERT INTO review_sessions (caption_file, file_hash, position, created_at, updated_at) "
                    "VALUES (?, 'h', 0, 1.0, 1.0)", (f"captions{i}.jsonl",))
    con.commit()
    con.close()
    corrupt_table_page(cat, "review_sessions")
    proc = subprocess.run([sys.executable, "-c", _WRITE_INTO_WAL_AND_DIE, str(cat), str(WAL_IMAGES)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    wal = Path(f"{cat}-wal")
    assert wal.stat().st_size > 0
    # Read through a scratch copy: even a read-only look may touch the -shm.
    scratch = tmp_path_factory.mktemp("scratch")
    for p in folder.iterdir():
        shutil.copy2(p, scratch / p.name)
    rows = rows_of(scratch / "catalog.sqlite3")
    assert len(rows["images"]) == IMAGES + WAL_IMAGES and ("written-to-the-wal", "yes") in rows["meta"]
    return Master(folder, rows, sha256(cat), sha256(wal))


def start_rebuild(home: Path, pause: str | None = None, ready: Path | None = None) -> subprocess.Popen:
    extra = {"LONGLENS_TEST_SWAP_PAUSE": f"{pause}:{ready}"} if pause else {}
    return subprocess.Popen([sys.executable, "-m", "engine", "check-catalog", "--rebuild"], cwd=ROOT,
                            env=child_env(home, **extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(path: Path, proc: subprocess.Popen, timeout_s: float = 120) -> None:
    """Synchronise on the child's pause file (it writes it, then waits for ever)."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the rebuild ended (rc {proc.returncode}) before its pause point: {out}{err}")
        if time.monotonic() > deadline:
            proc.kill()
            proc.communicate()
            pytest.fail("the rebuild never reached its pause point")
        time.sleep(0.01)


def rebuild_paused_at(home: Path, step: str, ready: Path) -> subprocess.Popen:
    """A real `check-catalog --rebuild` child, waiting for ever at its pause point `step`."""
    proc = start_rebuild(home, step, ready)
    wait_for(ready, proc)
    return proc


def kill_9(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)  # reaps it: its pid is then free, as after any crash


def hidden(home: Path) -> list[str]:
    """Longlens's own hidden files beside the catalog: journals, locks, temporary copies."""
    return sorted(p.name for p in (home / "data").iterdir() if p.name.startswith("."))


def damaged_copies(home: Path) -> list[Path]:
    return sorted(p for p in (home / "data").glob("catalog.sqlite3.damaged-*") if not p.name.endswith(("-wal", "-shm")))


def outcome_of(notes: str) -> str:
    if FINISHED in notes:
        return "finished"
    if ROLLED_BACK in notes:
        return "rolled back"
    if "stopped before its swap" in notes:
        return "stopped"
    return "nothing"


def check_recovered(home: Path, master: Master, outcome: str) -> None:
    """After the next start: no hidden file, every row, and (rebuilt once more where it was rolled
    back) a catalog that passes the full check, with the damaged file kept whole beside it."""
    from engine.catalog.repair import check_catalog, rebuild_catalog

    cat = catalog_of(home)
    assert hidden(home) == [], "a temporary file, journal or lock outlived the recovery"
    assert rows_of(cat) == master.rows, "rows were lost"
    if outcome in ("rolled back", "stopped", "nothing"):
        assert sha256(cat) == master.main_sha and sha256(Path(f"{cat}-wal")) == master.wal_sha
        assert damaged_copies(home) == []
        assert not check_catalog(cat).ok
        rebuild_catalog(cat)  # the user's next step: the rebuild, this time to its end
        assert hidden(home) == []
    assert check_catalog(cat).ok
    assert rows_of(cat) == master.rows
    (kept,) = damaged_copies(home)
    assert sha256(kept) == master.main_sha and sha256(Path(f"{kept}-wal")) == master.wal_sha


@pytest.mark.parametrize("step, next_command", [
    ("rebuild-copying", "libraries"),
    ("rebuild-journal-written", "check-catalog"),
    ("rebuild-sides-moved", "libraries"),
    ("rebuild-damaged-moved", "check-catalog"),
    ("rebuild-swapped", "libraries"),
])
def test_rebuild_killed_at_each_step_is_settled_by_the_next_command(tmp_path, master, step, next_command):
    home = tmp_path / "home"
    master.install(home)
    ready = tmp_path / "ready"
    kill_9(rebuild_paused_at(home, step, ready))
    left = hidden(home)
    assert left, "the kill left nothing behind: the step is not inside the swap"
    if STEPS[step] == "finished":
        assert not catalog_of(home).exists() or step == "rebuild-swapped"

    if next_command == "libraries":
        result = run_cli(home, "libraries", "--json")
        assert result.returncode == 0, result.stderr
        listed = json.loads(result.stdout)
        assert sorted(lib["id"] for lib in listed) == [1, 2, 3]  # never a new, empty catalog
        assert sum(sum(lib["counts"].values()) for lib in listed) == IMAGES + WAL_IMAGES
    else:
        result = run_cli(home, "check-catalog")
        assert result.returncode == (0 if STEPS[step] == "finished" else 1), result.stdout + result.stderr
        assert ("integrity check ok" if STEPS[step] == "finished" else "DAMAGED") in result.stdout
    assert outcome_of(result.stderr) == STEPS[step], result.stderr
    assert "Traceback" not in result.stderr
    check_recovered(home, master, STEPS[step])


@pytest.mark.parametrize("step, outcome, says", [
    ("rebuild-copying", "nothing", "was not changed and the partial copy was removed"),
    ("rebuild-sides-moved", "rolled back", ROLLED_BACK),
    ("rebuild-damaged-moved", "finished", FINISHED),
])
def test_ctrl_c_during_a_rebuild_exits_130_and_says_what_was_done(tmp_path, master, step, outcome, says):
    home = tmp_path / "home"
    master.install(home)
    ready = tmp_path / "ready"
    proc = rebuild_paused_at(home, step, ready)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, out + err
    assert "interrupted" in err and says in err and "Traceback" not in err
    # Settled in the interrupted process itself: nothing left for the next start to do.
    assert hidden(home) == []
    result = run_cli(home, "libraries", "--json")
    assert result.returncode == 0 and result.stderr == "", result.stderr
    check_recovered(home, master, outcome)


def test_a_missing_catalog_beside_a_rebuilt_copy_without_journal_is_never_started_empty(tmp_path, master):
    """What releases before the journal left (killed between the renames), or a catalog deleted by
    hand while a rebuild's copy sits beside it: refused with the way out, nothing created."""
    home = tmp_path / "home"
    master.install(home)
    ready = tmp_path / "ready"
    kill_9(rebuild_paused_at(home, "rebuild-damaged-moved", ready))
    (home / "data" / ".catalog.sqlite3.swap-journal").unlink()
    before = [n for n in hidden(home) if not n.endswith(".swap.lock")]  # the lock goes with its release
    assert any(n.startswith(".catalog.sqlite3.rebuild-") for n in before)
    for args in (["libraries"], ["check-catalog"]):
        result = run_cli(home, *args)
        assert result.returncode == 2, result.stdout + result.stderr
        assert "did not start a new, empty catalog" in result.stderr and ".catalog.sqlite3.rebuild-" in result.stderr
        assert not catalog_of(home).exists()
        assert hidden(home) == before
    # The way out it names: rename the copy to the catalog's name.
    (copy,) = (home / "data").glob(".catalog.sqlite3.rebuild-*.tmp")
    copy.rename(catalog_of(home))
    assert run_cli(home, "check-catalog").returncode == 0
    assert rows_of(catalog_of(home)) == master.rows


def test_a_journal_whose_files_are_all_gone_refuses_to_start_an_empty_catalog(tmp_path, master):
    home = tmp_path / "home"
    master.install(home)
    ready = tmp_path / "ready"
    kill_9(rebuild_paused_at(home, "rebuild-damaged-moved", ready))
    for p in (home / "data").iterdir():
        if p.name.startswith((".catalog.sqlite3.rebuild-", "catalog.sqlite3.damaged-")):
            p.unlink()
    result = run_cli(home, "libraries")
    assert result.returncode == 2 and "did not start a new, empty catalog" in result.stderr
    assert not catalog_of(home).exists()
    assert (home / "data" / ".catalog.sqlite3.swap-journal").exists()  # kept: nothing was settled


def test_an_unreadable_journal_is_refused_naming_it_and_nothing_changes(tmp_path, master):
    home = tmp_path / "home"
    cat = master.install(home)
    journal = home / "data" / ".catalog.sqlite3.swap-journal"
    journal.write_text("{not json", encoding="utf-8")
    result = run_cli(home, "libraries")
    assert result.returncode == 2 and str(journal) in result.stderr and "Traceback" not in result.stderr
    assert sha256(cat) == master.main_sha and journal.read_text(encoding="utf-8") == "{not json"


def test_a_start_leaves_a_live_rebuilds_files_alone(tmp_path, master):
    """Another command started while a rebuild copies rows must not take its copy for a leftover,
    nor open the catalog the rebuild is about to swap away from under it."""
    home = tmp_path / "home"
    cat = master.install(home)
    ready = tmp_path / "ready"
    proc = start_rebuild(home, "rebuild-copying", ready)
    try:
        wait_for(ready, proc)
        live = hidden(home)
        assert any(n.startswith(f".catalog.sqlite3.rebuild-{proc.pid}-") for n in live)
        result = run_cli(home, "libraries", "--json")
        assert result.returncode == 2 and "is being rebuilt by another Longlens process" in result.stderr
        assert hidden(home) == live and sha256(cat) == master.main_sha
        second = run_cli(home, "check-catalog", "--rebuild")
        assert second.returncode == 2 and "is being rebuilt by another Longlens process" in second.stderr
        assert hidden(home) == live
    finally:
        kill_9(proc)
    assert run_cli(home, "libraries").returncode == 0
    assert hidden(home) == []


# -- kill -9 at random moments ---------------------------------------------------------------------

@dataclass
class StressReport:
    rounds: int = 0
    by_outcome: dict[str, int] = field(default_factory=dict)  # finished / rolled back / stopped / nothing
    kill_left: dict[str, int] = field(default_factory=dict)  # what the kill left: journal / copy / lock / none
    killed_at_pause: int = 0
    killed_at_random_time: int = 0
    finished_before_kill: int = 0
    strays: int = 0
    rows_lost: int = 0
    wall_s: float = 0.0


def rebuild_started(home: Path, proc: subprocess.Popen, timeout_s: float = 120) -> bool:
    """Wait until the rebuild has made its first file (start-up takes most of a run); False when
    the run ended first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(n.startswith(".catalog.sqlite3.") for n in os.listdir(home / "data")):
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.002)
    pytest.fail("the rebuild never started")


def stress_rounds(tmp_path: Path, master: Master, rounds: int, seed: int) -> StressReport:
    rng = random.Random(seed)
    report = StressReport()
    t0 = time.monotonic()
    # How long a rebuild runs from its first file to its end: random kills land anywhere in it.
    probe = tmp_path / "probe"
    master.install(probe)
    proc = start_rebuild(probe)
    assert rebuild_started(probe, proc)
    started = time.monotonic()
    proc.communicate(timeout=120)
    assert proc.returncode == 0
    window = time.monotonic() - started
    for i in range(rounds):
        home = tmp_path / f"home{i}"
        master.install(home)
        if rng.random() < 0.5:
            step = rng.choice(list(STEPS))
            ready = tmp_path / f"ready{i}"
            proc = rebuild_paused_at(home, step, ready)
            report.killed_at_pause += 1
        else:
            proc = start_rebuild(home)
            if rebuild_started(home, proc):
                time.sleep(rng.uniform(0.0, 1.0) * window)
            if proc.poll() is None:
                report.killed_at_random_time += 1
            else:
                report.finished_before_kill += 1
        kill_9(proc)
        left = hidden(home)
        kind = ("journal" if any(n.endswith(".swap-journal") for n in left) else
                "copy" if any(".rebuild-" in n for n in left) else "lock" if left else "none")
        report.kill_left[kind] = report.kill_left.get(kind, 0) + 1
        result = run_cli(home, "libraries", "--json")
        assert result.returncode == 0, f"round {i}: {result.stderr}"
        assert sorted(lib["id"] for lib in json.loads(result.stdout)) == [1, 2, 3], f"round {i}"
        outcome = outcome_of(result.stderr)
        if outcome == "nothing" and damaged_copies(home):
            outcome = "finished"  # the rebuild had completed before the kill
        report.by_outcome[outcome] = report.by_outcome.get(outcome, 0) + 1
        report.strays += len(hidden(home))
        report.rows_lost += rows_of(catalog_of(home)) != master.rows
        check_recovered(home, master, outcome)
        report.rounds += 1
        shutil.rmtree(home)
    report.wall_s = round(time.monotonic() - t0, 1)
    print(f"\nrebuild kill -9 rounds: {json.dumps(asdict(report))}")
    return report


def test_rebuild_killed_at_random_moments_three_rounds(tmp_path, master):
    report = stress_rounds(tmp_path, master, 3, seed=27)
    assert report.rounds == 3 and report.strays == 0 and report.rows_lost == 0


@pytest.mark.stress
def test_rebuild_killed_at_random_moments_always_recovers(tmp_path, master, stress_iterations):
    report = stress_rounds(tmp_path, master, stress_iterations, seed=2739)
    assert report.rounds == stress_iterations and report.strays == 0 and report.rows_lost == 0


# -- index files: one rename each, but their temporary files must not outlive their owner -----------

_SAVE_AND_DIE = r"""
import os, signal, sys, tempfile
from pathlib import Path
from engine.swap_journal import temp_prefix
target = Path(sys.argv[1])
for suffix in (".tmp", ".hnsw.tmp"):  # what VectorIndex.save has open while it writes
    fd, _ = tempfile.mkstemp(prefix=temp_prefix(target, "save"), suffix=suffix, dir=target.parent)
    os.write(fd, b"half an index")
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_index_temp_files_of_a_killed_save_are_removed_at_the_next_start(tmp_path):
    from engine.config import get_paths
    from engine.index.store import STALE_TEMP_AGE_S, index_path

    home = tmp_path / "home"
    paths = get_paths(home).ensure()
    target = index_path(paths.indexes, 1, "tiny-blip@0123456789abcdef")
    died = subprocess.run([sys.executable, "-c", _SAVE_AND_DIE, str(target)], cwd=ROOT, env=child_env(home),
                          capture_output=True, text=True, timeout=60)
    assert died.returncode == -signal.SIGKILL, died.stderr
    orphans = sorted(paths.indexes.iterdir())
    assert len(orphans) == 2 and all(".save-" in p.name for p in orphans)
    # A live process's save in another index is left alone, however the start is made.
    live = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        other = index_path(paths.indexes, 2, "tiny-blip@0123456789abcdef")
        live_tmp = other.parent / f".{other.name}.save-{live.pid}-abcd1234.tmp"
        live_tmp.write_bytes(b"being written")
        old_name = other.parent / f".{other.name}.abc12345.tmp"  # a release before the pid names, fresh
        old_name.write_bytes(b"?")
        reused = other.parent / f".{other.name}.save-{live.pid}-ffff0000.hnsw.tmp"  # pid since re-used
        reused.write_bytes(b"old")
        long_ago = time.time() - 2 * STALE_TEMP_AGE_S
        os.utime(reused, (long_ago, long_ago))
        result = run_cli(home, "libraries")
        assert result.returncode == 0, result.stderr
        assert sorted(paths.indexes.iterdir()) == sorted([live_tmp, old_name])
    finally:
        live.stdin.close()
        live.wait(timeout=60)
    run_cli(home, "libraries")
    assert sorted(paths.indexes.iterdir()) == [old_name]  # its owner is gone now too; the pid-less one waits


def test_a_journal_half_written_by_a_killed_process_is_removed_at_the_next_start(tmp_path, master):
    """write_journal's own temporary file (a kill before its rename): swept with the rest."""
    from engine.catalog import Catalog
    from engine.swap_journal import journal_path, temp_path

    cat = master.install(tmp_path / "home")
    half = temp_path(journal_path(cat), "write")
    half.write_text('{"kind": "catalog reb', encoding="utf-8")
    models_half = tmp_path / "home" / "models" / temp_path(Path("m.swap-journal"), "write").name
    models_half.parent.mkdir(parents=True)
    models_half.write_text("{", encoding="utf-8")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    models_half = models_half.rename(models_half.with_name(models_half.name.replace(f"-{os.getpid()}-",
                                                                                       f"-{dead.stdout.strip()}-")))
    with Catalog(cat):
        pass
    assert not half.exists() and hidden(tmp_path / "home") == []
    result = run_cli(tmp_path / "home", "libraries")
    assert result.returncode == 0, result.stderr
    assert not models_half.exists()
