"""Cluster indexing on a real local Ray runtime (2 CPUs, shut down after each job) with the tiny BLIP
model: results equal single-process indexing, a killed worker loses and duplicates nothing, a
cancelled job resumes, and the CLI verbs work end to end. `make test-cluster` runs these."""

from __future__ import annotations

import os
import shutil
import signal
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray")
pq = pytest.importorskip("pyarrow.parquet")

from engine.cli import main  # noqa: E402
from engine.cluster import shards as shardio  # noqa: E402
from engine.cluster.importer import import_shards  # noqa: E402
from engine.cluster.job import ClusterOptions, run_cluster_index  # noqa: E402
from engine.jobs import CancelToken, run_to_end  # noqa: E402
from engine.models.registry import identity_name  # noqa: E402
from engine.services import Services  # noqa: E402

from .conftest import MODEL, N_PHOTOS, assert_same_catalog, assert_same_results, rankings  # noqa: E402

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]

OPTIONS = ClusterOptions(address="local:2", block_rows=16, rows_per_shard=64)


def _run_job(photos, out, paths, cancel=None, on_progress=None):
    reports = []
    for p in run_cluster_index(photos, out, MODEL, paths, OPTIONS, cancel):
        reports.append(p)
        if on_progress is not None:
            on_progress(p)
    assert reports[-1].stage == "done"
    return reports, reports[-1].extra["summary"]


def _import(paths, out, root):
    with Services(paths) as svc:
        last = run_to_end(import_shards(svc.catalog, svc.store, out, root))
    return last.extra["summary"]


def _shard_rows(out: Path) -> list[dict]:
    rows = []
    for p in shardio.part_files(out):
        rows += pq.read_table(p).to_pylist()
    return rows


def test_cluster_index_and_import_equal_single_process(photos, single_process_home, cluster_home, tmp_path):
    out = tmp_path / "shards"
    reports, s = _run_job(photos, out, cluster_home)
    index_reports = [r for r in reports if r.stage == "index" and r.done]
    assert index_reports and index_reports[-1].done == N_PHOTOS + 1
    assert all(r.total == N_PHOTOS + 1 and r.rate and r.rate > 0 for r in index_reports)
    assert index_reports[-1].eta_s == 0
    assert s.complete and not s.cancelled and s.actors == 2
    assert s.processed == N_PHOTOS + 1 and s.embedded == N_PHOTOS
    assert s.unreadable == [{"path": "broken.jpg", "reason": "truncated"}]  # as decode_image says locally

    # The shards hold every listed column, one row per file, vectors of the model's size.
    parts = shardio.part_files(out)
    assert len(parts) == s.shards_written >= 2
    schema = pq.read_schema(parts[0])
    assert schema.names == list(shardio.SHARD_COLUMNS)
    rows = _shard_rows(out)
    assert sorted(r["rel_path"] for r in rows) == sorted(
        p.relative_to(photos).as_posix() for p in photos.rglob("*") if p.is_file())
    ok = [r for r in rows if r["status"] == "ok"]
    assert len(ok) == N_PHOTOS and all(identity_name(r["model_id"]) == MODEL and len(r["vector"]) == len(ok[0]["vector"]) for r in ok)
    assert all(len(r["content_hash"]) == 64 and r["width"] and r["height"] for r in ok)

    imp = _import(cluster_home, out, photos)
    assert imp.complete and not imp.bad_shards and imp.duplicate_rows == 0
    assert imp.merge["new"] == N_PHOTOS and imp.merge["unreadable"] == s.unreadable
    assert imp.merge["deleted"] == 0
    assert_same_catalog(single_process_home, cluster_home)
    assert_same_results(rankings(single_process_home, photos), rankings(cluster_home, photos))

    # Idempotent: a second import changes nothing.
    again = _import(cluster_home, out, photos)
    m = again.merge
    assert (m["new"], m["changed"], m["moved"], m["deleted"], m["unchanged"]) == (0, 0, 0, 0, N_PHOTOS + 1)
    assert_same_catalog(single_process_home, cluster_home)


