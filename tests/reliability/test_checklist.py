"""The reliability checklist (../shared/docs/reliability-checklist.md), one test per item, on real
components: real image files, a real SQLite catalog, the real CLI, child processes where a crash
or a second process is the point. Items with a dedicated module (7, 8, 10, 25-27 properties) are
tested there; docs/reliability.md maps every item to its tests."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from engine.catalog import Catalog
from engine.config import get_paths
from engine.index.store import STALE_TEMP_AGE_S, index_path, remove_stale_temp_files
from engine.index.vector_index import VectorIndex
from engine.text.inert import inert
from tests.e2e.conftest import TINY_MODEL
from tests.reliability.conftest import last_progress

ROOT = Path(__file__).resolve().parents[2]
MODEL = ["--model", TINY_MODEL]


def child_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), **extra}


def model_key(home: Path) -> str:
    """The key the tiny model's vectors are stored under (its identity, not its name)."""
    from engine.models.registry import installed_identity

    return installed_identity(TINY_MODEL, get_paths(str(home))).image


def rows(home: Path) -> dict[str, tuple[int, str, bytes | None]]:
    """rel_path -> (id, status, vector) straight from the catalog file."""
    con = sqlite3.connect(f"{Path(home / 'data' / 'catalog.sqlite3').absolute().as_uri()}?mode=ro", uri=True)
    try:
        return {p: (i, s, v) for p, i, s, v in con.execute(
            "SELECT i.rel_path, i.id, i.status, e.vector FROM images i "
            "LEFT JOIN embeddings e ON e.image_id = i.id AND e.model_id = ?", (model_key(home),))}
    finally:
        con.close()


def assert_catalog_and_index_agree(home: Path) -> None:
    paths = get_paths(str(home))
    key = model_key(home)
    with Catalog(paths.catalog) as cat:
        assert cat.integrity_check() == "ok"
        for lib in cat.libraries():
            truth = cat.embedded_ids(lib.id, key)
            if not truth:
                continue
            dim = cat.vectors_for([min(truth)], key).shape[1]
            idx = VectorIndex.load(index_path(paths.indexes, lib.id, key), dim)
            assert set(idx.ids().tolist()) == truth


# 1 -------------------------------------------------------------------------------------------
def test_01_decompression_bomb_is_skipped_as_too_large_and_indexing_continues(home, cli, photos):
    from engine.samples import make_problem_files

    bomb = make_problem_files(photos / "problems")["bomb_png"]
    for p in (photos / "problems").iterdir():
        if p != bomb:
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    summary = cli.json("index", str(photos), *MODEL)
    rel = str(bomb.relative_to(photos))
    assert [u for u in summary["unreadable"] if u["path"] == rel] == [{"path": rel, "reason": "too large"}]
    assert summary["new"] == 24  # every other picture was indexed


# 2 -------------------------------------------------------------------------------------------
def test_02_truncated_empty_and_text_files_are_reported_in_cli_and_catalog(home, cli, photos):
    from engine.samples import make_problem_files

    made = make_problem_files(photos / "bad")
    keep = {made[k] for k in ("empty", "text", "truncated_jpeg")}
    for p in (photos / "bad").iterdir():
        if p not in keep:
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    rc, out, err = cli("index", str(photos), *MODEL)
    assert rc == 0, err
    assert "unreadable (3):" in out
    for name in ("empty.jpg", "notes.jpg", "truncated.jpg"):
        assert f"bad/{name}: " in out
    with Catalog(get_paths(str(home)).catalog) as cat:
        reasons = {r.rel_path: r.reason for r in cat.unreadable(cat.libraries()[0].id)}
    assert reasons == {"bad/empty.jpg": "empty file", "bad/notes.jpg": "not an image",
                       "bad/truncated.jpg": "truncated"}
    libs = cli.json("libraries")
    assert libs[0]["counts"] == {"ok": 24, "unreadable": 3}


