"""`longlens dev ...`: the maintenance jobs the Makefile runs (training the bundled model, its
calibration, the reports and benchmarks in docs/).

Each subcommand hands its arguments untouched to the module's own `main(argv)`, imported only
when the subcommand runs: the modules keep their options, and `python -m MODULE` still works.
A module that moves needs only its name changed in JOBS.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Sequence
from typing import Any

# subcommand -> (module with main(argv), what it does)
JOBS: dict[str, tuple[str, str]] = {
    "train-sceneworld-mini": ("engine.training.sceneworld_mini",
                              "train the bundled sceneworld-mini model (make demo-model)"),
    "train-matcher": ("engine.training.matcher_training", "train sceneworld-mini's matching head (make demo-model)"),
    "calibrate": ("engine.evaluation.grounding_calibration", "fit a model's grounding calibration (make demo-model)"),
    "sceneworld-report": ("engine.evaluation.sceneworld_report",
                          "measure sceneworld-mini and write docs/sceneworld.md (make sceneworld-report)"),
    "lexical-shift": ("engine.evaluation.lexical_shift",
                      "long-query retrieval on the SceneWorld lexical-shift set (docs/language-towers.md)"),
    "train-lm-tower": ("engine.training.lm_tower_sceneworld",
                       "train an LM text tower (k = 0, cached MiniLM features) on SceneWorld (docs/language-towers.md)"),
    "ship-text-tower": ("engine.training.ship_text_tower",
                        "bundle a trained LM text tower with a model as a query reader (docs/language-towers.md)"),
    "caft": ("engine.training.caft",
             "train and measure the CAFT-style sceneworld-mini variant; write docs/caft.md (make caft)"),
    "reproduction": ("engine.training.reproduction",
                     "run the C1-C10 SceneWorld study and write docs/reproduction.md (make reproduction)"),
    "bench-ann": ("engine.bench.ann", "ANN recall, latency and size against exact search (make bench)"),
    "bench-indexing": ("engine.bench.indexing", "end-to-end indexing throughput (make bench)"),
    "bench-gpu": ("engine.bench.gpu", "the CUDA section of docs/benchmarks.md (needs a GPU)"),
    "bench-rss": ("engine.bench.rss", "peak memory while indexing"),
    "bench-cluster": ("engine.cluster.bench", "Ray indexing throughput against one process (docs/scale-out.md)"),
    "fake-vlm-server": ("engine.datagen.fake_server",
                        "a local stand-in for a vision-language endpoint, to try `longlens datagen`"),
}


def split_job_args(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """(the arguments for the `longlens` parser, the arguments of a `dev` job).

    What follows `dev JOB` belongs to the job, options included, so it never reaches argparse:
    argparse would read the job's --out or --help as its own. Only --home comes before a command.
    """
    argv = list(argv)
    i = 0
    while i < len(argv) and (argv[i] == "--home" or argv[i].startswith("--home=")):
        i += 2 if argv[i] == "--home" else 1
    if i + 1 < len(argv) and argv[i] == "dev" and argv[i + 1] in JOBS:
        return argv[: i + 2], argv[i + 2:]
    return argv, []


def cmd_dev(args: argparse.Namespace) -> int:
    module = importlib.import_module(JOBS[args.dev_cmd][0])
    try:
        return int(module.main(list(args.job_args)) or 0)
    except SystemExit as exc:  # the job's own usage error (2) or --help (0)
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)


def register(sub: Any) -> None:
    dp = sub.add_parser(
        "dev",
        help="maintenance jobs for developers (train the bundled model, write the docs' reports, benchmarks)",
        description="Maintenance jobs the Makefile runs. Each takes its own options: `longlens dev JOB --help`.",
    )
    dsub = dp.add_subparsers(dest="dev_cmd", required=True, metavar="JOB")
    for name, (module, text) in JOBS.items():
        # No options of its own (not even --help): everything after the name goes to the job.
        dsub.add_parser(name, help=f"{text}; runs {module}", add_help=False,
                        description=f"{text}. Runs {module}.main with the arguments given.")
    dp.set_defaults(func=cmd_dev, job_args=[])
