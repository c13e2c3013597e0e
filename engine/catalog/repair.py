"""The full catalog check and the rebuild of a damaged catalog (`longlens check-catalog`).

Opening a catalog runs only a time-bounded quick check (db.inspect_catalog); this is the full
PRAGMA integrity_check, plus a way out when it fails: copy every row that can still be read
into a fresh catalog, then swap it in and keep the damaged file beside it, never deleting it.
Row ids are kept, so the vector index files still match the rows that survived.
"""

from __future__ import annotations

import os
import sqlite3
import time
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path

from engine.catalog.db import (
    REBUILD_JOURNAL_KIND,
    REBUILD_TEMP_PURPOSE,
    SCHEMA_VERSION,
    SIDE_SUFFIXES,
    SQLITE_MAGIC,
    CatalogDamagedError,
    connect_read_only,
    open_in_another_process,
    rebuild_lock_path,
    settle_rebuild,
    settle_rebuild_locked,
)
from engine.errors import CatalogError, JobCancelled
from engine.fileutil import open_user_file
from engine.swap_journal import (
    exclusive_lock,
    fsync_folder,
    pause_point,
    read_journal,
    remove_journal,
    temp_path,
    write_journal,
)

MAX_REPORTED_PROBLEMS = 100
# Past an unreadable page, the copy tries rowids this much further on, doubling each time.
MAX_ROWID_JUMP = 1 << 62
LIBRARY_TABLES = {"libraries", "images", "embeddings"}


@dataclass
class CatalogCheck:
    path: str
    ok: bool
    problems: list[str] = field(default_factory=list)

    def text(self) -> str:
        if self.ok:
            return f"catalog {self.path}: integrity check ok"
        lines = [f"catalog {self.path} is DAMAGED ({len(self.problems)} problem(s) reported):"]
        return "\n".join(lines + [f"  {p}" for p in self.problems[:20]])


@dataclass
class RebuildReport:
    catalog: str
    damaged_copy: str  # the damaged file, kept under this name
    copied: dict[str, int] = field(default_factory=dict)  # table -> rows copied
    unreadable: dict[str, int] = field(default_factory=dict)  # table -> stretches of rows skipped
    orphans_removed: dict[str, int] = field(default_factory=dict)  # table -> rows whose parent was lost
    recovered: list[str] = field(default_factory=list)  # an earlier, interrupted rebuild settled first

    @property
    def lost_rows(self) -> bool:
        return bool(self.unreadable or self.orphans_removed)

    @property
    def libraries_incomplete(self) -> bool:
        """Rows of libraries, images or vectors were lost: the libraries must be indexed again."""
        lost = set(self.unreadable) | set(self.orphans_removed)
        return bool(lost & LIBRARY_TABLES)

    def text(self) -> str:
        copied = ", ".join(f"{t} {n}" for t, n in self.copied.items())
        lines = [*self.recovered, f"rebuilt {self.catalog} from every readable row ({copied})",
                 f"  the damaged file is kept as {self.damaged_copy}"]
        for table, n in self.unreadable.items():
            lines.append(f"  {table}: {n} unreadable stretch(es) of rows skipped")
        for table, n in self.orphans_removed.items():
            lines.append(f"  {table}: {n} row(s) dropped whose parent row was lost")
        if self.libraries_incomplete:
            lines.append("  every library is marked partly indexed: index them again to restore what was lost")
        return "\n".join(lines)


