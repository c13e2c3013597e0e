"""kill -9 at random moments while `longlens index` runs in a subprocess, then restart and check.

Each iteration: snapshot what the catalog has committed (path -> row id and vector bytes),
start `python -m engine index` on a folder of real image files, SIGKILL it at a random moment
(early, during start-up/scan, or after a random number of committed rows plus a random delay so
the kill lands at different points of a batch), restart the same command to completion and check:

* nothing committed before the kill is lost, re-numbered or re-embedded (same vector bytes);
* no duplicate rows (path, content, embedding) and one row per file on disk;
* the saved index file holds exactly the catalog's embedded ids (and no id twice);
* ``PRAGMA integrity_check`` is ``ok``.

A kill during an index save leaves that save's temp file; it is counted (``orphan_temp_files``),
not failed: the index file itself is whole, and IndexStore removes such orphans once they are old.

Problems are counted, not asserted on the spot, so one run reports every kind of failure;
tests assert the counts are zero. Run it by hand with
``python -m tests.reliability.crash_harness --iterations 20``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
MODEL = "tiny-blip"
# Initial folder: enough batches that a kill after a few committed rows still leaves work.
INITIAL_FILES = 96
FILES_PER_ITERATION = 24
IMAGE_SIZE = (128, 96)
BATCH_SIZE = 4


@dataclass
class CrashReport:
    iterations: int = 0
    killed_mid_job: int = 0
    finished_before_kill: int = 0  # an "early" kill that came after the job had ended
    kills_before_first_new_commit: int = 0
    committed_rows_checked: int = 0
    lost: int = 0  # committed rows missing, re-numbered or with a different vector after resume
    duplicate_rows: int = 0
    index_mismatches: int = 0
    integrity_failures: int = 0
    resume_failures: int = 0
    orphan_temp_files: int = 0  # temp files of a killed save, seen after the restart (not a failure)
    files_on_disk: int = 0
    wall_s: float = 0.0
    problems: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not (self.lost or self.duplicate_rows or self.index_mismatches or self.integrity_failures
                    or self.resume_failures)

    def as_dict(self) -> dict:
        return {**asdict(self), "clean": self.clean}


def catalog_path(home: Path) -> Path:
    return home / "data" / "catalog.sqlite3"


def _read_only(catalog: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"{catalog.as_uri()}?mode=ro", uri=True, timeout=30)


def model_key(home: Path) -> str:
    """The key MODEL's vectors are stored under: its identity (NAME@hash of its files), not its name."""
    from engine.config import get_paths
    from engine.models.registry import installed_identity

    return installed_identity(MODEL, get_paths(str(home))).image


def committed_rows(catalog: Path) -> dict[str, tuple[int, bytes | None]]:
    """path -> (row id, vector bytes) as committed right now, read through a separate connection."""
    if not catalog.exists():
        return {}
    con = _read_only(catalog)
    try:
        rows = con.execute(
            "SELECT i.rel_path, i.id, e.vector FROM images i "
            "LEFT JOIN embeddings e ON e.image_id = i.id AND e.model_id = ?",
            (model_key(catalog.parents[1]),),
        ).fetchall()
    except sqlite3.OperationalError:
        return {}  # schema not created yet
    finally:
        con.close()
    return {p: (i, v) for p, i, v in rows}


def committed_count(catalog: Path) -> int:
    """Rows committed right now; cheap enough to poll while the child works."""
    if not catalog.exists():
        return 0
    con = _read_only(catalog)
    try:
        return int(con.execute("SELECT count(*) FROM images").fetchone()[0])
    except sqlite3.OperationalError:
        return 0
    finally:
        con.close()


def index_command(photos: Path) -> list[str]:
    return [sys.executable, "-m", "engine", "index", str(photos), "--model", MODEL,
            "--batch-size", str(BATCH_SIZE), "--quiet", "--json"]


