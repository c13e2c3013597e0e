"""Time the public-data recipe's steps on this machine (docs/public-data.md, "Time per epoch").

    PYTHONPATH=. .venv/bin/python scripts/measure_public_data.py [--out docs/public-data-speed.json]

Everything runs in a temporary LONGLENS_HOME on a generated DOCCI-layout folder (real JPEGs at
DOCCI's 4:3 shape, paragraphs of DOCCI's average length, ~136 words, so every paragraph fills the
128-token budget as real ones do). The models have random weights and the real architectures
(BLIP base: ViT-B/16 at 384 px + BERT-base text encoder, the configuration of
Salesforce/blip-itm-base-coco; the packaged all-MiniLM-L6-v2): speed does not depend on the weights.
Measured: `train convert` (records/s), `train cache` (images/s, the frozen vision tower) and
`train` (seconds per step, from the job's own progress reports, the first step left out as warm-up).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SENTENCES = [
    "A {c} {t} stands on a wooden table in the middle of a small kitchen, lit from a window on the left.",
    "Behind it a white tiled wall runs from the counter up to the ceiling, and two shelves hold glass jars.",
    "The jars are filled with rice, lentils and dried beans, each closed with a metal lid and a paper label.",
    "To the right of the {t} there is a folded blue towel, and a silver spoon lies across the towel.",
    "The floor is covered with grey stone tiles, and a round rug with a red and yellow pattern lies under the table.",
    "In the background a door stands half open, and a coat hangs on a hook beside it.",
    "The light is warm and soft, and the shadows fall toward the bottom right corner of the picture.",
    "Nothing in the picture moves, and no person is visible anywhere in the room.",
]
COLOURS = ["red", "green", "blue", "yellow", "purple", "orange", "white", "black"]
THINGS = ["cup", "kettle", "vase", "lamp", "bowl", "jug", "clock", "radio"]


def write_layout(root: Path, n: int, size: tuple[int, int]) -> None:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    (root / "images").mkdir(parents=True)
    lines = []
    for i in range(n):
        name = f"train_{i:05d}"
        pixels = rng.integers(0, 256, (size[1] // 8, size[0] // 8, 3), dtype=np.uint8)
        Image.fromarray(pixels).resize(size, Image.BILINEAR).save(root / "images" / f"{name}.jpg", quality=90)
        text = " ".join(s.format(c=COLOURS[i % 8], t=THINGS[(i // 8) % 8]) for s in SENTENCES)
        lines.append(json.dumps({"example_id": name, "split": "train", "image_file": f"{name}.jpg",
                                 "description": text}))
    (root / "docci_descriptions.jsonlines").write_text("\n".join(lines) + "\n", encoding="utf-8")


def cli(*args: str) -> tuple[dict, float]:
    import contextlib
    import io

    from engine.cli import main

    buf = io.StringIO()
    t0 = time.monotonic()
    with contextlib.redirect_stdout(buf):
        rc = main([*args, "--json", "--quiet"])
    dt = time.monotonic() - t0
    if rc not in (0, 1):
        raise SystemExit(f"longlens {' '.join(args)} exited {rc}")
    return json.loads(buf.getvalue()), dt


def seconds_per_step(paths, **request) -> dict:
    """Drive train_job as `longlens train` does and time its steps from its progress reports."""
    from engine.jobs import CancelToken
    from engine.training.configs import load_config
    from engine.training.run import TrainRequest, train_job

    cfg = load_config(request.pop("config"), epochs=request.pop("epochs"), batch_size=request.pop("batch_size"),
                      lr=1e-5, warmup_steps=1)
    req = TrainRequest(config=cfg, checkpoint_every=0, **request)
    t0 = time.monotonic()
    marks: list[tuple[int, float]] = []
    for p in train_job(req, paths, CancelToken()):
        if p.stage == "train" and p.done:
            marks.append((p.done, time.monotonic()))
    total = time.monotonic() - t0
    (s0, t_0), (s1, t_1) = marks[0], marks[-1]
    per_step = (t_1 - t_0) / (s1 - s0) if s1 > s0 else None
    return {"config": cfg.name, "batch_size": cfg.batch_size, "steps": s1, "seconds_per_step": per_step,
            "seconds_per_image": per_step / cfg.batch_size if per_step else None,
            "first_step_and_setup_s": round(t_0 - t0, 1), "command_s": round(total, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "public-data-speed.json")
    ap.add_argument("--images", type=int, default=24)
    ap.add_argument("--blip-batch", type=int, default=8)
    ap.add_argument("--minilm-batch", type=int, default=8)
    ap.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or mps (cache and training)")
    args = ap.parse_args()

    import torch

    from engine.backends.blip.checkpoints import save_random_blip_checkpoint
    from engine.bench.report import machine_description
    from engine.config import get_paths

    tmp = Path(tempfile.mkdtemp(prefix="longlens-public-data-"))
    os.environ["LONGLENS_HOME"] = str(tmp / "home")
    paths = get_paths(tmp / "home").ensure()
    result: dict = {"machine": machine_description(), "device": args.device, "load_average_at_start": os.getloadavg(),
                    "images": args.images, "image_size": [640, 480]}
    write_layout(tmp / "docci", args.images, (640, 480))

    summary, dt = cli("train", "convert", "docci", "--root", str(tmp / "docci"), "--out", str(tmp / "train.jsonl"))
    result["convert"] = {"records": summary["written"], "seconds": round(dt, 3),
                         "records_per_s": round(summary["written"] / dt, 1)}

    t0 = time.monotonic()
    base = save_random_blip_checkpoint(tmp / "blip-base", size="base", seed=0)
    result["random_blip_base_written_s"] = round(time.monotonic() - t0, 1)

    summary, dt = cli("train", "cache", "--data", str(tmp / "train.jsonl"), "--base", str(base), "--out",
                      str(tmp / "cache"), "--batch-size", "8", "--workers", "1", "--device", args.device)
    result["cache_blip_base"] = {"images": summary["added"], "seconds": round(dt, 1),
                                 "images_per_s": round(summary["added"] / dt, 3),
                                 "note": "includes loading the model (random weights, BLIP base)"}

    data = tmp / "train.jsonl"
    result["train_blip_base_c5"] = seconds_per_step(
        paths, config="C5", batch_size=args.blip_batch, epochs=1, data=data, base=str(base), out_dir=tmp / "run-blip",
        cache_dir=tmp / "cache", device=args.device)
    for k, epochs in ((0, 30), (2, 5)):
        result[f"train_minilm_k{k}_c5"] = seconds_per_step(
            paths, config="C5", batch_size=args.minilm_batch, epochs=epochs, data=data, base=str(base),
            out_dir=tmp / f"run-minilm-{k}", cache_dir=tmp / "cache", device=args.device, text_tower="minilm",
            train_layers=k)
    result["torch_threads"] = torch.get_num_threads()
    result["load_average_at_end"] = os.getloadavg()
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
