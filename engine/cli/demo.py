"""`longlens demo`: index the demo collection (engine/sample_collection.py) and run a sample
query, in the terminal or in the desktop app.

Without the bundled sceneworld-mini model the demo model has RANDOM weights, and the output
says so in plain words.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, TextIO

from engine import sample_collection as collection
from engine.cli import common
from engine.config import Paths
from engine.sample_collection import DEMO_QUERY, SCENEWORLD_MODEL

SCENEWORLD_BANNER = (
    "sceneworld-mini is a small model trained by the Longlens project on SceneWorld, a generated "
    "world of pictures with exact descriptions. It understands SceneWorld pictures only; real photos "
    "need the BLIP model (`longlens models pull blip-itm-base-coco` or `longlens models import DIR`)."
)
UNTRAINED_BANNER = (
    "NOTE: this demo model has RANDOM, UNTRAINED weights. It shows the pipeline working end to "
    "end (decode, embed, catalog, index, search); its ranking is meaningless. Real photos need "
    "the BLIP model: `longlens models pull blip-itm-base-coco` or `longlens models import DIR`."
)


def _index_demo(svc, model: str, photos: Path, out: TextIO):
    """Index the demo folder under a progress bar and print the summary; returns the embedder."""
    embedder = svc.embedder(model)
    last = common.run_job(lambda tok: svc.indexer(embedder).run(photos, cancel=tok), quiet=False)
    if last is None or "summary" not in last.extra or last.extra["summary"].cancelled:
        from engine.errors import JobCancelled

        # No sample query and no app on a half-indexed demo: the next `longlens demo` resumes.
        raise JobCancelled("the demo collection was not fully indexed; run `longlens demo` again to finish")
    s = last.extra["summary"]
    print(f"indexed: {s.new} new, {s.unchanged} unchanged, {len(s.unreadable)} unreadable "
          f"({s.elapsed_s:.1f}s)", file=out)
    return embedder


def run_sceneworld_demo(paths: Paths, *, no_gui: bool, out: TextIO) -> int:
    from engine.services import Services

    photos = collection.ensure_sceneworld_photos(paths)
    query, target = collection.sceneworld_demo_query()
    print(SCENEWORLD_BANNER, file=out)
    print(f"\nSceneWorld demo collection: {photos}", file=out)
    with Services(paths) as svc:
        embedder = _index_demo(svc, SCENEWORLD_MODEL, photos, out)
        if no_gui or not collection.display_available():
            result = svc.searcher(embedder).search_text(query, top_k=5)
            print(f"\nquery ({result.tokens_used}/{result.tokens_total} tokens), the description of {target}:\n"
                  f"  {query}\n", file=out)
            for h in result.hits:
                mark = "   <- the described scene" if Path(h.path).name == target else ""
                print(f"  {h.rank:2}  {h.score:+.4f}  {h.path}{mark}", file=out)
            return 0
    print("\nopening the desktop app (use --no-gui to stay in the terminal)", file=out)
    return common.launch_gui(["--model", SCENEWORLD_MODEL, "--query", query])


def run_demo(paths: Paths, *, no_gui: bool = True, out: TextIO) -> int:
    from engine.services import Services

    paths.ensure()
    if collection.sceneworld_model_available(paths):
        return run_sceneworld_demo(paths, no_gui=no_gui, out=out)
    model = collection.ensure_demo_model(paths)
    photos = collection.ensure_demo_photos(paths)
    print(UNTRAINED_BANNER, file=out)
    print(f"\nsample collection: {photos}", file=out)
    with Services(paths) as svc:
        embedder = _index_demo(svc, model, photos, out)
        gui = not no_gui and collection.display_available()
        if not gui:
            result = svc.searcher(embedder).search_text(DEMO_QUERY, top_k=5)
            print(f"\nquery ({result.tokens_used}/{result.tokens_total} tokens): {DEMO_QUERY}\n", file=out)
            for h in result.hits:
                print(f"  {h.rank:2}  {h.score:+.4f}  {h.path}", file=out)
            print(f"\n{UNTRAINED_BANNER}", file=out)
            return 0
    # The app opens the catalog itself (and holds its single-instance lock), so ours is closed first.
    print("\nopening the desktop app (use --no-gui to stay in the terminal)", file=out)
    return common.launch_gui(["--model", model, "--query", DEMO_QUERY])


def cmd_demo(args: argparse.Namespace) -> int:
    return run_demo(common.paths(args), no_gui=args.no_gui, out=sys.stdout)


def register(sub: Any) -> None:
    sd = sub.add_parser("demo", help="index a generated sample collection and run a sample query")
    sd.add_argument("--no-gui", action="store_true")
    sd.set_defaults(func=cmd_demo)
