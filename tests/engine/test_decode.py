"""engine.indexing.decode: formats, orientation, EXIF, draft mode, bad files, fuzzing."""

from __future__ import annotations

import errno
import io
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image, features

from engine.errors import DecodeError
from engine.indexing import decode
from engine.indexing.decode import (
    DECODE_REASONS,
    MAX_PIXELS,
    SUPPORTED_EXTENSIONS,
    decode_image,
    read_meta,
)
from engine.samples import (
    BOMB_SIZE,
    MARKER_SIZE,
    _write_bomb_png,
    make_problem_files,
    marker_picture,
    procedural_picture,
    stored_for_orientation,
    write_image,
)

REPO = Path(__file__).resolve().parents[2]
HAVE_AVIF = features.check("avif")

ALL_FORMATS = ["JPEG", "PNG", "WEBP", "TIFF", "BMP", "GIF", "HEIF"] + (["AVIF"] if HAVE_AVIF else [])
EXIF_FORMATS = ["JPEG", "PNG", "WEBP", "TIFF", "HEIF"] + (["AVIF"] if HAVE_AVIF else [])
LOSSY = {"JPEG", "WEBP", "HEIF", "AVIF", "GIF"}  # GIF: palette quantisation


@pytest.fixture(scope="module")
def problems(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_problem_files(tmp_path_factory.mktemp("problems"))


def _picture(size: tuple[int, int] = (120, 80), seed: int = 5) -> Image.Image:
    return procedural_picture(np.random.default_rng(seed), size)


def _mean_abs_diff(a: Image.Image, b: Image.Image) -> float:
    assert a.size == b.size
    return float(np.abs(np.asarray(a, dtype=np.int16) - np.asarray(b, dtype=np.int16)).mean())


def _save(path: Path, image: Image.Image, fmt: str, **kw: object) -> Path:
    if fmt == "GIF":
        image = image.quantize(colors=256)
    return write_image(path, image, fmt, **kw)


# --------------------------------------------------------------------------- constants


def test_supported_extensions_are_lowercase_dotted_and_complete() -> None:
    required = {".jpg", ".jpeg", ".jpe", ".png", ".webp", ".tif", ".tiff", ".bmp", ".gif", ".heic", ".heif"}
    assert required <= SUPPORTED_EXTENSIONS
    assert all(e.startswith(".") and e == e.lower() for e in SUPPORTED_EXTENSIONS)
    assert (".avif" in SUPPORTED_EXTENSIONS) == HAVE_AVIF


def test_max_pixels_covers_100mp_cameras() -> None:
    assert 11648 * 8736 <= MAX_PIXELS  # Fujifilm GFX100 full resolution
    assert MAX_PIXELS < BOMB_SIZE[0] * BOMB_SIZE[1]


# --------------------------------------------------------------------------- formats


@pytest.mark.parametrize("fmt", ALL_FORMATS)
def test_every_format_decodes_to_rgb_with_its_size_and_pixels(tmp_path: Path, fmt: str) -> None:
    original = _picture()
    path = _save(tmp_path / f"pic.{fmt.lower()}", original, fmt)
    image, meta = decode_image(path)
    assert image.mode == "RGB"
    assert image.size == (120, 80)
    assert (meta.width, meta.height) == (120, 80)
    assert meta.format == fmt
    diff = _mean_abs_diff(image, original)
    assert diff < (12 if fmt in LOSSY else 0.001), diff
    # read_meta agrees with a full decode.
    assert read_meta(path) == meta


@pytest.mark.parametrize("fmt", EXIF_FORMATS)
@pytest.mark.parametrize("orientation", [3, 6, 8])
def test_orientation_is_applied_in_every_exif_format(tmp_path: Path, fmt: str, orientation: int) -> None:
    upright = _picture((120, 80))
    path = write_image(
        tmp_path / f"o.{fmt.lower()}",
        stored_for_orientation(upright, orientation),
        fmt,
        orientation=orientation,
    )
    image, meta = decode_image(path)
    assert image.size == (120, 80)
    assert (meta.width, meta.height) == (120, 80)
    assert meta.orientation == orientation
    assert _mean_abs_diff(image, upright) < 12
    assert read_meta(path) == meta


@pytest.mark.parametrize("compression", [None, "tiff_deflate", "jpeg"])
@pytest.mark.parametrize("orientation", [5, 6, 8])
def test_tiff_orientation_tag_is_applied_once(
    tmp_path: Path, compression: str | None, orientation: int
) -> None:
    # Pillow's TIFF loader turns the pixels itself; decode must not turn them again.
    upright = marker_picture()
    path = tmp_path / "o.tif"
    options = {"compression": compression} if compression else {}
    stored_for_orientation(upright, orientation).save(path, tiffinfo={0x0112: orientation}, **options)
    image, meta = decode_image(path)
    assert image.size == MARKER_SIZE and (meta.width, meta.height) == MARKER_SIZE
    assert meta.orientation == orientation
    assert _mean_abs_diff(image, upright) < 3
    assert read_meta(path) == meta


def test_result_does_not_ask_to_be_rotated_again(problems: dict[str, Path]) -> None:
    from PIL import ImageOps

    image, _ = decode_image(problems["orientation_6"])
    again = ImageOps.exif_transpose(image)
    assert again.size == image.size and again.tobytes() == image.tobytes()


def _marker_ok(image: Image.Image) -> None:
    """Red top-left, green top-right, white bottom corners (see samples.marker_picture)."""
    w, h = image.size
    px = np.asarray(image, dtype=int)

    def near(y: int, x: int, rgb: tuple[int, int, int]) -> bool:
        return bool(np.abs(px[y, x] - np.array(rgb)).max() < 40)

    q = min(w, h) // 8  # middle of a marker: markers are min(w, h) // 4 wide
    assert near(q, q, (255, 0, 0)), "red marker not top-left"
    assert near(q, w - 1 - q, (0, 160, 0)), "green marker not top-right"
    assert near(h - 1 - q, q, (255, 255, 255))
    assert near(h - 1 - q, w - 1 - q, (255, 255, 255))


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientations_1_to_8_give_the_same_upright_picture(
    problems: dict[str, Path], orientation: int
) -> None:
    path = problems[f"orientation_{orientation}"]
    image, meta = decode_image(path)
    assert image.mode == "RGB"
    assert image.size == MARKER_SIZE
    assert (meta.width, meta.height) == MARKER_SIZE
    assert meta.orientation == orientation
    _marker_ok(image)
    reference, _ = decode_image(problems["orientation_1"])
    assert _mean_abs_diff(image, reference) < 6
    # The draft-mode path turns the picture too.
    small, _ = decode_image(path, target_size=24)
    assert min(small.size) >= 24 and small.size[0] > small.size[1]
    _marker_ok(small)
    assert read_meta(path) == meta


# --------------------------------------------------------------------------- EXIF


@pytest.mark.parametrize("fmt", EXIF_FORMATS)
def test_exif_date_make_model_are_read(tmp_path: Path, fmt: str) -> None:
    path = write_image(
        tmp_path / f"e.{fmt.lower()}",
        _picture((64, 48)),
        fmt,
        date=datetime(2021, 5, 6, 7, 8, 9),
        make="Canon\x00\x00  ",
        model="  Canon EOS R5\x00",
        orientation=1,
    )
    _, meta = decode_image(path)
    assert meta.exif_date == "2021-05-06T07:08:09"
    assert meta.camera_make == "Canon"
    assert meta.camera_model == "Canon EOS R5"
    assert read_meta(path) == meta


def test_placeholder_exif_date_is_none(tmp_path: Path) -> None:
    path = write_image(tmp_path / "z.jpg", _picture((32, 32)), "JPEG", date="0000:00:00 00:00:00", make="X")
    meta = read_meta(path)
    assert meta.exif_date is None
    assert meta.camera_make == "X"


def test_file_without_exif_has_empty_fields(tmp_path: Path) -> None:
    path = write_image(tmp_path / "plain.jpg", _picture((32, 32)), "JPEG")
    _, meta = decode_image(path)
    assert (meta.exif_date, meta.camera_make, meta.camera_model, meta.orientation) == (None, None, None, None)
    assert meta.format == "JPEG"


def test_corrupt_exif_does_not_cost_the_picture(problems: dict[str, Path]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        image, meta = decode_image(problems["bad_exif_jpeg"])
    assert image.size == (320, 240)
    assert meta.exif_date is None and meta.orientation is None


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("2020:01:02 03:04:05", "2020-01-02T03:04:05"),
        ("2020:01:02 03:04:05\x00", "2020-01-02T03:04:05"),
        (b"2020:01:02 03:04:05", "2020-01-02T03:04:05"),
        ("2020-01-02 03:04:05", "2020-01-02T03:04:05"),
        ("2020:13:02 03:04:05", None),
        ("    :  :     :  :  ", None),
        ("", None),
        (None, None),
        (12345, None),
    ],
)
def test_exif_date_parsing(raw: object, expected: str | None) -> None:
    assert decode._parse_exif_date(raw) == expected


