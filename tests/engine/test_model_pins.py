"""Pins for every file of a registered model, and a first pull that needs no trust setting.

The hub is tests/fake_hub.py: a real HTTP server on loopback answering huggingface_hub's HEAD and
ranged GET at /{repo}/resolve/{revision}/{file}. It serves small stand-in files of each registered
model (a tiny random checkpoint of the model's backend); the test computes their pins, registers
the model's spec with those pins (registry.register_model), and pulls it through the CLI.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

from engine.cli import main as cli_main
from engine.config import Paths, get_paths
from engine.errors import ModelError, ModelIntegrityError, OfflineError
from engine.jobs import Progress
from engine.models import registry
from engine.models.download import pull_model
from engine.models.pins import (
    FileDigests,
    Pin,
    git_blob_id,
    git_blob_pin,
    hash_file,
    parse_pin,
    sha256_pin,
)
from engine.models.registry import MANIFEST_NAME, ModelSpec, installed_model_dir, verify_model
from tests.fake_hub import FakeHub, files_for_spec, pinned_like, publish, running_hub

REV = "89abcdef0123456789abcdef0123456789abcdef"

# A small model folder in each backend's layout, to serve as a registered model's files. A backend
# that gains registered models needs an entry here (the test below fails and says so).
FOLDER_FIXTURES = {"blip": "blip_tiny_checkpoint", "clip": "clip_b16_tiny_checkpoint"}
# A small checkpoint in a backend's own published format, for registered models pulled as one file
# the backend converts (Long-CLIP's OpenAI-layout .pt).
CHECKPOINT_FIXTURES = {"clip": "longclip_openai_tiny_pt"}


@pytest.fixture
def paths(tmp_path: Path) -> Paths:
    return get_paths(tmp_path / "home").ensure()


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    with running_hub(monkeypatch) as h:
        yield h


@pytest.fixture
def register_spec() -> Iterator[Callable[[ModelSpec], ModelSpec]]:
    """registry.register_model for the test's specs; the originals are back (or gone) afterwards."""
    replaced: list[tuple[ModelSpec, ModelSpec]] = []

    def register(spec: ModelSpec) -> ModelSpec:
        replaced.append((spec, registry.register_model(spec)))
        return spec

    yield register
    for spec, before in reversed(replaced):
        if before is spec:
            registry.unregister_model(spec.name)
        else:
            registry.register_model(before)


def run_job(job: Iterator[Progress]) -> list[Progress]:
    reports = []
    try:
        while True:
            reports.append(next(job))
    except StopIteration:
        return reports


def tiny_blip_spec(folder: Path, name: str = "pinned-blip") -> tuple[ModelSpec, dict[str, bytes]]:
    """A BLIP spec over the tiny checkpoint's files, every one pinned by git blob id or SHA-256."""
    served = {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}
    files = {f: sha256_pin(hashlib.sha256(d).hexdigest()) if f.endswith(".safetensors") else git_blob_pin(git_blob_id(d))
             for f, d in served.items()}
    spec = ModelSpec(name, "blip", "test model", "acme/pinned-blip", REV, files, dim=256, image_size=384,
                     default_text_tokens=128)
    return spec, served


# --- pins ------------------------------------------------------------------------------------


def test_git_blob_id_is_what_git_computes(tmp_path: Path) -> None:
    git = shutil.which("git")
    if git is None:
        pytest.skip("git is not installed")
    for i, data in enumerate([b"", b"{}\n", os.urandom(300_001), "café\r\n".encode()]):
        f = tmp_path / f"f{i}"
        f.write_bytes(data)
        expected = subprocess.run([git, "hash-object", str(f)], capture_output=True, text=True, check=True,
                                  cwd=tmp_path).stdout.strip()
        assert git_blob_id(data) == expected
        digests = hash_file(f)
        assert digests == FileDigests(hashlib.sha256(data).hexdigest(), expected, len(data))
        assert digests.matches(Pin("git-blob", expected)) and not digests.matches(Pin("git-blob", "0" * 40))


