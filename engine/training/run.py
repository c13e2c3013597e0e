"""`longlens train` as an engine job: validate the data, fill the frozen-vision embedding cache,
train, and write the text tower. The CLI and any other front end drive the same generator.

Output folder:
    text_tower.safetensors + text_tower.json   the override (BlipEmbedder / SceneWorldMiniEmbedder
                                               text_tower_dir=...), written at the end
    checkpoint/state.pt, checkpoint/text_tower  resume state and the tower so far
    run.json                                    what was trained on what (checked on --resume)
    history.jsonl                               loss and lr of every step
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.errors import ConfigError, LonglensError
from engine.fileutil import sha256_file
from engine.jobs import CancelToken, Progress

if TYPE_CHECKING:
    from engine.config import Paths
    from engine.training.bases import BaseModel
    from engine.training.configs import TrainConfig

RUN_FILE = "run.json"
HISTORY_FILE = "history.jsonl"


@dataclass
class TrainRequest:
    data: Path
    base: str  # installed model name or model folder
    out_dir: Path
    config: TrainConfig
    cache_dir: Path | None = None  # None: default_cache_dir(paths, base)
    device: str = "auto"
    resume: bool = False
    strict: bool = False
    checkpoint_every: int = 500
    init_text_tower: Path | None = None
    auto_grad_accum: bool = False  # on a CUDA out-of-memory error at the first step, double grad_accum
    # An LM text tower (engine/models/lm_tower.py) trained instead of the base's own text tower, against
    # the base's frozen image embeddings: a tower folder, a local language-model folder or a packaged
    # name (engine.training.lm_tower_adapter.resolve_tower); train_layers: its top k layers or "all".
    text_tower: str | None = None
    train_layers: int | str | None = None
    cache_batch_size: int = 64


def default_cache_dir(paths: Paths, base: BaseModel) -> Path:
    """<cache>/train-embeddings/<name>; a folder base also gets a hash of its path, so two
    folders that happen to share a name do not share (and then refuse) one cache."""
    if base.installed:
        return paths.cache / "train-embeddings" / base.name
    digest = hashlib.sha256(str(base.folder).encode("utf-8")).hexdigest()[:8]
    return paths.cache / "train-embeddings" / f"{base.name}-{digest}"


def _fingerprint(req: TrainRequest, base_name: str) -> dict[str, Any]:
    return {
        "config": req.config.to_dict(),
        "data": str(req.data.resolve()),
        "data_sha256": sha256_file(req.data),
        "base": base_name,
        "init_text_tower": str(req.init_text_tower) if req.init_text_tower else None,
        **({"text_tower": req.text_tower, "train_layers": req.train_layers} if req.text_tower else {}),
    }


def _check_resume(out_dir: Path, fp: dict[str, Any]) -> None:
    path = out_dir / RUN_FILE
    if not path.is_file():
        return
    from engine.jsonfile import read_json_file
    from engine.limits import MAX_SMALL_JSON_BYTES

    try:
        old = read_json_file(path, max_bytes=MAX_SMALL_JSON_BYTES).get("fingerprint", {})
    except (OSError, ValueError, AttributeError) as exc:
        raise ConfigError(f"cannot resume: {path} is unreadable ({exc}); choose a new output folder") from None
    diffs = [k for k in ("config", "data_sha256", "base", "init_text_tower", "text_tower", "train_layers")
             if old.get(k) != fp.get(k)]
    if diffs:
        raise ConfigError(f"cannot resume: {out_dir} holds a run with a different {', '.join(diffs)}; "
                          "use a new output folder or start afresh instead of resuming", settings=("resume", "out_dir"))


def _region_adapter(adapter: Any, base: BaseModel) -> Any:
    """`adapter` itself when local alignment can train it (a RegionAdapter), else a refusal."""
    from engine.training.local_alignment import RegionAdapter

    if not isinstance(adapter, RegionAdapter):
        raise ConfigError(f"local (phrase-region) alignment needs a model whose vision tower gives region (patch) "
                          f"embeddings; {base.name} ({base.backend} backend) gives none: train without it",
                          settings=("local_alignment",))
    return adapter


def train_job(req: TrainRequest, paths: Paths, cancel: CancelToken | None = None) -> Iterator[Progress]:
    """Validate → cache image embeddings → train → save. Yields Progress; the final report
    (stage "done") carries the run summary in extra."""
    import numpy as np
    import torch

    from engine.fileutil import atomic_write_text
    from engine.training.bases import load_embedder_for, make_adapter, resolve_base
    from engine.training.cache import build_cache, lookup
    from engine.training.data import format_problems, read_training_jsonl
    from engine.training.trainer import Trainer

    cancel = cancel or CancelToken()
    cfg = req.config
    out_dir = Path(req.out_dir)
    if not req.resume and (out_dir / "checkpoint" / "state.pt").exists():
        raise ConfigError(f"{out_dir} already holds a training run; resume it to continue it or "
                          "choose another output folder", settings=("resume", "out_dir"))
    if req.text_tower is not None and req.init_text_tower is not None:
        raise ConfigError("an LM text tower starts from its own weights; give either the LM text tower or the "
                          "text tower to start from, not both", settings=("text_tower", "init_text_tower"))
    if req.train_layers is not None and req.text_tower is None:
        raise ConfigError("the number of trained layers applies to an LM text tower only", settings=("train_layers",))
    if req.text_tower is not None:
        from engine.training.lm_tower_adapter import check_tower_ref

        check_tower_ref(req.text_tower)
    base = resolve_base(req.base, paths)
    local = float(cfg.extra.get("local_alignment", 0.0) or 0.0)
    if local and cfg.grad_accum > 1:
        raise ConfigError("local (phrase-region) alignment is not implemented with gradient caching: train with "
                          "one micro-batch per batch", settings=("local_alignment", "grad_accum"))

    yield Progress("validate", 0, None, f"reading {req.data}")
    data = read_training_jsonl(req.data, cfg, strict=req.strict)
    if data.problems:
        yield Progress("validate", data.n_lines, data.n_lines, format_problems(data, limit=10),
                       extra={"problems": len(data.problems), "skipped": len(data.skipped_lines)})
    if len(data.records) < cfg.batch_size:
        raise ConfigError(f"{len(data.records)} usable lines in {req.data} are fewer than one batch of "
                          f"{cfg.batch_size}; lower the batch size", settings=("batch_size",))
    fp = _fingerprint(req, base.name)
    if req.resume:
        _check_resume(out_dir, fp)

    # Frozen vision: every image is embedded once (and kept across runs) by content hash.
    cache_dir = req.cache_dir or default_cache_dir(paths, base)
    images = [r.image for r in data.records]
    embedder = load_embedder_for(base, paths, device=req.device)
    # A budget past the base's text positions (C5's 128-token paragraphs on a 77-position CLIP) is
    # read up to those positions, as search reads it; said here so the cut is never silent.
    limit = None if req.text_tower is not None else getattr(embedder, "max_text_tokens", None)
    cut = sorted({i.tokens for i in cfg.inputs if isinstance(limit, int) and i.tokens > limit})
    if cut:
        yield Progress("validate", 0, None, f"{base.name} reads at most {limit} text tokens: the config's "
                       f"{'/'.join(map(str, cut))}-token texts are read up to there, as search reads them",
                       extra={"text_tokens_cut": {str(t): limit for t in cut}})
    cache_report: dict[str, Any] = {}
    for p in build_cache(embedder, images, cache_dir, batch_size=req.cache_batch_size, cancel=cancel):
        if p.stage == "done":
            cache_report = p.extra
            if p.extra.get("cancelled"):
                yield Progress("done", 0, None, "cancelled while caching image embeddings",
                               extra={"cancelled": True})
                return
        else:
            yield p
    # Local alignment needs the pictures themselves (their regions): decoded and preprocessed as
    # the cache's were, by this embedder; otherwise it is done.
    preprocess = (embedder.preprocess, embedder.image_size) if local else None
    del embedder
    vectors, keep = lookup(cache_dir, images)
    dropped = len(images) - len(keep)
    examples = [data.records[i].to_example() for i in keep]
    if len(examples) < cfg.batch_size:
        raise LonglensError(f"only {len(examples)} images could be embedded; fewer than one batch")

    image_source = None
    if preprocess is not None:
        from engine.training.file_images import FileImages

        image_source = FileImages([images[i] for i in keep], *preprocess)
    if req.text_tower is not None:
        from engine.training.lm_tower_adapter import make_lm_tower_adapter

        # Local alignment: the tower's phrases meet the regions of the base's own (frozen) vision tower.
        regions = _region_adapter(make_adapter(base, device=req.device), base) if local else None
        # A resumed run rebuilds the same start (the projection is seeded by the config's seed) and
        # the trainer then restores the trained tensors from its checkpoint.
        adapter = make_lm_tower_adapter(req.text_tower, embed_dim=int(vectors.shape[1]), train_layers=req.train_layers,
                                        device=req.device, seed=cfg.seed, regions=regions)
    else:
        adapter = make_adapter(base, device=req.device, init_text_tower=req.init_text_tower)
        if local:
            _region_adapter(adapter, base)
    device = getattr(adapter, "device", "cpu")
    emb = torch.from_numpy(np.ascontiguousarray(vectors)).to(device)
    out_dir.mkdir(parents=True, exist_ok=True)
    run_info: dict[str, Any] = {"fingerprint": fp, "base_folder": str(base.folder), "cache": str(cache_dir),
                                "examples": len(examples), "lines": data.n_lines,
                                "skipped_lines": len(data.skipped_lines), "images_not_embedded": dropped,
                                "text_tokens_cut": {str(t): limit for t in cut},
                                "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    atomic_write_text(out_dir / RUN_FILE, json.dumps(run_info, indent=2) + "\n")

    while True:
        try:
            trainer = Trainer(adapter, cfg, examples, image_source, image_embeddings=emb, out_dir=out_dir,
                              checkpoint_every=req.checkpoint_every, resume=req.resume)
        except ValueError as exc:  # what the run asks for does not fit the model or the data
            raise ConfigError(str(exc), settings=("local_alignment",) if local else ()) from None
        try:
            last = None
            for p in trainer.run(cancel):
                if p.stage == "done":
                    last = p  # replaced by this job's own final report below
                else:
                    yield p
            break
        except torch.cuda.OutOfMemoryError:
            # Only before the first step: nothing has been updated yet, so restarting with smaller
            # micro-batches (gradient caching gives the same result) is safe.
            # Local alignment has no gradient caching: nothing to retry with.
            if not req.auto_grad_accum or local or trainer.history or cfg.grad_accum * 2 > cfg.batch_size // 2:
                raise
            torch.cuda.empty_cache()
            cfg = cfg.with_overrides(grad_accum=cfg.grad_accum * 2)
            yield Progress("train", 0, None, f"out of GPU memory: retrying with grad_accum {cfg.grad_accum}")
    cancelled = bool(last is not None and last.extra.get("cancelled"))
    atomic_write_text(out_dir / HISTORY_FILE, "".join(json.dumps(h) + "\n" for h in trainer.history))
    run_info.update(finished=None if cancelled else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    steps=trainer.history[-1]["step"] if trainer.history else 0,
                    final_loss=trainer.history[-1]["loss"] if trainer.history else None,
                    grad_accum=cfg.grad_accum, cache_added=cache_report.get("added"))
    atomic_write_text(out_dir / RUN_FILE, json.dumps(run_info, indent=2) + "\n")
    yield Progress("done", run_info["steps"], trainer.total_steps,
                   "cancelled; resume with --resume" if cancelled else f"text tower written to {out_dir}",
                   extra={**run_info, "cancelled": cancelled, "out_dir": str(out_dir)})
