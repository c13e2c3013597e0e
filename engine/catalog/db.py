"""Opening the catalog: SQLite with WAL, busy timeout, IMMEDIATE write transactions, migrations.

Write transactions start with BEGIN IMMEDIATE so a writer takes the RESERVED lock up
front and waits on the busy timeout; a DEFERRED transaction that upgrades from read to
write can fail with SQLITE_BUSY immediately, whatever the timeout, which users would see.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.pool import QueuePool

from engine.catalog import schema
from engine.errors import CatalogError, CatalogTooNewError

SCHEMA_VERSION = 1
BUSY_TIMEOUT_S = 30.0


def _v1(conn: Connection) -> None:
    # Version 1 tables. When a later version alters these, freeze this step's DDL as literal
    # SQL so that old catalogs keep migrating through the same linear path.
    schema.metadata.create_all(
        conn, tables=[schema.meta, schema.libraries, schema.images, schema.embeddings]
    )


# Linear migration steps: MIGRATIONS[v] takes a catalog from version v-1 to v.
MIGRATIONS: dict[int, Callable[[Connection], None]] = {1: _v1}


def create_catalog_engine(path: Path) -> Engine:
    path.parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(
        f"sqlite:///{path}",
        connect_args={"timeout": BUSY_TIMEOUT_S, "check_same_thread": False},
        poolclass=QueuePool,
        pool_size=4,
        max_overflow=8,
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: sqlite3.Connection, _record: object) -> None:
        # Take transaction control away from the sqlite3 module so our BEGIN is the one used.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        mode = conn.get_execution_options().get("sqlite_begin", "DEFERRED")
        conn.exec_driver_sql(f"BEGIN {mode}")

    return engine


def user_version(conn: Connection) -> int:
    return int(conn.exec_driver_sql("PRAGMA user_version").scalar() or 0)


def backup_catalog(engine: Engine, path: Path, version: int) -> Path:
    """Consistent online copy (sqlite3 backup API), taken before any migration step."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    dest = path.with_name(f"{path.name}.v{version}-{stamp}.bak")
    raw = engine.raw_connection()
    try:
        target = sqlite3.connect(dest)
        try:
            raw.driver_connection.backup(target)
        finally:
            target.close()
    finally:
        raw.close()
    return dest


def migrate(engine: Engine, path: Path) -> Path | None:
    """Bring the catalog to SCHEMA_VERSION. Returns the backup path when one was taken."""
    writer = engine.execution_options(sqlite_begin="IMMEDIATE")
    with writer.connect() as conn:
        current = user_version(conn)
    if current > SCHEMA_VERSION:
        raise CatalogTooNewError(
            f"{path} was written by a newer Longlens (catalog schema {current}, this version "
            f"understands up to {SCHEMA_VERSION}). Upgrade Longlens; the catalog was not modified."
        )
    if current == SCHEMA_VERSION:
        return None
    backup = backup_catalog(engine, path, current) if current > 0 else None
    for target in range(current + 1, SCHEMA_VERSION + 1):
        step = MIGRATIONS[target]
        with writer.connect() as conn, conn.begin():
            # Re-check inside the write lock: another process may have migrated meanwhile.
            if user_version(conn) >= target:
                continue
            step(conn)
            conn.exec_driver_sql(f"PRAGMA user_version={target}")
    return backup


@contextmanager
def sqlite_errors(path: Path) -> Iterator[None]:
    """Turn low-level SQLite failures into messages naming the catalog file."""
    from sqlalchemy.exc import DatabaseError, OperationalError

    try:
        yield
    except OperationalError as exc:
        msg = str(exc.orig) if exc.orig else str(exc)
        if "disk" in msg and "full" in msg:
            raise CatalogError(f"disk full while writing the catalog {path}; nothing was committed") from exc
        raise CatalogError(f"catalog {path}: {msg}") from exc
    except DatabaseError as exc:
        msg = str(exc.orig) if exc.orig else str(exc)
        raise CatalogError(f"catalog {path} is unreadable ({msg})") from exc
