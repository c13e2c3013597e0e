"""All on-disk locations, from one function.

platformdirs gives the per-OS defaults; LONGLENS_HOME puts everything under one folder
(tests, portable installs, the demo). Never evaluated at import time.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from engine.errors import ConfigError

APP_NAME = "Longlens"
APP_AUTHOR = "Longlens"


def ensure_folder(folder: Path) -> None:
    """mkdir -p, with a message naming the path when a file (not a folder) is in the way."""
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise ConfigError(f"{folder} (or a folder above it) is a file, not a folder; move it away "
                          "and try again") from None
    except PermissionError:
        raise ConfigError(f"cannot create the folder {folder}: permission denied") from None


@dataclass(frozen=True)
class Paths:
    data: Path
    cache: Path
    config: Path
    models: Path

    @property
    def catalog(self) -> Path:
        return self.data / "catalog.sqlite3"

    @property
    def indexes(self) -> Path:
        return self.data / "indexes"

    @property
    def thumbnails(self) -> Path:
        return self.cache / "thumbnails"

    def ensure(self) -> Paths:
        for p in (self.data, self.cache, self.config, self.models, self.indexes):
            ensure_folder(p)
        return self

    def as_dict(self) -> dict[str, str]:
        return {
            "data": str(self.data),
            "cache": str(self.cache),
            "config": str(self.config),
            "models": str(self.models),
            "catalog": str(self.catalog),
            "indexes": str(self.indexes),
        }


def get_paths(home: str | os.PathLike[str] | None = None) -> Paths:
    """Resolve paths: explicit `home`, else $LONGLENS_HOME, else the platform's folders."""
    home = home if home is not None else os.environ.get("LONGLENS_HOME")
    if home:
        root = Path(home).expanduser().resolve()
        return Paths(root / "data", root / "cache", root / "config", root / "models")
    import platformdirs

    dirs = platformdirs.PlatformDirs(APP_NAME, APP_AUTHOR)
    data = Path(dirs.user_data_dir)
    return Paths(data, Path(dirs.user_cache_dir), Path(dirs.user_config_dir), data / "models")