# 3 -------------------------------------------------------------------------------------------
SCAN_AS_NOBODY = textwrap.dedent("""
    import json, os, sys
    from engine.indexing.scanner import FileEntry, scan_folder
    from engine.indexing.decode import SUPPORTED_EXTENSIONS
    if os.geteuid() == 0:  # root ignores permissions: scan as nobody (everything imported first)
        os.setgroups([]); os.setgid(65534); os.setuid(65534)
    out = {"files": [], "skipped": []}
    for e in scan_folder(sys.argv[1], SUPPORTED_EXTENSIONS):
        if isinstance(e, FileEntry):
            out["files"].append(e.rel_path)
        else:
            out["skipped"].append([e.rel_path, e.reason])
    print(json.dumps(out))
""")


@pytest.fixture
def shared_tmp():
    """A folder other users can reach (pytest's tmp_path is private to its owner)."""
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="longlens-perm-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_03_broken_links_loops_and_permission_denied_are_skipped_and_the_scan_ends(shared_tmp, sample_master):
    tmp_path = shared_tmp
    root = tmp_path / "tree"
    shutil.copytree(sample_master, root)
    (root / "broken.jpg").symlink_to(tmp_path / "nowhere.jpg")
    (root / "loop").symlink_to(root)  # a folder link back to the root
    (root / "self.jpg").symlink_to(root / "self.jpg")  # ELOOP
    locked_dir = root / "private"
    locked_dir.mkdir()
    shutil.copy(next(sample_master.rglob("*.jpg")), locked_dir / "secret.jpg")
    locked_file = root / "locked.jpg"
    shutil.copy(next(sample_master.rglob("*.png")), locked_file)
    locked_dir.chmod(0o000)
    locked_file.chmod(0o000)
    for parent in tmp_path.parents:  # the unprivileged child must reach the tree
        if not os.stat(parent).st_mode & 0o001:
            pytest.skip(f"{parent} is not searchable by other users")
    try:
        proc = subprocess.run([sys.executable, "-c", SCAN_AS_NOBODY, str(root)], capture_output=True,
                              text=True, timeout=120, env=child_env(), cwd=ROOT)
    finally:
        locked_dir.chmod(0o755)
        locked_file.chmod(0o644)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    skipped = dict(map(tuple, got["skipped"]))
    assert skipped["broken.jpg"] == "broken symlink"
    assert skipped["loop"] == "symlink loop"
    assert "self.jpg" in skipped and "unreadable" in skipped["self.jpg"]
    assert skipped["private"] == "permission denied"
    assert skipped["locked.jpg"] == "permission denied"
    assert len(got["files"]) == 24  # everything readable was found, once


# 4 -------------------------------------------------------------------------------------------
def test_04_missing_root_deletes_nothing_and_is_shown_offline(home, cli, photos, tmp_path):
    assert cli("index", str(photos), *MODEL)[0] == 0
    before = rows(home)
    shutil.move(photos, tmp_path / "unplugged")
    rc, out, _ = cli("index", str(photos), *MODEL)
    assert rc == 3 and "OFFLINE" in out
    assert rows(home) == before
    assert cli.json("libraries")[0]["status"] == "offline"
    shutil.move(tmp_path / "unplugged", photos)  # plugged back in: everything is still there
    summary = cli.json("index", str(photos), *MODEL)
    assert (summary["unchanged"], summary["deleted"], summary["embedded"]) == (24, 0, 0)


# 5 -------------------------------------------------------------------------------------------
def test_05_moved_and_renamed_files_keep_row_vector_and_metadata_without_inference(home, cli, photos):
    assert cli("index", str(photos), *MODEL)[0] == 0
    before = rows(home)
    src = sorted(photos.rglob("*.jpg"))[0]
    rel = str(src.relative_to(photos))
    with Catalog(get_paths(str(home)).catalog) as cat:
        old_rec = {r.rel_path: r for r in cat.image_records(cat.libraries()[0].id)}[rel]
    (photos / "moved here").mkdir()
    src.rename(photos / "moved here" / "renamed.jpg")
    summary = cli.json("index", str(photos), *MODEL)
    assert (summary["moved"], summary["embedded"], summary["deleted"]) == (1, 0, 0)
    after = rows(home)
    assert rel not in after
    assert after["moved here/renamed.jpg"] == before[rel]  # same id, status and vector bytes
    with Catalog(get_paths(str(home)).catalog) as cat:
        rec = {r.rel_path: r for r in cat.image_records(cat.libraries()[0].id)}["moved here/renamed.jpg"]
    fields = ("id", "content_hash", "width", "height", "exif_date", "camera_make", "camera_model", "orientation")
    assert [getattr(rec, f) for f in fields] == [getattr(old_rec, f) for f in fields]
    assert_catalog_and_index_agree(home)


