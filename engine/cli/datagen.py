"""`longlens datagen`.

    longlens datagen (--images DIR | --list FILE) --endpoint URL --generator MODEL --scorer MODEL --out FILE.jsonl
    longlens datagen --sceneworld --seed S --n N --out FILE.jsonl

See docs/datagen.md. Exit codes: 0 every image written, 1 some images failed (run again to retry
them), 2 bad input or a fatal endpoint error, 130 cancelled.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from engine import options
from engine.cli import common
from engine.errors import JobCancelled, LonglensError
from engine.text.inert import inert

API_KEY_ENV = "LONGLENS_API_KEY"
# Seeds from 1000 on are SceneWorld's evaluation scenes: training data never uses them.
TRAIN_SEED = options.count("SceneWorld training seed (1000 and up are reserved for evaluation)", 0, 999)
GEN_TEMPERATURE = options.Number("sampling temperature", float, 0, 2)
GEN_TOKENS = options.count("tokens per answer", 1, 32768)


# The settings an engine error may name (DatagenRequest's fields), as this command's flags.
DATAGEN_FLAGS = {
    "images": "--images", "list": "--list", "out": "--out", "prompts_dir": "--prompts", "endpoint": "--endpoint",
    "generator": "--generator", "scorer": "--scorer", "concurrency": "--concurrency", "timeout": "--timeout",
    "parse_retries": "--parse-retries", "max_regenerations": "--max-regenerations", "max_retries": "--max-retries",
    "score_threshold": "--score-threshold", "max_side": "--max-side", "n": "--n",
}


def register(sub: Any) -> None:
    from engine.datagen.sampling import Sampling

    d = Sampling()
    p = sub.add_parser(
        "datagen",
        help="generate training data (captions, hard negatives, scored paragraphs) with a vision-language endpoint",
        description="Caption images with an OpenAI-compatible vision-language endpoint (vLLM, Ollama, LM Studio) "
        "into the training JSONL of docs/training.md, or write the same format from SceneWorld's ground truth "
        "(--sceneworld). Resumable: images already in --out are skipped. See docs/datagen.md.",
    )
    src = p.add_argument_group("input (one of)")
    src.add_argument("--images", type=Path, metavar="DIR", help="folder of images (searched recursively)")
    src.add_argument("--list", type=Path, metavar="FILE", help="JSONL {image, caption}, CSV/TSV with image[,caption], or one path per line")
    src.add_argument("--sceneworld", action="store_true", help="SceneWorld ground truth instead of an endpoint")
    p.add_argument("--out", type=Path, required=True, metavar="FILE.jsonl", help="training JSONL to write or extend")

    ep = p.add_argument_group("endpoint")
    ep.add_argument("--endpoint", metavar="URL", help="base URL, e.g. http://127.0.0.1:8000/v1")
    ep.add_argument("--generator", metavar="MODEL", help="model that writes captions, negatives and paragraphs")
    ep.add_argument("--scorer", metavar="MODEL", help="model that scores paragraphs 0-10")
    ep.add_argument("--api-key", metavar="KEY", help=f"bearer token (default: ${API_KEY_ENV})")
    ep.add_argument("--concurrency", type=options.count("images in flight", 1, 256), default=4, help="images in flight (default 4)")
    ep.add_argument("--timeout", type=options.Number("request timeout (s)", float, 0, 86400, lo_open=True), default=120.0, help="seconds without an answer before a retry (default 120)")
    ep.add_argument("--max-retries", type=options.count("retries per request", 0, 100), default=5, help="retries per request on 429/5xx/timeouts (default 5)")
    ep.add_argument("--backoff", type=options.Number("first backoff (s)", float, 0, 3600), default=1.0, help="first backoff in seconds, doubled per retry (default 1)")
    ep.add_argument("--max-backoff", type=options.Number("longest backoff (s)", float, 0, 86400), default=60.0, help="longest backoff in seconds (default 60)")
    ep.add_argument("--prompts", type=Path, metavar="DIR", help="folder of prompt templates overriding the defaults (NAME.txt)")
    ep.add_argument("--max-side", type=options.count("picture side (px)", 16, 8192), default=768, help="long side of the picture sent, in pixels (default 768)")
    ep.add_argument("--limit", type=options.count("number of new images", 1, 100_000_000), help="at most this many new images in this run")

    sp = p.add_argument_group("sampling (defaults: the research brief's)")
    sp.add_argument("--temperature", type=GEN_TEMPERATURE, default=d.temperature, help=f"generation (default {d.temperature})")
    sp.add_argument("--top-p", type=options.Number("top-p", float, 0, 1, lo_open=True), default=d.top_p, help=f"generation (default {d.top_p})")
    sp.add_argument("--max-tokens-positives", type=GEN_TOKENS, default=d.max_tokens_positives, metavar="N",
                    help=f"default {d.max_tokens_positives}")
    sp.add_argument("--max-tokens-negatives", type=GEN_TOKENS, default=d.max_tokens_negatives, metavar="N",
                    help=f"default {d.max_tokens_negatives}")
    sp.add_argument("--max-tokens-paragraph", type=GEN_TOKENS, default=d.max_tokens_paragraph, metavar="N",
                    help=f"default {d.max_tokens_paragraph}")
    sp.add_argument("--score-temperature", type=GEN_TEMPERATURE, default=d.score_temperature, metavar="T",
                    help=f"default {d.score_temperature:g}: greedy")
    sp.add_argument("--score-max-tokens", type=GEN_TOKENS, default=d.score_max_tokens, metavar="N",
                    help=f"default {d.score_max_tokens}")
    sp.add_argument("--score-threshold", type=options.Number("score threshold", float, 0, 10), default=5.0, metavar="S",
                    help="paragraphs scoring <= S are regenerated (default 5)")
    sp.add_argument("--max-regenerations", type=options.count("regenerations per paragraph", 0, 100), default=3, help="regenerations per paragraph (default 3)")
    sp.add_argument("--parse-retries", type=options.count("re-asks per answer", 0, 100), default=2, help="re-asks for an unusable answer (default 2)")

    sw = p.add_argument_group("SceneWorld mode")
    sw.add_argument("--seed", type=TRAIN_SEED, default=0, help="SceneWorld training seed, 0-999 (default 0)")
    sw.add_argument("--n", type=options.SCENES, default=100, help="scenes (default 100)")
    sw.add_argument("--size", type=options.count("picture size (px)", 16, 4096), default=256, help="picture size in pixels (default 256)")
    sw.add_argument("--image-dir", type=Path, metavar="DIR", help="where the pictures go (default: OUT_images next to --out)")

    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_datagen, flags=DATAGEN_FLAGS)


def _postfix(p: Any) -> str:
    return f"req {p.extra.get('requests', 0)} retry {p.extra.get('retries', 0)} failed {p.extra.get('failed', 0)}"


# Images, rate, ETA, requests, failures; the first Ctrl+C lets images in flight finish their current
# request and keeps what is written.
BARS = common.Bars(postfix=_postfix, need_total=True, announce=True)
STOPPING = "\nstopping: finishing requests in flight (Ctrl+C again to abort) ..."


def _drive(make_job: Any, quiet: bool) -> Any:
    return common.run_job(make_job, quiet=quiet, bars=BARS, stopping=STOPPING)


def _check_outputs(args: argparse.Namespace) -> None:
    """The JSONL (extended by a resumed run) and SceneWorld's picture folder must not be an input,
    a photo or inside an indexed library; the default picture folder is OUT_images next to --out."""
    from engine.outputs import check_output, library_roots

    inputs = [p for p in (args.images, args.list, args.prompts) if p is not None]
    roots = library_roots(args.home)
    check_output(args.out, what="training data file", kind="datagen", inputs=inputs, library_roots=roots)
    if args.sceneworld and args.image_dir is not None:
        check_output(args.image_dir, what="picture folder", kind="datagen-images", folder=True, resumable=True,
                     inputs=[*inputs, args.out], library_roots=roots)


def cmd_datagen(args: argparse.Namespace) -> int:
    sources = [n for n, v in (("--images", args.images), ("--list", args.list), ("--sceneworld", args.sceneworld))
               if v]
    if len(sources) != 1:
        raise LonglensError("give exactly one of --images DIR, --list FILE or --sceneworld"
                            + (f" (got {', '.join(sources)})" if sources else ""))
    _check_outputs(args)
    if args.sceneworld:
        from engine.datagen.pipeline import sceneworld_job

        last = _drive(lambda tok: sceneworld_job(args.out, args.seed, args.n, size=args.size,
                                                 image_dir=args.image_dir, cancel=tok), quiet=args.quiet or args.json)
        summary = last.extra["summary"]
        if args.json:
            common.print_json(summary)
        else:
            print(inert(last.message, layout=True))
        return 130 if summary.get("cancelled") else 0

    missing = [f"--{n}" for n in ("endpoint", "generator", "scorer") if not getattr(args, n)]
    if missing:
        raise LonglensError(f"`longlens datagen` with {sources[0]} needs {', '.join(missing)}")
    from engine.datagen.inputs import images_in_folder, read_image_list
    from engine.datagen.pipeline import DatagenRequest, datagen_job
    from engine.datagen.sampling import Sampling

    items = images_in_folder(args.images) if args.images else read_image_list(args.list)
    req = DatagenRequest(
        items=items, out=args.out, endpoint=args.endpoint, generator=args.generator, scorer=args.scorer,
        api_key=args.api_key or os.environ.get(API_KEY_ENV) or None,
        sampling=Sampling(args.temperature, args.top_p, args.max_tokens_positives, args.max_tokens_negatives,
                          args.max_tokens_paragraph, args.score_temperature, args.score_max_tokens),
        prompts_dir=args.prompts, concurrency=args.concurrency, timeout=args.timeout, max_retries=args.max_retries,
        backoff=args.backoff, max_backoff=args.max_backoff, parse_retries=args.parse_retries,
        score_threshold=args.score_threshold, max_regenerations=args.max_regenerations, max_side=args.max_side,
        limit=args.limit,
    )
    last = _drive(lambda tok: datagen_job(req, tok), quiet=args.quiet or args.json)
    if last is None or "summary" not in last.extra:
        raise JobCancelled(f"stopped before any image was done; {inert(args.out)} is as it was")
    summary = last.extra["summary"]
    if args.json:
        common.print_json(summary)
    else:
        if summary["torn_bytes_removed"]:
            print(f"note: removed an unfinished last line ({summary['torn_bytes_removed']} bytes) left by an "
                  "interrupted run", file=sys.stderr)
        print(inert(last.message, layout=True))
        for f in summary["failed"][:20]:
            print(f"  failed: {inert(f['image'])}: {inert(f['reason'])}")
        if len(summary["failed"]) > 20:
            print(f"  ... and {len(summary['failed']) - 20} more (--json lists all)")
        if summary["failed"]:
            print("run the same command again to retry the failed images")
    if summary["cancelled"]:
        return 130
    return 1 if summary["failed"] else 0
