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
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.jobs import CancelToken

__all__ = [
    "AtomicTextWriter",
    "FileTooLargeError",
    "NotARegularFileError",
    "UserFile",
    "atomic_write_bytes",
    "atomic_write_text",
    "fsync_dir",
    "open_user_file",
    "read_user_file",
    "read_user_text",
    "sha256_file",
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
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


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
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent)
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
