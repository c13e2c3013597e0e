"""Model registry, import, verify and pull (against a real HTTP server on loopback).

Everything is offline: the "hub" is an http.server thread on 127.0.0.1 that speaks the parts of the
Hugging Face protocol a pull uses (ranged GET on /{repo}/resolve/{revision}/{file}, with
X-Repo-Commit / ETag / Content-Length headers). The bounds on what a pull reads (overlong bodies,
stalls, Ctrl+C, requests made) are tested in tests/reliability/test_pulls.py.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import re
import shutil
import socket
import sys
import time
import types
from collections.abc import Iterator
from dataclasses import replace as dc_replace
from pathlib import Path

import numpy as np
import pytest

from engine.config import Paths, get_paths
from engine.errors import (
    JobCancelled,
    ModelError,
    ModelIntegrityError,
    ModelNotInstalledError,
    OfflineError,
)
from engine.jobs import CancelToken, Progress
from engine.models import registry
from engine.models.download import import_model, pull_model
from engine.models.registry import (
    MANIFEST_NAME,
    ModelSpec,
    get_spec,
    installed_model_dir,
    list_models,
    load_embedder,
    verify_model,
)
from tests.fake_hub import FakeHub, running_hub

HAVE_BLIP = importlib.util.find_spec("engine.backends.blip.embedder") is not None
HAVE_CHECKPOINTS = importlib.util.find_spec("engine.backends.blip.checkpoints") is not None

REPO = "acme/blip-test"
REV = "0123456789abcdef0123456789abcdef01234567"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def paths(tmp_path: Path) -> Paths:
    return get_paths(tmp_path / "home").ensure()


def make_fake_hf_folder(folder: Path) -> Path:
    """A minimal HF-style BLIP folder: enough for import/verify, not for running the model."""
    from safetensors.numpy import save_file

    folder.mkdir(parents=True)
    (folder / "config.json").write_text(
        json.dumps({"model_type": "blip", "architectures": ["BlipForImageTextRetrieval"]})
    )
    save_file({"w": np.arange(12, dtype=np.float32).reshape(3, 4)}, str(folder / "model.safetensors"))
    (folder / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nphoto\n")
    (folder / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    (folder / "special_tokens_map.json").write_text(json.dumps({"pad_token": "[PAD]"}))
    (folder / "preprocessor_config.json").write_text(json.dumps({"image_size": 384}))
    return folder


@pytest.fixture
def hf_folder(tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    """A fresh, writable model folder: the tiny random BLIP checkpoint if available, else a fake one."""
    dst = tmp_path / "src-model"
    if HAVE_CHECKPOINTS:
        shutil.copytree(request.getfixturevalue("blip_tiny_checkpoint"), dst)
        return dst
    return make_fake_hf_folder(dst)


def flip_byte(path: Path, offset: int = -100) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def no_staging_left(paths: Paths) -> bool:
    return not [d for d in paths.models.iterdir() if d.name.startswith(".")]


# --- registry -------------------------------------------------------------------------------


def test_unknown_model_name_lists_known_ones() -> None:
    with pytest.raises(ModelError) as ei:
        get_spec("no-such-model")
    msg = str(ei.value)
    for name in registry.known_model_names():
        assert name in msg
    assert "blip-itm-base-coco" in msg


def test_registered_specs_pin_commits_and_hashes() -> None:
    base = get_spec("blip-itm-base-coco")
    assert base.repo_id == "Salesforce/blip-itm-base-coco"
    assert re.fullmatch(r"[0-9a-f]{40}", base.revision or "")
    # The weights are pinned; the small git files are not (no published SHA-256 for them).
    assert (
        base.files["pytorch_model.bin"] == "017fb3e7f4e125f13a8a4717f1402dbe0d0bb877474b4a203db13a4447b0227f"
    )
    assert "config.json" in base.unpinned_files
    demo = get_spec("sceneworld-mini")
    assert demo.bundled and demo.repo_id is None
    with pytest.raises(ValueError):
        ModelSpec("x", "blip", "", "a/b", "main", {}, 1, 1, 1)  # a branch name is not a pin
    with pytest.raises(ValueError):
        ModelSpec("x", "blip", "", "a/b", REV, {"f": "not-a-hash"}, 1, 1, 1)


def test_list_models_before_anything_is_installed(paths: Paths) -> None:
    statuses = {s.name: s for s in list_models(paths)}
    assert set(registry.known_model_names()) <= set(statuses)
    assert not statuses["blip-itm-base-coco"].installed
    assert statuses["sceneworld-mini"].bundled


def test_missing_model_message_says_how_to_get_it(paths: Paths) -> None:
    with pytest.raises(ModelNotInstalledError) as ei:
        load_embedder("blip-itm-base-coco", paths)
    msg = str(ei.value)
    assert "longlens models pull blip-itm-base-coco" in msg
    assert "longlens models import DIR --name blip-itm-base-coco" in msg
    assert "offline" in msg
    with pytest.raises(ModelNotInstalledError):
        verify_model("blip-itm-base-coco", paths)


def test_bundled_demo_model_loads_and_cannot_be_pulled(paths: Paths, monkeypatch) -> None:
    from engine.models import registry

    emb = load_embedder("sceneworld-mini", paths)
    assert emb.model_id == "sceneworld-mini"
    with pytest.raises(ModelError, match="bundled"):
        next(pull_model("sceneworld-mini", paths))
    # A build that does not ship the weights says so instead of failing obscurely.
    monkeypatch.setattr(registry, "bundled_model_dir", lambda name: paths.data / "nowhere")
    with pytest.raises(ModelNotInstalledError, match="sceneworld-mini"):
        load_embedder("sceneworld-mini", paths)


@pytest.mark.parametrize("bad", ["../evil", "a/b", ".hidden", "", "x" * 101, "name."])
def test_unsafe_names_are_refused(paths: Paths, hf_folder: Path, bad: str) -> None:
    with pytest.raises(ModelError, match="invalid model name"):
        import_model(hf_folder, bad, paths)


# --- import / verify / load -------------------------------------------------------------------


def test_import_list_verify(paths: Paths, hf_folder: Path) -> None:
    (hf_folder / "README.md").write_text("card")
    (hf_folder / "tf_model.h5").write_bytes(b"not copied")
    installed = import_model(hf_folder, "my-blip", paths)

    assert installed == paths.models / "my-blip"
    assert installed_model_dir("my-blip", paths) == installed
    assert not (installed / "tf_model.h5").exists()
    manifest = json.loads((installed / MANIFEST_NAME).read_text())
    assert manifest["name"] == "my-blip" and manifest["source"] == "import" and manifest["backend"] == "blip"
    weights = (hf_folder / "model.safetensors").read_bytes()
    assert manifest["files"]["model.safetensors"] == {"sha256": sha256(weights), "size": len(weights)}
    assert set(manifest["files"]) >= {"config.json", "model.safetensors", "vocab.txt", "README.md"}

    status = {s.name: s for s in list_models(paths, verify=True)}["my-blip"]
    assert status.installed and not status.registered and status.verified is True
    assert status.location == installed and status.size_bytes == sum(
        e["size"] for e in manifest["files"].values()
    )

    report = verify_model("my-blip", paths)
    assert report.ok, report.summary()
    assert {c.filename for c in report.files} == set(manifest["files"])
    assert no_staging_left(paths)


def test_import_under_existing_name_needs_replace(paths: Paths, hf_folder: Path) -> None:
    import_model(hf_folder, "m", paths)
    (hf_folder / "README.md").write_text("v2")
    with pytest.raises(ModelError, match="already exists"):
        import_model(hf_folder, "m", paths)
    assert "README.md" not in json.loads((paths.models / "m" / MANIFEST_NAME).read_text())["files"]
    import_model(hf_folder, "m", paths, replace=True)
    assert (paths.models / "m" / "README.md").read_text() == "v2"
    assert verify_model("m", paths).ok
    assert no_staging_left(paths)


def test_tampered_weights_fail_verify_and_load(paths: Paths, hf_folder: Path) -> None:
    installed = import_model(hf_folder, "m", paths)
    flip_byte(installed / "model.safetensors")

    report = verify_model("m", paths)
    assert not report.ok
    (bad,) = report.failures
    assert bad.filename == "model.safetensors" and bad.status == "mismatch"
    assert bad.actual_sha256 != bad.expected_sha256
    with pytest.raises(ModelIntegrityError, match="re-import"):
        load_embedder("m", paths)
    assert {s.name: s for s in list_models(paths, verify=True)}["m"].verified is False


def test_verify_reads_a_file_again_only_when_it_changed(paths: Paths, hf_folder: Path, monkeypatch) -> None:
    import os

    from engine.models import registry

    installed = import_model(hf_folder, "m", paths)
    assert verify_model("m", paths).ok
    reads: list[str] = []
    real = registry.sha256_file
    monkeypatch.setattr(registry, "sha256_file", lambda p: reads.append(Path(p).name) or real(p))
    assert verify_model("m", paths).ok and reads == []  # nothing changed: nothing read again
    weights = installed / "model.safetensors"
    st = weights.stat()
    flip_byte(weights)  # same size: the new modification time is what makes it read again
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns + 1))  # coarse clocks: at least 1 ns later
    report = verify_model("m", paths)
    assert reads == ["model.safetensors"] and [f.filename for f in report.failures] == ["model.safetensors"]


def test_missing_and_unexpected_files_fail_verify(paths: Paths, hf_folder: Path) -> None:
    installed = import_model(hf_folder, "m", paths)
    (installed / "vocab.txt").unlink()
    (installed / "pytorch_model.bin").write_bytes(b"dropped in later")
    report = verify_model("m", paths)
    statuses = {c.filename: c.status for c in report.failures}
    assert statuses == {"vocab.txt": "missing", "pytorch_model.bin": "unexpected"}
    with pytest.raises(ModelIntegrityError):
        load_embedder("m", paths)


@pytest.mark.parametrize("pickle_name", ["pytorch_model.bin", "weights.pt", "model.pth", "x.pkl"])
def test_import_refuses_pickles(paths: Paths, hf_folder: Path, pickle_name: str) -> None:
    (hf_folder / pickle_name).write_bytes(b"\x80\x04pickle")
    with pytest.raises(ModelIntegrityError, match="pickle") as ei:
        import_model(hf_folder, "m", paths)
    assert pickle_name in str(ei.value)
    assert installed_model_dir("m", paths) is None
    assert no_staging_left(paths)


def test_import_refuses_symlink_outside(paths: Paths, hf_folder: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere.json"
    outside.write_text("{}")
    (hf_folder / "tokenizer_config.json").unlink()
    (hf_folder / "tokenizer_config.json").symlink_to(outside)
    with pytest.raises(ModelIntegrityError, match="outside"):
        import_model(hf_folder, "m", paths)
    assert installed_model_dir("m", paths) is None


def test_import_follows_hf_cache_snapshot_links(paths: Paths, hf_folder: Path, tmp_path: Path) -> None:
    # huggingface_hub's cache: snapshots/<commit>/<file> -> ../../blobs/<hash>
    repo = tmp_path / "models--acme--blip"
    snap = repo / "snapshots" / REV
    (repo / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    for f in hf_folder.iterdir():
        blob = repo / "blobs" / sha256(f.read_bytes())
        shutil.copyfile(f, blob)
        (snap / f.name).symlink_to(Path("../../blobs") / blob.name)
    installed = import_model(snap, "m", paths)
    assert not (installed / "model.safetensors").is_symlink()
    assert verify_model("m", paths).ok


def test_import_requires_config_and_valid_safetensors(paths: Paths, hf_folder: Path) -> None:
    (hf_folder / "model.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(ModelIntegrityError, match="safetensors"):
        import_model(hf_folder, "m", paths)
    (hf_folder / "model.safetensors").unlink()
    with pytest.raises(ModelError, match="no safetensors weights"):
        import_model(hf_folder, "m", paths)
    (hf_folder / "config.json").unlink()
    with pytest.raises(ModelError, match="config.json"):
        import_model(hf_folder, "m", paths)
    assert installed_model_dir("m", paths) is None
    assert no_staging_left(paths)


def test_import_refuses_non_blip_config(paths: Paths, hf_folder: Path) -> None:
    cfg = json.loads((hf_folder / "config.json").read_text())
    cfg["model_type"] = "clip"
    (hf_folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelError, match="model_type"):
        import_model(hf_folder, "m", paths)


def test_load_embedder_passes_install_to_backend(
    paths: Paths, hf_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Routing only: a stand-in BlipEmbedder records what load_embedder gives it."""
    calls: list[tuple[Path, dict]] = []

    class StubEmbedder:
        def __init__(self, checkpoint_dir: Path, **kwargs: object) -> None:
            calls.append((checkpoint_dir, kwargs))

    stub = types.ModuleType("engine.backends.blip.embedder")
    stub.BlipEmbedder = StubEmbedder  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "engine.backends.blip.embedder", stub)
    installed = import_model(hf_folder, "blip-itm-base-coco", paths)
    load_embedder("blip-itm-base-coco", paths, device="cpu")
    from engine.models.registry import installed_identity

    ((where, kwargs),) = calls
    assert where == installed
    assert kwargs == {
        "device": "cpu",
        "text_tower_dir": None,
        "model_id": "blip-itm-base-coco",
        "compute": "fast",  # the CPU/GPU fast path is what users get (engine/backends/blip/embedder.py)
        "default_text_tokens": 128,
        # What keys its vectors: the manifest's hashes (issue 16 item 2), not the name.
        "identity": installed_identity("blip-itm-base-coco", paths).image,
        "text_identity": installed_identity("blip-itm-base-coco", paths).text,
    }
    assert str(kwargs["identity"]).startswith("blip-itm-base-coco@")


