"""A small OpenAI-compatible chat-completions server with scripted answers, for tests and demos.

    python -m engine.datagen.fake_server --port 8765          # serves http://127.0.0.1:8765/v1

It answers `POST /v1/chat/completions` the way a vision-language server would, without looking
at the picture: captions, hard negatives and paragraphs are made up from a seeded vocabulary, and
scores are deterministic (about one first paragraph in three scores 4, so the regeneration loop
runs). `--fail-every N` answers every Nth request with 429 + Retry-After, `--delay S` slows every
answer, so the client's retries and progress can be watched.

Tests script it: `FakeVLMServer(ScriptedResponder({"positives": [Reply(status=429, ...), "1. ..."]}))`
answers each task's requests from its queue first and falls back to the default answers.
Loopback only by default; it is a test tool, not a server to expose.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
import signal
import sys
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from engine import options

TASKS = ("positives", "negatives", "paragraph", "score")


@dataclass
class Reply:
    content: str | None = None  # the assistant's text (status 200)
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0  # seconds to wait before answering (a slow model, or a timeout)
    raw: bytes | None = None  # send these bytes as the body instead (malformed answers)
    usage: dict[str, int] | None = None


@dataclass
class Seen:
    task: str
    body: dict[str, Any]
    headers: dict[str, str]
    reply: Reply


def _user_text(body: dict[str, Any]) -> str:
    texts = []
    for m in body.get("messages", []):
        c = m.get("content")
        if isinstance(c, str):
            texts.append(c)
        elif isinstance(c, list):
            texts += [p.get("text", "") for p in c if isinstance(p, dict) and p.get("type") == "text"]
    return "\n".join(texts)


def _image_url(body: dict[str, Any]) -> str:
    for m in body.get("messages", []):
        c = m.get("content")
        if isinstance(c, list):
            for p in c:
                if isinstance(p, dict) and p.get("type") == "image_url":
                    return str(p.get("image_url", {}).get("url", ""))
    return ""


def classify(body: dict[str, Any], headers: dict[str, str]) -> str:
    """Which of the pipeline's requests this is: the client's task header, else the prompt's words."""
    task = headers.get("x-longlens-task", "")
    if task in TASKS:
        return task
    text = _user_text(body).lower()
    if "0 to 10" in text or "score" in text or "rate" in text:
        return "score"
    if "false" in text or "wrong" in text or "negative" in text:
        return "negatives"
    if "paragraph" in text:
        return "paragraph"
    return "positives"


_SUBJECTS = ["a brown dog", "a woman in a red coat", "two children", "a grey cat", "an old bicycle",
             "a man with a blue umbrella", "a white van", "a wooden boat", "a street musician", "a green parrot"]
_PLACES = ["on a sandy beach", "in a busy market", "beside a stone wall", "under a large oak tree",
           "in a small kitchen", "on a snowy path", "near a fountain", "at a train platform"]
_ACTIONS = ["stands still", "looks toward the camera", "waits in the sun", "rests in the shade", "moves to the left"]
_COLOURS = ["red", "blue", "yellow", "green", "black", "white", "orange", "purple"]


class DefaultAnswers:
    """Plausible answers, a pure function of (image, task, attempt) for repeatable demos."""

    def __init__(self) -> None:
        self._paragraph_attempts: dict[str, int] = defaultdict(int)
        self._lock = threading.Lock()

    def __call__(self, task: str, body: dict[str, Any]) -> Reply:
        image = hashlib.sha256(_image_url(body).encode()).hexdigest()[:16]
        scene = random.Random(image)  # the same subject and place in every answer about this image
        subject, place = scene.choice(_SUBJECTS), scene.choice(_PLACES)
        rng = random.Random(f"{image}/{task}")
        if task in ("positives", "negatives"):
            lines = []
            base = rng.randrange(8)
            for i in range(5):
                colour = _COLOURS[(base + i) % 8]  # distinct per item: duplicates would be dropped
                act = _ACTIONS[(i + rng.randrange(5)) % 5]
                if task == "negatives":
                    lines.append(f"{i + 1}. {subject.capitalize()} {act} {place} next to a sign painted {colour}, "
                                 f"with {i + 2} people behind it.")
                else:
                    lines.append(f"{i + 1}. {subject.capitalize()} {act} {place} beside a door painted {colour}.")
            return Reply("Here are the captions:\n" + "\n".join(lines) if rng.random() < 0.3 else "\n".join(lines))
        if task == "paragraph":
            with self._lock:
                self._paragraph_attempts[image] += 1
                attempt = self._paragraph_attempts[image]
            colour = _COLOURS[(rng.randrange(8) + attempt) % 8]
            return Reply(f"{subject.capitalize()} {rng.choice(_ACTIONS)} {place}. Behind it a {colour} wall catches "
                         f"the light, and a low bench stands to the right. The ground is uneven and a little wet. "
                         f"In the distance a few trees frame the scene (draft {attempt}).")
        # score: the paragraph carries its attempt number; a third of the images fail their first draft.
        text = _user_text(body)
        m = re.search(r"\(draft (\d+)\)", text)
        attempt = int(m.group(1)) if m else 1
        low = int(image, 16) % 3 == 0 and attempt == 1
        return Reply("4" if low else str(7 + int(image, 16) % 3))