# 6 -------------------------------------------------------------------------------------------
def test_06_deleted_files_are_soft_deleted_and_purged_only_on_request(home, cli, photos):
    assert cli("index", str(photos), *MODEL)[0] == 0
    gone = sorted(photos.rglob("*.png"))[0]
    rel = str(gone.relative_to(photos))
    gone.unlink()
    summary = cli.json("index", str(photos), *MODEL)
    assert summary["deleted"] == 1
    assert rows(home)[rel][1] == "deleted"
    hits = cli.json("search", "a picture", *MODEL, "--top", "50")["results"]
    assert all(h["path"] != str(gone) for h in hits) and len(hits) == 23
    assert cli.json("index", str(photos), *MODEL)["deleted"] == 0  # a re-scan keeps the row
    assert rel in rows(home)
    with Catalog(get_paths(str(home)).catalog) as cat:
        assert cat.purge_deleted() == 1  # the user's explicit request
    assert rel not in rows(home)
    assert_catalog_and_index_agree(home)


# 9 -------------------------------------------------------------------------------------------
SAVE_LOOP = textwrap.dedent("""
    import sys
    from engine.index.vector_index import VectorIndex
    path, sources = sys.argv[1], sys.argv[2:]
    versions = [VectorIndex.load(s, 64, exact_threshold=t) for s, t in zip(sources, (10**9, 0))]
    print("ready", flush=True)
    i = 0
    while True:
        versions[i % 2].save(path)
        i += 1
""")


def test_09_kill_while_saving_the_index_leaves_a_whole_file(tmp_path):
    import random

    rng = np.random.default_rng(9)
    sources = []
    for n, threshold in ((12000, 10**9), (1500, 0)):  # a 3 MB exact file and an hnsw one
        v = rng.standard_normal((n, 64)).astype(np.float32)
        idx = VectorIndex(64, exact_threshold=threshold, M=8, ef_construction=40)
        idx.add(np.arange(n), v / np.linalg.norm(v, axis=1, keepdims=True))
        sources.append(tmp_path / f"v{n}.llidx")
        idx.save(sources[-1])
    work = tmp_path / "work"
    work.mkdir()
    path = work / "lib.llidx"
    shutil.copy(sources[0], path)
    rnd = random.Random(9)
    for _ in range(3):
        proc = subprocess.Popen([sys.executable, "-c", SAVE_LOOP, str(path), *map(str, sources)],
                                stdout=subprocess.PIPE, text=True, env=child_env(), cwd=ROOT)
        try:
            assert proc.stdout.readline().strip() == "ready"
            time.sleep(rnd.uniform(0.05, 0.6))  # somewhere inside one of the back-to-back saves
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            proc.stdout.close()
        idx = VectorIndex.load(path, 64)  # never a half-written file
        assert len(idx) in (12000, 1500)
        # Only temp files of the killed save may remain; they are never read as the index.
        assert all(p.name.startswith(f".{path.name}.") for p in work.iterdir() if p != path)
    # Orphans of crashed saves are removed when the index is next opened, once they are old
    # enough not to belong to a save still running in another process.
    orphan = work / f".{path.name}.abc123.tmp"
    orphan.write_bytes(b"x" * 100)
    fresh = work / f".{path.name}.def456.tmp"
    fresh.write_bytes(b"y")
    old = time.time() - 2 * STALE_TEMP_AGE_S
    os.utime(orphan, (old, old))
    leftovers = [p for p in work.iterdir() if p.name.endswith(".tmp") and p not in (orphan, fresh)]
    for p in leftovers:
        os.utime(p, (old, old))
    assert set(remove_stale_temp_files(path)) == {orphan, *leftovers}
    assert sorted(work.iterdir()) == sorted([path, fresh])


