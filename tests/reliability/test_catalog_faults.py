"""Catalog and index-folder faults (issue 16 items 3, 8, 9, 12, 14): odd home paths, refused catalogs
that must stay byte-identical, folders in the way, read-only index folders, cancelled runs, and a
really corrupted SQLite file. Real CLI, real files, real SQLite."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from engine.catalog import Catalog
from tests.e2e.conftest import TINY_MODEL
from tests.reliability.conftest import corrupt_table_page
from tests.reliability.crash_harness import committed_count

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(300)


def sha256(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def folder_listing(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


def import_tiny(cli, checkpoint: Path) -> None:
    rc, _, err = cli("models", "import", str(checkpoint), "--name", TINY_MODEL)
    assert rc == 0, err


# -- item 3: any legal path works as the home / catalog path ---------------------------------------
@pytest.mark.parametrize("name", ["cat?one", "a%20b %41 #frag &x=1 ;semi é ünï 目录\nsecond line"])
def test_any_legal_home_path_keeps_the_catalog_where_it_belongs(
        name, tmp_path, monkeypatch, cli, photos, blip_tiny_checkpoint):
    parent = tmp_path / "parent"
    parent.mkdir()
    home = parent / name
    monkeypatch.setenv("LONGLENS_HOME", str(home))
    import_tiny(cli, blip_tiny_checkpoint)
    summary = cli.json("index", str(photos), "--model", TINY_MODEL)
    assert summary["new"] > 0 and not summary["cancelled"]
    catalog = home / "data" / "catalog.sqlite3"
    assert catalog.is_file()
    # Nothing was written beside the home (e.g. "cat" for "cat?one").
    assert folder_listing(parent) == {name}
    with sqlite3.connect(catalog.as_uri() + "?mode=ro", uri=True) as con:
        assert con.execute("SELECT count(*) FROM images WHERE status = 'ok'").fetchone()[0] == summary["new"]
    found = cli.json("search", "a photo", "--model", TINY_MODEL)
    assert len(found["results"]) > 0
    libs = cli.json("libraries")
    assert [lib["root"] for lib in libs] == [str(photos.resolve())]


# make stress: the in-process CLI test above runs the same verbs on the same paths in make test.
@pytest.mark.stress
def test_home_path_with_odd_characters_through_a_real_subprocess(tmp_path, blip_tiny_checkpoint, photos):
    home = tmp_path / "h?x=1%2F#y"
    env = {**os.environ, "LONGLENS_HOME": str(home)}
    for args in (["models", "import", str(blip_tiny_checkpoint), "--name", TINY_MODEL],
                 ["index", str(photos), "--model", TINY_MODEL, "--quiet"]):
        r = subprocess.run([sys.executable, "-m", "engine", *args], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=240)
        assert r.returncode == 0, r.stderr
    assert (home / "data" / "catalog.sqlite3").is_file()
    assert folder_listing(tmp_path) == {home.name, "photos"}


# -- items 8 and 9: refused catalogs stay byte-identical ---------------------------------------------
def _catalog_with_version(paths, version: int) -> Path:
    with Catalog(paths.catalog):
        pass
    con = sqlite3.connect(paths.catalog)
    con.execute(f"PRAGMA user_version={version}")
    con.commit()
    con.close()
    return paths.catalog


@pytest.mark.parametrize("version, words", [(99, "newer Longlens"), (-1, "version -1")])
def test_refused_catalog_version_is_a_clear_error_and_stays_byte_identical(
        version, words, home, paths, cli, photos):
    catalog = _catalog_with_version(paths, version)
    before, listing = sha256(catalog), folder_listing(catalog.parent)
    for args in (("libraries",), ("index", str(photos), "--model", TINY_MODEL),
                 ("search", "a photo", "--model", TINY_MODEL)):
        rc, _, err = cli(*args)
        assert rc == 2, (args, err)
        assert words in err and str(catalog) in err and "not modified" in err
        assert "Traceback" not in err
    assert sha256(catalog) == before
    assert folder_listing(catalog.parent) == listing  # no -wal/-shm left behind


def test_a_file_that_is_not_sqlite_is_refused_unchanged(home, paths, cli):
    paths.catalog.parent.mkdir(parents=True, exist_ok=True)
    paths.catalog.write_bytes(b"not a database at all\n" * 20)
    before = sha256(paths.catalog)
    rc, _, err = cli("libraries")
    assert rc == 2 and "not an SQLite database" in err and str(paths.catalog) in err
    assert sha256(paths.catalog) == before


# -- item 8: data folders in the way, a read-only index folder ----------------------------------------
def test_indexes_folder_being_a_file_is_a_clear_error(home, paths, cli, photos):
    shutil.rmtree(paths.indexes, ignore_errors=True)
    paths.indexes.parent.mkdir(parents=True, exist_ok=True)
    paths.indexes.write_text("I am in the way")
    for args in (("index", str(photos), "--model", TINY_MODEL), ("libraries",)):
        rc, _, err = cli(*args)
        assert rc == 2, err
        assert str(paths.indexes) in err and "is a file, not a folder" in err
    assert paths.indexes.read_text() == "I am in the way"


@contextmanager
def read_only_folder(folder: Path) -> Iterator[None]:
    """A folder nobody can create files in. Root ignores permission bits, so as root the folder is
    made immutable (chattr +i), which the kernel enforces for root too."""
    as_root = os.geteuid() == 0
    if as_root:
        if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(folder)]).returncode:
            pytest.skip("running as root without chattr: cannot make a folder read-only")
    else:
        os.chmod(folder, 0o555)
    try:
        yield
    finally:
        if as_root:
            subprocess.run(["chattr", "-i", str(folder)], check=True)
        else:
            os.chmod(folder, 0o755)


def test_read_only_indexes_folder_still_searches_from_memory(home, paths, cli, photos, tmp_path):
    held = tmp_path / "held"
    held.mkdir()
    extra = [photos / n for n in ("sample_000.jpg", "sample_003.jpg", "sample_012.jpg")]
    for p in extra:
        shutil.move(p, held / p.name)
    assert cli.json("index", str(photos), "--model", TINY_MODEL)["new"] > 0
    (index_file,) = list(paths.indexes.glob("*.llidx"))
    behind = index_file.read_bytes()
    for p in extra:
        shutil.move(held / p.name, photos / p.name)
    assert cli.json("index", str(photos), "--model", TINY_MODEL)["new"] == 3
    index_file.write_bytes(behind)  # now 3 rows behind the catalog: opening it reconciles and saves
    with read_only_folder(paths.indexes):
        r = subprocess.run([sys.executable, "-m", "engine", "search", "a photo", "--model", TINY_MODEL, "--json",
                            "--top", "100"], cwd=ROOT, env={**os.environ, "LONGLENS_HOME": str(home)},
                           capture_output=True, text=True, timeout=240)
        assert r.returncode == 0, r.stderr
        hits = json.loads(r.stdout)["results"]
        (lib,) = cli.json("libraries")
        assert len(hits) == lib["counts"]["ok"]  # the 3 reconciled rows are found too
        assert "could not save the updated index" in r.stderr and "from memory" in r.stderr
        # Indexing into it is a clear error, not a traceback; the catalog keeps every vector.
        (photos / "one_more.jpg").write_bytes(extra[0].read_bytes() + b"x")
        rc, _, err = cli("index", str(photos), "--model", TINY_MODEL)
        assert rc == 2 and "could not save the vector index" in err and "Traceback" not in err
    assert index_file.read_bytes() == behind


# -- item 12: a cancelled run reads "partly indexed · N pending" until a run completes ----------------
def test_ctrl_c_leaves_the_library_partly_indexed_with_its_pending_count(home, paths, cli, tmp_path):
    from engine.samples import make_sample_folder

    photos = tmp_path / "many"
    make_sample_folder(photos, n=120, seed=3)
    n_files = sum(1 for p in photos.rglob("*") if p.is_file())
    proc = subprocess.Popen(
        [sys.executable, "-m", "engine", "index", str(photos), "--model", TINY_MODEL, "--batch-size", "1",
         "--quiet", "--json"],
        cwd=ROOT, env={**os.environ, "LONGLENS_HOME": str(home)}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 200
        while committed_count(paths.catalog) < 2 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert proc.poll() is None, "indexing ended before it could be interrupted"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert json.loads(out)["cancelled"]
    rows = committed_count(paths.catalog)
    assert 0 < rows < n_files
    (lib,) = cli.json("libraries")
    assert lib["status"] == "partial"
    assert lib["pending"] == n_files - rows
    assert lib["state"] == f"partly indexed · {n_files - rows} pending"
    rc, text, _ = cli("libraries")
    assert rc == 0 and f"partly indexed · {n_files - rows} pending" in text
    # A run that completes makes it "indexed" again.
    assert not cli.json("index", str(photos), "--model", TINY_MODEL)["cancelled"]
    (lib,) = cli.json("libraries")
    assert lib["status"] == "online" and lib["state"] == "indexed" and lib["pending"] is None


def test_cancelled_engine_run_reports_pending_to_the_gui_facade(home, paths, photos):
    """The GUI's Cancel forwards a CancelToken to the same engine run; the facade reads the state."""
    pytest.importorskip("PySide6")
    from desktop_app.facade import Backend
    from desktop_app.views.library_view import describe
    from engine.jobs import CancelToken
    from engine.services import Services

    with Services(paths) as svc:
        token = CancelToken()
        job = svc.indexer(svc.embedder(TINY_MODEL), batch_size=2).run(photos, cancel=token)
        for p in job:
            if p.stage == "index":
                token.cancel()
        n_files = sum(1 for p in photos.rglob("*") if p.is_file())
        rows = len(svc.catalog.image_records(svc.catalog.libraries()[0].id))
    backend = Backend(paths)
    try:
        (info,) = backend.libraries()
        assert info.partial and info.pending == n_files - rows > 0
        assert describe(info, queued=False).startswith(f"Partly indexed · {n_files - rows} pending")
    finally:
        backend.close()


