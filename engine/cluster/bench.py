"""Throughput of `--cluster local:N` against single-process indexing, on the same files, in one run.

    python -m engine.cluster.bench [--n 600] [--size 320x240] [--model sceneworld-mini] [--cpus 2]

Both runs start from an empty catalog in a temporary LONGLENS_HOME, index the same generated folder
of real image files and use the same model. Reported: wall time end to end (the cluster's includes
starting Ray and loading the model in every actor), the embedding phase alone, and the ratio.
Needs longlens[cluster]. The numbers are this machine's; docs/scale-out.md quotes one run.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

from engine import options


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m engine.cluster.bench")
    ap.add_argument("--n", type=options.count("number of photos", 1, 10_000_000), default=600)
    ap.add_argument("--size", default="320x240")
    ap.add_argument("--model", default="sceneworld-mini")
    ap.add_argument("--cpus", type=options.count("number of CPUs", 1, 4096), default=2)
    ap.add_argument("--block-rows", type=options.count("rows per block", 1, 1_000_000), default=32)
    ap.add_argument("--torch-threads", type=options.count("number of torch threads", 0, 4096), default=0,
                    help="torch intra-op threads for the single-process run (0: torch's default); "
                    "each Ray actor gets 1 (Ray sets OMP_NUM_THREADS to its CPU share)")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    w, h = (int(x) for x in args.size.split("x"))

    from engine.cluster.importer import import_shards
    from engine.cluster.job import ClusterOptions, run_cluster_index
    from engine.config import get_paths
    from engine.jobs import run_to_end
    from engine.models.download import import_model
    from engine.models.registry import installed_model_dir
    from engine.samples import make_sample_folder
    from engine.services import Services

    work = Path(tempfile.mkdtemp(prefix="longlens-cluster-bench-"))
    try:
        photos = work / "photos"
        make_sample_folder(photos, n=args.n, seed=0, size=(w, h))
        homes = {}
        for name in ("single", "cluster"):
            paths = get_paths(work / name).ensure()
            if installed_model_dir(args.model, paths) is None:
                src = installed_model_dir(args.model, get_paths())
                if src is None:
                    raise SystemExit(f"model {args.model!r} is not installed")
                import_model(src, args.model, paths)
            homes[name] = paths

        if args.torch_threads:
            import torch

            torch.set_num_threads(args.torch_threads)
        with Services(homes["single"]) as svc:
            emb = svc.embedder(args.model, device="cpu")
            t = time.perf_counter()
            last = run_to_end(svc.indexer(emb).run(photos))
            single_s = time.perf_counter() - t
        single = last.extra["summary"]

        t = time.perf_counter()
        last = run_to_end(run_cluster_index(photos, work / "shards", args.model, homes["cluster"],
                                            ClusterOptions(address=f"local:{args.cpus}", block_rows=args.block_rows)))
        cluster_s = time.perf_counter() - t
        cs = last.extra["summary"]
        with Services(homes["cluster"]) as svc:
            t = time.perf_counter()
            run_to_end(import_shards(svc.catalog, svc.store, work / "shards", photos))
            import_s = time.perf_counter() - t

        files = args.n
        report = {
            "files": files, "size": args.size, "model": args.model, "cpus": args.cpus, "actors": cs.actors,
            "single_torch_threads": args.torch_threads or "default",
            "single_process_s": round(single_s, 2), "single_files_per_s": round(files / single_s, 1),
            "cluster_total_s": round(cluster_s, 2), "cluster_files_per_s": round(files / cluster_s, 1),
            "cluster_embed_phase_s": round(cs.embed_s, 2),
            "cluster_embed_files_per_s": round(files / cs.embed_s, 1),
            "cluster_first_block_s": round(cs.first_result_s, 2),
            "ray_start_and_scan_s": round(cluster_s - cs.embed_s, 2),
            "import_s": round(import_s, 2), "import_files_per_s": round(files / import_s, 1),
            "ratio_cluster_total_vs_single": round(single_s / cluster_s, 2),
            "ratio_cluster_embed_vs_single": round(single_s / cs.embed_s, 2),
            "shard_bytes_per_file": round(sum(p.stat().st_size for p in (work / "shards").glob("part-*"))
                                          / files, 1),
            "single_embedded": single.embedded,
        }
        print(json.dumps(report, indent=1))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