def _embed_actor_pids() -> list[int]:
    """Processes of the model actors: Ray titles them ray::MapWorker(MapBatches(EmbedBatches))."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes()
        except OSError:
            continue
        if b"EmbedBatches" in cmd and int(d.name) != os.getpid():
            pids.append(int(d.name))
    return pids


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the worker through /proc")
def test_worker_killed_mid_job_loses_and_duplicates_nothing(photos, single_process_home, cluster_home, tmp_path):
    out = tmp_path / "shards"
    killed: list[int] = []

    def kill_one_worker(p):
        # After the first block came back, with most of the job still queued or in flight.
        if p.stage == "index" and p.done and not killed:
            pids = _embed_actor_pids()
            assert pids, "no model actor process found"
            os.kill(pids[0], signal.SIGKILL)
            killed.append(pids[0])

    reports, s = _run_job(photos, out, cluster_home, on_progress=kill_one_worker)
    assert killed
    assert [r for r in reports if r.stage == "index"][-1].done == N_PHOTOS + 1
    assert s.complete and s.processed == N_PHOTOS + 1
    rows = _shard_rows(out)
    names = [r["rel_path"] for r in rows]
    assert len(names) == len(set(names)) == N_PHOTOS + 1  # nothing lost, nothing written twice

    imp = _import(cluster_home, out, photos)
    assert imp.complete and imp.duplicate_rows == 0 and imp.merge["new"] == N_PHOTOS
    assert_same_catalog(single_process_home, cluster_home)


def test_cancel_keeps_shards_and_rerun_resumes(photos, single_process_home, cluster_home, tmp_path):
    out = tmp_path / "shards"
    token = CancelToken()

    def cancel_early(p):
        if p.stage == "index" and p.done >= 32:
            token.cancel()

    _, first = _run_job(photos, out, cluster_home, cancel=token, on_progress=cancel_early)
    assert first.cancelled and not first.complete
    assert 32 <= first.processed < N_PHOTOS + 1
    (manifest,), _ = shardio.read_runs(out)
    assert not manifest.complete

    # An import of the partial shards adds what is there and deletes nothing.
    partial = _import(cluster_home, out, photos)
    assert not partial.complete and partial.merge["deleted"] == 0
    assert partial.merge["new"] + len(partial.merge["unreadable"]) == first.processed

    _, second = _run_job(photos, out, cluster_home)
    assert second.complete and second.already_in_shards == first.processed
    assert second.processed == N_PHOTOS + 1 - first.processed
    names = [r["rel_path"] for r in _shard_rows(out)]
    assert len(names) == len(set(names)) == N_PHOTOS + 1

    imp = _import(cluster_home, out, photos)
    assert imp.complete
    assert imp.merge["new"] + len(imp.merge["unreadable"]) == N_PHOTOS + 1 - first.processed
    assert imp.merge["unchanged"] == first.processed
    assert_same_catalog(single_process_home, cluster_home)


def test_cli_moves_and_deletions_follow_local_rules(photos, cluster_home, tmp_path, capsys):
    """`longlens index --cluster` + `import-shards` on a folder that then changes: a moved file keeps
    its row and vector, a deleted one is soft-deleted, as local indexing does."""
    lib = tmp_path / "lib"
    shutil.copytree(photos / "2024", lib)  # a smaller copy this test may change
    out = tmp_path / "shards"
    home = ["--home", str(cluster_home.data.parent)]
    assert main([*home, "index", str(lib), "--cluster", "local:2", "--out", str(out), "--model", MODEL,
                 "--quiet"]) == 0
    assert "import-shards" in capsys.readouterr().out
    assert main([*home, "import-shards", str(out), "--library", str(lib), "--json"]) == 0
    with Services(cluster_home) as svc:
        (library,) = svc.catalog.libraries()
        before = {r.rel_path: r for r in svc.catalog.image_records(library.id)}
    n = len(before)
    assert n >= 50

    moved_from = sorted(before)[0]
    deleted = sorted(before)[1]
    (lib / moved_from).rename(lib / "moved-here.jpg")
    (lib / deleted).unlink()
    assert main([*home, "index", str(lib), "--cluster", "local:2", "--out", str(out), "--model", MODEL,
                 "--quiet", "--json"]) == 0
    capsys.readouterr()
    assert main([*home, "import-shards", str(out), "--library", str(lib), "--json"]) == 0
    import json

    summary = json.loads(capsys.readouterr().out)
    m = summary["merge"]
    assert (m["moved"], m["deleted"], m["new"], m["unchanged"]) == (1, 1, 0, n - 2)
    with Services(cluster_home) as svc:
        after = {r.rel_path: r for r in svc.catalog.image_records(library.id)}
        live = svc.catalog.embedded_ids(library.id, svc.embedder(MODEL).identity)
    assert after["moved-here.jpg"].id == before[moved_from].id and after["moved-here.jpg"].id in live
    assert after[deleted].status == "deleted" and after[deleted].id not in live
    assert moved_from not in after
