"""Opening the catalog: SQLite with WAL, busy timeout, IMMEDIATE write transactions, migrations.

Write transactions start with BEGIN IMMEDIATE so a writer takes the RESERVED lock up
front and waits on the busy timeout; a DEFERRED transaction that upgrades from read to
write can fail with SQLITE_BUSY immediately, whatever the timeout, which users would see.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import URL
from sqlalchemy.pool import QueuePool

from engine.config import ensure_folder
from engine.errors import CatalogError, CatalogTooNewError
from engine.fileutil import NotARegularFileError, open_user_file
from engine.swap_journal import (
    LOCK_SUFFIX,
    Journal,
    JournalError,
    exclusive_lock,
    fsync_folder,
    journal_path,
    read_journal,
    remove_journal,
)


class CatalogDamagedError(CatalogError):
    """The catalog file fails SQLite's integrity checks; Longlens refuses to write into it."""


class CatalogConflictError(CatalogError):
    """A write lost a race with another process's change; rolled back whole, the catalog is intact."""


SCHEMA_VERSION = 6
BUSY_TIMEOUT_S = 30.0
# The quick check at open must stay cheap on a large catalog: it stops after this long and the
# catalog is then used unchecked (the full check is `longlens check-catalog`).
QUICK_CHECK_BUDGET_S = 1.0
QUICK_CHECK_MAX_ERRORS = 5
SQLITE_MAGIC = b"SQLite format 3\x00"

# Each step's DDL is frozen as literal SQL: schema.py describes the *current* tables for
# queries and may change, but an old catalog must keep migrating through exactly the
# statements its version was created with.
_V1_DDL = (
    """CREATE TABLE meta (
	"key" VARCHAR NOT NULL,
	value TEXT NOT NULL,
	PRIMARY KEY ("key")
)""",
    """CREATE TABLE libraries (
	id INTEGER NOT NULL,
	root TEXT NOT NULL,
	status VARCHAR NOT NULL,
	added_at FLOAT NOT NULL,
	last_scan_at FLOAT,
	PRIMARY KEY (id),
	UNIQUE (root)
)""",
    """CREATE TABLE images (
	id INTEGER NOT NULL,
	library_id INTEGER NOT NULL,
	rel_path TEXT NOT NULL,
	size BIGINT NOT NULL,
	mtime_ns BIGINT NOT NULL,
	content_hash VARCHAR,
	width INTEGER,
	height INTEGER,
	exif_date VARCHAR,
	camera_make VARCHAR,
	camera_model VARCHAR,
	orientation INTEGER,
	status VARCHAR NOT NULL,
	reason TEXT,
	added_at FLOAT NOT NULL,
	updated_at FLOAT NOT NULL,
	PRIMARY KEY (id),
	CONSTRAINT uq_images_library_path UNIQUE (library_id, rel_path),
	FOREIGN KEY(library_id) REFERENCES libraries (id) ON DELETE CASCADE
)""",
    "CREATE INDEX ix_images_hash ON images (library_id, content_hash)",
    "CREATE INDEX ix_images_status ON images (library_id, status)",
    """CREATE TABLE embeddings (
	image_id INTEGER NOT NULL,
	model_id VARCHAR NOT NULL,
	dims INTEGER NOT NULL,
	vector BLOB NOT NULL,
	created_at FLOAT NOT NULL,
	CONSTRAINT pk_embeddings PRIMARY KEY (image_id, model_id),
	FOREIGN KEY(image_id) REFERENCES images (id) ON DELETE CASCADE
)""",
    "CREATE INDEX ix_embeddings_model ON embeddings (model_id)",
)

