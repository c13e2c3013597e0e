"""The SQLite catalog (SQLAlchemy 2 Core)."""

from engine.catalog.catalog import (
    LIBRARY_PARTIAL,
    Catalog,
    ImageFilter,
    ImageWrite,
    LibraryState,
    open_catalog,
    root_reachable,
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
    "LibraryState",
    "open_catalog",
    "root_reachable",
]
