"""Installing CLIP-family models, over a fake hub on loopback (tests/fake_hub.py) and from folders:

* the registered clip-vit-base-patch16 file list, served with a tiny CLIP's bytes (HF-layout
  pytorch_model.bin, pinned), is downloaded, converted to safetensors without running pickle code,
  checked as CLIP and loaded by the CLIP backend; a file that does not match its pin is refused
  with which file, the expected and the found digest, and how to get it again;
* `longlens models pull longclip-b`: the registered Long-CLIP entry with its pin injected for a
  random OpenAI-layout .pt the hub serves: downloaded (resumed after a cut), checked by SHA-256
  before anything is unpickled, converted into a CLIPModel folder with its manifest; a .pt that
  does not match is never unpickled and leaves nothing installed, one that needs code is refused;
* `models import` of a CLIP folder that has vocab.json and merges.txt but no tokenizer.json.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import threading
import time
from dataclasses import replace as dc_replace
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from engine.backends.clip.convert import convert_openai_checkpoint
from engine.backends.clip.embedder import ClipEmbedder
from engine.cli import main as cli_main
from engine.config import get_paths
from engine.errors import ModelIntegrityError, OfflineError
from engine.models.download import import_model, pull_model
from engine.models.pins import sha256_pin
from engine.models.registry import MANIFEST_NAME, get_spec, installed_model_dir, load_embedder, verify_model
from tests.engine.test_model_pins import register_spec  # noqa: F401  (a fixture)
from tests.engine.test_models_registry import REPO, REV, hub, run_job, sha256  # noqa: F401  (hub: a fixture)

TEXTS = ["a photo of a cat", "two dogs in the snow next to a wooden fence"]
LONG_TEXT = " ".join(["a red umbrella stands on the sand near a blue bucket while gulls circle above"] * 12)


@pytest.fixture
def served(tmp_path, hub, clip_b16_tiny_checkpoint):  # noqa: F811  (the imported fixture)
    """clip-vit-base-patch16's spec, pointed at the fake hub and pinned to the tiny model's bytes."""
    folder = tmp_path / "src"
    shutil.copytree(clip_b16_tiny_checkpoint, folder)
    buf = io.BytesIO()
    torch.save(load_file(str(folder / "model.safetensors")), buf)
    (folder / "pytorch_model.bin").write_bytes(buf.getvalue())
    spec = get_spec("clip-vit-base-patch16")
    files = {}
    for name in spec.files:
        data = (folder / name).read_bytes()
        hub.files[(REPO, REV, name)] = data
        files[name] = sha256(data)
    return dc_replace(spec, name="clip-test", repo_id=REPO, revision=REV, files=files), hub


def test_pull_of_a_clip_spec_installs_a_working_clip_model(tmp_path, served, clip_b16_tiny_checkpoint):
    spec, fake_hub = served
    paths = get_paths(tmp_path / "home").ensure()
    reports = run_job(pull_model(spec, paths, endpoint=fake_hub.url))
    assert "convert" in [r.stage for r in reports]
    installed = paths.models / "clip-test"
    assert not list(installed.glob("*.bin")) and verify_model("clip-test", paths).ok
    emb = load_embedder("clip-test", paths, device="cpu")
    assert emb.backend == "clip" and emb.max_text_tokens == 77
    direct = ClipEmbedder(clip_b16_tiny_checkpoint, device="cpu", compute="fast")
    np.testing.assert_allclose(emb.encode_texts(TEXTS), direct.encode_texts(TEXTS), atol=1e-6)


def test_a_served_file_that_does_not_match_its_pin_is_refused(tmp_path, served):
    spec, fake_hub = served
    good = fake_hub.files[(REPO, REV, "pytorch_model.bin")]
    fake_hub.files[(REPO, REV, "pytorch_model.bin")] = bad = good + b"\0"
    paths = get_paths(tmp_path / "home").ensure()
    with pytest.raises(ModelIntegrityError) as ei:
        run_job(pull_model(spec, paths, endpoint=fake_hub.url))
    msg = str(ei.value)
    # Which file, the pin and what was found, and how to get it again.
    assert "pytorch_model.bin of clip-test does not match its pin" in msg
    assert f"expected sha256 {sha256(good)}" in msg and f"got {sha256(bad)} ({len(bad)} bytes)" in msg
    assert "pull clip-test again" in msg and "import a copy you trust" in msg
    assert not (paths.models / "clip-test").exists()


# --- Long-CLIP: one OpenAI-layout .pt, pulled and converted ------------------------------------


def longclip_spec(pt: Path, name: str = "longclip-b"):
    """The registered Long-CLIP entry with its pin replaced by the test file's SHA-256."""
    real = get_spec(name)
    (fname,) = real.files
    return dc_replace(real, files={fname: sha256_pin(hashlib.sha256(pt.read_bytes()).hexdigest())}), fname


