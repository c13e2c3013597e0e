"""Concurrent indexing on one catalog (issue 16 item 10): a write that races another process's hard
delete is re-checked and retried inside its transaction, never reported as an "unreadable" catalog;
three real `index` processes plus a file mutator end with a catalog that agrees with the disk."""

from __future__ import annotations

import hashlib
import os
import random
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from engine.catalog import Catalog, ImageWrite
from engine.errors import CatalogError
from engine.types import STATUS_OK
from tests.e2e.conftest import TINY_MODEL

ROOT = Path(__file__).resolve().parents[2]
MODEL = "m"


def _write(lib_id: int, rel: str, image_id: int | None = None, seed: int = 0) -> ImageWrite:
    vec = np.random.default_rng(seed).standard_normal(8).astype(np.float32)
    return ImageWrite(library_id=lib_id, rel_path=rel, size=10, mtime_ns=1, content_hash=f"h{seed}",
                      status=STATUS_OK, image_id=image_id, vector=vec)


@pytest.mark.timeout(60)
def test_write_for_a_row_another_process_hard_deleted_is_rechecked_not_unreadable(tmp_path):
    path = tmp_path / "catalog.sqlite3"
    with Catalog(path) as mine, Catalog(path) as theirs:
        lib = mine.add_library(tmp_path)
        (old_id,) = mine.write_batch(MODEL, [_write(lib.id, "a.jpg", seed=1)])
        # The other process moves a row onto a.jpg's path: write_batch drops the stale row there.
        (moved_id,) = theirs.write_batch(MODEL, [_write(lib.id, "b.jpg", seed=2)])
        theirs.write_batch(MODEL, [_write(lib.id, "a.jpg", image_id=moved_id, seed=2)])
        # This process still thinks old_id is a.jpg's row, classified before the move: the file changed.
        (new_id,) = mine.write_batch(MODEL, [_write(lib.id, "a.jpg", image_id=old_id, seed=3)])
        recs = {r.rel_path: r for r in mine.image_records(lib.id)}
        assert recs["a.jpg"].id == new_id and recs["a.jpg"].content_hash == "h3"
        assert new_id in mine.embedded_ids(lib.id, MODEL)
        np.testing.assert_array_equal(mine.vectors_for([new_id], MODEL)[0], _write(lib.id, "a", seed=3).vector)
        assert mine.integrity_check() == "ok"


@pytest.mark.timeout(60)
def test_write_for_a_removed_library_says_so_and_never_calls_the_catalog_unreadable(tmp_path):
    path = tmp_path / "catalog.sqlite3"
    with Catalog(path) as mine, Catalog(path) as theirs:
        lib = mine.add_library(tmp_path)
        mine.write_batch(MODEL, [_write(lib.id, "a.jpg", seed=1)])
        theirs.remove_library(lib.id)
        with pytest.raises(CatalogError) as info:
            mine.write_batch(MODEL, [_write(lib.id, "b.jpg", seed=2)])
        assert "was removed" in str(info.value) and "unreadable" not in str(info.value)
        assert mine.integrity_check() == "ok"


@pytest.mark.timeout(60)
def test_a_constraint_failure_is_a_conflict_not_an_unreadable_catalog(tmp_path):
    path = tmp_path / "catalog.sqlite3"
    with Catalog(path) as cat:
        with pytest.raises(CatalogError) as info, cat.write() as conn:
            conn.exec_driver_sql("INSERT INTO embeddings VALUES (12345, 'm', 1, x'00', 0)")
        assert "unreadable" not in str(info.value) and "concurrent change" in str(info.value)
        assert "intact" in str(info.value)


