"""Crash-safe file writes (temp file in the same folder, fsync, atomic rename, fsync the folder),
the one safe way to open a user's file, and the one streaming SHA-256 of a file.

A user's file is whatever sits at a path now, not what a scan saw a moment ago: it may have
become a FIFO (a plain open() blocks until a writer appears, forever), a link to /dev/zero (a
read never ends), a socket, a folder, or a file another program keeps appending to.
`open_user_file` opens without blocking, checks the type of the *open descriptor* (a check of
the path before opening it is a race) and bounds every read by the size seen then.
"""

from __future__ import annotations

import errno
import hashlib
import io
import math
import os
import secrets
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from engine.jobs import CancelToken

__all__ = [
    "TEMP_PREFIX",
    "AtomicTextWriter",
    "FileChangedError",
    "FileIdentity",
    "FileTooLargeError",
    "FolderLockTimeout",
    "NotARegularFileError",
    "UserFile",
    "atomic_write_bytes",
    "atomic_write_text",
    "check_identity",
    "copy_file_identity",
    "folder_write_lock",
    "fsync_dir",
    "open_user_file",
    "pid_alive",
    "read_user_file",
    "read_user_text",
    "read_with_identity",
    "remove_stale_temp_files",
    "replace_user_file",
    "sha256_file",
    "temp_name_for",
]

_HASH_CHUNK = 1 << 20

# O_NONBLOCK: opening a FIFO returns at once instead of waiting for a writer. O_NOCTTY: opening a
# terminal never makes it ours. Flags a platform lacks (Windows) are 0, i.e. not used there.
_OPEN_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_NOCTTY", 0)
    | getattr(os, "O_CLOEXEC", 0)
    | getattr(os, "O_BINARY", 0)
)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


class NotARegularFileError(OSError):
    """The path names a FIFO, device, socket, folder or (not followed) link, not a regular file."""

    def __init__(self, path: os.PathLike[str] | str, kind: str) -> None:
        self.kind = kind  # "a FIFO (named pipe)", "a character device", "a folder", ...
        super().__init__(errno.EISDIR if kind == "a folder" else errno.EINVAL,
                         f"{kind}, not a regular file", os.fspath(path))

    def __str__(self) -> str:
        return f"{self.filename} is {self.kind}, not a regular file"


