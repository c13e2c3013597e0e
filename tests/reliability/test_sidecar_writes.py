"""Issue 27 (classes 36, 37, 39, 40, 11/31): how `longlens xmp export` writes into a photographer's
sidecars, against real second processes, real signals and a real full disk.

- another program's edit made while the export merges is merged again, never lost, and the backup
  is what was replaced (class 36);
- two exports at once over the same pictures: every sidecar ends with both reviews (class 36);
- the replaced file keeps mode, owner, group and extended attributes; new sidecars follow the umask;
  a hard-linked sidecar is written in place (class 37);
- kill -9 between the temporary write and the rename: the sidecar is whole and the next export
  removes the stray temporary file (class 39);
- Ctrl+C exits 130 saying what was skipped; a full disk while backing up changes nothing (class 40);
- sidecars are written only inside indexed libraries; a RAW+JPEG pair's sidecar is not hidden."""

from __future__ import annotations

import json
import os
import pwd
import resource
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from PIL import Image

from engine.catalog import Catalog
from engine.config import get_paths
from engine.metadata.xmp import parse_xmp
from tests.reliability.sidecar_fixtures import (
    DATA,
    ROOT,
    Export,
    foreign_edit,
    make_library,
    reviewed_captions,
    reviews_in,
    run_export,
    subjects_in,
)


def _backups(lib) -> dict[str, bytes]:
    """origin sidecar path -> backup bytes, over every run's manifest."""
    out = {}
    for manifest in sorted((get_paths(str(lib.home)).data / "xmp-backups").glob("*/manifest.json")):
        for name, origin in json.loads(manifest.read_text()).items():
            out.setdefault(origin, []).append((manifest.parent / name).read_bytes())
    return out


# --------------------------------------------------------------------------- class 36: compare-and-swap


def test_another_programs_edit_while_the_export_merges_is_kept_and_backed_up(tmp_path):
    lib = make_library(tmp_path, 2)
    captions = reviewed_captions(lib, "A", "Caption {name} of {pic}.")
    export = Export(lib, captions, pause_at="merged")
    assert export.wait_paused()
    # Every sidecar has been read and merged; now another program edits one (a new inode, as
    # darktable and exiv2 write) and the other in place (same inode, same size class).
    edited = {lib.pictures[0].name + ".xmp": foreign_edit(lib.folder / (lib.pictures[0].name + ".xmp"), "other-edit"),
              lib.pictures[1].name + ".xmp": foreign_edit(lib.folder / (lib.pictures[1].name + ".xmp"), "other-edit",
                                                          in_place=True)}
    export.resume()
    rc, out, err = export.finish()
    assert rc == 0, out + err
    assert "merged again" in out
    backups = _backups(lib)
    for name, data in lib.sidecars().items():
        assert "other-edit" in subjects_in(data), name  # the other program's edit survived
        assert reviews_in(data)[f"Caption A of {name[:-4]}."] == ("faithful", "fine")
        # The backup is exactly what was replaced: the other program's version.
        assert backups[str(lib.folder / name)][-1] == edited[name]
    assert lib.strays() == []


def test_two_exports_at_once_over_the_same_pictures_keep_both_reviews(tmp_path):
    lib = make_library(tmp_path, 3)
    a = reviewed_captions(lib, "A", "Caption {name} of {pic}.", note="from A")
    b = reviewed_captions(lib, "B", "Caption {name} of {pic}.", note="from B")
    first, second = Export(lib, a, pause_at="merged"), Export(lib, b, pause_at="merged")
    # Both have read and merged the same sidecars before either writes: the lost-update race.
    assert first.wait_paused() and second.wait_paused()
    first.resume()
    second.resume()
    (rc1, out1, err1), (rc2, out2, err2) = first.finish(), second.finish()
    assert (rc1, rc2) == (0, 0), out1 + err1 + out2 + err2
    for name, data in lib.sidecars().items():
        got = reviews_in(data)
        pic = name[:-4]
        assert got[f"Caption A of {pic}."] == ("faithful", "from A"), name
        assert got[f"Caption B of {pic}."] == ("faithful", "from B"), name
    # Each run kept its own backups (two runs in one second never share a folder).
    runs = list((get_paths(str(lib.home)).data / "xmp-backups").iterdir())
    assert len(runs) == 2 and all(len(json.loads((r / "manifest.json").read_text())) == 3 for r in runs)


