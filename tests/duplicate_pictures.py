"""Real image files for the duplicates tests (issue 20 item 6): exact copies, re-encoded, resized
and EXIF-rotated near-copies, and different pictures."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
from PIL import Image

from engine.samples import procedural_picture, stored_for_orientation, write_image

# name -> which original picture it shows ("A", "B", ...); exact copies share bytes.
EXACT = {"a.jpg", "copies/a copy.jpg"}  # the same bytes
NEAR_A = {"a.jpg", "copies/a copy.jpg", "edits/a quality 55.jpg", "edits/a smaller.jpg"}
NEAR_B = {"b.jpg", "edits/b rotated.jpg"}
DIFFERENT = {"c.jpg", "d.png"}


def make_duplicates_folder(root: Path) -> dict[str, Path]:
    rng = np.random.default_rng(20)
    pictures = {k: procedural_picture(rng, (320, 240)) for k in "ABCD"}
    files = {
        "a.jpg": write_image(root / "a.jpg", pictures["A"], "JPEG", quality=92, date="2019:05:01 10:00:00"),
        "edits/a quality 55.jpg": write_image(root / "edits/a quality 55.jpg", pictures["A"], "JPEG", quality=55),
        "edits/a smaller.jpg": write_image(root / "edits/a smaller.jpg", pictures["A"].resize((240, 180),
                                           Image.Resampling.LANCZOS), "JPEG", quality=85),
        "b.jpg": write_image(root / "b.jpg", pictures["B"], "JPEG", quality=90),
        # Stored turned, shown upright by its EXIF orientation: the same picture to a person.
        "edits/b rotated.jpg": write_image(root / "edits/b rotated.jpg", stored_for_orientation(pictures["B"], 6),
                                           "JPEG", quality=90, orientation=6),
        "c.jpg": write_image(root / "c.jpg", pictures["C"], "JPEG", quality=90),
        "d.png": write_image(root / "d.png", pictures["D"], "PNG"),
    }
    (root / "copies").mkdir(parents=True, exist_ok=True)
    files["copies/a copy.jpg"] = Path(shutil.copy2(files["a.jpg"], root / "copies" / "a copy.jpg"))
    return files
