"""import-shards on hand-written shards (pyarrow, no Ray): validation, bad shards skipped and
reported, duplicate and stale rows, and deletions only after a finished run."""

from __future__ import annotations

import time

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from engine.cli import main  # noqa: E402
from engine.cluster import ClusterError  # noqa: E402
from engine.cluster import shards as shardio  # noqa: E402
from engine.cluster.importer import import_shards  # noqa: E402
from engine.config import get_paths  # noqa: E402
from engine.jobs import run_to_end  # noqa: E402
from engine.services import Services  # noqa: E402

pytestmark = pytest.mark.cluster

SRC = "/cluster/photos"  # the folder as the (imaginary) cluster saw it
DIM = 8


def _vec(seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)
    return v / np.linalg.norm(v)


def _row(rel: str, seed: int, size: int = 100, mtime: int = 1_000, status: str = "ok") -> dict:
    if status != "ok":
        return {"rel_path": rel, "size": size, "mtime_ns": mtime, "content_hash": f"h{seed}", "status": status,
                "reason": "truncated"}
    return {"rel_path": rel, "size": size, "mtime_ns": mtime, "content_hash": f"h{seed}", "status": "ok",
            "width": 64, "height": 48, "camera_make": "Fuji", "vector": _vec(seed)}


def _write_run(out, rows_per_part: list[list[dict]], *, model: str = "m", complete: bool = True,
               listing: list[tuple[str, int, int]] | None = None) -> str:
    run_id = shardio.new_run_id()
    time.sleep(1.01)  # run ids sort by their start second
    w = shardio.ShardWriter(out, SRC, model, run_id, rows_per_shard=10**6)
    for rows in rows_per_part:
        w.add(shardio.result_table(rows, model))
        w.flush()
    if listing is None:
        listing = [(r["rel_path"], r["size"], r["mtime_ns"]) for rows in rows_per_part for r in rows]
    shardio.write_listing(out, run_id, SRC, model, listing)
    shardio.RunManifest(run_id, SRC, model, len(listing), len(listing), time.time(), time.time(), complete,
                        DIM).save(out)
    return run_id


@pytest.fixture
def svc(tmp_path):
    s = Services(get_paths(tmp_path / "home"))
    yield s
    s.close()


def _import(svc, out, lib, **kw):
    return run_to_end(import_shards(svc.catalog, svc.store, out, lib, **kw)).extra["summary"]


def _live(svc, lib) -> dict[str, str]:
    (library,) = svc.catalog.libraries()
    live = svc.catalog.embedded_ids(library.id, "m")
    return {r.rel_path: r.status for r in svc.catalog.image_records(library.id) if r.status != "ok" or r.id in live}


def test_bad_shards_are_reported_and_skipped(svc, tmp_path):
    out, lib = tmp_path / "shards", tmp_path / "lib"
    _write_run(out, [[_row("a.jpg", 1), _row("b.jpg", 2)], [_row("c.jpg", 3)]])
    (out / "part-zz-garbage.parquet").write_bytes(b"PAR1 this is not parquet")
    short = shardio.result_table([_row("d.jpg", 4)], "m")
    short = short.set_column(short.schema.get_field_index("vector"), "vector",
                             pa.array([[0.5] * (DIM - 1)], pa.list_(pa.float32())))
    pq.write_table(short.replace_schema_metadata(shardio.shard_schema(SRC, "m", DIM, "x").metadata),
                   out / "part-zz-short.parquet")
    missing = shardio.result_table([_row("e.jpg", 5)], "m").drop_columns(["content_hash"])
    pq.write_table(missing.replace_schema_metadata(shardio.shard_schema(SRC, "m", DIM, "x").metadata),
                   out / "part-zz-missing.parquet")
    other = shardio.ShardWriter(out, SRC, "other-model", "zz", 10)
    other.add(shardio.result_table([_row("f.jpg", 6)], "other-model"))
    other.flush()

    s = _import(svc, out, lib, model_id="m")
    reasons = {b["file"]: b["reason"] for b in s.bad_shards}
    assert set(reasons) == {"part-zz-garbage.parquet", "part-zz-short.parquet", "part-zz-missing.parquet",
                            "part-zz-00000.parquet"}
    assert "not a readable Parquet file" in reasons["part-zz-garbage.parquet"]
    assert "row 0 ('d.jpg'): field 'vector' has 7 values, expected 8" in reasons["part-zz-short.parquet"]
    assert "column 'content_hash' is missing" in reasons["part-zz-missing.parquet"]
    assert "model id 'other-model', expected 'm'" in reasons["part-zz-00000.parquet"]
    assert _live(svc, lib) == {"a.jpg": "ok", "b.jpg": "ok", "c.jpg": "ok"}
    assert s.complete and s.merge["new"] == 3


def test_cli_exit_code_and_report_for_a_bad_shard(tmp_path, capsys):
    out, lib = tmp_path / "shards", tmp_path / "lib"
    _write_run(out, [[_row("a.jpg", 1)]])
    (out / "part-zz-garbage.parquet").write_bytes(b"nope")
    assert main(["--home", str(tmp_path / "home"), "import-shards", str(out), "--library", str(lib)]) == 2
    text = capsys.readouterr().out
    assert "BAD SHARD skipped: part-zz-garbage.parquet: not a readable Parquet file" in text
    assert "new 1" in text


