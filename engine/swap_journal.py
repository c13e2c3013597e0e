"""Journalled multi-step swaps, and Longlens's own temporary files: recognisable, owned, swept.

A swap that takes more than one rename (the catalog rebuild: damaged file aside, rebuilt file in;
a model replace: old folder aside, new one in) can be cut between its steps by a kill, a power cut
or Ctrl+C, and the target then names nothing, or the old thing, with the new one hidden beside it.
So before its first step a swap writes a journal beside its target: what it is about to do and
every path involved, fsynced, with the folder fsynced too. It deletes the journal after its last
step. Whoever starts next (opening the catalog, loading the models folder) and finds a journal
finishes the swap or rolls it back, from the journal and what is on disk, before using the target.
Each owner (engine.catalog.db, engine.models.install_state) knows its own steps; this module only
writes, reads and removes journals, and serialises a swap with the recovery of it.

Temporary files are named `.<target name>.<purpose>-<pid>-<random>.tmp` (hidden, beside their
target, the owner's pid inside), so the next run can tell whose they are and remove those whose
owner is gone (or, where the pid cannot be told, that are older than a day).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from engine.errors import LonglensError
from engine.fileutil import fsync_dir, pid_alive
from engine.jsonfile import loads_bounded

try:
    import fcntl
except ImportError:  # Windows: no flock; swaps there are not serialised with other processes
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "JOURNAL_SUFFIX",
    "LOCK_SUFFIX",
    "PAUSE_ENV",
    "STALE_TEMP_AGE_S",
    "Journal",
    "JournalError",
    "exclusive_lock",
    "journal_path",
    "owner_pid",
    "pause_point",
    "pid_alive",
    "read_journal",
    "remove_journal",
    "remove_stale_journal_temps",
    "remove_stale_temps",
    "temp_path",
    "temp_prefix",
    "write_journal",
]

JOURNAL_SUFFIX = ".swap-journal"
LOCK_SUFFIX = ".swap.lock"
JOURNAL_VERSION = 1
# A journal is a few hundred bytes; anything much bigger is not one of ours.
MAX_JOURNAL_BYTES = 64 * 1024
# Temporary files whose owner cannot be told (no pid in the name, or a pid that is alive but may
# have been re-used by another program) are removed only when this old.
STALE_TEMP_AGE_S = 24 * 3600.0

# Test hook: `LONGLENS_TEST_SWAP_PAUSE=STEP:FILE` makes a swap write its pid to FILE and sleep when
# it reaches STEP, so a test can SIGKILL (or SIGINT) it exactly there. Never set outside tests.
PAUSE_ENV = "LONGLENS_TEST_SWAP_PAUSE"


class JournalError(LonglensError):
    """A swap journal that cannot be read or acted on; the files it names are left as they are."""


@dataclass(frozen=True)
class Journal:
    """One unfinished (or just finished) swap: its kind, its owner and the paths it touches."""

    path: Path  # the journal file itself
    kind: str
    pid: int
    created: float
    paths: dict[str, Path]


def journal_path(target: Path) -> Path:
    """Where the journal of a swap into `target` lives: hidden, beside the target."""
    target = Path(target)
    return target.parent / f".{target.name}{JOURNAL_SUFFIX}"


def pause_point(step: str, env: str = PAUSE_ENV) -> None:
    """Stop here for ever when the test hook `env` (STEP:FILE) names this step: FILE gets this
    process's pid, so a test can SIGKILL it exactly here. Never set outside tests."""
    spec = os.environ.get(env)
    if not spec or not spec.startswith(step + ":"):
        return
    Path(spec.split(":", 1)[1]).write_text(str(os.getpid()), encoding="utf-8")
    while True:
        time.sleep(3600)


fsync_folder = fsync_dir  # the one folder fsync (engine.fileutil), under the name this module's callers use


def write_journal(target: Path, kind: str, paths: dict[str, Path]) -> Journal:
    """Write (and make durable) the journal of a swap into `target`, before its first step."""
    target = Path(target)
    journal = Journal(journal_path(target), kind, os.getpid(), time.time(),
                      {k: Path(v).absolute() for k, v in paths.items()})
    data = json.dumps({"version": JOURNAL_VERSION, "kind": kind, "pid": journal.pid, "created": journal.created,
                       "paths": {k: str(v) for k, v in journal.paths.items()}}, indent=1).encode("utf-8")
    tmp = temp_path(journal.path, "write")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, journal.path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_folder(journal.path.parent)
    return journal


