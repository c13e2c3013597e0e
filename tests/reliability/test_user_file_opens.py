"""Issue 16 item 1 and checklist 28: every open of a user's file is safe against a path that has
changed type since it was scanned (now a FIFO, a link to /dev/zero, a folder, a socket, a link
where a plain file was, or a file that keeps growing). Nothing blocks or spins: the file is
reported with a reason, the other files are indexed and the index is saved; Ctrl+C stops a run
even while a worker is deep in a file.

The swaps are deterministic: in a child process the scanner is wrapped so that the swap happens
right after the real scan, before any file is hashed or decoded; for the direct tests, right
after the first stat() of the path (the old stat-then-open race). Anything that could hang runs
under a timeout that fails the test (subprocess timeouts, pytest-timeout in-process).
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from engine.errors import DecodeError, JobCancelled
from engine.fileutil import sha256_file
from engine.indexing.decode import DECODE_REASONS, decode_image, read_meta
from engine.jobs import CancelToken
from engine.thumbnails import ThumbnailCache, make_thumbnail
from tests.e2e.conftest import TINY_MODEL
from tests.reliability.code_scan import ScopedCalls

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs, sockets and /dev/zero are POSIX")

ROOT = Path(__file__).resolve().parents[2]
CHILD_TIMEOUT_S = 240  # a child that has not finished by then hung
KINDS = ("fifo", "dev_zero", "folder", "socket")
KIND_WORDS = {"fifo": "FIFO", "dev_zero": "character device", "folder": "folder", "socket": "socket",
              "link": "symbolic link"}


# --------------------------------------------------------------------------- making the swaps


def swap_path(path: Path, kind: str) -> None:
    """Replace the regular file at `path` by `kind`: fifo, dev_zero (a link to /dev/zero), folder,
    socket, link (a link to a copy of the file outside its folder), or growing (it stays a file that
    a thread keeps appending to, 32 MiB in all, so that the disk does not fill)."""
    path = Path(path)
    if kind == "growing":
        def append() -> None:
            with open(path, "ab") as f:
                for _ in range(128):
                    f.write(os.urandom(256 * 1024))
                    f.flush()

        threading.Thread(target=append, daemon=True).start()
        return
    if kind == "link":
        target = path.parent.parent / f"outside-{path.name}"
        shutil.copyfile(path, target)
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev_zero":
        os.symlink("/dev/zero", path)
    elif kind == "folder":
        path.mkdir()
        (path / "inside.jpg").write_bytes(b"not scanned: the scan is over")
    elif kind == "socket":
        # AF_UNIX addresses are limited to ~108 bytes; bind by a name relative to the folder.
        cwd = os.getcwd()
        os.chdir(path.parent)
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.bind(path.name)  # the socket file outlives the socket
        finally:
            os.chdir(cwd)
    elif kind == "link":
        os.symlink(target, path)
    else:
        raise ValueError(kind)


@pytest.fixture
def jpeg(tmp_path) -> Path:
    from PIL import Image

    folder = tmp_path / "lib"
    folder.mkdir()
    p = folder / "photo.jpg"
    Image.new("RGB", (64, 48), (200, 30, 40)).save(p, "JPEG")
    return p


def swap_on_first_open(monkeypatch, path: Path, kind: str) -> None:
    """Swap `path` to `kind` right before the code under test first opens it (os.open, open(),
    io.open, which Path.read_bytes/read_text use): whatever it checked before (stat, is_file, its
    size) still saw the regular file. That is the window between a check of a path and its open,
    or between a scan and the read, made deterministic."""
    import builtins
    import io

    state = {"swapped": False}

    def swapping(real):
        def call(p, *args, **kwargs):
            if not state["swapped"] and isinstance(p, (str, os.PathLike)) and os.fspath(p) == os.fspath(path):
                state["swapped"] = True
                swap_path(path, kind)
            return real(p, *args, **kwargs)
        return call

    monkeypatch.setattr(os, "open", swapping(os.open))
    monkeypatch.setattr(builtins, "open", swapping(builtins.open))
    monkeypatch.setattr(io, "open", swapping(io.open))


# --------------------------------------------------------------------------- the helper itself


@pytest.mark.timeout(60, func_only=True)
@pytest.mark.parametrize("kind", KINDS)
def test_open_user_file_refuses_each_kind_of_non_regular_file_without_blocking(jpeg, kind):
    from engine.fileutil import NotARegularFileError, open_user_file, read_user_file

    swap_path(jpeg, kind)
    with pytest.raises(NotARegularFileError) as info:
        open_user_file(jpeg)
    assert str(jpeg) in str(info.value) and KIND_WORDS[kind] in str(info.value)
    assert isinstance(info.value, OSError) and info.value.filename == str(jpeg)
    with pytest.raises(NotARegularFileError):
        read_user_file(jpeg)


@pytest.mark.timeout(60, func_only=True)
def test_open_user_file_follows_links_only_when_asked(jpeg):
    from engine.fileutil import NotARegularFileError, open_user_file

    data = jpeg.read_bytes()
    swap_path(jpeg, "link")
    with open_user_file(jpeg) as f:
        assert f.read() == data
    with pytest.raises(NotARegularFileError) as info:
        open_user_file(jpeg, follow_symlinks=False)
    assert "symbolic link" in str(info.value)
    with pytest.raises(FileNotFoundError):
        open_user_file(jpeg.parent / "missing.jpg")


@pytest.mark.timeout(60, func_only=True)
def test_reads_of_a_growing_file_end_at_the_size_seen_at_open_and_seek_tell_work(tmp_path):
    from engine.fileutil import FileTooLargeError, open_user_file, read_user_file

    p = tmp_path / "growing.bin"
    first = os.urandom(300_000)
    p.write_bytes(first)
    with open_user_file(p) as f:
        with open(p, "ab") as w:
            w.write(os.urandom(5_000_000))  # another program appends after the open
        assert f.size == len(first)
        assert f.read(10) == first[:10] and f.tell() == 10
        assert f.seek(-16, os.SEEK_END) == len(first) - 16 and f.read() == first[-16:]
        assert f.read() == b""
        f.seek(0)
        assert f.read() == first
    assert p.stat().st_size == len(first) + 5_000_000
    with pytest.raises(FileTooLargeError) as info:
        read_user_file(p, max_bytes=1000)
    assert str(p) in str(info.value) and info.value.limit == 1000


# --------------------------------------------------------------------------- hashing


@pytest.mark.timeout(60, func_only=True)
@pytest.mark.parametrize("kind", KINDS)
def test_sha256_file_refuses_non_regular_files_never_blocks_or_spins(jpeg, kind):
    swap_path(jpeg, kind)
    with pytest.raises(OSError) as info:  # NotARegularFileError
        sha256_file(jpeg)
    assert type(info.value).__name__ == "NotARegularFileError"
    assert str(jpeg) in str(info.value) and KIND_WORDS[kind] in str(info.value)


@pytest.mark.timeout(60, func_only=True)
def test_sha256_file_of_an_ever_growing_file_hashes_the_size_seen_at_open(tmp_path):
    p = tmp_path / "growing.bin"
    first = os.urandom(3 * (1 << 20) + 5)
    p.write_bytes(first)
    appended = 0

    def append_after_each_chunk(n: int) -> None:
        # A writer that always stays ahead of the reader (bounded so a plain open() still ends).
        nonlocal appended
        if appended < 64:
            appended += 1
            with open(p, "ab") as w:
                w.write(os.urandom(1 << 20))

    assert sha256_file(p, on_bytes=append_after_each_chunk) == hashlib.sha256(first).hexdigest()
    assert appended >= 1


@pytest.mark.timeout(60, func_only=True)
def test_sha256_file_stops_between_chunks_once_cancelled(tmp_path):
    p = tmp_path / "big.jpg"
    with open(p, "wb") as f:
        f.truncate(1 << 40)  # 1 TiB, sparse: hours to hash, nothing on disk
    token = CancelToken()
    chunks = []

    def cancel_after_first(n: int) -> None:
        chunks.append(n)
        token.cancel()

    with pytest.raises(JobCancelled):
        sha256_file(p, on_bytes=cancel_after_first, cancel=token)
    assert len(chunks) == 1


# --------------------------------------------------------------------------- decoding, thumbnails


@pytest.mark.timeout(60, func_only=True)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("reader", ["decode_image", "read_meta"])
def test_decoding_a_path_that_changes_type_between_its_checks_and_its_open_is_not_a_file(jpeg, monkeypatch, kind, reader):
    assert jpeg.is_file()  # what the scan saw
    swap_on_first_open(monkeypatch, jpeg, kind)
    with pytest.raises(DecodeError) as info:
        decode_image(jpeg, target_size=32) if reader == "decode_image" else read_meta(jpeg)
    assert info.value.reason == "not a file" and info.value.reason in DECODE_REASONS


@pytest.mark.timeout(60, func_only=True)
def test_decoding_refuses_a_link_swapped_in_when_links_are_not_followed(jpeg):
    swap_path(jpeg, "link")
    assert decode_image(jpeg)[1].width == 64  # a link the scan followed is still read
    for read in (lambda: decode_image(jpeg, follow_symlinks=False), lambda: read_meta(jpeg, follow_symlinks=False)):
        with pytest.raises(DecodeError) as info:
            read()
        assert info.value.reason == "not a file"


@pytest.mark.timeout(60, func_only=True)
def test_decoding_a_growing_file_reads_the_image_and_stops(jpeg):
    swap_path(jpeg, "growing")
    image, meta = decode_image(jpeg)
    assert image.size == (64, 48) and meta.format == "JPEG"


@pytest.mark.timeout(60, func_only=True)
@pytest.mark.parametrize("kind", KINDS)
def test_thumbnails_of_a_swapped_file_are_a_decode_error_not_a_hang(jpeg, tmp_path, monkeypatch, kind):
    make_thumbnail(jpeg, 32)  # readable first
    swap_on_first_open(monkeypatch, jpeg, kind)
    with pytest.raises(DecodeError) as info:
        make_thumbnail(jpeg, 32)
    assert info.value.reason == "not a file"
    with pytest.raises(DecodeError) as info:
        make_thumbnail(jpeg, 32, ThumbnailCache(tmp_path / "thumbs"))
    assert info.value.reason == "not a file"


# --------------------------------------------------------------------------- every other reader of a user file


def _caption_jsonl(folder: Path) -> Path:
    p = folder / "captions.jsonl"
    p.write_text(json.dumps({"image": "photo.jpg", "caption": "A red square."}) + "\n", encoding="utf-8")
    return p


def _training_jsonl(folder: Path) -> Path:
    p = folder / "train.jsonl"
    p.write_text(json.dumps({"image": "photo.jpg", "positives": ["a red square"]}) + "\n", encoding="utf-8")
    return p


def _image_list(folder: Path) -> Path:
    p = folder / "images.txt"
    p.write_text("photo.jpg\n", encoding="utf-8")
    return p


def _train_config(folder: Path) -> Path:
    p = folder / "cfg.json"
    p.write_text(json.dumps({"base": "C1"}), encoding="utf-8")
    return p


def _docci(folder: Path) -> Path:
    p = folder / "docci_descriptions.jsonlines"
    p.write_text(json.dumps({"example_id": "1", "image_file": "photo.jpg", "description": "red", "split": "test"})
                 + "\n", encoding="utf-8")
    return p


def _sharegpt4v(folder: Path) -> Path:
    p = folder / "share.json"
    p.write_text(json.dumps([{"id": "1", "image": "photo.jpg",
                              "conversations": [{"from": "gpt", "value": "A red square."}]}]), encoding="utf-8")
    return p


def _dci_splits(folder: Path) -> Path:
    p = folder / "splits.json"
    p.write_text(json.dumps({"train": [], "valid": [], "test": []}), encoding="utf-8")
    return p


def _read_review(p: Path) -> None:
    from engine.review import load_caption_file

    load_caption_file(p)


def _read_ground_items(p: Path) -> None:
    from engine.grounding.items import read_items

    list(read_items(p))


def _read_training(p: Path) -> None:
    from engine.training.data import read_training_jsonl

    read_training_jsonl(p, check_images=False)


def _read_image_list(p: Path) -> None:
    from engine.datagen.inputs import read_image_list

    read_image_list(p)


def _read_config(p: Path) -> None:
    from engine.training.configs import load_config

    load_config(str(p))


def _read_docci(p: Path) -> None:
    from engine.evaluation.loaders import load_docci

    load_docci(p.parent, annotations=p, check_images=False)


def _read_sharegpt4v(p: Path) -> None:
    from engine.evaluation.loaders import load_sharegpt4v

    load_sharegpt4v(p.parent, annotations=p, check_images=False)


def _read_dci_splits(p: Path) -> None:
    from engine.evaluation.public_sets import read_dci

    list(read_dci(p.parent, "train"))


TEXT_READERS = {
    "review": (_caption_jsonl, _read_review),
    "ground_check": (_caption_jsonl, _read_ground_items),
    "training_data": (_training_jsonl, _read_training),
    "datagen_list": (_image_list, _read_image_list),
    "train_config": (_train_config, _read_config),
    "eval_annotations": (_docci, _read_docci),
    "sharegpt4v_list": (_sharegpt4v, _read_sharegpt4v),
    "dci_splits": (_dci_splits, _read_dci_splits),
}


@pytest.mark.timeout(60, func_only=True)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("reader", sorted(TEXT_READERS))
def test_every_reader_of_a_user_file_refuses_one_that_changed_type_with_a_clear_error(
        jpeg, monkeypatch, reader, kind):
    from engine.errors import LonglensError

    make, read = TEXT_READERS[reader]
    path = make(jpeg.parent)
    read(path)  # readable as it is
    swap_on_first_open(monkeypatch, path, kind)
    with pytest.raises(LonglensError) as info:
        read(path)
    message = str(info.value)
    assert str(path) in message and KIND_WORDS[kind] in message, message


@pytest.mark.timeout(60, func_only=True)
@pytest.mark.parametrize("kind", ["fifo", "dev_zero"])
def test_model_import_refuses_a_weights_file_that_changed_type_and_installs_nothing(
        blip_tiny_checkpoint, tmp_path, monkeypatch, kind):
    from engine.config import get_paths
    from engine.errors import ModelError
    from engine.models.download import import_model

    src = tmp_path / "model"
    shutil.copytree(blip_tiny_checkpoint, src)
    paths = get_paths(str(tmp_path / "home")).ensure()
    swap_on_first_open(monkeypatch, src / "model.safetensors", kind)
    with pytest.raises(ModelError) as info:
        import_model(src, "swapped", paths)
    # The import copies resolved paths without following links, so a link swapped in is refused as one.
    expected = "symbolic link" if kind == "dev_zero" else KIND_WORDS[kind]
    assert "model.safetensors" in str(info.value) and expected in str(info.value)
    assert not (paths.models / "swapped").exists()
    assert [p.name for p in paths.models.iterdir() if p.name.startswith(".staging")] == []


# --------------------------------------------------------------------------- real indexing runs

# The real CLI in a child process, with the scanner wrapped so that the swaps happen right after
# the real scan and before any file is hashed or decoded.
CHILD = textwrap.dedent("""
    import sys
    from pathlib import Path

    import engine.indexing.pipeline as pipeline
    from engine.cli import main
    from tests.reliability.test_user_file_opens import swap_path

    lib, swaps, rest = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
    real_scan = pipeline.scan_folder

    def scan_then_swap(*args, **kwargs):
        yield from real_scan(*args, **kwargs)
        for spec in swaps.split(","):
            name, kind = spec.split("=")
            swap_path(lib / name, kind)
        print("swapped", file=sys.stderr, flush=True)

    pipeline.scan_folder = scan_then_swap
    sys.exit(main(["index", str(lib), *rest]))
