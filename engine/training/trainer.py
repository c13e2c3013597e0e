"""One trainer for both backends: contrastive training of the text tower (vision frozen, image
embeddings computed once) or of both towers (sceneworld-mini pre-training).

Determinism: the batch order of epoch e comes from rng([seed, e]) and the text sampling of step
s from rng([seed, s]), so a run resumed from a checkpoint takes exactly the same steps.
"""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from engine.jobs import CancelToken, Progress, RateMeter
from engine.training.configs import TrainConfig
from engine.training.local_alignment import RegionAdapter, local_alignment_loss
from engine.training.losses import hard_negative_info_nce, info_nce, multi_positive_info_nce


@dataclass
class Example:
    """One image's texts, as in the training data format (docs/training.md)."""

    key: str
    original: str
    positives: list[str]
    negatives: list[str]
    paragraph: str


class ImageSource(Protocol):
    def __len__(self) -> int: ...

    def pixels(self, indices: np.ndarray) -> torch.Tensor: ...


class DualEncoderAdapter(Protocol):
    """What the trainer needs from a backend (sceneworld-mini, BLIP)."""

    def trainable_parameters(self, train_vision: bool, learn_temperature: bool) -> list[torch.nn.Parameter]: ...

    def train_mode(self, train_vision: bool) -> None: ...

    def encode_pixels(self, pixels: torch.Tensor) -> torch.Tensor: ...

    def encode_texts(self, texts: Sequence[str], max_tokens: int) -> torch.Tensor: ...

    def logit_scale(self, cfg: TrainConfig) -> torch.Tensor: ...

    def save(self, out_dir: Path, cfg: TrainConfig, *, text_only: bool, extra: dict) -> Path: ...


def texts_for(ex: Example, cfg: TrainConfig, rng: np.random.Generator) -> list[tuple[str, int]]:
    """The (text, token budget) pairs that stand for one image in one step."""
    out: list[tuple[str, int]] = []
    for inp in cfg.inputs:
        if inp.source == "original":
            out.append((ex.original, inp.tokens))
        elif inp.source == "generated_one":
            out.append((ex.positives[rng.integers(len(ex.positives))], inp.tokens))
        elif inp.source == "generated_all":
            out.extend((t, inp.tokens) for t in ex.positives[:5])
        elif inp.source == "caption_any":
            pool = [ex.original, *ex.positives]
            out.append((pool[rng.integers(len(pool))], inp.tokens))
        elif inp.source == "paragraph":
            sampling = cfg.extra.get("sentence_sampling")  # e.g. an LM tower's option
            if sampling is None:
                out.append((ex.paragraph, inp.tokens))
            else:
                from engine.training.data import sample_sentences

                out.append((sample_sentences(ex.paragraph, rng, sampling), inp.tokens))
    return out


def lr_at(step: int, total: int, cfg: TrainConfig) -> float:
    """Linear warm-up then cosine decay to 0. Warm-up is capped at 10% of the run so that
    short runs (small data sets) still spend most steps at a useful rate."""
    warm = min(cfg.warmup_steps, max(total // 10, 1))
    if step < warm:
        return cfg.lr * (step + 1) / warm
    progress = (step - warm) / max(total - warm, 1)
    return cfg.lr * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))


