"""Builds the engine's long-lived objects once (catalog, index store, embedders) for the CLI and GUI."""

from __future__ import annotations

import json
from pathlib import Path

from engine.catalog import Catalog
from engine.config import Paths
from engine.errors import ModelError
from engine.index.store import IndexStore
from engine.models.base import Embedder

SETTINGS_FILE = "settings.json"


class Services:
    def __init__(self, paths: Paths) -> None:
        self.paths = paths.ensure()
        from engine.models.install_state import recover_models_folder

        # A model install killed last time may have left a staging folder or a model moved aside.
        recover_models_folder(self.paths)
        self.catalog = Catalog(paths.catalog)
        self.store = IndexStore(paths.indexes, self.catalog)
        self._embedders: dict[tuple[str, str, str | None], Embedder] = {}

    def close(self) -> None:
        self.catalog.close()

    def __enter__(self) -> Services:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- settings -----------------------------------------------------------
    def _settings_file_values(self) -> dict:
        try:
            values = json.loads((self.paths.config / SETTINGS_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}  # missing or damaged (not JSON): it must not stop the app; defaults apply
        return values if isinstance(values, dict) else {}

    def settings(self) -> dict:
        """The settings file's values. A number out of range is a ConfigError naming the file and
        the key (engine/options.py), never replaced silently by a default."""
        from engine.options import validate_settings

        return validate_settings(self._settings_file_values(), self.paths.config / SETTINGS_FILE)

    def save_settings(self, values: dict) -> None:
        from engine.fileutil import atomic_write_text
        from engine.options import validate_settings

        p = self.paths.config / SETTINGS_FILE
        merged = validate_settings({**self._settings_file_values(), **values}, p)  # before writing
        atomic_write_text(p, json.dumps(merged, indent=2))

    # -- models -------------------------------------------------------------
    def default_model_name(self, explicit: str | None = None) -> str:
        """--model, else the settings' default, else the only model the catalog or disk knows."""
        if explicit:
            return explicit
        configured = self.settings().get("default_model")
        if configured:
            return configured
        from engine.models.registry import identity_name

        # Vectors are stored under model identities ("NAME@hash"); the user picks by name.
        used = {identity_name(key) for key in self.catalog.model_ids()}
        if len(used) == 1:
            return next(iter(used))
        if len(used) > 1:
            raise ModelError(
                f"the catalog holds vectors of several models ({', '.join(sorted(used))}); choose the model to use",
                settings=("model",),
            )
        from engine.models.registry import list_models

        models = [m for m in list_models(self.paths) if m.installed]
        # A model the user installed wins over the bundled demo model, which is always present.
        own = [m.name for m in models if not m.bundled]
        if len(own) == 1:
            return own[0]
        installed = [m.name for m in models]
        if len(installed) == 1:
            return installed[0]
        if not installed:
            raise ModelError(
                "no model is installed: run `longlens demo`, or `longlens models import DIR --name NAME`"
            )
        raise ModelError(f"several models are installed ({', '.join(installed)}); choose the model to use",
                         settings=("model",))

    def embedder(self, name: str | None = None, device: str = "auto", text_tower: Path | None = None) -> Embedder:
        name = self.default_model_name(name)
        key = (name, device, str(text_tower) if text_tower else None)
        if key not in self._embedders:
            from engine.models.registry import load_embedder

            self._embedders[key] = load_embedder(name, self.paths, device=device, text_tower_dir=text_tower)
        return self._embedders[key]

    def indexer(self, embedder: Embedder, **kwargs):
        from engine.indexing.pipeline import Indexer

        return Indexer(self.catalog, self.store, embedder, **kwargs)

    def searcher(self, embedder: Embedder):
        from engine.search.searcher import Searcher

        return Searcher(self.catalog, self.store, embedder)
