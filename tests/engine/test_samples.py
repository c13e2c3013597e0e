"""engine.samples: deterministic sample folders of real files, and the problem files."""

from __future__ import annotations

import hashlib
import struct
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, features

from engine.errors import DecodeError
from engine.indexing.decode import SUPPORTED_EXTENSIONS, decode_image, read_meta
from engine.samples import (
    BOMB_SIZE,
    MARKER_SIZE,
    make_problem_files,
    make_sample_folder,
    marker_picture,
    stored_for_orientation,
    write_image,
)

HAVE_AVIF = features.check("avif")


def _digest(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path]]:
    root = tmp_path_factory.mktemp("samples")
    return root, make_sample_folder(root)


def test_same_seed_gives_byte_identical_files(tmp_path: Path, folder: tuple[Path, list[Path]]) -> None:
    root, paths = folder
    again = tmp_path / "again"
    paths2 = make_sample_folder(again)
    assert [p.relative_to(again) for p in paths2] == [p.relative_to(root) for p in paths]
    first, second = _digest(root), _digest(again)
    assert len(first) == 24
    assert first == second


def test_different_seed_gives_different_files(tmp_path: Path, folder: tuple[Path, list[Path]]) -> None:
    root, _ = folder
    other = tmp_path / "other"
    make_sample_folder(other, seed=1)
    a, b = _digest(root), _digest(other)
    assert a.keys() == b.keys()  # same layout ...
    assert all(a[k] != b[k] for k in a)  # ... every file's content differs


def test_every_sample_decodes_to_rgb_with_consistent_metadata(folder: tuple[Path, list[Path]]) -> None:
    root, paths = folder
    formats = set()
    for path in paths:
        assert path.is_file() and path.stat().st_size > 0
        assert path.suffix in SUPPORTED_EXTENSIONS
        image, meta = decode_image(path)
        assert image.mode == "RGB"
        assert image.size == (meta.width, meta.height)
        assert image.size in {(320, 240), (240, 320)}
        # Portrait exactly when the file says the camera was turned.
        assert (image.size == (240, 320)) == (meta.orientation in (5, 6, 7, 8))
        assert read_meta(path) == meta
        formats.add(meta.format)
    expected = {"JPEG", "PNG", "WEBP", "TIFF", "BMP", "GIF", "HEIF"} | ({"AVIF"} if HAVE_AVIF else set())
    assert formats == expected


def test_samples_are_spread_over_subfolders(folder: tuple[Path, list[Path]]) -> None:
    root, paths = folder
    parents = {p.parent.relative_to(root).as_posix() for p in paths}
    assert len(parents) >= 3
    assert any("/" in p for p in parents)  # a nested subfolder too


def test_samples_carry_exif_and_rotations(folder: tuple[Path, list[Path]]) -> None:
    _, paths = folder
    metas = [read_meta(p) for p in paths]
    with_exif = [m for m in metas if m.exif_date]
    assert len(with_exif) >= 8
    assert all(m.camera_make and m.camera_model for m in with_exif)
    assert {m.format for m in with_exif} >= {"JPEG", "TIFF", "HEIF", "PNG", "WEBP"}
    jpeg_orientations = {m.orientation for m in metas if m.format == "JPEG"}
    assert jpeg_orientations & {6, 8}
    assert 1 in jpeg_orientations and None in jpeg_orientations  # and JPEGs without EXIF
    assert len({m.exif_date for m in with_exif}) == len(with_exif)  # spread in time


def test_samples_show_different_pictures(folder: tuple[Path, list[Path]]) -> None:
    _, paths = folder
    thumbs = [np.asarray(decode_image(p)[0].resize((16, 16)), dtype=np.int16) for p in paths]
    for i in range(len(thumbs)):
        for j in range(i + 1, len(thumbs)):
            assert np.abs(thumbs[i] - thumbs[j]).mean() > 5, (paths[i], paths[j])
    # Textured, not flat: the noise gives JPEG work to do.
    assert all(t.std() > 10 for t in thumbs)


def test_size_and_count_are_respected(tmp_path: Path) -> None:
    paths = make_sample_folder(tmp_path / "s", n=5, seed=3, size=(100, 60))
    assert len(paths) == 5 and len(set(paths)) == 5
    for p in paths:
        image, _ = decode_image(p)
        assert image.size in {(100, 60), (60, 100)}
    assert make_sample_folder(tmp_path / "none", n=0) == []


