"""Issue 27 point 6 on a real catalog and real folders: a parent library absorbs the libraries
inside it (paths re-rooted, undecodable names included, vectors and metadata kept), a folder inside
a library is refused, and the same folder reached through a symbolic link is the same library."""

from __future__ import annotations

import os

import numpy as np
import pytest

from engine.catalog import Catalog, ImageWrite, LibraryOverlapError, folder_within
from engine.types import STATUS_OK, PhotoMetadata

ODD_NAME = os.fsdecode(b"caf\xe9.jpg")  # not UTF-8: stored as NUL + base64 (engine.catalog.paths)


def _write(lib_id: int, rel: str, seed: int) -> ImageWrite:
    v = np.random.default_rng(seed).standard_normal(8).astype(np.float32)
    return ImageWrite(library_id=lib_id, rel_path=rel, size=10, mtime_ns=1, content_hash=f"h{seed}",
                      status=STATUS_OK, vector=v / np.linalg.norm(v))


def test_a_parent_absorbs_the_library_inside_it(tmp_path):
    inner = tmp_path / "photos" / "2024"
    inner.mkdir(parents=True)
    with Catalog(tmp_path / "catalog.sqlite3") as cat:
        child = cat.add_library(inner)
        ids = cat.write_batch("m", [_write(child.id, "a.jpg", 1), _write(child.id, f"trip/{ODD_NAME}", 2)])
        cat.write_metadata([(ids[0], PhotoMetadata(rating=4, hierarchy=("Places|Norway",), state="s"))])
        added = cat.add_library_merging(tmp_path / "photos")
        assert [(m.root, m.moved, m.dropped) for m in added.merged] == [(str(inner.resolve()), 2, 0)]
        (lib,) = cat.libraries()
        assert lib.id == added.library.id and lib.root == str((tmp_path / "photos").resolve())
        rows = {r.rel_path: r.id for r in cat.image_records(lib.id)}
        assert rows == {"2024/a.jpg": ids[0], f"2024/trip/{ODD_NAME}": ids[1]}
        assert cat.embedded_ids(lib.id, "m") == set(ids)
        assert cat.photo_metadata([ids[0]])[ids[0]].rating == 4
        assert cat.image_at(tmp_path / "photos" / "2024" / "a.jpg").id == ids[0]

        with pytest.raises(LibraryOverlapError, match="index .* instead"):
            cat.add_library(inner)
        assert cat.overlap_problem(inner) is not None and cat.overlap_problem(tmp_path / "photos") is None
        # The same folder through a symbolic link is that library, not a second one.
        os.symlink(tmp_path / "photos", tmp_path / "link")
        assert cat.add_library(tmp_path / "link").id == lib.id and len(cat.libraries()) == 1


def test_folder_within_compares_whole_names_and_follows_the_disk(tmp_path):
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos-2").mkdir()
    assert folder_within(tmp_path / "photos", tmp_path / "photos")
    assert folder_within(tmp_path / "photos" / "x", tmp_path / "photos")
    assert not folder_within(tmp_path / "photos-2", tmp_path / "photos")  # a shared prefix is not a parent
    assert not folder_within(tmp_path / "photos", tmp_path / "photos" / "x")
