"""`longlens bench`: every performance figure with its baseline from the same run.

    longlens bench [--quick] [--json] [--out docs/benchmarks.md] [--no-1m] [--gpu]

Sections (JSON keys): machine, encode (JPEG -> vector throughput, naive vs fast, stage
breakdown, fast-vs-reference agreement), query (text-encode latency, ANN + catalog latency,
recall and bytes per vector at growing sizes), ann_choice (exact/hnsw threshold check),
rss (peak memory while indexing), profile (where the fast image path spends its time), and
with --gpu the CUDA figures (engine/bench/gpu.py). --quick uses the tiny BLIP architecture
and small sizes and finishes in seconds; it checks the machinery, its figures mean nothing.
The Markdown goes to the `bench` block of --out (`bench-quick` with --quick).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.bench.report import machine_description, update_section
from engine.errors import LonglensError

Log = Callable[[str], None]


@dataclass
class BenchConfig:
    model_size: str = "base"
    camera_n: int = 12
    camera_size: tuple[int, int] = (4000, 3000)
    sceneworld_n: int = 24
    batch_size: int = 8
    query_sizes: tuple[int, ...] = (10_000, 100_000, 1_000_000)
    token_counts: tuple[int, ...] = (20, 128, 512)
    text_reps: int = 20
    real_images: int = 2000
    n_queries: int = 200
    ladder: tuple[int, ...] = (500, 1_000, 2_000, 3_000, 5_000, 8_000, 10_000, 20_000)
    rss_images: int = 20_000
    rss_batch_size: int = 32
    profile: bool = True
    notes: list[str] = field(default_factory=list)


QUICK = BenchConfig(
    model_size="tiny", camera_n=2, camera_size=(640, 480), sceneworld_n=3, batch_size=4,
    query_sizes=(1_000, 4_000), text_reps=2, real_images=32, n_queries=10,
    ladder=(250, 500, 1_000), rss_images=60, rss_batch_size=16, profile=False,
)


def _section(log: Log, name: str, fn: Callable[[], Any]) -> Any:
    t = time.perf_counter()
    out = fn()
    log(f"{name}: {time.perf_counter() - t:.0f} s")
    return out


def profile_fast_images(checkpoint: Path, batch_size: int, rows: int = 12) -> str:
    """torch.profiler table (self CPU time by operator) of one fast-path batch."""
    import numpy as np
    import torch
    from torch.profiler import ProfilerActivity, profile

    from engine.backends.blip.embedder import BlipEmbedder

    emb = BlipEmbedder(checkpoint, device="cpu", compute="fast")
    pixels = np.random.default_rng(0).standard_normal((batch_size, 3, emb.image_size, emb.image_size))
    pixels = pixels.astype(np.float32)
    emb.encode_pixels(pixels[:1])
    with profile(activities=[ProfilerActivity.CPU]) as prof, torch.inference_mode():
        emb.encode_pixels(pixels)
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)


SECTIONS = ("encode", "text", "ann", "rss", "profile")


def run_bench(cfg: BenchConfig, *, quick: bool, with_1m: bool = True, gpu: bool = False,
              log: Log | None = None, only: set[str] | None = None,
              base: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run the sections in `only` (default all); the others are taken from `base`, an earlier
    run's JSON (so that one section can be re-measured without the 1M-vector build)."""
    from engine.backends.blip.checkpoints import save_random_blip_checkpoint
    from engine.bench import encode, query, rss

    log = log or (lambda msg: None)
    wanted = set(SECTIONS) if only is None else set(only)
    if wanted != set(SECTIONS) and base is None:
        raise ValueError("running only some sections needs an earlier run's JSON to take the others from")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    result: dict[str, Any] = {
        "quick": quick,
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": {**machine_description(), "load_average_at_start": None if load is None else round(load, 2)},
        "model": f"BLIP ({cfg.model_size} architecture, random weights)",
    }
    if base is not None and wanted != set(SECTIONS):
        for key in ("encode", "query", "rss", "profile"):
            if key in base:
                result[key] = base[key]
        result["remeasured"] = {"sections": sorted(wanted), "date": result["date"], "base_date": base.get("date"),
                                "load_average_at_start": result["machine"]["load_average_at_start"]}
        result["date"], result["machine"] = base.get("date", result["date"]), base.get("machine", result["machine"])
    with tempfile.TemporaryDirectory(prefix="longlens-bench-") as tmp:
        work = Path(tmp)
        log(f"writing a random-weight BLIP checkpoint ({cfg.model_size})")
        ckpt = save_random_blip_checkpoint(work / "ckpt", size=cfg.model_size, seed=0)
        tiny = ckpt if cfg.model_size == "tiny" else save_random_blip_checkpoint(work / "tiny", size="tiny")

        if "encode" in wanted:
            result["encode"] = _section(log, "encode", lambda: encode.run(
                checkpoint=ckpt, work=work / "encode", camera_n=cfg.camera_n, camera_size=cfg.camera_size,
                sceneworld_n=cfg.sceneworld_n, batch_size=cfg.batch_size, log=log))

        def text_section() -> dict[str, Any]:
            from engine.backends.blip.embedder import BlipEmbedder

            # The baseline runs with torch's default threads, as transformers would; the same
            # eager forward on one thread shows how much of the gain is the thread setting alone.
            one_thread = BlipEmbedder(ckpt, device="cpu", compute="reference")
            one_thread.query_threads = 1
            return query.text_encode_latency(
                {"reference": BlipEmbedder(ckpt, device="cpu", compute="reference"),
                 "reference_1_thread": one_thread,
                 "fast": BlipEmbedder(ckpt, device="cpu", compute="fast")},
                cfg.token_counts, cfg.text_reps, log)

        def ann_section() -> dict[str, Any]:
            real_images, real_texts = query.real_embeddings(cfg.real_images, cfg.n_queries, log)
            resampler = query.Resampler(real_images)
            sizes = [n for n in cfg.query_sizes if with_1m or n < 1_000_000]
            rows = query.ann_and_catalog(sizes, resampler, real_texts, log)
            cross = query.crossover(resampler, real_texts, cfg.ladder, log)
            return {
                "vectors": f"{len(real_images)} sceneworld-mini image embeddings of SceneWorld renders, "
                           "resampled with covariance-shaped noise (engine/bench/query.py)",
                "queries": f"{len(real_texts)} sceneworld-mini text embeddings of held-out SceneWorld paragraphs",
                "sizes": rows,
                "crossover": cross,
                "ann_choice": query.ann_choice(rows, cross),
            }

        q = dict(result.get("query", {}))
        if "text" in wanted:
            q["text_encode"] = _section(log, "text", text_section)
        if "ann" in wanted:
            q.update(_section(log, "ann", ann_section))
        result["query"] = q
        if "rss" in wanted:
            result["rss"] = _section(log, "rss", lambda: rss.run(
                checkpoint=tiny, work=work, n=cfg.rss_images, batch_size=cfg.rss_batch_size, log=log))
        if cfg.profile and "profile" in wanted:
            result["profile"] = _section(log, "profile", lambda: profile_fast_images(ckpt, cfg.batch_size))
        if gpu:
            from engine.bench import gpu as gpu_bench

            result["gpu"] = _section(log, "gpu", lambda: gpu_bench.run(work=work / "gpu", quick=quick, log=log))
    return result


