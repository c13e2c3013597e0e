"""`longlens demo`: a working collection out of the box, offline.

With the bundled sceneworld-mini model (resources/models/sceneworld-mini) the demo generates
a SceneWorld collection of real image files and searches it with the paragraph of one of its
scenes. sceneworld-mini understands SceneWorld pictures only; real photos need BLIP.

Without it (a build that does not ship the weights) the demo falls back to a tiny BLIP with
RANDOM weights: the pipeline runs end to end but the ranking carries no meaning, and the
output says so in plain words.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import TextIO

from engine.config import Paths

DEMO_MODEL = "blip-tiny-random"  # the fallback when sceneworld-mini is not shipped
SCENEWORLD_MODEL = "sceneworld-mini"
# The demo collection uses a seed from the evaluation range: no training scene is in it.
SCENEWORLD_DEMO_SEED = 4242
SCENEWORLD_DEMO_SIZE = 300
SCENEWORLD_QUERY_INDEX = 17
SCENEWORLD_BANNER = (
    "sceneworld-mini is a small model trained by the Longlens project on SceneWorld, a generated "
    "world of pictures with exact descriptions. It understands SceneWorld pictures only; real photos "
    "need the BLIP model (`longlens models pull blip-itm-base-coco` or `longlens models import DIR`)."
)
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
        from engine.models.blip.checkpoints import save_random_blip_checkpoint
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


def sceneworld_model_available(paths: Paths) -> bool:
    from engine.models.registry import installed_model_dir

    return installed_model_dir(SCENEWORLD_MODEL, paths) is not None


def ensure_sceneworld_photos(paths: Paths, n: int = SCENEWORLD_DEMO_SIZE) -> Path:
    """~300 SceneWorld scenes as real JPEG files (with their ground truth in sceneworld.jsonl)."""
    from engine.sceneworld.export import write_collection

    folder = paths.data / "sceneworld-demo"
    if not (folder / "sceneworld.jsonl").is_file():
        write_collection(folder, SCENEWORLD_DEMO_SEED, n, size=256, fmt="jpeg")
    return folder


def sceneworld_demo_query() -> tuple[str, str]:
    """(paragraph, file name of the scene it describes) for the sample query."""
    from engine.sceneworld import generate_scene
    from engine.sceneworld.export import image_name

    scene = generate_scene(SCENEWORLD_DEMO_SEED, SCENEWORLD_QUERY_INDEX)
    return scene.paragraph.text, image_name(SCENEWORLD_DEMO_SEED, SCENEWORLD_QUERY_INDEX, "jpeg")


def _index_demo(svc, model: str, photos: Path, out: TextIO):
    """Index the demo folder under a progress bar and print the summary; returns the embedder."""
    from engine.cli import drive

    embedder = svc.embedder(model)
    last = drive(svc.indexer(embedder).run(photos), quiet=False)
    s = last.extra["summary"]
    print(f"indexed: {s.new} new, {s.unchanged} unchanged, {len(s.unreadable)} unreadable "
          f"({s.elapsed_s:.1f}s)", file=out)
    return embedder


def run_sceneworld_demo(paths: Paths, *, no_gui: bool, out: TextIO) -> int:
    from engine.services import Services

    photos = ensure_sceneworld_photos(paths)
    query, target = sceneworld_demo_query()
    print(SCENEWORLD_BANNER, file=out)
    print(f"\nSceneWorld demo collection: {photos}", file=out)
    with Services(paths) as svc:
        embedder = _index_demo(svc, SCENEWORLD_MODEL, photos, out)
        if no_gui or not display_available():
            result = svc.searcher(embedder).search_text(query, top_k=5)
            print(f"\nquery ({result.tokens_used}/{result.tokens_total} tokens), the description of {target}:\n"
                  f"  {query}\n", file=out)
            for h in result.hits:
                mark = "   <- the described scene" if Path(h.path).name == target else ""
                print(f"  {h.rank:2}  {h.score:+.4f}  {h.path}{mark}", file=out)
            return 0
    print("\nopening the desktop app (use --no-gui to stay in the terminal)", file=out)
    from engine.cli import launch_gui

    return launch_gui(["--model", SCENEWORLD_MODEL, "--query", query])


def demo_setup(paths: Paths) -> tuple[str, Path, str]:
    """(model, photo folder, sample query) of the demo, installing what is missing.

    The GUI's "Open the demo collection" and `longlens demo` share this choice.
    """
    paths.ensure()
    if sceneworld_model_available(paths):
        return SCENEWORLD_MODEL, ensure_sceneworld_photos(paths), sceneworld_demo_query()[0]
    return ensure_demo_model(paths), ensure_demo_photos(paths), DEMO_QUERY


def model_notice(name: str | None) -> str | None:
    """What a user must know about a demo model before trusting its results."""
    if name == DEMO_MODEL:
        return "random, untrained weights: the whole pipeline runs, but rankings and scores are meaningless"
    if name == SCENEWORLD_MODEL:
        return "trained on generated SceneWorld pictures only: real photos need a BLIP model"
    return None


def display_available() -> bool:
    """Whether a window can be shown: always on macOS and Windows, with X11/Wayland elsewhere."""
    if sys.platform in ("darwin", "win32"):
        return True
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def run_demo(paths: Paths, *, no_gui: bool = True, out: TextIO) -> int:
    from engine.services import Services

    paths.ensure()
    if sceneworld_model_available(paths):
        return run_sceneworld_demo(paths, no_gui=no_gui, out=out)
    model = ensure_demo_model(paths)
    photos = ensure_demo_photos(paths)
    print(UNTRAINED_BANNER, file=out)
    print(f"\nsample collection: {photos}", file=out)
    with Services(paths) as svc:
        embedder = _index_demo(svc, model, photos, out)
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
