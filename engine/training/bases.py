"""Which model a `--base`/`--model` argument means, and the objects built from it.

A reference is either an installed model name (`longlens models list`) or a model folder:
a Hugging Face BLIP folder (config.json + model.safetensors) or a sceneworld-mini folder
(sceneworld_mini.json + model.safetensors). Folders make the study scripts and tests
independent of what is installed. torch/transformers load only inside the builders.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from engine.errors import ModelError, ModelNotInstalledError

if TYPE_CHECKING:
    from engine.config import Paths
    from engine.models.base import Embedder
    from engine.training.trainer import DualEncoderAdapter


@dataclass(frozen=True)
class BaseModel:
    ref: str  # as the user wrote it
    folder: Path
    backend: str  # "blip" | "sceneworld-mini"
    name: str  # model id: the installed name, or the folder's name
    installed: bool  # True when resolved through the model registry (files verified on load)


def detect_backend(folder: Path) -> str:
    if (folder / "sceneworld_mini.json").is_file():
        return "sceneworld-mini"
    if (folder / "config.json").is_file():
        return "blip"
    raise ModelError(f"{folder} is neither a BLIP folder (config.json) nor a sceneworld-mini folder "
                     "(sceneworld_mini.json)")


def installed_dir(name: str, paths: Paths) -> Path | None:
    from engine.models import registry

    try:
        return registry.installed_model_dir(name, paths)
    except ModelError:  # not a valid model name, so not an installed model
        return None


def resolve_base(ref: str | Path, paths: Paths | None = None) -> BaseModel:
    """An installed model name (names win, so a folder of that name in the working directory
    cannot shadow it), else a path to a model folder."""
    from engine.config import get_paths
    from engine.models import registry

    text = str(ref)
    paths = paths or get_paths()
    model_dir = installed_dir(text, paths)
    if model_dir is not None:
        return BaseModel(text, model_dir, registry.read_manifest(model_dir)["backend"], text, True)
    folder = Path(text).expanduser()
    if folder.is_dir():
        folder = folder.resolve()
        return BaseModel(text, folder, detect_backend(folder), folder.name, False)
    try:
        registry.check_model_name(text)
    except ModelError:
        raise ModelNotInstalledError(f"{text!r} is neither a model folder nor an installed model name") from None
    raise ModelNotInstalledError(f"model {text!r} is not installed. {registry.how_to_get(text)}")


def load_embedder_for(
    base: BaseModel,
    paths: Paths | None = None,
    *,
    device: str = "auto",
    text_tower_dir: Path | None = None,
) -> Embedder:
    """The Embedder of a base (installed models go through the registry, which verifies files)."""
    if base.installed:
        from engine.config import get_paths
        from engine.models.registry import load_embedder

        return load_embedder(base.name, paths or get_paths(), device=device, text_tower_dir=text_tower_dir)
    if base.backend == "blip":
        from engine.models.blip.embedder import BlipEmbedder

        return BlipEmbedder(base.folder, device=device, text_tower_dir=text_tower_dir, model_id=base.name)
    from engine.models.sceneworld_mini.embedder import SceneWorldMiniEmbedder

    return SceneWorldMiniEmbedder(base.folder, device=device, text_tower_dir=text_tower_dir, model_id=base.name)


def make_adapter(
    base: BaseModel, *, device: str = "auto", init_text_tower: Path | None = None, amp: bool = True
) -> DualEncoderAdapter:
    """A trainable adapter on the base's weights (float32), optionally starting from a text tower."""
    from engine.models.blip.embedder import resolve_device

    if base.backend == "blip":
        from engine.models.blip.training import BlipAdapter

        return BlipAdapter.from_checkpoint(base.folder, device=device, text_tower_dir=init_text_tower,
                                           model_id=base.name, amp=amp)
    from engine.models.sceneworld_mini.network import load_model, load_text_tower
    from engine.training.sceneworld_mini import MiniAdapter

    dev = resolve_device(device)
    model = load_model(base.folder, dev)
    if init_text_tower is not None:
        load_text_tower(model, Path(init_text_tower))
    return MiniAdapter(model, dev)