def check_catalog(path: Path) -> CatalogCheck:
    """SQLite's full integrity_check and foreign_key_check, read-only (the file is not changed)."""
    path = Path(path)
    if not path.is_file():
        raise CatalogError(f"there is no catalog at {path}")
    with open_user_file(path) as f:
        if not f.read(16).startswith(SQLITE_MAGIC):
            return CatalogCheck(str(path), False, ["not an SQLite database"])
    try:
        with closing(connect_read_only(path)) as con:
            problems = [str(r[0]) for r in con.execute(f"PRAGMA integrity_check({MAX_REPORTED_PROBLEMS})")]
            if problems == ["ok"]:
                problems = [f"row {rowid} of {table} refers to a missing {parent} row"
                            for table, rowid, parent, _ in con.execute("PRAGMA foreign_key_check")]
    except sqlite3.DatabaseError as exc:
        return CatalogCheck(str(path), False, [str(exc)])
    return CatalogCheck(str(path), not problems, problems[:MAX_REPORTED_PROBLEMS])


def rebuild_catalog(path: Path) -> RebuildReport:
    """Copy every readable row of a damaged catalog into a new file and swap it in.

    Refused while another process has the catalog open or another rebuild runs. The damaged file
    (and its -wal) is renamed to `<name>.damaged-<time>`, never deleted. The swap is journalled
    (engine.catalog.db): a run killed between its renames is finished or rolled back by the next
    start. Ctrl+C raises JobCancelled saying what state the catalog was left in.
    """
    path = Path(path).absolute()
    with exclusive_lock(rebuild_lock_path(path), blocking=False) as held:
        if not held:
            raise CatalogError(f"the catalog {path} is being rebuilt by another Longlens process; wait for the "
                               "rebuild to end and start again. Nothing was changed")
        recovered = settle_rebuild_locked(path)
        if open_in_another_process(path):
            # Swapping the file under a live process would send its later writes to the damaged copy.
            raise CatalogError(
                f"{path} is open in another Longlens process (the app, an index or search run); close it "
                "and run the rebuild again. Nothing was changed"
            )
        tmp = temp_path(path, REBUILD_TEMP_PURPOSE)
        report = RebuildReport(str(path), str(_damaged_name(path)), recovered=recovered)
        try:
            _copy_into(path, tmp, report)
        except BaseException as exc:
            for p in (tmp, Path(f"{tmp}-journal"), Path(f"{tmp}-wal"), Path(f"{tmp}-shm")):
                p.unlink(missing_ok=True)
            if isinstance(exc, KeyboardInterrupt):
                raise JobCancelled(f"interrupted while copying rows; {path} was not changed and the partial copy "
                                   "was removed") from None
            raise
        _swap_in(path, tmp, Path(report.damaged_copy))
    return report


def _damaged_name(path: Path) -> Path:
    """`<name>.damaged-<time>`, with a counter when a rebuild in the same second made one already."""
    base = path.with_name(f"{path.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}")
    candidate, n = base, 1
    while any(Path(f"{candidate}{s}").exists() for s in ("", *SIDE_SUFFIXES)):
        n += 1
        candidate = base.with_name(f"{base.name}-{n}")
    return candidate


def _copy_into(path: Path, tmp: Path, report: RebuildReport) -> None:
    """Copy every readable row of `path` into the new file `tmp`, check it and make it durable."""
    with closing(connect_read_only(path)) as src, closing(sqlite3.connect(str(tmp))) as dst:
        try:
            schema = src.execute(
                "SELECT type, name, sql FROM sqlite_master WHERE sql IS NOT NULL AND name NOT LIKE 'sqlite_%' "
                "ORDER BY type = 'index', rowid"
            ).fetchall()
            version = int(src.execute("PRAGMA user_version").fetchone()[0])
        except sqlite3.DatabaseError as exc:
            raise CatalogDamagedError(
                f"catalog {path}: even its table list is unreadable ({exc}), so no row can be recovered; "
                "restore a backup, or move the file away and index the libraries again"
            ) from None
        dst.isolation_level = None
        dst.execute("BEGIN")
        for kind, name, sql in schema:
            dst.execute(sql)
            if kind == "table":
                report.copied[name] = _copy_rows(src, dst, name, report)
                pause_point("rebuild-copying")
        report.orphans_removed = _drop_orphans(dst)
        if report.libraries_incomplete and "libraries" in report.copied:
            dst.execute("UPDATE libraries SET status = 'partial'")
        dst.execute(f"PRAGMA user_version={min(max(version, 0), SCHEMA_VERSION)}")
        dst.execute("COMMIT")
        result = dst.execute("PRAGMA integrity_check").fetchone()[0]
        if result != "ok":
            raise CatalogError(f"the rebuilt catalog failed its own check ({result}); {path} was left as is")
        dst.execute("PRAGMA journal_mode=WAL")
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())