# ---------------------------------------------------------------------- Markdown


def _f(x: float, digits: int = 2) -> str:
    return f"{x:,.{digits}f}"


def render_markdown(r: dict[str, Any]) -> str:
    m, enc, q = r["machine"], r["encode"], r["query"]
    lines = [
        "## `longlens bench`" + (" (--quick: tiny model, figures meaningless)" if r["quick"] else ""),
        "",
        f"Generated by `longlens bench` on {r['date']}: {m['cpu']}, {m['cores']} cores, {m['os']}, "
        f"Python {m['python']}, torch {m.get('torch')} ({m.get('torch_threads')} threads)"
        + (f", GPU {m['gpu']}" if m.get("gpu") else ", no GPU")
        + f". 1-min load average at start {m.get('load_average_at_start')}: **the machine was shared** with "
        "other jobs, so absolute figures are noisy; every figure comes with its baseline measured in the "
        f"same run. Model: {r['model']} (speed does not depend on weight values).",
        "",
        *([f"Re-measured on {r['remeasured']['date']} (load average {r['remeasured']['load_average_at_start']}): "
           f"sections {', '.join(r['remeasured']['sections'])}; the rest is from the run above.", ""]
          if "remeasured" in r else []),
        "### (a) Image encode throughput (files -> vectors)",
        "",
        f"Baseline: {enc['baseline']}. Fast: {enc['fast']}.",
        "",
        "| set | files | mean file | naive img/s | fast img/s (end to end) | speed-up | naive ms/img decode / preprocess / model "
        "| fast ms/img decode / preprocess / model | cosine fast vs naive (min) |",
        "|---|---:|---:|---:|---:|---:|---|---|---:|",
    ]
    for name in ("camera", "sceneworld"):
        s = enc[name]
        ns, fs = s["naive"]["stage_ms_per_image"], s["fast_stages"]["stage_ms_per_image"]
        lines.append(
            f"| {name} ({s['file_size']}) | {s['files']} | {s['mean_file_bytes'] / 1e6:.2f} MB "
            f"| {_f(s['naive']['images_per_s'])} | {_f(s['fast_end_to_end']['images_per_s'])} "
            f"| **{_f(s['speedup_end_to_end_vs_naive'])}x** "
            f"| {ns['decode']:.0f} / {ns['preprocess']:.0f} / {ns['model']:.0f} "
            f"| {fs['decode']:.0f} / {fs['preprocess']:.0f} / {fs['model']:.0f} "
            f"| {s['cosine_fast_vs_naive']['min']:.4f} |"
        )
    top = enc["sceneworld"].get("top10_overlap")
    mo = enc["model_only_images_per_s"]
    b = str(max(int(k) for k in mo["fast"]))
    lines += [
        "",
        f"Model only (random pixels, img/s): reference eager fp32 batch 1 {_f(mo['reference_fp32_eager']['1'])}, "
        f"batch {b} {_f(mo['reference_fp32_eager'][b])}; fast ({enc['fast_compute_dtype']}, SDPA) batch 1 "
        f"{_f(mo['fast']['1'])}, batch {b} {_f(mo['fast'][b])} "
        f"(**{_f(mo['fast'][b] / mo['reference_fp32_eager']['1'])}x** the naive model stage).",
    ]
    if top:
        lines.append(
            f"Agreement on the SceneWorld files (fast path incl. draft decode vs naive): top-{top['k']} overlap "
            f"image->image {top['image_to_image']:.3f}, text->image {top['text_to_image']:.3f}; text-vector "
            f"cosine min {top['text_cosine_min']:.5f}."
        )
    lines += [
        "",
        "### (b) Query latency (paragraph -> hits)",
        "",
        f"Vectors: {q['vectors']}. Queries: {q['queries']}.",
        "",
        "Text encode, one paragraph (ms; baseline = transformers eager fp32):",
        "",
        "| tokens | reference p50 | reference p95 | eager fp32, 1 thread p50 | fast p50 | fast p95 "
        "| fast speed-up vs reference | cosine |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in q["text_encode"].values():
        one = row.get("reference_1_thread", {}).get("p50_ms")
        lines.append(
            f"| {row['tokens']} | {row['reference']['p50_ms']:.1f} | {row['reference']['p95_ms']:.1f} "
            f"| {'n/a' if one is None else f'{one:.1f}'} "
            f"| {row['fast']['p50_ms']:.1f} | {row['fast']['p95_ms']:.1f} | {_f(row['speedup_p50'])}x "
            f"| {row['cosine']:.5f} |"
        )
    lines += [
        "",
        "Search after encoding (Searcher.search_vector on a real SQLite catalog with n rows, top 20; ms):",
        "",
        "| n | index | ANN p50 | ANN p95 | catalog p50 | catalog p95 | total p50 with 128-token fast encode |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    enc128 = q["text_encode"].get("128", next(iter(q["text_encode"].values())))["fast"]["p50_ms"]
    for row in q["sizes"]:
        total = enc128 + row["search_ann_p50_ms"] + row["search_catalog_p50_ms"]
        lines.append(
            f"| {row['n']:,} | {row['index_kind']} | {row['search_ann_p50_ms']:.3f} | {row['search_ann_p95_ms']:.3f} "
            f"| {row['search_catalog_p50_ms']:.3f} | {row['search_catalog_p95_ms']:.3f} | {total:.1f} |"
        )
    lines += [
        "",
        "### (c) ANN recall and size (library defaults vs exact search, same vectors and queries)",
        "",
        "| n | index | recall@10 | p50 ms | p95 ms | exact p50 ms | exact p95 ms | speed-up | disk B/vector "
        "| memory B/vector | incremental build s |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in q["sizes"]:
        lines.append(
            f"| {row['n']:,} | {row['index_kind']} | {row['recall_at_10_vs_exact']:.4f} | {row['ann_p50_ms']:.3f} "
            f"| {row['ann_p95_ms']:.3f} | {row['exact_p50_ms']:.3f} | {row['exact_p95_ms']:.3f} "
            f"| {_f(row['ann_speedup_p50_vs_exact'])}x | {row['bytes_per_vector_disk']:.0f} "
            f"| {row['bytes_per_vector_memory']:.0f} | {row['build_s_incremental']:.1f} |"
        )
    ch = q["ann_choice"]
    lines += [
        "",
        "### ANN choice check",
        "",
        f"Library: exact search below EXACT_THRESHOLD={ch['EXACT_THRESHOLD']:,} vectors, hnswlib above with "
        f"M={ch['defaults']['M']}, ef_construction={ch['defaults']['ef_construction']}, "
        f"ef_search={ch['defaults']['ef_search']}. Measured exact->hnsw crossover on these vectors: "
        f"~{ch['measured_crossover_n']} vectors. hnsw recall@10 min {ch['min_recall_at_10']} "
        f"({'meets' if ch['recall_ok'] else 'MISSES'} >= 0.99), max {ch['max_bytes_per_vector_disk'] or 0:.0f} "
        f"bytes/vector on disk ({'within' if ch['size_ok'] else 'OVER'} {ch['budget_bytes_per_vector']}). "
        "The parameter grid behind these defaults is the `ann` / `ann-model` sections (`make bench`).",
        "",
        "### (d) Peak memory while indexing",
        "",
    ]
    rs = r["rss"]
    points = ", ".join(f"{p['done']:,}: {p['rss_mib']:.0f}" for p in rs["rss_at_progress_mib"])
    lines += [
        f"{rs['images']:,} distinct 320x240 JPEGs indexed by a subprocess (tiny BLIP, batch {rs['batch_size']}, "
        f"{rs['wall_s']:.0f} s): RSS after loading the model {rs['rss_after_model_load_mib']:.0f} MiB (baseline), "
        f"peak {rs['peak_rss_mib']:.0f} MiB (the child's VmHWM; ru_maxrss of children, "
        f"{rs['ru_maxrss_children_mib']:.0f} MiB, also counts the benchmark's own pages shared at fork), i.e. "
        f"+{rs['growth_over_model_mib']:.0f} MiB ({_f(rs['peak_over_model_ratio'])}x the baseline). "
        f"RSS (MiB) at images done: {points}.",
    ]
    if "profile" in r:
        lines += [
            "",
            "### Where the fast image path spends its time (torch.profiler, one batch)",
            "",
            "```",
            r["profile"].rstrip(),
            "```",
        ]
    if "gpu" in r:
        from engine.bench import gpu as gpu_bench

        lines += ["", gpu_bench.render_markdown(r["gpu"]).rstrip()]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------- CLI


def _strip_for_json(obj: Any) -> Any:
    return json.loads(json.dumps(obj, default=str))


def _check_bench_outputs(args: Any) -> None:
    """Before the (long) run: the Markdown and JSON outputs must be safe places to write."""
    from engine.outputs import check_output, library_roots

    roots = library_roots(getattr(args, "home", None))
    inputs = [args.merge] if args.merge is not None else []
    if args.out is not None:
        check_output(args.out, what="benchmark report", kind="bench-markdown", inputs=inputs, library_roots=roots)
    if args.json_out is not None:
        check_output(args.json_out, what="benchmark JSON", kind="bench-json", inputs=inputs, library_roots=roots)


def main_args(args: Any) -> int:
    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    cfg = QUICK if args.quick else BenchConfig()
    only = set(args.only.split(",")) if args.only else None
    unknown = (only or set()) - set(SECTIONS)
    if unknown:
        raise LonglensError(f"unknown section(s) to re-measure: {', '.join(sorted(unknown))}; choose from "
                            f"{', '.join(SECTIONS)}", settings=("only",))
    if only is not None and set(only) != set(SECTIONS) and args.merge is None:
        raise LonglensError("re-measuring only some sections needs an earlier run's JSON for the other sections",
                            settings=("only", "merge"))
    base = None
    if args.merge is not None:
        try:
            from engine.jsonfile import read_json_file
            from engine.limits import MAX_REPORT_JSON_BYTES

            base = read_json_file(args.merge, max_bytes=MAX_REPORT_JSON_BYTES)
        except (OSError, ValueError) as exc:
            raise LonglensError(f"cannot read the earlier run's JSON {args.merge}: {exc}", settings=("merge",)) from None
    _check_bench_outputs(args)
    result = run_bench(cfg, quick=args.quick, with_1m=not args.no_1m, gpu=args.gpu, log=log, only=only, base=base)
    out = args.out if args.out is not None else (None if args.quick else Path("docs/benchmarks.md"))
    markdown = render_markdown(result)
    if out is not None:
        update_section(out, "bench-quick" if args.quick else "bench", markdown)
        log(f"wrote the {'bench-quick' if args.quick else 'bench'} section of {out}")
    if args.json_out is not None:
        from engine.fileutil import atomic_write_text

        atomic_write_text(args.json_out, json.dumps(_strip_for_json(result), indent=2) + "\n")
    if args.json:
        print(json.dumps(_strip_for_json(result), indent=2))
    else:
        print(markdown)
    return 0
