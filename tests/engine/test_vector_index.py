"""VectorIndex: exact and hnsw search, mutation, persistence, corruption, concurrency."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from engine.errors import IndexFileError
from engine.index import vector_index as vi
from engine.index.rwlock import RWLock
from engine.index.vector_index import VectorIndex

REPO = Path(__file__).resolve().parents[2]
DIM = 32


def unit(rng: np.random.Generator, n: int, dim: int = DIM) -> np.ndarray:
    x = rng.standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def brute_force(
    ids: np.ndarray, vecs: np.ndarray, q: np.ndarray, k: int, allowed: set[int] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Reference top-k by (-score, id), computed independently of VectorIndex."""
    scores = vecs.astype(np.float64) @ q.astype(np.float64)
    pairs = sorted(zip((-scores).tolist(), ids.tolist(), strict=True))
    pairs = [(s, i) for s, i in pairs if allowed is None or i in allowed][:k]
    return np.array([i for _, i in pairs], dtype=np.int64), np.array([-s for s, _ in pairs], dtype=np.float32)


def recall_at(found: np.ndarray, truth: np.ndarray) -> float:
    return len(np.intersect1d(found, truth)) / len(truth)


def subprocess_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


@pytest.fixture()
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


def build(
    rng: np.random.Generator, n: int, *, mode: str, start: int = 10, **params: int
) -> tuple[VectorIndex, np.ndarray, np.ndarray]:
    ids = np.arange(start, start + 3 * n, 3, dtype=np.int64)  # sparse, like catalog ids after deletes
    vecs = unit(rng, n)
    threshold = 0 if mode == "hnsw" else 10**9
    index = VectorIndex(DIM, exact_threshold=threshold, **params)
    index.add(ids, vecs)
    assert index.mode == mode
    return index, ids, vecs


# ---------------------------------------------------------------------- exact search


def test_exact_matches_brute_force_including_ties(rng: np.random.Generator) -> None:
    index, ids, vecs = build(rng, 500, mode="exact")
    # Exact ties: a one-hot vector scores exactly 1.0 against itself in any summation
    # order; equal scores must come out by ascending id.
    one_hot = np.zeros((1, DIM), dtype=np.float32)
    one_hot[0, 0] = 1.0
    dup_ids = np.array([5, 7_000, 3, int(ids[0])], dtype=np.int64)
    index.add(dup_ids, np.repeat(one_hot, 4, axis=0))
    vecs = vecs.copy()
    vecs[0] = one_hot[0]
    all_ids, all_vecs = (
        np.concatenate([ids, dup_ids[:3]]),
        np.concatenate([vecs, np.repeat(one_hot, 3, axis=0)]),
    )
    queries = np.concatenate([one_hot, unit(rng, 20)])
    for k in (1, 4, 10, 600):
        results = index.query(queries, k)
        assert len(results) == len(queries)
        for q, (got_ids, got_scores) in zip(queries, results, strict=True):
            want_ids, want_scores = brute_force(all_ids, all_vecs, q, k)
            np.testing.assert_array_equal(got_ids, want_ids)
            np.testing.assert_allclose(got_scores, want_scores, rtol=0, atol=1e-5)
            assert got_ids.dtype == np.int64 and got_scores.dtype == np.float32
    top_ids, top_scores = index.query(one_hot, 5)[0]
    assert top_ids[:4].tolist() == [3, 5, int(ids[0]), 7_000]
    assert top_scores[:4].tolist() == [1.0] * 4


def test_exact_query_is_deterministic_and_accepts_1d(rng: np.random.Generator) -> None:
    index, _, vecs = build(rng, 300, mode="exact")
    a = index.query(vecs[3], 10)[0]
    b = index.query(vecs[3][None, :], 10)[0]
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])


def test_empty_index_and_k_larger_than_count(rng: np.random.Generator) -> None:
    index = VectorIndex(DIM)
    ids, scores = index.query(unit(rng, 1), 5)[0]
    assert len(ids) == 0 and len(scores) == 0
    index.add(np.array([1, 2]), unit(rng, 2))
    ids, _ = index.query(unit(rng, 1), 50)[0]
    assert sorted(ids.tolist()) == [1, 2]