def test_write_image_refuses_exif_where_the_format_cannot_hold_it(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        write_image(tmp_path / "a.bmp", Image.new("RGB", (4, 4)), "BMP", make="X")
    assert not (tmp_path / "a.bmp").exists()


def test_stored_for_orientation_round_trips_through_decode(tmp_path: Path) -> None:
    upright = marker_picture()
    for o in range(1, 9):
        stored = stored_for_orientation(upright, o)
        assert stored.size == (MARKER_SIZE if o < 5 else MARKER_SIZE[::-1])
        path = write_image(tmp_path / f"{o}.png", stored, "PNG", orientation=o)
        image, meta = decode_image(path)
        assert meta.orientation == o
        assert image.tobytes() == upright.tobytes()  # lossless format: exact


# --------------------------------------------------------------------------- problem files


@pytest.fixture(scope="module")
def problems(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_problem_files(tmp_path_factory.mktemp("problems"))


def test_problem_files_are_all_there(problems: dict[str, Path]) -> None:
    expected = {
        "empty", "text", "truncated_jpeg", "bomb_png", "mislabelled_pcx", "directory", "png16",
        "cmyk_jpeg", "cmyk_jpeg_plain", "gray_jpeg", "onebit_png", "palette_alpha_png", "rgba_png",
        "animated_gif", "animated_webp", "bad_exif_jpeg",
    } | {f"orientation_{o}" for o in range(1, 9)}  # fmt: skip
    assert set(problems) == expected
    for key, path in problems.items():
        assert path.exists(), key
    assert problems["empty"].stat().st_size == 0
    assert problems["directory"].is_dir()
    assert problems["truncated_jpeg"].read_bytes()[:3] == b"\xff\xd8\xff"
    assert not problems["truncated_jpeg"].read_bytes().endswith(b"\xff\xd9")


def test_animations_really_have_several_frames(problems: dict[str, Path]) -> None:
    for key in ("animated_gif", "animated_webp"):
        with Image.open(problems[key]) as im:
            assert getattr(im, "n_frames", 1) == 3


def test_bomb_png_is_a_valid_png_made_cheaply(tmp_path: Path) -> None:
    start = time.perf_counter()
    path = make_problem_files(tmp_path)["bomb_png"]
    assert time.perf_counter() - start < 10
    data = path.read_bytes()
    assert len(data) < 1_000_000
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    # Walk the chunks: CRCs valid, IHDR as claimed, IDAT inflates to exactly the rows.
    pos, chunks = 8, {}
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])
        assert zlib.crc32(kind + body) & 0xFFFFFFFF == crc
        chunks[kind] = body
        pos += 12 + length
    assert list(chunks) == [b"IHDR", b"IDAT", b"IEND"]
    w, h, depth, colour = struct.unpack(">IIBB", chunks[b"IHDR"][:10])
    assert (w, h) == BOMB_SIZE and (depth, colour) == (1, 0)
    inflater, total, rest = zlib.decompressobj(), 0, chunks[b"IDAT"]
    while rest:
        total += len(inflater.decompress(rest, 1 << 20))  # bounded memory
        rest = inflater.unconsumed_tail
    total += len(inflater.flush())
    assert total == h * (1 + (w + 7) // 8)
    with pytest.raises(DecodeError) as info:
        decode_image(path)
    assert info.value.reason == "too large"


def test_problem_files_are_deterministic(tmp_path: Path) -> None:
    make_problem_files(tmp_path / "a")
    make_problem_files(tmp_path / "b")
    assert _digest(tmp_path / "a") == _digest(tmp_path / "b")


def test_decoding_in_threads_matches_sequential(folder: tuple[Path, list[Path]]) -> None:
    # The indexer decodes in worker threads.
    from concurrent.futures import ThreadPoolExecutor

    _, paths = folder
    sequential = [decode_image(p, 64)[0].tobytes() for p in paths]
    with ThreadPoolExecutor(4) as pool:
        threaded = list(pool.map(lambda p: decode_image(p, 64)[0].tobytes(), paths * 3))
    assert threaded == sequential * 3