# Version 2: review sessions for annotators (caption files, items, per-item/per-sentence verdicts).
_V2_DDL = (
    """CREATE TABLE review_sessions (
	id INTEGER NOT NULL,
	caption_file TEXT NOT NULL,
	file_hash VARCHAR NOT NULL,
	position INTEGER NOT NULL,
	created_at FLOAT NOT NULL,
	updated_at FLOAT NOT NULL,
	PRIMARY KEY (id),
	CONSTRAINT uq_review_sessions_file UNIQUE (caption_file, file_hash)
)""",
    """CREATE TABLE review_items (
	id INTEGER NOT NULL,
	session_id INTEGER NOT NULL,
	line_no INTEGER NOT NULL,
	image_path TEXT NOT NULL,
	caption TEXT NOT NULL,
	PRIMARY KEY (id),
	CONSTRAINT uq_review_items_line UNIQUE (session_id, line_no),
	FOREIGN KEY(session_id) REFERENCES review_sessions (id) ON DELETE CASCADE
)""",
    """CREATE TABLE verdicts (
	id INTEGER NOT NULL,
	item_id INTEGER NOT NULL,
	sentence_index INTEGER,
	verdict VARCHAR,
	note TEXT NOT NULL,
	updated_at FLOAT NOT NULL,
	PRIMARY KEY (id),
	CONSTRAINT ck_verdicts_value CHECK (verdict IS NULL OR verdict IN ('faithful', 'unfaithful', 'unsure')),
	FOREIGN KEY(item_id) REFERENCES review_items (id) ON DELETE CASCADE
)""",
    # One verdict per (item, sentence); the whole-item verdict has sentence_index NULL, which a
    # plain UNIQUE would treat as distinct from every other NULL, hence the expression.
    "CREATE UNIQUE INDEX ux_verdicts_target ON verdicts (item_id, coalesce(sentence_index, -1))",
)


# Version 3: verdicts keyed by (image content, caption text, sentence index) instead of by a
# session's item, so an edited caption file keeps the verdicts of its unchanged items. SQLite
# cannot add NOT NULL columns or change a table's keys in place: new tables are filled from the
# old ones (_v3 computes the keys) and renamed over them.
_V3_CREATE = (
    """CREATE TABLE review_items_v3 (
	id INTEGER NOT NULL,
	session_id INTEGER NOT NULL,
	line_no INTEGER NOT NULL,
	image_path TEXT NOT NULL,
	caption TEXT NOT NULL,
	image_key TEXT NOT NULL,
	caption_hash VARCHAR NOT NULL,
	change VARCHAR,
	image_size BIGINT,
	image_mtime_ns BIGINT,
	PRIMARY KEY (id),
	CONSTRAINT uq_review_items_line UNIQUE (session_id, line_no),
	FOREIGN KEY(session_id) REFERENCES review_sessions (id) ON DELETE CASCADE
)""",
    """CREATE TABLE verdicts_v3 (
	id INTEGER NOT NULL,
	image_key TEXT NOT NULL,
	caption_hash VARCHAR NOT NULL,
	sentence_index INTEGER,
	verdict VARCHAR,
	note TEXT NOT NULL,
	updated_at FLOAT NOT NULL,
	PRIMARY KEY (id),
	CONSTRAINT ck_verdicts_value CHECK (verdict IS NULL OR verdict IN ('faithful', 'unfaithful', 'unsure'))
)""",
)
_V3_FILL_ITEMS = (
    "INSERT INTO review_items_v3 (id, session_id, line_no, image_path, caption, image_key, caption_hash, "
    "change, image_size, image_mtime_ns) VALUES (?, ?, ?, ?, ?, ?, ?, NULL, ?, ?)"
)
# Two items of old sessions with the same (image, caption) may both hold a verdict on the same
# target (an edited file used to start from nothing): the most recent one wins.
_V3_FILL_VERDICTS = (
    """INSERT INTO verdicts_v3 (image_key, caption_hash, sentence_index, verdict, note, updated_at)
SELECT i.image_key, i.caption_hash, v.sentence_index, v.verdict, v.note, v.updated_at
FROM verdicts AS v JOIN review_items_v3 AS i ON i.id = v.item_id
WHERE true
ORDER BY v.updated_at, v.id
ON CONFLICT (image_key, caption_hash, coalesce(sentence_index, -1)) DO UPDATE SET verdict = excluded.verdict, note = excluded.note, updated_at = excluded.updated_at
WHERE excluded.updated_at >= verdicts_v3.updated_at"""
)
_V3_SWAP = (
    "DROP TABLE verdicts",
    "DROP TABLE review_items",
    "ALTER TABLE review_items_v3 RENAME TO review_items",
    "ALTER TABLE verdicts_v3 RENAME TO verdicts",
    "CREATE INDEX ix_review_items_image ON review_items (image_path)",
    "CREATE UNIQUE INDEX ux_verdicts_target ON verdicts (image_key, caption_hash, coalesce(sentence_index, -1))",
)