def _kill_at_random_moment(home: Path, photos: Path, rng: random.Random, report: CrashReport) -> None:
    env = {**os.environ, "LONGLENS_HOME": str(home)}
    before = committed_count(catalog_path(home))
    early = rng.random() < 0.2
    target = before + rng.randint(1, 12)
    proc = subprocess.Popen(index_command(photos), cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        if early:
            # Anywhere in start-up: imports, model load, catalog open, scan, first batch.
            deadline = time.monotonic() + rng.uniform(0.0, 3.0)
            while time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.005)
        else:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and proc.poll() is None:
                if committed_count(catalog_path(home)) >= target:
                    break
                time.sleep(0.01)
            # Lands the kill at different points of the next batch (decode, model, commit, save).
            time.sleep(rng.random() * 0.05)
    finally:
        running = proc.poll() is None
        if running:
            proc.send_signal(signal.SIGKILL)
        proc.wait()
    if running and proc.returncode == -signal.SIGKILL:
        report.killed_mid_job += 1
        if committed_count(catalog_path(home)) == before:
            report.kills_before_first_new_commit += 1
    else:
        report.finished_before_kill += 1
        if not early:
            report.problems.append(f"iteration {report.iterations}: indexing ended (rc {proc.returncode}) "
                                   "before the kill; the folder is too small to interrupt")


def check_consistency(home: Path, photos: Path, before_kill: dict[str, tuple[int, bytes | None]],
                      report: CrashReport) -> None:
    from engine.catalog import Catalog
    from engine.config import get_paths
    from engine.errors import LonglensError
    from engine.index.store import index_path
    from engine.index.vector_index import VectorIndex

    it = report.iterations
    after = committed_rows(catalog_path(home))
    for path, (row_id, vec) in before_kill.items():
        report.committed_rows_checked += 1
        now = after.get(path)
        if now is None or now[0] != row_id or (vec is not None and now[1] != vec):
            report.lost += 1
            report.problems.append(f"iteration {it}: committed row {path!r} (id {row_id}) lost or changed")
    files = [p for p in photos.rglob("*") if p.is_file()]
    report.files_on_disk = len(files)
    paths = get_paths(home)
    with Catalog(paths.catalog) as cat:
        result = cat.integrity_check()
        if result != "ok":
            report.integrity_failures += 1
            report.problems.append(f"iteration {it}: integrity_check says {result!r}")
        with cat.read() as conn:
            dup = conn.exec_driver_sql(
                "SELECT (SELECT count(*) FROM (SELECT 1 FROM images GROUP BY library_id, rel_path "
                "HAVING count(*) > 1)) + (SELECT count(*) FROM (SELECT 1 FROM embeddings "
                "GROUP BY image_id, model_id HAVING count(*) > 1)) + (SELECT count(*) FROM (SELECT 1 "
                "FROM images WHERE status = 'ok' GROUP BY library_id, content_hash HAVING count(*) > 1))"
            ).scalar()
            n_rows = conn.exec_driver_sql("SELECT count(*) FROM images WHERE status != 'deleted'").scalar()
        if dup:
            report.duplicate_rows += int(dup)
            report.problems.append(f"iteration {it}: {dup} duplicated rows")
        if n_rows != len(files):
            report.duplicate_rows += abs(n_rows - len(files))
            report.problems.append(f"iteration {it}: {n_rows} live rows for {len(files)} files")
        lib = cat.libraries()[0]
        key = model_key(home)
        truth = cat.embedded_ids(lib.id, key)
        dim = cat.vectors_for([next(iter(truth))], key).shape[1]
        try:
            ids = VectorIndex.load(index_path(paths.indexes, lib.id, key), dim=dim).ids()
        except LonglensError as exc:
            report.index_mismatches += 1
            report.problems.append(f"iteration {it}: index file unreadable after resume: {exc}")
        else:
            if len(ids) != len(set(ids.tolist())) or set(ids.tolist()) != truth:
                report.index_mismatches += 1
                report.problems.append(f"iteration {it}: index holds {len(ids)} ids, catalog {len(truth)}")
    report.orphan_temp_files = len(list(paths.indexes.glob(".*.tmp")))


def _resume_in_process(home: Path, photos: Path) -> tuple[bool, str]:
    """The restart, with fresh engine objects in this process: cheaper than a new interpreter (no
    torch import), and it sees exactly the files the killed process left behind."""
    from engine.config import get_paths
    from engine.errors import LonglensError
    from engine.services import Services

    try:
        with Services(get_paths(str(home))) as svc:
            embedder = svc.embedder(MODEL, device="cpu")
            last = deque(svc.indexer(embedder, batch_size=BATCH_SIZE).run(photos), maxlen=1)[0]
    except LonglensError as exc:
        return False, str(exc)
    summary = last.extra["summary"]
    if summary.cancelled or summary.offline:
        return False, f"resume did not complete: {summary}"
    return True, ""


