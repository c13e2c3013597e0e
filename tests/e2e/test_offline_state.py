"""Issue 27 point 12 (a) from the CLI: `longlens libraries` looks at each folder, so a folder
that went missing is offline without a run, and one that is back is no longer offline (the
stored state cleared, and the state it had before restored); `longlens index` re-scans it."""

from __future__ import annotations

import shutil

from engine.catalog import LIBRARY_PARTIAL, Catalog


def _library(cli) -> dict:
    rows = cli.json("libraries")
    assert len(rows) == 1
    return rows[0]


def _stored(paths) -> str:
    with Catalog(paths.catalog) as cat:
        return cat.libraries()[0].status


def test_libraries_and_index_follow_the_folder_offline_and_back(home, paths, photos, cli, tmp_path):
    assert cli("index", str(photos))[0] == 0
    assert (_library(cli)["status"], _library(cli)["state"]) == ("online", "indexed")
    unplugged = tmp_path / "unplugged"
    shutil.move(photos, unplugged)
    # No run yet: the listing looks at the folder itself.
    assert (_library(cli)["status"], _library(cli)["state"]) == ("offline", "offline")
    rc, out, _ = cli("index", str(photos))
    assert rc == 3 and "OFFLINE" in out
    assert _stored(paths) == "offline"

    shutil.move(unplugged, photos)  # plugged back in
    row = _library(cli)
    assert (row["status"], row["state"]) == ("online", "indexed")
    assert _stored(paths) == "online"  # the look cleared it, no re-scan needed
    rc, out, _ = cli("libraries")
    assert rc == 0 and " indexed " in out and "offline" not in out
    summary = cli.json("index", str(photos))
    assert (summary["offline"], summary["unchanged"], summary["deleted"], summary["embedded"]) == (False, 24, 0, 0)


def test_a_partly_indexed_folder_comes_back_partly_indexed(home, paths, photos, cli, tmp_path):
    """Offline does not erase what was known: the pending count of an interrupted run survives."""
    assert cli("index", str(photos))[0] == 0
    with Catalog(paths.catalog) as cat:  # the state an interrupted run leaves
        cat.set_library_status(cat.libraries()[0].id, LIBRARY_PARTIAL, pending=5)
    shutil.move(photos, tmp_path / "unplugged")
    assert cli("index", str(photos))[0] == 3
    assert _library(cli)["state"] == "offline"
    shutil.move(tmp_path / "unplugged", photos)
    row = _library(cli)
    assert (row["status"], row["state"], row["pending"]) == ("partial", "partly indexed · 5 pending", 5)
    assert _stored(paths) == "partial"