@pytest.fixture
def longclip_home(tmp_path, monkeypatch, hub):  # noqa: F811
    home = tmp_path / "home"
    monkeypatch.setenv("LONGLENS_HOME", str(home))
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    return home


def test_models_pull_longclip_downloads_checks_and_converts_the_pinned_pt(
    longclip_home, hub, register_spec, longclip_openai_tiny_pt, tmp_path, capsys,  # noqa: F811
):
    real = get_spec("longclip-b")
    assert real.fully_pinned and list(real.files) == ["longclip-B.pt"]
    spec, fname = longclip_spec(longclip_openai_tiny_pt)
    register_spec(spec)
    data = longclip_openai_tiny_pt.read_bytes()
    assert len(data) > 4 * 64 * 1024  # several download chunks: the cut below lands mid-file
    hub.files[(spec.repo_id, spec.revision, fname)] = data
    assert (spec.repo_id, spec.revision) == ("BeichenZhang/LongCLIP-B", real.revision)

    # A connection cut halfway (and the hub down after it) keeps the partial file; the next pull
    # continues it.
    hub.drop_once.add(fname)

    def unavailable_after_drop() -> None:
        while fname in hub.drop_once:
            time.sleep(0.01)
        hub.gets_unavailable = True

    watcher = threading.Thread(target=unavailable_after_drop, daemon=True)
    watcher.start()
    paths = get_paths(longclip_home).ensure()
    with pytest.raises(OfflineError, match="again"):
        run_job(pull_model("longclip-b", paths))
    watcher.join()
    hub.gets_unavailable = False
    part = paths.cache / "downloads" / "BeichenZhang--LongCLIP-B" / spec.revision / f"{fname}.part"
    kept = part.stat().st_size
    assert 0 < kept < len(data) and installed_model_dir("longclip-b", paths) is None

    capsys.readouterr()
    assert cli_main(["models", "pull", "longclip-b"]) == 0  # no trust setting: the one file is pinned
    out, err = capsys.readouterr()
    assert hub.gets(fname)[-1] == f"bytes={kept}-"
    final = installed_model_dir("longclip-b", paths)
    assert final is not None and f"installed longclip-b in {final}" in out
    assert "longclip-b: 1 files" in err and "already here from an earlier pull" in err

    manifest = json.loads((final / MANIFEST_NAME).read_text())
    assert manifest["source"] == "pull" and manifest["repo_id"] == "BeichenZhang/LongCLIP-B"
    assert manifest["converted_from"] == {fname: {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}}
    assert manifest["pinned"] == dict(spec.files) and manifest["trusted_unpinned"] == []
    assert {"config.json", "model.safetensors", "vocab.json", "merges.txt", "tokenizer.json",
            "preprocessor_config.json"} <= set(manifest["files"])
    assert not list(longclip_home.rglob("*.pt")) and not list(longclip_home.rglob("*.part"))
    assert not [d for d in paths.models.iterdir() if d.name.startswith(".") and d.is_dir()]
    assert verify_model("longclip-b", paths).ok

    # The installed model is the converter's folder: same embeddings, the whole 248 tokens read.
    direct = ClipEmbedder(run_convert(longclip_openai_tiny_pt, tmp_path / "direct"), device="cpu", compute="fast")
    emb = load_embedder("longclip-b", paths, device="cpu")
    assert (emb.backend, emb.max_text_tokens, emb.default_text_tokens) == ("clip", 248, 248)
    assert 77 < emb.token_count(LONG_TEXT) <= 248
    np.testing.assert_allclose(emb.encode_texts([LONG_TEXT, *TEXTS]), direct.encode_texts([LONG_TEXT, *TEXTS]),
                               atol=1e-6)
    image = Image.new("RGB", (80, 60), (30, 160, 90))
    np.testing.assert_allclose(emb.encode_images([image]), direct.encode_images([image]), atol=1e-6)


def run_convert(pt: Path, out: Path) -> Path:
    """The converter alone, on the same file: what `models convert` installs."""
    job = convert_openai_checkpoint(pt, out, sha256=hashlib.sha256(pt.read_bytes()).hexdigest())
    while True:
        try:
            next(job)
        except StopIteration as stop:
            return stop.value


