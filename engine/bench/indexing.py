"""Index throughput on this machine: end-to-end (files -> catalog + index) and model-only.

`python -m engine.bench.indexing [--models tiny,base] [--n 48] [--size 1600x1200] [--out docs/benchmarks.md]`

Models are BLIP architectures with RANDOM weights (speed does not depend on the weights):
"tiny" is the test configuration, "base" the full blip-itm-base-coco architecture
(ViT-B/16 at 384). Files are real JPEGs written for the run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from engine import options
from engine.outputs import check_script_output


def _write_jpegs(folder: Path, n: int, size: tuple[int, int], seed: int = 0) -> list[Path]:
    from engine.samples import procedural_picture

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        p = folder / f"photo_{i:04d}.jpg"
        procedural_picture(rng, size).save(p, "JPEG", quality=90)
        out.append(p)
    return out


def bench_model(size_name: str, photos: Path, work: Path, batch_size: int) -> dict:
    from engine.backends.blip.checkpoints import save_random_blip_checkpoint
    from engine.config import get_paths
    from engine.indexing.decode import decode_image
    from engine.models.download import import_model
    from engine.services import Services

    paths = get_paths(work / f"home-{size_name}").ensure()
    ckpt = save_random_blip_checkpoint(work / f"ckpt-{size_name}", size=size_name, seed=0)
    name = f"bench-{size_name}"
    import_model(ckpt, name, paths)
    with Services(paths) as svc:
        emb = svc.embedder(name, device="cpu")
        files = sorted(photos.glob("*.jpg"))
        # Model-only: preprocessed pixels straight into the vision tower, same batch size.
        pixels = emb.preprocess([decode_image(f, target_size=emb.image_size)[0] for f in files[:batch_size]])
        emb.encode_pixels(pixels[:2])  # warm-up
        reps = []
        for _ in range(2):
            t = time.perf_counter()
            emb.encode_pixels(pixels)
            reps.append(len(pixels) / (time.perf_counter() - t))
        model_ips = statistics.median(reps)
        indexer = svc.indexer(emb, batch_size=batch_size)
        t = time.perf_counter()
        from engine.jobs import run_to_end

        last = run_to_end(indexer.run(photos))
        wall = time.perf_counter() - t
        summary = last.extra["summary"]
    assert summary.embedded == len(files), summary
    return {
        "model": size_name,
        "images": len(files),
        "batch_size": batch_size,
        "end_to_end_images_per_s": len(files) / wall,
        "model_only_images_per_s": model_ips,
        "end_to_end_over_model_only": (len(files) / wall) / model_ips,
        "wall_s": wall,
    }


def render(result: dict) -> str:
    m = result["machine"]
    lines = [
        "## Index throughput (CPU, this machine)",
        "",
        f"Measured by `python -m engine.bench.indexing` on {m['cpu']} ({m['cores']} cores, "
        f"torch {m.get('torch')} with {m.get('torch_threads')} threads). Files: {result['images']} real JPEGs of "
        f"{result['size']} written for the run; BLIP architectures with random weights (speed does not depend "
        "on weight values). End to end = scan + hash + decode (draft mode) + preprocess + model + catalog commit "
        "+ index update; model only = the vision tower on preprocessed pixels, same batch size, same run.",
        "",
        "| model | images | batch | end to end (img/s) | model only (img/s) | end to end / model only |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in result["runs"]:
        lines.append(
            f"| {r['model']} | {r['images']} | {r['batch_size']} | {r['end_to_end_images_per_s']:.2f} | "
            f"{r['model_only_images_per_s']:.2f} | {r['end_to_end_over_model_only']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m engine.bench.indexing", description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="tiny,base")
    ap.add_argument("--n", type=options.count("number of photos", 1, 10_000_000), default=48)
    ap.add_argument("--size", default="1600x1200")
    ap.add_argument("--batch-size", type=options.BATCH_SIZE, default=16)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--json", action="store_true")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_script_output(parser, args.out, what="benchmark report")
    from engine.bench.report import machine_description, update_section

    w, h = (int(x) for x in args.size.lower().split("x"))
    runs = []
    with tempfile.TemporaryDirectory(prefix="longlens-bench-") as tmp:
        work = Path(tmp)
        photos = work / "photos"
        _write_jpegs(photos, args.n, (w, h))
        for size_name in args.models.split(","):
            runs.append(bench_model(size_name.strip(), photos, work, args.batch_size))
    result = {"machine": machine_description(), "images": args.n, "size": args.size, "runs": runs}
    if args.out:
        update_section(args.out, "indexing", render(result))
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(render(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
