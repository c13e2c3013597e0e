"""Query latency (encode / ANN / catalog) and ANN quality at growing collection sizes.

Vectors come from the model's own embedding distribution: sceneworld-mini embeddings of real
SceneWorld renders, resampled with Gaussian perturbations shaped by their covariance (each
synthetic vector = a real one + noise along the data's principal directions, renormalised),
so clusters and anisotropy follow the real embeddings. ANN queries are sceneworld-mini
*text* embeddings of SceneWorld paragraphs (the modality gap included).

One catalog (a real SQLite file) and one pair of indexes grow through the sizes; at each size:
* ANN: VectorIndex as the library configures it (exact below EXACT_THRESHOLD, hnswlib above)
  against exact search (the baseline): recall@10, p50/p95, bytes per vector on disk and in
  memory (reusing engine.bench.ann's helpers);
* full query: Searcher.search_vector on the real catalog (timings "ann" and "catalog"), and
  text encoding of 20-, 128- and 512-token paragraphs with the full-size BLIP text tower,
  fast path against transformers' eager float32 (the baseline).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from engine.bench import ann
from engine.index import vector_index as vi
from engine.index.vector_index import VectorIndex

Log = Callable[[str], None]
K = 10
TOP_K = 20  # hits a search returns by default


# ---------------------------------------------------------------------- data


def real_embeddings(n_images: int, n_texts: int, log: Log) -> tuple[np.ndarray, np.ndarray]:
    """sceneworld-mini image embeddings of SceneWorld renders, and text embeddings of held-out
    scenes' paragraphs (queries)."""
    from engine.config import get_paths
    from engine.models.registry import load_embedder
    from engine.sceneworld import generate_scene
    from engine.sceneworld.render import render_scene

    with tempfile.TemporaryDirectory(prefix="longlens-bench-") as tmp:
        emb = load_embedder("sceneworld-mini", get_paths(tmp).ensure(), device="cpu")
        images = []
        for start in range(0, n_images, 256):
            batch = [render_scene(generate_scene(1000, i), emb.image_size)[0]
                     for i in range(start, min(n_images, start + 256))]
            images.append(emb.encode_images(batch))
        log(f"query: {n_images} real image embeddings")
        texts = [generate_scene(1000, n_images + i).paragraph.text for i in range(n_texts)]
        return np.concatenate(images), emb.encode_texts(texts)


class Resampler:
    """Draws vectors around real embeddings: parent + covariance-shaped noise, renormalised."""

    def __init__(self, real: np.ndarray, *, noise: float = 0.5, seed: int = 0) -> None:
        self.real = real.astype(np.float32)
        centred = self.real - self.real.mean(axis=0)
        cov = centred.T @ centred / max(len(real) - 1, 1)
        eigval, eigvec = np.linalg.eigh(cov.astype(np.float64))
        self._shape = (np.sqrt(np.clip(eigval, 0, None))[:, None] * eigvec.T).astype(np.float32) * noise
        self._rng = np.random.default_rng(seed)

    def sample(self, n: int, chunk: int = 65536) -> np.ndarray:
        out = np.empty((n, self.real.shape[1]), dtype=np.float32)
        for s in range(0, n, chunk):
            m = min(chunk, n - s)
            parents = self.real[self._rng.integers(0, len(self.real), m)]
            x = parents + self._rng.standard_normal((m, self.real.shape[1])).astype(np.float32) @ self._shape
            out[s : s + m] = x / np.linalg.norm(x, axis=1, keepdims=True)
        return out


# ---------------------------------------------------------------------- text encode


def paragraph_of_tokens(tokenizer: Any, n_tokens: int) -> str:
    """A SceneWorld-style paragraph that tokenises to exactly n_tokens ([CLS] and [SEP] included)."""
    from engine.sceneworld import generate_scene

    words: list[str] = []
    i = 0
    while len(tokenizer(" ".join(words), verbose=False)["input_ids"]) < n_tokens + 8:
        words += generate_scene(1000, 900_000 + i).paragraph.text.split()
        i += 1
    ids = tokenizer(" ".join(words), add_special_tokens=False, verbose=False)["input_ids"][: n_tokens - 2]
    text = tokenizer.decode(ids)
    # decode/encode can merge or split a piece at the edge; trim until it fits exactly.
    while len(tokenizer(text)["input_ids"]) > n_tokens:
        text = text.rsplit(" ", 1)[0]
    return text


