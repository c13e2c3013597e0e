"""`longlens train` and its subcommands.

    longlens train --config C5 --data FILE --base MODEL --out DIR [--epochs N --lr X ...]
    longlens train cache --data FILE --base MODEL [--out CACHE_DIR]
    longlens train validate FILE [--config C5] [--strict]
    longlens train convert {docci,sharegpt4v,dci} --root DIR --out FILE.jsonl [--split S --skip N --limit N]

"train" takes its own options and an optional nested command, so all the forms parse with
one parser. torch and transformers load inside the command functions only.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

from engine import limits, options
from engine.cli import common
from engine.errors import LonglensError
from engine.text.inert import inert

TRAIN_BATCH = options.count("batch size", 1, 65536)
GRAD_ACCUM = options.count("gradient accumulation steps", 1, 4096)
CHECKPOINT_EVERY = options.count("steps between checkpoints", 0, 1_000_000_000)
PROBLEM_LIMIT = options.count("number of problems to print", 0, 1_000_000_000)
CONVERT_LIMIT = options.count("number of lines to write", 1, limits.MAX_FILE_LINES)
CONVERT_SKIP = options.count("number of records to skip", 0, 1_000_000_000)
CONVERT_FLAGS = {"root": "--root", "out": "--out", "split": "--split", "annotations": "--annotations",
                 "images": "--images", "limit": "--limit", "skip": "--skip"}


def _grad_accum(value: str) -> int | str:
    if value.strip() == "auto":
        return "auto"
    try:
        return GRAD_ACCUM.parse(value)
    except options.OptionError as exc:
        raise argparse.ArgumentTypeError(f"{exc} (or 'auto')") from None


_grad_accum.number = GRAD_ACCUM  # type: ignore[attr-defined]  # its range, for the option tests


def register(sub: Any) -> None:
    tp = sub.add_parser(
        "train",
        help="train a paragraph text tower (also: train cache, train validate, train convert)",
        description="Train the text tower of MODEL on a training JSONL with configuration C1..C10 "
        "(vision frozen). Subcommands: `train cache` precomputes image embeddings, `train validate` "
        "checks a data file, `train convert` turns DOCCI, ShareGPT4V or DCI into one. See docs/training.md "
        "and docs/public-data.md.",
    )
    tp.add_argument("--config", help="C1..C10, pretrain, or a JSON config file")
    tp.add_argument("--data", type=Path, help="training JSONL (docs/training.md, 'Data format')")
    tp.add_argument("--base", help="installed model name or model folder to start from")
    tp.add_argument("--out", type=Path, help="output folder (text-tower override + checkpoints)")
    tp.add_argument("--epochs", type=options.EPOCHS)
    tp.add_argument("--lr", type=options.LEARNING_RATE)
    tp.add_argument("--batch-size", type=TRAIN_BATCH)
    tp.add_argument("--grad-accum", type=_grad_accum, default="auto",
                    help="micro-batches per batch (gradient caching: same result as one batch); "
                    "'auto' (default) starts at the config's value and doubles on a GPU out-of-memory error")
    tp.add_argument("--seed", type=options.SEED)
    tp.add_argument("--warmup-steps", type=options.STEPS)
    tp.add_argument("--temperature", type=options.TEMPERATURE)
    tp.add_argument("--init-text-tower", type=Path, help="start from this text-tower override instead of the base's")
    tp.add_argument("--text-tower", metavar="NAME_OR_FOLDER",
                    help="train a pretrained language model as the text tower instead of the base's own, against "
                    "the base's frozen image embeddings: an LM tower folder (lm_tower.json), a local Hugging Face "
                    "model folder, or all-MiniLM-L6-v2 (packaged); writes an LM tower folder")
    tp.add_argument("--train-layers", type=options.train_layers,
                    help="with --text-tower: train its top K transformer layers (0: the projection only; 'all')")
    tp.add_argument("--sentence-sampling", type=options.SENTENCE_SAMPLING, metavar="FRACTION",
                    help="each step, each paragraph keeps this fraction of its sentences (at least one), drawn at "
                    "random and kept in order: the seed recipe's sentence sampling (default: whole paragraphs)")
    tp.add_argument("--local-alignment", type=options.LOCAL_ALIGNMENT, default=0.0, metavar="WEIGHT",
                    help="add the local phrase-region alignment loss with this weight beside the global one: each "
                    "phrase of a text is matched to its best image patch (models whose vision tower gives patch "
                    "embeddings: BLIP, CLIP, sceneworld-mini; 0, the default: off). See docs/training.md")
    tp.add_argument("--cache", type=Path, help="embedding cache folder (default: under the Longlens cache)")
    tp.add_argument("--checkpoint-every", type=CHECKPOINT_EVERY, default=500, help="steps between checkpoints (0: only at the end)")
    tp.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint")
    tp.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps")
    tp.add_argument("--strict", action="store_true", help="abort on the first bad data line instead of skipping it")
    tp.add_argument("--json", action="store_true", help="print the run summary as JSON")
    tp.add_argument("--quiet", action="store_true", help="no progress bar")
    tp.set_defaults(func=cmd_train, flags={"resume": "--resume", "out_dir": "--out", "batch_size": "--batch-size",
                                          "cache_dir": "--cache", "model": "--base",
                                          "text_tower": "--text-tower", "train_layers": "--train-layers",
                                          "init_text_tower": "--init-text-tower",
                                          "local_alignment": "--local-alignment", "grad_accum": "--grad-accum"})
    tsub = tp.add_subparsers(dest="train_cmd", metavar="{cache,validate,convert}")

    tc = tsub.add_parser("cache", help="compute the frozen image embeddings of a data file (resumable)")
    tc.add_argument("--data", type=Path, required=True)
    tc.add_argument("--base", required=True, help="installed model name or model folder")
    tc.add_argument("--out", type=Path, help="cache folder (default: the one `longlens train` uses)")
    tc.add_argument("--device", default="auto")
    tc.add_argument("--batch-size", type=options.BATCH_SIZE, default=64)
    tc.add_argument("--workers", type=options.WORKERS, default=4, help="decoding threads")
    tc.add_argument("--strict", action="store_true")
    tc.add_argument("--json", action="store_true")
    tc.add_argument("--quiet", action="store_true")
    tc.set_defaults(func=cmd_train_cache, flags={"cache_dir": "--out", "batch_size": "--batch-size", "model": "--base"})

    tv = tsub.add_parser("validate", help="check a training JSONL; lists problems by line number")
    tv.add_argument("file", type=Path)
    tv.add_argument("--config", help="also check what this configuration needs (e.g. C5 needs paragraphs)")
    tv.add_argument("--strict", action="store_true", help="warnings fail too (exit 1)")
    tv.add_argument("--no-image-check", action="store_true", help="do not check that image files exist")
    tv.add_argument("--limit", type=PROBLEM_LIMIT, default=50, help="problems to print (default 50)")
    tv.add_argument("--json", action="store_true")
    tv.set_defaults(func=cmd_train_validate, flags={})

    from engine.training.public_data import SOURCES

    cv = tsub.add_parser(
        "convert", help="turn a public long-caption set (DOCCI, ShareGPT4V, DCI) into a training JSONL",
        description="Convert DOCCI (docci_descriptions.jsonlines + images/), ShareGPT4V (its JSON list, images "
        "under the folder or its data/) or DCI (densely_captioned_images/: splits.json, complete/, photos/) into "
        "the training JSONL of docs/training.md. Bad records and missing images are skipped and listed "
        "(FILE:LINE: field: reason); the file is written only when the conversion finishes. See docs/public-data.md.")
    cv.add_argument("source", choices=SOURCES)
    cv.add_argument("--root", type=Path, required=True, metavar="DIR", help="the folder the set was downloaded into")
    cv.add_argument("--out", type=Path, required=True, metavar="FILE.jsonl", help="training JSONL to write (replaced)")
    cv.add_argument("--split", help="DOCCI: train (default), test, qual_dev, qual_test; DCI: train (default), valid, "
                    "test; ShareGPT4V has none")
    cv.add_argument("--skip", type=CONVERT_SKIP, default=0, metavar="N",
                    help="leave out the first N records (ShareGPT4V: 1000 keeps Long-CLIP's ShareGPT4V-1k test set out)")
    cv.add_argument("--limit", type=CONVERT_LIMIT, metavar="N", help="write at most N lines")
    cv.add_argument("--annotations", type=Path, metavar="FILE",
                    help="the annotation file (DOCCI's .jsonlines, or which ShareGPT4V .json) when not the default")
    cv.add_argument("--images", type=Path, metavar="DIR", help="the image folder when not the layout's default")
    cv.add_argument("--strict", action="store_true", help="stop at the first bad record and write nothing")
    cv.add_argument("--json", action="store_true", help="print the summary as JSON")
    cv.add_argument("--quiet", action="store_true", help="no progress bar")
    cv.set_defaults(func=cmd_train_convert, flags=CONVERT_FLAGS)


def _postfix(p: Any) -> str | None:
    return f"loss {p.extra['loss']:.4f} lr {p.extra['lr']:.2e}" if "loss" in p.extra else None


# One bar per stage; the training bar shows loss, lr, steps/s and ETA.
BARS = common.Bars(unit=lambda stage: "step" if stage == "train" else "img", postfix=_postfix, need_total=True)
STOPPING = "\nstopping after the current step (Ctrl+C again to abort) ..."


def run_training_job(make_job: Any, quiet: bool) -> Any:
    """Run make_job(cancel_token) with progress on stderr, reporting data problems as they are
    found. Ctrl+C asks the job to stop; it checkpoints and ends cleanly."""

    def report_problems(p: Any) -> None:
        if p.stage == "validate" and p.message and not quiet and p.extra.get("problems"):
            print(f"data problems ({p.extra['problems']}, {p.extra['skipped']} lines skipped):\n"
                  f"{inert(p.message, layout=True)}",
                  file=sys.stderr)
        if p.stage == "validate" and p.extra.get("text_tokens_cut") and not quiet:
            print(f"note: {inert(p.message, layout=True)}", file=sys.stderr)

    return common.run_job(make_job, quiet=quiet, bars=BARS, stopping=STOPPING, on_progress=report_problems)


def _check_train_out(args: argparse.Namespace, out: Path, what: str, kind: str, inputs: list[Path | None]) -> None:
    """A training folder is extended and resumed, not replaced; it may still be no input of the
    run (data file, base model folder, tower) and lie in no indexed library."""
    from engine.outputs import check_output, library_roots

    refs = [p for p in inputs if p is not None]
    if args.base and Path(args.base).expanduser().exists():
        refs.append(Path(args.base))
    check_output(out, what=what, kind=kind, folder=True, resumable=True, inputs=refs,
                 library_roots=library_roots(args.home))


def _tower_folder(ref: str | None) -> Path | None:
    """An --text-tower that names a folder: it is an input of the run (not a packaged name)."""
    return Path(ref).expanduser() if ref and Path(ref).expanduser().exists() else None


def cmd_train(args: argparse.Namespace) -> int:
    from engine.training.configs import load_config
    from engine.training.run import TrainRequest, train_job

    missing = [f"--{n}" for n in ("config", "data", "base", "out") if getattr(args, n) is None]
    if missing:
        raise LonglensError(f"`longlens train` needs {', '.join(missing)} "
                            "(or use `longlens train cache` / `longlens train validate`)")
    _check_train_out(args, args.out, "training output", "train", [args.data, args.init_text_tower, args.cache,
                                                                        _tower_folder(args.text_tower)])
    fixed_accum = args.grad_accum if isinstance(args.grad_accum, int) else None
    cfg = load_config(args.config, epochs=args.epochs, lr=args.lr, batch_size=args.batch_size,
                      grad_accum=fixed_accum, seed=args.seed, warmup_steps=args.warmup_steps,
                      temperature=args.temperature)
    if args.sentence_sampling is not None:
        cfg = dataclasses.replace(cfg, extra={**cfg.extra, "sentence_sampling": args.sentence_sampling})
    if args.local_alignment:  # 0 leaves the config (and so the run's fingerprint) as it was
        cfg = cfg.with_overrides(extra={**cfg.extra, "local_alignment": args.local_alignment})
    paths = common.paths(args).ensure()
    req = TrainRequest(data=args.data, base=args.base, out_dir=args.out, config=cfg, cache_dir=args.cache,
                       device=args.device, resume=args.resume, strict=args.strict,
                       checkpoint_every=args.checkpoint_every, init_text_tower=args.init_text_tower,
                       auto_grad_accum=fixed_accum is None, text_tower=args.text_tower,
                       train_layers=args.train_layers)
    last = run_training_job(lambda tok: train_job(req, paths, tok), quiet=args.quiet or args.json)
    extra = dict(last.extra) if last is not None else {}
    if args.json:
        common.print_json(extra)
    elif last is not None:
        print(inert(last.message, layout=True))
        if extra.get("final_loss") is not None:
            print(f"steps {extra.get('steps')}  final loss {extra['final_loss']:.4f}  "
                  f"examples {extra.get('examples')}  skipped lines {extra.get('skipped_lines')}")
    return 130 if extra.get("cancelled") else 0


def cmd_train_cache(args: argparse.Namespace) -> int:
    from engine.training.bases import load_embedder_for, resolve_base
    from engine.training.cache import build_cache
    from engine.training.data import format_problems, read_training_jsonl
    from engine.training.run import default_cache_dir

    if args.out is not None:
        _check_train_out(args, args.out, "embedding cache", "train-cache", [args.data])
    paths = common.paths(args).ensure()
    data = read_training_jsonl(args.data, strict=args.strict)
    if data.errors and not args.json:
        print(f"skipping {len(data.skipped_lines)} bad lines:\n"
              f"{inert(format_problems(data, limit=10, severity='error'), layout=True)}",
              file=sys.stderr)
    base = resolve_base(args.base, paths)
    embedder = load_embedder_for(base, paths, device=args.device)
    cache_dir = args.out or default_cache_dir(paths, base)
    images = [r.image for r in data.records]
    last = run_training_job(lambda tok: build_cache(embedder, images, cache_dir, batch_size=args.batch_size,
                                          workers=args.workers, cancel=tok), quiet=args.quiet or args.json)
    extra = dict(last.extra) if last is not None else {}
    if args.json:
        common.print_json(extra)
    else:
        print(f"cache {inert(extra.get('cache'))}: {extra.get('added', 0)} embedded, {extra.get('reused', 0)} already "
              f"cached, {len(extra.get('failed', []))} failed, {extra.get('count', 0)} in total")
        for f in extra.get("failed", [])[:20]:
            print(f"  failed: {inert(f['path'])}: {inert(f['reason'])}")
        if extra.get("cancelled"):
            print("CANCELLED: the other images were not embedded; run the command again to finish "
                  "(what is cached is kept)")
    return 130 if extra.get("cancelled") else 0


def cmd_train_validate(args: argparse.Namespace) -> int:
    from engine.training.configs import load_config
    from engine.training.data import read_training_jsonl

    cfg = load_config(args.config) if args.config else None
    data = read_training_jsonl(args.file, cfg, check_images=not args.no_image_check)
    failing = data.problems if args.strict else data.errors
    if args.json:
        common.print_json({**data.summary(), "skipped_lines": data.skipped_lines,
                     "problems": [{"line": p.line, "field": p.field, "reason": p.reason, "severity": p.severity}
                                  for p in data.problems]})
    else:
        for p in data.problems[: args.limit]:
            print(inert(p.format(data.path)))
        if len(data.problems) > args.limit:
            print(f"... and {len(data.problems) - args.limit} more (--limit)")
        s = data.summary()
        print(f"{inert(s['file'])}: {s['lines']} lines, {s['valid']} usable, {s['skipped']} would be skipped, "
              f"{s['errors']} errors, {s['warnings']} warnings")
    return 1 if failing else 0


CONVERT_BARS = common.Bars(unit=lambda stage: "B" if stage == "read" else "record", need_total=True,
                           scaled_units=frozenset({"B"}),
                           postfix=lambda p: f"written {p.extra.get('written', 0)} skipped {p.extra.get('skipped', 0)}")


def cmd_train_convert(args: argparse.Namespace) -> int:
    from engine.outputs import library_roots
    from engine.training.public_data import ConvertRequest, convert_job

    req = ConvertRequest(source=args.source, root=args.root, out=args.out, split=args.split, limit=args.limit,
                         skip=args.skip, strict=args.strict, annotations=args.annotations, images=args.images,
                         library_roots=tuple(library_roots(args.home)))
    last = common.run_job(lambda tok: convert_job(req, tok), quiet=args.quiet or args.json, bars=CONVERT_BARS,
                          stopping="\nstopping: nothing will be written (Ctrl+C again to abort) ...")
    summary = dict(last.extra) if last is not None else {}
    if args.json:
        common.print_json(summary)
    else:
        problems = summary.get("problems", [])
        for text in problems[:20]:
            print(inert(text), file=sys.stderr)
        if summary.get("skipped", 0) > 20:
            print(f"... and {summary['skipped'] - 20} more (--json lists the first {len(problems)})", file=sys.stderr)
        if last is not None:
            print(inert(last.message, layout=True))
        if summary.get("duplicate_images"):
            print(f"note: {summary['duplicate_images']} lines repeat an earlier line's image (kept)")
    if summary.get("cancelled"):
        return 130
    return 1 if summary.get("skipped") else 0
