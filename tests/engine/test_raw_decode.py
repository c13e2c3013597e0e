"""RAW files through LibRaw (engine.indexing.raw): real DNGs written by engine.samples.write_dng
and opened by LibRaw, the embedded-preview and half-size-demosaic paths, orientation, metadata,
the limits, and the reasons recorded for files LibRaw cannot read."""

from __future__ import annotations

import io
import struct
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw

from engine.errors import DecodeError
from engine.indexing import decode
from engine.indexing.decode import (
    DECODE_REASONS,
    RAW_EXTENSIONS,
    SUPPORTED_EXTENSIONS,
    decode_image,
    read_meta,
)
from engine.indexing.raw import orientation_of_flip, raw_exif_fields, raw_looks_truncated
from engine.samples import exif_bytes, marker_picture, stored_for_orientation, write_dng
from engine.thumbnails import make_thumbnail

UPRIGHT = (256, 192)  # the upright picture; its half-size demosaic is 128x96
PREVIEW_SCALE = 3 / 8  # previews are 96x72 upright: enough for 72 px, not for 80
SMALL_NEED, BIG_NEED = 48, 80
DATE = "2023:07:14 18:30:05"


def upright_picture() -> Image.Image:
    return marker_picture(UPRIGHT)  # red top-left, green top-right, white elsewhere