""")


def child_cmd(lib: Path, swaps: dict[str, str], *rest: str) -> list[str]:
    return [sys.executable, "-c", CHILD, str(lib), ",".join(f"{n}={k}" for n, k in swaps.items()),
            "--model", TINY_MODEL, *rest]


def child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def catalog_rows(home: Path) -> dict[str, tuple[int, str, str | None]]:
    con = sqlite3.connect(f"{Path(home / 'data' / 'catalog.sqlite3').absolute().as_uri()}?mode=ro", uri=True)
    try:
        return {p: (i, s, r) for p, i, s, r in con.execute("SELECT rel_path, id, status, reason FROM images")}
    finally:
        con.close()


def copy_in(photos: Path, names: list[str]) -> None:
    from PIL import Image

    for i, name in enumerate(names):
        Image.new("RGB", (80, 60), (10 + 20 * i, 120, 200)).save(photos / name, "JPEG")


def test_indexing_a_library_whose_files_change_type_after_the_scan_finishes_and_saves(home, photos):
    from engine.catalog import Catalog
    from engine.config import get_paths
    from engine.index.store import index_path
    from engine.index.vector_index import VectorIndex
    from engine.models.registry import installed_identity

    swaps = {f"zz-{kind}.jpg": kind for kind in (*KINDS, "link")}
    copy_in(photos, [*swaps, "zz-growing.jpg"])
    n_regular = sum(1 for p in photos.rglob("*") if p.is_file()) - len(swaps)
    try:
        proc = subprocess.run(child_cmd(photos, {**swaps, "zz-growing.jpg": "growing"}, "--json", "--batch-size", "4"),
                              cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"indexing hung on a swapped file: {(exc.stderr or b'')[-2000:]!r}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    assert not summary["cancelled"]
    reported = {u["path"]: u["reason"] for u in summary["unreadable"]}
    assert reported == {name: "not a file" for name in swaps}
    assert summary["new"] == n_regular  # every other file, the growing one included, is indexed
    rows = catalog_rows(home)
    assert {p: (s, r) for p, (_i, s, r) in rows.items() if p in swaps} == {n: ("unreadable", "not a file") for n in swaps}
    ok = {i for p, (i, s, _r) in rows.items() if s == "ok"}
    assert len(ok) == n_regular and rows["zz-growing.jpg"][1] == "ok"
    paths = get_paths(str(home))
    key = installed_identity(TINY_MODEL, paths).image  # vectors are stored under the model's identity
    with Catalog(paths.catalog) as cat:
        assert cat.integrity_check() == "ok"
        lib = cat.library_by_root(photos.resolve())
        assert cat.embedded_ids(lib.id, key) == ok
        dim = cat.vectors_for([min(ok)], key).shape[1]
    saved = VectorIndex.load(index_path(paths.indexes, lib.id, key), dim)  # the index was saved
    assert set(saved.ids().tolist()) == ok


def _open_in(pid: int, path: Path) -> bool:
    fd_dir = Path(f"/proc/{pid}/fd")
    try:
        return any(os.readlink(fd_dir / fd) == str(path) for fd in os.listdir(fd_dir))
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="watches the child's open files in /proc")
def test_ctrl_c_stops_index_while_a_huge_file_is_hashed_and_a_fifo_was_swapped_in(home, photos):
    """SIGINT to a real `index` while one worker hashes a 1 TiB (sparse) file and the other meets a
    path swapped to a FIFO: the run stops at its next checkpoint and exits 130, in bounded time."""
    huge = photos / "aaa-huge.jpg"
    with open(huge, "wb") as f:
        f.truncate(1 << 40)  # hours to hash; nothing on disk
    copy_in(photos, ["aab-swapped.jpg"])
    proc = subprocess.Popen(child_cmd(photos, {"aab-swapped.jpg": "fifo"}, "--json", "--batch-size", "4"),
                            cwd=ROOT, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + CHILD_TIMEOUT_S
        while not _open_in(proc.pid, huge.resolve()) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert _open_in(proc.pid, huge.resolve()), "the child never started hashing the huge file"
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            pytest.fail("Ctrl+C did not stop `longlens index` while a file was being hashed")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    summary = json.loads(out)
    assert summary["cancelled"] is True
    con = sqlite3.connect(f"{Path(home / 'data' / 'catalog.sqlite3').absolute().as_uri()}?mode=ro", uri=True)
    try:
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        con.close()


# --------------------------------------------------------------------------- the rule, across the code

# Every call in engine/ and desktop_app/ that opens a file for reading by path, by (module, function):
# the ones allowed to bypass engine.fileutil.open_user_file, and why. A new reader of a user's file
# must use open_user_file / read_user_file / read_user_text (or be listed here with the reason it
# only ever reads a file Longlens wrote itself).
READS_ALLOWED: dict[tuple[str, str], str] = {
    ("engine/fileutil.py", "open_user_file"): "the one safe open itself",
    ("engine/fileutil.py", "fsync_dir"): "opens a folder to fsync it",
    ("engine/index/vector_index.py", "VectorIndex.save"): "index files Longlens writes in its home",
    ("engine/index/vector_index.py", "VectorIndex._load"): "index files in the home, checksummed",
    ("engine/index/vector_index.py", "VectorIndex._load_hnsw_payload"): "index files in the home",
    ("engine/index/vector_index.py", "_fsync_dir"): "opens a folder to fsync it",
    ("engine/indexing/decode.py", "_open"): "Image.open on the UserFile from open_user_file",
    ("engine/indexing/decode.py", "_identify_any"): "Image.open on the UserFile from open_user_file",
    ("engine/indexing/raw.py", "_preview"): "Image.open on a RAW's preview bytes, from a read through open_user_file",
    ("engine/thumbnails.py", "ThumbnailCache.get"): "the thumbnail cache in the home",
    ("engine/bench/ann.py", "_load_user_array"): "np.load on the UserFile from open_user_file",
    ("engine/bench/encode.py", "naive_encode"): "images the benchmark generated itself",
    ("engine/bench/encode.py", "run"): "images the benchmark generated itself",
    ("engine/bench/report.py", "machine_description"): "/proc/cpuinfo",
    ("engine/bench/report.py", "update_section"): "the repository's docs/benchmarks.md",
    ("engine/bench/rss.py", "_proc_status_kib"): "/proc/self/status",
    ("engine/cluster/shards.py", "read_listing"): "pq.read_table on the UserFile from open_user_file",
    ("engine/cluster/shards.py", "read_shard"): "pq.read_table on the UserFile from open_user_file",
    ("engine/cluster/shards.py", "existing_files"): "pq.read_* on the UserFile from open_user_file",
    ("engine/datagen/output.py", "LineAppender.__init__"): "opens the output for appending, not reading",
    ("engine/datagen/pipeline.py", "sceneworld_job"): "a temporary file the job itself wrote",
    ("engine/grounding/calibration.py", "weights_sha256"): "an installed model's manifest in the home",
    ("engine/backends/sceneworld_mini/matcher.py", "load_matcher"): "an installed model's matcher in the home",
    ("engine/backends/blip/embedder.py", "_declared_model_type"): "model folders (installed in the home; see note)",
    ("engine/backends/blip/embedder.py", "BlipEmbedder._load_image_settings"): "model folders (see note)",
    ("engine/backends/blip/embedder.py", "BlipEmbedder._load_text_tower"): "model folders (see note)",
    ("engine/models/hf_dual_encoder.py", "read_tower_tensors"): "model folders (see note)",
    ("engine/models/tokenizers.py", "read_vocab"): "a vocabulary file shipped with the package",
    ("engine/backends/sceneworld_mini/network.py", "init_token_embeddings_from_minilm"): "a downloaded, hash-pinned model file",
    ("engine/backends/sceneworld_mini/network.py", "load_model"): "model folders (see note)",
    ("engine/models/lm_tower.py", "load_tower"): "model folders (see note)",
    ("engine/backends/sceneworld_mini/network.py", "load_text_tower"): "model folders (see note)",
    ("engine/models/download.py", "_validate_hf_folder"): "the staging copy the import wrote itself",
    ("engine/models/download.py", "_convert_pickle_to_safetensors"): "a downloaded file whose pinned hash matched",
    ("engine/backends/clip/convert.py", "load_pinned_state_dict"): "torch.load on the UserFile whose pinned hash matched",
    ("engine/models/manifest.py", "read_manifest_file"): "manifests of installed models in the home",
    ("engine/catalog/db.py", "open_in_another_process"): "the catalog's own WAL index beside it, opened to probe its lock, never read",
    ("engine/catalog/repair.py", "_copy_into"): "fsync of the rebuilt catalog this function just wrote",
    ("engine/fileutil.py", "folder_write_lock"): "a picture folder opened only to flock it, never read",
    ("engine/fileutil.py", "_new_temp_fd"): "its own new temporary file, created O_EXCL, written not read",
    ("engine/fileutil.py", "replace_user_file"): "a sidecar opened to hold its identity under the lock; its bytes "
                                                 "were read through open_user_file",
    ("engine/fileutil.py", "_write_in_place"): "a hard-linked sidecar rewritten in place after its backup; read "
                                               "through open_user_file",
    ("engine/models/download.py", "_HubConnection.read_body"): "the partial download in the home it writes itself",
    ("engine/swap_journal.py", "write_journal"): "the swap journal's new temporary file, created O_EXCL",
    ("engine/swap_journal.py", "read_journal"): "a swap journal Longlens wrote beside its catalog or models",
    ("engine/swap_journal.py", "exclusive_lock"): "Longlens's own lock file, opened to flock it, never read",
    ("engine/services.py", "Services._settings_file_values"): "the settings file in Longlens's config folder",
    ("engine/models/install_state.py", "install_lock"): "Longlens's own lock file next to the models folder",
    ("engine/models/install_state.py", "Staging.__init__"): "the staging folder's lock file this process creates",
    ("engine/models/install_state.py", "_owner_is_gone"): "a staging folder's lock file (flock probe)",
    ("engine/samples.py", "make_problem_files"): "a file it has just written",
    ("engine/selftest.py", "read_sample"): "the self-test sample shipped with the package",
    ("engine/services.py", "Services.settings"): "the settings file in the home",
    ("engine/training/cache.py", "EmbeddingCache.vectors"): "the embedding cache Longlens writes",
    ("engine/training/cache.py", "_ensure_capacity"): "the embedding cache Longlens writes",
    ("engine/training/reproduction.py", "run_study.train_and_eval"): "a study folder Longlens wrote",
    ("engine/training/reproduction.py", "_cached"): "a study folder Longlens wrote",
    ("engine/training/run.py", "_check_resume"): "the run folder's own fingerprint file",
    ("engine/training/study.py", "base_temperature"): "an installed model's metadata",
    ("engine/training/study.py", "sceneworld_training_set"): "the vector cache Longlens writes",
    ("engine/training/trainer.py", "Trainer._load_checkpoint"): "the trainer's own checkpoint (weights_only)",
}
# Note: model folders are read by safetensors' and transformers' own readers. An imported model is
# copied through open_user_file first, so they read Longlens's copy; a training --base given as a
# folder is the one case where they read a user's folder directly.

_READ_NAMES = {"open", "load_file", "safe_open"}
_READ_METHODS = {"read_bytes", "read_text"}
_READ_QUALIFIED = {("Image", "open"), ("np", "load"), ("numpy", "load"), ("np", "memmap"), ("pq", "read_table"),
                   ("pq", "read_schema"), ("os", "open"), ("torch", "load")}


def _is_write_mode(call: ast.Call) -> bool:
    modes = [call.args[1]] if len(call.args) >= 2 else []
    modes += [kw.value for kw in call.keywords if kw.arg == "mode"]
    return any(isinstance(m, ast.Constant) and any(c in str(m.value) for c in "wax+") for m in modes)


class _FileReads(ScopedCalls):
    """Collects (module, enclosing function, what is called, line) of every read-by-path call."""

    def visit_call(self, node: ast.Call) -> None:
        f, what = node.func, None
        if isinstance(f, ast.Name) and f.id in _READ_NAMES and not (f.id == "open" and _is_write_mode(node)):
            what = f.id
        elif isinstance(f, ast.Attribute) and f.attr in _READ_METHODS:
            what = f.attr
        elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and (f.value.id, f.attr) in _READ_QUALIFIED:
            what = f"{f.value.id}.{f.attr}"
        if what is not None:
            self.found.append((self.module, self.scope_name, what, node.lineno))


def file_reads(root: Path) -> list[tuple[str, str, str, int]]:
    """(module, enclosing function, what is called, line) for every call that opens a file by path
    for reading, in engine/ and desktop_app/."""
    found: list[tuple[str, str, str, int]] = []
    for path in sorted([*root.joinpath("engine").rglob("*.py"), *root.joinpath("desktop_app").rglob("*.py")]):
        visitor = _FileReads(path.relative_to(root).as_posix())
        visitor.visit(ast.parse(path.read_text(encoding="utf-8")))
        found += visitor.found
    return found


def test_every_read_of_a_file_goes_through_open_user_file_unless_it_is_longlens_own():
    reads = file_reads(ROOT)
    assert any(m == "engine/indexing/decode.py" for m, *_ in reads)  # the scan sees the code
    unlisted = [f"{m}:{line} {fn}(): {what}" for m, fn, what, line in reads if (m, fn) not in READS_ALLOWED]
    assert not unlisted, (
        "these open a file by path without engine.fileutil.open_user_file; use open_user_file / "
        "read_user_file / read_user_text, or list the function in READS_ALLOWED with why it only reads "
        "Longlens's own files:\n" + "\n".join(unlisted))
