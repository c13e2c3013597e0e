"""CUDA image-encode benchmark: eager fp16 (transformers) vs the fast path, same run.

    python -m engine.bench.gpu [--out docs/benchmarks.md] [--json] [--compile] [--n-files 2000]
                               [--quick] [--allow-cpu]

Full-size BLIP ViT-B/16 at 384 with random weights. Figures:
* model only, images/s at `--batch` on device-resident pixels: eager fp16 (compute="reference",
  float16 weights) vs fast (SDPA, [CLS]-only last layer, float16 weights), optionally with
  torch.compile of the fast forward (--compile);
* agreement: cosine of fast fp16 vs the float32 reference on the same pixels (goal >= 0.999);
* end to end from JPEG files: `longlens index` (Indexer: thread-pool decode in draft mode and
  preprocessing on the host overlapping the device, pinned-memory copies) on --n-files camera-like
  JPEGs, and the host decode+preprocess rate alone (the host-side ceiling).
Writes the `gpu` block of --out. Without CUDA it only says the figures are pending, unless
--allow-cpu runs the same code on the CPU with the tiny model (a plumbing check for tests).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from engine import options
from engine.bench.report import machine_description, update_section
from engine.outputs import check_script_output


def _write_one(args: tuple[Path, int, tuple[int, int]]) -> None:
    from engine.samples import procedural_picture

    path, seed, size = args
    procedural_picture(np.random.default_rng(seed), size).save(path, "JPEG", quality=90)


def write_jpegs(folder: Path, n: int, size: tuple[int, int]) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    jobs = [(folder / f"img_{i:05d}.jpg", i, size) for i in range(n)]
    with ProcessPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        list(pool.map(_write_one, jobs, chunksize=16))
    return [j[0] for j in jobs]


def _images_per_s(fn: Any, pixels: Any, iters: int, sync: Any) -> float:
    for _ in range(2):
        fn(pixels)
    sync()
    t = time.perf_counter()
    for _ in range(iters):
        fn(pixels)
    sync()
    return iters * len(pixels) / (time.perf_counter() - t)


def run(*, work: Path, quick: bool = False, compile_fast: bool = False, n_files: int = 2000,
        batch: int = 256, allow_cpu: bool = False, log: Any = None) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    from engine.backends.blip.checkpoints import save_random_blip_checkpoint
    from engine.backends.blip.embedder import BlipEmbedder

    log = log or (lambda msg: None)
    cuda = torch.cuda.is_available()
    if not cuda and not allow_cpu:
        return {"available": False, "note": "no CUDA device here: GPU figures pending"}
    device = "cuda" if cuda else "cpu"
    size = "base" if cuda and not quick else "tiny"
    if not cuda:
        batch, n_files = min(batch, 8), min(n_files, 16)
    work.mkdir(parents=True, exist_ok=True)
    # Files first: the writer pool forks, which is safest before CUDA is initialised.
    file_size = (1600, 1200)
    log(f"gpu: writing {n_files} JPEGs of {file_size[0]}x{file_size[1]}")
    files = write_jpegs(work / "photos", n_files, file_size)
    ckpt = save_random_blip_checkpoint(work / f"ckpt-{size}", size=size, seed=0)
    weights = "float16" if cuda else "float32"
    eager = BlipEmbedder(ckpt, device=device, dtype=weights, compute="reference")
    fast = BlipEmbedder(ckpt, device=device, dtype=weights, compute="exact")  # SDPA in the weights' dtype
    reference32 = BlipEmbedder(ckpt, device=device, dtype="float32", compute="reference")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    s = fast.image_size
    gen = torch.Generator(device="cpu").manual_seed(0)
    pixels = torch.randn(batch, 3, s, s, generator=gen).to(device=device, dtype=fast.torch_dtype)
    iters = 3 if quick or not cuda else 10
    result: dict[str, Any] = {"available": cuda, "device": device, "model": f"BLIP {size} (random weights)",
                              "batch": batch, "weights": weights, "machine": machine_description()}

    with torch.inference_mode():
        def eager_fn(px: Any, emb: Any = eager) -> Any:
            return emb.model.vision_proj(emb.vision_states(px)[:, 0])

        result["eager_fp16_images_per_s"] = _images_per_s(eager_fn, pixels, iters, sync)
        log(f"gpu: eager {result['eager_fp16_images_per_s']:.0f} img/s")
        result["fast_images_per_s"] = _images_per_s(fast._fast.image_features, pixels, iters, sync)
        log(f"gpu: fast {result['fast_images_per_s']:.0f} img/s")
        if compile_fast:
            compiled = torch.compile(fast._fast.image_features)
            result["fast_compiled_images_per_s"] = _images_per_s(compiled, pixels, iters, sync)
            log(f"gpu: fast + torch.compile {result['fast_compiled_images_per_s']:.0f} img/s")
        probe = pixels[:64]
        want = F.normalize(reference32.model.vision_proj(reference32.vision_states(probe.float())[:, 0]), dim=-1)
        got = F.normalize(fast._fast.image_features(probe), dim=-1)
        cos = (want * got).sum(-1)
        result["cosine_fast_vs_fp32_reference"] = {"min": float(cos.min()), "mean": float(cos.mean())}
    result["speedup_fast_vs_eager"] = result["fast_images_per_s"] / result["eager_fp16_images_per_s"]
    eager = reference32 = eager_fn = None  # free their device memory before the end-to-end run
    if cuda:
        torch.cuda.empty_cache()

    # End to end: JPEG files -> catalog + index.
    from engine.config import get_paths
    from engine.indexing.decode import decode_image
    from engine.jobs import run_to_end
    from engine.services import Services

    workers = os.cpu_count() or 1

    def prep(p: Path) -> np.ndarray:
        return fast.preprocess([decode_image(p, target_size=s)[0]])[0]

    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(prep, files[: min(64, len(files))]))  # warm the page cache and the pool
        t = time.perf_counter()
        list(pool.map(prep, files))
        result["host_decode_preprocess_images_per_s"] = len(files) / (time.perf_counter() - t)
    log(f"gpu: host decode+preprocess {result['host_decode_preprocess_images_per_s']:.0f} img/s ({workers} threads)")
    with Services(get_paths(work / "home").ensure()) as svc:
        indexer = svc.indexer(fast, batch_size=batch, decode_workers=workers)
        t = time.perf_counter()
        last = run_to_end(indexer.run(work / "photos"))
        wall = time.perf_counter() - t
    summary = last.extra["summary"]
    result["end_to_end"] = {"files": len(files), "file_size": f"{file_size[0]}x{file_size[1]}",
                            "decode_workers": workers, "embedded": summary.embedded,
                            "images_per_s": summary.embedded / wall}
    log(f"gpu: end to end {result['end_to_end']['images_per_s']:.0f} img/s")
    return result


def render_markdown(r: dict[str, Any]) -> str:
    lines = ["## GPU image encode (engine/bench/gpu.py)", ""]
    if not r.get("available") and r.get("device") is None:
        lines += [
            "**Pending**: no CUDA device was available to this run. On a CUDA machine run "
            "`python -m engine.bench.gpu --out docs/benchmarks.md --compile` (about 5 minutes); it measures "
            "eager fp16 vs the fast path (SDPA, fp16 weights, [CLS]-only last layer, batch 256, optional "
            "torch.compile), checks cosine >= 0.999 against the fp32 reference and measures end-to-end "
            "JPEG indexing. Goals: >= 3,500 img/s model only on an H200, >= 1,500 img/s end to end.",
        ]
        return "\n".join(lines) + "\n"
    m = r["machine"]
    label = "" if r["available"] else " (CPU plumbing check, not a GPU figure)"
    lines += [
        f"{r['model']} on {m.get('gpu', r['device'])}{label}, batch {r['batch']}, {r['weights']} weights.",
        "",
        "| path | images/s | vs eager |",
        "|---|---:|---:|",
        f"| eager (transformers) | {r['eager_fp16_images_per_s']:,.0f} | 1.00x |",
        f"| fast (SDPA, [CLS]-only last layer) | {r['fast_images_per_s']:,.0f} | {r['speedup_fast_vs_eager']:.2f}x |",
    ]
    if "fast_compiled_images_per_s" in r:
        v = r["fast_compiled_images_per_s"]
        lines.append(f"| fast + torch.compile | {v:,.0f} | {v / r['eager_fp16_images_per_s']:.2f}x |")
    e = r["end_to_end"]
    lines += [
        "",
        f"Cosine fast vs fp32 reference: min {r['cosine_fast_vs_fp32_reference']['min']:.5f}. End to end "
        f"(`longlens index`, {e['files']} JPEGs of {e['file_size']}, {e['decode_workers']} decode threads): "
        f"{e['images_per_s']:,.0f} img/s; host decode + preprocess alone "
        f"{r['host_decode_preprocess_images_per_s']:,.0f} img/s.",
    ]
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m engine.bench.gpu", description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--compile", action="store_true", help="also measure torch.compile of the fast path")
    ap.add_argument("--n-files", type=options.count("number of files", 1, 10_000_000), default=2000)
    ap.add_argument("--batch", type=options.BATCH_SIZE, default=256)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--allow-cpu", action="store_true", help="without CUDA, run the code path on the CPU")
    return ap


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_script_output(parser, args.out, what="benchmark report")

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="longlens-gpu-") as tmp:
        result = run(work=Path(tmp), quick=args.quick, compile_fast=args.compile, n_files=args.n_files,
                     batch=args.batch, allow_cpu=args.allow_cpu, log=log)
    markdown = render_markdown(result)
    if args.out:
        update_section(args.out, "gpu", markdown)
    print(json.dumps(result, indent=2, default=str) if args.json else markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