# -- item 14: a damaged catalog is found when opened for writing -----------------------------------
def _corrupt_table_page(catalog: Path, table: str) -> None:
    """conftest's corrupt_table_page, checked to have damaged the file."""
    corrupt_table_page(catalog, table)
    con = sqlite3.connect(catalog.as_uri() + "?mode=ro&immutable=1", uri=True)  # leaves no -wal/-shm
    try:
        assert con.execute("PRAGMA integrity_check").fetchone()[0] != "ok"
    except sqlite3.DatabaseError as exc:
        assert "malformed" in str(exc)
    finally:
        con.close()


@pytest.mark.parametrize("table", [
    # Never read by index or search: before the fix both went on with exit 0 over the damage.
    "review_sessions",
    # Read by both: a search that trips over the damage says what to do.
    "images",
])
def test_damaged_catalog_is_refused_for_writing_with_the_way_out(table, home, paths, cli, photos):
    assert cli.json("index", str(photos), "--model", TINY_MODEL)["new"] > 0
    _corrupt_table_page(paths.catalog, table)
    before = sha256(paths.catalog)
    listing = folder_listing(paths.catalog.parent)
    (photos / "added.jpg").write_bytes((photos / "sample_000.jpg").read_bytes() + b"changed")
    rc, _, err = cli("index", str(photos), "--model", TINY_MODEL)
    assert rc == 2, err
    assert "is damaged" in err and str(paths.catalog) in err and "check-catalog" in err
    assert "nothing was written" in err
    rc, out, err = cli("search", "a photo", "--model", TINY_MODEL)
    if table == "images":
        assert rc == 2 and "is damaged" in err and "check-catalog" in err
    else:  # readable parts can still be searched, with the damage said out loud
        assert rc == 0 and "is damaged" in err and "check-catalog" in err
    assert sha256(paths.catalog) == before
    assert folder_listing(paths.catalog.parent) == listing

    rc, out, _ = cli("check-catalog")
    assert rc == 1 and "DAMAGED" in out and "--rebuild" in out
    assert sha256(paths.catalog) == before
    rc, out, err = cli("check-catalog", "--rebuild")
    assert rc == 0, err
    assert f"{table}: 1 unreadable stretch" in out
    (kept,) = list(paths.catalog.parent.glob("catalog.sqlite3.damaged-*[0-9]"))
    assert sha256(kept) == before  # the damaged file is kept, untouched
    rc, out, _ = cli("check-catalog")
    assert rc == 0 and "integrity check ok" in out
    (lib,) = cli.json("libraries")
    assert lib["status"] == ("partial" if table == "images" else "online")
    # Indexing works again and restores every file.
    summary = cli.json("index", str(photos), "--model", TINY_MODEL)
    n_files = sum(1 for p in photos.rglob("*") if p.is_file())
    (lib,) = cli.json("libraries")
    assert lib["counts"].get("ok", 0) + lib["counts"].get("unreadable", 0) == n_files, summary
    assert lib["state"] == "indexed"
    assert len(cli.json("search", "a photo", "--model", TINY_MODEL)["results"]) > 0


