"""Helpers for the configuration study (C1–C10) on SceneWorld, for scripts:

    from engine.training.study import train_config_on_sceneworld, evaluate_on_sceneworld
    tower = train_config_on_sceneworld(base, "C5", out / "C5", n_train=20000, epochs=8)
    print(evaluate_on_sceneworld(base, tower)["long"]["i2t"]["R@1"])

Training scenes come from a training seed (< 1000) and are embedded once by the base's frozen
vision tower; the embeddings are kept in memory for the process and on disk in `cache_dir`,
so the ten configurations share one rendering pass. The starting text tower defaults to the
base's stage-(a) tower (`captions-only/`, the sceneworld-mini analogue of BLIP0) when the base
has one, so each configuration fine-tunes the same caption-trained model, as in the paper.
Evaluation uses scenes with seeds ≥ 1000 (never trained on).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import numpy as np

if TYPE_CHECKING:
    import torch

    from engine.training.trainer import Example

CAPTIONS_ONLY = "captions-only"
_MEMO: dict[tuple, tuple[list, Any]] = {}
_EVAL_MEMO: dict[tuple, Any] = {}


def _weights_id(folder: Path) -> str:
    """Identity of a base's weights (its vision tower lives in model.safetensors)."""
    from engine.fileutil import sha256_file

    return sha256_file(folder / "model.safetensors")[:16]


