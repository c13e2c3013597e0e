"""A folder of real JPEGs for the date tests (issue 20 item 5): three with EXIF dates (and a
camera), three without (a scan, a screenshot, an export) whose file times are set."""

from __future__ import annotations

import datetime as dt
import hashlib
import os
from pathlib import Path

import numpy as np

from engine.samples import procedural_picture, write_image

EXIF_DATED = (("exif2019", "2019:05:01 10:00:00"), ("exif2020", "2020:07:15 09:30:00"),
              ("exif2022", "2022:02:02 18:45:00"))
FILE_TIMED = (("scan2018", "2018-03-03T12:00:00"), ("shot2021", "2021-06-06T12:00:00"),
              ("export2023", "2023-09-09T12:00:00"))
NEWEST_FIRST = ("export2023", "exif2022", "shot2021", "exif2020", "exif2019", "scan2018")


def _ns(when: str) -> int:
    return int(dt.datetime.fromisoformat(when).timestamp()) * 1_000_000_000


def make_dated_folder(root: Path) -> dict[str, Path]:
    rng = np.random.default_rng(7)
    files: dict[str, Path] = {}
    for name, when in EXIF_DATED:
        files[name] = write_image(root / f"{name}.jpg", procedural_picture(rng, (160, 120)), "JPEG",
                                  date=when, make="Canon", model="EOS R6", quality=90)
    for name, when in FILE_TIMED:
        files[name] = write_image(root / f"{name}.jpg", procedural_picture(rng, (160, 120)), "JPEG", quality=90)
        os.utime(files[name], ns=(_ns(when), _ns(when)))
    return files


def file_state(files: dict[str, Path]) -> dict[str, tuple[str, int]]:
    """Each file's SHA-256 and mtime: what must not change."""
    return {k: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns) for k, p in files.items()}
