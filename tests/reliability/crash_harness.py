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
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path

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


def model_key(home: Path) -> str:
    """The key MODEL's vectors are stored under: its identity (NAME@hash of its files), not its name."""
    from engine.config import get_paths
    from engine.models.registry import installed_identity

    return installed_identity(MODEL, get_paths(str(home))).image


def committed_rows(catalog: Path) -> dict[str, tuple[int, bytes | None]]:
    """path -> (row id, vector bytes) as committed right now, read through a separate connection."""
    if not catalog.exists():
        return {}
    con = sqlite3.connect(f"file:{catalog}?mode=ro", uri=True, timeout=30)
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
    con = sqlite3.connect(f"file:{catalog}?mode=ro", uri=True, timeout=30)
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


def _install_tiny_model(home: Path, work: Path) -> None:
    from engine.cli import main as cli_main
    from engine.models.blip_checkpoints import save_random_blip_checkpoint

    ckpt = save_random_blip_checkpoint(work / "blip-tiny", size="tiny", seed=0)
    os.environ["LONGLENS_HOME"] = str(home)
    if cli_main(["models", "import", str(ckpt), "--name", MODEL]) != 0:
        raise SystemExit("could not install the tiny model")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--restart", choices=["process", "inline"], default="process")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="longlens-crash-") as tmp:
        work = Path(tmp)
        _install_tiny_model(work / "home", work)
        report = run_crash_harness(work / "home", work / "photos", args.iterations, args.seed,
                                   restart=args.restart)
    print(json.dumps(report.as_dict(), indent=2))
    return 0 if report.clean and report.killed_mid_job > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