# Version 5: the XMP metadata of each picture (engine.metadata) and its keywords, for filters and
# the inspector. New tables only: a schema-4 catalog keeps every row, and its pictures' metadata is
# read at the next scan (without re-embedding them).
_V5_DDL = (
    """CREATE TABLE image_metadata (
	image_id INTEGER NOT NULL,
	state TEXT NOT NULL,
	title TEXT,
	description TEXT,
	rating INTEGER,
	label TEXT,
	label_key TEXT,
	taken_at VARCHAR,
	gps_lat FLOAT,
	gps_lon FLOAT,
	sources TEXT NOT NULL,
	problems TEXT NOT NULL,
	read_at FLOAT NOT NULL,
	PRIMARY KEY (image_id),
	FOREIGN KEY(image_id) REFERENCES images (id) ON DELETE CASCADE
)""",
    """CREATE TABLE image_keywords (
	image_id INTEGER NOT NULL,
	kind VARCHAR NOT NULL,
	keyword TEXT NOT NULL,
	keyword_key TEXT NOT NULL,
	CONSTRAINT pk_image_keywords PRIMARY KEY (image_id, kind, keyword),
	FOREIGN KEY(image_id) REFERENCES images (id) ON DELETE CASCADE
)""",
    "CREATE INDEX ix_image_keywords_key ON image_keywords (keyword_key)",
)


# Version 6 (issue 28): what EXIF, IPTC-IIM and the wider XMP vocabulary add to a picture's
# metadata (engine.types.PhotoMetadata): camera, lens, pick label, the kind of source of the date,
# titles and descriptions per language, and every field read with where it came from (JSON lists),
# plus an index for the GPS filter's bounding box. New columns only, so every row stays; they are
# empty until the next scan reads the pictures' metadata again (the reader's version changed with
# them), which re-embeds nothing.
_V6_DDL = (
    "ALTER TABLE image_metadata ADD COLUMN camera_make TEXT",
    "ALTER TABLE image_metadata ADD COLUMN camera_model TEXT",
    "ALTER TABLE image_metadata ADD COLUMN lens TEXT",
    "ALTER TABLE image_metadata ADD COLUMN pick VARCHAR",
    "ALTER TABLE image_metadata ADD COLUMN taken_from VARCHAR",
    "ALTER TABLE image_metadata ADD COLUMN titles TEXT NOT NULL DEFAULT '[]'",
    "ALTER TABLE image_metadata ADD COLUMN descriptions TEXT NOT NULL DEFAULT '[]'",
    "ALTER TABLE image_metadata ADD COLUMN fields TEXT NOT NULL DEFAULT '[]'",
    "CREATE INDEX ix_image_metadata_gps ON image_metadata (gps_lat, gps_lon)",
)


def _run_ddl(conn: Connection, statements: tuple[str, ...]) -> None:
    for sql in statements:
        conn.exec_driver_sql(sql)


def _v1(conn: Connection) -> None:
    _run_ddl(conn, _V1_DDL)


def _v2(conn: Connection) -> None:
    _run_ddl(conn, _V2_DDL)