# 11 ------------------------------------------------------------------------------------------
def test_11_indexing_while_searching_in_threads(home, photos, tmp_path):
    from engine.samples import make_sample_folder
    from engine.services import Services

    make_sample_folder(photos / "more", n=48, seed=77, size=(96, 72))
    errors: list[BaseException] = []
    done = threading.Event()
    searches = 0
    with Services(get_paths(str(home))) as svc:
        embedder = svc.embedder(TINY_MODEL, device="cpu")
        last_progress(svc.indexer(embedder, batch_size=4).run(sorted(photos.iterdir())[0]))  # a library exists

        def search_loop() -> None:
            nonlocal searches
            searcher = svc.searcher(embedder)
            while not done.is_set():
                try:
                    hits = searcher.search_text("a tree next to a bench", top_k=10).hits
                    assert all(Path(h.path).exists() for h in hits)
                    searcher.search_vector(np.ones(embedder.dim, np.float32) / np.sqrt(embedder.dim), 5)
                    searches += 1
                except BaseException as exc:  # noqa: BLE001  (collected, re-raised below)
                    errors.append(exc)
                    return

        threads = [threading.Thread(target=search_loop) for _ in range(3)]
        for t in threads:
            t.start()
        try:
            summary = last_progress(svc.indexer(embedder, batch_size=4).run(photos)).extra["summary"]
        finally:
            done.set()
            for t in threads:
                t.join(60)
        assert not errors, errors
        assert searches > 0 and summary.new > 0 and not summary.cancelled
    assert_catalog_and_index_agree(home)


