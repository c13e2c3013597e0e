"""The SQLite catalog (SQLAlchemy 2 Core)."""

from engine.catalog.catalog import (
    LIBRARY_PARTIAL,
    Catalog,
    ImageFilter,
    ImageWrite,
    LibraryAdded,
    LibraryOverlapError,
    LibraryState,
    MergedLibrary,
    folder_within,
    open_catalog,
    root_reachable,
    same_folder,
)
from engine.catalog.db import SCHEMA_VERSION, CatalogConflictError, CatalogDamagedError

__all__ = [
    "LIBRARY_PARTIAL",
    "SCHEMA_VERSION",
    "Catalog",
    "CatalogConflictError",
    "CatalogDamagedError",
    "ImageFilter",
    "ImageWrite",
    "LibraryAdded",
    "LibraryOverlapError",
    "LibraryState",
    "MergedLibrary",
    "folder_within",
    "open_catalog",
    "root_reachable",
    "same_folder",
]