@pytest.mark.skipif(not (HAVE_BLIP and HAVE_CHECKPOINTS), reason="engine.backends.blip.embedder not available yet")
def test_imported_random_blip_loads_and_encodes(paths: Paths, hf_folder: Path) -> None:
    from PIL import Image

    from engine.models.base import Embedder

    import_model(hf_folder, "tiny-blip", paths)
    emb = load_embedder("tiny-blip", paths, device="cpu")
    assert isinstance(emb, Embedder)
    assert emb.model_id == "tiny-blip"
    images = [Image.new("RGB", (40, 30), (200, 30, 30)), Image.new("RGB", (32, 32), (10, 10, 240))]
    vecs = emb.encode_images(images)
    assert vecs.shape == (2, emb.dim) and vecs.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, rtol=1e-4)
    assert not np.allclose(vecs[0], vecs[1])


# --- a fake hub on loopback (tests/fake_hub.py) ---------------------------------------------


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    with running_hub(monkeypatch) as h:
        yield h


def publish(hub: FakeHub, folder: Path, *, pin: bool = True, name: str = "test-blip") -> ModelSpec:
    files = {}
    for f in sorted(folder.iterdir()):
        if f.is_file():
            data = f.read_bytes()
            hub.files[(REPO, REV, f.name)] = data
            files[f.name] = sha256(data) if pin else None
    return ModelSpec(
        name, "blip", "test model", REPO, REV, files, dim=256, image_size=384, default_text_tokens=128
    )


