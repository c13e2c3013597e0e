"""Folder scanning: what is found, what is skipped and why, and that it always terminates."""

from __future__ import annotations

import os

from engine.indexing.scanner import FileEntry, Skipped, scan_folder

EXTS = frozenset({".jpg", ".png"})


def _scan(root, **kw):
    found, skipped = [], []
    for item in scan_folder(root, EXTS, **kw):
        (found if isinstance(item, FileEntry) else skipped).append(item)
    return found, skipped


def test_finds_images_recursively_and_skips_hidden_and_system(tmp_path):
    for rel in ["a.jpg", "B.PNG", "sub/c.jpg", "sub/deeper/d.png", "notes.txt", ".hidden.jpg",
                ".git/e.jpg", "@eaDir/f.jpg", "$RECYCLE.BIN/g.jpg", "System Volume Information/h.jpg"]:
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"x" * 3)
    found, skipped = _scan(tmp_path)
    assert [f.rel_path for f in found] == ["B.PNG", "a.jpg", "sub/c.jpg", "sub/deeper/d.png"]
    assert skipped == []
    assert all(f.size == 3 and f.mtime_ns > 0 for f in found)


def test_symlink_loop_and_broken_link_terminate(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "x.jpg").write_bytes(b"1")
    os.symlink(tmp_path, tmp_path / "real" / "loop")  # points back at the root
    os.symlink(tmp_path / "nowhere.jpg", tmp_path / "broken.jpg")
    os.symlink(tmp_path / "self.jpg", tmp_path / "self.jpg")  # ELOOP
    found, skipped = _scan(tmp_path)
    assert [f.rel_path for f in found] == ["real/x.jpg"]
    reasons = {s.rel_path: s.reason for s in skipped}
    assert reasons["broken.jpg"] == "broken symlink"
    assert reasons["real/loop"] == "symlink loop"
    assert reasons["self.jpg"].startswith("unreadable")


def test_symlinked_folder_is_followed_once(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "o.jpg").write_bytes(b"1")
    root = tmp_path / "root"
    root.mkdir()
    os.symlink(outside, root / "linked")
    found, _ = _scan(root)
    assert [f.rel_path for f in found] == ["linked/o.jpg"]


def test_permission_denied_folder_is_reported(tmp_path, monkeypatch):
    (tmp_path / "locked").mkdir()
    (tmp_path / "ok.jpg").write_bytes(b"1")
    real_scandir = os.scandir

    def scandir(path):
        if str(path).endswith("locked"):
            raise PermissionError(13, "Permission denied")
        return real_scandir(path)

    # Root bypasses file permissions, so the denial is simulated at the system-call boundary.
    monkeypatch.setattr(os, "scandir", scandir)
    found, skipped = _scan(tmp_path)
    assert [f.rel_path for f in found] == ["ok.jpg"]
    assert [(s.rel_path, s.reason) for s in skipped] == [("locked", "permission denied")]


def test_missing_root_is_reported_not_raised(tmp_path):
    found, skipped = _scan(tmp_path / "gone")
    assert found == [] and len(skipped) == 1 and skipped[0].rel_path == ""
    assert isinstance(skipped[0], Skipped)


def test_non_utf8_names(tmp_path):
    name = os.fsdecode(b"photo-\xff\xfe.jpg")
    (tmp_path / name).write_bytes(b"1")
    found, _ = _scan(tmp_path)
    assert [f.rel_path for f in found] == [name]


# --------------------------------------------------------------------------- RAW+JPEG pairs


def _pair_folder(root) -> list[FileEntry]:
    from engine.indexing.decode import SUPPORTED_EXTENSIONS

    for rel in ["IMG_0001.CR2", "IMG_0001.JPG", "IMG_0002.NEF", "IMG_0003.jpg", "IMG_0004.dng",
                "img_0004.jpeg", "IMG_0005.ARW", "IMG_0005.HIF", "IMG_0006.RAF", "IMG_0006.png",
                "trip/IMG_0007.ORF", "IMG_0007.JPG", "trip/IMG_0008.rw2", "trip/IMG_0008.JPG"]:
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"x")
    found = [item for item in scan_folder(root, SUPPORTED_EXTENSIONS) if isinstance(item, FileEntry)]
    return found


def test_raw_jpeg_pairs_keep_the_jpeg_by_default_in_scan_order(tmp_path):
    from engine.indexing.decode import RAW_EXTENSIONS
    from engine.indexing.scanner import split_raw_pairs

    entries = _pair_folder(tmp_path)
    kept, left_out = split_raw_pairs(entries, "jpeg", RAW_EXTENSIONS)
    # Pairs: same folder, same name (any case), a RAW and a JPEG or HEIF. A PNG is no camera twin,
    # and IMG_0007.ORF in trip/ has no JPEG beside it.
    assert [e.rel_path for e in left_out] == ["IMG_0001.CR2", "IMG_0004.dng", "IMG_0005.ARW", "trip/IMG_0008.rw2"]
    assert [e.rel_path for e in kept] == [e.rel_path for e in entries if e not in left_out]


def test_raw_jpeg_pairs_can_keep_the_raw_or_both(tmp_path):
    from engine.indexing.decode import RAW_EXTENSIONS
    from engine.indexing.scanner import split_raw_pairs

    entries = _pair_folder(tmp_path)
    kept, left_out = split_raw_pairs(entries, "raw", RAW_EXTENSIONS)
    assert [e.rel_path for e in left_out] == ["IMG_0001.JPG", "IMG_0005.HIF", "img_0004.jpeg", "trip/IMG_0008.JPG"]
    assert len(kept) + len(left_out) == len(entries)
    kept, left_out = split_raw_pairs(entries, "both", RAW_EXTENSIONS)
    assert kept == entries and left_out == []
