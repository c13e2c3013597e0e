"""What `make test-interop` installs beside the pinned environment (pidng, scikit-image, exiv2,
open_clip's tokenizer; installed with requirements.lock as constraints) moved none of the pinned
packages, and the real tools the interop tests use are there (a missing one fails, never skips)."""

from __future__ import annotations

import subprocess
from importlib import metadata
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.interop import realfiles as rf

pytestmark = pytest.mark.interop

LOCK = Path(__file__).resolve().parents[2] / "requirements.lock"


def test_no_pinned_package_moved():
    moved = []
    for line in LOCK.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, _, pinned = line.partition("==")
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            moved.append(f"{name}: not installed (pinned {pinned})")
            continue
        # torch's wheel says 2.13.0+cpu: the local build tag is not a different release.
        if Version(installed).public != Version(pinned).public:
            moved.append(f"{canonicalize_name(name)}: {installed} installed, {pinned} pinned")
    assert moved == []


def test_the_real_tools_and_packages_are_there():
    for command, flag, expected in (("exiftool", "-ver", "12."), ("exiv2", "--version", "exiv2 0.27"),
                                    ("darktable-cli", "--version", "darktable")):
        done = subprocess.run([rf.tool(command), flag], capture_output=True, text=True, timeout=60)
        assert expected in (done.stdout + done.stderr), (command, done.stdout, done.stderr)
    assert metadata.version("pidng") == "4.0.9" and metadata.version("scikit-image") == "0.26.0"
    for name in rf.PHOTOS:
        assert rf.photo_path(name).stat().st_size > 10_000, name