def base_temperature(base_model_dir: Path) -> float:
    """The temperature the base was trained with (sceneworld-mini records its learned one), else 0.07."""
    meta_path = Path(base_model_dir) / "sceneworld_mini.json"
    try:
        from engine.jsonfile import read_json_file
        from engine.limits import model_file_limit

        meta = read_json_file(meta_path, max_bytes=model_file_limit(meta_path.name) or 0)
        return float(meta["training_report"]["learned_temperature"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0.07


def _embed_training_images(base_model_dir: Path, scenes: list, device: str) -> np.ndarray:
    """Frozen image embeddings of the training scenes, rendered as the base's backend trains on them."""
    from engine.errors import ModelError
    from engine.models.registry import detect_backend, get_backend

    backend = get_backend(detect_backend(base_model_dir))
    if backend.embed_training_scenes is None:
        raise ModelError(f"the {backend.name} backend cannot embed SceneWorld training scenes")
    return backend.embed_training_scenes(base_model_dir, scenes, device)


def sceneworld_training_set(
    base_model_dir: Path,
    n_train: int,
    seed: int = 0,
    *,
    device: str = "cpu",
    cache_dir: Path | None = None,
) -> tuple[list[Example], torch.Tensor]:
    """Examples of training scenes (seed, 0..n_train-1) and their frozen image embeddings (N, D)."""
    import torch

    from engine.sceneworld import check_train_seed, generate_scenes
    from engine.training.sceneworld_mini import examples_from_scenes

    check_train_seed(seed)
    base_model_dir = Path(base_model_dir).resolve()
    wid = _weights_id(base_model_dir)
    key = (wid, seed, n_train)
    if key not in _MEMO:
        scenes = generate_scenes(seed, 0, n_train)
        path = Path(cache_dir) / f"sceneworld-s{seed}-n{n_train}-{wid}.npy" if cache_dir else None
        if path is not None and path.is_file():
            vectors = np.load(path)
        else:
            vectors = _embed_training_images(base_model_dir, scenes, device)
            if path is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(".tmp.npy")
                np.save(tmp, vectors)
                tmp.replace(path)
        _MEMO[key] = (examples_from_scenes(scenes), torch.from_numpy(vectors))
    examples, vectors = _MEMO[key]
    return examples, vectors.to(device)


def train_config_on_sceneworld(
    base_model_dir: Path,
    config_name: str,
    out_dir: Path,
    n_train: int = 20000,
    seed: int = 0,
    epochs: int = 8,
    lr: float = 5e-4,
    batch_size: int = 128,
    *,
    warmup_steps: int = 100,
    temperature: float | None = None,
    init_text_tower: Path | str | None = "auto",
    device: str = "cpu",
    cache_dir: Path | None = None,
    checkpoint_every: int = 0,
    log: TextIO | None = sys.stderr,
) -> Path:
    """Fine-tune the base's text tower with `config_name` (C1..C10 or a JSON file) on SceneWorld
    training scenes, vision frozen; returns `out_dir`, a text-tower override folder
    (SceneWorldMiniEmbedder(base, text_tower_dir=...) / BlipEmbedder(..., text_tower_dir=...)).

    Defaults follow sceneworld-mini's stage (b) (lr 5e-4, 8 epochs, batch 128, 100 warm-up
    steps). temperature None: the base's own (its learned τ for sceneworld-mini, else 0.07).
    init_text_tower "auto": the base's captions-only/ tower when present; None: the base's
    weights as they are; a path: that override. cache_dir None: next to out_dir."""
    from engine.training.bases import BaseModel, detect_backend, make_adapter
    from engine.training.configs import load_config
    from engine.training.trainer import Trainer

    base_model_dir = Path(base_model_dir).resolve()
    out_dir = Path(out_dir)
    if init_text_tower == "auto":
        init_text_tower = base_model_dir / CAPTIONS_ONLY if (base_model_dir / CAPTIONS_ONLY).is_dir() else None
    cfg = load_config(config_name, lr=lr, epochs=epochs, batch_size=batch_size, seed=seed,
                      warmup_steps=warmup_steps,
                      temperature=temperature if temperature is not None else base_temperature(base_model_dir))
    t0 = time.monotonic()
    examples, vectors = sceneworld_training_set(base_model_dir, n_train, seed, device=device,
                                                cache_dir=cache_dir or out_dir.parent / ".sceneworld-embeddings")
    base = BaseModel(str(base_model_dir), base_model_dir, detect_backend(base_model_dir), base_model_dir.name, False)
    adapter = make_adapter(base, device=device, init_text_tower=Path(init_text_tower) if init_text_tower else None)
    trainer = Trainer(adapter, cfg, examples, image_embeddings=vectors, out_dir=out_dir,
                      checkpoint_every=checkpoint_every)
    t1 = time.monotonic()
    last_print = 0.0
    for p in trainer.run():
        now = time.monotonic()
        if log is not None and (now - last_print > 15 or p.stage == "done"):
            last_print = now
            eta = f" eta {p.eta_s / 60:.1f} min" if p.eta_s else ""
            print(f"[{cfg.name}] {p.stage} {p.done}/{p.total} {p.message}{eta}", file=log, flush=True)
    from engine.fileutil import atomic_write_text

    atomic_write_text(out_dir / "study.json", json.dumps({
        "config": cfg.to_dict(), "base": str(base_model_dir), "n_train": n_train, "seed": seed,
        "init_text_tower": str(init_text_tower) if init_text_tower else None,
        "seconds": {"data": round(t1 - t0, 1), "train": round(time.monotonic() - t1, 1)},
        "final_loss": trainer.history[-1]["loss"] if trainer.history else None,
    }, indent=2) + "\n")
    return out_dir


def evaluate_on_sceneworld(
    base_model_dir: Path,
    text_tower_dir: Path | None,
    *,
    seed: int = 1000,
    n: int = 1000,
    splits: Sequence[str] = ("short", "long"),
    truncation_budgets: Sequence[int] = (),
    device: str = "cpu",
) -> dict[str, Any]:
    """Recall@1/5/10 (engine.evaluation.sceneworld) of base + text tower on test scenes; image
    embeddings are computed once per base and reused for every tower in the process.
    With `truncation_budgets`, result["truncation"] holds the long split evaluated at each budget."""
    from engine.evaluation.sceneworld import embed_scenes, evaluate
    from engine.training.bases import BaseModel, detect_backend, load_embedder_for

    base_model_dir = Path(base_model_dir).resolve()
    base = BaseModel(str(base_model_dir), base_model_dir, detect_backend(base_model_dir), base_model_dir.name, False)
    emb = load_embedder_for(base, device=device, text_tower_dir=text_tower_dir)
    key = (_weights_id(base_model_dir), seed, n)
    if key not in _EVAL_MEMO:
        _EVAL_MEMO[key] = embed_scenes(emb, seed, n)
    data = _EVAL_MEMO[key]
    out: dict[str, Any] = {split: evaluate(emb, split, seed, n, data=data) for split in splits}
    if truncation_budgets:
        out["truncation"] = [evaluate(emb, "long", seed, n, max_tokens=b, data=data) for b in truncation_budgets]
    return out
