"""Time CLIP-family grounding on this machine's CPU (docs/grounding.md, "Time per image").

    PYTHONPATH=. .venv/bin/python scripts/measure_clip_grounding.py [--size real|tiny] [--reps 3] [ARCH ...]

A random-weight model of each real architecture (engine/backends/clip/checkpoints.py: speed does
not depend on the weights) grounds a two-sentence paragraph (7 phrases, one of them a relation) in
a 1024 x 768 picture with each map method; the time is the median of `reps` runs after one
warm-up, for the whole `ground` call (preprocessing, the vision tower, the text tower for every
phrase and sentence, the maps). Threads: torch's default for the machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PARAGRAPH = ("A red ball lies to the left of a small wooden bench. Two white clouds drift across the blue "
             "sky above the green grass.")


def main(argv: list[str] | None = None) -> int:
    import numpy as np
    import torch
    from PIL import Image

    from engine.backends.clip.checkpoints import ARCHS, save_random_clip_checkpoint
    from engine.backends.clip.embedder import ClipEmbedder
    from engine.backends.clip.grounder import METHODS, ClipGrounder

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("archs", nargs="*", metavar="ARCH", help=f"of {', '.join(ARCHS)} (default: clip-b16 longclip-b)")
    ap.add_argument("--size", choices=["real", "tiny"], default="real")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args(argv)
    unknown = [a for a in args.archs if a not in ARCHS]
    if unknown:
        ap.error(f"unknown architectures {unknown}; known: {', '.join(ARCHS)}")
    args.archs = args.archs or ["clip-b16", "longclip-b"]
    image = Image.fromarray((np.random.default_rng(0).random((768, 1024, 3)) * 255).astype(np.uint8))
    rows = []
    for name in args.archs:
        with tempfile.TemporaryDirectory(prefix="longlens-clip-ground-") as tmp:
            folder = save_random_clip_checkpoint(Path(tmp) / name, name=name, size=args.size, seed=0)
            emb = ClipEmbedder(folder, device="cpu")
            for method in METHODS:
                g = ClipGrounder(emb, method=method)
                res = g.ground(image, PARAGRAPH)  # warm-up
                times = []
                for _ in range(args.reps):
                    t = time.perf_counter()
                    g.ground(image, PARAGRAPH)
                    times.append(time.perf_counter() - t)
                rows.append({"arch": name, "size": args.size, "method": g.method, "phrases": len(res.phrases),
                             "grid": res.phrases[0].heatmap.shape[0], "threads": torch.get_num_threads(),
                             "ground_s": round(statistics.median(times), 3)})
                print(json.dumps(rows[-1]), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
