"""Real files for the interop tests (issue 28, points 4 and 5): the photographs scikit-image ships,
as JPEG, TIFF and DNG (written by pidng, a third-party DNG writer, as a Bayer mosaic), and their
tags written by the real tools: exiftool, Debian's exiv2 CLI and darktable-cli. Nothing here is
written by Longlens. A missing tool or package fails the test that needs it (never a skip):
`make test-interop` installs them."""

from __future__ import annotations

import os
import shutil
import subprocess
from functools import cache
from pathlib import Path

import numpy as np
from PIL import Image

HERE = Path(__file__).resolve().parent
# exiftool has no table for darktable's namespace; a user-defined one (exiftool's own mechanism,
# https://exiftool.org/config.html) lets it write darktable:colorlabels as darktable does.
EXIFTOOL_CONFIG = HERE / "data" / "exiftool-darktable.config"

# The real photographs of scikit-image's data folder (no download: they are in the wheel).
# hubble_deep_field.jpg carries Photoshop CS5's own XMP (xmp:CreateDate 2012-06-29T09:29-04:00).
PHOTOS = ("astronaut.png", "coffee.png", "chelsea.png", "rocket.jpg", "retina.jpg", "hubble_deep_field.jpg")
SMALL = 160  # long side of the test pictures: the tools and the index stay fast

NIKON_MAKE, NIKON_MODEL = "NIKON CORPORATION", "NIKON D750"


def tool(name: str) -> str:
    path = shutil.which(name)
    assert path, f"{name} is not installed (make test-interop installs it)"
    return path


def skimage_data() -> Path:
    try:
        import skimage.data
    except ImportError as exc:  # a failure, never a skip: make test-interop installs it
        raise AssertionError("scikit-image is not installed (make test-interop installs it)") from exc
    return Path(skimage.data.__file__).parent


def photo_path(name: str) -> Path:
    path = skimage_data() / name
    assert path.is_file(), f"{path}: not in this scikit-image"
    return path


@cache
def _photo(name: str, size: int) -> Image.Image:
    with Image.open(photo_path(name)) as im:
        im = im.convert("RGB")
        im.thumbnail((size, size), Image.Resampling.LANCZOS)
        return im.copy()


def photo(name: str, size: int = SMALL) -> Image.Image:
    """The photograph, RGB, its long side `size`."""
    return _photo(name, size).copy()


def write_jpeg(path: Path, name: str, size: int = SMALL) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    photo(name, size).save(path, "JPEG", quality=88)
    return path


def write_tiff(path: Path, name: str, size: int = SMALL) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    photo(name, size).save(path, "TIFF")
    return path