def test_the_folder_lock_excludes_another_process_whatever_path_leads_there(tmp_path):
    """The lock every Longlens writer takes: held by a real second process, it keeps this one out,
    also through a symbolic link to the folder (the lock is the folder's inode), and it is free
    again the moment that process dies (kill -9: no stale lock)."""
    from engine.fileutil import FolderLockTimeout, folder_write_lock

    folder = tmp_path / "photos"
    folder.mkdir()
    alias = tmp_path / "alias"
    alias.symlink_to(folder)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, engine.fileutil as f\nwith f.folder_write_lock(sys.argv[1]):\n"
         "    print('held', flush=True)\n    sys.stdin.read()", str(folder)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert holder.stdout.readline().strip() == "held"
    for path in (folder, alias):
        with pytest.raises(FolderLockTimeout, match="another Longlens process"):
            with folder_write_lock(path, timeout=0.2):
                pass
    holder.kill()
    holder.wait()
    with folder_write_lock(alias, timeout=5):
        assert list(folder.iterdir()) == []  # no lock file in the photo folder


# --------------------------------------------------------------------------- class 37: file identity


def test_a_replaced_sidecar_keeps_mode_owner_group_and_extended_attributes(tmp_path):
    lib = make_library(tmp_path, 1)
    sidecar = lib.folder / (lib.pictures[0].name + ".xmp")
    nobody = pwd.getpwnam("nobody")
    os.chown(sidecar, nobody.pw_uid, 4242)
    os.chmod(sidecar, 0o664)
    os.setxattr(sidecar, "user.sync.id", b"abc-123")
    os.setxattr(sidecar, "user.comment", b"kept")
    ino = sidecar.stat().st_ino
    rc, out, err = run_export(lib, reviewed_captions(lib, "A", "Caption {name}."))
    assert rc == 0, out + err
    st = sidecar.stat()
    assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o664, nobody.pw_uid, 4242)
    assert {n: os.getxattr(sidecar, n) for n in os.listxattr(sidecar)} == \
           {"user.sync.id": b"abc-123", "user.comment": b"kept"}
    assert st.st_ino != ino and "Caption A." in reviews_in(sidecar.read_bytes())  # replaced atomically


@pytest.mark.parametrize("umask", [0o022, 0o002])
def test_a_new_sidecar_follows_the_umask(tmp_path, umask):
    lib = make_library(tmp_path, 1, existing=False)
    captions = reviewed_captions(lib, "A", "Caption {name}.")
    export = Export(lib, captions, preexec_fn=lambda: os.umask(umask))
    rc, out, err = export.finish()
    assert rc == 0, out + err
    created = lib.folder / (lib.pictures[0].name + ".xmp")
    assert stat.S_IMODE(created.stat().st_mode) == 0o666 & ~umask


def test_a_hard_linked_sidecar_is_written_in_place_and_every_name_sees_it(tmp_path):
    lib = make_library(tmp_path, 1)
    sidecar = lib.folder / (lib.pictures[0].name + ".xmp")
    other = tmp_path / "elsewhere-link.xmp"
    os.link(sidecar, other)
    before = sidecar.read_bytes()
    rc, out, err = run_export(lib, reviewed_captions(lib, "A", "Caption {name}."))
    assert rc == 0, out + err
    assert "written in place" in out
    assert sidecar.stat().st_ino == other.stat().st_ino and sidecar.stat().st_nlink == 2
    assert other.read_bytes() == sidecar.read_bytes() != before
    assert _backups(lib)[str(sidecar)] == [before]


