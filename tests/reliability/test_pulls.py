"""Checklist class 42: network reads are bounded. Model pulls against a real HTTP server on loopback
(tests/fake_hub.py) that misbehaves the ways a hostile or broken server does:

* a body longer than announced is cut at the announced (or pinned) size, never written past it,
  and deleted; an announcement larger than the pin allows is refused before a byte is read;
* a server that sends headers and then nothing ends the pull after the stall limit, with the part
  kept and the next pull continuing it with a Range GET;
* a real SIGINT to a child `python -m engine models pull` stalled mid-request exits 130 within a
  second, and neither that pull nor a complete one writes anything outside LONGLENS_HOME (HOME and
  TMPDIR are empty folders of the test's, walked afterwards);
* the hub's request log holds the pinned files' GETs and nothing else (no HEAD, no metadata or
  revision lookup, no telemetry), Range GETs only to continue a part.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import replace as dc_replace
from pathlib import Path

import pytest

from engine.config import Paths, get_paths
from engine.errors import ModelError, ModelIntegrityError, OfflineError
from engine.jobs import Progress
from engine.models import registry
from engine.models.download import GIT_TRACKED_MAX, download_cache_dir, pull_model
from engine.models.pins import git_blob_id, git_blob_pin, sha256_pin
from engine.models.registry import ModelSpec, PinnedCheckpoint, installed_model_dir, verify_model
from tests.fake_hub import OVERLONG_CAP, FakeHub, running_hub

ROOT = Path(__file__).resolve().parents[2]
REPO = "acme/bounded"
REV = "fedcba9876543210fedcba9876543210fedcba98"
CHUNK = 64 * 1024  # the most one socket read returns (httpcore's read size)


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    with running_hub(monkeypatch) as h:
        yield h


@pytest.fixture
def paths(tmp_path: Path) -> Paths:
    return get_paths(tmp_path / "home").ensure()


@pytest.fixture
def served(blip_tiny_checkpoint: Path) -> dict[str, bytes]:
    """A model's files as a hub serves them: the tiny BLIP's small git-tracked files and its 4 MB
    model.safetensors (an LFS file, read in many socket reads)."""
    return {p.name: p.read_bytes() for p in sorted(blip_tiny_checkpoint.iterdir()) if p.is_file()}


def spec_for(served: dict[str, bytes], name: str = "bounded") -> ModelSpec:
    """Every file pinned as a registered spec pins it: LFS files by SHA-256, the rest by git blob id."""
    files = {f: sha256_pin(hashlib.sha256(d).hexdigest()) if f.endswith(".safetensors") else git_blob_pin(git_blob_id(d))
             for f, d in served.items()}
    return ModelSpec(name, "blip", "test model", REPO, REV, files, dim=8, image_size=16, default_text_tokens=8)


def publish(hub: FakeHub, served: dict[str, bytes]) -> None:
    for fname, data in served.items():
        hub.files[(REPO, REV, fname)] = data


def run_job(job: Iterator[Progress]) -> None:
    for _ in job:
        pass


def cache_of(paths: Paths) -> Path:
    return paths.cache / "downloads" / REPO.replace("/", "--") / REV


def files_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if not p.is_dir())


# --- bodies longer than announced --------------------------------------------------------------


def test_a_body_longer_than_announced_is_cut_at_the_announced_size_and_deleted(
    paths: Paths, hub: FakeHub, served: dict[str, bytes],
) -> None:
    publish(hub, served)
    spec = spec_for(served)
    fname = "model.safetensors"
    # The hub's X-Linked-Size says how large the file is; the body has no Content-Length and goes on
    # (the file, then filler) for as long as the client reads, up to 256 MiB.
    hub.overlong[fname] = "unannounced"
    t0 = time.monotonic()
    with pytest.raises(ModelIntegrityError) as ei:
        run_job(pull_model(spec, paths, endpoint=hub.url, stall_s=5))
    elapsed = time.monotonic() - t0
    msg = str(ei.value)
    bound = len(served[fname])
    received = int(msg.split("stopped at ")[1].split(" bytes")[0])
    assert f"more than the {bound} bytes of {fname}" in msg and "nothing was installed" in msg
    assert bound < received <= bound + CHUNK  # stopped at the first read that went past the bound
    assert not [p for p in cache_of(paths).rglob(f"{fname}*")], "the overlong download is deleted"
    assert installed_model_dir(spec.name, paths) is None
    hub.close()  # the server's thread notices the hang-up and counts what it managed to send
    print(f"\noverlong body: bound {bound} B, received {received} B, server sent {hub.sent[fname]} B "
          f"of up to {OVERLONG_CAP}, refused after {elapsed:.2f} s")
    assert hub.sent[fname] < 32 * 1024 * 1024, "the client stopped reading at the bound"


def test_nothing_past_the_bound_reaches_the_disk(tmp_path: Path, hub: FakeHub, served: dict[str, bytes]) -> None:
    """The same overlong body, pulled in a child whose files may not grow past the bound
    (RLIMIT_FSIZE): a single byte written past it would kill the child with SIGXFSZ."""
    publish(hub, served)
    fname = "model.safetensors"
    hub.overlong[fname] = "unannounced"
    bound = len(served[fname])  # the largest file: nothing else the pull writes comes near it
    proc = run_child_pull(tmp_path, hub, spec_for(served), fsize_limit=bound)
    assert proc.returncode == 2, (proc.returncode, proc.stderr)  # an engine error, not SIGXFSZ (-25)
    assert f"more than the {bound} bytes of {fname}" in proc.stderr


def test_an_answer_announcing_more_than_the_pin_allows_is_refused_before_its_body(
    paths: Paths, hub: FakeHub, served: dict[str, bytes], monkeypatch: pytest.MonkeyPatch,
) -> None:
    publish(hub, served)
    spec = spec_for(served)
    # A git-tracked file (pinned by blob id): the hub keeps those under 10 MiB, whatever is announced.
    hub.overlong["config.json"] = "lying"  # Content-Length: 7 GB
    with pytest.raises(ModelIntegrityError, match="git-tracked file") as ei:
        run_job(pull_model(spec, paths, endpoint=hub.url))
    assert "7000000000 bytes for config.json" in str(ei.value)
    assert GIT_TRACKED_MAX < 7 * 1000**3
    # A file whose size is pinned (Long-CLIP's checkpoints): an answer announcing another size.
    del hub.overlong["config.json"]
    data = served["model.safetensors"]
    sha = hashlib.sha256(data).hexdigest()
    monkeypatch.setitem(registry.OPENAI_LAYOUT_CHECKPOINTS, "longclip-b",
                        PinnedCheckpoint(REPO, REV, "model.safetensors", sha, len(data)))
    hub.claimed_size["model.safetensors"] = len(data) + 1
    hub.overlong["model.safetensors"] = "unannounced"  # X-Linked-Size: the claimed size
    with pytest.raises(ModelIntegrityError, match=f"its pin is for a file of {len(data)} bytes"):
        run_job(pull_model(spec, paths, endpoint=hub.url))
    hub.close()
    assert hub.sent.get("config.json", 0) == 0 or hub.sent["config.json"] < OVERLONG_CAP // 8
    assert not [p for p in cache_of(paths).rglob("*") if p.is_file() and p.name.startswith(("config", "model"))]


def test_a_pinned_size_bounds_a_body_that_announces_none(paths: Paths, hub: FakeHub, served: dict[str, bytes],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """No Content-Length and no X-Linked-Size: the registry's pinned size is the bound; a file of
    no known size at all is refused before its body."""
    publish(hub, served)
    spec = spec_for(served)
    data = served["model.safetensors"]
    monkeypatch.setitem(registry.OPENAI_LAYOUT_CHECKPOINTS, "longclip-b",
                        PinnedCheckpoint(REPO, REV, "model.safetensors", hashlib.sha256(data).hexdigest(), len(data)))
    hub.hide_linked_size = True
    hub.overlong["vocab.txt"] = "unannounced"  # pinned by blob id: no size known anywhere
    with pytest.raises(ModelIntegrityError, match="did not say how large vocab.txt"):
        run_job(pull_model(spec, paths, endpoint=hub.url, stall_s=5))
    assert not [p for p in cache_of(paths).rglob("*") if p.is_file() and p.stat().st_size], \
        "answers are checked before any body is read: nothing was written"
    hub.overlong = {"model.safetensors": "unannounced"}  # its pinned size is known
    with pytest.raises(ModelIntegrityError, match=f"more than the {len(data)} bytes of model.safetensors"):
        run_job(pull_model(spec, paths, endpoint=hub.url, stall_s=5))
    assert not list(cache_of(paths).glob("model.safetensors*"))


def test_a_pull_larger_than_the_free_space_is_refused_before_any_body(
    paths: Paths, hub: FakeHub, served: dict[str, bytes],
) -> None:
    publish(hub, served)
    hub.claimed_size["model.safetensors"] = 10**15  # 1 PB, no pin names its size: the announcement stands
    with pytest.raises(ModelError, match=r"bounded needs 1000000\.0 GB more in .* is free there"):
        run_job(pull_model(spec_for(served), paths, endpoint=hub.url))
    assert not [p for p in cache_of(paths).rglob("*") if p.is_file() and p.stat().st_size]


# --- stalls ---------------------------------------------------------------------------------------


@pytest.mark.serial  # measures the clock
@pytest.mark.timeout(60)  # a pull that ignores its stall limit or the cancel would hang here
def test_a_stalled_body_ends_the_pull_after_the_stall_limit_and_the_next_pull_continues_it(
    paths: Paths, hub: FakeHub, served: dict[str, bytes],
) -> None:
    publish(hub, served)
    spec = spec_for(served)
    fname = "model.safetensors"
    first = 200 * 1024
    hub.stall[fname] = first  # 200 KiB, then silence
    stall_s = 1.0
    with pytest.raises(OfflineError) as ei:
        run_job(pull_model(spec, paths, endpoint=hub.url, stall_s=stall_s))
    noticed = time.monotonic() - hub.stalled_at
    msg = str(ei.value)
    assert f"stopped sending {fname}" in msg and "no data for 1 seconds" in msg
    assert f"The partial download ({first} bytes) is kept; pull again to continue it." in msg
    assert stall_s <= noticed < stall_s + 1.5, noticed
    assert hub.stall_ended.wait(5), "the client hung up on the stalled connection"
    print(f"\nstall limit {stall_s} s: the pull failed {noticed:.2f} s after the last byte")

    del hub.stall[fname]
    n = len(hub.requests)
    run_job(pull_model(spec, paths, endpoint=hub.url, stall_s=stall_s))
    assert verify_model(spec.name, paths).ok
    # The second pull asked for the file it lacked, from where the first one stopped, and nothing else.
    assert hub.requests[n:] == [("GET", f"/{REPO}/resolve/{REV}/{fname}", f"bytes={first}-")]


@pytest.mark.serial  # measures the clock
@pytest.mark.timeout(60)  # a pull that ignores its stall limit or the cancel would hang here
def test_a_hub_that_never_answers_ends_the_pull_after_the_stall_limit(
    paths: Paths, hub: FakeHub, served: dict[str, bytes],
) -> None:
    publish(hub, served)
    hub.silent = True  # the connection is accepted; no status line ever comes
    t0 = time.monotonic()
    with pytest.raises(OfflineError, match="did not answer the request for") as ei:
        run_job(pull_model(spec_for(served), paths, endpoint=hub.url, stall_s=0.5))
    elapsed = time.monotonic() - t0
    assert "no data for 0.5 seconds" in str(ei.value) and 0.5 <= elapsed < 2.5, elapsed


# --- Ctrl+C, HOME, and the requests a pull makes, with real child processes ---------------------


def child_env(tmp_path: Path, hub: FakeHub) -> tuple[dict[str, str], dict[str, Path]]:
    """An environment whose HOME, temp folder and XDG folders are empty folders of the test's."""
    dirs = {k: tmp_path / k for k in ("user-home", "tmpdir", "longlens-home")}
    for d in dirs.values():
        d.mkdir()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HF_", "HUGGINGFACE", "XDG_", "TRANSFORMERS", "TORCH_HOME", "LONGLENS_"))}
    env.update(PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), HOME=str(dirs["user-home"]),
               TMPDIR=str(dirs["tmpdir"]), LONGLENS_HOME=str(dirs["longlens-home"]), HF_ENDPOINT=hub.url,
               NO_PROXY="127.0.0.1,localhost", PYTHONUNBUFFERED="1")
    return env, dirs