def test_rejects_bad_input(rng: np.random.Generator) -> None:
    index = VectorIndex(DIM)
    with pytest.raises(ValueError):
        index.add(np.array([1]), unit(rng, 1, DIM + 1))
    with pytest.raises(ValueError):
        index.add(np.array([-1]), unit(rng, 1))
    with pytest.raises(ValueError):
        index.add(np.array([1, 2]), unit(rng, 1))
    bad = unit(rng, 1)
    bad[0, 0] = np.nan
    with pytest.raises(ValueError):
        index.add(np.array([1]), bad)
    with pytest.raises(ValueError):
        index.query(unit(rng, 1), 0)
    with pytest.raises(ValueError):
        VectorIndex(DIM, M=1)
    assert len(index) == 0


# ---------------------------------------------------------------------- hnsw search


def test_hnsw_recall_against_exact(rng: np.random.Generator) -> None:
    # Uniform random unit vectors are a harder case than real embeddings (no clusters),
    # so this uses a larger ef than the library default.
    index, ids, vecs = build(rng, 4000, mode="hnsw", ef_search=128)
    queries = unit(rng, 100)
    recalls = []
    for q, (got, scores) in zip(queries, index.query(queries, 10), strict=True):
        want, _ = brute_force(ids, vecs, q, 10)
        recalls.append(recall_at(got, want))
        assert np.all(np.diff(scores) <= 0)
        np.testing.assert_allclose(scores, vecs[np.searchsorted(ids, got)] @ q, atol=1e-5)
    assert np.mean(recalls) >= 0.99


def test_mode_switches_at_threshold_and_back_with_hysteresis(rng: np.random.Generator) -> None:
    index = VectorIndex(DIM, exact_threshold=200)
    vecs = unit(rng, 300)
    index.add(np.arange(199), vecs[:199])
    assert index.mode == "exact"
    index.add(np.array([199]), vecs[199:200])
    assert index.mode == "hnsw" and len(index) == 200
    # Every vector survived the switch.
    got, scores = index.query(vecs[150], 1)[0]
    assert got.tolist() == [150] and scores[0] == pytest.approx(1.0, abs=1e-5)
    index.delete(np.arange(100, 199))  # 101 left: above threshold // 2
    assert index.mode == "hnsw"
    index.delete(np.array([0, 1]))  # 99 left: below 100
    assert index.mode == "exact" and len(index) == 99
    assert index.ids().tolist() == [*range(2, 100), 199]
    got, _ = index.query(vecs[50], 1)[0]
    assert got.tolist() == [50]


def test_hnsw_builds_deterministically(rng: np.random.Generator) -> None:
    vecs = unit(rng, 1500)
    queries = unit(rng, 20)
    results = []
    for _ in range(2):
        index = VectorIndex(DIM, exact_threshold=0, ef_search=16)
        index.add(np.arange(1000), vecs[:1000])
        index.add(np.arange(1000, 1500), vecs[1000:])
        results.append(index.query(queries, 10))
    for (a_ids, a_s), (b_ids, b_s) in zip(*results, strict=True):
        np.testing.assert_array_equal(a_ids, b_ids)
        np.testing.assert_array_equal(a_s, b_s)


# ---------------------------------------------------------------------- mutation


@pytest.mark.parametrize("mode", ["exact", "hnsw"])
def test_upsert_replaces_vector(rng: np.random.Generator, mode: str) -> None:
    index, ids, vecs = build(rng, 1200, mode=mode)
    target = int(ids[17])
    new_vec = unit(rng, 1)
    index.add(np.array([target]), new_vec)
    assert len(index) == 1200
    got, scores = index.query(new_vec, 1)[0]
    assert got.tolist() == [target] and scores[0] == pytest.approx(1.0, abs=1e-5)
    # The old vector no longer finds it first (it is now a random vector).
    old_top, _ = index.query(vecs[17], 1)[0]
    assert old_top.tolist() != [target]
    # A repeated id within one batch: the last vector wins.
    a, b = unit(rng, 2)
    index.add(np.array([target, target]), np.stack([a, b]))
    assert len(index) == 1200
    assert index.query(b, 1)[0][0].tolist() == [target]


