"""A model hub on loopback for pull tests: an http.server thread on 127.0.0.1 that answers the parts
of the Hugging Face protocol huggingface_hub 2.x uses for single-file downloads at a pinned
revision: HEAD and (ranged) GET on /{owner}/{name}/resolve/{revision}/{file}, with the hub's
X-Repo-Commit, ETag and Content-Length headers. Like huggingface.co, a git-tracked file's ETag is
its git blob id and a Git LFS file's is its SHA-256.

Hooks make it fail the ways a real connection does: a body cut off halfway, a 503, or a server that
is not a hub at all (no X-Repo-Commit, as from a captive portal).
"""

from __future__ import annotations

import hashlib
import re
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote

from engine.models.pins import git_blob_id

_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")
# Files huggingface.co keeps in Git LFS (their ETag is the SHA-256); the rest are plain git blobs.
LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".h5", ".msgpack", ".onnx")


class FakeHub:
    """Serves files the way huggingface.co's /resolve endpoint does, with hooks for failures."""

    def __init__(self) -> None:
        self.files: dict[tuple[str, str, str], bytes] = {}
        self.log: list[tuple[str, str, str | None]] = []  # (method, filename, Range header)
        self.drop_once: set[str] = set()  # first GET of these sends half the body, then hangs up
        self.gets_unavailable = False  # every GET answers 503
        self.impostor = False  # answer like a plain web server (captive portal), without hub headers
        self._lock = threading.Lock()
        hub = self

        self._connections: set[socket.socket] = set()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                with hub._lock:
                    hub._connections.add(self.connection)

            def finish(self) -> None:
                with hub._lock:
                    hub._connections.discard(self.connection)
                super().finish()

            def log_message(self, *args: object) -> None:
                pass

            def do_HEAD(self) -> None:
                hub._serve(self, head=True)

            def do_GET(self) -> None:
                hub._serve(self, head=False)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        # close() ends every connection and then waits for its thread: a client's idle keep-alive
        # connection must not leave a handler thread behind (GUI tests fail on leftover threads).
        self.server.daemon_threads = False
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        with self._lock:
            open_connections = list(self._connections)
        for conn in open_connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)  # the handler's next read sees the end and returns
            except OSError:
                pass  # already closed by the client
        self.server.server_close()  # joins the handler threads
        self._thread.join(timeout=5)

    def gets(self, filename: str) -> list[str | None]:
        return [r for m, f, r in self.log if m == "GET" and f == filename]

    def _error(self, h: BaseHTTPRequestHandler, status: int, code: str, rev: str | None = None) -> None:
        h.send_response(status)
        h.send_header("X-Error-Code", code)
        if rev:
            h.send_header("X-Repo-Commit", rev)
        h.send_header("Content-Length", "0")
        h.end_headers()

    def _serve(self, h: BaseHTTPRequestHandler, *, head: bool) -> None:
        m = _RESOLVE.match(unquote(h.path))
        if not m:
            return self._error(h, 404, "RepoNotFound")
        repo, rev, fname = m["repo"], m["rev"], m["file"]
        with self._lock:
            self.log.append(("HEAD" if head else "GET", fname, h.headers.get("Range")))
            drop = not head and fname in self.drop_once
            self.drop_once.discard(fname) if drop else None
        if not any(k[0] == repo for k in self.files):
            return self._error(h, 404, "RepoNotFound")
        if not any(k[:2] == (repo, rev) for k in self.files):
            return self._error(h, 404, "RevisionNotFound")
        data = self.files.get((repo, rev, fname))
        if data is None:
            return self._error(h, 404, "EntryNotFound", rev)
        if not head and self.gets_unavailable:
            return self._error(h, 503, "ServiceUnavailable")
        start = 0
        rng = h.headers.get("Range")
        if rng and not head:
            start = int(re.fullmatch(r"bytes=(\d+)-", rng)[1])  # type: ignore[index]
            h.send_response(206)
            h.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            h.send_response(200)
        body = data[start:]
        h.send_header("Content-Type", "application/octet-stream")
        h.send_header("Content-Length", str(len(body)))
        h.send_header("Accept-Ranges", "bytes")
        if not self.impostor:
            h.send_header("X-Repo-Commit", rev)
        etag = hashlib.sha256(data).hexdigest() if fname.endswith(LFS_SUFFIXES) else git_blob_id(data)
        h.send_header("ETag", f'"{etag}"')
        h.end_headers()
        if head:
            return
        if drop:
            h.wfile.write(body[: len(body) // 2])
            h.wfile.flush()
            h.close_connection = True
            h.connection.shutdown(socket.SHUT_RDWR)
            return
        h.wfile.write(body)


@contextmanager
def running_hub(monkeypatch) -> Iterator[FakeHub]:
    """A FakeHub, with the environment cleared of a developer's offline settings and HF_ENDPOINT."""
    from huggingface_hub import constants

    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    # http_get writes in chunks of this size and a half-received chunk is lost on a drop; real
    # weights are many chunks long, so shrink it to give the small test files several chunks too.
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 64 * 1024)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    h = FakeHub()
    try:
        yield h
    finally:
        h.close()


# --- serving a registered model's files with pins the test computes ---------------------------


def files_for_spec(spec, folder: Path, checkpoint: Path | None = None) -> dict[str, bytes]:
    """The bytes a fake hub serves for each of `spec.files`, from a small model folder of the spec's
    backend layout: the folder's own file of that name; for a checkpoint in the backend's own format
    (a .pt its convert_checkpoint takes: Long-CLIP's), the bytes of `checkpoint`; for pickled
    weights (pytorch_model.bin) the folder's model.safetensors saved with torch.save; for a file the
    folder lacks, a small placeholder (a JSON object for .json files)."""
    from engine.models.registry import get_backend

    own_format = get_backend(spec.backend).checkpoint_suffixes
    served: dict[str, bytes] = {}
    for fname in spec.files:
        src = folder / fname
        if Path(fname).suffix in own_format:
            if checkpoint is None:
                raise ValueError(f"{spec.name}: {fname} is a {spec.backend} checkpoint; pass one to serve")
            served[fname] = Path(checkpoint).read_bytes()
        elif src.is_file():
            served[fname] = src.read_bytes()
        elif fname.endswith(".bin"):
            served[fname] = _state_dict_pickle(folder / "model.safetensors")
        elif fname.endswith(".json"):
            served[fname] = b'{"placeholder": true}\n'
        else:
            served[fname] = f"placeholder for {fname}\n".encode()
    return served


def _state_dict_pickle(safetensors_file: Path) -> bytes:
    import io

    import torch
    from safetensors.torch import load_file

    buf = io.BytesIO()
    torch.save(load_file(str(safetensors_file)), buf)
    return buf.getvalue()


def pinned_like(spec, served: dict[str, bytes]):
    """`spec` with every file pinned to the bytes in `served`, each by the kind of pin the real spec
    uses for it; a file the real spec leaves unpinned gets a git blob id (a SHA-256 for pickles and
    LFS-style files), as a found value would be written."""
    from dataclasses import replace

    from engine.models.pins import git_blob_pin, sha256_pin

    files: dict[str, str] = {}
    for fname, data in served.items():
        pin = spec.pin(fname)
        by_sha256 = pin.kind == "sha256" if pin is not None else fname.endswith(LFS_SUFFIXES)
        files[fname] = sha256_pin(hashlib.sha256(data).hexdigest()) if by_sha256 else git_blob_pin(git_blob_id(data))
    return replace(spec, files=files)


def publish(hub: FakeHub, spec, served: dict[str, bytes]) -> None:
    """Put `served` on the hub under the spec's repository and pinned revision."""
    for fname, data in served.items():
        hub.files[(spec.repo_id, spec.revision, fname)] = data
