"""Peak memory (RSS) while indexing many images: streaming with bounded queues keeps it flat.

The parent writes N distinct small JPEGs, then runs `python -m engine.bench.rss --child ...`
in a subprocess that indexes them with a BLIP checkpoint and prints its VmRSS / VmHWM (from
/proc/self/status) before indexing and at progress points as JSON lines; the parent adds the
child's ru_maxrss from resource.getrusage(RUSAGE_CHILDREN). The baseline is the RSS after
the model is loaded, before the first file: what indexing adds on top of the model is the
figure that must not grow with N.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from engine import options

Log = Callable[[str], None]


def write_distinct_jpegs(folder: Path, n: int, size: tuple[int, int] = (320, 240), seed: int = 0) -> None:
    """n JPEGs with distinct content (so every file needs the model): 64 procedural pictures,
    each file stamped with its own random 12x12 block."""
    from engine.samples import procedural_picture

    rng = np.random.default_rng(seed)
    bases = [np.asarray(procedural_picture(rng, size)) for _ in range(64)]
    w, h = size
    for i in range(n):
        arr = bases[i % len(bases)].copy()
        x, y = int(rng.integers(0, w - 12)), int(rng.integers(0, h - 12))
        arr[y : y + 12, x : x + 12] = rng.integers(0, 256, (12, 12, 3), dtype=np.uint8)
        sub = folder / f"{i // 1000:03d}"
        sub.mkdir(parents=True, exist_ok=True)
        Image.fromarray(arr).save(sub / f"img_{i:06d}.jpg", "JPEG", quality=90)


def _proc_status_kib(field: str) -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)  # KiB on Linux


def _child(folder: Path, home: Path, checkpoint: Path, batch_size: int, every: int) -> int:
    from engine.backends.blip.embedder import BlipEmbedder
    from engine.config import get_paths
    from engine.services import Services

    def report(stage: str, done: int) -> None:
        print(json.dumps({"stage": stage, "done": done, "rss_kib": _proc_status_kib("VmRSS"),
                          "hwm_kib": _proc_status_kib("VmHWM")}), flush=True)

    emb = BlipEmbedder(checkpoint, device="cpu", compute="fast")
    with Services(get_paths(home).ensure()) as svc:
        emb.encode_pixels(emb.preprocess([Image.new("RGB", (64, 64))]))  # allocate the model's buffers
        report("loaded", 0)
        next_report = every
        t = time.perf_counter()
        summary = None
        for p in svc.indexer(emb, batch_size=batch_size).run(folder):
            if p.stage == "index" and p.done >= next_report:
                report("index", p.done)
                next_report += every
            if p.stage == "done":
                summary = p.extra["summary"]
        report("done", summary.embedded if summary else 0)
        print(json.dumps({"stage": "summary", "embedded": summary.embedded if summary else 0,
                          "wall_s": time.perf_counter() - t}), flush=True)
    return 0


def run(*, checkpoint: Path, work: Path, n: int, batch_size: int, log: Log) -> dict[str, Any]:
    import resource

    folder = work / "rss-photos"
    log(f"rss: writing {n} JPEGs")
    write_distinct_jpegs(folder, n)
    every = max(n // 10, 1)
    cmd = [sys.executable, "-m", "engine.bench.rss", "--child", "--folder", str(folder),
           "--home", str(work / "rss-home"), "--checkpoint", str(checkpoint),
           "--batch-size", str(batch_size), "--every", str(every)]
    log(f"rss: indexing {n} images in a subprocess")
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    if proc.returncode != 0:
        raise RuntimeError(f"rss child failed ({proc.returncode}): {proc.stderr[-2000:]}")
    children_max = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    points = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    summary = next(p for p in points if p["stage"] == "summary")
    samples = [p for p in points if p["stage"] != "summary"]
    loaded = next(p for p in samples if p["stage"] == "loaded")
    peak_kib = max(p["hwm_kib"] for p in samples)
    mid = [p for p in samples if p["stage"] == "index"]
    return {
        "images": summary["embedded"],
        "wall_s": summary["wall_s"],
        "batch_size": batch_size,
        "rss_after_model_load_mib": loaded["rss_kib"] / 1024,
        "peak_rss_mib": peak_kib / 1024,
        "ru_maxrss_children_mib": (children_max if children_max > before else peak_kib) / 1024,
        "growth_over_model_mib": (peak_kib - loaded["rss_kib"]) / 1024,
        "peak_over_model_ratio": peak_kib / loaded["rss_kib"],
        "rss_at_progress_mib": [{"done": p["done"], "rss_mib": p["rss_kib"] / 1024} for p in mid],
    }


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m engine.bench.rss", description=__doc__.split("\n")[0])
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--folder", type=Path, required=True)
    ap.add_argument("--home", type=Path, required=True)
    ap.add_argument("--checkpoint", type=Path, required=True)
    ap.add_argument("--batch-size", type=options.BATCH_SIZE, default=32)
    ap.add_argument("--every", type=options.count("photos between samples", 1, 100_000_000), default=1000)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return _child(args.folder, args.home, args.checkpoint, args.batch_size, args.every)


if __name__ == "__main__":
    raise SystemExit(main())
