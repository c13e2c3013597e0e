"""Real catalogs of an older schema, made by the frozen migration steps that version was created
with (engine.catalog.db.MIGRATIONS), so a test of a later step starts from exactly what an older
Longlens left on disk."""

from __future__ import annotations

from pathlib import Path

from engine.catalog import db


def make_catalog_at(path: Path, version: int) -> None:
    """Create the SQLite catalog at `path` with schema `version` (steps 1..version), no data."""
    engine = db.create_catalog_engine(Path(path))
    try:
        writer = engine.execution_options(sqlite_begin="IMMEDIATE")
        for step in range(1, version + 1):
            with writer.connect() as conn, conn.begin():
                db.MIGRATIONS[step](conn)
                conn.exec_driver_sql(f"PRAGMA user_version={step}")
    finally:
        engine.dispose()