@pytest.mark.parametrize("mode", ["exact", "hnsw"])
def test_delete_removes_and_ignores_unknown(rng: np.random.Generator, mode: str) -> None:
    index, ids, vecs = build(rng, 1200, mode=mode)
    gone = ids[:600]
    index.delete(np.concatenate([gone, [10**12, 2]]))
    index.delete([])
    assert len(index) == 600
    assert int(gone[0]) not in index and int(ids[-1]) in index
    np.testing.assert_array_equal(index.ids(), ids[600:])
    for q in vecs[:50]:
        got, _ = index.query(q, 10)[0]
        assert not np.isin(got, gone).any()
    # Re-adding a deleted id works and does not duplicate it.
    index.add(gone[:1], vecs[:1])
    got, _ = index.query(vecs[0], 3)[0]
    assert got[0] == gone[0] and len(set(got.tolist())) == len(got)
    assert len(index) == 601


def test_hnsw_slot_reuse_keeps_size_bounded(rng: np.random.Generator, tmp_path: Path) -> None:
    index, ids, vecs = build(rng, 2000, mode="hnsw")
    path = tmp_path / "slots.idx"
    index.save(path)
    size0, slots0, capacity0 = path.stat().st_size, index.stats()["slots"], index.stats()["capacity"]
    next_id = 10**6
    for cycle in range(3):
        index.delete(index.ids())  # threshold 0: stays in hnsw mode with every slot deleted
        assert len(index) == 0
        fresh = np.arange(next_id, next_id + 2000)
        next_id += 2000
        index.add(fresh, unit(rng, 2000))
        stats = index.stats()
        assert stats["slots"] == slots0 and stats["capacity"] == capacity0, (cycle, stats)
        index.save(path)
        assert abs(path.stat().st_size - size0) <= 0.02 * size0
    # Mixed: revive some deleted ids, add new ones, upsert live ones.
    live = index.ids()
    index.delete(live[:500])
    index.add(np.concatenate([live[:200], [5, 6, 7], live[600:700]]), unit(rng, 303))
    assert len(index) == 2000 - 500 + 203
    assert index.stats()["slots"] == slots0
    # hnswlib's own label table agrees with ours: no slot carries an id twice.
    labels = index._hnsw.get_ids_list()  # white-box check of hnswlib state
    assert len(labels) == len(set(labels)) == slots0
    assert set(index.ids().tolist()) <= set(labels)


def test_hnsw_grows_capacity_automatically(rng: np.random.Generator) -> None:
    index = VectorIndex(DIM, exact_threshold=0)
    vecs = unit(rng, 3000)
    index.add(np.arange(10), vecs[:10])
    capacity0 = index.stats()["capacity"]
    for start in range(10, 3000, 97):
        stop = min(start + 97, 3000)
        index.add(np.arange(start, stop), vecs[start:stop])
    stats = index.stats()
    assert stats["count"] == 3000 and stats["capacity"] >= 3000 > capacity0
    hits = [index.query(vecs[i], 1)[0][0][0] == i for i in range(0, 3000, 37)]
    assert np.mean(hits) >= 0.99


# ---------------------------------------------------------------------- filters


def test_filter_exact_mode_equals_filtered_brute_force(rng: np.random.Generator) -> None:
    index, ids, vecs = build(rng, 1000, mode="exact")
    queries = unit(rng, 10)
    for fraction in (0.5, 0.05, 0.003, 0.0):
        allowed_ids = set(rng.choice(ids, size=int(len(ids) * fraction), replace=False).tolist())
        calls: list[int] = []

        def allowed(i: int, allowed_ids: set[int] = allowed_ids, calls: list[int] = calls) -> bool:
            calls.append(i)
            return i in allowed_ids

        for q, (got, scores) in zip(queries, index.query(queries, 10, allowed=allowed), strict=True):
            want, want_scores = brute_force(ids, vecs, q, 10, allowed_ids)
            np.testing.assert_array_equal(got, want)
            np.testing.assert_allclose(scores, want_scores, atol=1e-5)
        if fraction == 0.5:
            # Over-fetch: a permissive filter is asked about a few candidates, not everything.
            assert len(calls) < 0.5 * len(ids) * len(queries)


