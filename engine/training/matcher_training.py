"""An image–text matching head for sceneworld-mini: the analogue of BLIP's ITM head.

Why. sceneworld-mini's contrastive embeddings retrieve scenes from colours, setting and
layout; a global (CLS-to-CLS style) contrastive loss never needs to bind object kinds or
counts to regions, so similarity scores cannot tell "a red car" from "a red kite" in the same
scene (docs/grounding.md). BLIP answers "does this text describe this image?" with a separate
head: the text encoder cross-attends to every image patch and is trained to separate true
texts from hard negatives. This module gives the demo model the same design at its scale:

    text tokens -> text tower layers (self-attention)
                -> `layers` blocks of self-attention + cross-attention over the patch tokens
                   of the matcher's own vision tower -> masked mean -> logit

Both towers start from the shipped model's weights; the matcher keeps its own copy of the
vision tower, so training it never changes the retrieval embeddings. Training data are
SceneWorld *training* scenes (seeds < 1000): true captions, paragraph sentences and phrases
against the generator's one-detail-wrong negatives (attribute, relation, count, object) and
captions of other scenes.

Two dense terms help the one-bit match loss (docs/grounding.md has the measurements):
* patch labels (PatchLabeller, training only): every patch token must name the kind, colour,
  pattern and size of the object covering it (SceneWorld's masks say which);
* phrase-patch alignment (align_logits): a phrase's pooled text state scored against every
  patch token, trained to light up exactly the patches of the objects the phrase refers to and
  none for a phrase made wrong in one attribute or kind. The grounder uses its maximum as a
  phrase feature and its map as the "align" map method.

Files: MODEL_DIR/matcher/{matcher.safetensors, matcher.json}.

    longlens dev train-matcher --model-dir resources/models/sceneworld-mini
"""

from __future__ import annotations

import argparse
import math
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from dataclasses import field as dataclass_field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from engine import options
from engine.backends.sceneworld_mini.matcher import (  # noqa: F401  (re-exported for the matcher's users)
    MATCHER_DIR,
    MAX_TOKENS,
    META,
    WEIGHTS,
    MiniMatcher,
    load_matcher,
    save_matcher,
)
from engine.jobs import CancelToken, Progress
from engine.jsonfile import read_json_file
from engine.limits import MAX_SMALL_JSON_BYTES
from engine.outputs import check_script_output


def add_to_manifest(model_dir: Path) -> bool:
    """List the matcher's files in the model folder's longlens-manifest.json, so `longlens models
    verify` (which fails on unlisted files) covers them; False when the folder has no manifest."""
    from engine.models.download import list_subfolder_in_manifest

    return list_subfolder_in_manifest(model_dir, MATCHER_DIR)


# --------------------------------------------------------------------------- training data


@dataclass
class SceneTexts:
    positives: list[str]  # true captions and paragraph sentences
    phrases: list[str]  # object phrases of true texts
    negatives: list[tuple[str, str]]  # (one-detail-wrong caption, the true caption it came from)
    negative_types: list[str]  # each negative's error type (attribute, relation, count, object)
    wrong_phrases: list[str]  # the phrases those corruptions introduced
    # Alignment targets: true object phrases with the ids of the objects they refer to, and the
    # attribute- or kind-corrupted phrases (nothing in the image is what they say). Count
    # corruptions are left out: "two cups" still points at the one cup there is.
    aligned: list[tuple[str, tuple[int, ...]]] = dataclass_field(default_factory=list)
    misaligned: list[str] = dataclass_field(default_factory=list)


def scene_texts(scene: Any) -> SceneTexts:
    pos = [t.text for t in scene.positives]
    para = scene.paragraph
    pos += [para.text[s.start:s.end] for s in para.sentences]
    true_obj = {p.text: tuple(p.object_ids) for t in [*scene.positives, para] for p in t.phrases
                if p.kind == "object"}
    wrong = sorted({p.text for n in scene.negatives for p in n.phrases
                    if p.kind == "object" and p.text not in true_obj})
    misaligned = sorted({p.text for n in scene.negatives if n.error_type in ("attribute", "object")
                         for p in n.phrases if p.kind == "object" and p.text not in true_obj})
    negatives = [(n.text, scene.positives[n.source_index].text) for n in scene.negatives]
    return SceneTexts(pos, sorted(true_obj), negatives, [n.error_type for n in scene.negatives], wrong,
                      sorted(true_obj.items()), misaligned)