def _v3(conn: Connection) -> None:
    import os

    from engine.catalog.review_keys import caption_hash, image_key

    _run_ddl(conn, _V3_CREATE)
    # The unique index the verdicts are filled through (the final one is made after the swap).
    conn.exec_driver_sql(
        "CREATE UNIQUE INDEX ux_verdicts_v3_target ON verdicts_v3 (image_key, caption_hash, coalesce(sentence_index, -1))"
    )
    # Old verdicts carry over to the image's content as it is now: the picture on disk is taken
    # to be the one that was reviewed (there is no record of what it was then).
    keys: dict[str, tuple[str, int | None, int | None]] = {}
    rows = conn.exec_driver_sql(
        "SELECT id, session_id, line_no, image_path, caption FROM review_items ORDER BY id").all()
    filled = []
    for item_id, session_id, line_no, image_path, caption in rows:
        if image_path not in keys:
            try:
                st = os.stat(image_path)
                size, mtime = int(st.st_size), int(st.st_mtime_ns)
            except OSError:
                size = mtime = None
            keys[image_path] = (image_key(image_path), size, mtime)
        key, size, mtime = keys[image_path]
        filled.append((item_id, session_id, line_no, image_path, caption, key, caption_hash(caption), size, mtime))
    for start in range(0, len(filled), 500):
        conn.exec_driver_sql(_V3_FILL_ITEMS, filled[start : start + 500])
    conn.exec_driver_sql(_V3_FILL_VERDICTS)
    conn.exec_driver_sql("DROP INDEX ux_verdicts_v3_target")
    _run_ddl(conn, _V3_SWAP)


def _v4(conn: Connection) -> None:
    # Version 4: sentence verdicts renumbered to the one sentence splitter (engine.text); no DDL.
    from engine.catalog.sentence_renumbering import migrate_sentence_verdicts

    migrate_sentence_verdicts(conn)


def _v5(conn: Connection) -> None:
    _run_ddl(conn, _V5_DDL)


def _v6(conn: Connection) -> None:
    _run_ddl(conn, _V6_DDL)


# Linear migration steps: MIGRATIONS[v] takes a catalog from version v-1 to v.
MIGRATIONS: dict[int, Callable[[Connection], None]] = {1: _v1, 2: _v2, 3: _v3, 4: _v4, 5: _v5, 6: _v6}


def read_only_uri(path: Path) -> str:
    """A `file:` URI opening `path` read-only. Path.as_uri percent-encodes every character that
    means something in a URI (? # % & ; spaces, newlines), so any legal path works. With no -wal
    and no -shm file nobody has the catalog open (WAL mode keeps them while a connection lives),
    so it is opened immutable: SQLite then creates no file and changes nothing on disk."""
    in_use = any(Path(f"{path}{suffix}").exists() for suffix in ("-wal", "-shm"))
    return Path(path).absolute().as_uri() + ("?mode=ro" if in_use else "?mode=ro&immutable=1")


def _file_state(path: Path) -> tuple:
    """What changes when another process writes the catalog (an immutable read takes no locks)."""
    out: list = []
    for p in (Path(path), Path(f"{path}-wal"), Path(f"{path}-shm")):
        try:
            st = p.stat()
            out.append((st.st_size, st.st_mtime_ns))
        except FileNotFoundError:
            out.append(None)
    return tuple(out)


# SQLite's WAL index (the -shm file): every open connection holds a shared POSIX lock on this
# byte (its "DMS" slot) for as long as it lives (sqlite3 os_unix.c: UNIX_SHM_DMS).
_SHM_DMS_BYTE = 128


def open_in_another_process(path: Path) -> bool:
    """True when another process has the catalog open (a live SQLite connection to it).

    Call it with no SQLite connection to the catalog open in this process: POSIX locks belong
    to the process, and closing the probe's descriptor would drop such a connection's locks.
    Where the OS has no POSIX locks (Windows) it cannot tell and says False.
    """
    try:
        import fcntl
    except ImportError:
        return False
    shm = Path(f"{Path(path).absolute()}-shm")
    try:
        # Longlens's own WAL index, beside the catalog; never followed through a link.
        fd = os.open(shm, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return False  # no -shm file: no connection in WAL mode has it open
    try:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, _SHM_DMS_BYTE, os.SEEK_SET)
        except OSError:
            return True  # another process's connection holds its shared lock
        fcntl.lockf(fd, fcntl.LOCK_UN, 1, _SHM_DMS_BYTE, os.SEEK_SET)
        return False
    finally:
        os.close(fd)