class Trainer:
    def __init__(
        self,
        adapter: DualEncoderAdapter,
        cfg: TrainConfig,
        examples: Sequence[Example],
        images: ImageSource | None = None,
        *,
        image_embeddings: torch.Tensor | None = None,
        out_dir: Path | None = None,
        checkpoint_every: int = 0,
        resume: bool = False,
    ) -> None:
        cfg.validate()
        if cfg.train_vision and images is None:
            raise ValueError("training the vision tower needs the images themselves")
        if not cfg.train_vision and images is None and image_embeddings is None:
            raise ValueError("need images or precomputed image embeddings")
        if len(examples) < cfg.batch_size:
            raise ValueError(f"{len(examples)} examples are fewer than one batch of {cfg.batch_size}")
        self.local_weight = float(cfg.extra.get("local_alignment", 0.0) or 0.0)
        if self.local_weight and not isinstance(adapter, RegionAdapter):
            raise ValueError("local (phrase-region) alignment needs a backend whose vision tower exposes "
                             "region tokens; this one does not")
        if self.local_weight and images is None:
            raise ValueError("local (phrase-region) alignment needs the images themselves (their regions)")
        if self.local_weight and cfg.grad_accum > 1:
            raise ValueError("local (phrase-region) alignment is not implemented with gradient caching "
                             "(grad_accum > 1)")
        self.adapter = adapter
        self.cfg = cfg
        self.image_regions: torch.Tensor | None = None  # frozen vision + local alignment: cached regions
        self.examples = list(examples)
        self.images = images
        self.image_embeddings = image_embeddings
        self.out_dir = Path(out_dir) if out_dir else None
        self.checkpoint_every = checkpoint_every
        self.resume = resume
        self.steps_per_epoch = len(self.examples) // cfg.batch_size
        self.total_steps = self.steps_per_epoch * cfg.epochs
        self.history: list[dict] = []

    # -- helpers --------------------------------------------------------------
    @torch.no_grad()
    def cache_image_embeddings(self, batch: int = 256) -> torch.Tensor:
        """Frozen vision: every image is embedded once, then only text passes are needed. With
        local alignment the region embeddings are cached too (float16: they are only compared)."""
        self.adapter.train_mode(train_vision=False)
        out, regions = [], []
        for start in range(0, len(self.images), batch):
            idx = np.arange(start, min(start + batch, len(self.images)))
            pixels = self.images.pixels(idx)
            if self.local_weight:
                g, r = self.adapter.encode_pixel_regions(pixels)
                out.append(g.float())
                regions.append(r.half())
            else:
                out.append(self.adapter.encode_pixels(pixels).float())
        if regions:
            self.image_regions = torch.cat(regions)
        return torch.cat(out)

    def _batch_order(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.cfg.seed, epoch]).permutation(len(self.examples))

    def _step_texts(self, idx: np.ndarray, step: int) -> tuple[list[tuple[str, int]], list[int]]:
        """The (text, token budget) pairs of a step's images, and which batch image owns each."""
        rng = np.random.default_rng([self.cfg.seed, 1_000_003, step])
        texts: list[tuple[str, int]] = []
        owner: list[int] = []
        for b, i in enumerate(idx):
            pairs = texts_for(self.examples[i], self.cfg, rng)
            texts.extend(pairs)
            owner.extend([b] * len(pairs))
        return texts, owner

    def _loss(self, img: torch.Tensor, idx: np.ndarray, step: int, regions: torch.Tensor | None = None) -> torch.Tensor:
        cfg = self.cfg
        texts, owner = self._step_texts(idx, step)
        owner_t = torch.tensor(owner, device=img.device)
        phrases = None
        if self.local_weight:
            txt, phrases, valid = self._encode_grouped_phrases(texts)
        else:
            txt = self._encode_grouped(texts)
        scale = self.adapter.logit_scale(cfg)
        if cfg.loss == "infonce":
            loss = info_nce(img, txt, scale)
        elif cfg.loss == "multipos":
            loss = multi_positive_info_nce(img, txt, owner_t, scale)
        else:
            m = cfg.hard_negatives
            negs = [(t, cfg.inputs[0].tokens) for i in idx for t in self.examples[i].negatives[:m]]
            if len(negs) != len(idx) * m:
                raise ValueError(f"config {cfg.name} needs {m} hard negatives for every image")
            neg = self._encode_grouped(negs).reshape(len(idx), m, -1)
            loss = hard_negative_info_nce(img, txt, neg, scale)
        if phrases is not None:
            assert regions is not None
            loss = loss + self.local_weight * local_alignment_loss(regions.to(phrases.dtype), phrases, valid,
                                                                   owner_t, scale)
        return loss

    def _encode_grouped_phrases(self, texts: list[tuple[str, int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """As _encode_grouped, with each text's phrase embeddings and their validity."""
        budgets = sorted({b for _, b in texts})
        rows: dict[int, list[int]] = {b: [j for j, (_, bb) in enumerate(texts) if bb == b] for b in budgets}
        glob: list[torch.Tensor | None] = [None] * len(texts)
        phr: list[torch.Tensor | None] = [None] * len(texts)
        val: list[torch.Tensor | None] = [None] * len(texts)
        for b in budgets:
            g, p, v = self.adapter.encode_text_phrases([texts[j][0] for j in rows[b]], b)
            for k, j in enumerate(rows[b]):
                glob[j], phr[j], val[j] = g[k], p[k], v[k]
        return torch.stack(glob), torch.stack(phr), torch.stack(val)

    def _encode_grouped(self, texts: list[tuple[str, int]]) -> torch.Tensor:
        """Encode texts with their own token budgets (captions 77, paragraphs 128), order kept."""
        budgets = sorted({b for _, b in texts})
        parts: dict[int, torch.Tensor] = {}
        for b in budgets:
            sel = [t for t, bb in texts if bb == b]
            parts[b] = self.adapter.encode_texts(sel, b)
        cursor = dict.fromkeys(budgets, 0)
        rows = []
        for _, b in texts:
            rows.append(parts[b][cursor[b]])
            cursor[b] += 1
        return torch.stack(rows)

    # -- checkpoints ------------------------------------------------------------
    def _ckpt_dir(self) -> Path | None:
        return self.out_dir / "checkpoint" if self.out_dir else None

    def _save_checkpoint(self, step: int, optimizer: torch.optim.Optimizer, params: list) -> None:
        d = self._ckpt_dir()
        if d is None:
            return
        d.mkdir(parents=True, exist_ok=True)
        state = {
            "step": step,
            "params": [p.detach().cpu().clone() for p in params],
            "optimizer": optimizer.state_dict(),
            "history": self.history,
            "config": self.cfg.name,
            # RNG states, so that anything random in a step (dropout) continues identically.
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        }
        if not self.cfg.train_vision:
            tower = d / "text_tower"
            if step < self.total_steps:
                # A usable text-tower override (safetensors) of the run so far, next to the state.
                self.adapter.save(tower, self.cfg, text_only=True, extra={"steps": step})
            elif tower.exists():
                shutil.rmtree(tower)  # the finished tower is in out_dir itself
        tmp = d / "state.pt.tmp"
        torch.save(state, tmp)
        tmp.replace(d / "state.pt")

    def _load_checkpoint(self, optimizer: torch.optim.Optimizer, params: list) -> int:
        d = self._ckpt_dir()
        if d is None or not (d / "state.pt").exists():
            return 0
        state = torch.load(d / "state.pt", weights_only=True)
        if state["config"] != self.cfg.name or len(state["params"]) != len(params):
            raise ValueError(f"checkpoint in {d} belongs to another run ({state['config']})")
        with torch.no_grad():
            for p, saved in zip(params, state["params"], strict=True):
                p.copy_(saved)
        optimizer.load_state_dict(state["optimizer"])
        self.history = list(state["history"])
        if "torch_rng" in state:
            torch.set_rng_state(state["torch_rng"])
        if state.get("cuda_rng") and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda_rng"])
        return int(state["step"])

    # -- the job ------------------------------------------------------------------
    def run(self, cancel: CancelToken | None = None) -> Iterator[Progress]:
        cfg = self.cfg
        cancel = cancel or CancelToken()
        torch.manual_seed(cfg.seed)
        if not cfg.train_vision and (self.image_embeddings is None
                                     or (self.local_weight and self.image_regions is None)):
            yield Progress("embed images", 0, len(self.images), "computing frozen image embeddings")
            self.image_embeddings = self.cache_image_embeddings()
        params = self.adapter.trainable_parameters(cfg.train_vision, cfg.learn_temperature)
        decay = [p for p in params if p.ndim >= 2]
        no_decay = [p for p in params if p.ndim < 2]
        optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=cfg.lr,
        )
        step = self._load_checkpoint(optimizer, params) if self.resume else 0
        meter = RateMeter(self.total_steps - step)
        self.adapter.train_mode(cfg.train_vision)
        t_last = time.monotonic()
        while step < self.total_steps:
            if cancel.cancelled:
                self._save_checkpoint(step, optimizer, params)
                yield Progress("done", step, self.total_steps, "cancelled; checkpoint saved",
                               extra={"cancelled": True})
                return
            epoch, k = divmod(step, self.steps_per_epoch)
            idx = self._batch_order(epoch)[k * cfg.batch_size : (k + 1) * cfg.batch_size]
            for g in optimizer.param_groups:
                g["lr"] = lr_at(step, self.total_steps, cfg)
            optimizer.zero_grad(set_to_none=True)
            loss_value = self._step(idx, step)
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            step += 1
            self.history.append({"step": step, "loss": loss_value, "lr": optimizer.param_groups[0]["lr"]})
            if self.checkpoint_every and step % self.checkpoint_every == 0:
                self._save_checkpoint(step, optimizer, params)
            now = time.monotonic()
            if now - t_last > 0.5 or step == self.total_steps:
                t_last = now
                p = meter.progress("train", step - (self.total_steps - meter.total), epoch=epoch + 1,
                                   loss=loss_value, lr=optimizer.param_groups[0]["lr"])
                p.done, p.total = step, self.total_steps
                p.message = f"epoch {epoch + 1}/{cfg.epochs} loss {loss_value:.4f}"
                yield p
        if self.out_dir is not None:
            self.adapter.save(self.out_dir, cfg, text_only=not cfg.train_vision,
                              extra={"history": self.history[-1:], "steps": step})
            self._save_checkpoint(step, optimizer, params)
        yield Progress("done", step, self.total_steps, "training complete",
                       extra={"final_loss": self.history[-1]["loss"] if self.history else None})

    def _step(self, idx: np.ndarray, step: int) -> float:
        cfg = self.cfg
        if cfg.grad_accum == 1:
            img, regions = self._images_and_regions(idx)
            loss = self._loss(img, idx, step, regions)
            loss.backward()
            return float(loss.detach())
        # Gradient caching (Gao et al., 2021): the contrastive loss needs the whole batch, so
        # embeddings are computed without graph, the loss's gradient w.r.t. them is taken over
        # the full batch, then each micro-batch is re-encoded with graph and back-propagated.
        if cfg.train_vision:
            raise ValueError("grad_accum > 1 is implemented for text-tower training (vision frozen)")
        img = self._images(idx, grad=False)
        # Text side: re-run _loss per micro-batch of images would change negatives, so we cache
        # text embeddings instead.
        texts, owner = self._step_texts(idx, step)
        if cfg.loss == "hardneg":
            m = cfg.hard_negatives
            texts += [(t, cfg.inputs[0].tokens) for i in idx for t in self.examples[i].negatives[:m]]
        chunks = np.array_split(np.arange(len(texts)), cfg.grad_accum)
        with torch.no_grad():
            emb = torch.cat([self._encode_grouped([texts[j] for j in c]) for c in chunks])
        emb = emb.detach().requires_grad_(True)
        scale = self.adapter.logit_scale(cfg)
        n_pos = len(owner)
        if cfg.loss == "infonce":
            loss = info_nce(img, emb[:n_pos], scale)
        elif cfg.loss == "multipos":
            loss = multi_positive_info_nce(img, emb[:n_pos], torch.tensor(owner, device=img.device), scale)
        else:
            loss = hard_negative_info_nce(img, emb[:n_pos], emb[n_pos:].reshape(len(idx), cfg.hard_negatives, -1),
                                          scale)
        loss.backward()
        for c in chunks:
            part = self._encode_grouped([texts[j] for j in c])
            part.backward(emb.grad[torch.as_tensor(c)])
        return float(loss.detach())

    def _images_and_regions(self, idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor | None]:
        if not self.local_weight:
            return self._images(idx, grad=self.cfg.train_vision), None
        if self.cfg.train_vision:
            return self.adapter.encode_pixel_regions(self.images.pixels(idx))
        rows = torch.as_tensor(idx)
        return self.image_embeddings[rows], self.image_regions[rows].float()

    def _images(self, idx: np.ndarray, grad: bool) -> torch.Tensor:
        if self.cfg.train_vision:
            return self.adapter.encode_pixels(self.images.pixels(idx))
        return self.image_embeddings[torch.as_tensor(idx)]