def test_an_owner_this_user_cannot_keep_means_writing_in_place():
    """As a user who may not chown (nobody), replacing a root-owned, world-writable sidecar would make
    it nobody's: it is written in place instead (owner and inode kept)."""
    import tempfile

    with tempfile.TemporaryDirectory(dir="/tmp") as shared:  # pytest's tmp_path is root's alone (0700)
        _owner_kept(Path(shared))


def _owner_kept(folder: Path) -> None:
    from engine import fileutil

    folder.chmod(0o777)
    sidecar = folder / "x.xmp"
    sidecar.write_bytes(b"old bytes")
    sidecar.chmod(0o666)
    _, identity = fileutil.read_with_identity(sidecar)
    script = ("import os, sys, engine.fileutil as fu, pickle; os.setgid(65534); os.setuid(65534); "
              "ident = pickle.loads(bytes.fromhex(sys.argv[2])); "
              "print(fu.replace_user_file(sys.argv[1], b'new bytes', expected=ident))")
    import pickle

    done = subprocess.run([sys.executable, "-c", script, str(sidecar), pickle.dumps(identity).hex()],
                          capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "written in place"
    st = sidecar.stat()
    assert (st.st_uid, st.st_ino, sidecar.read_bytes()) == (0, identity.ino, b"new bytes")
    assert [p.name for p in folder.iterdir()] == ["x.xmp"]


# --------------------------------------------------------------------------- class 39: temporary files


def test_kill_9_between_the_temporary_write_and_the_rename_then_the_next_export_cleans_up(tmp_path):
    lib = make_library(tmp_path, 2)
    before = lib.sidecars()
    captions = reviewed_captions(lib, "A", "Caption {name}.")
    export = Export(lib, captions, pause_at="replace")
    assert export.wait_paused()  # the first sidecar's temporary file is written, not yet renamed
    strays = lib.strays()
    assert len(strays) == 1 and strays[0].startswith(f".longlens-tmp-{export.proc.pid}-")
    os.kill(export.proc.pid, signal.SIGKILL)
    rc, _out, _err = export.finish()
    assert rc == -signal.SIGKILL
    assert lib.sidecars() == before  # every sidecar whole: still the old bytes
    rc, out, err = run_export(lib, captions)
    assert rc == 0, out + err
    assert lib.strays() == []  # the killed run's temporary file is gone
    assert all("Caption A." in reviews_in(d) for d in lib.sidecars().values())


def test_stale_temporary_files_go_and_a_live_writers_young_one_stays(tmp_path):
    from engine.fileutil import remove_stale_temp_files

    folder = tmp_path / "f"
    folder.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (folder / f".longlens-tmp-{dead.pid}-ab12-x.xmp").write_bytes(b"partial")
    (folder / ".longlens-tmp-1-cd34-y.xmp").write_bytes(b"live writer's")  # pid 1 is alive
    old = folder / ".longlens-tmp-1-ef56-z.xmp"
    old.write_bytes(b"old")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    (folder / "IMG_1.jpg.xmp").write_bytes(b"user's")
    assert sorted(remove_stale_temp_files(folder)) == sorted([f".longlens-tmp-{dead.pid}-ab12-x.xmp", old.name])
    assert sorted(p.name for p in folder.iterdir()) == [".longlens-tmp-1-cd34-y.xmp", "IMG_1.jpg.xmp"]


# --------------------------------------------------------------------------- class 40: interrupted runs


def test_ctrl_c_exits_130_and_says_what_was_skipped(tmp_path):
    lib = make_library(tmp_path, 4)
    before = lib.sidecars()
    export = Export(lib, reviewed_captions(lib, "A", "Caption {name}."), pause_at="replace")
    assert export.wait_paused()  # swapping the first sidecar
    os.kill(export.proc.pid, signal.SIGINT)
    export.wait_stderr("stopping at the next checkpoint")
    export.resume()
    rc, out, err = export.finish()
    assert rc == 130, out + err
    assert "updated 1" in out.replace("update 1", "updated 1") and "skipped 3" in out
    assert "interrupted: 1 sidecar(s) written (each whole, and backed up), 3 skipped, not written" in out
    assert out.count("SKIPPED") == 3
    after = lib.sidecars()
    assert sum(after[n] != before[n] for n in before) == 1 and lib.strays() == []


def test_a_full_disk_while_backing_up_changes_no_sidecar(tmp_path):
    lib = make_library(tmp_path, 2)
    # The second sidecar is larger than the child may write (RLIMIT_FSIZE): its backup fails.
    big = lib.folder / (lib.pictures[1].name + ".xmp")
    text = big.read_text(encoding="utf-8")
    big.write_text(text.replace("<dc:subject>", "<!-- " + "x" * 600_000 + " -->\n   <dc:subject>", 1),
                   encoding="utf-8")
    before = lib.sidecars()
    captions = reviewed_captions(lib, "A", "Caption {name}.")
    limit = 300_000
    assert get_paths(str(lib.home)).catalog.stat().st_size < limit

    def small_disk():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    rc, out, err = Export(lib, captions, preexec_fn=small_disk).finish()
    assert rc not in (0, None) and rc > 0, out + err
    assert "could not be written" in err and "no sidecar was changed" in err and "File too large" in err
    assert "Traceback" not in err and "OSError" not in err
    assert lib.sidecars() == before and lib.strays() == []


# --------------------------------------------------------------------------- scope and pairs


def test_pictures_outside_every_library_are_refused_per_item(tmp_path):
    lib = make_library(tmp_path, 1)
    outside = tmp_path / "outside"
    outside.mkdir()
    stranger = outside / "IMG_9.jpg"
    Image.new("RGB", (8, 8)).save(stranger, "JPEG")
    captions = tmp_path / "sneaky.jsonl"
    captions.write_text(
        json.dumps({"image": str(lib.pictures[0]), "caption": "Inside."}) + "\n"
        + json.dumps({"image": str(lib.folder / ".." / "outside" / "IMG_9.jpg"), "caption": "Outside."}) + "\n",
        encoding="utf-8")
    from tests.reliability.sidecar_fixtures import set_review

    set_review(lib, captions, "n")
    rc, out, err = run_export(lib, captions)
    assert rc == 1, out + err
    assert "outside every indexed library" in out and "REFUSED" in out
    assert sorted(p.name for p in outside.iterdir()) == ["IMG_9.jpg"]
    assert "Inside." in reviews_in((lib.folder / (lib.pictures[0].name + ".xmp")).read_bytes())


def test_a_raw_jpeg_pairs_raw_sidecar_is_merged_into_not_hidden(tmp_path):
    lib = make_library(tmp_path, 1, existing=False)
    jpeg = lib.pictures[0]
    raw = jpeg.with_suffix(".CR2")
    raw.write_bytes(b"II*\x00 not really a raw")
    raw_sidecar = lib.folder / f"{raw.name}.xmp"
    raw_sidecar.write_bytes((DATA / "darktable.xmp").read_bytes())
    before = parse_xmp(raw_sidecar.read_bytes(), "x").values
    rc, out, err = run_export(lib, reviewed_captions(lib, "A", "Caption {name}."), "--keyword", "Longlens")
    assert rc == 0, out + err
    assert not (lib.folder / f"{jpeg.name}.xmp").exists()  # nothing hides the pair's sidecar
    assert "the sidecar of the pair's" in out
    after = parse_xmp(raw_sidecar.read_bytes(), "x").values
    assert after["rating"] == before["rating"] and set(before["keywords"][0]) < set(after["keywords"][0])
    assert "Caption A." in reviews_in(raw_sidecar.read_bytes())

    # Pairs indexed both ways (the RAW in the catalog too): the JPEG's own sidecar hides nothing.
    with Catalog(get_paths(str(lib.home)).catalog) as cat:
        assert cat.image_at(raw) is None