class FileTooLargeError(OSError):
    """A file read whole is bigger than the caller's limit (nothing was read)."""

    def __init__(self, path: os.PathLike[str] | str, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit
        super().__init__(errno.EFBIG, f"{size} bytes, more than the limit of {limit}", os.fspath(path))

    def __str__(self) -> str:
        return f"{self.filename} is too large ({self.size} bytes; the limit is {self.limit})"


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    return "a special file"


class _BoundedRaw(io.RawIOBase):
    """Raw reads of an open descriptor that end at `size` bytes, however much the file grows."""

    def __init__(self, raw: io.FileIO, size: int, name: str) -> None:
        super().__init__()
        self._raw = raw
        self._pos = 0  # tracked here rather than asked of the OS (an lseek per read)
        self.size = size
        self.name = name

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._raw.fileno()

    def readinto(self, buffer) -> int:  # type: ignore[override]
        remaining = self.size - self._pos
        if remaining <= 0:
            return 0
        view = memoryview(buffer).cast("B")
        n = self._raw.readinto(view[:remaining] if len(view) > remaining else view) or 0
        self._pos += n
        return n

    def readall(self) -> bytes:
        # RawIOBase's own readall loops in 8 KiB steps; a whole caption or weights file is read in big ones.
        chunks = []
        while (remaining := self.size - self._pos) > 0:
            chunk = self._raw.read(min(remaining, 1 << 24))
            if not chunk:
                break
            self._pos += len(chunk)
            chunks.append(chunk)
        return b"".join(chunks)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_END:
            # The end is the end seen when the file was opened, not wherever a writer is now.
            offset, whence = self.size + offset, io.SEEK_SET
        self._pos = self._raw.seek(offset, whence)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def close(self) -> None:
        if not self.closed:
            try:
                self._raw.close()
            finally:
                super().close()


class UserFile(io.BufferedReader):
    """A user's regular file opened by `open_user_file`: buffered, seekable, reads end at `size`."""

    @property
    def size(self) -> int:
        """Bytes readable: the file's size when it was opened."""
        return self.raw.size  # type: ignore[attr-defined]


def open_user_file(path: os.PathLike[str] | str, *, follow_symlinks: bool = True) -> UserFile:
    """Open a user's file for reading, safe whatever the path names by now.

    Never blocks (O_NONBLOCK, so a FIFO opens at once) and never reads without end: the open
    descriptor is fstat'ed and anything but a regular file raises NotARegularFileError (an
    OSError naming the path and what it is); reads stop at the size seen at that fstat, and
    seeking to the end goes there. With follow_symlinks=False a path that is now a symbolic link
    is refused too (O_NOFOLLOW, where the platform has it). Other OSErrors (FileNotFoundError,
    PermissionError, ...) are raised as the OS reports them.
    """
    name = os.fspath(path)
    flags = _OPEN_FLAGS | (0 if follow_symlinks else _O_NOFOLLOW)
    try:
        fd = os.open(name, flags)
    except OSError as exc:
        # A socket cannot be opened at all (ENXIO); O_NOFOLLOW on a link fails with ELOOP (EMLINK on
        # some BSDs). Say what the path is instead of the OS's puzzling words.
        if exc.errno in (errno.ENXIO, errno.EOPNOTSUPP, errno.ELOOP, errno.EMLINK):
            try:
                st = os.stat(name, follow_symlinks=follow_symlinks)
            except OSError:
                raise exc from None
            if not stat.S_ISREG(st.st_mode):
                raise NotARegularFileError(name, _kind(st.st_mode)) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotARegularFileError(name, _kind(st.st_mode))
        raw = io.FileIO(fd, "rb", closefd=True)
    except BaseException:
        os.close(fd)
        raise
    return UserFile(_BoundedRaw(raw, st.st_size, name), buffer_size=64 * 1024)


def read_user_file(
    path: os.PathLike[str] | str, *, max_bytes: int | None = None, follow_symlinks: bool = True
) -> bytes:
    """The whole of a user's file, opened by `open_user_file`; FileTooLargeError (nothing read)
    when it is bigger than `max_bytes`."""
    with open_user_file(path, follow_symlinks=follow_symlinks) as f:
        if max_bytes is not None and f.size > max_bytes:
            raise FileTooLargeError(path, f.size, max_bytes)
        return f.read()


def read_user_text(
    path: os.PathLike[str] | str, *, encoding: str = "utf-8", max_bytes: int | None = None
) -> str:
    """`read_user_file` decoded (UnicodeDecodeError as str.decode raises it)."""
    return read_user_file(path, max_bytes=max_bytes).decode(encoding)


def fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return  # not supported on this platform (Windows): the rename is still atomic
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """`path` holds its old bytes or all of `data`, never a part: a temporary file in the same
    folder (TEMP_PREFIX, this process's pid), fsynced, renamed over it, the folder fsynced. A new
    file follows the umask like any other. The first write of a process into a folder removes the
    temporary files killed Longlens writers left there."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _sweep_dead_writers_once(path.parent)
    tmp = _write_new_temp(os.fspath(path.parent), path.name, data, 0o666)
    try:
        os.replace(tmp, path)
    except BaseException:
        _unlink_quietly(tmp)
        raise
    fsync_dir(path.parent)


_swept_folders: set[str] = set()
_swept_lock = threading.Lock()


def _sweep_dead_writers_once(folder: Path) -> None:
    """Once per folder and process (a data set export writes thousands of files into one folder):
    remove the temporary files whose writer process is gone. Never a live writer's, this
    process's included, however old: a long export may take hours."""
    key = os.fspath(folder)
    with _swept_lock:
        if key in _swept_folders:
            return
        _swept_folders.add(key)
    remove_stale_temp_files(folder, max_age=math.inf, include_own=False)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


class AtomicTextWriter:
    """A UTF-8 text file written piece by piece under a temporary name in its folder and renamed
    over `path` by commit() (after an fsync), so `path` holds its old bytes or the whole new text,
    never a part. Leaving a `with` block without commit() (an exception, a cancel) removes the
    temporary file. Why not atomic_write_text: some outputs (a converted data set of a million
    lines) are too big to build in memory first."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _sweep_dead_writers_once(self.path.parent)
        fd, tmp = _new_temp_fd(os.fspath(self.path.parent), self.path.name, 0o666)
        self._tmp = Path(tmp)
        self._fh = os.fdopen(fd, "w", encoding="utf-8", newline="\n")
        self.finished = False

    def write(self, text: str) -> None:
        self._fh.write(text)

    def commit(self) -> None:
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._fh.close()
        os.replace(self._tmp, self.path)
        self.finished = True
        fsync_dir(self.path.parent)

    def discard(self) -> None:
        if not self.finished:
            self._fh.close()
            self._tmp.unlink(missing_ok=True)
            self.finished = True

    def __enter__(self) -> AtomicTextWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.discard()


def sha256_file(
    path: os.PathLike[str] | str,
    *,
    on_bytes: Callable[[int], None] | None = None,
    cancel: CancelToken | None = None,
    follow_symlinks: bool = True,
) -> str:
    """Hex SHA-256 of a file's bytes, read in 1 MiB chunks through `open_user_file` (so a path that
    is now a FIFO, device, socket or folder raises NotARegularFileError, and a growing file is hashed
    up to its size at open); on_bytes(n) after each chunk (progress); JobCancelled between chunks
    once `cancel` is set, so hashing a huge file stops promptly."""
    h = hashlib.sha256()
    with open_user_file(path, follow_symlinks=follow_symlinks) as f:
        while chunk := f.read(_HASH_CHUNK):
            h.update(chunk)
            if on_bytes is not None:
                on_bytes(len(chunk))
            if cancel is not None:
                cancel.raise_if_cancelled()
    return h.hexdigest()


# --------------------------------------------------------------------------- replacing a user's file
#
# The one way Longlens replaces a file the user owns (an XMP sidecar): compare-and-swap under a
# lock every Longlens writer takes, with the file's identity carried over. Why a lock on the
# *folder's own descriptor* (fcntl.flock) and not a lock file:
#   - a lock file beside the sidecar would be one more file in the photo folder that other tools
#     list, sync and import;
#   - a lock file under the Longlens home is respected only by processes sharing that home, and
#     is keyed by a path spelling (a symlinked folder, a bind mount or another case of the name on
#     a case-insensitive disk is another key);
#   - the sidecar's own descriptor cannot be locked before it exists (an export that creates it),
#     and a replace gives the path a new inode, so a writer waiting on the old one would hold a
#     lock on a file nobody reads any more.
# flock on the folder is keyed by the folder's inode, whatever path leads there; every Longlens
# process on the machine sees it (the CLI, the app's worker threads: each open is its own lock
# owner, cluster jobs); the kernel releases it when the process dies (kill -9 leaves no stale
# lock); over NFS Linux maps it onto the server's byte-range locks. It is advisory: another
# program (darktable, a sync client) ignores it, which is why the content is re-checked right
# before the replace as well. The lock is held only for the swap of one file.

TEMP_PREFIX = ".longlens-tmp-"  # every temporary file Longlens makes in a user's folder starts so
STALE_TEMP_SECONDS = 3600.0  # a temporary file older than this is stale even if its pid is alive (pid reuse)
LOCK_TIMEOUT_SECONDS = 30.0


class FileChangedError(OSError):
    """The file is no longer what was read (another program wrote, replaced or removed it)."""

    def __init__(self, path: os.PathLike[str] | str, what: str) -> None:
        self.what = what
        super().__init__(errno.EAGAIN, f"changed since it was read ({what})", os.fspath(path))

    def __str__(self) -> str:
        return f"{self.filename} changed since it was read ({self.what})"


class FolderLockTimeout(OSError):
    """Another Longlens writer held the folder's lock for longer than the wait allowed."""

    def __init__(self, folder: os.PathLike[str] | str, waited: float) -> None:
        self.waited = waited
        super().__init__(errno.EWOULDBLOCK, f"another Longlens process has been writing here for over "
                         f"{waited:.0f} s", os.fspath(folder))

    def __str__(self) -> str:
        return f"{self.filename}: another Longlens process has been writing there for over {self.waited:.0f} s"