def test_filter_hnsw_mode_returns_only_allowed(rng: np.random.Generator) -> None:
    index, ids, vecs = build(rng, 3000, mode="hnsw")
    queries = unit(rng, 20)
    for fraction in (0.5, 0.02):
        allowed_ids = set(rng.choice(ids, size=int(len(ids) * fraction), replace=False).tolist())
        recalls = []
        for q, (got, scores) in zip(
            queries, index.query(queries, 10, allowed=allowed_ids.__contains__), strict=True
        ):
            assert set(got.tolist()) <= allowed_ids and len(got) == 10
            assert np.all(np.diff(scores) <= 0)
            recalls.append(recall_at(got, brute_force(ids, vecs, q, 10, allowed_ids)[0]))
        assert np.mean(recalls) >= 0.95
    # Fewer allowed ids than k: exactly those come back, best first.
    few = {int(ids[5]), int(ids[99]), int(ids[2500])}
    got, _ = index.query(queries[0], 10, allowed=few.__contains__)[0]
    np.testing.assert_array_equal(got, brute_force(ids, vecs, queries[0], 10, few)[0])
    got, _ = index.query(queries[0], 10, allowed=lambda i: False)[0]
    assert len(got) == 0


# ---------------------------------------------------------------------- persistence


def assert_same_results(a: VectorIndex, b: VectorIndex, queries: np.ndarray, k: int = 10) -> None:
    for (a_ids, a_s), (b_ids, b_s) in zip(a.query(queries, k), b.query(queries, k), strict=True):
        np.testing.assert_array_equal(a_ids, b_ids)
        np.testing.assert_array_equal(a_s, b_s)


@pytest.mark.parametrize("mode", ["exact", "hnsw"])
def test_save_load_roundtrip(rng: np.random.Generator, tmp_path: Path, mode: str) -> None:
    index, ids, _ = build(rng, 1500, mode=mode, M=12, ef_construction=80, ef_search=40)
    index.delete(ids[:100])  # hnsw: deleted slots must survive the roundtrip as deleted
    path = tmp_path / "sub" / "index.llidx"
    index.save(path)
    assert not [p for p in path.parent.iterdir() if p != path]  # no temp files left behind
    loaded = VectorIndex.load(path, DIM, exact_threshold=0 if mode == "hnsw" else 10**6)
    assert loaded.mode == mode and len(loaded) == len(index)
    assert (loaded.M, loaded.ef_construction, loaded.ef_search) == (12, 80, 40)
    np.testing.assert_array_equal(loaded.ids(), index.ids())
    assert loaded.path == path
    queries = unit(rng, 25)
    assert_same_results(index, loaded, queries)
    # The loaded index keeps working: new ids, revived ids, upserts.
    extra = unit(rng, 3)
    loaded.add(np.array([ids[0], 1, ids[500]]), extra)
    for vec, want in zip(extra, [ids[0], 1, ids[500]], strict=True):
        assert loaded.query(vec, 1)[0][0].tolist() == [want]
    assert not [p for p in path.parent.iterdir() if p != path]


def test_load_switches_mode_to_match_threshold(rng: np.random.Generator, tmp_path: Path) -> None:
    index, _, _ = build(rng, 800, mode="exact")
    index.save(tmp_path / "a.idx")
    assert VectorIndex.load(tmp_path / "a.idx", DIM, exact_threshold=500).mode == "hnsw"


def test_empty_index_roundtrip(tmp_path: Path) -> None:
    VectorIndex(DIM).save(tmp_path / "e.idx")
    loaded = VectorIndex.load(tmp_path / "e.idx", DIM)
    assert len(loaded) == 0 and loaded.mode == "exact"


def rewrite_checksum(data: bytearray) -> bytearray:
    """Make the file's SHA-256 match again, so that only structural checks can catch a change."""
    import hashlib

    fields = vi._FIELDS.size
    digest = hashlib.sha256(bytes(data[:fields]) + bytes(data[vi._HEADER_SIZE :])).digest()
    data[fields : fields + 32] = digest
    return data


