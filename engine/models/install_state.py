"""Crash-safe installs in the models folder: staging folders owned by live processes, and a replace
that never leaves a model name without an installed model.

Layout inside paths.models while an install runs:

    .staging-NAME-PID-RANDOM/        the new model being assembled (PID: the owner, for people)
    .staging-NAME-PID-RANDOM.lock    held (flock) by the owner for as long as it lives
    .replaced-NAME-PID-RANDOM/       during --replace only: the old model, between the two renames
and next to the models folder (so the models folder holds only models once installs end):

    .models.install.lock             held while a replace swaps folders and while a start repairs

    .NAME.swap-journal               during --replace only: the journal of the swap (engine.swap_journal)

The owner's flock is the truth about liveness (the kernel drops it when the process dies, even by
SIGKILL, and a re-used PID cannot hold it), so a start removes exactly the staging folders of dead
processes and never a live import's. A replace renames the old model aside only after the new one
is complete and verified, and both renames happen under `.install.lock`, after a journal naming
the three folders is written: a start that finds the journal finishes the replace (the new model
takes the name, the old one is deleted) once the old model had moved, and only drops the journal
before that. `.replaced-*` folders without a journal (left by releases before the journal) are
settled from their manifest: renamed back when no model has the name, deleted when one does.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from engine.config import Paths
from engine.fileutil import fsync_dir
from engine.swap_journal import (
    JOURNAL_SUFFIX,
    JournalError,
    read_journal,
    remove_journal,
    remove_stale_journal_temps,
    write_journal,
)
from engine.swap_journal import pause_point as swap_pause_point

try:
    import fcntl
except ImportError:  # Windows: no flock; staging folders then fall back to the age rule
    fcntl = None  # type: ignore[assignment]

STAGING_PREFIX = ".staging-"
REPLACED_PREFIX = ".replaced-"
LEGACY_TRASH_PREFIX = ".trash-"  # what releases before this module left between the two renames
INSTALL_LOCK_SUFFIX = ".install.lock"
REPLACE_JOURNAL_KIND = "model replace"
# Staging folders without an owner lock (older releases, or no flock on this OS) are removed only
# when this old, so a live install there is never touched.
STALE_WITHOUT_LOCK_S = 24 * 3600

# Test hook: `LONGLENS_TEST_INSTALL_PAUSE=STEP:FILE` makes an install write FILE and sleep when it
# reaches STEP, so a test can SIGKILL it exactly there. Never set outside tests.
PAUSE_ENV = "LONGLENS_TEST_INSTALL_PAUSE"


def pause_point(step: str) -> None:
    swap_pause_point(step, PAUSE_ENV)


@contextlib.contextmanager
def install_lock(paths: Paths) -> Iterator[None]:
    """Serialises folder swaps and repairs between processes sharing the models folder."""
    paths.models.mkdir(parents=True, exist_ok=True)
    if fcntl is None:
        yield
        return
    lock = paths.models.parent / f".{paths.models.name}{INSTALL_LOCK_SUFFIX}"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing drops the flock


class Staging:
    """A staging folder owned by this process: created with its lock held, removed on close."""

    def __init__(self, paths: Paths, name: str) -> None:
        paths.models.mkdir(parents=True, exist_ok=True)
        base = f"{STAGING_PREFIX}{name}-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self.dir = paths.models / base
        self.lock_path = paths.models / (base + ".lock")
        self._fd: int | None = None
        if fcntl is not None:
            # Lock first, folder second: a folder whose lock is free belongs to nobody.
            self._fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        self.dir.mkdir()

    def close(self) -> None:
        if self.dir.exists():
            shutil.rmtree(self.dir, ignore_errors=True)
        if self._fd is not None:
            self.lock_path.unlink(missing_ok=True)
            os.close(self._fd)
            self._fd = None


def _owner_is_gone(lock_path: Path) -> bool:
    """True when nobody holds the staging folder's lock (its owner died); False when one does."""
    try:
        fd = os.open(lock_path, os.O_RDWR)
    except FileNotFoundError:
        return False  # the owner is between creating its lock and its folder, or just finished
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # type: ignore[union-attr]
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


def remove_dead_staging(paths: Paths) -> list[Path]:
    """Delete staging folders (and their lock files) whose owner process is gone; returns them."""
    removed: list[Path] = []
    if not paths.models.is_dir():
        return removed
    now = time.time()
    for d in sorted(paths.models.iterdir()):
        if not d.name.startswith(STAGING_PREFIX) or d.name.endswith(".lock") or not d.is_dir():
            continue
        lock = d.with_name(d.name + ".lock")
        if fcntl is not None and lock.exists():
            dead = _owner_is_gone(lock)
        else:
            try:
                dead = now - d.stat().st_mtime > STALE_WITHOUT_LOCK_S
            except OSError:
                continue
        if dead:
            shutil.rmtree(d, ignore_errors=True)
            lock.unlink(missing_ok=True)
            removed.append(d)
    # Lock files whose folder is gone and whose owner is dead (killed between the two removals).
    if fcntl is not None:
        for lock in paths.models.glob(f"{STAGING_PREFIX}*.lock"):
            if not lock.with_name(lock.name.removesuffix(".lock")).exists() and _owner_is_gone(lock):
                lock.unlink(missing_ok=True)
    return removed


def _model_name_of(folder: Path) -> str | None:
    from engine.errors import ModelIntegrityError
    from engine.models.manifest import read_manifest_file

    try:
        return str(read_manifest_file(folder)["name"])
    except ModelIntegrityError:
        return None


