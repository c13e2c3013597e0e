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
    backend: str  # a backend name of engine.models.registry (the manifest's, or detected)
    name: str  # model id: the installed name, or the folder's name
    installed: bool  # True when resolved through the model registry (files verified on load)


def detect_backend(folder: Path) -> str:
    """The backend of a model folder without a manifest (engine.models.registry.detect_backend)."""
    from engine.models.registry import detect_backend as detect

    return detect(folder)


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
    from engine.models.registry import load_folder_embedder

    return load_folder_embedder(base.folder, base.backend, device=device, text_tower_dir=text_tower_dir,
                                model_id=base.name)


def make_adapter(
    base: BaseModel, *, device: str = "auto", init_text_tower: Path | None = None, amp: bool = True
) -> DualEncoderAdapter:
    """A trainable adapter on the base's weights (float32), optionally starting from a text tower."""
    from engine.models.registry import get_backend

    backend = get_backend(base.backend)
    if backend.make_training_adapter is None:
        raise ModelError(f"model {base.name!r} ({base.backend} backend) cannot be fine-tuned: its backend "
                         "has no training adapter")
    return backend.make_training_adapter(base.folder, device=device, init_text_tower=init_text_tower,
                                         model_id=base.name, amp=amp)