def test_thumbnail_cache_folder_in_the_way_still_gives_thumbnails(tmp_path, sample_master):
    """The sibling under the cache folder: derived data that cannot be stored costs the cache entry only."""
    from engine.thumbnails import ThumbnailCache, make_thumbnail

    folder = tmp_path / "thumbnails"
    folder.write_text("in the way")
    image = make_thumbnail(sample_master / "sample_000.jpg", 64, ThumbnailCache(folder))
    assert 0 < max(image.size) <= 64
    assert folder.read_text() == "in the way"


def test_damage_is_found_with_leftover_wal_and_shm_files(home, paths, cli, photos):
    """A crashed process (or a read-only reader) leaves an empty -wal and a -shm: still checked."""
    assert cli.json("index", str(photos), "--model", TINY_MODEL)["new"] > 0
    _corrupt_table_page(paths.catalog, "review_sessions")
    con = sqlite3.connect(paths.catalog.as_uri() + "?mode=ro", uri=True)
    con.execute("PRAGMA user_version").fetchone()
    con.close()
    assert {"catalog.sqlite3-wal", "catalog.sqlite3-shm"} <= folder_listing(paths.catalog.parent)
    before = sha256(paths.catalog)
    rc, _, err = cli("index", str(photos), "--model", TINY_MODEL)
    assert rc == 2 and "is damaged" in err, err
    assert sha256(paths.catalog) == before


