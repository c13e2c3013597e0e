"""A model hub on loopback for pull tests: an http.server thread on 127.0.0.1 that answers the parts
of the Hugging Face protocol a single-file download at a pinned revision uses: HEAD and (ranged)
GET on /{owner}/{name}/resolve/{revision}/{file}, with the hub's X-Repo-Commit, ETag and
Content-Length headers. Like huggingface.co, a git-tracked file's ETag is its git blob id and a Git
LFS file's is its SHA-256; with `redirect_lfs` an LFS file is answered, as huggingface.co does, by a
302 to a CDN path carrying X-Linked-Size and X-Repo-Commit, the CDN serving the bytes.

Every request it receives, whatever its method or path, is in `requests` (so a test can say that
a pull asked for nothing but its files); `log` holds those for files.

Hooks make it fail the ways a real connection or a hostile server does: a body cut off halfway
(`drop_once`), a 503, a server that is not a hub at all (no X-Repo-Commit, as from a captive
portal), an answer that sends its headers and then nothing (`stall`), a body that goes on past the
size announced (`overlong`).
"""

from __future__ import annotations

import hashlib
import re
import select
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote

from engine.models.pins import git_blob_id

_CDN = "/cdn/"  # where redirect_lfs sends LFS files (the same server stands in for the CDN)
#: What an "overlong" answer claims as Content-Length ("lying"), and the most it sends before giving up.
OVERLONG_CLAIM = 7 * 1000**3
OVERLONG_CAP = 256 * 1024 * 1024
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
        self.unavailable: set[str] = set()  # GETs of these files answer 503
        self.down_after_drop = False  # a file cut off by drop_once is then unavailable (its next GET: 503)
        self.impostor = False  # answer like a plain web server (captive portal), without hub headers
        self.redirect_lfs = False  # LFS files: 302 to /cdn/... (with X-Linked-Size), as huggingface.co does
        # GETs of these send their headers and that many bytes of the body, then nothing, until the
        # client goes away or the hub closes.
        self.stall: dict[str, int] = {}
        # The size announced for these files (Content-Length, X-Linked-Size), whatever the bytes are.
        self.claimed_size: dict[str, int] = {}
        self.stalled = threading.Event()  # set when a stalled GET has sent its headers
        self.stall_ended = threading.Event()  # set when the client of a stalled GET went away
        self.stalled_at = self.stall_ended_at = 0.0  # time.monotonic() of those two moments
        # GETs of these send the file and then endless filler: "unannounced" with no Content-Length (the
        # body ends when the connection does) but the hub's X-Linked-Size; "lying" with a Content-Length of
        # OVERLONG_CLAIM bytes (and no X-Linked-Size). `sent` counts body bytes sent per file.
        self.overlong: dict[str, str] = {}
        self.sent: dict[str, int] = {}
        self.requests: list[tuple[str, str, str | None]] = []  # (method, raw path, Range) of every request
        self.headers_seen: list[dict[str, str]] = []  # the headers of every request
        self.silent = False  # accept every request and never answer it (until the client goes)
        self.hide_linked_size = False  # "unannounced" answers carry no X-Linked-Size either
        self._closing = threading.Event()
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

            def do_POST(self) -> None:  # telemetry and API calls would come this way
                hub._record(self)
                hub._error(self, 404, "NotFound")

            do_PUT = do_OPTIONS = do_DELETE = do_PATCH = do_POST

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
        self._closing.set()  # a stalled answer stops waiting
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

    def _record(self, h: BaseHTTPRequestHandler) -> None:
        with self._lock:
            self.requests.append((h.command, h.path, h.headers.get("Range")))
            self.headers_seen.append(dict(h.headers))

    def _serve(self, h: BaseHTTPRequestHandler, *, head: bool) -> None:
        self._record(h)
        if self.silent:
            return self._stall(h, "", b"", headers_sent=False)
        path = unquote(h.path)
        cdn = path.startswith(_CDN)
        m = _RESOLVE.match(path[len(_CDN) - 1:] if cdn else path)
        if not m:
            return self._error(h, 404, "RepoNotFound")
        repo, rev, fname = m["repo"], m["rev"], m["file"]
        lfs = fname.endswith(LFS_SUFFIXES)
        if self.redirect_lfs and lfs and not cdn:
            if (repo, rev, fname) not in self.files:
                return self._error(h, 404, "EntryNotFound", rev)
            h.send_response(302)
            # Absolute, on another host name (localhost, not 127.0.0.1), as the hub's CDN is.
            h.send_header("Location", f"http://localhost:{self.server.server_address[1]}{_CDN[:-1]}{h.path}")
            h.send_header("X-Repo-Commit", rev)
            h.send_header("X-Linked-Size", str(len(self.files[(repo, rev, fname)])))
            h.send_header("Content-Length", "0")
            h.end_headers()
            return None
        with self._lock:
            self.log.append(("HEAD" if head else "GET", fname, h.headers.get("Range")))
            drop = not head and fname in self.drop_once
            self.drop_once.discard(fname) if drop else None
            if drop and self.down_after_drop:
                self.unavailable.add(fname)
            down = not head and not drop and (self.gets_unavailable or fname in self.unavailable)
        if not any(k[0] == repo for k in self.files):
            return self._error(h, 404, "RepoNotFound")
        if not any(k[:2] == (repo, rev) for k in self.files):
            return self._error(h, 404, "RevisionNotFound")
        data = self.files.get((repo, rev, fname))
        if data is None:
            return self._error(h, 404, "EntryNotFound", rev)
        if down:
            return self._error(h, 503, "ServiceUnavailable")
        start = 0
        rng = h.headers.get("Range")
        size = self.claimed_size.get(fname, len(data))
        if rng and not head:
            start = int(re.fullmatch(r"bytes=(\d+)-", rng)[1])  # type: ignore[index]
            h.send_response(206)
            h.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
        else:
            h.send_response(200)
        body = data[start:]
        overlong = None if head else self.overlong.get(fname)
        h.send_header("Content-Type", "application/octet-stream")
        if overlong == "lying":
            h.send_header("Content-Length", str(OVERLONG_CLAIM))
        elif overlong == "unannounced":
            if not self.hide_linked_size:
                h.send_header("X-Linked-Size", str(size))
            h.send_header("Connection", "close")  # the body ends when the connection does
            h.close_connection = True
        else:
            h.send_header("Content-Length", str(size - start))
        h.send_header("Accept-Ranges", "bytes")
        if not self.impostor and not cdn:
            h.send_header("X-Repo-Commit", rev)
        etag = hashlib.sha256(data).hexdigest() if lfs else git_blob_id(data)
        h.send_header("ETag", f'"{etag}"')
        h.end_headers()
        if head:
            return
        if fname in self.stall:
            return self._stall(h, fname, body[: self.stall[fname]])
        if overlong:
            return self._send_endlessly(h, fname, body)
        if drop:
            h.wfile.write(body[: len(body) // 2])
            h.wfile.flush()
            h.close_connection = True
            h.connection.shutdown(socket.SHUT_RDWR)
            return
        try:
            h.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            # The client hung up before reading it all (a pull that stopped, closing the answers it had
            # open): what any server sees, not a fault of the hub.
            h.close_connection = True
            return
        with self._lock:
            self.sent[fname] = self.sent.get(fname, 0) + len(body)

    def _stall(self, h: BaseHTTPRequestHandler, fname: str, first: bytes, *, headers_sent: bool = True) -> None:
        """Headers and `first` sent, then silence: wait until the client hangs up (or the hub closes)."""
        if headers_sent:
            h.wfile.write(first)
            h.wfile.flush()
        h.close_connection = True
        with self._lock:
            self.sent[fname] = self.sent.get(fname, 0) + len(first)
            self.stalled_at = time.monotonic()
        self.stalled.set()
        conn = h.connection
        while not self._closing.is_set():
            readable, _, _ = select.select([conn], [], [], 0.02)
            if readable:
                try:
                    if not conn.recv(1, socket.MSG_PEEK):
                        break  # the client closed or shut down its side
                except OSError:
                    break
        self.stall_ended_at = time.monotonic()
        self.stall_ended.set()

    def _send_endlessly(self, h: BaseHTTPRequestHandler, fname: str, body: bytes) -> None:
        """The file, then filler, until the client stops reading (or OVERLONG_CAP bytes)."""
        h.close_connection = True
        h.connection.settimeout(5)  # a client that stops reading without closing cannot hold this thread
        filler = b"\0" * (64 * 1024)
        sent = 0
        try:
            h.wfile.write(body)
            sent += len(body)
            while sent < OVERLONG_CAP and not self._closing.is_set():
                h.wfile.write(filler)
                sent += len(filler)
        except OSError:
            pass  # the client hung up: what a bounded client does
        finally:
            with self._lock:
                self.sent[fname] = self.sent.get(fname, 0) + sent


@contextmanager
def running_hub(monkeypatch) -> Iterator[FakeHub]:
    """A FakeHub, with the environment cleared of a developer's offline settings and HF_ENDPOINT."""
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)
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
