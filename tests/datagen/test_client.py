"""The chat client against a real HTTP server on loopback: retries, backoff, Retry-After, timeouts,
malformed answers, errors that must not be retried, token accounting."""

from __future__ import annotations

import email.utils
import socket
import time

import pytest

from engine.datagen.client import ChatClient, EndpointError, chat_url, parse_retry_after
from engine.datagen.fake_server import Reply

MSG = [{"role": "user", "content": "hello"}]


def _client(srv, **kw) -> ChatClient:
    waits: list[float] = []
    kw.setdefault("sleep", waits.append)  # backoff waits are recorded, not slept
    return ChatClient(srv.url, **kw)


def test_429_with_retry_after_is_honoured_then_succeeds(serve):
    srv = serve({"positives": [Reply(status=429, headers={"Retry-After": "7"}, raw=b"{}"), "1. ok"]})
    client = _client(srv, backoff=0.01)
    got = client.chat("m", MSG, task="positives")
    assert got.text == "1. ok"
    assert client.delays == [7.0]  # the server's wait, not the (much shorter) exponential backoff
    s = client.stats
    assert (s.requests, s.succeeded, s.failed, s.retries, s.gave_up) == (2, 1, 1, 1, 0)
    assert s.by_status == {"429": 1}


def test_5xx_backs_off_exponentially_with_jitter(serve):
    fails = [Reply(status=500, raw=b"boom"), Reply(status=502, raw=b""), Reply(status=503, raw=b"")]
    srv = serve({"score": [*fails, "8"]})
    client = _client(srv, backoff=1.0, max_backoff=3.0)
    assert client.chat("m", MSG, task="score").text == "8"
    d = client.delays
    assert len(d) == 3
    assert 0.5 <= d[0] <= 1.0 and 1.0 <= d[1] <= 2.0 and 1.5 <= d[2] <= 3.0  # capped at max_backoff
    assert client.stats.by_status == {"500": 1, "502": 1, "503": 1}


def test_gives_up_after_max_retries(serve):
    srv = serve({"score": [Reply(status=500, raw=b"down")] * 10})
    client = _client(srv, max_retries=2)
    with pytest.raises(EndpointError, match=r"HTTP 500: down \(gave up after 3 attempts\)") as info:
        client.chat("m", MSG, task="score")
    assert not info.value.fatal
    assert (client.stats.requests, client.stats.retries, client.stats.gave_up) == (3, 2, 1)
    assert len(srv.requests("score")) == 3


def test_timeout_is_retried(serve):
    srv = serve({"paragraph": [Reply("late", delay=2.0), "on time"]})
    client = _client(srv, timeout=0.3)
    assert client.chat("m", MSG, task="paragraph").text == "on time"
    assert client.stats.by_status == {"timeout": 1} and client.stats.retries == 1


def test_malformed_answers_are_retried(serve):
    srv = serve({"score": [Reply(raw=b"<html>gateway</html>"), Reply(raw=b'{"choices": []}'),
                           Reply(raw=b'{"choices": [{"message": {"role": "assistant"}}]}'), "6"]})
    client = _client(srv)
    assert client.chat("m", MSG, task="score").text == "6"
    assert client.stats.by_status == {"malformed": 3}


def test_a_rejected_request_is_not_retried(serve):
    srv = serve({"score": [Reply(status=400, raw=b'{"error": "image too large"}'), "6"]})
    client = _client(srv)
    with pytest.raises(EndpointError, match="HTTP 400") as info:
        client.chat("m", MSG, task="score")
    assert not info.value.fatal and client.stats.requests == 1 and client.delays == []


def test_wrong_api_key_is_fatal_and_names_the_option(serve):
    srv = serve(api_key="secret")
    with pytest.raises(EndpointError, match="check the API key") as info:
        _client(srv, api_key="wrong").chat("m", MSG)
    assert info.value.fatal and info.value.status == 401
    assert _client(srv, api_key="secret").chat("m", MSG, task="score").text  # the right key works
    assert srv.requests()[-1].headers["authorization"] == "Bearer secret"


def test_connection_refused_is_retried_then_reported():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed when the block ends: nothing listens there
    waits: list[float] = []
    client = ChatClient(f"http://127.0.0.1:{port}", max_retries=2, sleep=waits.append)
    with pytest.raises(EndpointError, match="connection error"):
        client.chat("m", MSG)
    assert client.stats.by_status == {"connection": 3} and len(waits) == 2


def test_usage_is_summed_and_body_carries_the_parameters(serve):
    srv = serve({"positives": [Reply("a", usage={"prompt_tokens": 100, "completion_tokens": 7}),
                               Reply("b", usage={"prompt_tokens": 50, "completion_tokens": 3, "total_tokens": 53})]})
    client = _client(srv)
    client.chat("gen", MSG, task="positives", temperature=0.7, top_p=0.9, max_tokens=160, seed=None)
    client.chat("gen", MSG, task="positives", temperature=0.7)
    s = client.stats
    assert (s.prompt_tokens, s.completion_tokens, s.total_tokens) == (150, 10, 160)
    body = srv.requests("positives")[0].body
    assert (body["model"], body["temperature"], body["top_p"], body["max_tokens"]) == ("gen", 0.7, 0.9, 160)
    assert "seed" not in body and body["stream"] is False


def test_cancel_stops_a_backoff_wait(serve):
    from engine.errors import JobCancelled
    from engine.jobs import CancelToken

    srv = serve({"score": [Reply(status=503, headers={"Retry-After": "120"}, raw=b"")]})
    token = CancelToken()
    client = ChatClient(srv.url, cancel=token)
    import threading

    threading.Timer(0.3, token.cancel).start()
    t0 = time.monotonic()
    with pytest.raises(JobCancelled):
        client.chat("m", MSG, task="score")
    # Not a speed check: an uninterruptible wait would take the server's full 120 s.
    assert time.monotonic() - t0 < 60


def test_chat_url_and_retry_after_forms():
    assert chat_url("http://h:1") == "http://h:1/v1/chat/completions"
    assert chat_url("http://h:1/v1/") == "http://h:1/v1/chat/completions"
    assert chat_url("https://h/api/v1/chat/completions") == "https://h/api/v1/chat/completions"
    with pytest.raises(Exception, match="http:// or https://"):
        chat_url("localhost:8000")
    assert parse_retry_after("3") == 3.0 and parse_retry_after("0.5") == 0.5
    assert parse_retry_after(None) is None and parse_retry_after("soon") is None
    date = email.utils.formatdate(1_000_100, usegmt=True)
    assert parse_retry_after(date, now=1_000_000) == pytest.approx(100.0)
    assert parse_retry_after(email.utils.formatdate(10, usegmt=True), now=1_000_000) == 0.0