def run_job(job: Iterator[Progress]) -> list[Progress]:
    reports = []
    try:
        while True:
            reports.append(next(job))
    except StopIteration as stop:
        reports.append(Progress("returned", extra={"value": stop.value}))
    return reports


# --- pull ------------------------------------------------------------------------------------


def test_pull_installs_verifies_and_reports_progress(paths: Paths, hub: FakeHub, hf_folder: Path) -> None:
    spec = publish(hub, hf_folder)
    reports = run_job(pull_model(spec, paths, endpoint=hub.url))

    final = reports[-1].extra["value"]
    assert final == paths.models / "test-blip" == installed_model_dir("test-blip", paths)
    stages = [r.stage for r in reports]
    assert stages[0] == "resolve" and "download" in stages and stages[-2] == "done"
    downloads = [r for r in reports if r.stage == "download"]
    total = sum(len(d) for k, d in hub.files.items())
    assert downloads[-1].total == total and downloads[-1].done == total
    assert [r.done for r in downloads] == sorted(r.done for r in downloads)  # monotonic

    assert verify_model("test-blip", paths).ok
    manifest = json.loads((final / MANIFEST_NAME).read_text())
    assert manifest["source"] == "pull" and manifest["repo_id"] == REPO and manifest["revision"] == REV
    assert {f: e["sha256"] for f, e in manifest["files"].items()} == spec.files
    # One GET per pinned file at the pinned revision and nothing else; the download cache is cleaned
    # up after install.
    assert sorted(hub.requests) == sorted(("GET", f"/{REPO}/resolve/{REV}/{f}", None) for f in spec.files)
    assert not (paths.cache / "downloads" / REPO.replace("/", "--") / REV).exists()
    assert no_staging_left(paths)

    # A second pull of an intact install downloads nothing.
    n = len(hub.log)
    assert run_job(pull_model(spec, paths, endpoint=hub.url))[-2].stage == "done"
    assert len(hub.log) == n


