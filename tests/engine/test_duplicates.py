"""engine.duplicates below the CLI: pHash pairs against brute force, the pHash cache (64-bit
values, a damaged file), the job's cancel, and similar groups through a real ANN index over
vectors written to a real catalog for real files."""

from __future__ import annotations

import numpy as np
import pytest

from engine.catalog import Catalog, ImageWrite
from engine.duplicates import (
    KIND_EXACT,
    KIND_NEAR,
    KIND_SIMILAR,
    DuplicatesError,
    PhashCache,
    find_duplicates,
    near_pairs,
    phash_of,
)
from engine.errors import JobCancelled
from engine.fileutil import sha256_file
from engine.index.store import IndexStore
from engine.jobs import CancelToken, run_to_end
from engine.types import STATUS_OK
from tests.duplicate_pictures import NEAR_A, make_duplicates_folder


def test_near_pairs_are_exactly_the_brute_force_pairs():
    rng = np.random.default_rng(0)
    h = rng.integers(0, 2**63, 300, dtype=np.uint64) | (rng.integers(0, 2, 300, dtype=np.uint64) << np.uint64(63))
    h[10] = h[3] ^ np.uint64(0b1011)  # 3 bits apart
    brute = {(i, j, bin(int(h[i]) ^ int(h[j])).count("1")) for i in range(300) for j in range(i + 1, 300)}
    for t in (0, 3, 20):
        assert set(near_pairs(h, t)) == {p for p in brute if p[2] <= t}
    assert (3, 10, 3) in set(near_pairs(h, 3))
    token = CancelToken()
    token.cancel()
    with pytest.raises(JobCancelled):
        list(near_pairs(h, 3, token))


def test_phash_cache_keeps_64_bit_values_and_replaces_a_damaged_file(tmp_path):
    path = tmp_path / "phash.sqlite3"
    cache = PhashCache(path)
    cache.put({"a": 2**64 - 1, "b": 0, "c": 2**63})
    cache.close()
    cache = PhashCache(path)
    assert cache.get(["a", "b", "c", "zz"]) == {"a": 2**64 - 1, "b": 0, "c": 2**63}
    cache.close()
    path.write_bytes(b"not a database at all" * 100)
    cache = PhashCache(path)
    assert cache.get(["a"]) == {}
    cache.put({"a": 5})
    assert cache.get(["a"]) == {"a": 5}
    cache.close()


def _catalog_of(root, files, tmp_path, vectors):
    cat = Catalog(tmp_path / "c.sqlite3")
    lib = cat.add_library(root)
    writes = []
    for name, p in sorted(files.items()):
        st = p.stat()
        writes.append(ImageWrite(library_id=lib.id, rel_path=name, size=st.st_size, mtime_ns=st.st_mtime_ns,
                                 content_hash=sha256_file(p), status=STATUS_OK, vector=vectors[name]))
    cat.write_batch("m@1", writes)
    return cat, lib


def test_similar_groups_come_from_the_ann_index_and_never_repeat_near_groups(tmp_path):
    root = tmp_path / "photos"
    files = make_duplicates_folder(root)
    rng = np.random.default_rng(1)
    base = {k: v / np.linalg.norm(v) for k, v in ((k, rng.normal(size=16)) for k in "ABCD")}
    # c and d are another shot of one scene: cosine 0.95; A's copies share A's vector, B's B's.
    base["D"] = 0.95 * base["C"] + np.sqrt(1 - 0.95**2) * _orthogonal(base["C"], rng)
    shows = {"a.jpg": "A", "copies/a copy.jpg": "A", "edits/a quality 55.jpg": "A", "edits/a smaller.jpg": "A",
             "b.jpg": "B", "edits/b rotated.jpg": "B", "c.jpg": "C", "d.png": "D"}
    vectors = {n: base[k].astype(np.float32) for n, k in shows.items()}
    cat, lib = _catalog_of(root, files, tmp_path, vectors)
    store = IndexStore(tmp_path / "indexes", cat, exact_threshold=0)  # hnswlib, not the exact path
    try:
        assert store.get(lib.id, "m@1", 16).mode == "hnsw"
        report = run_to_end_report(find_duplicates(cat, store, similar=0.9, model_identity="m@1", model_name="m",
                                                   phash_cache=PhashCache(tmp_path / "ph.sqlite3")))
        kinds = sorted((g.kind, frozenset(f.path.rsplit("photos/", 1)[1] for f in g.files)) for g in report.groups)
        assert (KIND_SIMILAR, frozenset({"c.jpg", "d.png"})) in kinds
        assert (KIND_NEAR, frozenset(NEAR_A)) in kinds and sum(k == KIND_EXACT for k, _ in kinds) == 1
        assert [k for k, _ in kinds].count(KIND_SIMILAR) == 1  # A and B are far apart: not similar
        sim = next(g for g in report.groups if g.kind == KIND_SIMILAR)
        assert "cosine >= 0.950" in sim.detail
        # Above c-d's cosine they are not grouped; without the pHash stage, A's and B's re-encodes
        # (the same vector here) are found by their embeddings instead, as similar pictures.
        report = run_to_end_report(find_duplicates(cat, store, similar=0.96, model_identity="m@1", near_distance=None))
        assert report.count(KIND_NEAR) == 0 and report.count(KIND_EXACT) == 1
        assert sorted(len(g.files) for g in report.groups if g.kind == KIND_SIMILAR) == [2, 4]
        assert not any(f.path.endswith(("c.jpg", "d.png")) for g in report.groups for f in g.files)
        with pytest.raises(DuplicatesError, match="need the model"):
            run_to_end(find_duplicates(cat, store, similar=0.9))
        token = CancelToken()
        token.cancel()
        with pytest.raises(JobCancelled):
            run_to_end(find_duplicates(cat, store, cancel=token))
    finally:
        cat.close()


def _orthogonal(v, rng):
    w = rng.normal(size=v.shape)
    w -= (w @ v) * v
    return w / np.linalg.norm(w)


def run_to_end_report(job):
    last = run_to_end(job)
    assert last.stage == "done"
    return last.extra["report"]


def test_phash_is_of_the_upright_picture(tmp_path):
    files = make_duplicates_folder(tmp_path / "p")
    assert phash_of(files["b.jpg"]) == phash_of(files["edits/b rotated.jpg"])
    assert bin(phash_of(files["b.jpg"]) ^ phash_of(files["c.jpg"])).count("1") > 16