# --------------------------------------------------------------------------- draft / target size


def _blocky(size: tuple[int, int]) -> Image.Image:
    img = Image.new("RGB", size, (40, 90, 160))
    img.paste((220, 60, 30), (0, 0, size[0] // 2, size[1] // 2))
    return img


def test_jpeg_draft_mode_decodes_smaller_but_keeps_both_sides_at_target(tmp_path: Path) -> None:
    path = tmp_path / "big.jpg"
    _blocky((2000, 1500)).save(path, "JPEG", quality=90)
    image, meta = decode_image(path, target_size=384)
    # 1500 // 384 = 3 -> DCT scale 1/2: decoded at 1000x750, not 2000x1500.
    assert image.size == (1000, 750)
    assert (meta.width, meta.height) == (2000, 1500)
    image, _ = decode_image(path, target_size=224)
    assert image.size == (500, 375)  # 1/4
    image, _ = decode_image(path, target_size=100)
    assert image.size == (250, 188)  # 1/8, the largest DCT factor
    full, _ = decode_image(path)
    assert full.size == (2000, 1500)


def test_draft_mode_is_really_used_for_jpeg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from PIL import JpegImagePlugin

    path = tmp_path / "big.jpg"
    _blocky((1600, 1200)).save(path, "JPEG")
    calls: list[tuple[str | None, tuple[int, int] | None]] = []
    original = JpegImagePlugin.JpegImageFile.draft

    def spy(self: JpegImagePlugin.JpegImageFile, mode: str | None, size: tuple[int, int] | None):  # noqa: ANN202
        calls.append((mode, size))
        return original(self, mode, size)

    monkeypatch.setattr(JpegImagePlugin.JpegImageFile, "draft", spy)
    image, _ = decode_image(path, target_size=300)
    assert calls == [("RGB", (300, 300))]
    assert image.size == (400, 300)  # 1200 // 300 = 4 -> DCT scale 1/4
    calls.clear()
    decode_image(path)
    assert calls == []


def test_portrait_jpeg_in_draft_mode_keeps_both_sides_at_target(tmp_path: Path) -> None:
    upright = _blocky((900, 1600))  # portrait, stored as landscape + orientation 6
    path = write_image(tmp_path / "p.jpg", stored_for_orientation(upright, 6), "JPEG", orientation=6)
    image, meta = decode_image(path, target_size=384)
    assert image.size[0] < image.size[1]  # still portrait
    assert min(image.size) >= 384 and image.size[1] < 1600
    assert (meta.width, meta.height) == (900, 1600)


@pytest.mark.parametrize("fmt", ["PNG", "WEBP", "TIFF", "BMP"])
def test_other_formats_are_reduced_keeping_both_sides_at_target(tmp_path: Path, fmt: str) -> None:
    path = write_image(tmp_path / f"big.{fmt.lower()}", _blocky((1600, 1000)), fmt)
    image, meta = decode_image(path, target_size=300)
    assert min(image.size) >= 300
    assert image.size == (534, 334)  # factor min(1600 // 300, 1000 // 300) = 3, rounded up
    assert (meta.width, meta.height) == (1600, 1000)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    w=st.integers(1, 1300),
    h=st.integers(1, 1300),
    target=st.integers(1, 400),
    fmt=st.sampled_from(["JPEG", "PNG"]),
)
def test_target_size_never_undershoots(w: int, h: int, target: int, fmt: str) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / f"x.{fmt.lower()}"
        _blocky((w, h)).save(path, fmt)
        image, meta = decode_image(path, target_size=target)
    assert image.mode == "RGB"
    assert image.size[0] >= min(w, target) and image.size[1] >= min(h, target)
    assert image.size[0] <= w and image.size[1] <= h
    assert (meta.width, meta.height) == (w, h)


def test_target_size_must_be_positive(tmp_path: Path) -> None:
    path = write_image(tmp_path / "a.png", _picture((8, 8)), "PNG")
    with pytest.raises(ValueError):
        decode_image(path, target_size=0)


# --------------------------------------------------------------------------- awkward modes


def test_sixteen_bit_png_is_scaled_not_clipped(problems: dict[str, Path]) -> None:
    with Image.open(problems["png16"]) as raw:
        assert raw.mode.startswith("I;16")
    image, _ = decode_image(problems["png16"])
    row = np.asarray(image)[0, :, 0].astype(int)
    assert row[0] <= 1 and row[-1] >= 254
    assert abs(int(row[32]) - 130) <= 3  # 32/63 of full scale, not clipped to 255
    assert np.all(np.diff(row) >= 0)
    assert np.array_equal(np.asarray(image)[..., 0], np.asarray(image)[..., 2])


@pytest.mark.parametrize("key", ["cmyk_jpeg", "cmyk_jpeg_plain"])
def test_cmyk_jpeg_comes_out_red(problems: dict[str, Path], key: str) -> None:
    with Image.open(problems[key]) as raw:
        assert raw.mode == "CMYK"
        assert ("adobe" in raw.info) == (key == "cmyk_jpeg")
    image, meta = decode_image(problems[key])
    r, g, b = (int(v) for v in np.asarray(image).reshape(-1, 3).mean(axis=0))
    assert r > 240 and g < 15 and b < 15, (r, g, b)
    assert meta.format == "JPEG"


def test_cmyk_jpeg_draft_mode(tmp_path: Path) -> None:
    path = tmp_path / "cmyk.jpg"
    Image.new("CMYK", (800, 600), (0, 255, 255, 0)).save(path, "JPEG")
    image, _ = decode_image(path, target_size=100)
    assert image.mode == "RGB" and image.size == (200, 150)
    assert image.getpixel((10, 10))[0] > 240


def test_greyscale_and_one_bit(problems: dict[str, Path]) -> None:
    grey, _ = decode_image(problems["gray_jpeg"])
    assert grey.mode == "RGB"
    px = np.asarray(grey).astype(int)
    assert px[10, 2, 0] < 20 and px[10, -3, 0] > 235
    bits, _ = decode_image(problems["onebit_png"])
    assert bits.mode == "RGB"
    assert bits.getpixel((5, 5)) == (0, 0, 0) and bits.getpixel((60, 5)) == (255, 255, 255)


@pytest.mark.parametrize(("key", "colour"), [("palette_alpha_png", (255, 0, 0)), ("rgba_png", (0, 0, 255))])
def test_transparency_is_flattened_on_white(
    problems: dict[str, Path], key: str, colour: tuple[int, int, int]
) -> None:
    image, _ = decode_image(problems[key])
    assert image.mode == "RGB"
    assert image.getpixel((5, 5)) == (255, 255, 255)  # transparent (black underneath)
    assert image.getpixel((60, 40)) == colour


def test_la_image_is_flattened_on_white(tmp_path: Path) -> None:
    la = Image.new("LA", (20, 10), (0, 0))
    la.paste((80, 255), (10, 0, 20, 10))
    la.save(tmp_path / "la.png")
    image, _ = decode_image(tmp_path / "la.png")
    assert image.getpixel((2, 2)) == (255, 255, 255) and image.getpixel((15, 5)) == (80, 80, 80)


@pytest.mark.parametrize("key", ["animated_gif", "animated_webp"])
def test_animation_gives_its_first_frame(problems: dict[str, Path], key: str) -> None:
    image, meta = decode_image(problems[key])
    assert image.mode == "RGB" and image.size == (64, 48)
    r, g, b = image.getpixel((30, 20))
    assert r > 240 and g < 15 and b < 15


# --------------------------------------------------------------------------- bad files


@pytest.mark.parametrize(
    ("key", "reason"),
    [
        ("empty", "empty file"),
        ("text", "not an image"),
        ("truncated_jpeg", "truncated"),
        ("bomb_png", "too large"),
        ("mislabelled_pcx", "unsupported format"),
        ("directory", "not a file"),
    ],
)
def test_problem_files_give_their_reason(problems: dict[str, Path], key: str, reason: str) -> None:
    with pytest.raises(DecodeError) as info:
        decode_image(problems[key])
    assert info.value.reason == reason
    assert reason in DECODE_REASONS
    assert info.value.detail


def test_truncated_jpeg_is_refused_not_grey_filled(problems: dict[str, Path]) -> None:
    with pytest.raises(DecodeError) as info:
        decode_image(problems["truncated_jpeg"], target_size=64)
    assert info.value.reason == "truncated"
    # The header is intact, so metadata alone can still be read.
    meta = read_meta(problems["truncated_jpeg"])
    assert (meta.width, meta.height) == (320, 240)


@pytest.mark.parametrize("cut", [3, 20, 200, 0.5, 0.9])
@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "GIF", "WEBP"])
def test_truncation_anywhere_is_a_decode_error(tmp_path: Path, fmt: str, cut: float) -> None:
    data = io.BytesIO()
    _picture((160, 120)).convert("P" if fmt == "GIF" else "RGB").save(data, fmt)
    raw = data.getvalue()
    n = int(len(raw) * cut) if isinstance(cut, float) else cut
    path = tmp_path / f"cut.{fmt.lower()}"
    path.write_bytes(raw[:n])
    with pytest.raises(DecodeError) as info:
        decode_image(path)
    assert info.value.reason in {"truncated", "decode error"}


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DecodeError) as info:
        decode_image(tmp_path / "nope.jpg")
    assert info.value.reason == "not found"
    with pytest.raises(DecodeError) as info:
        read_meta(tmp_path / "nope.jpg")
    assert info.value.reason == "not found"