def preview_of(stored: Image.Image) -> Image.Image:
    """The camera's preview of `stored`, marked with a blue centre block the sensor data lacks, so
    a test can tell which of the two a decoded picture came from."""
    w, h = round(stored.width * PREVIEW_SCALE), round(stored.height * PREVIEW_SCALE)
    preview = stored.resize((w, h), Image.Resampling.BILINEAR)
    ImageDraw.Draw(preview).rectangle((w // 2 - 6, h // 2 - 6, w // 2 + 6, h // 2 + 6), fill=(0, 0, 255))
    return preview


def make_dng(folder: Path, orientation: int, preview: str | None, name: str | None = None, **kw) -> Path:
    """A DNG of upright_picture() stored as a camera held for `orientation` would store it;
    preview: None, "jpeg", "bitmap" (both in IFD0) or "jpeg-subifd"."""
    stored = stored_for_orientation(upright_picture(), orientation)
    kind, _, where = (preview or "").partition("-")
    return write_dng(folder / (name or f"o{orientation}-{preview}.dng"), stored, orientation=orientation,
                     preview=preview_of(stored) if preview else None, preview_kind=kind or "jpeg",
                     preview_in=where or "ifd0", date=DATE, make="Longlens Optics", model="LL-1 Mark II", **kw)


def pixel(image: Image.Image, x: int, y: int) -> tuple[int, int, int]:
    return tuple(int(v) for v in np.asarray(image)[y, x])


def is_red(p) -> bool:
    return p[0] > 190 and p[1] < 80 and p[2] < 80


def is_green(p) -> bool:
    return p[1] > 100 and p[0] < 80 and p[2] < 80


def is_white(p) -> bool:
    return min(p) > 200


def is_blue(p) -> bool:
    return p[2] > 190 and p[0] < 80 and p[1] < 80


def assert_upright(image: Image.Image) -> None:
    """Red top-left, green top-right, white bottom-left: only the upright picture has all three."""
    w, h = image.size
    assert w > h, f"a landscape picture came out {w}x{h}"
    corners = {"top-left": pixel(image, 2, 2), "top-right": pixel(image, w - 3, 2),
               "bottom-left": pixel(image, 2, h - 3), "bottom-right": pixel(image, w - 3, h - 3)}
    assert is_red(corners["top-left"]), corners
    assert is_green(corners["top-right"]), corners
    assert is_white(corners["bottom-left"]) and is_white(corners["bottom-right"]), corners


def centre(image: Image.Image) -> tuple[int, int, int]:
    return pixel(image, image.width // 2, image.height // 2)


# --------------------------------------------------------------------------- formats picked


def test_raw_extensions_are_scanned_and_lowercase() -> None:
    assert {".cr2", ".cr3", ".nef", ".arw", ".dng", ".raf", ".orf", ".rw2", ".pef"} == RAW_EXTENSIONS
    assert RAW_EXTENSIONS <= SUPPORTED_EXTENSIONS
    assert "unsupported RAW" in DECODE_REASONS


def test_flip_maps_back_to_the_exif_orientation_libraw_read() -> None:
    # LibRaw: flip = "50132467"[orientation & 7]; orientation_of_flip is its inverse.
    for orientation in range(1, 9):
        assert orientation_of_flip(int("50132467"[orientation & 7])) == orientation


# --------------------------------------------------------------------------- the two paths, upright


@pytest.mark.parametrize("orientation", [1, 3, 6, 8])
@pytest.mark.parametrize("preview", ["jpeg", "bitmap", "jpeg-subifd"])
def test_preview_path_is_upright_for_every_orientation(tmp_path: Path, orientation: int, preview: str) -> None:
    path = make_dng(tmp_path, orientation, preview)
    image, meta = decode_image(path, target_size=SMALL_NEED)
    assert is_blue(centre(image)), "the preview (blue centre) was not used"
    assert image.size == (96, 72)  # the preview, upright, not reduced below the need
    assert_upright(image)
    assert (meta.width, meta.height) == UPRIGHT
    assert meta.orientation == orientation
    assert meta.format == "DNG"


@pytest.mark.parametrize("orientation", [1, 3, 6, 8])
@pytest.mark.parametrize("preview", [None, "jpeg"])
def test_demosaic_path_is_upright_for_every_orientation(tmp_path: Path, orientation: int,
                                                        preview: str | None) -> None:
    # No preview, or one too small for the need (72 < 80): a half-size demosaic of the sensor data.
    path = make_dng(tmp_path, orientation, preview)
    image, meta = decode_image(path, target_size=BIG_NEED)
    assert is_white(centre(image)), "the sensor data has no blue centre: the preview was used"
    assert image.size == (128, 96)  # half of 256x192
    assert_upright(image)
    assert (meta.width, meta.height) == UPRIGHT
    assert meta.orientation == orientation


def test_demosaic_keeps_the_pictures_colours(tmp_path: Path) -> None:
    # The DNG's colour matrix makes the camera space sRGB, so the demosaic shows the picture's own
    # colours (LibRaw's automatic brightening shifts their level a little, not their relations).
    rng = np.random.default_rng(3)
    blocks = rng.integers(40, 220, (6, 8, 3), dtype=np.uint8)
    picture = Image.fromarray(np.repeat(np.repeat(blocks, 32, 0), 32, 1))
    path = write_dng(tmp_path / "blocks.dng", picture)
    image, _ = decode_image(path, target_size=64)
    assert image.size == (128, 96)
    got = np.asarray(image, dtype=np.float64).reshape(6, 16, 8, 16, 3)[:, 3:13, :, 3:13].mean(axis=(1, 3))
    assert np.corrcoef(got.ravel(), blocks.astype(np.float64).ravel())[0, 1] > 0.98
    assert float(np.abs(got - blocks).mean()) < 20


def test_the_model_size_decides_between_preview_and_demosaic(tmp_path: Path) -> None:
    path = make_dng(tmp_path, 1, "jpeg")
    for need in (16, 48, 72):
        assert is_blue(centre(decode_image(path, target_size=need)[0])), need
    for need in (73, 96, 200):
        assert not is_blue(centre(decode_image(path, target_size=need)[0])), need


def test_target_size_reduces_by_whole_factors_keeping_the_need(tmp_path: Path) -> None:
    path = make_dng(tmp_path, 6, None)
    image, _ = decode_image(path, target_size=24)
    assert image.size == (32, 24)  # the 128x96 demosaic reduced 4x, both sides still >= 24
    assert_upright(image)


def test_without_target_size_a_half_size_preview_or_the_demosaic(tmp_path: Path) -> None:
    small = make_dng(tmp_path, 8, "jpeg")
    image, _ = decode_image(small)
    assert image.size == (128, 96) and not is_blue(centre(image))
    stored = stored_for_orientation(upright_picture(), 8)
    big_preview = stored.resize((stored.width // 2, stored.height // 2))
    ImageDraw.Draw(big_preview).rectangle((40, 50, 55, 70), fill=(0, 0, 255))
    big = write_dng(tmp_path / "big-preview.dng", stored, orientation=8, preview=big_preview)
    image, _ = decode_image(big)
    assert image.size == (128, 96) and is_blue(pixel(image, 60, 48))
    assert_upright(image)


def test_a_damaged_preview_falls_back_to_the_sensor_data(tmp_path: Path) -> None:
    path = make_dng(tmp_path, 6, "jpeg")
    data = bytearray(path.read_bytes())
    sof = data.index(b"\xff\xc0")  # the preview JPEG's frame header: a 0x0 picture does not parse
    data[sof + 5 : sof + 9] = bytes(4)
    path.write_bytes(bytes(data))
    image, _ = decode_image(path, target_size=SMALL_NEED)
    assert image.size == (64, 48) and is_white(centre(image))  # the 128x96 demosaic, reduced 2x
    assert_upright(image)


def test_thumbnails_of_raw_files_are_upright(tmp_path: Path) -> None:
    thumb = make_thumbnail(make_dng(tmp_path, 6, "jpeg"), 64)
    assert max(thumb.size) == 64 and thumb.width > thumb.height
    assert_upright(thumb)


# --------------------------------------------------------------------------- metadata


def test_exif_date_and_camera_come_from_the_raw(tmp_path: Path) -> None:
    for preview in (None, "jpeg"):
        path = make_dng(tmp_path, 6, preview)
        _, meta = decode_image(path, target_size=SMALL_NEED)
        assert meta.exif_date == "2023-07-14T18:30:05"
        assert (meta.camera_make, meta.camera_model) == ("Longlens Optics", "LL-1 Mark II")
        assert read_meta(path) == meta


def test_a_raw_without_date_or_orientation_has_none(tmp_path: Path) -> None:
    path = write_dng(tmp_path / "plain.dng", upright_picture(), date=None)
    data = bytearray(path.read_bytes())
    # Drop the Orientation tag (274) from IFD0 by renaming it to an unknown private tag.
    ifd0 = struct.unpack("<I", data[4:8])[0]
    for i in range(struct.unpack("<H", data[ifd0 : ifd0 + 2])[0]):
        at = ifd0 + 2 + 12 * i
        if struct.unpack("<H", data[at : at + 2])[0] == 274:
            data[at : at + 2] = struct.pack("<H", 65000)
    path.write_bytes(bytes(data))
    meta = read_meta(path)
    assert meta.exif_date is None and meta.orientation is None
    assert meta.camera_make == "Longlens"


def test_orf_and_rw2_headers_are_read_as_tiff(tmp_path: Path) -> None:
    data = make_dng(tmp_path, 1, None).read_bytes()
    for magic in (b"IIRO", b"IIU\x00"):
        date, make, model, orientation = raw_exif_fields(magic + data[4:])
        assert (date, make, model, orientation) == ("2023-07-14T18:30:05", "Longlens Optics", "LL-1 Mark II", 1)


def test_cr3_metadata_boxes_are_read() -> None:
    cmt1 = exif_bytes(make="Canon", model="Canon EOS R5", orientation=6)
    tags = Image.Exif()
    tags[0x9003] = "2022:01:02 03:04:05"  # CMT2: the EXIF tags stand in its IFD0
    cmt2 = tags.tobytes()

    def box(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", 8 + len(body)) + kind + body

    data = box(b"ftyp", b"crx \x00\x00\x00\x01crx isom") + box(b"moov", box(b"CMT1", cmt1) + box(b"CMT2", cmt2))
    assert raw_exif_fields(data) == ("2022-01-02T03:04:05", "Canon", "Canon EOS R5", 6)
    assert not raw_looks_truncated(data)
    assert raw_looks_truncated(data[:-10])


def test_raf_header_extents_tell_truncation() -> None:
    header = bytearray(b"FUJIFILMCCD-RAW 0201FF383501" + bytes(200))
    struct.pack_into(">IIIIII", header, 84, 160, 20, 180, 10, 190, 30)  # preview, metadata, CFA
    whole = bytes(header) + bytes(300)
    assert not raw_looks_truncated(whole[:220])
    assert raw_looks_truncated(whole[:219])


# --------------------------------------------------------------------------- limits


def test_a_raw_over_the_pixel_limit_is_refused_before_demosaic(tmp_path: Path) -> None:
    path = make_dng(tmp_path, 1, "jpeg")
    with pytest.raises(DecodeError) as info:
        decode_image(path, target_size=BIG_NEED, max_pixels=256 * 192 - 1)
    assert info.value.reason == "too large"
    assert "256x192" in info.value.detail
    # Its preview is within the limit and enough for a smaller need: nothing big is allocated.
    image, _ = decode_image(path, target_size=SMALL_NEED, max_pixels=256 * 192 - 1)
    assert is_blue(centre(image))


def test_a_header_claiming_a_huge_sensor_is_refused(tmp_path: Path) -> None:
    # The header claims 12000x11000 (132 MP, over MAX_PIXELS) for a file of a few kilobytes.
    stored = upright_picture()
    path = write_dng(tmp_path / "bomb.dng", stored, raw_size=(12000, 11000), preview=preview_of(stored))
    assert path.stat().st_size < 200_000
    with pytest.raises(DecodeError) as info:
        decode_image(path, target_size=BIG_NEED)
    assert info.value.reason == "too large" and "12000x11000" in info.value.detail
    no_preview = write_dng(tmp_path / "bomb-bare.dng", stored, raw_size=(12000, 11000))
    with pytest.raises(DecodeError) as info:
        decode_image(no_preview, target_size=SMALL_NEED)
    assert info.value.reason == "too large"
    assert read_meta(no_preview).width == 12000  # the header alone is read without limit


def test_a_raw_over_the_byte_limit_is_not_read(tmp_path: Path, monkeypatch) -> None:
    path = make_dng(tmp_path, 1, None)
    monkeypatch.setattr(decode, "MAX_RAW_BYTES", path.stat().st_size - 1)
    with pytest.raises(DecodeError) as info:
        decode_image(path, target_size=SMALL_NEED)
    assert info.value.reason == "too large" and "MiB" in info.value.detail


# --------------------------------------------------------------------------- unreadable files


def test_truncated_nef_is_recorded_as_truncated(tmp_path: Path) -> None:
    data = make_dng(tmp_path, 1, "jpeg").read_bytes()
    for cut in (len(data) // 2, len(data) - 1000, 600):
        path = tmp_path / f"cut-{cut}.nef"
        path.write_bytes(data[:cut])
        with pytest.raises(DecodeError) as info:
            decode_image(path, target_size=SMALL_NEED)
        assert info.value.reason == "truncated", (cut, info.value)
        with pytest.raises(DecodeError) as info:
            read_meta(path)
        assert info.value.reason == "truncated"


def test_garbage_nef_is_an_unsupported_raw_with_libraws_words(tmp_path: Path) -> None:
    for name, data in {"noise.nef": np.random.default_rng(0).bytes(20_000),
                       "notes.cr3": b"shopping list: eggs, milk\n" * 50,
                       "tiffish.arw": b"II*\x00\x08\x00\x00\x00" + bytes(64)}.items():
        path = tmp_path / name
        path.write_bytes(data)
        with pytest.raises(DecodeError) as info:
            decode_image(path, target_size=SMALL_NEED)
        assert info.value.reason == "unsupported RAW", (name, info.value)
        assert "LibRaw" in info.value.detail and "not a RAW file" in info.value.detail


def test_empty_raw_is_an_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.cr2"
    path.write_bytes(b"")
    with pytest.raises(DecodeError) as info:
        decode_image(path)
    assert info.value.reason == "empty file"


def test_a_jpeg_saved_under_a_raw_name_is_decoded_as_the_jpeg(tmp_path: Path) -> None:
    buf = io.BytesIO()
    upright_picture().save(buf, "JPEG", quality=90)
    path = tmp_path / "renamed.NEF"
    path.write_bytes(buf.getvalue())
    image, meta = decode_image(path, target_size=SMALL_NEED)
    assert meta.format == "JPEG" and image.size[0] > image.size[1]
    assert_upright(image)


def test_raw_decoding_leaves_the_file_untouched(tmp_path: Path) -> None:
    path = make_dng(tmp_path, 6, "jpeg")
    before = (path.read_bytes(), path.stat().st_mtime_ns)
    decode_image(path, target_size=SMALL_NEED)
    decode_image(path, target_size=BIG_NEED)
    read_meta(path)
    assert (path.read_bytes(), path.stat().st_mtime_ns) == before


@pytest.mark.skipif(not hasattr(__import__("os"), "mkfifo"), reason="FIFOs are POSIX")
def test_a_raw_path_that_is_a_fifo_is_not_a_file_and_never_blocks(tmp_path: Path) -> None:
    import os

    path = tmp_path / "IMG_0001.NEF"
    os.mkfifo(path)
    with pytest.raises(DecodeError) as info:
        decode_image(path, target_size=SMALL_NEED)
    assert info.value.reason == "not a file"
