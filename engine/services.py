"""Builds the engine's long-lived objects once (catalog, index store, embedders) for the CLI and GUI."""

from __future__ import annotations

from pathlib import Path

from engine.catalog import Catalog
from engine.config import Paths
from engine.errors import ModelError
from engine.index.store import IndexStore
from engine.models.base import Embedder
from engine.settings import Settings


class Services:
    def __init__(self, paths: Paths) -> None:
        self.paths = paths.ensure()
        from engine.models.install_state import recover_models_folder

        # A model install killed last time may have left a staging folder or a model moved aside,
        # and a catalog rebuild a swap half done: each is settled first. What was done, one
        # sentence each, for the front end to show.
        self.recovered: list[str] = recover_models_folder(self.paths)
        self.catalog = Catalog(paths.catalog)
        self.recovered += self.catalog.recovered
        self.store = IndexStore(paths.indexes, self.catalog)
        self._embedders: dict[tuple[str, str, str | None], Embedder] = {}

    def close(self) -> None:
        self.catalog.close()

    def __enter__(self) -> Services:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- settings -----------------------------------------------------------
    def settings(self) -> Settings:
        """The settings in effect (engine.settings: the file over the defaults), read now. A
        bad value is a ConfigError naming the file and the key, never replaced by a default."""
        from engine.settings import load_settings

        return load_settings(self.paths.config)

    def save_settings(self, values: dict) -> Settings:
        from engine.settings import save_settings

        return save_settings(self.paths.config, values)

    # -- models -------------------------------------------------------------
    def default_model_name(self, explicit: str | None = None, settings: Settings | None = None) -> str:
        """--model, else the settings' default (`settings`: already read ones), else the only
        model the catalog or disk knows."""
        if explicit:
            return explicit
        configured = (settings if settings is not None else self.settings()).default_model
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

    def own_folders(self) -> tuple[Path, ...]:
        """Longlens's own folders: never a library, and never scanned when a library contains them. The
        data folder is not one: it holds the sample collections (demo-photos, ...), libraries of their own."""
        return (self.paths.cache, self.paths.config, self.paths.models, self.paths.indexes,
                self.paths.data / "xmp-backups")  # engine.xmp_export.BACKUP_FOLDER

    def library_root_problem(self, root: Path | str) -> str | None:
        """Why indexing `root` would be refused (engine.indexing.pipeline.library_root_problem), or None."""
        from engine.indexing.pipeline import library_root_problem

        return library_root_problem(self.catalog, root, self.own_folders(), self.paths.data)

    def indexer(self, embedder: Embedder, **kwargs):
        from engine.indexing.pipeline import Indexer

        kwargs.setdefault("own_folders", self.own_folders())
        # Never scanned as part of a library that contains it (catalog, backups, sample collections).
        kwargs.setdefault("data_folder", self.paths.data)
        return Indexer(self.catalog, self.store, embedder, **kwargs)

    def searcher(self, embedder: Embedder):
        from engine.search.searcher import Searcher

        return Searcher(self.catalog, self.store, embedder)