def test_validation_names_row_and_field(tmp_path):
    out = tmp_path / "shards"
    out.mkdir()
    bad = shardio.result_table([_row("a.jpg", 1), {**_row("../etc/x.jpg", 2)}], "m")
    path = out / "part-x.parquet"
    pq.write_table(bad.replace_schema_metadata(shardio.shard_schema(SRC, "m", DIM, "x").metadata), path)
    with pytest.raises(ClusterError, match=r"part-x.parquet: row 1 \('../etc/x.jpg'\): field 'rel_path'"):
        shardio.read_shard(path)
    odd = shardio.result_table([{**_row("a.jpg", 1), "status": "maybe"}], "m")
    pq.write_table(odd.replace_schema_metadata(shardio.shard_schema(SRC, "m", DIM, "x").metadata), path)
    with pytest.raises(ClusterError, match=r"row 0 \('a.jpg'\): field 'status' is 'maybe'"):
        shardio.read_shard(path)
    pq.write_table(odd.replace_schema_metadata({}), path)
    with pytest.raises(ClusterError, match="part-x.parquet: format None"):
        shardio.read_shard(path)


def test_duplicate_and_stale_rows_keep_one_row_per_file(svc, tmp_path):
    out, lib = tmp_path / "shards", tmp_path / "lib"
    # The same file twice (a block written twice), and b.jpg in an old version the scan no longer sees.
    _write_run(out, [[_row("a.jpg", 1), _row("b.jpg", 2, size=10)], [_row("a.jpg", 1)],
                     [_row("b.jpg", 7, size=20, mtime=2_000)]],
               listing=[("a.jpg", 100, 1_000), ("b.jpg", 20, 2_000)])
    s = _import(svc, out, lib)
    assert (s.duplicate_rows, s.stale_rows, s.complete) == (1, 1, True)
    (library,) = svc.catalog.libraries()
    recs = {r.rel_path: r for r in svc.catalog.image_records(library.id)}
    assert set(recs) == {"a.jpg", "b.jpg"} and recs["b.jpg"].content_hash == "h7" and recs["b.jpg"].size == 20
    np.testing.assert_array_equal(svc.catalog.vectors_for([recs["b.jpg"].id], "m")[0], _vec(7))
    assert svc.catalog.duplicate_paths() == 0


def test_deletions_only_after_a_finished_run_and_moves_keep_rows(svc, tmp_path):
    out, lib = tmp_path / "shards", tmp_path / "lib"
    _write_run(out, [[_row("a.jpg", 1), _row("b.jpg", 2), _row("c.jpg", 3), _row("bad.jpg", 4, status="unreadable")]])
    first = _import(svc, out, lib)
    assert first.merge["new"] == 3 and first.merge["unreadable"] == [{"path": "bad.jpg", "reason": "truncated"}]
    (library,) = svc.catalog.libraries()
    ids = {r.rel_path: r.id for r in svc.catalog.image_records(library.id)}

    # An unfinished run that no longer lists c.jpg and found a.jpg under a new name: the import
    # still follows the last finished scan, so nothing moves and nothing is deleted yet.
    _write_run(out, [[_row("moved/a.jpg", 1)]], complete=False,
               listing=[("moved/a.jpg", 100, 1_000), ("b.jpg", 100, 1_000)])
    partial = _import(svc, out, lib)
    m = partial.merge
    assert (m["new"], m["moved"], m["deleted"], m["unchanged"]) == (0, 0, 0, 4)
    assert partial.stale_rows == 1

    # The run finishes: c.jpg is soft-deleted, a.jpg's row (and vector) moved, nothing inferred.
    _write_run(out, [], listing=[("moved/a.jpg", 100, 1_000), ("b.jpg", 100, 1_000), ("bad.jpg", 100, 1_000)])
    done = _import(svc, out, lib)
    assert done.complete and done.merge["deleted"] == 1
    live = _live(svc, lib)
    assert live == {"moved/a.jpg": "ok", "b.jpg": "ok", "bad.jpg": "unreadable", "c.jpg": "deleted"}
    recs = {r.rel_path: r.id for r in svc.catalog.image_records(library.id)}
    assert recs["moved/a.jpg"] == ids["a.jpg"] and done.merge["moved"] == 1
    idx = svc.store.get(library.id, "m", DIM)
    assert sorted(idx.ids().tolist()) == sorted([recs["moved/a.jpg"], recs["b.jpg"]])


def test_shards_of_several_folders_need_source(svc, tmp_path):
    out, lib = tmp_path / "shards", tmp_path / "lib"
    _write_run(out, [[_row("a.jpg", 1)]])
    w = shardio.ShardWriter(out, "/elsewhere", "m", "zz", 10)
    w.add(shardio.result_table([_row("z.jpg", 9)], "m"))
    w.flush()
    with pytest.raises(ClusterError, match="several folders .*pick the source folder"):
        _import(svc, out, lib)
    s = _import(svc, out, lib, source_root="/elsewhere")
    assert s.merge["new"] == 1 and not s.complete
    assert "no finished cluster run in the shards folder: nothing is marked deleted" in s.notes


def test_vector_size_must_match_the_catalog(svc, tmp_path):
    out, lib = tmp_path / "shards", tmp_path / "lib"
    _write_run(out, [[_row("a.jpg", 1)]])
    _import(svc, out, lib)
    other = tmp_path / "other"
    w = shardio.ShardWriter(other, SRC, "m", "zz", 10)
    w.add(shardio.result_table([{**_row("q.jpg", 3), "vector": np.ones(4, np.float32) / 2}], "m"))
    w.flush()
    with pytest.raises(ClusterError, match="have 8 values, the shards 4"):
        _import(svc, other, lib)
    assert _live(svc, lib) == {"a.jpg": "ok"}