def text_encode_latency(
    embedders: dict[str, Any], token_counts: Sequence[int], reps: int, log: Log
) -> dict[str, Any]:
    """p50/p95 ms of encode_texts([one paragraph]) per embedder and length, interleaved so that
    load from other processes hits every variant alike."""
    first = next(iter(embedders.values()))
    out: dict[str, Any] = {}
    for n in token_counts:
        text = paragraph_of_tokens(first.tokenizer, n)
        used = len(first.tokenizer(text)["input_ids"])
        times: dict[str, list[float]] = {name: [] for name in embedders}
        vecs = {}
        for name, emb in embedders.items():
            vecs[name] = emb.encode_texts([text], max_tokens=n)[0]  # warm-up
        for _ in range(reps):
            for name, emb in embedders.items():
                t = time.perf_counter()
                emb.encode_texts([text], max_tokens=n)
                times[name].append(time.perf_counter() - t)
        row: dict[str, Any] = {"tokens": used}
        for name, ts in times.items():
            p50, p95 = ann.percentiles(ts)
            row[name] = {"p50_ms": p50, "p95_ms": p95}
        names = list(embedders)
        # Ratios and agreement against the first embedder (the baseline) for every other one;
        # the top-level keys compare the baseline with "fast".
        for other in names[1:]:
            row[other]["speedup_p50_vs_" + names[0]] = row[names[0]]["p50_ms"] / row[other]["p50_ms"]
            row[other]["cosine_vs_" + names[0]] = float(vecs[names[0]] @ vecs[other])
        if "fast" in embedders and names[0] != "fast":
            row["speedup_p50"] = row[names[0]]["p50_ms"] / row["fast"]["p50_ms"]
            row["cosine"] = float(vecs[names[0]] @ vecs["fast"])
        out[str(n)] = row
        log(f"query: text encode {used} tokens " + ", ".join(f"{k} {row[k]['p50_ms']:.0f} ms" for k in names))
    return out


# ---------------------------------------------------------------------- ANN + catalog


def _fill_catalog(catalog: Any, library_id: int, start: int, stop: int) -> list[int]:
    """Rows start..stop-1 of a camera-like library in one executemany per 50k rows (the real
    schema; Catalog.write_batch adds rows one statement at a time, ~1k rows/s, too slow for 1M).
    Returns the new row ids in order."""
    from sqlalchemy import insert, select

    from engine.catalog.schema import images

    now = time.time()
    with catalog.write() as conn:
        first = conn.execute(select(images.c.id).order_by(images.c.id.desc()).limit(1)).scalar() or 0
        for s in range(start, stop, 50_000):
            conn.execute(insert(images), [
                {"library_id": library_id, "rel_path": f"{i // 1000:04d}/IMG_{i:07d}.jpg", "size": 3_000_000 + i,
                 "mtime_ns": 1_700_000_000_000_000_000 + i, "content_hash": f"{i:064x}", "status": "ok",
                 "width": 4000, "height": 3000, "camera_make": "Bench", "camera_model": "Cam",
                 "added_at": now, "updated_at": now}
                for i in range(s, min(stop, s + 50_000))
            ])
        ids = conn.execute(select(images.c.id).where(images.c.id > first).order_by(images.c.id)).scalars().all()
    if len(ids) != stop - start:
        raise RuntimeError(f"catalog fill wrote {len(ids)} rows, expected {stop - start}")
    return [int(i) for i in ids]