def read_journal(target: Path, kind: str) -> Journal | None:
    """The unfinished swap into `target`, or None. JournalError for a file that is not a journal
    of this kind (it is left in place: it names files that must not be guessed at)."""
    path = journal_path(target)
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_JOURNAL_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise JournalError(f"cannot read the swap journal {path} ({exc.strerror})") from None
    try:
        if len(raw) > MAX_JOURNAL_BYTES:
            raise ValueError("too large")
        data = loads_bounded(raw, path)  # its size is bounded by the read above
        if data["kind"] != kind or data["version"] != JOURNAL_VERSION:
            raise ValueError(f"a {data['kind']!r} journal, version {data['version']}")
        return Journal(path, kind, int(data["pid"]), float(data["created"]),
                       {str(k): Path(v) for k, v in dict(data["paths"]).items()})
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as exc:
        raise JournalError(
            f"{path} should be the journal of an interrupted {kind} but cannot be read ({exc}); nothing was "
            f"changed. Look at the files beside it, then move the journal away"
        ) from None


def remove_journal(journal: Journal) -> None:
    """The swap is complete (or rolled back): the journal goes, durably."""
    journal.path.unlink(missing_ok=True)
    fsync_folder(journal.path.parent)


@contextlib.contextmanager
def exclusive_lock(lock_path: Path, *, blocking: bool = True) -> Iterator[bool]:
    """Hold an exclusive lock on `lock_path` (created for the purpose, removed on release).

    Yields True when held; with blocking=False, yields False at once when another process holds
    it. The holder removes the lock file on release, so none is left after a completed run; a
    waiter that then gets the lock on the removed file sees that the name no longer leads to what
    it locked and tries again. Where the OS has no flock (Windows) it yields True unlocked.
    """
    if fcntl is None:
        yield True
        return
    while True:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(fd)
            yield False
            return
        except BaseException:
            os.close(fd)
            raise
        try:
            held = os.fstat(fd)
            now = os.stat(lock_path)
            same = (held.st_dev, held.st_ino) == (now.st_dev, now.st_ino)
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # the previous holder removed this file on release: lock the current one
    try:
        yield True
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lock_path)
        os.close(fd)  # closing drops the flock


def temp_path(target: Path, purpose: str) -> Path:
    """A new temporary name for work on `target`: hidden, beside it, naming its purpose and owner."""
    target = Path(target)
    return target.parent / f".{target.name}.{purpose}-{os.getpid()}-{secrets.token_hex(4)}.tmp"


def temp_prefix(target: Path, purpose: str) -> str:
    """The start of every temporary name `temp_path` gives (for tempfile.mkstemp's prefix)."""
    return f".{Path(target).name}.{purpose}-{os.getpid()}-"


def owner_pid(temp_name: str, target_name: str) -> int | None:
    """The owner's pid in a temporary name of `target_name`'s, or None where it has none."""
    m = re.fullmatch(re.escape(f".{target_name}.") + r"[A-Za-z]+-(\d+)-[^/]*\.tmp(?:-journal|-wal|-shm)?",
                     temp_name)
    return int(m.group(1)) if m else None


def remove_stale_temps(folder: Path, target_name: str, *, max_age_s: float = STALE_TEMP_AGE_S,
                       also_unowned: bool = False) -> list[Path]:
    """Delete temporary files of `target_name` in `folder` whose owner process is gone, or that are
    older than `max_age_s` (the owner's pid re-used, or a name without a pid when `also_unowned`:
    names from older releases). Another live process's temporary files are never touched."""
    removed: list[Path] = []
    prefix = f".{target_name}."
    now = time.time()
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        name = entry.name
        if not name.startswith(prefix) or ".tmp" not in name:
            continue
        pid = owner_pid(name, target_name)
        if pid is None and not (also_unowned and re.search(r"\.tmp(?:-journal|-wal|-shm)?$", name)):
            continue
        try:
            st = entry.stat(follow_symlinks=False)
            # Our own are in use, however old; another's go when their owner is gone or they are old.
            stale = pid != os.getpid() and ((pid is not None and not pid_alive(pid)) or now - st.st_mtime > max_age_s)
            if stale and entry.is_file(follow_symlinks=False):
                os.unlink(entry.path)
                removed.append(Path(entry.path))
        except OSError:
            continue  # gone meanwhile, or not ours to remove
    return removed


def remove_stale_journal_temps(folder: Path) -> list[Path]:
    """Delete the temporary files of journals whose writer died before renaming them in."""
    removed: list[Path] = []
    try:
        names = [n for n in os.listdir(folder) if f"{JOURNAL_SUFFIX}.write-" in n]
    except OSError:
        return removed
    for name in names:
        target = name[1:name.index(JOURNAL_SUFFIX)]
        removed += remove_stale_temps(folder, target + JOURNAL_SUFFIX)
    return removed