# 12 ------------------------------------------------------------------------------------------
def test_12_index_grows_past_its_capacity_under_the_writer_lock_while_read(tmp_path):
    from engine.index.vector_index import MIN_CAPACITY

    rng = np.random.default_rng(12)
    dim = 16
    idx = VectorIndex(dim, exact_threshold=0)
    idx.add(np.arange(10), rng.standard_normal((10, dim)).astype(np.float32))
    start_capacity = idx.stats()["capacity"]
    errors: list[BaseException] = []
    stop = threading.Event()

    def reader() -> None:
        q = rng.standard_normal((1, dim)).astype(np.float32)
        while not stop.is_set():
            try:
                ids, _ = idx.query(q, 5)[0]
                assert len(ids) == 5
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)
                return

    t = threading.Thread(target=reader)
    t.start()
    try:
        for start in range(10, 3 * MIN_CAPACITY, 256):
            idx.add(np.arange(start, start + 256), rng.standard_normal((256, dim)).astype(np.float32))
    finally:
        stop.set()
        t.join(30)
    assert not errors, errors
    stats = idx.stats()
    assert stats["capacity"] > start_capacity and stats["count"] == len(idx) == 10 + ((3 * MIN_CAPACITY - 10 + 255) // 256) * 256
    idx.save(tmp_path / "grown.llidx")
    assert len(VectorIndex.load(tmp_path / "grown.llidx", dim, exact_threshold=0)) == len(idx)


# 13 ------------------------------------------------------------------------------------------
def test_13_mass_delete_then_add_reuses_slots_and_stays_bounded(tmp_path):
    rng = np.random.default_rng(13)
    dim, n = 16, 1500
    idx = VectorIndex(dim, exact_threshold=0, M=8, ef_construction=40)
    idx.add(np.arange(n), rng.standard_normal((n, dim)).astype(np.float32))
    idx.save(tmp_path / "a.llidx")
    first = idx.stats()
    size_first = (tmp_path / "a.llidx").stat().st_size
    for round_ in range(3):
        live = idx.ids()
        idx.delete(live[: int(0.9 * len(live))])
        new_ids = np.arange(n * (round_ + 1) + 10**6, n * (round_ + 1) + 10**6 + int(0.9 * n))
        idx.add(new_ids, rng.standard_normal((len(new_ids), dim)).astype(np.float32))
    after = idx.stats()
    assert after["count"] == n
    assert after["slots"] == first["slots"] and after["capacity"] == first["capacity"]
    assert after["memory_bytes"] <= first["memory_bytes"] * 1.05
    idx.save(tmp_path / "b.llidx")
    assert (tmp_path / "b.llidx").stat().st_size == size_first


# 14 ------------------------------------------------------------------------------------------
HOLD_LOCK = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from desktop_app.app import acquire_instance_lock
    lock = acquire_instance_lock(Path(sys.argv[1]))
    print("locked", flush=True)
    time.sleep(600)
""")


def test_14_second_instance_is_refused_and_a_killed_first_one_does_not_block(tmp_path):
    pytest.importorskip("PySide6")
    from desktop_app.app import AlreadyRunning, acquire_instance_lock

    data = tmp_path / "data"
    proc = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(data)], stdout=subprocess.PIPE, text=True,
                            env=child_env(QT_QPA_PLATFORM="offscreen"), cwd=ROOT)
    try:
        assert proc.stdout.readline().strip() == "locked"
        with pytest.raises(AlreadyRunning) as info:
            acquire_instance_lock(data)
        assert "already running on this catalog" in str(info.value) and str(proc.pid) in str(info.value)
    finally:
        proc.send_signal(signal.SIGKILL)  # the first window dies without cleaning up
        proc.wait()
        proc.stdout.close()
    lock = acquire_instance_lock(data)  # its stale lock does not lock the user out
    lock.unlock()


# 15 ------------------------------------------------------------------------------------------
def test_15_concurrent_writers_never_surface_sqlite_busy(home, cli, photos, tmp_path):
    from engine.samples import make_sample_folder

    other = tmp_path / "other"
    make_sample_folder(other, n=24, seed=15, size=(96, 72))
    env = {**os.environ, "LONGLENS_HOME": str(home)}
    procs = [subprocess.Popen([sys.executable, "-m", "engine", "index", str(folder), *MODEL, "--batch-size", "2",
                               "--quiet"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for folder in (photos, other)]
    # A third writer in this process: review-style meta writes in a tight loop meanwhile.
    writes = 0
    with Catalog(get_paths(str(home)).catalog) as cat:
        while any(p.poll() is None for p in procs):
            cat.set_meta("writer-test", str(writes))
            writes += 1
            time.sleep(0.01)
    outputs = [p.communicate() for p in procs]
    for p, (_out, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err
        assert "locked" not in err and "busy" not in err.lower()
    assert writes > 0
    libs = {Path(r["root"]).name: r["counts"] for r in cli.json("libraries")}
    assert libs == {"photos": {"ok": 24}, "other": {"ok": 24}}
    assert_catalog_and_index_agree(home)


# 16 ------------------------------------------------------------------------------------------
DISK_FULL = textwrap.dedent("""
    import resource, signal, sys
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails like ENOSPC
    limit = int(sys.argv[1])
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    from engine.cli import main
    sys.exit(main(sys.argv[2:]))
""")


def test_16_disk_full_while_writing_is_a_clear_error_and_corrupts_nothing(home, cli, photos):
    from engine.samples import make_sample_folder

    assert cli("index", str(photos), *MODEL)[0] == 0
    committed = rows(home)
    make_sample_folder(photos / "more", n=60, seed=16, size=(96, 72))
    catalog_size = (home / "data" / "catalog.sqlite3").stat().st_size
    env = {**os.environ, "LONGLENS_HOME": str(home)}
    failures = 0
    for limit in (catalog_size // 2, catalog_size + 30_000):
        proc = subprocess.run([sys.executable, "-c", DISK_FULL, str(limit), "index", str(photos), *MODEL,
                               "--batch-size", "8", "--quiet"], cwd=ROOT, env=child_env(**env), capture_output=True,
                              text=True, timeout=300)
        assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
        if proc.returncode != 0:
            failures += 1
            assert proc.returncode == 2 and "longlens: error:" in proc.stderr and "catalog" in proc.stderr
        now = rows(home)
        assert all(now[p] == v for p, v in committed.items())  # nothing committed was lost
        with Catalog(get_paths(str(home)).catalog) as cat:
            assert cat.integrity_check() == "ok"
        committed = now
    assert failures > 0  # the limits really did fill the "disk"
    assert cli("index", str(photos), *MODEL)[0] == 0  # space again: it completes
    assert len(rows(home)) == 84
    assert_catalog_and_index_agree(home)


# 17 ------------------------------------------------------------------------------------------
def test_17_pickled_weights_are_refused_without_running_them(tmp_path, monkeypatch, cli, blip_tiny_checkpoint):
    import pickle

    monkeypatch.setenv("LONGLENS_HOME", str(tmp_path / "home"))
    marker = tmp_path / "pwned"

    class RunsCode:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    folder = tmp_path / "model"
    shutil.copytree(blip_tiny_checkpoint, folder)
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps(RunsCode()))
    rc, _out, err = cli("models", "import", str(folder), "--name", "evil")
    assert rc == 2 and "pickle" in err.lower()
    assert not marker.exists()
    assert all(m["name"] != "evil" or not m["installed"] for m in cli.json("models", "list"))


# 18 ------------------------------------------------------------------------------------------
def test_18_tampered_model_fails_its_hash_and_is_refused_with_how_to_get_it_again(home, cli, photos):
    weights = home / "models" / TINY_MODEL / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-100] ^= 0xFF
    weights.write_bytes(bytes(data))
    rc, out, _ = cli("models", "verify", TINY_MODEL)
    assert rc == 1 and "mismatch" in out.lower()
    rc, _, err = cli("index", str(photos), *MODEL)
    assert rc == 2 and "re-import" in err, err  # refused, and told how to get a good copy again
    assert not (home / "data" / "catalog.sqlite3").exists() or rows(home) == {}


# 19 ------------------------------------------------------------------------------------------
def test_19_offline_first_run_says_a_model_is_needed_and_the_demo_model_works(tmp_path, monkeypatch, cli,
                                                                               sample_master):
    from engine.models.registry import bundled_model_dir

    monkeypatch.setenv("LONGLENS_HOME", str(tmp_path / "fresh"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    have_demo = (bundled_model_dir("sceneworld-mini") / "model.safetensors").is_file()
    rc, out, err = cli("search", "a red bicycle")
    if have_demo:  # the bundled demo model answers (nothing is indexed yet), offline
        assert rc == 0 and "no results" in out
    else:
        assert rc == 2 and "no model is installed" in err and "longlens demo" in err
    rc, _, err = cli("index", str(sample_master), "--model", "blip-itm-base-coco")
    assert rc == 2 and "not installed" in err and "models pull blip-itm-base-coco" in err
    rc, _, err = cli("models", "pull", "blip-itm-base-coco")
    assert rc == 2 and "Traceback" not in err and "models import" in err  # the offline way in is named
    if not have_demo:
        pytest.skip("sceneworld-mini weights are not in this checkout")
    photos = tmp_path / "photos"
    shutil.copytree(sample_master, photos)
    assert cli("index", str(photos), "--model", "sceneworld-mini", "--quiet")[0] == 0
    assert len(cli.json("search", "a red ball on the grass", "--model", "sceneworld-mini")["results"]) == 20


# 21 ------------------------------------------------------------------------------------------
def test_21_every_exif_orientation_gives_upright_thumbnails_and_the_same_embedding(home, tmp_path):
    from PIL import ImageChops

    from engine.samples import marker_picture, stored_for_orientation, write_image
    from engine.services import Services
    from engine.thumbnails import render_thumbnail

    folder = tmp_path / "orient"
    upright = marker_picture((96, 64))
    for o in range(1, 9):
        write_image(folder / f"o{o}.png", stored_for_orientation(upright, o), "PNG", orientation=o)
    # Control: the sideways pixels of orientation 6 with no tag to turn them.
    write_image(folder / "sideways.png", stored_for_orientation(upright, 6), "PNG")
    with Services(get_paths(str(home))) as svc:
        embedder = svc.embedder(TINY_MODEL, device="cpu")
        last_progress(svc.indexer(embedder, batch_size=4).run(folder))
        lib = svc.catalog.library_by_root(folder)
        recs = {r.rel_path: r for r in svc.catalog.image_records(lib.id)}
        vecs = {name: svc.catalog.vectors_for([r.id], embedder.identity)[0] for name, r in recs.items()}
    ref = vecs["o1.png"]
    for o in range(2, 9):
        assert np.allclose(vecs[f"o{o}.png"], ref, atol=1e-4), o
        assert (recs[f"o{o}.png"].width, recs[f"o{o}.png"].height) == (96, 64)
        thumb = render_thumbnail(folder / f"o{o}.png", 48)
        assert thumb.size == (48, 32)
        assert ImageChops.difference(thumb, render_thumbnail(folder / "o1.png", 48)).getbbox() is None
    assert not np.allclose(vecs["sideways.png"], ref, atol=1e-3)  # turning really changes the vector


# 22 ------------------------------------------------------------------------------------------
def test_22_awkward_formats_are_decoded_or_skipped_with_a_reason(home, cli, tmp_path):
    from engine.samples import make_problem_files

    folder = tmp_path / "formats"
    made = make_problem_files(folder)
    wanted = {"png16", "cmyk_jpeg", "cmyk_jpeg_plain", "palette_alpha_png", "rgba_png", "animated_gif",
              "animated_webp", "gray_jpeg", "onebit_png"}
    for name, p in made.items():
        if name not in wanted and p.exists():
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    heic = None
    try:
        from pillow_heif import register_heif_opener

        register_heif_opener()
        from engine.samples import procedural_picture

        heic = folder / "iphone.heic"
        procedural_picture(np.random.default_rng(22), (64, 48)).save(heic, "HEIF")
    except Exception:  # noqa: BLE001  (no HEIF encoder here: the decoder side is still checked)
        heic = None
    summary = cli.json("index", str(folder), *MODEL)
    expected = len(wanted) + (heic is not None)
    assert summary["scanned"] == expected
    assert summary["new"] + len(summary["unreadable"]) == expected
    assert summary["unreadable"] == []  # all of these are decodable pictures


# 25 ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("query", "outcome"), [
    ("the red ball " * 1700, "truncated"),            # ~5,000 words
    ("", "error"),
    ("   \t\n ", "error"),
    ("?!... ,;:", "results"),
    ("東京の夜景、赤い自転車が青いドアに立てかけてある。", "results"),
    ("Кошка сидит на красном диване.", "results"),
    ("\x00\x07\x1b[31m", "results"),  # control bytes dropped, "[31m" left
    ("\x00\x01\x02\x7f", "error"),
    ("\udcff\udcfe", "error"),  # undecodable argv bytes arrive as lone surrogates
    ("a red ball \udcff on grass", "results"),
])
def test_25_any_query_gets_results_or_a_clear_message(home, cli, photos, query, outcome):
    assert cli("index", str(photos), *MODEL, "--quiet")[0] == 0
    rc, out, err = cli("search", query, *MODEL, "--json")
    assert "Traceback" not in err
    if outcome == "error":
        assert rc == 2 and "the query is empty" in err
        return
    assert rc == 0, err
    result = json.loads(out)
    assert len(result["results"]) == 20
    assert result["truncated"] == (outcome == "truncated")
    if outcome == "truncated":
        rc, text_out, _ = cli("search", query, *MODEL)
        assert rc == 0 and "(TRUNCATED)" in text_out


# 26 ------------------------------------------------------------------------------------------
def test_26_odd_file_names_are_indexed_and_printed(home, photos, tmp_path):
    src = sorted(photos.rglob("*.jpg"))[0]
    odd = tmp_path / "odd names"
    odd.mkdir()
    names = [os.fsdecode(b"caf\xe9 latin-1.jpg"), "東京 駅 photo.jpg", "x" * 240 + ".jpg", "a  b\tc.jpg",
             "emoji 😀.jpg", "ＡＢＣ full-width.jpg"]
    for n in names:
        shutil.copy(src, odd / n)
    env = {**os.environ, "LONGLENS_HOME": str(home), "PYTHONIOENCODING": "utf-8:strict"}  # a strict terminal
    done = subprocess.run([sys.executable, "-m", "engine", "index", str(odd), *MODEL, "--json"], cwd=ROOT,
                          env=env, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    assert json.loads(done.stdout)["new"] == len(names)
    for fmt in ([], ["--json"]):
        got = subprocess.run([sys.executable, "-m", "engine", "search", "a picture", *MODEL, "--folder", str(odd),
                              *fmt], cwd=ROOT, env=env, capture_output=True, timeout=300)
        assert got.returncode == 0 and b"Traceback" not in got.stderr, got.stderr.decode(errors="replace")
        # The terminal gets valid UTF-8 (item 44: no raw byte of a name reaches it).
        text = got.stdout.decode("utf-8")
        if fmt:  # JSON gives each name exactly (a byte that is not UTF-8 as a \udcXX escape)
            shown = {h["path"] for h in json.loads(text)["results"]}
            assert shown == {str(odd / n) for n in names}
        else:  # shown on one line each, an undecodable byte as \xNN and a tab as \t, like `ls -b`
            for n in names:
                assert inert(str(odd / n)) in text
            assert "caf\\xe9 latin-1.jpg" in text and "a  b\\tc.jpg" in text


# 27 ------------------------------------------------------------------------------------------
def test_27_malformed_caption_files_report_lines_process_the_rest_and_write_whole_reports(home, cli, photos,
                                                                                          tmp_path):
    imgs = sorted(photos.rglob("*.jpg"))
    lines = [
        json.dumps({"image": str(imgs[0]), "caption": "A red ball on the grass."}),
        "{not json",
        json.dumps({"image": "missing.jpg", "caption": "Nothing."}),
        json.dumps({"image": str(imgs[1]), "caption": "Two clouds\u2028and a tree."}),  # a line separator inside
        json.dumps({"picture": str(imgs[2]), "caption": "wrong column"}),
        json.dumps({"image": str(imgs[3]), "caption": "A bench by a tree."}),
    ]
    cap = tmp_path / "captions.jsonl"
    cap.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "report.jsonl"
    out.write_text("previous report\n", encoding="utf-8")
    rc, stdout, err = cli("check", str(cap), "--out", str(out), *MODEL)
    assert rc == 1
    assert f"{cap}:2: not valid JSON" in err and f"{cap}:3: " in err and f"{cap}:5: no image path" in err
    # One JSON object per "\n" line (splitlines() would also break at the U+2028 in line 4).
    report = [json.loads(x) for x in out.read_text(encoding="utf-8").split("\n") if x]
    assert [r["line"] for r in report] == [1, 2, 3, 4, 5, 6]
    assert [r["verdict"] == "error" for r in report] == [False, True, True, False, True, False]
    assert "checked 6 lines" in stdout
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".report")] == []
    # Training data: the same kinds of damage, reported by line, the good lines kept.
    train = tmp_path / "train.jsonl"
    train.write_text("\n".join([
        json.dumps({"image": str(imgs[0]), "original_caption": "a ball", "paragraph": "A red ball."}),
        "[1, 2",
        json.dumps({"image": "missing.jpg", "original_caption": "x"}),
        json.dumps({"image": str(imgs[1]), "original_caption": 7}),
        json.dumps({"image": str(imgs[2]), "original_caption": "a bench", "paragraph": "A bench."}),
    ]) + "\n", encoding="utf-8")
    rc, out, _ = cli("train", "validate", str(train), "--json")
    report = json.loads(out)
    assert rc == 1 and report["skipped_lines"] == [2, 3, 4] and report["valid"] == 2