def test_pin_forms_and_what_a_spec_refuses() -> None:
    sha = hashlib.sha256(b"x").hexdigest()
    blob = git_blob_id(b"x")
    assert parse_pin(sha) == parse_pin(f"sha256:{sha}") == Pin("sha256", sha)  # the original bare form
    assert parse_pin(f"git-blob:{blob}") == Pin("git-blob", blob) and parse_pin(None) is None
    assert str(parse_pin(git_blob_pin(blob))) == f"git-blob:{blob}" and sha256_pin(sha) == f"sha256:{sha}"
    for bad in (sha.upper(), sha[:-1], f"git-blob:{sha}", f"sha1:{blob}", blob, f"git-blob:{blob.upper()}", ""):
        with pytest.raises(ValueError):
            parse_pin(bad)
    with pytest.raises(ValueError, match="config.json"):
        ModelSpec("x", "blip", "", "a/b", REV, {"config.json": f"sha1:{blob}"}, 1, 1, 1)

    spec = ModelSpec("x", "blip", "", "a/b", REV, {"config.json": f"git-blob:{blob}", "model.safetensors": sha,
                                                    "vocab.txt": None}, 1, 1, 1)
    assert spec.pins == {"config.json": Pin("git-blob", blob), "model.safetensors": Pin("sha256", sha)}
    assert spec.unpinned_files == ["vocab.txt"] and not spec.fully_pinned
    assert ModelSpec("y", "blip", "", "a/b", REV, {"config.json": f"git-blob:{blob}"}, 1, 1, 1).fully_pinned


def test_registered_pins_are_well_formed_and_blip_small_files_are_pinned_by_blob_id() -> None:
    for spec in registry.registered_specs():
        for fname, pin in spec.pins.items():
            if fname.endswith((".bin", ".pt", ".pth", ".safetensors")):
                assert pin.kind == "sha256", f"{spec.name}: {fname}: weights are pinned by SHA-256"
    base, large = registry.get_spec("blip-itm-base-coco"), registry.get_spec("blip-itm-large-coco")
    special = Pin("git-blob", "a8b3208c2884c4efb86e49300fdd3dc877220cdf")
    assert base.pin("special_tokens_map.json") == special == large.pin("special_tokens_map.json")
    # The value is the blob id of the content and size the hub's page shows for that file.
    shown = json.dumps({"cls_token": "[CLS]", "mask_token": "[MASK]", "pad_token": "[PAD]", "sep_token": "[SEP]",
                        "unk_token": "[UNK]"}, indent=2) + "\n"
    assert len(shown) == 125 and git_blob_id(shown.encode()) == special.digest
    assert large.pin("tokenizer_config.json") == Pin("git-blob", "8360f5587c7786385d33e3c508c6e7a8c55b5369")


# --- every registered model pulls without a trust setting ------------------------------------