# -- real `index` processes and a mutator -----------------------------------------------------------


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def _mutate(root: Path, pool: list[bytes], stop: threading.Event, log: list[str], seed: int,
            mutations: int) -> None:
    """Add, rename, replace, overwrite, truncate and delete files while the indexers run (bounded)."""
    rng = random.Random(seed)
    for i in range(mutations):
        if stop.is_set():
            return
        files = _files(root)
        # "replace" renames a file onto another one's path: the indexer that sees it first moves the
        # row of the vanished file there and hard-deletes the row that held the path, while another
        # indexer may still be writing that row (the FOREIGN KEY race).
        op = rng.choice(["add", "rename", "replace", "replace", "overwrite", "truncate", "delete"])
        try:
            if op == "add" or not files:
                (root / f"added_{i:03d}.jpg").write_bytes(rng.choice(pool) + f"#{i}".encode())
            else:
                victim = rng.choice(files)
                if op == "rename":
                    victim.rename(victim.with_name(f"renamed_{i:03d}{victim.suffix}"))
                elif op == "replace":
                    os.replace(victim, rng.choice([f for f in files if f != victim] or [victim]))
                elif op == "overwrite":
                    victim.write_bytes(rng.choice(pool) + f"@{i}".encode())
                elif op == "truncate":
                    with open(victim, "r+b") as f:
                        f.truncate(rng.choice([0, max(1, victim.stat().st_size // 3)]))
                else:
                    victim.unlink()
            log.append(op)
        except FileNotFoundError:
            pass  # raced with another mutation of the same file
        time.sleep(rng.uniform(0.0, 0.08))


def _index_cmd(photos: Path) -> list[str]:
    return [sys.executable, "-m", "engine", "index", str(photos), "--model", TINY_MODEL, "--batch-size", "3",
            "--quiet", "--json"]


@pytest.mark.parametrize("processes, runs_each, mutations", [
    # Both in make stress: make test runs the crash harness's mutator mode once (test_crash_harness.py),
    # and the deterministic race tests above.
    pytest.param(2, 1, 30, id="2x1-quick", marks=pytest.mark.stress),
    pytest.param(3, 2, 80, id="3x2", marks=pytest.mark.stress),
])
@pytest.mark.timeout(900)
def test_concurrent_indexers_and_a_mutator_end_with_a_catalog_that_agrees_with_the_disk(
        processes, runs_each, mutations, home, paths, photos):
    env = {**os.environ, "LONGLENS_HOME": str(home)}
    pool = [p.read_bytes() for p in _files(photos) if p.suffix in (".jpg", ".png")]
    # A first run creates the catalog and library, so the racing runs all work on existing rows.
    first = subprocess.run(_index_cmd(photos), cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    extra = photos / "more"
    extra.mkdir()
    for i, data in enumerate(pool * 2):
        (extra / f"more_{i:03d}.jpg").write_bytes(data + f"more{i}".encode())

    failures: list[str] = []

    def indexer(k: int) -> None:
        for run in range(runs_each):
            try:
                r = subprocess.run(_index_cmd(photos), cwd=ROOT, env=env, capture_output=True, text=True,
                                   timeout=300)
            except subprocess.TimeoutExpired:
                failures.append(f"indexer {k} run {run}: hung (killed after 300 s)")
                return
            if r.returncode != 0 or "Traceback" in r.stderr:
                failures.append(f"indexer {k} run {run}: rc {r.returncode}: {r.stderr[-2000:]}")

    stop = threading.Event()
    log: list[str] = []
    mutator = threading.Thread(target=_mutate, args=(photos, pool, stop, log, 16, mutations))
    workers = [threading.Thread(target=indexer, args=(k,)) for k in range(processes)]
    mutator.start()
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=700)
    stop.set()
    mutator.join(timeout=30)
    assert not any(w.is_alive() for w in workers), "an indexer thread never finished"
    assert not failures, "\n".join(failures)
    assert len(log) >= min(10, mutations)  # the mutator really ran alongside

    # Quiet now: one more run brings the catalog up to date; then it must agree with the disk.
    last = subprocess.run(_index_cmd(photos), cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert last.returncode == 0, last.stderr
    _assert_catalog_agrees_with_disk(paths, photos)


def _assert_catalog_agrees_with_disk(paths, photos: Path) -> None:
    from engine.index.store import index_path
    from engine.index.vector_index import VectorIndex
    from engine.models.registry import installed_identity

    with Catalog(paths.catalog) as cat:
        assert cat.integrity_check() == "ok"
        (lib,) = cat.libraries()
        assert cat.library_state(lib.id).label == "indexed"
        live = {r.rel_path: r for r in cat.image_records(lib.id) if r.status != "deleted"}
        on_disk = {p.relative_to(photos).as_posix(): p for p in _files(photos)}
        assert set(live) == set(on_disk)
        for rel, rec in live.items():
            st = on_disk[rel].stat()
            assert (rec.size, rec.mtime_ns) == (st.st_size, st.st_mtime_ns), rel
            if rec.status == STATUS_OK:
                assert rec.content_hash == hashlib.sha256(on_disk[rel].read_bytes()).hexdigest(), rel
        key = installed_identity(TINY_MODEL, paths).image  # vectors are stored under the model's identity
        truth = cat.embedded_ids(lib.id, key)
        assert truth == {r.id for r in live.values() if r.status == STATUS_OK}
        dim = cat.vectors_for([next(iter(truth))], key).shape[1]
        ids = VectorIndex.load(index_path(paths.indexes, lib.id, key), dim=dim).ids().tolist()
        assert len(ids) == len(set(ids)) and set(ids) == truth
    con = sqlite3.connect(paths.catalog.as_uri() + "?mode=ro", uri=True)
    try:
        assert con.execute("PRAGMA foreign_key_check").fetchall() == []
    finally:
        con.close()