class ScriptedResponder:
    """Answers each task from its own queue of scripted replies, then from `fallback`."""

    def __init__(self, script: dict[str, list[Reply | str]] | None = None,
                 fallback: Callable[[str, dict[str, Any]], Reply] | None = None) -> None:
        self._queues: dict[str, deque[Reply]] = {
            t: deque(r if isinstance(r, Reply) else Reply(r) for r in replies) for t, replies in (script or {}).items()
        }
        self._fallback = fallback or DefaultAnswers()
        self._lock = threading.Lock()

    def __call__(self, task: str, body: dict[str, Any]) -> Reply:
        with self._lock:
            q = self._queues.get(task)
            if q:
                return q.popleft()
        return self._fallback(task, body)


class FailEvery:
    """Wraps a responder: every nth request gets 429 with Retry-After (for the demo)."""

    def __init__(self, inner: Callable[[str, dict[str, Any]], Reply], n: int, retry_after: float = 1.0) -> None:
        self.inner, self.n, self.retry_after = inner, n, retry_after
        self._count = 0
        self._lock = threading.Lock()

    def __call__(self, task: str, body: dict[str, Any]) -> Reply:
        with self._lock:
            self._count += 1
            fail = self.n > 0 and self._count % self.n == 0
        if fail:
            return Reply(status=429, headers={"Retry-After": f"{self.retry_after:g}"},
                         raw=b'{"error": {"message": "rate limited", "type": "rate_limit"}}')
        return self.inner(task, body)


class FakeVLMServer:
    """ThreadingHTTPServer in a daemon thread; `with FakeVLMServer() as srv: srv.url`."""

    def __init__(self, responder: Callable[[str, dict[str, Any]], Reply] | None = None, *, host: str = "127.0.0.1",
                 port: int = 0, delay: float = 0.0, api_key: str | None = None) -> None:
        self.responder = responder or ScriptedResponder()
        self.delay = delay
        self.api_key = api_key
        self.log: list[Seen] = []
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer((host, port), self._handler_class())
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def requests(self, task: str | None = None) -> list[Seen]:
        with self._lock:
            return [s for s in self.log if task is None or s.task == task]

    def start(self) -> FakeVLMServer:
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,), name="fake-vlm",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> FakeVLMServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # quiet: tests read .log instead
                pass

            def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    for k, v in (headers or {}).items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout test); nothing to tell it

            def do_GET(self) -> None:
                if self.path.rstrip("/").endswith("/models"):
                    self._send(200, json.dumps({"object": "list", "data": [{"id": "fake-vlm", "object": "model"}]})
                               .encode())
                else:
                    self._send(404, b'{"error": {"message": "not found"}}')

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    self._send(404, b'{"error": {"message": "unknown path"}}')
                    return
                if server.api_key and self.headers.get("Authorization") != f"Bearer {server.api_key}":
                    self._send(401, b'{"error": {"message": "invalid api key"}}')
                    return
                try:
                    body = json.loads(raw)
                except ValueError:
                    self._send(400, b'{"error": {"message": "body is not JSON"}}')
                    return
                headers = {k.lower(): v for k, v in self.headers.items()}
                task = classify(body, headers)
                reply = server.responder(task, body)
                with server._lock:
                    server.log.append(Seen(task, body, headers, reply))
                if reply.delay or server.delay:
                    time.sleep(reply.delay or server.delay)
                if reply.raw is not None:
                    self._send(reply.status, reply.raw, reply.headers)
                    return
                content = reply.content or ""
                usage = reply.usage or {"prompt_tokens": len(raw) // 4,
                                        "completion_tokens": len(content.split()),
                                        "total_tokens": len(raw) // 4 + len(content.split())}
                payload = {
                    "id": f"chatcmpl-{len(server.log)}", "object": "chat.completion", "created": int(time.time()),
                    "model": body.get("model", "fake"),
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                                 "finish_reason": "stop"}],
                    "usage": usage,
                }
                self._send(reply.status, json.dumps(payload).encode(), reply.headers)

        return Handler


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m engine.datagen.fake_server",
                                description="Scripted OpenAI-compatible chat-completions server for trying "
                                "`longlens datagen` without a model.")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=options.count("port", 0, 65535), default=8765, help="0 picks a free port")
    p.add_argument("--delay", type=options.Number("delay (s)", float, 0, 3600), default=0.0, help="seconds before each answer")
    p.add_argument("--fail-every", type=options.count("requests between failures", 0, 1_000_000), default=0, help="answer every Nth request with 429 + Retry-After")
    p.add_argument("--api-key", help="require this bearer token")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    responder: Callable[[str, dict[str, Any]], Reply] = ScriptedResponder()
    if args.fail_every:
        responder = FailEvery(responder, args.fail_every)
    srv = FakeVLMServer(responder, host=args.host, port=args.port, delay=args.delay, api_key=args.api_key)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    srv.start()
    print(f"serving {srv.url}  (Ctrl+C to stop)", flush=True)
    try:
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        srv.stop()
    print(f"served {len(srv.log)} requests", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
