"""Issue 27 point 6 through the real CLI, on real files in temporary folders: one picture, one
library. A parent of an indexed folder absorbs it (its rows and vectors move, nothing is
re-embedded), a folder inside a library is refused with the way out, the same folder under another
name (a bind mount: same device and inode) is the same library, Longlens's own folders and other
libraries are never scanned as part of a library (also through a symbolic link), and `duplicates`
never calls one file a copy of itself and checks exact copies on their bytes."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest

from engine.catalog import Catalog
from engine.samples import procedural_picture, write_image
from tests.dated_pictures import file_state
from tests.duplicate_pictures import EXACT, make_duplicates_folder
from tests.e2e.conftest import TINY_MODEL

MODEL = ("--model", TINY_MODEL)


def _pictures(folder: Path, names: list[str], seed: int) -> dict[str, Path]:
    import numpy as np

    rng = np.random.default_rng(seed)
    return {n: write_image(folder / n, procedural_picture(rng, (96, 72)), "JPEG", quality=90) for n in names}


def _libraries(paths) -> list[tuple[str, dict[str, str]]]:
    with Catalog(paths.catalog) as cat:
        return [(lib.root, {r.rel_path: r.status for r in cat.image_records(lib.id)}) for lib in cat.libraries()]


def _search_paths(cli) -> list[str]:
    return [r["path"] for r in cli.json("search", "a picture", *MODEL, "--top", "100")["results"]]


def test_a_parent_absorbs_the_library_inside_it_and_nothing_is_counted_twice(home, paths, tmp_path, cli):
    photos = tmp_path / "photos"
    _pictures(photos / "2024", ["a.jpg", "b.jpg"], seed=1)
    _pictures(photos, ["top.jpg"], seed=2)
    child = cli.json("index", str(photos / "2024"), *MODEL)
    assert child["new"] == 2
    with Catalog(paths.catalog) as cat:
        (lib,) = cat.libraries()
        ids_before = {r.rel_path: r.id for r in cat.image_records(lib.id)}

    parent = cli.json("index", str(photos), *MODEL)
    # The child's two pictures moved in with their vectors: only top.jpg went through the model.
    assert (parent["new"], parent["embedded"], parent["unchanged"], parent["scanned"]) == (1, 1, 2, 3)
    assert parent["merged_libraries"] == [{"root": str((photos / "2024").resolve()), "pictures": 2,
                                           "already_held": 0}]
    ((root, rows),) = _libraries(paths)
    assert root == str(photos.resolve())
    assert rows == {"2024/a.jpg": "ok", "2024/b.jpg": "ok", "top.jpg": "ok"}
    with Catalog(paths.catalog) as cat:
        (lib,) = cat.libraries()
        moved = {r.rel_path: r.id for r in cat.image_records(lib.id)}
    assert {moved["2024/a.jpg"], moved["2024/b.jpg"]} == set(ids_before.values())  # the same rows

    hits = _search_paths(cli)
    assert sorted(hits) == sorted(str(p) for p in (photos.resolve() / "2024/a.jpg", photos.resolve() / "2024/b.jpg",
                                                   photos.resolve() / "top.jpg"))
    dups = cli.json("duplicates")
    assert dups["counts"]["exact"] == 0 and dups["looked_at"] == 3

    # The folder inside can no longer be indexed as a library of its own.
    rc, _, err = cli("index", str(photos / "2024"), *MODEL)
    assert rc == 2 and f"index {photos.resolve()} instead" in err


def test_the_merge_is_said_in_words(home, paths, tmp_path, cli):
    photos = tmp_path / "photos"
    _pictures(photos / "2024", ["a.jpg"], seed=1)
    assert cli("index", str(photos / "2024"), *MODEL, "--quiet")[0] == 0
    rc, out, _ = cli("index", str(photos), *MODEL, "--quiet")
    assert rc == 0
    assert (f"merged: the library {(photos / '2024').resolve()} lies inside this folder; its 1 picture is "
            "this library's now (nothing re-embedded)") in out


def test_a_parent_of_an_offline_library_waits_for_it(home, paths, tmp_path, cli):
    photos = tmp_path / "photos"
    _pictures(photos / "card", ["a.jpg"], seed=1)
    assert cli("index", str(photos / "card"), *MODEL, "--quiet")[0] == 0
    (photos / "card").rename(tmp_path / "card-away")  # the card is out of the reader
    _pictures(photos, ["top.jpg"], seed=2)
    before = _libraries(paths)
    rc, _, err = cli("index", str(photos), *MODEL)
    assert rc == 2 and f"the library {(photos / 'card').resolve()} lies inside {photos.resolve()} and is offline" in err
    assert _libraries(paths) == before
    (tmp_path / "card-away").rename(photos / "card")
    s = cli.json("index", str(photos), *MODEL)
    assert (s["new"], s["unchanged"], s["deleted"]) == (1, 1, 0)


def test_a_folder_inside_a_library_is_refused_with_the_way_out(home, paths, tmp_path, cli):
    photos = tmp_path / "photos"
    _pictures(photos / "2024", ["a.jpg"], seed=1)
    assert cli("index", str(photos), *MODEL, "--quiet")[0] == 0
    before = _libraries(paths)
    catalog_bytes = paths.catalog.read_bytes()
    rc, _, err = cli("index", str(photos / "2024"), *MODEL)
    assert rc == 2 and "Traceback" not in err
    assert f"is inside the library {photos.resolve()}" in err and f"index {photos.resolve()} instead" in err
    # A symbolic link to the inner folder is the inner folder.
    os.symlink(photos / "2024", tmp_path / "link-to-2024")
    rc, _, err = cli("index", str(tmp_path / "link-to-2024"), *MODEL)
    assert rc == 2 and f"is inside the library {photos.resolve()}" in err
    assert _libraries(paths) == before and paths.catalog.read_bytes() == catalog_bytes


def test_the_same_folder_under_another_name_is_the_same_library(home, paths, tmp_path, cli):
    photos = tmp_path / "photos"
    _pictures(photos, ["a.jpg", "b.jpg"], seed=3)
    other_name = tmp_path / "Photos-mounted"  # as a case-insensitive disk's other spelling would be
    other_name.mkdir()
    try:
        subprocess.run(["mount", "--bind", str(photos), str(other_name)], check=True, capture_output=True)
    except (subprocess.CalledProcessError, FileNotFoundError) as exc:
        pytest.skip(f"a bind mount is not permitted here: {exc}")
    try:
        assert cli.json("index", str(photos), *MODEL)["new"] == 2
        again = cli.json("index", str(other_name), *MODEL)
        assert (again["new"], again["unchanged"]) == (0, 2)
        ((root, rows),) = _libraries(paths)
        assert root == str(photos.resolve()) and set(rows) == {"a.jpg", "b.jpg"}
        # A folder inside it, by the other name, is inside it too.
        (photos / "sub").mkdir()
        rc, _, err = cli("index", str(other_name / "sub"), *MODEL)
        assert rc == 2 and f"inside the library {photos.resolve()}" in err
    finally:
        subprocess.run(["umount", str(other_name)], check=True)


def test_longlens_own_folders_are_never_indexed(home, paths, tmp_path, cli):
    # LONGLENS_HOME (tmp_path/home) lies inside the library: its thumbnails and backups are not photos.
    _pictures(tmp_path / "photos", ["a.jpg"], seed=4)
    paths.thumbnails.mkdir(parents=True, exist_ok=True)
    _pictures(paths.thumbnails, ["thumb-1.jpg"], seed=5)
    backups = paths.data / "xmp-backups" / "photos"
    _pictures(backups, ["a.jpg"], seed=6)
    (backups / "a.jpg.xmp").write_text("<x:xmpmeta xmlns:x='adobe:ns:meta/'/>", encoding="utf-8")
    summary = cli.json("index", str(tmp_path), *MODEL)
    ((_, rows),) = _libraries(paths)
    assert set(rows) == {"photos/a.jpg"}
    skipped = {s["path"]: s["reason"] for s in summary["skipped"]}
    assert set(skipped) == {"home/cache", "home/data", "home/config", "home/models"}
    assert all("Longlens's own data folder" in r for r in skipped.values())
    rc, out, _ = cli("index", str(tmp_path), *MODEL)
    assert rc == 0 and "home/data: Longlens's own data folder" in out

    # A library in the home is refused before anything is written.
    for inside in (paths.data / "xmp-backups", paths.thumbnails, paths.models):
        rc, _, err = cli("index", str(inside), *MODEL)
        assert rc == 2 and "Longlens's own data folder" in err and "Traceback" not in err
    assert [root for root, _ in _libraries(paths)] == [str(tmp_path.resolve())]


def test_longlens_sample_collections_in_its_data_folder_are_libraries_of_their_own(home, paths, tmp_path, cli):
    demo = paths.data / "demo-photos"
    _pictures(demo, ["a.jpg"], seed=5)
    _pictures(tmp_path / "photos", ["b.jpg"], seed=6)
    assert cli.json("index", str(demo), *MODEL)["new"] == 1
    # The home inside a library: the demo collection stays its own library, the library's scan skips it.
    s = cli.json("index", str(tmp_path), *MODEL)
    assert s["merged_libraries"] == [] and s["new"] == 1
    assert cli.json("index", str(demo), *MODEL)["unchanged"] == 1
    assert dict(_libraries(paths)) == {str(demo.resolve()): {"a.jpg": "ok"},
                                       str(tmp_path.resolve()): {"photos/b.jpg": "ok"}}


def test_a_link_into_another_library_is_not_followed_into_it(home, paths, tmp_path, cli):
    a, b = tmp_path / "a", tmp_path / "b"
    _pictures(a, ["one.jpg"], seed=7)
    _pictures(b / "trip", ["two.jpg"], seed=8)
    assert cli("index", str(b), *MODEL, "--quiet")[0] == 0
    os.symlink(b / "trip", a / "trip-link")
    os.symlink(b / "trip" / "two.jpg", a / "two-link.jpg")
    summary = cli.json("index", str(a), *MODEL)
    reasons = {s["path"]: s["reason"] for s in summary["skipped"]}
    assert reasons == {"trip-link": f"the library {b.resolve()}, indexed on its own",
                       "two-link.jpg": f"the library {b.resolve()}, indexed on its own"}
    libs = dict(_libraries(paths))
    assert libs[str(a.resolve())] == {"one.jpg": "ok"} and libs[str(b.resolve())] == {"trip/two.jpg": "ok"}
    assert sorted(_search_paths(cli)) == sorted([str(a.resolve() / "one.jpg"), str(b.resolve() / "trip/two.jpg")])


def test_libraries_that_overlap_from_before_are_healed_and_never_pair_a_file_with_itself(home, paths, tmp_path,
                                                                                         cli):
    """A catalog written before the check: the child indexed, then its parent added beside it holding
    the same files. `duplicates` lists each file once; the next index of the parent merges them."""
    photos = tmp_path / "photos"
    files = _pictures(photos / "2024", ["a.jpg", "b.jpg"], seed=9)
    assert cli("index", str(photos / "2024"), *MODEL, "--quiet")[0] == 0
    db = sqlite3.connect(paths.catalog)
    try:
        with db:
            db.execute("INSERT INTO libraries (root, status, added_at, last_scan_at) VALUES (?, 'online', 0, 0)",
                       (str(photos.resolve()),))
            parent_id = db.execute("SELECT id FROM libraries WHERE root = ?", (str(photos.resolve()),)).fetchone()[0]
            cols = ("size, mtime_ns, content_hash, width, height, exif_date, camera_make, camera_model, orientation, "
                    "status, reason, added_at, updated_at")
            db.execute(f"INSERT INTO images (library_id, rel_path, {cols}) "
                       f"SELECT ?, '2024/' || rel_path, {cols} FROM images WHERE library_id != ?", (parent_id, parent_id))
    finally:
        db.close()
    assert len(_libraries(paths)) == 2
    before = file_state(files)

    dups = cli.json("duplicates")
    assert dups["counts"]["exact"] == 0 and dups["groups"] == []  # never "a.jpg is a copy of a.jpg"
    assert dups["looked_at"] == 2 and len(dups["same_file"]) == 2
    assert {Path(s["path"]).name for s in dups["same_file"]} == {"a.jpg", "b.jpg"}
    rc, out, _ = cli("duplicates")
    assert rc == 0 and "never as a copy of itself" in out

    merged = cli.json("index", str(photos), *MODEL)
    # Both held the two files: one row each stays, with the vectors (the parent's rows had none).
    assert merged["merged_libraries"] == [{"root": str((photos / "2024").resolve()), "pictures": 0,
                                           "already_held": 2}]
    assert (merged["unchanged"], merged["embedded"], merged["new"]) == (2, 0, 0)
    ((root, rows),) = _libraries(paths)
    assert root == str(photos.resolve()) and rows == {"2024/a.jpg": "ok", "2024/b.jpg": "ok"}
    assert len(_search_paths(cli)) == 2
    assert file_state(files) == before


def test_exact_copies_are_checked_on_their_bytes(home, paths, tmp_path, cli):
    root = tmp_path / "photos"
    files = make_duplicates_folder(root)
    assert cli("index", str(root), *MODEL, "--quiet")[0] == 0
    copy = files["copies/a copy.jpg"]
    # Other bytes of the same size, the modification time put back: size and time say "as indexed".
    st = copy.stat()
    data = bytearray(copy.read_bytes())
    data[-3] ^= 0xFF
    copy.write_bytes(bytes(data))
    os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (copy.stat().st_size, copy.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    got = cli.json("duplicates")
    assert got["counts"]["exact"] == 0
    assert str(copy.resolve()) in got["changed"]
    assert all(g["kind"] != "exact" for g in got["groups"])
    assert any("changed or gone since they were indexed" in n for n in got["notes"])

    # A hard link is another name of the same file, not a copy of it.
    shutil.copy2(files["a.jpg"], copy)  # the exact copy again
    os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.link(files["a.jpg"], root / "a hard link.jpg")
    assert cli("index", str(root), *MODEL, "--quiet")[0] == 0
    got = cli.json("duplicates")
    exact = [g for g in got["groups"] if g["kind"] == "exact"]
    assert len(exact) == 1
    names = {Path(f["path"]).relative_to(root.resolve()).as_posix() for f in exact[0]["files"]}
    assert len(names) == 2 and "copies/a copy.jpg" in names and names <= EXACT | {"a hard link.jpg"}
    assert [Path(s["path"]).name for s in got["same_file"]] in (["a.jpg"], ["a hard link.jpg"])
