"""File pins: what a registered model's file must hash to before Longlens installs it.

A pin is written in a ModelSpec's `files` as a string:

* ``"<64 hex>"`` or ``"sha256:<64 hex>"``: the file's SHA-256. Hugging Face shows it for every Git
  LFS file (the "Git LFS Details" of the file's page, the ``lfs.oid`` of the tree API), so this is
  how weights are pinned.
* ``"git-blob:<40 hex>"``: the file's git blob id, SHA-1 of ``b"blob <size>\\0" + bytes``, as git
  computes it (``git hash-object FILE``). Small files a hub keeps in git itself (config.json,
  tokenizer files) have no published SHA-256, but their blob id is what the hub's tree API lists as
  ``oid`` (``GET /api/models/OWNER/NAME/tree/REVISION``) and what it sends as their ETag, and it
  changes with any byte of the file.
* ``None``: no pin is known; such a file is only installed when the user trusts it explicitly.

Pickles (``.bin``, ``.pt``, ...) need a SHA-256 pin: they are loaded (with weights_only, after the
check), so they get the stronger hash. A git blob id is SHA-1; a collision needs whoever made the
published file to have made its twin beforehand, which is not the threat a pin guards against
(bytes changed after publication, on the hub or on the way).

`hash_file` computes both digests in one pass, so a file is read once whatever its pin is.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

PinKind = Literal["sha256", "git-blob"]

SHA256_PREFIX = "sha256:"
GIT_BLOB_PREFIX = "git-blob:"
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_SHA1_RE = re.compile(r"^[0-9a-f]{40}$")
_CHUNK = 4 * 1024 * 1024


@dataclass(frozen=True)
class Pin:
    kind: PinKind
    digest: str  # lower-case hex

    def __str__(self) -> str:
        return f"{self.kind}:{self.digest}"

    def describe(self) -> str:
        return f"git blob id {self.digest}" if self.kind == "git-blob" else f"sha256 {self.digest}"


@dataclass(frozen=True)
class FileDigests:
    """The digests a pin can be checked against, from one read of the file."""

    sha256: str
    git_blob: str
    size: int

    def of_kind(self, kind: PinKind) -> str:
        return self.git_blob if kind == "git-blob" else self.sha256

    def matches(self, pin: Pin) -> bool:
        return self.of_kind(pin.kind) == pin.digest


def sha256_pin(digest: str) -> str:
    """The pin string of a SHA-256 (as a spec's `files` value)."""
    return str(parse_pin(SHA256_PREFIX + digest))


def git_blob_pin(blob_id: str) -> str:
    """The pin string of a git blob id (as a spec's `files` value)."""
    return str(parse_pin(GIT_BLOB_PREFIX + blob_id))


def parse_pin(value: str | None) -> Pin | None:
    """The Pin a spec's `files` value stands for; ValueError when it is none of the forms above."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError(f"a pin is a string, not {type(value).__name__}")
    if _SHA256_RE.fullmatch(value):  # the original form: a bare SHA-256
        return Pin("sha256", value)
    if value.startswith(SHA256_PREFIX) and _SHA256_RE.fullmatch(value[len(SHA256_PREFIX):]):
        return Pin("sha256", value[len(SHA256_PREFIX):])
    if value.startswith(GIT_BLOB_PREFIX) and _SHA1_RE.fullmatch(value[len(GIT_BLOB_PREFIX):]):
        return Pin("git-blob", value[len(GIT_BLOB_PREFIX):])
    raise ValueError(
        f"not a pin: {value!r} (use a lower-case SHA-256 as 64 hex digits or 'sha256:<64 hex>', "
        "or a git blob id as 'git-blob:<40 hex>')"
    )


def git_blob_id(data: bytes) -> str:
    """The git blob id of `data` (what `git hash-object` prints for a file holding it)."""
    h = hashlib.sha1(b"blob %d\0" % len(data), usedforsecurity=False)
    h.update(data)
    return h.hexdigest()


def hash_file(path: Path) -> FileDigests:
    """SHA-256 and git blob id of a file, read once through engine.fileutil.open_user_file (a path
    that is no regular file by now is refused, a growing one is read up to its size at open). That
    size goes into the blob header before the bytes, so a file that shrinks while read is refused."""
    from engine.fileutil import open_user_file

    with open_user_file(path) as f:
        size = f.size
        sha256 = hashlib.sha256()
        blob = hashlib.sha1(b"blob %d\0" % size, usedforsecurity=False)
        read = 0
        while chunk := f.read(_CHUNK):
            sha256.update(chunk)
            blob.update(chunk)
            read += len(chunk)
    if read != size:
        raise OSError(f"{path} changed size while it was being hashed ({size} -> {read} bytes)")
    return FileDigests(sha256.hexdigest(), blob.hexdigest(), size)