@dataclass(frozen=True)
class FileIdentity:
    """What a file was when it was read: compared before it is replaced."""

    size: int
    mtime_ns: int
    ino: int
    dev: int
    sha256: str

    def differences(self, other: FileIdentity) -> list[str]:
        out = [name for name in ("size", "mtime_ns", "ino", "dev") if getattr(self, name) != getattr(other, name)]
        if self.sha256 != other.sha256:
            out.append("content")
        return out


def read_with_identity(path: os.PathLike[str] | str, *, max_bytes: int | None = None) -> tuple[bytes, FileIdentity]:
    """A user's file read whole (links not followed) with its identity: the stat of the open
    descriptor after the read and the SHA-256 of exactly the bytes returned. FileNotFoundError when
    there is none."""
    with open_user_file(path, follow_symlinks=False) as f:
        if max_bytes is not None and f.size > max_bytes:
            raise FileTooLargeError(path, f.size, max_bytes)
        data = f.read()
        st = os.fstat(f.fileno())
    return data, FileIdentity(st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev, hashlib.sha256(data).hexdigest())


def check_identity(path: os.PathLike[str] | str, expected: FileIdentity | None, *,
                   max_bytes: int | None = None) -> None:
    """Raise FileChangedError unless `path` is still exactly `expected` (None: still absent)."""
    try:
        _data, now = read_with_identity(path, max_bytes=max_bytes)
    except FileNotFoundError:
        if expected is None:
            return
        raise FileChangedError(path, "removed") from None
    except NotARegularFileError as exc:
        raise FileChangedError(path, f"now {exc.kind}") from None
    if expected is None:
        raise FileChangedError(path, "created by another program")
    diff = expected.differences(now)
    if diff:
        raise FileChangedError(path, ", ".join(diff))