def repair_interrupted_replace(paths: Paths) -> list[str]:
    """Finish or undo a replace whose process died between or after its renames (caller holds
    install_lock). Returns what was done, one sentence each."""
    from engine.models.manifest import MANIFEST_NAME

    done: list[str] = []
    if not paths.models.is_dir():
        return done
    aside = [d for d in sorted(paths.models.iterdir(), key=lambda p: _mtime(p), reverse=True)
             if d.name.startswith((REPLACED_PREFIX, LEGACY_TRASH_PREFIX)) and d.is_dir()]
    for d in aside:
        name = _model_name_of(d)
        final = paths.models / name if name else None
        if final is not None and not final.exists() and not final.is_symlink():
            os.replace(d, final)  # died between the renames: the old model goes back
            fsync_dir(paths.models)
            done.append(f"restored {name} (an interrupted replace had moved it aside)")
        elif final is None or (final / MANIFEST_NAME).is_file():
            shutil.rmtree(d, ignore_errors=True)  # the new model is in place; the old one is garbage
            done.append(f"removed the replaced copy of {name or d.name}")
        # else: something that is not a model holds the name; the old model is kept aside untouched.
    return done


def _mtime(p: Path) -> float:
    try:
        return p.stat().st_mtime
    except OSError:
        return 0.0


def settle_replace_journals(paths: Paths) -> list[str]:
    """Finish the replaces whose journal is left in the models folder (caller holds install_lock).

    The journal is written once the new model is complete and verified, before the old one moves:
    so a replace stopped after that is finished (the new model takes the name, the old one goes),
    and one stopped before its first rename only loses its journal (the old model never moved;
    the staging folder goes with the dead process's others)."""
    from engine.models.manifest import MANIFEST_NAME

    done: list[str] = []
    for jfile in sorted(paths.models.glob(f".*{JOURNAL_SUFFIX}")):
        target = paths.models / jfile.name[1:].removesuffix(JOURNAL_SUFFIX)
        try:
            journal = read_journal(target, REPLACE_JOURNAL_KIND)
        except JournalError as exc:
            done.append(str(exc))
            continue
        if journal is None:
            continue
        try:
            final, aside, staging = (journal.paths[k] for k in ("final", "aside", "staging"))
        except KeyError:
            done.append(f"{journal.path} names no model folders; left as it is")
            continue
        name = final.name
        if aside.exists():
            if not (final.exists() or final.is_symlink()) and staging.is_dir():
                os.replace(staging, final)  # died between the renames: the new model takes the name
                fsync_dir(paths.models)
            if (final / MANIFEST_NAME).is_file():
                shutil.rmtree(aside, ignore_errors=True)
                done.append(f"finished an interrupted replace of {name}: the new model is installed")
            elif not (final.exists() or final.is_symlink()):
                os.replace(aside, final)  # the new one is gone: the old model goes back
                fsync_dir(paths.models)
                done.append(f"rolled back an interrupted replace of {name}: the old model is installed again")
            else:
                done.append(f"an interrupted replace of {name} left the old model at {aside}: something that is "
                            f"not a model holds {final}; move one of them away")
                continue  # keep the journal: nothing was settled
        elif not (final.exists() or final.is_symlink()) and staging.is_dir():
            os.replace(staging, final)
            fsync_dir(paths.models)
            done.append(f"finished an interrupted install of {name}")
        elif staging.is_dir():
            done.append(f"rolled back an interrupted replace of {name}: it had not moved anything yet")
        remove_journal(journal)
    return done


def recover_models_folder(paths: Paths) -> list[str]:
    """What every start runs: undo or finish interrupted replaces, drop dead processes' staging."""
    if not paths.models.is_dir():
        return []
    if not any(p.name.startswith((STAGING_PREFIX, REPLACED_PREFIX, LEGACY_TRASH_PREFIX))
               or JOURNAL_SUFFIX in p.name for p in paths.models.iterdir()):
        return []  # the common case costs one listing, no lock
    with install_lock(paths):
        done = settle_replace_journals(paths)
        done += repair_interrupted_replace(paths)
        remove_stale_journal_temps(paths.models)
    done += [f"removed {d.name} (left by an install that was killed)" for d in remove_dead_staging(paths)]
    return done


def swap_in(staging: Path, final: Path, paths: Paths, *, replace: bool) -> None:
    """Put a complete, verified staging folder in place as `final`.

    The old model (if replacing) stays installed until the new one is complete: it is renamed aside
    only now, the new one takes its name at once, and a death between the two renames is undone by
    the next start (repair_interrupted_replace)."""
    from engine.errors import ModelError

    with install_lock(paths):
        settle_replace_journals(paths)
        repair_interrupted_replace(paths)
        if final.exists() or final.is_symlink():
            if not replace:
                raise ModelError(f"{final} already exists; pass replace to overwrite it")
            aside = final.with_name(f"{REPLACED_PREFIX}{final.name}-{os.getpid()}-{uuid.uuid4().hex[:12]}")
            # Journalled: a death from here on is finished by the next start (settle_replace_journals)
            # from the paths written down, never guessed from what the folders hold.
            journal = write_journal(final, REPLACE_JOURNAL_KIND, {"final": final, "aside": aside, "staging": staging})
            try:
                pause_point("journal-written")
                os.replace(final, aside)
                pause_point("replaced-aside")
                os.replace(staging, final)
            except BaseException:
                # An error or Ctrl+C in this process: put the old model back rather than leave nothing.
                if aside.exists() and not (final.exists() or final.is_symlink()):
                    os.replace(aside, final)
                remove_journal(journal)
                raise
            fsync_dir(paths.models)
            pause_point("swapped-in")
            shutil.rmtree(aside, ignore_errors=True)
            remove_journal(journal)
        else:
            os.replace(staging, final)
            fsync_dir(paths.models)
