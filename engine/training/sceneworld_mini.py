"""Train sceneworld-mini in two stages that mirror the research brief, reproducibly.

  stage (a)  both towers, contrastive, short captions only (original or generated) — the
             stand-in for BLIP's own pre-training;
  stage (b)  vision frozen, text tower fine-tuned with config C5 (original caption +
             paragraph, multi-positive InfoNCE).

`python -m engine.training.sceneworld_mini --out resources/models/sceneworld-mini` (also
`make demo-model`). Same seed -> same weights on the same machine and library versions.
Training scenes use seeds < 1000; evaluation seeds are ≥ 1000 and never seen here.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from engine import options
from engine.backends.sceneworld_mini.network import (
    MiniConfig,
    SceneWorldMini,
    init_token_embeddings_from_minilm,
    save_model,
    save_text_tower,
)
from engine.backends.sceneworld_mini.training import (  # noqa: F401  (re-exported: training code imports them from here)
    SUPERSAMPLE,
    ArrayImages,
    MiniAdapter,
    render_for_model,
)
from engine.outputs import check_script_output
from engine.training.configs import PRESETS
from engine.training.trainer import Example, Trainer


def examples_from_scenes(scenes) -> list[Example]:
    return [
        Example(
            key=f"{s.seed}/{s.index}",
            original=s.original_caption.text,
            positives=[t.text for t in s.positives],
            negatives=[t.text for t in s.negatives],
            paragraph=s.paragraph.text,
        )
        for s in scenes
    ]


def _drive(job, label: str, log) -> None:
    last_print = 0.0
    for p in job:
        now = time.monotonic()
        if now - last_print > 15 or p.stage == "done":
            last_print = now
            eta = f" eta {p.eta_s / 60:.1f} min" if p.eta_s else ""
            print(f"[{label}] {p.stage} {p.done}/{p.total} {p.message}{eta}", file=log, flush=True)


def train(
    out_dir: Path,
    *,
    seed: int = 0,
    n_train: int = 20000,
    epochs_a: int = 12,
    epochs_b: int = 8,
    lr_a: float = 2e-3,
    lr_b: float = 5e-4,
    batch_size: int = 128,
    cfg: MiniConfig | None = None,
    local_alignment: float = 0.0,
    log=sys.stderr,
) -> dict:
    """Both stages; writes out_dir (the shipped model: stage-a vision + stage-b text) and
    out_dir/captions-only (stage-a text tower, for comparisons). Returns a small report.

    `local_alignment` > 0 adds the phrase-region loss (engine/training/local_alignment.py) with
    this weight to both stages: the CAFT-style variant (engine/training/caft.py)."""
    from engine.sceneworld import generate_scenes

    torch.manual_seed(seed)
    cfg = cfg or MiniConfig()
    t0 = time.monotonic()
    # Several minutes on 2 cores before the first training step: say what is happening.
    print(f"data: generating and rendering {n_train} training scenes (seed {seed})...", file=log, flush=True)
    scenes = generate_scenes(seed, 0, n_train)
    renders = render_for_model(scenes, cfg.image_size)
    examples = examples_from_scenes(scenes)
    t_data = time.monotonic() - t0
    print(f"data: {n_train} scenes rendered in {t_data:.0f}s", file=log, flush=True)

    model = SceneWorldMini(cfg)
    # Pretrained word vectors (shipped in a PyPI package) for the token table: measured on a
    # 4,000-scene pilot, long-split R@1 0.014 -> 0.072 at equal steps.
    init_token_embeddings_from_minilm(model)
    adapter = MiniAdapter(model)
    cfg_a = PRESETS["pretrain"].with_overrides(lr=lr_a, epochs=epochs_a, batch_size=batch_size,
                                               warmup_steps=100, seed=seed)
    if local_alignment:
        cfg_a = cfg_a.with_overrides(extra={**cfg_a.extra, "local_alignment": local_alignment})
    t1 = time.monotonic()
    _drive(Trainer(adapter, cfg_a, examples, ArrayImages(renders)).run(), "stage a", log)
    t_a = time.monotonic() - t1
    learned_tau = float(1.0 / model.logit_scale.exp().clamp(max=100.0))
    save_text_tower(model, out_dir / "captions-only", "captions-only", {"stage": "a"}, half=True)

    # Stage (b): C5 with the vision tower frozen; the temperature stays at stage (a)'s value
    # (as BLIP fine-tuning keeps BLIP's), lr scaled to this small model.
    cfg_b = PRESETS["C5"].with_overrides(lr=lr_b, epochs=epochs_b, batch_size=batch_size,
                                         warmup_steps=100, temperature=learned_tau, seed=seed)
    if local_alignment:
        cfg_b = cfg_b.with_overrides(extra={**cfg_b.extra, "local_alignment": local_alignment})
    t2 = time.monotonic()
    _drive(Trainer(adapter, cfg_b, examples, ArrayImages(renders)).run(), "stage b", log)
    t_b = time.monotonic() - t2
    report = {
        "seed": seed,
        "n_train_scenes": n_train,
        "train_scene_seed": seed,
        "image_size": cfg.image_size,
        "stage_a": cfg_a.to_dict(),
        "stage_b": cfg_b.to_dict(),
        "learned_temperature": learned_tau,
        "seconds": {"data": round(t_data), "stage_a": round(t_a), "stage_b": round(t_b)},
        "torch": torch.__version__,
    }
    save_model(model, out_dir, {"training_report": report}, half=True)
    from engine.models.download import write_local_manifest

    write_local_manifest(out_dir, "sceneworld-mini", "sceneworld-mini", training_report=report)
    return report


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m engine.training.sceneworld_mini", description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    # Seeds of 1000 and up are reserved for evaluation scenes.
    ap.add_argument("--seed", type=options.count("training seed (1000 and up are reserved for evaluation)", 0, 999), default=0)
    ap.add_argument("--n-train", type=options.SCENES, default=20000)
    ap.add_argument("--epochs-a", type=options.EPOCHS, default=12)
    ap.add_argument("--epochs-b", type=options.EPOCHS, default=8)
    ap.add_argument("--batch-size", type=options.count("batch size", 1, 65536), default=128)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_script_output(parser, args.out, what="model folder", folder=True, resumable=True)
    torch.set_num_threads(max(torch.get_num_threads(), 1))
    report = train(args.out, seed=args.seed, n_train=args.n_train, epochs_a=args.epochs_a,
                   epochs_b=args.epochs_b, batch_size=args.batch_size)
    print(json.dumps(report["seconds"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