def ann_and_catalog(
    sizes: Sequence[int], resampler: Resampler, queries: np.ndarray, log: Log
) -> list[dict[str, Any]]:
    from engine.config import get_paths
    from engine.search.searcher import Searcher
    from engine.services import Services

    dim = queries.shape[1]
    rows = []
    with tempfile.TemporaryDirectory(prefix="longlens-bench-") as tmp:
        work = Path(tmp)
        with Services(get_paths(work / "home").ensure()) as svc:
            lib = svc.catalog.add_library(work / "photos")
            model_id = "bench-model"
            chosen = svc.store.get(lib.id, model_id, dim)  # as the app configures it
            exact = VectorIndex(dim, exact_threshold=max(sizes) + 1)

            class _Emb:  # what Searcher.search_vector reads of an embedder
                model_id, dim = "bench-model", queries.shape[1]
                identity = text_identity = model_id

            searcher = Searcher(svc.catalog, svc.store, _Emb())
            done = 0
            for n in sizes:
                t = time.perf_counter()
                ids = np.asarray(_fill_catalog(svc.catalog, lib.id, done, n), dtype=np.int64)
                t_cat = time.perf_counter() - t
                vecs = resampler.sample(n - done)
                exact.add(ids, vecs)
                t = time.perf_counter()
                chosen.add(ids, vecs)
                t_idx = time.perf_counter() - t
                done = n
                log(f"query: n={n:,}: catalog +{t_cat:.0f} s, index +{t_idx:.0f} s ({chosen.stats().get('mode')})")
                truth = ann.search_all(exact, queries)
                recall = ann.recall_at_k(ann.search_all(chosen, queries), truth)
                (ex_p50, ex_p95), (p50, p95) = ann.time_queries([exact, chosen], queries)
                searcher.search_vector(queries[0], TOP_K)  # warm the catalog's caches
                ann_ms, cat_ms = [], []
                for q in queries:
                    res = searcher.search_vector(q, TOP_K)
                    ann_ms.append(res.timings_ms["ann"] / 1000)
                    cat_ms.append(res.timings_ms["catalog"] / 1000)
                with tempfile.TemporaryDirectory(dir=work) as scratch:
                    disk = ann.disk_bytes(chosen, Path(scratch))
                stats = chosen.stats()
                rows.append({
                    "n": n,
                    "index_kind": stats.get("mode"),
                    "index_params": {k: stats.get(k) for k in ("M", "ef_construction", "ef_search") if k in stats},
                    "recall_at_10_vs_exact": recall,
                    "ann_p50_ms": p50, "ann_p95_ms": p95,
                    "exact_p50_ms": ex_p50, "exact_p95_ms": ex_p95,
                    "ann_speedup_p50_vs_exact": ex_p50 / p50,
                    "search_ann_p50_ms": ann.percentiles(ann_ms)[0],
                    "search_ann_p95_ms": ann.percentiles(ann_ms)[1],
                    "search_catalog_p50_ms": ann.percentiles(cat_ms)[0],
                    "search_catalog_p95_ms": ann.percentiles(cat_ms)[1],
                    "bytes_per_vector_disk": disk / n,
                    "bytes_per_vector_memory": stats.get("memory_bytes", 0) / n,
                    "build_s_incremental": t_idx,
                })
                log(f"query: n={n:,}: recall@10 {recall:.4f}, ann p50 {p50:.3f} ms (exact {ex_p50:.3f} ms)")
    return rows


def ann_choice(rows: list[dict[str, Any]], crossover: dict[str, Any] | None) -> dict[str, Any]:
    """Point 4 of the design: exact below a measured threshold, hnswlib above it with
    recall@10 >= 0.99 and <= 1.4 KB per image (vectors + graph)."""
    hnsw_rows = [r for r in rows if r["index_kind"] == "hnsw"]
    budget = 1400
    return {
        "EXACT_THRESHOLD": vi.EXACT_THRESHOLD,
        "defaults": {"M": vi.DEFAULT_M, "ef_construction": vi.DEFAULT_EF_CONSTRUCTION,
                     "ef_search": vi.DEFAULT_EF_SEARCH},
        "measured_crossover_n": None if crossover is None else crossover.get("measured_crossover_n"),
        "min_recall_at_10": min((r["recall_at_10_vs_exact"] for r in hnsw_rows), default=None),
        "max_bytes_per_vector_disk": max((r["bytes_per_vector_disk"] for r in hnsw_rows), default=None),
        "budget_bytes_per_vector": budget,
        "recall_ok": all(r["recall_at_10_vs_exact"] >= ann.RECALL_TARGET for r in hnsw_rows),
        "size_ok": all(r["bytes_per_vector_disk"] <= budget for r in hnsw_rows),
    }


def crossover(resampler: Resampler, queries: np.ndarray, ladder: Sequence[int], log: Log) -> dict[str, Any]:
    data = resampler.sample(max(ladder))
    return ann.measure_crossover(data, queries, ladder, vi.DEFAULT_M, vi.DEFAULT_EF_CONSTRUCTION,
                          vi.DEFAULT_EF_SEARCH, log)
