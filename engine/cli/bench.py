"""`longlens bench`; the measurements are engine/bench/suite.py's."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def cmd_bench(args: argparse.Namespace) -> int:
    from engine.bench.suite import main_args

    return main_args(args)


def register(sub: Any) -> None:
    bp = sub.add_parser(
        "bench",
        help="measure indexing and query speed against their baselines (writes docs/benchmarks.md)",
        description="Encode throughput (naive vs fast, stage breakdown), query latency (encode / ANN / "
        "catalog) at 10k/100k/1M vectors, ANN recall and bytes per vector, peak RSS while indexing. "
        "Every figure has its baseline from the same run. The full run takes about half an hour on 2 cores.",
    )
    bp.add_argument("--quick", action="store_true",
                    help="tiny model and small sizes (seconds); checks the machinery, figures are meaningless")
    bp.add_argument("--json", action="store_true", help="print the results as JSON instead of Markdown")
    bp.add_argument("--json-out", type=Path, help="also write the JSON to this file")
    bp.add_argument("--out", type=Path,
                    help="Markdown file whose bench section is updated (default docs/benchmarks.md; none with --quick)")
    bp.add_argument("--no-1m", action="store_true", help="skip the 1M-vector size (its hnsw build is slow)")
    bp.add_argument("--gpu", action="store_true", help="also run the CUDA section (engine/bench/gpu.py)")
    bp.add_argument("--only", help="comma-separated sections to re-measure: encode,text,ann,rss,profile "
                    "(needs --merge)")
    bp.add_argument("--merge", type=Path, help="earlier run's JSON (--json-out) supplying the other sections")
    bp.set_defaults(func=cmd_bench, flags={"only": "--only", "merge": "--merge"})