@contextmanager
def folder_write_lock(folder: os.PathLike[str] | str, *, timeout: float = LOCK_TIMEOUT_SECONDS,
                      cancel: CancelToken | None = None) -> Iterator[None]:
    """Hold the advisory lock every Longlens writer takes before replacing a file in `folder`
    (see above for why the folder's descriptor). Waits up to `timeout` seconds, then raises
    FolderLockTimeout; JobCancelled while waiting once `cancel` is set."""
    folder = os.fspath(folder)
    if fcntl is None:  # no flock (Windows): a lock file in the temp folder, keyed by the real path
        from filelock import FileLock, Timeout

        key = hashlib.sha256(os.path.normcase(os.path.realpath(folder)).encode("utf-8", "surrogateescape"))
        lock_dir = Path(tempfile.gettempdir()) / "longlens-locks"
        lock_dir.mkdir(exist_ok=True)
        lock = FileLock(str(lock_dir / f"{key.hexdigest()}.lock"))
        try:
            lock.acquire(timeout=timeout)
        except Timeout:
            raise FolderLockTimeout(folder, timeout) from None
        try:
            yield
        finally:
            lock.release()
        return
    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        deadline = time.monotonic() + timeout
        pause = 0.001
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if cancel is not None:
                    cancel.raise_if_cancelled()
                if time.monotonic() >= deadline:
                    raise FolderLockTimeout(folder, timeout) from None
                # The holder's swap of one file takes milliseconds: look again soon, then less often.
                time.sleep(pause)
                pause = min(pause * 2, 0.02)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def pid_alive(pid: int) -> bool:
    """True when a process with this pid exists (it may be another program that re-used the pid,
    which is why leftovers also go by age). Windows: os.kill(pid, 0) would send a CTRL_C_EVENT,
    so there it cannot tell and says alive."""
    if pid <= 0:
        return False
    if os.name == "nt":
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, owned by another user
    return True