@pytest.mark.parametrize("name", [s.name for s in registry.registered_specs() if s.repo_id and not s.bundled])
def test_every_registered_model_pulls_with_no_flag_from_a_hub_serving_its_pinned_files(
    name: str, request: pytest.FixtureRequest, register_spec, hub: FakeHub, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    real = registry.get_spec(name)
    fixture = FOLDER_FIXTURES.get(real.backend)
    assert fixture is not None, (f"{name}: add a small {real.backend} model folder fixture to FOLDER_FIXTURES in "
                                 f"{Path(__file__).name} so its pull is tested")
    converts = bool(registry.get_backend(real.backend).checkpoint_suffixes & {Path(f).suffix for f in real.files})
    checkpoint = request.getfixturevalue(CHECKPOINT_FIXTURES[real.backend]) if converts else None
    served = files_for_spec(real, request.getfixturevalue(fixture), checkpoint)
    spec = register_spec(pinned_like(real, served))
    assert spec.fully_pinned and spec.revision == real.revision and list(spec.files) == list(real.files)
    publish(hub, spec, served)
    home = tmp_path / "home"
    monkeypatch.setenv("LONGLENS_HOME", str(home))
    monkeypatch.setenv("HF_ENDPOINT", hub.url)

    capsys.readouterr()
    assert cli_main(["models", "pull", name]) == 0
    out, err = capsys.readouterr()
    paths = get_paths(home)
    final = installed_model_dir(name, paths)
    assert final is not None and f"installed {name} in {final}" in out
    total = sum(len(d) for d in served.values())
    assert f"{name}: {len(served)} files" in err and "to download" in err  # the size, before the bar
    assert verify_model(name, paths).ok
    manifest = json.loads((final / MANIFEST_NAME).read_text())
    assert manifest["trusted_unpinned"] == [] and manifest["pinned"] == dict(spec.files)
    assert manifest["revision"] == real.revision and manifest["repo_id"] == real.repo_id
    # The hub was asked for the pinned files at the pinned revision, one GET each, and for nothing else.
    assert sorted(hub.requests) == sorted(("GET", f"/{real.repo_id}/resolve/{real.revision}/{quote(f)}", None)
                                          for f in served) and total > 0
    if converts:
        assert set(manifest["converted_from"]) == set(served) and not list(final.glob("*.pt"))
    from PIL import Image

    emb = registry.load_embedder(name, paths, device="cpu")
    assert emb.backend == real.backend
    assert emb.encode_images([Image.new("RGB", (24, 24), (200, 30, 30))]).shape[0] == 1


# --- a file that does not match its pin ------------------------------------------------------


def test_a_file_not_matching_its_blob_id_is_refused_and_the_next_pull_gets_it_again(
    paths: Paths, hub: FakeHub, blip_tiny_checkpoint: Path,
) -> None:
    spec, served = tiny_blip_spec(blip_tiny_checkpoint)
    publish(hub, spec, served)
    good = served["tokenizer_config.json"]
    hub.files[(spec.repo_id, REV, "tokenizer_config.json")] = good.replace(b"true", b"false", 1)

    with pytest.raises(ModelIntegrityError) as ei:
        run_job(pull_model(spec, paths, endpoint=hub.url))
    msg = str(ei.value)
    assert f"expected git blob id {git_blob_id(good)}" in msg
    assert git_blob_id(good.replace(b"true", b"false", 1)) in msg
    assert "nothing was installed" in msg and f"pull {spec.name} again" in msg and "import a copy you trust" in msg
    assert installed_model_dir(spec.name, paths) is None and not (paths.models / spec.name).exists()
    assert not [d for d in paths.models.iterdir() if d.name.startswith(".")], "no staging folder is left"
    cache = paths.cache / "downloads" / "acme--pinned-blip" / REV
    assert not list(cache.glob("tokenizer_config.json*")), "the refused bytes are deleted"

    # Files are read smallest first; those read before the refused one matched their pins and stay.
    finished = sorted(p.name for p in cache.iterdir() if p.is_file() and not p.name.endswith(".part"))
    order = sorted(spec.files, key=lambda f: len(served[f]))  # stable: spec order among equal sizes
    assert finished == sorted(order[:order.index("tokenizer_config.json")]) and finished

    # The hub serves the pinned bytes again: the refused file is fetched afresh; the files that
    # matched their pins before are not downloaded a second time.
    hub.files[(spec.repo_id, REV, "tokenizer_config.json")] = good
    gets_before = {f: len(hub.gets(f)) for f in served}
    run_job(pull_model(spec, paths, endpoint=hub.url))
    assert verify_model(spec.name, paths).ok
    assert len(hub.gets("tokenizer_config.json")) == gets_before["tokenizer_config.json"] + 1
    kept = [f for f in served if f not in ("tokenizer_config.json",) and len(hub.gets(f)) == gets_before[f]]
    assert kept == finished


def test_a_pickle_pinned_by_blob_id_is_refused_before_any_download(paths: Paths, hub: FakeHub) -> None:
    spec = ModelSpec("pickle-blob", "blip", "", "acme/p", REV, {"pytorch_model.bin": git_blob_pin("1" * 40)},
                     1, 1, 1)
    with pytest.raises(ModelIntegrityError, match="SHA-256"):
        run_job(pull_model(spec, paths, endpoint=hub.url))
    assert hub.log == []


# --- a spec with nothing to pull says why, each kind its own way ----------------------------


@pytest.mark.parametrize("kind", ["bundled", "no repository", "no revision", "no files"])
def test_a_spec_with_nothing_to_pull_says_why_and_what_to_do(
    kind: str, paths: Paths, hub: FakeHub, register_spec, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sha = hashlib.sha256(b"w").hexdigest()
    spec, words = {
        "bundled": (registry.get_spec(registry.BUNDLED_MODEL), ["bundled with Longlens", "nothing to pull"]),
        "no repository": (ModelSpec("local-only", "clip", "", None, None, {}, 1, 1, 1),
                          ["names no model hub repository", "longlens models import DIR --name local-only"]),
        "no revision": (ModelSpec("no-rev", "blip", "", "acme/no-rev", None, {"model.safetensors": sha}, 1, 1, 1),
                        ["no pinned revision of acme/no-rev", "never a branch"]),
        "no files": (ModelSpec("no-files", "blip", "", "acme/no-files", REV, {}, 1, 1, 1),
                     ["lists no files to pull from acme/no-files"]),
    }[kind]
    with pytest.raises(ModelError) as ei:
        run_job(pull_model(spec, paths, endpoint=hub.url))
    for w in words:
        assert w in str(ei.value)
    assert "is bundled" not in str(ei.value) or kind == "bundled"  # the old one-size message
    assert hub.log == [] and not list(paths.models.iterdir())

    # The same sentence through the CLI, for a registered spec of that kind.
    if not spec.bundled:
        register_spec(spec)
    monkeypatch.setenv("LONGLENS_HOME", str(paths.models.parent))
    capsys.readouterr()
    assert cli_main(["models", "pull", spec.name]) != 0
    assert words[0] in capsys.readouterr().err


# --- an interrupted pull resumes, and reports size, rate and time left -----------------------


def test_an_interrupted_pull_resumes_and_counts_only_new_bytes_in_its_rate(
    paths: Paths, hub: FakeHub, blip_tiny_checkpoint: Path,
) -> None:
    spec, served = tiny_blip_spec(blip_tiny_checkpoint)
    publish(hub, spec, served)
    big = "tokenizer.json"  # git-tracked, so pinned by blob id: the resumed file is checked by that pin
    assert spec.pin(big).kind == "git-blob" and len(served[big]) > 4 * 64 * 1024
    hub.drop_once.add(big)
    hub.down_after_drop = True  # and its next GET answers 503: the pull fails with the part kept
    first: list[Progress] = []
    with pytest.raises(OfflineError, match="again"):
        for report in pull_model(spec, paths, endpoint=hub.url):
            first.append(report)
    assert installed_model_dir(spec.name, paths) is None
    cache = paths.cache / "downloads" / "acme--pinned-blip" / REV
    kept = (cache / f"{big}.part").stat().st_size
    assert 0 < kept < len(served[big])
    finished = sum(p.stat().st_size for p in cache.iterdir() if p.is_file() and not p.name.endswith(".part"))

    hub.unavailable.clear()
    reports = run_job(pull_model(spec, paths, endpoint=hub.url))
    assert hub.gets(big)[-1] == f"bytes={kept}-"  # continued where it stopped, not restarted
    assert verify_model(spec.name, paths).ok

    total = sum(len(d) for d in served.values())
    sizes = next(r for r in reports if r.extra.get("sizes"))
    assert sizes.extra["sizes"] == {"files": len(served), "total": total, "present": finished + kept}
    assert "already here from an earlier pull" in sizes.message
    downloads = [r for r in reports if r.stage == "download"]
    assert all(r.total == total for r in downloads) and downloads[-1].done == total
    # The rate is over the bytes this pull fetched: at most what was missing, over a positive time.
    for r in downloads:
        if r.rate is not None:
            assert r.eta_s is not None and r.eta_s >= 0
    assert any(r.rate is not None for r in downloads)
    assert [r.done for r in downloads] == sorted(r.done for r in downloads)
