"""A small client for OpenAI-compatible chat-completions endpoints (vLLM, Ollama, LM Studio, ...).

Standard library only (urllib): the pipeline needs one POST with JSON in and out, and a
dependency for that would be heavier than the code. Thread-safe: one client serves all worker
threads, and its counters add up requests, retries, failures and tokens for the run summary.

Retries: 429, 5xx, connection errors, timeouts and unreadable answers are retried with
exponential backoff and jitter (delay = min(max_backoff, backoff * 2**k) * U(0.5, 1)); a
Retry-After header (seconds or an HTTP date) is honoured instead, up to `max_retry_after`.
Other 4xx answers are not retried: the request itself is wrong and would fail again.
"""

from __future__ import annotations

import email.utils
import json
import random
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from http.client import HTTPException
from typing import Any

from engine.errors import JobCancelled, LonglensError
from engine.jobs import CancelToken
from engine.jsonfile import JsonTooDeepError, loads_bounded

USER_AGENT = "longlens-datagen/1"
RETRY_STATUSES = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
# These mean the run as a whole cannot work (wrong key, wrong model or URL): stop instead of
# failing every image the same way.
FATAL_STATUSES = frozenset({401, 403, 404})
# A chat completion holding one caption is a few kB; an endpoint answering without end would
# otherwise be read into memory whole (reliability checklist 33).
MAX_RESPONSE_BYTES = 16 * 1024 * 1024


