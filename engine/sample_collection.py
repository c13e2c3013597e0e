"""The demo collection: a working collection out of the box, offline, for `longlens demo` and
the desktop app's "Open the demo collection".

With the bundled sceneworld-mini model (resources/models/sceneworld-mini) it is a generated
SceneWorld collection of real image files, searched with the paragraph of one of its scenes.
sceneworld-mini understands SceneWorld pictures only; real photos need BLIP.

Without it (a build that does not ship the weights) it falls back to a tiny BLIP with RANDOM
weights: the pipeline runs end to end but the ranking carries no meaning.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from engine.config import Paths
from engine.models.registry import BUNDLED_MODEL

FALLBACK_DEMO_MODEL = "blip-tiny-random"  # the fallback when sceneworld-mini is not shipped
SCENEWORLD_MODEL = BUNDLED_MODEL  # the model shipped in resources/
# The demo collection uses a seed from the evaluation range: no training scene is in it.
SCENEWORLD_DEMO_SEED = 4242
SCENEWORLD_DEMO_SIZE = 300
SCENEWORLD_QUERY_INDEX = 17
DEMO_QUERY = (
    "A red ball lies on the grass to the left of a small wooden bench. Behind the bench a tall "
    "green tree casts a long shadow, and two white clouds drift across a pale blue sky. In the "
    "lower right corner a yellow kite rests against a stone wall."
)

def ensure_demo_model(paths: Paths) -> str:
    from engine.models.registry import installed_model_dir

    if installed_model_dir(FALLBACK_DEMO_MODEL, paths) is None:
        from engine.backends.blip.checkpoints import save_random_blip_checkpoint
        from engine.models.download import import_model

        with tempfile.TemporaryDirectory(dir=paths.cache) as tmp:
            ckpt = save_random_blip_checkpoint(Path(tmp) / FALLBACK_DEMO_MODEL, size="tiny", seed=0)
            import_model(ckpt, FALLBACK_DEMO_MODEL, paths)
    return FALLBACK_DEMO_MODEL


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
    if name == FALLBACK_DEMO_MODEL:
        return "random, untrained weights: the whole pipeline runs, but rankings and scores are meaningless"
    if name == SCENEWORLD_MODEL:
        return "trained on generated SceneWorld pictures only: real photos need a BLIP model"
    return None


def display_available() -> bool:
    """Whether a window can be shown: always on macOS and Windows, with X11/Wayland elsewhere."""
    if sys.platform in ("darwin", "win32"):
        return True
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))