def run_child_pull(tmp_path: Path, hub: FakeHub, spec: ModelSpec, *, fsize_limit: int | None = None,
                   ) -> subprocess.CompletedProcess[str]:
    """`longlens models pull` of `spec` in a child process (the spec registered there first)."""
    env, _ = child_env(tmp_path, hub)
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps({"name": spec.name, "repo_id": spec.repo_id, "revision": spec.revision,
                                     "files": dict(spec.files)}))
    code = textwrap.dedent(f"""
        import json, sys
        from engine.models import registry
        s = json.load(open({str(spec_file)!r}))
        registry.register_model(registry.ModelSpec(s["name"], "blip", "test model", s["repo_id"], s["revision"],
                                                   s["files"], dim=8, image_size=16, default_text_tokens=8))
        from engine.cli import main
        sys.exit(main(["models", "pull", s["name"]]))
    """)

    def limit() -> None:
        if fsize_limit is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize_limit, fsize_limit))

    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                          preexec_fn=limit)


@pytest.mark.serial  # measures the clock
@pytest.mark.timeout(60)  # a pull that ignores its stall limit or the cancel would hang here
def test_one_ctrl_c_stops_a_stalled_pull_within_a_second(tmp_path: Path, hub: FakeHub) -> None:
    """`python -m engine models pull longclip-b` (the registered spec) against a hub whose answer
    sends its headers and then nothing: one SIGINT, and the child exits 130 at once."""
    spec = registry.get_spec("longclip-b")
    fname = next(iter(spec.files))
    pin = registry.OPENAI_LAYOUT_CHECKPOINTS["longclip-b"]
    hub.files[(spec.repo_id, spec.revision, fname)] = b"x" * 100_000
    hub.claimed_size[fname] = pin.size  # the size its pin names, so the answer is accepted
    hub.stall[fname] = 100_000  # then silence
    env, dirs = child_env(tmp_path, hub)
    proc = subprocess.Popen([sys.executable, "-m", "engine", "models", "pull", "longclip-b"], env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    part = download_cache_dir(spec, get_paths(dirs["longlens-home"])) / f"{fname}.part"
    try:
        assert hub.stalled.wait(60), "the child's request never arrived"
        deadline = time.monotonic() + 30
        while not (part.is_file() and part.stat().st_size == 100_000):  # the child has written what came
            assert time.monotonic() < deadline and proc.poll() is None, "the child never wrote the bytes sent"
            time.sleep(0.01)
        sent = time.monotonic()
        os.kill(proc.pid, signal.SIGINT)
        rc = proc.wait(timeout=10)
        stopped = time.monotonic() - sent
    finally:
        proc.kill()
        proc.wait()
    out, err = proc.communicate()
    assert rc == 130, (rc, err)
    assert "cancelled: longclip-b was not installed; the 100.0 kB downloaded so far are kept" in err, err
    assert "Traceback" not in err
    assert hub.stall_ended.wait(2), "the child's connection was closed"
    print(f"\nCtrl+C during a stalled request: exit {rc} {stopped:.3f} s after SIGINT")
    assert stopped < 1.0, stopped
    # One request: the pinned file at the pinned revision. No HEAD, no API call, no telemetry.
    assert hub.requests == [("GET", f"/{spec.repo_id}/resolve/{spec.revision}/{fname}", None)]
    # Nothing written outside LONGLENS_HOME: the child's HOME and temp folder are as they were.
    assert files_under(dirs["user-home"]) == [] and files_under(dirs["tmpdir"]) == []
    assert not [p for p in dirs["user-home"].rglob("*")], "not even an empty cache folder"
    assert part.read_bytes() == b"x" * 100_000  # kept for the next pull


def test_a_complete_pull_asks_only_for_its_files_and_writes_only_into_longlens_home(
    tmp_path: Path, hub: FakeHub, served: dict[str, bytes],
) -> None:
    publish(hub, served)
    hub.redirect_lfs = True  # as huggingface.co: LFS files are a 302 to the CDN with X-Linked-Size
    spec = spec_for(served)
    proc = run_child_pull(tmp_path, hub, spec)
    dirs = {k: tmp_path / k for k in ("user-home", "tmpdir", "longlens-home")}
    assert proc.returncode == 0, proc.stderr
    assert "installed bounded in" in proc.stdout
    assert [p for p in dirs["user-home"].rglob("*")] == [] and files_under(dirs["tmpdir"]) == []
    home = get_paths(dirs["longlens-home"])
    assert verify_model("bounded", home).ok
    resolve = f"/{REPO}/resolve/{REV}"
    expected = [("GET", f"{resolve}/{f}", None) for f in served]
    expected.append(("GET", f"/cdn{resolve}/model.safetensors", None))  # the redirect's one hop
    assert sorted(hub.requests) == sorted(expected)
    print(f"\ncomplete pull of {len(served)} files: {len(hub.requests)} requests ({len(served)} GETs at the "
          "pinned revision, 1 redirect hop), nothing outside LONGLENS_HOME")


def test_a_pull_needs_no_hub_client_settings(
    paths: Paths, hub: FakeHub, served: dict[str, bytes], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """HF_* settings that would send the hub client elsewhere (its cache, telemetry, a token) change
    nothing: the pull does not use it. Only HF_ENDPOINT and HF_HUB_OFFLINE are honoured."""
    publish(hub, served)
    elsewhere = paths.cache.parent.parent / "hf-elsewhere"
    for var in ("HF_HOME", "HF_HUB_CACHE", "HF_XET_CACHE"):
        monkeypatch.setenv(var, str(elsewhere / var))
    monkeypatch.setenv("HF_TOKEN", "hf_secret_never_sent")
    run_job(pull_model(dc_replace(spec_for(served)), paths, endpoint=hub.url))
    assert not elsewhere.exists()
    assert all("authorization" not in {k.lower() for k in h} for h in hub.headers_seen)
