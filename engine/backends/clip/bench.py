"""CPU speed of the CLIP-family architectures on random weights: image throughput of the fast path
(what indexing runs) and the latency of one query at the model's own token limit (what a search
waits for). Real sizes by default; "tiny" ones check the machinery and mean nothing.

    python -m engine.backends.clip.bench [--size tiny|real] [--images N] [ARCH ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from engine.backends.clip.checkpoints import ARCHS, arch, save_random_clip_checkpoint

_WORDS = ("a red boat drifts past the old harbour wall while gulls circle above the grey water and "
          "children wave from the pier").split()


def query_of(embedder: Any, tokens: int) -> str:
    """A text of exactly `tokens` tokens (special tokens included) for this tokenizer."""
    words: list[str] = []
    while embedder.token_count(" ".join(words)) < tokens:
        words.append(_WORDS[len(words) % len(_WORDS)])
    while embedder.token_count(" ".join(words)) > tokens:
        words.pop()
    return " ".join(words)


def cpu_speed(name: str, size: str = "real", *, images: int = 8, query_reps: int = 5,
              work: Path | None = None) -> dict[str, Any]:
    """Measure one architecture on the CPU (fast compute, the registry's settings)."""
    import numpy as np
    import torch

    from engine.backends.clip.embedder import ClipEmbedder

    a = arch(name, size)
    with tempfile.TemporaryDirectory(prefix="longlens-clip-bench-", dir=work) as tmp:
        folder = save_random_clip_checkpoint(Path(tmp) / name, name=name, size=size, seed=0)
        emb = ClipEmbedder(folder, device="cpu", compute="fast")
        params = sum(p.numel() for p in emb.model.parameters())
        pixels = np.random.default_rng(0).standard_normal((images, 3, a.image_size, a.image_size)).astype(np.float32)
        emb.encode_pixels(pixels[:1])  # warm-up: builds the reduced-precision copy
        t = time.perf_counter()
        emb.encode_pixels(pixels)
        image_s = time.perf_counter() - t
        query = query_of(emb, a.context_length)
        emb.encode_texts([query])
        times = []
        for _ in range(query_reps):
            t = time.perf_counter()
            emb.encode_texts([query])
            times.append(time.perf_counter() - t)
        return {
            "arch": name, "size": size, "params_m": round(params / 1e6, 1), "image_size": a.image_size,
            "text_tokens": emb.token_count(query), "compute_dtype": emb.compute_dtype,
            "threads": torch.get_num_threads(), "query_threads": emb.query_threads,
            "images": images, "images_per_s": round(images / image_s, 2),
            "query_ms_median": round(1000 * statistics.median(times), 1),
        }


def markdown(rows: list[dict[str, Any]]) -> str:
    head = ("| architecture | size | params (M) | input | dtype | images/s | query at limit (ms) |\n"
            "|---|---|---:|---|---|---:|---:|\n")
    return head + "".join(
        f"| {r['arch']} | {r['size']} | {r['params_m']} | {r['image_size']} px, {r['text_tokens']} tokens | "
        f"{r['compute_dtype']} | {r['images_per_s']} | {r['query_ms_median']} |\n" for r in rows)


def build_parser() -> argparse.ArgumentParser:
    from engine import options

    p = argparse.ArgumentParser(prog="python -m engine.backends.clip.bench", description=__doc__.splitlines()[0])
    p.add_argument("archs", nargs="*", default=list(ARCHS), help=f"architectures (default: all of {', '.join(ARCHS)})")
    p.add_argument("--size", choices=("tiny", "real"), default="real")
    p.add_argument("--images", type=options.count("number of images", 1, 10_000), default=8)
    p.add_argument("--json", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    rows = []
    for name in args.archs:
        rows.append(cpu_speed(name, args.size, images=args.images))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(json.dumps(rows, indent=2) if args.json else markdown(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
