"""Exception types whose messages a user can act on.

Storage and model code raise these; only the CLI and GUI decide how to show them.
"""

from __future__ import annotations


class LonglensError(Exception):
    """Base class: the message is meant for a person, not a traceback reader.

    Messages never name a command-line flag (the GUI shows them too): they speak of the setting.
    `settings` names the settings or parameters the message asks to change (e.g. ("resume",)),
    so a front end can point at its own control for each (the CLI adds the flags).
    """

    settings: tuple[str, ...] = ()

    def __init__(self, *args: object, settings: tuple[str, ...] = ()) -> None:
        super().__init__(*args)
        if settings:
            self.settings = tuple(settings)


class ConfigError(LonglensError):
    pass


class CatalogError(LonglensError):
    pass


class CatalogTooNewError(CatalogError):
    """The catalog was written by a newer Longlens; we refuse to touch it."""


class LibraryError(LonglensError):
    pass


class LibraryOfflineError(LibraryError):
    """A library root is missing or unmounted; nothing is marked deleted."""


class InstanceLockedError(LonglensError):
    """Another Longlens process holds the catalog's writer lock."""


class ModelError(LonglensError):
    pass


class ModelNotInstalledError(ModelError):
    pass


class ModelIntegrityError(ModelError):
    """A model file is missing, tampered with, or in a refused format (pickle)."""


class OfflineError(ModelError):
    """A download was needed but the hub cannot be reached."""


class IndexFileError(LonglensError):
    """An ANN index file failed its header or checksum check."""


class QueryError(LonglensError):
    """A search query cannot be run (empty, unreadable image, bad filter)."""


class DecodeError(LonglensError):
    """An image could not be decoded; `reason` is a short machine-friendly tag."""

    def __init__(self, reason: str, detail: str = "") -> None:
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}" if detail else reason)


class JobCancelled(LonglensError):
    pass
