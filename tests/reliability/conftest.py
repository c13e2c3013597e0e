"""Reliability fixtures: the end-to-end ones (a LONGLENS_HOME with the tiny random BLIP installed,
a folder of real image files, the in-process CLI) plus helpers to snapshot a photo tree."""

from __future__ import annotations

import os
import sqlite3
from collections import deque
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import cli, home, paths, photos, sample_master  # noqa: F401  (re-exported fixtures)


def tree_snapshot(root: Path) -> dict[str, tuple[bytes, int, int]]:
    """Every entry under root (files, folders, links) -> (content or b'', mtime_ns, mode), links not followed."""
    out: dict[str, tuple[bytes, int, int]] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in [*dirnames, *filenames]:
            p = Path(dirpath) / name
            st = p.lstat()
            data = p.read_bytes() if p.is_file() and not p.is_symlink() else b""
            out[os.fsdecode(p.relative_to(root))] = (data, st.st_mtime_ns, st.st_mode)
    st = root.lstat()
    out["."] = (b"", st.st_mtime_ns, st.st_mode)
    return out


def corrupt_table_page(catalog: Path, table: str) -> None:
    """Overwrite a table's root page of a real SQLite catalog with garbage, as a bad sector or a
    stray write would."""
    con = sqlite3.connect(catalog)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    page_size = con.execute("PRAGMA page_size").fetchone()[0]
    root = con.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (table,)).fetchone()[0]
    con.close()
    with open(catalog, "r+b") as f:
        f.seek((root - 1) * page_size)
        f.write(bytes([0x0D, 0xFF, 0xFF, 0x7F]) + os.urandom(page_size - 4))


def last_progress(job: Iterator):
    """Run an engine job to its end and return its last Progress (the summary rides on it)."""
    return deque(job, maxlen=1)[0]


@pytest.fixture
def stress_iterations() -> int:
    return int(os.environ.get("LONGLENS_STRESS_ITERATIONS", "20"))