def header_with(data: bytes, **changes: int | bytes) -> bytearray:
    names = [
        "magic",
        "version",
        "mode",
        "dim",
        "M",
        "efc",
        "efs",
        "count",
        "capacity",
        "slots",
        "payload_len",
    ]
    values = dict(zip(names, vi._FIELDS.unpack_from(data), strict=True))
    values.update(changes)
    out = bytearray(data)
    out[: vi._FIELDS.size] = vi._FIELDS.pack(*values.values())
    return out


@pytest.fixture(params=["exact", "hnsw"])
def saved(request: pytest.FixtureRequest, rng: np.random.Generator, tmp_path: Path) -> tuple[Path, bytes]:
    index, ids, _ = build(rng, 600, mode=request.param)
    index.delete(ids[:10])
    path = tmp_path / f"{request.param}.idx"
    index.save(path)
    return path, path.read_bytes()


def expect_index_error(path: Path, data: bytes, fragment: str, dim: int = DIM) -> None:
    path.write_bytes(data)
    with pytest.raises(IndexFileError) as info:
        VectorIndex.load(path, dim)
    message = str(info.value)
    assert str(path) in message and fragment in message, message
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # load leaves no temp file


def test_truncated_files_are_rejected(saved: tuple[Path, bytes]) -> None:
    path, data = saved
    expect_index_error(path, b"", "truncated")
    expect_index_error(path, data[:100], "truncated")
    expect_index_error(path, data[:128], "header says the payload is")
    expect_index_error(path, data[: len(data) // 2], "header says the payload is")
    expect_index_error(path, data[:-1], "header says the payload is")
    expect_index_error(path, data + b"\0", "header says the payload is")


def test_flipped_bytes_are_rejected(saved: tuple[Path, bytes]) -> None:
    path, data = saved
    for offset in (128, 129 + 8 * 10, len(data) // 2, len(data) - 1):
        flipped = bytearray(data)
        flipped[offset] ^= 0x40
        expect_index_error(path, bytes(flipped), "checksum")
    # ef_search is not otherwise checked: the checksum covers the header fields too.
    expect_index_error(path, bytes(header_with(data, efs=17)), "checksum")


def test_crafted_headers_are_rejected(saved: tuple[Path, bytes]) -> None:
    path, data = saved
    expect_index_error(path, bytes(header_with(data, magic=b"NOTANIDX")), "magic")
    expect_index_error(path, bytes(header_with(data, version=99)), "newer")
    expect_index_error(path, bytes(header_with(data, dim=2**31)), "dimension")
    expect_index_error(path, bytes(header_with(data, mode=7)), "mode")
    expect_index_error(path, bytes(header_with(data, M=0)), "out of range")
    expect_index_error(path, bytes(header_with(data, count=2**40)), "inconsistent counts")
    expect_index_error(
        path, bytes(header_with(data, count=2**40, slots=2**40, capacity=2**40)), "inconsistent counts"
    )
    expect_index_error(path, bytes(header_with(data, payload_len=2**62)), "header says the payload is")
    reserved = bytearray(data)
    reserved[120] = 1
    expect_index_error(path, bytes(reserved), "reserved")
    # Wrong model dimension asked for.
    path.write_bytes(data)
    with pytest.raises(IndexFileError, match="does not match"):
        VectorIndex.load(path, DIM * 2)


def test_crafted_hnsw_payload_with_valid_checksum_is_rejected(
    rng: np.random.Generator, tmp_path: Path
) -> None:
    index, _, _ = build(rng, 600, mode="hnsw", M=8)
    path = tmp_path / "h.idx"
    index.save(path)
    data = path.read_bytes()
    base = vi._HEADER_SIZE + vi._HNSW_HEADER.size  # level-0 block of element 0
    sdpe = vi._level0_bytes(DIM, 8)
    cases = {
        "link points past": (base + 4, struct.pack("<I", 10**9)),
        "neighbour count": (base, struct.pack("<H", 1000)),
        "flags": (base + 2, b"\x07"),
        "labels": (base + sdpe - 8 + sdpe, data[base + sdpe - 8 : base + sdpe]),  # element 1 gets 0's label
        "entry point": (vi._HEADER_SIZE + 52, struct.pack("<I", 10**6)),
        "bytes per element": (vi._HEADER_SIZE + 24, struct.pack("<Q", 10**9)),
    }
    for fragment, (offset, patch) in cases.items():
        crafted = bytearray(data)
        crafted[offset : offset + len(patch)] = patch
        path.write_bytes(bytes(rewrite_checksum(crafted)))
        with pytest.raises(IndexFileError, match=fragment):
            VectorIndex.load(path, DIM)


FUZZ_SCRIPT = textwrap.dedent(
    """
    import hashlib, sys
    from pathlib import Path
    import numpy as np
    from engine.errors import IndexFileError
    from engine.index import vector_index as vi
    src, work, dim = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    data = src.read_bytes()
    rng = np.random.default_rng(7)
    # Structural region: hnswlib's header, the level-0 link lists, the upper-level lists.
    sdpe = vi._level0_bytes(dim, 8)
    h = vi._HEADER_SIZE
    n = (len(data) - h - vi._HNSW_HEADER.size) // sdpe
    rejected = loaded = 0
    for trial in range(300):
        crafted = bytearray(data)
        for _ in range(int(rng.integers(1, 4))):
            region = rng.integers(0, 3)
            if region == 0:
                off = h + int(rng.integers(0, vi._HNSW_HEADER.size))
            elif region == 1:
                off = h + vi._HNSW_HEADER.size + int(rng.integers(0, n)) * sdpe + int(rng.integers(0, 4 + 4 * 16))
            else:
                off = h + vi._HNSW_HEADER.size + n * sdpe + int(rng.integers(0, len(data) - h - vi._HNSW_HEADER.size - n * sdpe))
            crafted[off] = int(rng.integers(0, 256))
        fields = vi._FIELDS.size
        crafted[fields:fields + 32] = hashlib.sha256(bytes(crafted[:fields]) + bytes(crafted[h:])).digest()
        work.write_bytes(bytes(crafted))
        try:
            index = vi.VectorIndex.load(work, dim, exact_threshold=0)
        except IndexFileError:
            rejected += 1
            continue
        loaded += 1
        q = np.ones((1, dim), dtype=np.float32) / np.sqrt(dim)
        index.query(q, 10)
        index.query(q, 10, allowed=lambda i: i % 2 == 0)
        index.add(np.array([10**9 + trial]), q)
        index.delete(index.ids()[:5])
        index.add(index.ids()[:3], np.repeat(q, 3, axis=0))
    print("OK", rejected, loaded)
    """
)


def test_fuzzed_hnsw_payloads_never_crash_the_process(rng: np.random.Generator, tmp_path: Path) -> None:
    """Byte changes with a recomputed checksum: hnswlib must never see an out-of-bounds graph."""
    index, _, _ = build(rng, 400, mode="hnsw", M=8)
    index.delete(index.ids()[:20])
    src = tmp_path / "src.idx"
    index.save(src)
    proc = subprocess.run(
        [sys.executable, "-c", FUZZ_SCRIPT, str(src), str(tmp_path / "work.idx"), str(DIM)],
        capture_output=True,
        text=True,
        timeout=120,
        env=subprocess_env(),
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    status, rejected, loaded = proc.stdout.split()
    assert status == "OK" and int(rejected) > 100, proc.stdout


def test_open_or_rebuild(rng: np.random.Generator, tmp_path: Path) -> None:
    ids = np.arange(100, 400, dtype=np.int64)
    vecs = unit(rng, 300)
    calls: list[int] = []

    def all_vectors() -> tuple[np.ndarray, np.ndarray]:
        calls.append(1)
        return ids, vecs

    path = tmp_path / "idx" / "lib-1.llidx"
    index, note = VectorIndex.open_or_rebuild(path, DIM, all_vectors, exact_threshold=100)
    assert note is not None and "missing" in note and "300 vectors" in note
    assert path.exists() and index.mode == "hnsw" and len(index) == 300
    again, note = VectorIndex.open_or_rebuild(path, DIM, all_vectors, exact_threshold=100)
    assert note is None and len(calls) == 1
    assert_same_results(index, again, vecs[:5])
    # Damage the payload: rebuilt, with the reason in the note, and the file is good again.
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF
    path.write_bytes(bytes(data))
    rebuilt, note = VectorIndex.open_or_rebuild(path, DIM, all_vectors, exact_threshold=100)
    assert note is not None and "checksum" in note and str(path) in note and len(calls) == 2
    assert len(rebuilt) == 300
    assert VectorIndex.open_or_rebuild(path, DIM, all_vectors, exact_threshold=100)[1] is None
    # A file for another model dimension is rebuilt too.
    _, note = VectorIndex.open_or_rebuild(path, DIM * 2, lambda: (ids[:0], np.empty((0, DIM * 2))))
    assert note is not None and "does not match" in note


@pytest.mark.parametrize("mode", ["exact", "hnsw"])
@pytest.mark.parametrize("failure", ["midway", "replace"])
def test_crash_during_save_keeps_previous_file(
    rng: np.random.Generator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, failure: str
) -> None:
    index, ids, _ = build(rng, 1200, mode=mode)
    path = tmp_path / "keep.idx"
    index.save(path)
    before = path.read_bytes()
    index.delete(ids[:600])
    index.add(np.arange(10**6, 10**6 + 700), unit(rng, 700))

    if failure == "midway":
        real = vi._write_chunks

        def failing(out, chunks, hasher):  # type: ignore[no-untyped-def]
            chunks = iter(chunks)
            real(out, [next(chunks)], hasher)
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(vi, "_write_chunks", failing)
    else:

        def failing_replace(src, dst):  # type: ignore[no-untyped-def]
            raise OSError("power cut before the rename")

        monkeypatch.setattr(vi.os, "replace", failing_replace)

    with pytest.raises(OSError):
        index.save(path)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["keep.idx"]
    old = VectorIndex.load(path, DIM, exact_threshold=0 if mode == "hnsw" else 10**6)
    assert len(old) == 1200
    # The in-memory index is unharmed and the next save succeeds.
    index.save(path)
    assert len(VectorIndex.load(path, DIM)) == 1300


@pytest.mark.parametrize("mode", ["exact", "hnsw"])
def test_reconcile(rng: np.random.Generator, mode: str) -> None:
    catalog = {i: unit(rng, 1)[0] for i in range(0, 1600)}
    index = VectorIndex(DIM, exact_threshold=0 if mode == "hnsw" else 10**6)
    held = np.arange(0, 1200)
    index.add(held, np.stack([catalog[i] for i in held]))
    truth = np.arange(300, 1600)
    fetched: list[int] = []

    def fetch(batch: np.ndarray) -> np.ndarray:
        fetched.extend(batch.tolist())
        return np.stack([catalog[int(i)] for i in batch])

    added, removed = index.reconcile(truth, fetch, batch=128)
    assert (added, removed) == (400, 300)
    assert sorted(fetched) == list(range(1200, 1600))
    np.testing.assert_array_equal(index.ids(), truth)
    for i in (300, 1199, 1200, 1599):
        assert index.query(catalog[i], 1)[0][0].tolist() == [i]
    assert index.reconcile(truth, fetch) == (0, 0)


# ---------------------------------------------------------------------- concurrency


def test_concurrent_queries_while_writing(rng: np.random.Generator, tmp_path: Path) -> None:
    """Readers and a writer for ~2 s, crossing the exact->hnsw threshold, with saves."""
    pool = unit(rng, 4000)
    index = VectorIndex(DIM, exact_threshold=800, ef_search=32)
    index.add(np.arange(500), pool[:500])
    errors: list[BaseException] = []
    stop = threading.Event()
    query_counts = [0] * 4

    def reader(slot: int) -> None:
        local = np.random.default_rng(slot)
        try:
            while not stop.is_set():
                q = pool[local.integers(0, len(pool))]
                allowed = None if slot % 2 else (lambda i: i % 3 != 0)
                ids, scores = index.query(q, 10, allowed=allowed)[0]
                assert len(ids) <= 10 and np.all(np.diff(scores) <= 1e-6)
                assert ((ids >= 0) & (ids < len(pool))).all()
                if allowed is not None:
                    assert all(i % 3 != 0 for i in ids.tolist())
                len(index), 5 in index, index.ids()
                query_counts[slot] += 1
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    def writer() -> None:
        local = np.random.default_rng(99)
        try:
            while not stop.is_set():
                batch = local.integers(0, len(pool), size=int(local.integers(1, 60)))
                index.add(batch, pool[batch])
                index.delete(local.integers(0, len(pool), size=int(local.integers(1, 30))))
                if local.random() < 0.05:
                    index.save(tmp_path / "live.idx")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(4)]
    threads.append(threading.Thread(target=writer))
    for t in threads:
        t.start()
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline and not errors:
        time.sleep(0.05)
    stop.set()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors[0]
    assert all(count > 0 for count in query_counts)
    assert index.mode == "hnsw"
    assert len(VectorIndex.load(tmp_path / "live.idx", DIM)) > 0


def test_rwlock_readers_share_writers_exclude() -> None:
    lock = RWLock()
    inside: list[str] = []
    max_readers = 0
    guard = threading.Lock()
    errors: list[str] = []

    def reader() -> None:
        nonlocal max_readers
        for _ in range(50):
            with lock.read():
                with guard:
                    if "w" in inside:
                        errors.append("reader overlapped a writer")
                    inside.append("r")
                    max_readers = max(max_readers, inside.count("r"))
                time.sleep(0.0005)
                with guard:
                    inside.remove("r")

    def writer() -> None:
        for _ in range(50):
            with lock.write():
                with guard:
                    if inside:
                        errors.append(f"writer overlapped {inside}")
                    inside.append("w")
                time.sleep(0.0002)
                with guard:
                    inside.remove("w")

    threads = [threading.Thread(target=reader) for _ in range(4)] + [
        threading.Thread(target=writer) for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors, errors[:3]
    assert max_readers > 1
    with pytest.raises(RuntimeError):
        lock.release_read()


# ---------------------------------------------------------------------- benchmark


def test_quick_benchmark_emits_json_and_markdown(tmp_path: Path) -> None:
    out = tmp_path / "benchmarks.md"
    out.write_text(
        "# Benchmarks\n\nIntro kept.\n\n<!-- ann:begin -->\nold\n<!-- ann:end -->\n\n## Other\nkept too\n"
    )
    cmd = [sys.executable, "-m", "engine.bench.ann", "--quick", "--json", "--out", str(out)]
    for _ in range(2):  # the second run must replace, not append, the section
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=120, env=subprocess_env(), cwd=REPO
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert set(result) >= {"meta", "sizes", "chosen", "crossover", "library_defaults"}
    assert result["meta"]["synthetic"] is True and "synthetic" in result["meta"]["data"]
    size = result["sizes"][0]
    assert set(size["exact"]) >= {"p50_ms", "p95_ms", "build_s", "bytes_per_vector_disk"}
    cfg = size["hnsw"][0]
    assert set(cfg) >= {
        "M",
        "ef_construction",
        "build_s",
        "bytes_per_vector_disk",
        "bytes_per_vector_memory_est",
    }
    run = cfg["runs"][0]
    assert set(run) >= {"ef_search", "p50_ms", "p95_ms", "recall_at_10", "speedup_p50_vs_exact"}
    assert 0.0 <= run["recall_at_10_min"] <= 1.0 and run["p50_ms"] > 0
    assert set(result["chosen"]) >= {"M", "ef_construction", "ef_search", "recall_at_10", "meets_targets"}
    assert result["crossover"]["points"] and "threshold_rounded" in result["crossover"]
    text = out.read_text()
    assert text.startswith("# Benchmarks\n\nIntro kept.") and text.rstrip().endswith("kept too")
    assert text.count("<!-- ann:begin -->") == 1 and text.count("<!-- ann:end -->") == 1
    assert "old" not in text.split("<!-- ann:begin -->")[1].split("<!-- ann:end -->")[0].splitlines()
    assert "SYNTHETIC" in text and "Chosen parameters" in text
