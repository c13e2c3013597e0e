"""The SQLite catalog (SQLAlchemy 2 Core)."""

from engine.catalog.catalog import Catalog, ImageFilter, ImageWrite, open_catalog
from engine.catalog.db import SCHEMA_VERSION

__all__ = ["SCHEMA_VERSION", "Catalog", "ImageFilter", "ImageWrite", "open_catalog"]