UPGRADE_UNDER_A_FULL_DISK = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails like ENOSPC
limit = int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
from engine.catalog import Catalog
from engine.errors import CatalogError
try:
    Catalog(sys.argv[1]).close()
except CatalogError as exc:
    print(exc)
    sys.exit(2)
"""


def test_an_upgrade_that_cannot_write_its_backup_changes_nothing(tmp_path):
    """The disk fills while the pre-migration backup is written: a clear error, the old catalog
    byte-identical, no partial backup left (a real SQLite file, a real file-size limit)."""
    path = tmp_path / "catalog.sqlite3"
    with Catalog(path) as cat:
        cat.add_library(tmp_path / "photos")
        cat.set_meta("padding", "x" * 200_000)  # a catalog larger than the limit below
    con = sqlite3.connect(path)
    con.execute("PRAGMA user_version=3")  # an older schema: opening it migrates, after a backup
    con.commit()
    con.close()
    before = path.read_bytes()
    proc = subprocess.run([sys.executable, "-c", UPGRADE_UNDER_A_FULL_DISK, str(path), "65536"],
                          cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert "could not back up" in proc.stdout and "the catalog was not changed" in proc.stdout
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["catalog.sqlite3"]


HOLD_THE_CATALOG_OPEN = """
import sys
from engine.catalog import Catalog
cat = Catalog(sys.argv[1])
cat.libraries()  # a live connection, as the app or an index run holds one
print("open", flush=True)
sys.stdin.readline()
cat.close()
"""


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX locks tell whether another process has it open")
def test_rebuild_is_refused_while_another_process_has_the_catalog_open(tmp_path):
    """check-catalog --rebuild swaps the file: a live process would go on writing to the old copy."""
    from engine.catalog.repair import rebuild_catalog
    from engine.errors import CatalogError

    path = tmp_path / "catalog.sqlite3"
    with Catalog(path) as cat:
        cat.add_library(tmp_path / "photos")
    holder = subprocess.Popen([sys.executable, "-c", HOLD_THE_CATALOG_OPEN, str(path)], cwd=Path(__file__).resolve().parents[2],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "open"
        before = sorted(p.name for p in tmp_path.iterdir())
        with pytest.raises(CatalogError, match="open in another Longlens process"):
            rebuild_catalog(path)
        assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing renamed, no temp file
    finally:
        holder.communicate("\n", timeout=60)
    assert holder.returncode == 0
    report = rebuild_catalog(path)  # nobody has it open any more
    assert report.copied["libraries"] == 1
    with Catalog(path) as cat:
        assert [lib.root for lib in cat.libraries()] == [str(tmp_path / "photos")]