def remove_stale_temp_files(folder: os.PathLike[str] | str, *, max_age: float = STALE_TEMP_SECONDS,
                            include_own: bool = True) -> list[str]:
    """Remove Longlens' temporary files (TEMP_PREFIX) that a killed writer left in `folder`: those
    whose process is gone, or older than `max_age`. With include_own, this process's own files
    count as leftovers too: right only under folder_write_lock, where a live writer makes and
    removes its temporary files (sidecars). Returns the names removed."""
    removed: list[str] = []
    try:
        names = os.listdir(folder)
    except OSError:
        return removed
    now = time.time()
    for name in names:
        if not name.startswith(TEMP_PREFIX):
            continue
        pid_s = name[len(TEMP_PREFIX):].split("-", 1)[0]
        path = os.path.join(folder, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode):
            continue
        if (pid_s.isdigit() and not pid_alive(int(pid_s))) or now - st.st_mtime > max_age or \
                (include_own and pid_s.isdigit() and int(pid_s) == os.getpid()):
            try:
                os.unlink(path)
                removed.append(name)
            except OSError:
                pass
    return removed


def temp_name_for(name: str) -> str:
    """A recognisable temporary name for a file about to be written as `name`: TEMP_PREFIX, the
    writer's pid (so a later run knows a killed writer's leftovers), a random part, the name."""
    head = f"{TEMP_PREFIX}{os.getpid()}-{secrets.token_hex(4)}-"
    tail = name.encode("utf-8", "surrogateescape")[: 250 - len(head)].decode("utf-8", "ignore")
    return head + tail


def _new_temp_fd(folder: str, name: str, mode: int) -> tuple[int, str]:
    """A new temporary file (temp_name_for) in `folder`, created exclusively, never through a link,
    with `mode` less the umask: its descriptor, open for writing, and its path."""
    tmp = os.path.join(folder, temp_name_for(name))
    return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), mode), tmp


