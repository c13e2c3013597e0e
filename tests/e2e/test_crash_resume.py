"""kill -9 in the middle of indexing, then resume: nothing committed is lost, no duplicates,
catalog and index agree, and SQLite's integrity check passes."""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.catalog import Catalog
from engine.index.store import index_path
from engine.index.vector_index import VectorIndex
from tests.e2e.conftest import TINY_MODEL

ROOT = Path(__file__).resolve().parents[2]


def _committed(catalog_path: Path) -> dict[str, int]:
    if not catalog_path.exists():
        return {}
    con = sqlite3.connect(f"{Path(catalog_path).absolute().as_uri()}?mode=ro", uri=True, timeout=30)
    try:
        return {p: i for i, p in con.execute("SELECT id, rel_path FROM images")}
    except sqlite3.OperationalError:
        return {}
    finally:
        con.close()


def _index_cmd(photos: Path) -> list[str]:
    return [sys.executable, "-m", "engine", "index", str(photos), "--model", TINY_MODEL,
            "--batch-size", "4", "--quiet", "--json"]


def kill_during_indexing(home: Path, photos: Path, rng: random.Random) -> dict[str, int]:
    """Start indexing in a subprocess, SIGKILL it after a random number of committed rows."""
    env = {**os.environ, "LONGLENS_HOME": str(home)}
    catalog_path = home / "data" / "catalog.sqlite3"
    before = len(_committed(catalog_path))
    target = before + rng.randint(1, 12)
    proc = subprocess.Popen(_index_cmd(photos), cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if len(_committed(catalog_path)) >= target:
                break
            time.sleep(0.02)
        # A random extra delay lands the kill at different points of a batch.
        time.sleep(rng.random() * 0.15)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stderr.close()
    # The kill must have landed mid-job, or the test proves nothing.
    assert proc.returncode == -signal.SIGKILL
    return _committed(catalog_path)


def check_consistent(home: Path, photos: Path) -> None:
    from engine.config import get_paths
    from engine.models.registry import installed_identity

    paths = get_paths(home)
    with Catalog(paths.catalog) as cat:
        assert cat.integrity_check() == "ok"
        assert cat.duplicate_paths() == 0
        lib = cat.libraries()[0]
        key = installed_identity(TINY_MODEL, paths).image  # vectors are stored under the model identity
        ids = cat.embedded_ids(lib.id, key)
        idx = VectorIndex.load(index_path(paths.indexes, lib.id, key), dim=cat.vectors_for([next(iter(ids))], key).shape[1])
        assert set(idx.ids().tolist()) == ids
        n_files = sum(1 for p in photos.rglob("*") if p.is_file())
        assert len(cat.image_records(lib.id)) == n_files
        with cat.read() as conn:
            assert conn.exec_driver_sql(
                "SELECT count(*) FROM (SELECT image_id, model_id FROM embeddings GROUP BY 1, 2 HAVING count(*) > 1)"
            ).scalar() == 0


def run_crash_iterations(home: Path, photos: Path, iterations: int, seed: int) -> None:
    rng = random.Random(seed)
    env = {**os.environ, "LONGLENS_HOME": str(home)}
    catalog_path = home / "data" / "catalog.sqlite3"
    for it in range(iterations):
        committed = kill_during_indexing(home, photos, rng)
        n_files = sum(1 for p in photos.rglob("*") if p.is_file())
        assert len(committed) < n_files, "indexing finished before the kill"
        # Resume to the end.
        done = subprocess.run(_index_cmd(photos), cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        after = _committed(catalog_path)
        # Nothing committed before the kill was lost or re-numbered.
        assert all(after.get(p) == i for p, i in committed.items())
        check_consistent(home, photos)
        # New files so the next iteration has model work to interrupt again.
        from engine.samples import make_sample_folder

        make_sample_folder(photos / f"extra-{it}", n=24, seed=1000 + it, size=(96, 72))


# make stress: tests/reliability/test_crash_harness.py::test_kill9_three_times_loses_nothing is the
# make test version of the same kill -9 and resume.
@pytest.mark.stress
def test_kill9_then_resume(home, tmp_path):
    from engine.samples import make_sample_folder

    photos = tmp_path / "many"
    make_sample_folder(photos, n=300, seed=5)
    run_crash_iterations(home, photos, iterations=1, seed=0)