def test_fifo_is_not_a_file_and_does_not_block(tmp_path: Path) -> None:
    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs here")
    fifo = tmp_path / "pipe.jpg"
    os.mkfifo(fifo)
    with pytest.raises(DecodeError) as info:
        decode_image(fifo)
    assert info.value.reason == "not a file"


def test_permission_denied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_image(tmp_path / "secret.jpg", _picture((16, 16)), "JPEG")
    if os.name == "posix" and os.geteuid() != 0:
        path.chmod(0)
    else:  # root reads anything: simulate the OS refusing instead

        def refuse(*args: object, **kwargs: object) -> None:
            raise PermissionError(errno.EACCES, "Permission denied")

        monkeypatch.setattr(decode, "open_user_file", refuse)  # the one open of a user file
    try:
        with pytest.raises(DecodeError) as info:
            decode_image(path)
        assert info.value.reason == "permission denied"
    finally:
        path.chmod(0o644)


def test_os_read_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_image(tmp_path / "a.jpg", _picture((16, 16)), "JPEG")

    def broken_disk(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(decode, "open_user_file", broken_disk)  # the one open of a user file
    with pytest.raises(DecodeError) as info:
        decode_image(path)
    assert info.value.reason == "read error"


def test_own_pixel_limit_is_checked_before_decoding(tmp_path: Path) -> None:
    path = write_image(tmp_path / "a.png", _picture((320, 240)), "PNG")
    with pytest.raises(DecodeError) as info:
        decode_image(path, max_pixels=320 * 240 - 1)
    assert info.value.reason == "too large"
    image, _ = decode_image(path, max_pixels=320 * 240)
    assert image.size == (320, 240)


def test_header_over_default_limit_is_refused_fast(tmp_path: Path) -> None:
    # 144 MP: over MAX_PIXELS but under Pillow's own hard limit, so our check decides.
    path = tmp_path / "b.png"
    _write_bomb_png(path, 12000, 12000)
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        with pytest.raises(DecodeError) as info:
            decode_image(path)
        meta = read_meta(path)
    assert time.perf_counter() - start < 1.0
    assert info.value.reason == "too large"
    assert (meta.width, meta.height) == (12000, 12000)


_PEAK_SCRIPT = """
import json, resource, sys, time, warnings
from pathlib import Path
from engine.errors import DecodeError
from engine.indexing.decode import decode_image
warnings.simplefilter("ignore")
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
out = {}
for p in sys.argv[1:]:
    t = time.perf_counter()
    try:
        decode_image(Path(p))
        out[p] = "decoded"
    except DecodeError as e:
        out[p] = e.reason
    out[p + ":s"] = time.perf_counter() - t
out["grew_kb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(json.dumps(out))
"""


@pytest.mark.skipif(sys.platform == "win32", reason="uses the resource module")
def test_bombs_are_refused_without_allocating(problems: dict[str, Path], tmp_path: Path) -> None:
    mid = tmp_path / "mid.png"
    _write_bomb_png(mid, 12000, 12000)
    bomb = problems["bomb_png"]
    assert bomb.stat().st_size < 1_000_000  # cheap to store, 900 MB to decode
    proc = subprocess.run(
        [sys.executable, "-c", _PEAK_SCRIPT, str(bomb), str(mid)],
        capture_output=True, text=True, cwd=REPO, timeout=60, check=True,
    )  # fmt: skip
    out = json.loads(proc.stdout)
    assert out[str(bomb)] == "too large" and out[str(mid)] == "too large"
    assert out[str(bomb) + ":s"] < 1.0 and out[str(mid) + ":s"] < 1.0
    # A decode would need >= 144 MB for the smaller one (1 byte per pixel in mode "1").
    assert out["grew_kb"] < 30_000, out


# --------------------------------------------------------------------------- fuzzing


def _fuzz_bases() -> dict[str, bytes]:
    picture = _picture((48, 32), seed=11)
    bases = {}
    for fmt in ("JPEG", "PNG", "GIF", "WEBP", "TIFF", "BMP"):
        buf = io.BytesIO()
        img = picture.convert("P") if fmt == "GIF" else picture
        kwargs: dict[str, object] = {}
        if fmt in ("JPEG", "PNG", "WEBP"):
            # EXIF in the file, so the EXIF parser gets mutated bytes as well.
            from engine.samples import exif_bytes

            kwargs["exif"] = exif_bytes(date="2020:01:01 10:00:00", make="Canon", model="R", orientation=6)
        img.save(buf, fmt, **kwargs)
        bases[fmt] = buf.getvalue()
    return bases


_BASES = _fuzz_bases()

_mutation = st.one_of(
    st.tuples(st.just("truncate"), st.floats(0, 1)),
    st.tuples(st.just("flip"), st.floats(0, 1), st.integers(1, 255)),
    st.tuples(st.just("insert"), st.floats(0, 1), st.binary(min_size=1, max_size=64)),
    st.tuples(st.just("overwrite"), st.floats(0, 1), st.binary(min_size=1, max_size=16)),
)


def _mutate(data: bytes, mutations: list[tuple]) -> bytes:
    buf = bytearray(data)
    for m in mutations:
        if not buf:
            break
        at = min(int(m[1] * len(buf)), len(buf) - 1)
        if m[0] == "truncate":
            del buf[at:]
        elif m[0] == "flip":
            buf[at] ^= m[2]
        elif m[0] == "insert":
            buf[at:at] = m[2]
        else:
            buf[at : at + len(m[2])] = m[2]
    return bytes(buf)


@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::PIL.Image.DecompressionBombWarning")
@pytest.mark.parametrize("fmt", sorted(_BASES))
@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutations=st.lists(_mutation, min_size=1, max_size=4), target=st.sampled_from([None, 16]))
def test_mutated_files_decode_or_raise_decode_error(
    fmt: str, mutations: list[tuple], target: int | None
) -> None:
    data = _mutate(_BASES[fmt], mutations)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / f"fuzz.{fmt.lower()}"
        path.write_bytes(data)
        try:
            # A lower limit keeps a header mutated to e.g. 9000x9000 from costing 240 MB.
            image, meta = decode_image(path, target, max_pixels=4_000_000)
        except DecodeError as exc:
            assert exc.reason in DECODE_REASONS
        else:
            assert image.mode == "RGB" and image.width > 0 and image.height > 0
            assert meta.width > 0 and meta.height > 0
        try:
            read_meta(path)
        except DecodeError as exc:
            assert exc.reason in DECODE_REASONS


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("fmt", sorted(_BASES))
def test_every_single_truncation_point_of_the_header(tmp_path: Path, fmt: str) -> None:
    raw = _BASES[fmt]
    path = tmp_path / f"t.{fmt.lower()}"
    for n in range(1, min(len(raw), 400), 3):
        path.write_bytes(raw[:n])
        with pytest.raises(DecodeError) as info:
            decode_image(path)
        assert info.value.reason in {"truncated", "decode error", "not an image"}, (n, info.value)
