"""`longlens demo`: a working collection out of the box, offline.

Until the self-trained SceneWorld model ships, the demo uses a tiny BLIP with RANDOM
weights: it exercises the real pipeline (files -> catalog -> index -> search) but its
rankings carry no meaning, and the output says so in plain words.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import TextIO

from engine.config import Paths

DEMO_MODEL = "blip-tiny-random"
DEMO_QUERY = (
    "A red ball lies on the grass to the left of a small wooden bench. Behind the bench a tall "
    "green tree casts a long shadow, and two white clouds drift across a pale blue sky. In the "
    "lower right corner a yellow kite rests against a stone wall."
)
UNTRAINED_BANNER = (
    "NOTE: this demo model has RANDOM, UNTRAINED weights. It shows the pipeline working end to "
    "end (decode, embed, catalog, index, search); its ranking is meaningless. Real photos need "
    "the BLIP model: `longlens models pull blip-itm-base-coco` or `longlens models import DIR`."
)


def ensure_demo_model(paths: Paths) -> str:
    from engine.models.registry import installed_model_dir

    if installed_model_dir(DEMO_MODEL, paths) is None:
        from engine.models.blip_checkpoints import save_random_blip_checkpoint
        from engine.models.download import import_model

        with tempfile.TemporaryDirectory(dir=paths.cache) as tmp:
            ckpt = save_random_blip_checkpoint(Path(tmp) / DEMO_MODEL, size="tiny", seed=0)
            import_model(ckpt, DEMO_MODEL, paths)
    return DEMO_MODEL


def ensure_demo_photos(paths: Paths, n: int = 48) -> Path:
    from engine.samples import make_sample_folder

    folder = paths.data / "demo-photos"
    if not folder.is_dir() or not any(folder.rglob("*.*")):
        make_sample_folder(folder, n=n, seed=0)
    return folder


def display_available() -> bool:
    """Whether a window can be shown: always on macOS and Windows, with X11/Wayland elsewhere."""
    if sys.platform in ("darwin", "win32"):
        return True
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def run_demo(paths: Paths, *, no_gui: bool = True, out: TextIO) -> int:
    from engine.cli import drive
    from engine.services import Services

    paths.ensure()
    model = ensure_demo_model(paths)
    photos = ensure_demo_photos(paths)
    print(UNTRAINED_BANNER, file=out)
    print(f"\nsample collection: {photos}", file=out)
    with Services(paths) as svc:
        embedder = svc.embedder(model)
        last = drive(svc.indexer(embedder).run(photos), quiet=False)
        s = last.extra["summary"]
        print(f"indexed: {s.new} new, {s.unchanged} unchanged, {len(s.unreadable)} unreadable "
              f"({s.elapsed_s:.1f}s)", file=out)
        gui = not no_gui and display_available()
        if not gui:
            result = svc.searcher(embedder).search_text(DEMO_QUERY, top_k=5)
            print(f"\nquery ({result.tokens_used}/{result.tokens_total} tokens): {DEMO_QUERY}\n", file=out)
            for h in result.hits:
                print(f"  {h.rank:2}  {h.score:+.4f}  {h.path}", file=out)
            print(f"\n{UNTRAINED_BANNER}", file=out)
            return 0
    # The app opens the catalog itself (and holds its single-instance lock), so ours is closed first.
    print("\nopening the desktop app (use --no-gui to stay in the terminal)", file=out)
    from engine.cli import launch_gui

    return launch_gui(["--model", model, "--query", DEMO_QUERY])