class EndpointError(LonglensError):
    """A request failed for good (after its retries, or at once for a request the server rejects)."""

    def __init__(self, message: str, status: int | None = None, *, fatal: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.fatal = fatal


@dataclass
class RequestStats:
    requests: int = 0  # HTTP attempts, retries included
    succeeded: int = 0
    failed: int = 0  # attempts that did not give a usable answer
    retries: int = 0
    gave_up: int = 0  # requests that failed after all retries (or at once)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    by_status: dict[str, int] = field(default_factory=dict)  # failed attempts by status / error kind

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ChatResult:
    text: str
    usage: dict[str, int]
    finish_reason: str | None = None


def chat_url(endpoint: str) -> str:
    """Accept 'http://host:port', '.../v1' or the full '.../v1/chat/completions'."""
    url = endpoint.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise LonglensError(f"the endpoint URL must start with http:// or https://, got {endpoint!r}",
                            settings=("endpoint",))
    if url.endswith("/chat/completions"):
        return url
    if url.endswith("/v1"):
        return url + "/chat/completions"
    return url + "/v1/chat/completions"


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header: delta-seconds or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def _content_text(message: Any) -> str | None:
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # some servers answer with content parts
        parts = [p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") in (None, "text")]
        return "".join(parts)
    return None


class ChatClient:
    def __init__(
        self,
        endpoint: str,
        *,
        api_key: str | None = None,
        timeout: float = 120.0,
        max_retries: int = 5,
        backoff: float = 1.0,
        max_backoff: float = 60.0,
        max_retry_after: float = 300.0,
        cancel: CancelToken | None = None,
        rng: random.Random | None = None,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        self.url = chat_url(endpoint)
        self.api_key = api_key
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.max_retry_after = max_retry_after
        self.cancel = cancel
        self._rng = rng or random.Random()
        self._sleep = sleep
        self._lock = threading.Lock()
        self.stats = RequestStats()
        self.delays: list[float] = []  # every backoff wait taken, for the summary and tests

    # -- counters ------------------------------------------------------------------
    def _count(self, **inc: int) -> None:
        with self._lock:
            for k, v in inc.items():
                setattr(self.stats, k, getattr(self.stats, k) + v)

    def _failed_attempt(self, kind: str) -> None:
        with self._lock:
            self.stats.failed += 1
            self.stats.by_status[kind] = self.stats.by_status.get(kind, 0) + 1

    def _wait(self, seconds: float) -> None:
        with self._lock:
            self.delays.append(seconds)
        if self._sleep is not None:
            self._sleep(seconds)
            return
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            if self.cancel is not None and self.cancel.cancelled:
                raise JobCancelled("cancelled by the user")
            time.sleep(min(left, 0.1))

    def _backoff_delay(self, retry: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(retry_after, self.max_retry_after)
        with self._lock:
            jitter = self._rng.uniform(0.5, 1.0)
        return min(self.max_backoff, self.backoff * 2**retry) * jitter

    # -- one request ---------------------------------------------------------------
    def _post(self, body: bytes, task: str) -> tuple[int, dict[str, str], bytes]:
        headers = {"Content-Type": "application/json", "Accept": "application/json", "User-Agent": USER_AGENT,
                   # Ignored by real servers; lets logs (and the test server) tell the requests apart.
                   "X-Longlens-Task": task}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        req = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                # One byte past the limit tells an over-long answer from one exactly at it.
                return resp.status, dict(resp.headers.items()), resp.read(MAX_RESPONSE_BYTES + 1)
        except urllib.error.HTTPError as exc:
            try:
                payload = exc.read(64 * 1024)  # only its start is shown
            except (OSError, HTTPException):
                payload = b""
            return exc.code, dict(exc.headers.items()) if exc.headers else {}, payload

    def chat(self, model: str, messages: list[dict[str, Any]], *, task: str = "chat", **params: Any) -> ChatResult:
        """POST one chat completion; `params` (temperature, top_p, max_tokens, ...) go into the body
        as given (None values are left out). Raises EndpointError when it fails for good."""
        payload = {"model": model, "messages": messages, "stream": False,
                   **{k: v for k, v in params.items() if v is not None}}
        body = json.dumps(payload).encode("utf-8")
        retry = 0
        while True:
            if self.cancel is not None:
                self.cancel.raise_if_cancelled()
            self._count(requests=1)
            retry_after: float | None = None
            try:
                status, headers, raw = self._post(body, task)
            except (urllib.error.URLError, HTTPException, ConnectionError, TimeoutError, OSError) as exc:
                reason = getattr(exc, "reason", exc)
                kind = "timeout" if isinstance(reason, TimeoutError) or "timed out" in str(reason) else "connection"
                self._failed_attempt(kind)
                problem = f"{kind} error: {reason}"
            else:
                if status == 200:
                    try:
                        return self._result(raw)
                    except ValueError as exc:
                        self._failed_attempt("malformed")
                        problem = f"unusable answer: {exc}"
                else:
                    self._failed_attempt(str(status))
                    detail = raw[:300].decode("utf-8", "replace").strip()
                    problem = f"HTTP {status}" + (f": {detail}" if detail else "")
                    if status not in RETRY_STATUSES and status < 500:
                        self._count(gave_up=1)
                        hint = " (check the API key)" if status in (401, 403) else (
                            " (check the endpoint URL and the model names)" if status == 404 else "")
                        raise EndpointError(f"{self.url}: {problem}{hint}", status, fatal=status in FATAL_STATUSES)
                    lower = {k.lower(): v for k, v in headers.items()}
                    retry_after = parse_retry_after(lower.get("retry-after"))
            if retry >= self.max_retries:
                self._count(gave_up=1)
                raise EndpointError(f"{self.url}: {problem} (gave up after {retry + 1} attempts)")
            self._count(retries=1)
            self._wait(self._backoff_delay(retry, retry_after))
            retry += 1

    def _result(self, raw: bytes) -> ChatResult:
        if len(raw) > MAX_RESPONSE_BYTES:
            raise ValueError(f"the response is larger than {MAX_RESPONSE_BYTES:,} bytes (the limit); not read")
        try:
            obj = loads_bounded(raw, "the response")
        except JsonTooDeepError as exc:
            raise ValueError(str(exc)) from None
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"not JSON ({exc})") from None
        if not isinstance(obj, dict):
            raise ValueError("not a JSON object")
        choices = obj.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise ValueError("no choices")
        text = _content_text(choices[0].get("message"))
        if text is None:
            raise ValueError("no message content")
        usage_raw = obj.get("usage") if isinstance(obj.get("usage"), dict) else {}
        usage = {k: int(usage_raw[k]) for k in ("prompt_tokens", "completion_tokens", "total_tokens")
                 if isinstance(usage_raw.get(k), int | float) and not isinstance(usage_raw.get(k), bool)}
        if "total_tokens" not in usage and usage:
            usage["total_tokens"] = usage.get("prompt_tokens", 0) + usage.get("completion_tokens", 0)
        self._count(succeeded=1, **usage)
        return ChatResult(text, usage, choices[0].get("finish_reason"))