def test_pull_reads_hf_endpoint_at_call_time(
    paths: Paths, hub: FakeHub, hf_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = publish(hub, hf_folder)
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    run_job(pull_model(spec, paths))
    assert verify_model("test-blip", paths).ok


def test_pull_refuses_bytes_that_do_not_match_the_pin(paths: Paths, hub: FakeHub, hf_folder: Path) -> None:
    spec = publish(hub, hf_folder)
    good = hub.files[(REPO, REV, "model.safetensors")]
    bad = bytearray(good)
    bad[-10] ^= 0xFF
    hub.files[(REPO, REV, "model.safetensors")] = bytes(bad)

    with pytest.raises(ModelIntegrityError) as ei:
        run_job(pull_model(spec, paths, endpoint=hub.url))
    msg = str(ei.value)
    assert "model.safetensors" in msg and sha256(good) in msg and sha256(bytes(bad)) in msg
    assert installed_model_dir("test-blip", paths) is None
    assert not (paths.models / "test-blip").exists()
    cached = paths.cache / "downloads" / REPO.replace("/", "--") / REV
    assert not list(cached.glob("model.safetensors*")), "the bad file must be deleted"
    assert no_staging_left(paths)

    # Once the hub serves the right bytes, a re-pull downloads the file again and installs.
    hub.files[(REPO, REV, "model.safetensors")] = good
    before = len(hub.gets("model.safetensors"))
    run_job(pull_model(spec, paths, endpoint=hub.url))
    assert len(hub.gets("model.safetensors")) == before + 1
    assert verify_model("test-blip", paths).ok


def test_interrupted_pull_resumes_on_the_next_pull(paths: Paths, hub: FakeHub, hf_folder: Path) -> None:
    spec = publish(hub, hf_folder)
    size = len(hub.files[(REPO, REV, "model.safetensors")])
    # First attempt: the connection drops halfway and the hub then stays unavailable.
    hub.drop_once.add("model.safetensors")
    hub.down_after_drop = True  # and its next GET answers 503: the pull fails with the part kept
    with pytest.raises(OfflineError, match="again"):
        run_job(pull_model(spec, paths, endpoint=hub.url))
    assert installed_model_dir("test-blip", paths) is None
    part = paths.cache / "downloads" / REPO.replace("/", "--") / REV / "model.safetensors.part"
    kept = part.stat().st_size
    assert 0 < kept < size

    hub.unavailable.clear()
    run_job(pull_model(spec, paths, endpoint=hub.url))
    assert hub.gets("model.safetensors")[-1] == f"bytes={kept}-"  # continued, not restarted
    assert verify_model("test-blip", paths).ok


def test_dropped_connection_is_resumed_within_one_pull(paths: Paths, hub: FakeHub, hf_folder: Path) -> None:
    spec = publish(hub, hf_folder)
    hub.drop_once.add("model.safetensors")
    run_job(pull_model(spec, paths, endpoint=hub.url))
    ranges = hub.gets("model.safetensors")
    assert ranges[0] is None and ranges[-1] is not None and ranges[-1].startswith("bytes=")
    assert verify_model("test-blip", paths).ok


def test_offline_fails_fast(paths: Paths, hub: FakeHub, hf_folder: Path) -> None:
    spec = publish(hub, hf_folder)
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    t0 = time.monotonic()
    with pytest.raises(OfflineError) as ei:
        run_job(pull_model(spec, paths, endpoint=closed))
    assert time.monotonic() - t0 < 5
    assert "cannot reach the model hub" in str(ei.value)
    assert "longlens models import DIR --name test-blip" in str(ei.value)
    assert installed_model_dir("test-blip", paths) is None


def test_hf_hub_offline_is_respected(
    paths: Paths, hub: FakeHub, hf_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = publish(hub, hf_folder)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(OfflineError, match="offline mode"):
        run_job(pull_model(spec, paths, endpoint=hub.url))
    assert hub.log == []


def test_cancel_stops_the_job_and_installs_nothing(paths: Paths, hub: FakeHub, hf_folder: Path) -> None:
    spec = publish(hub, hf_folder)
    cancel = CancelToken()
    job = pull_model(spec, paths, endpoint=hub.url, cancel=cancel)
    seen = []
    with pytest.raises(JobCancelled):
        for report in job:
            seen.append(report.stage)
            if report.stage == "download":
                cancel.cancel()
    assert "download" in seen and "install" not in seen
    assert installed_model_dir("test-blip", paths) is None
    assert not (paths.models / "test-blip").exists()
    assert no_staging_left(paths)


def test_unpinned_files_need_explicit_trust(paths: Paths, hub: FakeHub, hf_folder: Path) -> None:
    spec = publish(hub, hf_folder, pin=False)
    with pytest.raises(ModelIntegrityError, match="Run again trusting unpinned files") as info:
        run_job(pull_model(spec, paths, endpoint=hub.url))
    assert info.value.settings == ("trust_unpinned",)  # the CLI names --trust-unpinned
    assert hub.log == [], "nothing may be fetched before the user agrees"

    run_job(pull_model(spec, paths, endpoint=hub.url, trust_unpinned=True))
    manifest = json.loads((paths.models / "test-blip" / MANIFEST_NAME).read_text())
    assert sorted(manifest["trusted_unpinned"]) == sorted(spec.files)
    for fname, entry in manifest["files"].items():
        assert entry["sha256"] == sha256(hub.files[(REPO, REV, fname)])
    # The recorded hashes make later tampering detectable.
    flip_byte(paths.models / "test-blip" / "model.safetensors")
    assert not verify_model("test-blip", paths).ok
    # ... and a re-pull repairs the install.
    run_job(pull_model(spec, paths, endpoint=hub.url, trust_unpinned=True))
    assert verify_model("test-blip", paths).ok


def _state_dict_bytes(folder: Path) -> tuple[bytes, dict]:
    import torch
    from safetensors.torch import load_file

    state = load_file(str(folder / "model.safetensors"))
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue(), state


def test_pinned_bin_is_loaded_weights_only_and_converted(paths: Paths, hub: FakeHub, hf_folder: Path) -> None:
    import torch
    from safetensors.torch import load_file

    bin_bytes, state = _state_dict_bytes(hf_folder)
    (hf_folder / "model.safetensors").unlink()
    spec = publish(hub, hf_folder)
    hub.files[(REPO, REV, "pytorch_model.bin")] = bin_bytes
    spec = dc_replace(spec, files={**spec.files, "pytorch_model.bin": sha256(bin_bytes)})

    reports = run_job(pull_model(spec, paths, endpoint=hub.url))
    assert "convert" in [r.stage for r in reports]
    installed = paths.models / "test-blip"
    assert not list(installed.glob("*.bin")) and not list(paths.cache.rglob("*.bin"))
    loaded = load_file(str(installed / "model.safetensors"))
    assert loaded.keys() == state.keys()
    for k in state:
        assert torch.equal(loaded[k], state[k])
    manifest = json.loads((installed / MANIFEST_NAME).read_text())
    assert manifest["converted_from"]["pytorch_model.bin"]["sha256"] == sha256(bin_bytes)
    assert "pytorch_model.bin" not in manifest["files"]
    assert verify_model("test-blip", paths).ok

    if HAVE_BLIP and HAVE_CHECKPOINTS:
        from PIL import Image

        vec = load_embedder("test-blip", paths, device="cpu").encode_images([Image.new("RGB", (20, 20))])
        assert vec.shape[0] == 1 and np.isfinite(vec).all()


class _RunsCode:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (Path.touch, (self.marker,))


def test_malicious_pinned_bin_is_refused_without_running_it(
    paths: Paths, hub: FakeHub, hf_folder: Path, tmp_path: Path
) -> None:
    import torch

    marker = tmp_path / "pwned"
    buf = io.BytesIO()
    torch.save({"w": torch.zeros(2), "x": _RunsCode(marker)}, buf)
    (hf_folder / "model.safetensors").unlink()
    spec = publish(hub, hf_folder)
    hub.files[(REPO, REV, "pytorch_model.bin")] = buf.getvalue()
    spec = dc_replace(spec, files={**spec.files, "pytorch_model.bin": sha256(buf.getvalue())})

    with pytest.raises(ModelIntegrityError, match="weights_only"):
        run_job(pull_model(spec, paths, endpoint=hub.url))
    assert not marker.exists()
    assert installed_model_dir("test-blip", paths) is None
    assert no_staging_left(paths)


def test_unpinned_pickle_is_refused_even_when_trusting(paths: Paths, hub: FakeHub, hf_folder: Path) -> None:
    spec = publish(hub, hf_folder)
    spec = dc_replace(spec, files={**spec.files, "pytorch_model.bin": None})
    with pytest.raises(ModelIntegrityError, match="pickle"):
        run_job(pull_model(spec, paths, endpoint=hub.url, trust_unpinned=True))
    assert hub.log == []


def test_missing_file_on_hub_is_a_model_error(paths: Paths, hub: FakeHub, hf_folder: Path) -> None:
    spec = publish(hub, hf_folder)
    spec = dc_replace(spec, files={**spec.files, "extra.json": sha256(b"{}")})
    with pytest.raises(ModelError, match="extra.json"):
        run_job(pull_model(spec, paths, endpoint=hub.url))
    assert installed_model_dir("test-blip", paths) is None


def test_a_server_that_is_not_a_hub_is_refused(paths: Paths, hub: FakeHub, hf_folder: Path) -> None:
    spec = publish(hub, hf_folder)
    hub.impostor = True
    with pytest.raises(OfflineError, match="X-Repo-Commit"):
        run_job(pull_model(spec, paths, endpoint=hub.url))
    assert installed_model_dir("test-blip", paths) is None
    # Its answers were refused on their headers: not a byte of any body was kept.
    cached = paths.cache / "downloads" / REPO.replace("/", "--") / REV
    assert not [p for p in cached.rglob("*") if p.is_file()]