def _write_new_temp(folder: str, name: str, data: bytes, mode: int) -> str:
    """`data` in a new temporary file in `folder`, fsynced; created with `mode` (the umask and the
    folder's default ACL apply, as to any new file). Removed again if anything fails."""
    fd, tmp = _new_temp_fd(folder, name, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        _unlink_quietly(tmp)
        raise
    os.close(fd)
    return tmp


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def copy_file_identity(src: os.PathLike[str] | str, src_stat: os.stat_result, dst_fd: int) -> list[str]:
    """Give the open file `dst_fd` the owner, group, extended attributes (with them the POSIX ACLs,
    system.posix_acl_*) and mode of `src`. Returns what could not be carried over (empty: all)."""
    lost: list[str] = []
    dst = os.fstat(dst_fd)
    if (dst.st_uid, dst.st_gid) != (src_stat.st_uid, src_stat.st_gid) and hasattr(os, "fchown"):
        try:
            os.fchown(dst_fd, src_stat.st_uid, src_stat.st_gid)
        except PermissionError:
            lost.append(f"owner {src_stat.st_uid}:{src_stat.st_gid}")
    if hasattr(os, "listxattr"):
        try:
            names = os.listxattr(src, follow_symlinks=False)
        except OSError as exc:
            names = []
            if exc.errno not in (errno.ENOTSUP, errno.EOPNOTSUPP):
                lost.append("extended attributes")
        try:
            for extra in set(os.listxattr(dst_fd)) - set(names):  # e.g. an ACL the folder's default gave it
                os.removexattr(dst_fd, extra)
        except OSError:
            pass
        for name in names:
            try:
                os.setxattr(dst_fd, name, os.getxattr(src, name, follow_symlinks=False))
            except OSError:
                lost.append(f"extended attribute {name}")
    try:
        os.fchmod(dst_fd, stat.S_IMODE(src_stat.st_mode))  # last: fchown clears set-id bits, an ACL sets the group's
    except OSError:
        # Some file systems (FAT, exFAT on a memory card) have no modes to set: lost only if it differs.
        if stat.S_IMODE(os.fstat(dst_fd).st_mode) != stat.S_IMODE(src_stat.st_mode):
            lost.append(f"mode {stat.S_IMODE(src_stat.st_mode):o}")
    return lost


def replace_user_file(path: os.PathLike[str] | str, data: bytes, *, expected: FileIdentity | None,
                      max_bytes: int | None = None) -> str:
    """Write `data` as the user's file `path`, compare-and-swap. Call it holding
    folder_write_lock(path's folder), after the backup of what `expected` describes is on disk.

    `expected`: the identity of the content this replaces (read_with_identity), re-checked right
    before the swap; None: the file must not exist yet (it is created, never clobbering one made
    meanwhile). FileChangedError when the file is not what was expected; nothing was changed then.

    A replaced file keeps its mode, owner and group, extended attributes and ACLs. Where a new
    inode cannot carry them (a hard link, st_nlink > 1: the other names would keep the old bytes;
    an owner this user may not give) the file is written in place instead: the same inode, so
    every name, owner and attribute stays, but not atomic (the backup holds the old bytes).
    A new file is made with mode 0666 less the umask (and the folder's default ACL), as any
    program's new file. Returns "created", "replaced" or "written in place"."""
    path = os.fspath(path)
    folder, name = os.path.split(os.path.abspath(path))
    if expected is None:
        tmp = _write_new_temp(folder, name, data, 0o666)
        try:
            try:
                os.link(tmp, path)  # fails if a file appeared meanwhile: never clobbered
            except FileExistsError:
                raise FileChangedError(path, "created by another program") from None
            except OSError:  # a file system without hard links: check, then rename
                if os.path.lexists(path):
                    raise FileChangedError(path, "created by another program") from None
                os.replace(tmp, path)
        finally:
            _unlink_quietly(tmp)
        fsync_dir(Path(folder))
        return "created"
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise FileChangedError(path, "removed") from None
    if not stat.S_ISREG(st.st_mode):
        raise FileChangedError(path, f"now {_kind(st.st_mode)}")
    if st.st_nlink > 1:
        return _write_in_place(path, data, expected, max_bytes)
    tmp = _write_new_temp(folder, name, data, 0o600)
    try:
        fd = os.open(tmp, os.O_RDONLY | _O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
        try:
            lost = copy_file_identity(path, st, fd)
            os.fsync(fd)
        finally:
            os.close(fd)
        if lost:
            _unlink_quietly(tmp)
            return _write_in_place(path, data, expected, max_bytes)
        check_identity(path, expected, max_bytes=max_bytes)  # right before the swap
        os.replace(tmp, path)
    except BaseException:
        _unlink_quietly(tmp)
        raise
    fsync_dir(Path(folder))
    return "replaced"


def _write_in_place(path: str, data: bytes, expected: FileIdentity, max_bytes: int | None) -> str:
    fd = os.open(path, os.O_RDWR | _O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if max_bytes is not None and st.st_size > max_bytes:
            raise FileChangedError(path, "size")
        chunks = []
        offset = 0
        while offset < st.st_size:
            chunk = os.pread(fd, min(st.st_size - offset, 1 << 20), offset)
            if not chunk:
                break
            chunks.append(chunk)
            offset += len(chunk)
        now = FileIdentity(st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev, hashlib.sha256(b"".join(chunks)).hexdigest())
        diff = expected.differences(now)
        if diff:
            raise FileChangedError(path, ", ".join(diff))
        if len(data) > st.st_size and hasattr(os, "posix_fallocate"):
            try:  # a full disk fails here, before any byte of the file changed
                os.posix_fallocate(fd, 0, len(data))
            except OSError as exc:
                if exc.errno not in (errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL):
                    raise
        view = memoryview(data)
        offset = 0
        while offset < len(data):
            offset += os.pwrite(fd, view[offset:], offset)
        os.ftruncate(fd, len(data))
        os.fsync(fd)
    finally:
        os.close(fd)
    return "written in place"