def copy_original(path: Path, name: str) -> Path:
    """The photograph's own file, bytes as shipped (hubble_deep_field.jpg keeps Photoshop's XMP)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(photo_path(name), path)
    return path


def write_dng(path: Path, name: str, *, make: str | None = NIKON_MAKE, model: str | None = NIKON_MODEL,
              orientation: int = 1, size: int = SMALL) -> Path:
    """A DNG written by pidng: the photograph as the RGGB Bayer mosaic a camera's sensor records
    (12-bit), with the camera's Make/Model and Orientation as pidng writes them."""
    try:
        from pidng.core import RAW2DNG, DNGTags, Tag
        from pidng.defs import CalibrationIlluminant, CFAPattern, DNGVersion, PhotometricInterpretation
    except ImportError as exc:
        raise AssertionError("pidng is not installed (make test-interop installs it)") from exc
    rgb = np.asarray(photo(name, size), dtype=np.uint16) * 16  # 8 -> 12 bits
    h, w = (rgb.shape[0] // 2) * 2, (rgb.shape[1] // 2) * 2
    rgb = rgb[:h, :w]
    mosaic = np.empty((h, w), np.uint16)
    mosaic[0::2, 0::2] = rgb[0::2, 0::2, 0]
    mosaic[0::2, 1::2] = rgb[0::2, 1::2, 1]
    mosaic[1::2, 0::2] = rgb[1::2, 0::2, 1]
    mosaic[1::2, 1::2] = rgb[1::2, 1::2, 2]
    t = DNGTags()
    t.set(Tag.ImageWidth, w)
    t.set(Tag.ImageLength, h)
    t.set(Tag.TileWidth, w)
    t.set(Tag.TileLength, h)
    t.set(Tag.Orientation, orientation)
    t.set(Tag.PhotometricInterpretation, PhotometricInterpretation.Color_Filter_Array)
    t.set(Tag.SamplesPerPixel, 1)
    t.set(Tag.BitsPerSample, 16)
    t.set(Tag.CFARepeatPatternDim, [2, 2])
    t.set(Tag.CFAPattern, CFAPattern.RGGB)
    t.set(Tag.BlackLevel, 0)
    t.set(Tag.WhiteLevel, 4095)
    t.set(Tag.ColorMatrix1, [[1, 1], [0, 1], [0, 1], [0, 1], [1, 1], [0, 1], [0, 1], [0, 1], [1, 1]])
    t.set(Tag.CalibrationIlluminant1, CalibrationIlluminant.D65)
    t.set(Tag.AsShotNeutral, [[1, 1], [1, 1], [1, 1]])
    t.set(Tag.BaselineExposure, [[0, 1]])
    if make is not None:
        t.set(Tag.Make, make)
    if model is not None:
        t.set(Tag.Model, model)
    t.set(Tag.DNGVersion, DNGVersion.V1_4)
    t.set(Tag.DNGBackwardVersion, DNGVersion.V1_2)
    t.set(Tag.PreviewColorSpace, 2)
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = RAW2DNG()
    writer.options(t, path="", compress=False)
    assert path.suffix.lower() == ".dng", path
    writer.convert(mosaic, filename=str(path.with_suffix("")))
    written = path.with_suffix(".dng")
    if written != path:
        written.rename(path)
    return path


def _run(args: list[str], what: str) -> subprocess.CompletedProcess:
    done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{what} failed ({done.returncode}): {' '.join(args)}\n{done.stdout}\n{done.stderr}"
    return done


def exiftool(target: Path, *assignments: str) -> Path:
    """exiftool writes the tags into `target` (a picture, or a sidecar: an .xmp that does not exist
    yet is created, as `exiftool -Tag=value IMG.jpg.xmp` does)."""
    args = [tool("exiftool"), "-config", str(EXIFTOOL_CONFIG), "-q", "-q", "-m"]
    if target.exists():
        args.append("-overwrite_original")
    _run([*args, *assignments, str(target)], "exiftool")
    return target


def exiftool_read(target: Path, *tags: str) -> dict:
    """What exiftool reads from `target`: {group:tag: value} (-G1 -j -struct)."""
    import json

    done = _run([tool("exiftool"), "-config", str(EXIFTOOL_CONFIG), "-j", "-G1", "-struct", "-a", *tags,
                 str(target)], "exiftool")
    return json.loads(done.stdout)[0]


def exiv2(target: Path, *commands: str) -> Path:
    """Debian's exiv2 CLI modifies `target` (`exiv2 -M"set Xmp.dc.subject XmpBag Oslo" mo FILE`); a
    sidecar must exist first (exiv2 cannot create one from nothing: `new_sidecar`)."""
    args = [tool("exiv2")]
    for c in commands:
        args += ["-M", c]
    _run([*args, "mo", str(target)], "exiv2")
    return target


EMPTY_SIDECAR = """<?xpacket begin="\ufeff" id="W5M0MpCehiHzreSzNTczkc9d"?>
<x:xmpmeta xmlns:x="adobe:ns:meta/">
 <rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#">
  <rdf:Description rdf:about=""/>
 </rdf:RDF>
</x:xmpmeta>
<?xpacket end="w"?>
"""


def new_sidecar(path: Path) -> Path:
    """The empty packet exiv2 needs before it writes a sidecar (`exiv2 -M... mo x.xmp` on a missing
    file fails); every property in it is then written by exiv2."""
    path.write_text(EMPTY_SIDECAR, encoding="utf-8")
    return path


def exiv2_read(target: Path) -> dict[str, str]:
    """`exiv2 -pa` (every Exif, IPTC and XMP key with its interpreted value): {key: value}; repeated
    keys (IPTC Keywords) joined by '; '."""
    done = subprocess.run([tool("exiv2"), "-pa", "-q", str(target)], capture_output=True, text=True, timeout=60)
    out: dict[str, str] = {}
    for line in done.stdout.splitlines():
        parts = line.split(None, 3)
        if len(parts) >= 3 and "." in parts[0]:
            value = parts[3] if len(parts) > 3 else ""
            out[parts[0]] = out[parts[0]] + "; " + value if parts[0] in out else value
    return out


def darktable(picture: Path, configdir: Path, out: Path | None = None) -> Path:
    """darktable-cli imports `picture` (reading its EXIF, its embedded XMP and an existing
    `picture.xmp`), renders it to `out` and writes `picture.xmp` in darktable's own serialisation.
    Returns the sidecar."""
    configdir.mkdir(parents=True, exist_ok=True)
    out = out or configdir / f"render-{picture.name}.jpg"
    if out.exists():
        out.unlink()
    done = _run([tool("darktable-cli"), str(picture), str(out), "--core", "--configdir", str(configdir),
                 "--library", ":memory:", "--conf", "write_sidecar_files=on import"], "darktable-cli")
    sidecar = picture.with_name(picture.name + ".xmp")
    assert out.exists() and sidecar.exists(), f"darktable-cli wrote no render or no sidecar:\n{done.stdout}"
    return sidecar


def set_mtime(path: Path, when: str) -> None:
    """The file's modification time, `when` in local time (YYYY-MM-DD HH:MM:SS), as darktable writes it back."""
    import datetime as dt

    t = dt.datetime.strptime(when, "%Y-%m-%d %H:%M:%S").timestamp()
    os.utime(path, (t, t))


MODEL = "tiny-blip"
QUERY = "a photograph"


class LonglensHome:
    """The real `longlens` CLI (engine.cli.main, its argument parsing, output and exit status) with
    its own LONGLENS_HOME: a tiny BLIP model imported from disk (no download), `index`,
    `search --json`. In this process: a child per search would import torch and load the model
    again each time (seconds on a shared 2-core machine, for each of dozens of searches)."""

    def __init__(self, home: Path, checkpoint: Path) -> None:
        self.home = home
        rc, out, err = self("models", "import", str(checkpoint), "--name", MODEL)
        assert rc == 0, out + err

    def __call__(self, *args: str) -> tuple[int, str, str]:
        import contextlib
        import io

        import pytest

        from engine.cli import main

        out, err = io.StringIO(), io.StringIO()
        with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            mp.setenv("LONGLENS_HOME", str(self.home))
            rc = main(list(args))
        return rc, out.getvalue(), err.getvalue()

    def json(self, *args: str):
        import json

        rc, out, err = self(*args, "--json")
        assert rc == 0, f"longlens {' '.join(args)} failed ({rc}):\n{out}\n{err}"
        return json.loads(out)

    def index(self, folder: Path) -> dict:
        return self.json("index", str(folder), "--model", MODEL)

    def search(self, *filters: str) -> dict[str, dict]:
        """Every picture the filters keep (--top above the library's size): {file name: hit}."""
        found = self.json("search", QUERY, "--model", MODEL, "--top", "500", *filters)
        return {Path(h["path"]).name: h for h in found["results"]}