def test_a_longclip_pt_off_its_pin_is_never_unpickled_and_nothing_is_installed(
    longclip_home, hub, register_spec, longclip_openai_tiny_pt, monkeypatch,  # noqa: F811
):
    spec, fname = longclip_spec(longclip_openai_tiny_pt)
    register_spec(spec)
    good = longclip_openai_tiny_pt.read_bytes()
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0xFF  # same size: only the hash tells
    hub.files[(spec.repo_id, spec.revision, fname)] = bytes(bad)
    loads: list[object] = []
    real_load = torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **k: loads.append(a) or real_load(*a, **k))

    paths = get_paths(longclip_home).ensure()
    with pytest.raises(ModelIntegrityError) as ei:
        run_job(pull_model("longclip-b", paths))
    msg = str(ei.value)
    assert f"{fname} of longclip-b does not match its pin" in msg
    assert f"expected sha256 {hashlib.sha256(good).hexdigest()}" in msg
    assert f"got {hashlib.sha256(bytes(bad)).hexdigest()}" in msg and "pull longclip-b again" in msg
    assert loads == [], "nothing is unpickled before the pin matched"
    assert installed_model_dir("longclip-b", paths) is None and not (paths.models / "longclip-b").exists()
    assert [p.name for p in paths.models.iterdir()] == []  # no staging folder, no lock file
    assert not list(longclip_home.rglob(f"{fname}*")), "the refused bytes are deleted"

    # The same refusal through the CLI, which names what to do.
    assert cli_main(["models", "pull", "longclip-b"]) != 0


class NeedsCode:
    """Unpickling this calls print: code, which weights_only refuses to run."""

    def __reduce__(self):
        return (print, ("this would run",))


def test_a_pinned_pt_that_needs_code_to_unpickle_is_refused_and_nothing_is_installed(
    longclip_home, hub, register_spec, tmp_path, capsys,  # noqa: F811
):
    pt = tmp_path / "longclip-B.pt"
    # A pickle whose loading would call a function (what weights_only refuses), pinned correctly.
    torch.save({"visual.proj": NeedsCode()}, pt)
    spec, fname = longclip_spec(pt)
    register_spec(spec)
    hub.files[(spec.repo_id, spec.revision, fname)] = pt.read_bytes()
    paths = get_paths(longclip_home).ensure()
    with pytest.raises(ModelIntegrityError, match="needs code to unpickle"):
        run_job(pull_model("longclip-b", paths))
    assert "this would run" not in capsys.readouterr().out
    assert installed_model_dir("longclip-b", paths) is None
    assert [p.name for p in paths.models.iterdir()] == []


def test_registered_longclip_pins_are_the_converters() -> None:
    from engine.backends.clip.convert import PINNED

    for name in ("longclip-b", "longclip-l"):
        spec, pinned = get_spec(name), PINNED[name]
        assert (spec.repo_id, spec.revision, list(spec.files)) == (pinned.repo_id, pinned.revision, [pinned.filename])
        pin = spec.pin(pinned.filename)
        assert pin is not None and (pin.kind, pin.digest) == ("sha256", pinned.sha256)


# --- models import of a CLIP folder with vocab.json + merges.txt only --------------------------


def test_import_of_a_clip_folder_without_tokenizer_json_copies_vocab_and_merges(tmp_path, clip_b16_tiny_checkpoint):
    src = tmp_path / "src"
    shutil.copytree(clip_b16_tiny_checkpoint, src)
    (src / "tokenizer.json").unlink()
    assert (src / "vocab.json").is_file() and (src / "merges.txt").is_file()
    paths = get_paths(tmp_path / "home").ensure()
    final = import_model(src, "clip-bpe", paths, backend="clip")
    manifest = json.loads((final / MANIFEST_NAME).read_text())
    assert {"vocab.json", "merges.txt"} <= set(manifest["files"]) and "tokenizer.json" not in manifest["files"]
    for f in ("vocab.json", "merges.txt"):
        assert (final / f).read_bytes() == (src / f).read_bytes()
    emb = load_embedder("clip-bpe", paths, device="cpu")
    full = ClipEmbedder(clip_b16_tiny_checkpoint, device="cpu", compute="fast")
    for text in [*TEXTS, LONG_TEXT]:
        assert emb.tokenizer(text)["input_ids"] == full.tokenizer(text)["input_ids"]
    np.testing.assert_allclose(emb.encode_texts(TEXTS), full.encode_texts(TEXTS), atol=1e-6)