# Per-patch labels: what the object covering most of a patch is. Class 0 is "no object".
LABEL_FIELDS: tuple[str, ...] = ("kind", "colour", "pattern", "size")
MIN_PATCH_COVER = 0.25  # a patch is labelled with an object covering at least this share of it


def _label_vocab() -> dict[str, list[str]]:
    from engine.sceneworld.world import COLOURS, KIND_NAMES, PATTERNS, SIZES

    return {"kind": list(KIND_NAMES), "colour": list(COLOURS), "pattern": list(PATTERNS), "size": list(SIZES)}


def patch_cover(masks: np.ndarray, grid: int) -> np.ndarray:
    """(n, grid*grid) share of each patch that each object's visible mask (n, S, S) covers."""
    n, size, _ = masks.shape
    cell = size // grid
    cover = masks[:, : grid * cell, : grid * cell].reshape(n, grid, cell, grid, cell).mean(axis=(2, 4))
    return cover.reshape(n, grid * grid)


def patch_labels(scene: Any, cover: np.ndarray) -> np.ndarray:
    """(P, len(LABEL_FIELDS)) int64 labels from a scene's patch_cover (n, P): the attributes of
    the object covering most of a patch, when it covers at least MIN_PATCH_COVER of it."""
    vocab = _label_vocab()
    out = np.zeros((cover.shape[1], len(LABEL_FIELDS)), np.int64)
    if len(scene.objects) == 0:
        return out
    best = cover.argmax(axis=0)
    for p in np.flatnonzero(cover.max(axis=0) >= MIN_PATCH_COVER):
        o = scene.objects[int(best[p])]
        out[p] = [vocab[f].index(getattr(o, f)) + 1 for f in LABEL_FIELDS]
    return out


def render_with_labels(scenes: Sequence[Any], size: int,
                       grid: int) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """uint8 renders (N, size, size, 3) as the model sees them, their patch labels and each
    scene's object patches ((n, P) bool: patches an object covers at least MIN_PATCH_COVER of)."""
    from PIL import Image

    from engine.sceneworld import render_scene
    from engine.training.sceneworld_mini import SUPERSAMPLE

    images = np.empty((len(scenes), size, size, 3), np.uint8)
    labels = np.empty((len(scenes), grid * grid, len(LABEL_FIELDS)), np.int64)
    covers = []
    for i, scene in enumerate(scenes):
        img, masks = render_scene(scene, size * SUPERSAMPLE)
        images[i] = np.asarray(img.resize((size, size), Image.Resampling.BICUBIC))
        cover = patch_cover(masks, grid)
        labels[i] = patch_labels(scene, cover)
        covers.append(cover >= MIN_PATCH_COVER)
    return images, labels, covers