def connect_read_only(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(read_only_uri(path), uri=True, timeout=BUSY_TIMEOUT_S, check_same_thread=False)


def register_functions(con: sqlite3.Connection) -> None:
    """The SQL functions the catalog's queries use, on one connection: the great-circle distance
    of the GPS filter (engine.catalog.geo) and the camera's name as shown (engine.catalog.camera),
    so the camera filter matches what every display shows."""
    from engine.catalog.camera import CAMERA_DISPLAY, camera_display
    from engine.catalog.geo import GREAT_CIRCLE_KM, great_circle_km

    con.create_function(GREAT_CIRCLE_KM, 4, great_circle_km, deterministic=True)
    con.create_function(CAMERA_DISPLAY, 2, camera_display, deterministic=True)


def create_catalog_engine(path: Path, *, read_only: bool = False) -> Engine:
    """The catalog's engine. Connections come from a creator given the path as a plain file
    name, never a formatted URL, so ? % # & ; and newlines in the path cannot change which file
    is opened. `read_only`: for a catalog refused for writing (nothing on disk is changed)."""
    path = Path(path).absolute()
    if not read_only:
        ensure_folder(path.parent)

    def connect() -> sqlite3.Connection:
        if read_only:
            return connect_read_only(path)
        return sqlite3.connect(str(path), timeout=BUSY_TIMEOUT_S, check_same_thread=False)

    engine = create_engine(
        URL.create("sqlite", database=str(path)),
        creator=connect,
        poolclass=QueuePool,
        pool_size=4,
        max_overflow=8,
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: sqlite3.Connection, _record: object) -> None:
        # Take transaction control away from the sqlite3 module so our BEGIN is the one used.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        if not read_only:
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
        cur.close()
        register_functions(dbapi_conn)

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        mode = conn.get_execution_options().get("sqlite_begin", "DEFERRED")
        conn.exec_driver_sql(f"BEGIN {mode}")

    return engine


@dataclass(frozen=True)
class CatalogHealth:
    """What a read-only look at a catalog file found, before anything opens it for writing."""

    version: int | None  # None: no catalog yet (missing or empty file)
    damage: str | None = None  # quick_check's first findings when it failed
    checked: bool = True  # False when the quick check ran out of its time budget


def latest_backup(path: Path) -> Path | None:
    backups = sorted(Path(path).parent.glob(f"{Path(path).name}.v*.bak"), key=lambda p: p.stat().st_mtime)
    return backups[-1] if backups else None


def damaged_message(path: Path, finding: str) -> str:
    backup = latest_backup(path)
    restore = f"restore the backup {backup}, or " if backup else ""
    return (
        f"catalog {path} is damaged ({finding}); nothing was written to it. To go on, {restore}run "
        "`longlens check-catalog` to see the full damage and rebuild a clean catalog from what is readable"
    )


def inspect_catalog(path: Path, budget_s: float = QUICK_CHECK_BUDGET_S) -> CatalogHealth:
    """Version and a time-bounded PRAGMA quick_check, read through a read-only connection, so a
    catalog we then refuse (too new, unknown version, not SQLite) stays byte-identical.
    Raises CatalogError for a file that must not be opened at all."""
    path = Path(path)
    try:
        # Safe whatever is at the path now: a FIFO or device there is refused, never blocked on.
        with open_user_file(path) as f:
            header = f.read(100)
    except FileNotFoundError:
        return CatalogHealth(version=None)
    except NotARegularFileError as exc:
        raise CatalogError(f"{path} should be the catalog file but is {exc.kind}; move it away") from None
    except OSError as exc:
        raise CatalogError(f"cannot read the catalog {path}: {exc.strerror}") from None
    if not header:
        return CatalogHealth(version=None)  # SQLite treats an empty file as a new database
    if len(header) < 100 or not header.startswith(SQLITE_MAGIC):
        raise CatalogError(
            f"{path} is not a Longlens catalog (not an SQLite database); it was not modified. "
            f"Move it away or restore a backup of it"
        )
    for _attempt in range(3):
        before = _file_state(path)
        immutable = read_only_uri(path).endswith("immutable=1")
        health = _read_health(path, budget_s)
        # An immutable read takes no locks: if another process wrote meanwhile, look again.
        # (A locked read is consistent by itself; it may touch -shm, which is not a write.)
        if not immutable or _file_state(path) == before:
            return health
    return CatalogHealth(version=health.version, checked=False)


def _read_health(path: Path, budget_s: float) -> CatalogHealth:
    try:
        with closing(connect_read_only(path)) as con:
            version = int(con.execute("PRAGMA user_version").fetchone()[0])
            check_version(path, version)
            deadline = time.monotonic() + budget_s
            con.set_progress_handler(lambda: int(time.monotonic() > deadline), 10_000)
            try:
                rows = con.execute(f"PRAGMA quick_check({QUICK_CHECK_MAX_ERRORS})").fetchall()
            except sqlite3.OperationalError as exc:
                if "interrupt" in str(exc):
                    return CatalogHealth(version=version, checked=False)
                raise
            except sqlite3.DatabaseError as exc:
                # The check itself tripped over a damaged page: that is its finding.
                return CatalogHealth(version=version, damage=str(exc))
    except sqlite3.DatabaseError as exc:
        # The header is SQLite's but the file cannot be read (e.g. a damaged schema page).
        raise CatalogDamagedError(damaged_message(path, str(exc))) from None
    findings = [str(r[0]) for r in rows]
    if findings == ["ok"]:
        return CatalogHealth(version=version)
    return CatalogHealth(version=version, damage="; ".join(findings[:3]))


def check_version(path: Path, version: int) -> None:
    """Refuse a catalog version this Longlens cannot work with (the file is not touched)."""
    if version > SCHEMA_VERSION:
        raise CatalogTooNewError(
            f"{path} was written by a newer Longlens (catalog schema {version}, this version "
            f"understands up to {SCHEMA_VERSION}). Upgrade Longlens; the catalog was not modified."
        )
    if version < 0:
        raise CatalogError(
            f"{path} has catalog schema version {version}, which no Longlens writes; the catalog was "
            f"not modified. Restore a backup of it, or move it away to start a new catalog"
        )


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
    except (sqlite3.Error, OSError) as exc:
        # A disk that fills up (or a folder that turned read-only) while the copy is written: no
        # migration without a backup, and no half-written backup left to be mistaken for one.
        for leftover in (dest, Path(f"{dest}-journal")):
            leftover.unlink(missing_ok=True)
        raise CatalogError(
            f"could not back up {path} before upgrading it from catalog schema {version} to {SCHEMA_VERSION} "
            f"({exc}); the catalog was not changed. Free some disk space in {path.parent} and start again"
        ) from None
    finally:
        raw.close()
    return dest


def migrate(engine: Engine, path: Path) -> Path | None:
    """Bring the catalog to SCHEMA_VERSION. Returns the backup path when one was taken."""
    writer = engine.execution_options(sqlite_begin="IMMEDIATE")
    with writer.connect() as conn:
        current = user_version(conn)
    check_version(path, current)  # again: another process may have changed it since inspect_catalog
    if current == SCHEMA_VERSION:
        return None
    backup = backup_catalog(engine, path, current) if current > 0 else None
    for target in range(current + 1, SCHEMA_VERSION + 1):
        step = MIGRATIONS.get(target)
        if step is None:
            raise CatalogError(f"{path}: no migration step to catalog schema {target}; the catalog was not changed")
        with writer.connect() as conn, conn.begin():
            # Re-check inside the write lock: another process may have migrated meanwhile.
            if user_version(conn) >= target:
                continue
            step(conn)
            conn.exec_driver_sql(f"PRAGMA user_version={target}")
    return backup


# sqlite3 messages meaning the file itself is bad (SQLITE_CORRUPT, SQLITE_NOTADB).
CORRUPTION_MARKS = ("malformed", "not a database", "corrupt")


@contextmanager
def sqlite_errors(path: Path) -> Iterator[None]:
    """Turn low-level SQLite failures into messages naming the catalog file."""
    from sqlalchemy.exc import DatabaseError, IntegrityError, OperationalError

    try:
        yield
    except OperationalError as exc:
        msg = str(exc.orig) if exc.orig else str(exc)
        if "disk" in msg and "full" in msg:
            raise CatalogError(f"disk full while writing the catalog {path}; nothing was committed") from exc
        raise CatalogError(f"catalog {path}: {msg}") from exc
    except IntegrityError as exc:
        # A constraint refused a write (e.g. a row another process deleted meanwhile): the catalog
        # is fine and the transaction was rolled back whole; it is not "unreadable".
        msg = str(exc.orig) if exc.orig else str(exc)
        raise CatalogConflictError(
            f"catalog {path}: a write conflicted with a concurrent change ({msg}); nothing of it was "
            "committed and the catalog is intact. Run again"
        ) from exc
    except DatabaseError as exc:
        msg = str(exc.orig) if exc.orig else str(exc)
        if any(m in msg for m in CORRUPTION_MARKS):
            raise CatalogDamagedError(damaged_message(path, msg)) from exc
        raise CatalogError(f"catalog {path}: {msg}") from exc


# -- interrupted rebuilds (engine.catalog.repair swaps a rebuilt catalog in) ----------------------------
#
# The rebuild's swap takes more than one rename: the catalog's -wal/-shm and then the damaged file go
# aside, then the rebuilt file takes the catalog's name. It writes a journal (engine.swap_journal)
# before the first rename and removes it after the last; every start settles a journal it finds:
# once the damaged file is aside, the swap is finished (the rebuilt file was complete and verified
# before the journal was written); before that, it is rolled back. Every rebuild holds the rebuild
# lock for its whole run, so a start that gets the lock knows each rebuild's file beside the catalog
# belongs to a dead process.

REBUILD_JOURNAL_KIND = "catalog rebuild"
REBUILD_TEMP_PURPOSE = "rebuild"
SIDE_SUFFIXES = ("-wal", "-shm")
# Outcomes of settling a journal, at the start of each note (tests and people read them).
FINISHED = "finished an interrupted catalog rebuild"
ROLLED_BACK = "rolled back an interrupted catalog rebuild"


def rebuild_lock_path(path: Path) -> Path:
    path = Path(path)
    return path.parent / f".{path.name}{LOCK_SUFFIX}"


def rebuild_leftovers(path: Path) -> list[Path]:
    """Files a rebuild keeps beside the catalog while it runs (its copy, the copy's SQLite
    journal, the swap journal's temporary file), as far as they are there now."""
    path = Path(path)
    try:
        names = os.listdir(path.parent)
    except OSError:
        return []
    starts = (f".{path.name}.{REBUILD_TEMP_PURPOSE}-", f".{journal_path(path).name}.")  # swap_journal.temp_path
    return [path.parent / n for n in sorted(names) if n.startswith(starts)]


def recover_interrupted_rebuild(path: Path) -> list[str]:
    """The catalog's start-up hook: settle a rebuild that was interrupted (finish its swap or roll
    it back) and remove what killed rebuilds left beside the catalog. Returns what was done, one
    sentence each. Raises CatalogError rather than let a missing catalog be created empty while a
    rebuilt copy of it sits beside it, and while another process rebuilds the catalog."""
    path = Path(path).absolute()
    lock = rebuild_lock_path(path)
    if not (journal_path(path).exists() or lock.exists() or rebuild_leftovers(path)):
        return []  # the common case: one listing, no lock
    with exclusive_lock(lock, blocking=False) as held:
        if held:
            return settle_rebuild_locked(path)
    if path.exists():
        # A rebuild is running in another process (its files are its own), and will swap the file
        # away from under this process: writes made meanwhile would land in the damaged copy.
        raise CatalogError(
            f"the catalog {path} is being rebuilt by another Longlens process; wait for the rebuild to end "
            "and start again. Nothing was changed"
        )
    # A live rebuild between its renames (a few milliseconds): wait for it rather than start empty.
    with exclusive_lock(lock):
        return settle_rebuild_locked(path)


def settle_rebuild_locked(path: Path) -> list[str]:
    """recover_interrupted_rebuild's work; the caller holds the rebuild lock."""
    path = Path(path).absolute()
    notes: list[str] = []
    try:
        journal = read_journal(path, REBUILD_JOURNAL_KIND)
    except JournalError as exc:
        raise CatalogError(str(exc)) from None
    if journal is not None:
        notes.append(settle_rebuild(journal))
    leftovers = rebuild_leftovers(path)
    copies = [p for p in leftovers if p.name.endswith(".tmp") and p.name.startswith(f".{path.name}.{REBUILD_TEMP_PURPOSE}-")]
    if copies and not path.exists():
        raise CatalogError(
            f"the catalog {path} is missing, but {copies[0]} beside it is a copy of it made by a catalog rebuild "
            "that was interrupted before it could swap the copy in; Longlens did not start a new, empty catalog. "
            f"If that rebuild had finished copying, rename {copies[0].name} to {path.name}; otherwise move it away "
            "(and restore a backup of the catalog, or start a new one)"
        )
    for p in leftovers:
        try:
            p.unlink()
        except FileNotFoundError:
            continue
        except OSError as exc:
            notes.append(f"could not remove {p}, left by an interrupted catalog rebuild ({exc.strerror})")
            continue
        if not p.name.endswith(("-journal", "-wal", "-shm")):
            notes.append(f"removed {p.name}, left by a catalog rebuild that was stopped before its swap")
    return notes


def settle_rebuild(journal: Journal) -> str:
    """Finish or roll back the swap a rebuild journal describes (the caller holds the rebuild
    lock); removes the journal and returns what was done."""
    try:
        catalog, damaged, rebuilt = (journal.paths[k] for k in ("catalog", "damaged", "rebuilt"))
    except KeyError as exc:
        raise CatalogError(f"the rebuild journal {journal.path} names no {exc.args[0]} file; nothing was "
                           "changed. Look at the files beside it, then move the journal away") from None
    try:
        if rebuilt.exists():
            if catalog.exists():
                # The damaged file never left: put back what already went aside, drop the copy.
                _move_sides(damaged, catalog)
                for p in (rebuilt, *(Path(f"{rebuilt}{s}") for s in (*SIDE_SUFFIXES, "-journal"))):
                    p.unlink(missing_ok=True)
                note = (f"{ROLLED_BACK}: it had not swapped anything yet, so {catalog} is the damaged catalog as "
                        "it was; check and rebuild it again")
            else:
                os.replace(rebuilt, catalog)
                note = f"{FINISHED}: the rebuilt catalog is now {catalog}; the damaged file is kept as {damaged}"
        elif catalog.exists():
            note = f"{FINISHED}: its swap was complete; the damaged file is kept as {damaged}"
        elif damaged.exists():
            _move_sides(damaged, catalog)
            os.replace(damaged, catalog)
            note = (f"{ROLLED_BACK}: its rebuilt copy was gone, so the damaged file {damaged} is {catalog} again; "
                    "check and rebuild it again")
        else:
            raise CatalogError(
                f"the catalog {catalog} is missing and so are the rebuilt copy {rebuilt} and the damaged file "
                f"{damaged} that the interrupted rebuild's journal {journal.path} names; Longlens did not start a "
                "new, empty catalog. Restore a backup of the catalog, or move the journal away to start a new one"
            )
    except OSError as exc:
        raise CatalogError(
            f"could not settle the interrupted catalog rebuild of {catalog} ({exc}); its journal {journal.path} "
            "is kept so the next start tries again"
        ) from None
    fsync_folder(catalog.parent)
    remove_journal(journal)
    return note


def _move_sides(src: Path, dst: Path) -> None:
    """Move `src`'s -wal/-shm files to `dst`'s names, never over files `dst` already has."""
    for suffix in SIDE_SUFFIXES:
        side, target = Path(f"{src}{suffix}"), Path(f"{dst}{suffix}")
        if side.exists() and not target.exists():
            os.replace(side, target)