def _swap_in(path: Path, rebuilt: Path, damaged: Path) -> None:
    """Damaged file aside, rebuilt file in: journalled, so that a death between the renames is
    settled by the next start, and an exception or Ctrl+C here is settled at once."""
    journal = None
    try:
        journal = write_journal(path, REBUILD_JOURNAL_KIND,
                                {"catalog": path, "damaged": damaged, "rebuilt": rebuilt})
        pause_point("rebuild-journal-written")
        # -wal first: a WAL left beside the catalog's name would be replayed into the rebuilt file.
        for suffix in SIDE_SUFFIXES:
            side = Path(f"{path}{suffix}")
            if side.exists():
                os.replace(side, Path(f"{damaged}{suffix}"))
        pause_point("rebuild-sides-moved")
        os.replace(path, damaged)
        pause_point("rebuild-damaged-moved")
        os.replace(rebuilt, path)
        fsync_folder(path.parent)
        pause_point("rebuild-swapped")
        remove_journal(journal)
    except BaseException as exc:
        # Stopped inside write_journal, the journal may be on disk without having been returned.
        journal = journal or read_journal(path, REBUILD_JOURNAL_KIND)
        if journal is not None:
            outcome = settle_rebuild(journal)
        else:
            rebuilt.unlink(missing_ok=True)
            outcome = f"nothing was swapped yet, so {path} was not changed and the rebuilt copy was removed"
        if isinstance(exc, KeyboardInterrupt):
            raise JobCancelled(f"interrupted during the swap; {outcome}") from None
        if isinstance(exc, OSError):
            raise CatalogError(f"could not swap the rebuilt catalog in ({exc}); {outcome}") from None
        raise


def _copy_rows(src: sqlite3.Connection, dst: sqlite3.Connection, table: str, report: RebuildReport) -> int:
    """Copy a table's rows in rowid order; past an unreadable page, seek further on and go on."""
    quoted = '"' + table.replace('"', '""') + '"'
    copied = 0
    after = -(1 << 63)
    jump = 1
    while True:
        try:
            cur = src.execute(f"SELECT rowid, * FROM {quoted} WHERE rowid > ? ORDER BY rowid", (after,))
            cols = ", ".join('"' + d[0].replace('"', '""') + '"' for d in cur.description[1:])
            marks = ", ".join("?" * len(cur.description))
            insert = f"INSERT OR IGNORE INTO {quoted} (rowid, {cols}) VALUES ({marks})"
            for row in cur:
                dst.execute(insert, row)
                copied += 1
                after = row[0]
                jump = 1
            return copied
        except sqlite3.DatabaseError:
            if jump == 1:
                report.unreadable[table] = report.unreadable.get(table, 0) + 1
            if jump > MAX_ROWID_JUMP or after > (1 << 63) - 1 - jump:
                return copied
            after += jump
            jump *= 2


def _drop_orphans(dst: sqlite3.Connection) -> dict[str, int]:
    """Delete rows whose parent row was lost, until none are left (cascades through levels)."""
    removed: dict[str, int] = {}
    while True:
        orphans = dst.execute("PRAGMA foreign_key_check").fetchall()
        if not orphans:
            return removed
        for table, rowid, _parent, _fk in orphans:
            dst.execute(f'DELETE FROM "{table}" WHERE rowid = ?', (rowid,))
            removed[table] = removed.get(table, 0) + 1