class PatchLabeller(nn.Module):
    """Training-only linear heads reading each patch token's object kind, colour, pattern and size.

    Why: trained on match/no-match alone, the head learnt counts within a few hundred steps but
    never object kinds (object-error AUC 0.51, docs/grounding.md): one bit per caption is too
    weak a signal to make the vision tokens tell a cat from a bird. SceneWorld knows which
    object covers each patch, so the tokens are also taught to name it (dense supervision, as
    detection-style pretraining does); the match head then only has to bind words to tokens.
    """

    def __init__(self, width: int) -> None:
        super().__init__()
        self.sizes = [len(v) + 1 for v in _label_vocab().values()]
        self.head = nn.Linear(width, sum(self.sizes))

    def loss(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Kind over all patches (class 0: no object) counted twice, since kinds are what the tokens
        learn slowest (measured: colour reaches 0.89 patch accuracy in 100 steps at lr 2e-3, kind 0.24 in 300);
        colour, pattern and size over object patches only."""
        logits = self.head(tokens).split(self.sizes, dim=-1)
        total = 2 * F.cross_entropy(logits[0].reshape(-1, self.sizes[0]), labels[..., 0].reshape(-1))
        for k, lg in enumerate(logits[1:], start=1):
            total = total + F.cross_entropy(lg.reshape(-1, lg.shape[-1]), labels[..., k].reshape(-1), ignore_index=0)
        return total / (len(logits) + 1)


@dataclass(frozen=True)
class MatcherSettings:
    n_scenes: int = 24000
    epochs: int = 2
    batch_scenes: int = 32
    lr: float = 1e-3
    warmup_steps: int = 30
    weight_decay: float = 0.05
    layers: int = 2
    seed: int = 0
    object_share: float = 0.0  # extra share of object-kind negatives (see _sample_pairs)
    dense_weight: float = 1.0  # weight of the per-patch kind/colour/pattern/size loss (see PatchLabeller)
    align_weight: float = 1.0  # weight of the phrase-patch alignment loss (see _align_loss)


def _sample_pairs(texts: list[SceneTexts], rng: np.random.Generator,
                  object_share: float = 0.0) -> tuple[list[str], list[int], list[float]]:
    """Four texts per scene: a one-detail-wrong caption and the true caption it was made from
    (so the only difference to learn from is the detail), a true phrase or sentence, and
    either a wrong phrase or a text of another scene (the easy negative that keeps global
    matching honest). With probability `object_share` the wrong caption is one whose object kind
    was changed, when the scene has one (kinds are what the vision tower knows least).
    Returns texts, owner (scene index in the batch) and labels."""
    out_t: list[str] = []
    owner: list[int] = []
    label: list[float] = []

    def add(i: int, t: str, y: float) -> None:
        out_t.append(t)
        owner.append(i)
        label.append(y)

    n = len(texts)
    for i, st in enumerate(texts):
        kinds = [k for k, t in enumerate(st.negative_types) if t == "object"]
        if kinds and rng.random() < object_share:
            wrong, source = st.negatives[kinds[int(rng.integers(len(kinds)))]]
        else:
            wrong, source = st.negatives[int(rng.integers(len(st.negatives)))]
        add(i, source, 1.0)
        add(i, wrong, 0.0)
        pool = st.phrases + st.positives
        add(i, pool[int(rng.integers(len(pool)))], 1.0)
        if st.wrong_phrases and (n == 1 or rng.random() < 0.5):
            add(i, st.wrong_phrases[int(rng.integers(len(st.wrong_phrases)))], 0.0)
        elif n > 1:
            j = (i + 1 + int(rng.integers(n - 1))) % n
            add(i, texts[j].positives[int(rng.integers(len(texts[j].positives)))], 0.0)
    return out_t, owner, label


def _align_loss(matcher: MiniMatcher, tokens: torch.Tensor, texts: list[SceneTexts], covers: list[np.ndarray],
                rng: np.random.Generator, tokenizer: Any, per_scene: int = 2) -> torch.Tensor:
    """Phrase-patch alignment loss for a batch: per scene `per_scene` true object phrases (target:
    the patches of the objects they refer to) and as many corrupted ones (target: no patch).
    Patch-level BCE (positives and negatives balanced) plus a phrase-level BCE on the maximum."""
    from engine.backends.sceneworld_mini.network import tokenize

    phrases: list[str] = []
    owner: list[int] = []
    target: list[np.ndarray] = []
    P = tokens.shape[1]
    for i, st in enumerate(texts):
        for k in rng.permutation(len(st.aligned))[:per_scene]:
            text, ids = st.aligned[int(k)]
            phrases.append(text)
            owner.append(i)
            target.append(covers[i][list(ids)].any(axis=0))
        for k in rng.permutation(len(st.misaligned))[:per_scene]:
            phrases.append(st.misaligned[int(k)])
            owner.append(i)
            target.append(np.zeros(P, bool))
    device = tokens.device
    ids_t, mask = tokenize(tokenizer, phrases, MAX_TOKENS)
    logits = matcher.align_logits(tokens[torch.as_tensor(owner, device=device)], ids_t.to(device), mask.to(device))
    y = torch.from_numpy(np.stack(target)).to(device=device, dtype=logits.dtype)
    n_pos = y.sum().clamp(min=1)
    n_neg = (1 - y).sum().clamp(min=1)
    w = torch.where(y > 0.5, 0.5 / n_pos, 0.5 / n_neg)
    patch = (F.binary_cross_entropy_with_logits(logits, y, reduction="none") * w).sum()
    has = y.amax(dim=1)
    phrase = F.binary_cross_entropy_with_logits(logits.amax(dim=1), has)
    return patch + phrase


def train_matcher(model_dir: Path, out_dir: Path, s: MatcherSettings = MatcherSettings(), *,
                  device: str = "cpu", cancel: CancelToken | None = None,
                  checkpoint_every: int = 0, init_from: Path | None = None) -> Iterator[Progress]:
    """Train the matcher of `model_dir` into `out_dir` (a generator of progress; cancel-aware).
    checkpoint_every > 0 also saves the weights every that many steps (meta says which step);
    init_from: a matcher folder to continue from (a further run) instead of the model's towers."""
    from engine.backends.sceneworld_mini.network import (
        build_tokenizer,
        load_model,
        pixels_from_uint8,
        tokenize,
    )
    from engine.sceneworld import check_train_seed, generate_scenes
    check_train_seed(s.seed)
    cancel = cancel or CancelToken()
    torch.manual_seed(s.seed)
    rng = np.random.default_rng(s.seed)
    t0 = time.monotonic()
    base = load_model(Path(model_dir), "cpu")
    cfg = base.cfg
    yield Progress("data", 0, s.n_scenes, "rendering training scenes")
    scenes = generate_scenes(s.seed, 0, s.n_scenes)
    renders, patch_y, covers = render_with_labels(scenes, cfg.image_size, cfg.grid)
    texts = [scene_texts(sc) for sc in scenes]
    del scenes
    tokenizer = build_tokenizer()
    matcher = MiniMatcher.from_model(base, s.layers)
    if init_from is not None:
        from safetensors.torch import load as load_safetensors

        from engine.fileutil import read_user_file

        # A user's folder: read through open_user_file (no FIFO or device can block it), then parsed.
        weights = read_user_file(Path(init_from) / WEIGHTS)
        matcher.load_state_dict({k: v.float() for k, v in load_safetensors(weights).items()})
    matcher = matcher.to(device)
    del base
    # The word-piece table stays as trained (30,522 x 64: most of the parameters, and most words
    # never occur in SceneWorld); everything after it learns.
    matcher.text.tok.weight.requires_grad_(False)
    labeller = PatchLabeller(cfg.vision_width).to(device) if s.dense_weight > 0 else None
    params = [p for p in matcher.parameters() if p.requires_grad]
    if labeller is not None:
        params += list(labeller.parameters())
    opt = torch.optim.AdamW(params, lr=s.lr, weight_decay=s.weight_decay)
    steps_per_epoch = s.n_scenes // s.batch_scenes
    total = steps_per_epoch * s.epochs

    def lr_at(step: int) -> float:
        if step < s.warmup_steps:
            return (step + 1) / s.warmup_steps
        frac = (step - s.warmup_steps) / max(total - s.warmup_steps, 1)
        return 0.5 * (1 + math.cos(math.pi * min(frac, 1.0)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    history: list[list[float]] = []
    step = 0
    t_train = time.monotonic()
    matcher.train()
    for epoch in range(s.epochs):
        order = rng.permutation(s.n_scenes)
        for b in range(steps_per_epoch):
            if cancel.cancelled:
                yield Progress("cancelled", step, total, "cancelled")
                return
            idx = order[b * s.batch_scenes:(b + 1) * s.batch_scenes]
            pix = torch.from_numpy(pixels_from_uint8(renders[idx])).to(device)
            batch_texts, owner, labels = _sample_pairs([texts[i] for i in idx], rng, s.object_share)
            ids, mask = tokenize(tokenizer, batch_texts, MAX_TOKENS)
            tokens = matcher.image_tokens(pix)
            logits = matcher(tokens[torch.as_tensor(owner, device=device)], ids.to(device), mask.to(device))
            y = torch.as_tensor(labels, device=device)
            # Balance the classes: 0.5 then means "undecided" before any calibration.
            w = torch.where(y > 0.5, 0.5 / y.sum().clamp(min=1), 0.5 / (1 - y).sum().clamp(min=1))
            match_loss = (F.binary_cross_entropy_with_logits(logits, y, reduction="none") * w).sum()
            parts = [match_loss]
            if labeller is not None:
                parts.append(s.dense_weight * labeller.loss(tokens, torch.from_numpy(patch_y[idx]).to(device)))
            if s.align_weight > 0:
                parts.append(s.align_weight * _align_loss(matcher, tokens, [texts[i] for i in idx],
                                                          [covers[i] for i in idx], rng, tokenizer))
            loss = sum(parts)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            sched.step()
            step += 1
            history.append([float(x.detach()) for x in parts])
            if checkpoint_every and step % checkpoint_every == 0 and step < total:
                matcher.eval()
                save_matcher(matcher, Path(out_dir), {"settings": asdict(s), "checkpoint_step": step})
                matcher.train()
            if step % 10 == 0 or step == total:
                rate = step / max(time.monotonic() - t_train, 1e-9)
                recent = " + ".join(f"{v:.3f}" for v in np.mean(history[-20:], axis=0))
                yield Progress("train", step, total, f"epoch {epoch + 1}/{s.epochs} loss {recent}",
                               rate=rate, eta_s=(total - step) / rate)
    matcher.eval()
    meta = {"settings": asdict(s), "continued_from": read_json_file(Path(init_from) / META, max_bytes=MAX_SMALL_JSON_BYTES)
            if init_from is not None else None, "seconds": round(time.monotonic() - t0, 1),
            "final_loss": [float(v) for v in np.mean(history[-50:], axis=0)] if history else None,
            "torch": torch.__version__}
    save_matcher(matcher, Path(out_dir), meta)
    yield Progress("done", total, total, f"saved to {out_dir}")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="longlens dev train-matcher",
                                 description="Train sceneworld-mini's image-text matching head.")
    ap.add_argument("--model-dir", type=Path, required=True)
    ap.add_argument("--out", type=Path, help="default: MODEL_DIR/matcher")
    ap.add_argument("--n-scenes", type=options.SCENES, default=MatcherSettings.n_scenes)
    ap.add_argument("--epochs", type=options.EPOCHS, default=MatcherSettings.epochs)
    ap.add_argument("--seed", type=options.SEED, default=MatcherSettings.seed)
    ap.add_argument("--checkpoint-every", type=options.count("steps between checkpoints", 0, 1_000_000_000), default=0, help="also save every N steps")
    ap.add_argument("--object-share", type=options.probability("object-negative share"), default=MatcherSettings.object_share,
                    help="probability of picking an object-kind negative when a scene has one")
    ap.add_argument("--dense-weight", type=options.Number("dense loss weight", float, 0, 1000), default=MatcherSettings.dense_weight,
                    help="weight of the per-patch kind/colour/pattern/size loss (0: off)")
    ap.add_argument("--align-weight", type=options.Number("alignment loss weight", float, 0, 1000), default=MatcherSettings.align_weight,
                    help="weight of the phrase-patch alignment loss (0: off)")
    ap.add_argument("--init-from", type=Path, help="continue training the matcher in this folder")
    ap.add_argument("--rounds", type=options.count("number of rounds", 1, 1000), default=1,
                    help="train this many runs in a row, each continuing the previous one on fresh scenes "
                         "(seeds SEED, SEED+1, ...); the shipped head is 4 rounds")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.init_from is not None and not (args.init_from / WEIGHTS).is_file():
        ap.error(f"--init-from {args.init_from}: no {WEIGHTS} there (a folder written by this command)")
    s = MatcherSettings(n_scenes=args.n_scenes, epochs=args.epochs, seed=args.seed, object_share=args.object_share,
                        dense_weight=args.dense_weight, align_weight=args.align_weight)
    out = args.out or args.model_dir / MATCHER_DIR
    check_script_output(ap, out, what="matcher folder", folder=True, resumable=True,
                        inputs=[args.init_from] if args.init_from and args.init_from.resolve() != out.resolve() else [])
    scratch = Path(tempfile.mkdtemp(prefix="longlens-matcher-"))
    init = args.init_from
    try:
        for r in range(args.rounds):
            target = out if r == args.rounds - 1 else scratch / f"round{r}"
            last = 0.0
            for p in train_matcher(args.model_dir, target, replace(s, seed=s.seed + r),
                                   checkpoint_every=args.checkpoint_every, init_from=init):
                now = time.monotonic()
                if now - last > 15 or p.stage in ("done", "data"):
                    last = now
                    eta = f" eta {p.eta_s / 60:.1f} min" if p.eta_s else ""
                    print(f"[matcher] round {r + 1}/{args.rounds} {p.stage} {p.done}/{p.total} {p.message}{eta}",
                          file=sys.stderr, flush=True)
            init = target
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if out.resolve() == (args.model_dir / MATCHER_DIR).resolve() and add_to_manifest(args.model_dir):
        print(f"[matcher] listed in {args.model_dir}/longlens-manifest.json; now refit the calibration: "
              "longlens dev calibrate --model sceneworld-mini", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
