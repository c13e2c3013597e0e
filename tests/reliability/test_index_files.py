"""Checklist 10 and issue point 5: a header sanity check and the checksum stand before hnswlib;
crafted, truncated (at every region boundary) and bit-flipped index files are rejected and the
index is rebuilt from the catalog, in a child process so that a crash would show."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("mode", ["exact", "hnsw"])
def test_damaged_index_files_are_rejected_and_rebuilt_never_crash(tmp_path, mode):
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-m", "tests.reliability.index_file_cases", str(tmp_path), mode],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"child exited {proc.returncode}: {proc.stderr[-3000:]}"
    result = json.loads(proc.stdout)
    assert result["mode"] == mode
    assert result["cases"] > 50 and result["flips"] == 128 * 8 + 256
    assert result["loaded"] == [], "damaged files were accepted"
    assert result["flips_loaded"] == [], "bit-flipped files were accepted"
    assert result["bad_rebuilds"] == []
