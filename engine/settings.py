"""Settings: defaults, validation and the settings file, one meaning for CLI and GUI.

The file is `settings.json` in the config folder (engine.config): a JSON object. A missing or
damaged file (not JSON, not an object) must not stop anything: the defaults apply. A file over
the size or nesting limit (engine.limits) is refused with a ConfigError naming it and the limit. A bad value
in a valid file (a number out of range, a device that is not text) is refused with a
ConfigError naming the file and the key, never replaced silently by a default.

`load_settings` reads the file once into a frozen `Settings` (a read-only mapping with typed
attributes); `save_settings` merges values into the file, validates before writing and writes
atomically. The CLI fills the options a command was not given (device, text tower, token
budget, batch size, decoding threads, RAW+JPEG pairs) from the same object (`fill_args`): explicit flags win.
Unknown keys (e.g. the GUI's window geometry) are kept as they are.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from engine.errors import ConfigError
from engine.fileutil import FileTooLargeError, atomic_write_text
from engine.jsonfile import JsonTooDeepError, read_json_file
from engine.limits import MAX_NESTING_DEPTH, MAX_SETTINGS_BYTES, size_words

SETTINGS_FILE = "settings.json"
DEVICES = ("auto", "cuda", "mps", "cpu")  # the choices offered; "cuda:N" is accepted too
THEMES = ("system", "light", "dark")

DEFAULTS: Mapping[str, Any] = MappingProxyType({
    "device": "auto",
    "default_model": None,
    "text_tower": None,  # folder of a paragraph-trained text tower, overriding the model's
    # The engine checks for cancel between batches, so the batch size bounds how long Cancel
    # takes; 16 keeps it under a second for typical files.
    "batch_size": 16,
    "decode_workers": 2,
    "thumbnail_cache_mb": 512,
    "theme": "system",
    "top_k": 200,
    "max_tokens": None,  # None: the model's default budget
    "raw_jpeg_pairs": "jpeg",  # a RAW beside a JPEG of the same name: index the JPEG only (engine.options)
})

_TEXT_KEYS = ("device", "default_model", "text_tower", "theme")


class Settings(Mapping[str, Any]):
    """The settings in effect: the file's values over DEFAULTS. Read-only."""

    __slots__ = ("_values", "source")

    def __init__(self, values: Mapping[str, Any] | None = None, source: Path | None = None) -> None:
        object.__setattr__(self, "_values", MappingProxyType({**DEFAULTS, **(values or {})}))
        object.__setattr__(self, "source", source)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Settings are read-only; save_settings writes new ones")

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"Settings({dict(self._values)!r})"

    @property
    def device(self) -> str:
        return self._values["device"] or "auto"

    @property
    def default_model(self) -> str | None:
        return self._values["default_model"] or None

    @property
    def text_tower(self) -> Path | None:
        t = self._values["text_tower"]
        return Path(t).expanduser() if t else None

    @property
    def batch_size(self) -> int:
        return int(self._values["batch_size"])

    @property
    def decode_workers(self) -> int:
        return int(self._values["decode_workers"])

    @property
    def max_tokens(self) -> int | None:
        m = self._values["max_tokens"]
        return None if m is None else int(m)

    @property
    def top_k(self) -> int:
        return int(self._values["top_k"])

    @property
    def thumbnail_cache_mb(self) -> int:
        return int(self._values["thumbnail_cache_mb"])

    @property
    def raw_jpeg_pairs(self) -> str:
        return str(self._values["raw_jpeg_pairs"] or "jpeg")


def settings_path(config_dir: Path | str) -> Path:
    return Path(config_dir) / SETTINGS_FILE


def validate(values: Mapping[str, Any], source: Path | str) -> dict[str, Any]:
    """`values` unchanged when every known key holds a valid value, else ConfigError naming the
    file (`source`) and the key."""
    from engine.options import validate_settings

    for key in _TEXT_KEYS:
        if values.get(key) is not None and not isinstance(values[key], str):
            raise ConfigError(f"{source}: setting {key!r}: expected text, got {values[key]!r}")
    return validate_settings(values, source)


def read_values(path: Path) -> dict[str, Any]:
    """The file's raw values; {} when it is missing, unreadable or not a JSON object. A file over
    its size or nesting limit (engine.limits) is a ConfigError naming the file and the limit: it
    cannot be a settings file Longlens wrote, and nesting past the limit would end in a
    RecursionError wherever the values are next walked."""
    try:
        values = read_json_file(path, max_bytes=MAX_SETTINGS_BYTES)
    except FileTooLargeError as exc:
        raise ConfigError(f"{path} is too large for a settings file ({size_words(exc.size)}; the limit is "
                          f"{size_words(MAX_SETTINGS_BYTES)}); fix or remove it") from None
    except JsonTooDeepError:
        raise ConfigError(f"{path} nests deeper than {MAX_NESTING_DEPTH} levels (the limit for a settings "
                          "file); fix or remove it") from None
    except OSError:
        return {}
    except ValueError:
        return {}  # damaged (not JSON / not UTF-8): it must not stop the app; defaults apply
    return values if isinstance(values, dict) else {}


def load_settings(config_dir: Path | str) -> Settings:
    """The settings in effect (one read of the file); ConfigError on a bad value."""
    path = settings_path(config_dir)
    return Settings(validate(read_values(path), path), path)


def save_settings(config_dir: Path | str, values: Mapping[str, Any]) -> Settings:
    """Merge `values` into the file, validated before anything is written, atomically."""
    path = settings_path(config_dir)
    merged = validate({**read_values(path), **values}, path)
    atomic_write_text(path, json.dumps(merged, indent=2))
    return Settings(merged, path)


# argparse destinations the CLI fills from the settings when the command was not given them.
CLI_KEYS = ("device", "text_tower", "max_tokens", "batch_size", "decode_workers", "raw_jpeg_pairs")


def fill_args(args: Any, settings: Settings) -> Any:
    """Set each of CLI_KEYS that `args` holds as None (no flag given) to the setting's value;
    explicit flags win. Returns `args`."""
    for key in CLI_KEYS:
        if getattr(args, key, None) is None:
            setattr(args, key, getattr(settings, key))
    return args