def _resume_in_subprocess(home: Path, photos: Path) -> tuple[bool, str]:
    env = {**os.environ, "LONGLENS_HOME": str(home)}
    done = subprocess.run(index_command(photos), cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    return done.returncode == 0, f"rc {done.returncode}: {done.stderr.strip()[-500:]}"


def run_crash_harness(home: Path, photos: Path, iterations: int, seed: int = 0, *,
                      restart: str = "process") -> CrashReport:
    """`home` must have MODEL installed; `photos` is created (real image files) if missing.

    restart: "process" runs the resume as a new `longlens index` process; "inline" runs it in
    this process with fresh engine objects (used by the quick `make test` version)."""
    from engine.samples import make_sample_folder

    if not photos.exists():
        make_sample_folder(photos, n=INITIAL_FILES, seed=5, size=IMAGE_SIZE)
    rng = random.Random(seed)
    resume = {"process": _resume_in_subprocess, "inline": _resume_in_process}[restart]
    report = CrashReport()
    t0 = time.monotonic()
    for it in range(iterations):
        report.iterations = it + 1
        before_kill = committed_rows(catalog_path(home))
        _kill_at_random_moment(home, photos, rng, report)
        # Rows committed before this kill plus any the killed run committed: all must survive.
        survived_kill = committed_rows(catalog_path(home))
        ok, why = resume(home, photos)
        if not ok:
            report.resume_failures += 1
            report.problems.append(f"iteration {it + 1}: resume failed: {why}")
            continue
        check_consistency(home, photos, {**before_kill, **survived_kill}, report)
        # New files, so the next iteration has model work to interrupt again.
        make_sample_folder(photos / f"extra-{it}", n=FILES_PER_ITERATION, seed=1000 + it, size=IMAGE_SIZE)
    report.wall_s = round(time.monotonic() - t0, 1)
    return report


# --------------------------------------------------------------------------- mutator mode
# 2-3 concurrent `longlens index` processes on one library while a mutator adds, renames,
# overwrites, truncates, deletes and replaces files by FIFOs; one indexer is killed -9 at a random
# moment. Every run must end (a hang fails), no run may fail, and after a final quiet run the
# catalog must agree with the disk file by file.
MUTATIONS = ("add", "rename", "overwrite", "truncate", "delete", "fifo")
# Adds are weighted up so the library does not shrink away over 20 iterations of deletes and FIFOs.
MUTATION_WEIGHTS = (3, 1, 1, 1, 1, 1)
MAX_MUTATIONS_PER_ITERATION = 80
RUN_TIMEOUT_S = 240.0  # one index run of this small folder takes seconds; past this it hangs


@dataclass
class MutatorReport:
    iterations: int = 0
    runs: int = 0
    killed: int = 0
    hangs: int = 0
    failed_runs: int = 0  # a run that exited non-zero without being killed
    mutations: dict[str, int] = field(default_factory=dict)
    rows_checked: int = 0
    disagreements: int = 0  # a live row that does not match its file, or a file without a row
    duplicate_rows: int = 0
    index_mismatches: int = 0
    integrity_failures: int = 0
    wall_s: float = 0.0
    problems: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not (self.hangs or self.failed_runs or self.disagreements or self.duplicate_rows
                    or self.index_mismatches or self.integrity_failures)

    def as_dict(self) -> dict:
        return {**asdict(self), "clean": self.clean}


class _Mutator:
    """Changes a library the way people and sync tools do, from a pool of unique pictures (each used
    once, so no two live files share content by accident). Half of the changes hit a file it added
    or changed itself a moment ago: exactly the files an indexer has just scanned and is about to
    hash and decode, where a file that changes type or size under the reader does harm."""

    def __init__(self, photos: Path, pool: list[Path], rng: random.Random, report: MutatorReport,
                 tag: str) -> None:
        self.photos, self.pool, self.rng, self.report = photos, pool, rng, report
        self.tag = tag  # new names are unique across iterations: an old name may be a FIFO now
        self.serial = 0
        self.recent: deque[Path] = deque(maxlen=32)

    def _files(self) -> list[Path]:
        return sorted(p for p in self.photos.rglob("*") if p.is_file() and not p.is_symlink())

    def _victim(self, files: list[Path]) -> Path:
        fresh = [p for p in self.recent if p.is_file() and not p.is_symlink()]
        return self.rng.choice(fresh if fresh and self.rng.random() < 0.5 else files)

    def add_new(self, n: int) -> None:
        """n new pictures at once (a card import): work the indexers are about to hash and decode."""
        for _ in range(min(n, len(self.pool))):
            self.serial += 1
            src = self.pool.pop()
            dest = self.photos / f"import-{self.tag}-{self.serial}{src.suffix}"
            shutil.copyfile(src, dest)
            self.recent.append(dest)

    def once(self) -> None:
        kind = self.rng.choices(MUTATIONS, MUTATION_WEIGHTS)[0]
        files = self._files()
        self.serial += 1
        try:
            if kind == "add" or not files:
                if not self.pool:
                    return
                kind = "add"
                src = self.pool.pop()
                dest = self.photos / f"added-{self.tag}-{self.serial}{src.suffix}"
                shutil.copyfile(src, dest)
                self.recent.append(dest)
            else:
                victim = self._victim(files)
                if kind == "rename":
                    dest = victim.with_name(f"renamed-{self.tag}-{self.serial}{victim.suffix}")
                    victim.rename(dest)
                    self.recent.append(dest)
                elif kind == "overwrite":
                    if not self.pool:
                        return
                    # In place, as an editor saving over the file does (same path, new bytes).
                    victim.write_bytes(self.pool.pop().read_bytes())
                    self.recent.append(victim)
                elif kind == "truncate":
                    with open(victim, "r+b") as fh:
                        fh.truncate(max(1, victim.stat().st_size // 3))
                    self.recent.append(victim)
                elif kind == "delete":
                    victim.unlink()
                elif kind == "fifo":
                    victim.unlink()
                    os.mkfifo(victim)
        except FileNotFoundError:
            return  # the victim went away under us (rename/delete earlier in this loop)
        self.report.mutations[kind] = self.report.mutations.get(kind, 0) + 1

    def swap_for_fifos(self, n: int) -> None:
        """The issue's reproduction: `rm f; mkfifo f` on files an indexer has just scanned."""
        fresh = [p for p in self.recent if p.is_file() and not p.is_symlink()]
        for victim in self.rng.sample(fresh, min(n, len(fresh))):
            try:
                victim.unlink()
            except FileNotFoundError:
                continue
            os.mkfifo(victim)
            self.report.mutations["fifo"] = self.report.mutations.get("fifo", 0) + 1

    def run(self, stop: threading.Event, limit: int) -> None:
        """Right after the scan, a burst of FIFO swaps on the new files; then, until `stop` (all
        indexers ended) or `limit` changes, a random change every 10-150 ms."""
        time.sleep(self.rng.uniform(0.05, 0.4))
        self.swap_for_fifos(3)
        for _ in range(limit):
            if stop.wait(self.rng.uniform(0.01, 0.15)):
                return
            self.once()


def _start_index(home: Path, photos: Path, log: Path) -> tuple[subprocess.Popen, Any]:
    env = {**os.environ, "LONGLENS_HOME": str(home)}
    out = open(log, "w+b")  # noqa: SIM115 (closed by the caller once the run has ended)
    return subprocess.Popen(index_command(photos), cwd=ROOT, env=env, stdout=out, stderr=out), out


def _catalog_state(catalog: Path) -> tuple[int, int]:
    """(size, mtime) of the catalog's write-ahead log: any committed write changes it."""
    try:
        st = Path(f"{catalog}-wal").stat()
    except FileNotFoundError:
        return (-1, -1)
    return (st.st_size, st.st_mtime_ns)


def _wait_for_catalog_write(catalog: Path, before: tuple[int, int], procs: list[subprocess.Popen],
                            limit_s: float = 120.0) -> None:
    """Until a process commits to the catalog (not merely opens it: opening creates an empty log)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and (_catalog_state(catalog) == before or _catalog_state(catalog)[0] <= 0):
        if all(p.poll() is not None for p in procs):
            return
        time.sleep(0.01)


def _wait_bounded(proc: subprocess.Popen, timeout: float) -> bool:
    """True when the process ended within `timeout`; a hang is killed and reported False."""
    try:
        proc.wait(timeout=timeout)
        return True
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return False


def check_disk_agreement(home: Path, photos: Path, report: MutatorReport, it: int) -> None:
    """After a quiet run: one live row per regular image file and none for anything else; every
    live row's size and mtime (and, for readable ones, its hash) are the file's; the index holds
    exactly the catalog's embedded ok rows; integrity ok; no duplicates."""
    from engine.catalog import Catalog
    from engine.config import get_paths
    from engine.errors import LonglensError
    from engine.fileutil import sha256_file
    from engine.index.store import index_path
    from engine.index.vector_index import VectorIndex
    from engine.indexing.decode import SUPPORTED_EXTENSIONS

    paths = get_paths(str(home))
    on_disk = {p.relative_to(photos).as_posix(): p for p in photos.rglob("*")
               if p.is_file() and not p.name.startswith(".") and p.suffix.lower() in SUPPORTED_EXTENSIONS}
    key = model_key(home)
    con = _read_only(paths.catalog)
    try:
        rows = con.execute(
            "SELECT i.rel_path, i.id, i.size, i.mtime_ns, i.content_hash, i.status, e.image_id IS NOT NULL "
            "FROM images i LEFT JOIN embeddings e ON e.image_id = i.id AND e.model_id = ? "
            "WHERE i.status != 'deleted'", (key,)).fetchall()
        dup = con.execute(
            "SELECT (SELECT count(*) FROM (SELECT 1 FROM images GROUP BY library_id, rel_path "
            "HAVING count(*) > 1)) + (SELECT count(*) FROM (SELECT 1 FROM images WHERE status = 'ok' "
            "GROUP BY library_id, content_hash HAVING count(*) > 1))").fetchone()[0]
    finally:
        con.close()
    if dup:
        report.duplicate_rows += int(dup)
        report.problems.append(f"iteration {it}: {dup} duplicated rows")
    live = {r[0]: r for r in rows}
    for rel in sorted(set(on_disk) - set(live)):
        report.disagreements += 1
        report.problems.append(f"iteration {it}: {rel!r} is on disk but has no live row")
    for rel, (_, row_id, size, mtime_ns, digest, status, has_vec) in sorted(live.items()):
        report.rows_checked += 1
        path = on_disk.get(rel)
        if path is None:
            report.disagreements += 1
            report.problems.append(f"iteration {it}: live row {rel!r} ({status}) has no regular file")
            continue
        st = path.stat()
        why = []
        if (size, mtime_ns) != (st.st_size, st.st_mtime_ns):
            why.append(f"size/mtime {size}/{mtime_ns} vs {st.st_size}/{st.st_mtime_ns}")
        if status == "ok" and digest != sha256_file(path):
            why.append("content hash is not the file's")
        if status == "ok" and not has_vec:
            why.append("ok row without a vector")
        if why:
            report.disagreements += 1
            report.problems.append(f"iteration {it}: row {rel!r} (id {row_id}, {status}): {'; '.join(why)}")
    with Catalog(paths.catalog) as cat:
        result = cat.integrity_check()
        if result != "ok":
            report.integrity_failures += 1
            report.problems.append(f"iteration {it}: integrity_check says {result!r}")
        lib = cat.libraries()[0]
        truth = {r[1] for r in live.values() if r[5] == "ok"}
        if truth != cat.embedded_ids(lib.id, key) & {r[1] for r in live.values()}:
            report.index_mismatches += 1
            report.problems.append(f"iteration {it}: ok rows and embedded rows differ")
        try:
            dim = cat.vectors_for([next(iter(truth))], key).shape[1] if truth else 0
            ids = VectorIndex.load(index_path(paths.indexes, lib.id, key), dim=dim).ids() if truth else []
        except LonglensError as exc:
            report.index_mismatches += 1
            report.problems.append(f"iteration {it}: index file unreadable after the quiet run: {exc}")
            return
        if truth and (len(ids) != len(set(ids.tolist())) or set(ids.tolist()) != truth):
            report.index_mismatches += 1
            report.problems.append(f"iteration {it}: index holds {len(ids)} ids, catalog {len(truth)} ok rows")


def run_mutator_harness(home: Path, photos: Path, iterations: int, seed: int = 0, *,
                        writers: tuple[int, ...] = (2, 3)) -> MutatorReport:
    """`home` must have MODEL installed; `photos` is created (real image files) if missing."""
    from engine.samples import make_sample_folder

    if not photos.exists():
        make_sample_folder(photos, n=INITIAL_FILES // 2, seed=5, size=IMAGE_SIZE)
    pool_dir = photos.parent / f"{photos.name}-pool"
    # About half of the changes need a new picture (adds and overwrites).
    pool = make_sample_folder(pool_dir, n=(FILES_PER_ITERATION + MAX_MUTATIONS_PER_ITERATION // 2) * iterations,
                              seed=77,
                              size=IMAGE_SIZE)
    rng = random.Random(seed)
    report = MutatorReport()
    logs = photos.parent / f"{photos.name}-logs"
    logs.mkdir(exist_ok=True)
    t0 = time.monotonic()
    for it in range(1, iterations + 1):
        report.iterations = it
        mutator = _Mutator(photos, pool, rng, report, tag=f"it{it}")
        mutator.add_new(FILES_PER_ITERATION)
        seen = _catalog_state(catalog_path(home))
        runs = [_start_index(home, photos, logs / f"it{it}-run{k}.log") for k in range(rng.choice(writers))]
        report.runs += len(runs)
        stop = threading.Event()
        thread = threading.Thread(target=mutator.run, args=(stop, MAX_MUTATIONS_PER_ITERATION), daemon=True)
        # The indexers take seconds to import torch and load the model: start changing the library
        # when the first of them writes to the catalog (its library status, just before its scan),
        # and keep changing it while they hash, decode and commit.
        _wait_for_catalog_write(catalog_path(home), seen, [proc for proc, _ in runs])
        thread.start()
        victim = rng.randrange(len(runs))
        time.sleep(rng.uniform(0.0, 3.0))  # the kill lands in scan, hashing, batches or the save
        if runs[victim][0].poll() is None:
            runs[victim][0].send_signal(signal.SIGKILL)
        for k, (proc, out) in enumerate(runs):
            ended = _wait_bounded(proc, RUN_TIMEOUT_S)
            out.seek(0)
            tail = out.read().decode("utf-8", "replace").strip()[-600:]
            out.close()
            if not ended:
                report.hangs += 1
                report.problems.append(f"iteration {it}: run {k} did not end within {RUN_TIMEOUT_S:.0f} s")
            elif proc.returncode == -signal.SIGKILL and k == victim:
                report.killed += 1
            elif proc.returncode != 0:
                report.failed_runs += 1
                report.problems.append(f"iteration {it}: run {k} exited {proc.returncode}: {tail}")
        stop.set()
        thread.join(timeout=30)
        # The quiet run: nothing changes any more, so afterwards the catalog must match the disk.
        proc, out = _start_index(home, photos, logs / f"it{it}-quiet.log")
        report.runs += 1
        ended = _wait_bounded(proc, RUN_TIMEOUT_S)
        out.seek(0)
        tail = out.read().decode("utf-8", "replace").strip()[-600:]
        out.close()
        if not ended or proc.returncode != 0:
            report.hangs += not ended
            report.failed_runs += ended
            report.problems.append(f"iteration {it}: the quiet run {'hung' if not ended else 'failed'}: {tail}")
            continue
        check_disk_agreement(home, photos, report, it)
        # FIFOs left in the library stay: each later run must skip them again without blocking.
    report.wall_s = round(time.monotonic() - t0, 1)
    return report


def _install_tiny_model(home: Path, work: Path) -> None:
    from engine.backends.blip.checkpoints import save_random_blip_checkpoint
    from engine.cli import main as cli_main

    ckpt = save_random_blip_checkpoint(work / "blip-tiny", size="tiny", seed=0)
    os.environ["LONGLENS_HOME"] = str(home)
    if cli_main(["models", "import", str(ckpt), "--name", MODEL]) != 0:
        raise SystemExit("could not install the tiny model")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--restart", choices=["process", "inline"], default="process")
    ap.add_argument("--mutator", action="store_true",
                    help="2-3 concurrent index runs and a mutator (add, rename, overwrite, truncate, "
                         "delete, FIFO) instead of one run killed and restarted")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="longlens-crash-") as tmp:
        work = Path(tmp)
        _install_tiny_model(work / "home", work)
        if args.mutator:
            mreport = run_mutator_harness(work / "home", work / "photos", args.iterations, args.seed)
            print(json.dumps(mreport.as_dict(), indent=2))
            return 0 if mreport.clean else 1
        report = run_crash_harness(work / "home", work / "photos", args.iterations, args.seed,
                                   restart=args.restart)
    print(json.dumps(report.as_dict(), indent=2))
    return 0 if report.clean and report.killed_mid_job > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
