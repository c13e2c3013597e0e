"""Folders of real sample image files, for `longlens demo` and for tests.

Everything here is deterministic: the same arguments give byte-identical files (all
encoders used are single-pass and carry no timestamps), so tests can hash them and the
demo catalog is the same on every run.
"""

from __future__ import annotations

import io
import struct
import zlib
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

__all__ = [
    "BOMB_SIZE",
    "MARKER_SIZE",
    "exif_bytes",
    "make_problem_files",
    "make_sample_folder",
    "marker_picture",
    "procedural_picture",
    "stored_for_orientation",
    "write_dng",
    "write_image",
]

# Formats that can carry an EXIF block through Pillow's writers.
_EXIF_FORMATS = frozenset({"JPEG", "PNG", "WEBP", "TIFF", "HEIF", "AVIF"})

_EXT_FOR_FORMAT = {
    "JPEG": ".jpg",
    "PNG": ".png",
    "WEBP": ".webp",
    "TIFF": ".tif",
    "BMP": ".bmp",
    "GIF": ".gif",
    "HEIF": ".heic",
    "AVIF": ".avif",
}

# Encode-side inverse of each EXIF orientation's decode transform: storing
# `stored_for_orientation(upright, o)` with tag o makes a viewer show `upright`.
_INVERSE_TRANSPOSE: dict[int, Image.Transpose] = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_90,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_270,
}

# Upright size of the orientation test pictures; not square so a missed 90° turn shows.
MARKER_SIZE: tuple[int, int] = (96, 64)
# Header size of the decompression-bomb PNG.
BOMB_SIZE: tuple[int, int] = (30000, 30000)

_CAMERAS: tuple[tuple[str, str], ...] = (
    ("Canon", "Canon EOS R6"),
    ("Apple", "iPhone 13 Pro"),
    ("NIKON CORPORATION", "NIKON Z 6_2"),
    ("FUJIFILM", "X-T4"),
    ("SONY", "ILCE-7M3"),
)


# --------------------------------------------------------------------------- pictures


def procedural_picture(rng: np.random.Generator, size: tuple[int, int]) -> Image.Image:
    """A random RGB picture: noisy gradient background plus a few coloured shapes."""
    w, h = size
    c1 = rng.integers(0, 256, 3).astype(np.float32)
    c2 = rng.integers(0, 256, 3).astype(np.float32)
    angle = rng.uniform(0, 2 * np.pi)
    ys, xs = np.mgrid[0:h, 0:w].astype(np.float32)
    t = xs / max(w - 1, 1) * np.cos(angle) + ys / max(h - 1, 1) * np.sin(angle)
    t = (t - t.min()) / max(float(t.max() - t.min()), 1e-6)
    bg = c1 + (c2 - c1) * t[..., None]
    # Texture, so JPEG/WebP have real work to do and files of a kind differ in size.
    noise_amp = float(rng.uniform(4, 28))
    bg += rng.normal(0.0, noise_amp, (h, w, 1)).astype(np.float32)
    img = Image.fromarray(np.clip(bg, 0, 255).astype(np.uint8), "RGB")

    draw = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(2, 6))):
        colour = tuple(int(v) for v in rng.integers(0, 256, 3))
        kind = int(rng.integers(0, 4))
        x0, x1 = sorted(int(v) for v in rng.integers(0, w, 2))
        y0, y1 = sorted(int(v) for v in rng.integers(0, h, 2))
        x1, y1 = max(x1, x0 + w // 10), max(y1, y0 + h // 10)
        if kind == 0:
            draw.ellipse((x0, y0, x1, y1), fill=colour)
        elif kind == 1:
            draw.rectangle((x0, y0, x1, y1), fill=colour)
        elif kind == 2:
            pts = [(int(rng.integers(0, w)), int(rng.integers(0, h))) for _ in range(3)]
            draw.polygon(pts, fill=colour)
        else:
            width = int(rng.integers(2, max(3, min(w, h) // 12)))
            for k in range(int(rng.integers(2, 6))):
                off = k * width * 3
                draw.line((x0 + off, y0, x0 + off + (x1 - x0) // 2, y1), fill=colour, width=width)
    return img


def marker_picture(size: tuple[int, int] = MARKER_SIZE) -> Image.Image:
    """White picture with a red square top-left and a green one top-right.

    Two markers on adjacent corners plus a non-square size tell all eight EXIF
    orientations apart (one marker cannot: a transpose keeps the top-left corner).
    """
    w, h = size
    m = max(4, min(w, h) // 4)
    img = Image.new("RGB", size, (255, 255, 255))
    draw = ImageDraw.Draw(img)
    draw.rectangle((0, 0, m - 1, m - 1), fill=(255, 0, 0))
    draw.rectangle((w - m, 0, w - 1, m - 1), fill=(0, 160, 0))
    return img


def stored_for_orientation(upright: Image.Image, orientation: int) -> Image.Image:
    """Pixels a camera would store so that `orientation` displays as `upright`."""
    if orientation == 1:
        return upright.copy()
    return upright.transpose(_INVERSE_TRANSPOSE[orientation])


# --------------------------------------------------------------------------- writing


def exif_bytes(
    *,
    date: str | datetime | None = None,
    make: str | None = None,
    model: str | None = None,
    orientation: int | None = None,
) -> bytes:
    """A TIFF-structured EXIF block with the fields Longlens reads.

    `date` is a datetime or an EXIF string "YYYY:MM:DD HH:MM:SS"; it becomes
    DateTimeOriginal (and DateTimeDigitized) in the Exif sub-IFD.
    """
    exif = Image.Exif()
    if make is not None:
        exif[0x010F] = make
    if model is not None:
        exif[0x0110] = model
    if orientation is not None:
        exif[0x0112] = int(orientation)
    if date is not None:
        text = date.strftime("%Y:%m:%d %H:%M:%S") if isinstance(date, datetime) else date
        sub = exif.get_ifd(0x8769)
        sub[0x9003] = text
        sub[0x9004] = text
    return exif.tobytes()


def write_image(
    path: Path,
    image: Image.Image,
    fmt: str,
    *,
    date: str | datetime | None = None,
    make: str | None = None,
    model: str | None = None,
    orientation: int | None = None,
    **save_options: Any,
) -> Path:
    """Save `image` as `fmt` (Pillow format name) with optional EXIF fields.

    The pixels are written as given; use `stored_for_orientation` first when the
    picture should display upright under `orientation`. Creates parent folders.
    """
    fmt = fmt.upper()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    wants_exif = any(v is not None for v in (date, make, model, orientation))
    if wants_exif:
        if fmt not in _EXIF_FORMATS:
            raise ValueError(f"{fmt} files cannot carry EXIF")
        save_options["exif"] = exif_bytes(date=date, make=make, model=model, orientation=orientation)
    if fmt == "HEIF" and not _heif_encoder_available():
        raise RuntimeError("pillow-heif with an HEVC encoder is not available")
    image.save(path, fmt, **save_options)
    return path


def _heif_encoder_available() -> bool:
    from engine.indexing.decode import ensure_heif

    if not ensure_heif():
        return False
    try:
        import pillow_heif

        return bool(pillow_heif.libheif_info().get("HEIF"))
    except Exception:
        return False


def _avif_encoder_available() -> bool:
    try:
        from PIL import features

        return bool(features.check("avif"))
    except Exception:
        return False


# --------------------------------------------------------------------------- DNG (RAW) files

# TIFF field types used below: (struct code, bytes per value; rationals are two values).
_TIFF_TYPES: dict[int, str] = {1: "B", 2: "B", 3: "H", 4: "I", 5: "I", 10: "i"}
_BYTE, _ASCII, _SHORT, _LONG, _RATIONAL, _SRATIONAL = 1, 2, 3, 4, 5, 10
# XYZ (D65) -> linear sRGB: as the DNG's ColorMatrix1 it makes the camera's colour space linear
# sRGB, so a demosaic shows the picture's own colours.
_XYZ_TO_SRGB = ((3.2406, -1.5372, -0.4986), (-0.9689, 1.8758, 0.0415), (0.0557, -0.2040, 1.0570))
DNG_BLACK, DNG_WHITE = 256, 4095  # 12-bit sensor values in 16-bit samples


class _TiffWriter:
    """A little-endian TIFF built front to back: data blocks, then the IFDs that point at them."""

    def __init__(self) -> None:
        self.buf = bytearray(b"II*\x00\x00\x00\x00\x00")

    def block(self, data: bytes) -> int:
        if len(self.buf) % 2:
            self.buf += b"\x00"  # TIFF offsets are word-aligned
        offset = len(self.buf)
        self.buf += data
        return offset

    def ifd(self, entries: list[tuple[int, int, Any]]) -> int:
        """Write an IFD of (tag, type, values: ints, or bytes for BYTE/ASCII); its offset."""
        packed = []
        for tag, kind, values in sorted(entries, key=lambda e: e[0]):
            if isinstance(values, (bytes, bytearray)):
                data, count = bytes(values), len(values)
            else:
                data = struct.pack("<" + _TIFF_TYPES[kind] * len(values), *values)
                count = len(values) // (2 if kind in (_RATIONAL, _SRATIONAL) else 1)
            value = data.ljust(4, b"\x00") if len(data) <= 4 else struct.pack("<I", self.block(data))
            packed.append(struct.pack("<HHI", tag, kind, count) + value)
        offset = self.block(struct.pack("<H", len(packed)) + b"".join(packed) + b"\x00\x00\x00\x00")
        return offset


def _srgb_to_linear(values: np.ndarray) -> np.ndarray:
    v = values / 255.0
    return np.where(v <= 0.04045, v / 12.92, ((v + 0.055) / 1.055) ** 2.4)


def _bayer_mosaic(stored: Image.Image) -> np.ndarray:
    """The RGGB colour-filter samples a sensor would record for `stored` (even width and height)."""
    rgb = _srgb_to_linear(np.asarray(stored.convert("RGB"), dtype=np.float64))
    cfa = np.empty(rgb.shape[:2], dtype=np.float64)
    cfa[0::2, 0::2] = rgb[0::2, 0::2, 0]
    cfa[0::2, 1::2] = rgb[0::2, 1::2, 1]
    cfa[1::2, 0::2] = rgb[1::2, 0::2, 1]
    cfa[1::2, 1::2] = rgb[1::2, 1::2, 2]
    return np.round(DNG_BLACK + cfa * (DNG_WHITE - DNG_BLACK)).astype("<u2")


def write_dng(
    path: Path,
    stored: Image.Image,
    *,
    orientation: int = 1,
    preview: Image.Image | None = None,
    preview_kind: str = "jpeg",
    preview_in: str = "ifd0",
    date: str | None = "2024:05:06 07:08:09",
    make: str = "Longlens",
    model: str = "Test Camera",
    raw_size: tuple[int, int] | None = None,
) -> Path:
    """Write a real DNG (Adobe's RAW format, as LibRaw reads it) of `stored`, the picture as the
    sensor was held: an uncompressed 12-bit RGGB Bayer mosaic with DNGVersion, CFA pattern,
    BlackLevel/WhiteLevel, a colour matrix, Make/Model, Orientation and an EXIF capture date.

    `preview`: an embedded preview (also as the sensor was held), a "jpeg" or an uncompressed RGB
    "bitmap" (`preview_kind`), in IFD0 with the raw image in a SubIFD (`preview_in="ifd0"`, the
    usual layout) or the other way round ("subifd"); None: IFD0 is the raw image itself.
    `raw_size` makes the header claim another raw size than the data has (a bomb's header).
    """
    w, h = stored.size
    if w % 2 or h % 2:
        raise ValueError(f"a Bayer mosaic needs even sides, got {w}x{h}")
    tiff = _TiffWriter()
    cfa = _bayer_mosaic(stored).tobytes()
    cfa_at = tiff.block(cfa)
    claimed_w, claimed_h = raw_size or (w, h)
    raw_ifd = [
        (254, _LONG, (0,)), (256, _LONG, (claimed_w,)), (257, _LONG, (claimed_h,)), (258, _SHORT, (16,)),
        (259, _SHORT, (1,)), (262, _SHORT, (32803,)), (273, _LONG, (cfa_at,)), (277, _SHORT, (1,)),
        (278, _LONG, (claimed_h,)), (279, _LONG, (len(cfa),)), (284, _SHORT, (1,)),
        (33421, _SHORT, (2, 2)), (33422, _BYTE, bytes([0, 1, 1, 2])),  # CFARepeatPatternDim, CFAPattern RGGB
        (50714, _SHORT, (DNG_BLACK,)), (50717, _SHORT, (DNG_WHITE,)),  # BlackLevel, WhiteLevel
    ]
    matrix = tuple(v for row in _XYZ_TO_SRGB for x in row for v in (round(x * 10000), 10000))
    tags = [
        (271, _ASCII, make.encode() + b"\x00"), (272, _ASCII, model.encode() + b"\x00"),
        (274, _SHORT, (orientation,)),
        (50706, _BYTE, bytes([1, 4, 0, 0])), (50707, _BYTE, bytes([1, 1, 0, 0])),  # DNG(Backward)Version
        (50708, _ASCII, f"{make} {model}".encode() + b"\x00"),  # UniqueCameraModel
        (50721, _SRATIONAL, matrix), (50778, _SHORT, (21,)),  # ColorMatrix1 under D65
        (50728, _RATIONAL, (1, 1, 1, 1, 1, 1)),  # AsShotNeutral: the camera's white balance
    ]
    if date is not None:
        tags.append((34665, _LONG, (tiff.ifd([(36867, _ASCII, date.encode() + b"\x00")]),)))  # DateTimeOriginal
    if preview is None:
        ifd0 = tiff.ifd(raw_ifd + tags)
    else:
        pw, ph = preview.size
        if preview_kind == "jpeg":
            buf = io.BytesIO()
            preview.convert("RGB").save(buf, "JPEG", quality=92)
            data, coding = buf.getvalue(), [(259, _SHORT, (7,)), (262, _SHORT, (6,))]  # JPEG, YCbCr
        elif preview_kind == "bitmap":
            data, coding = np.asarray(preview.convert("RGB")).tobytes(), [(259, _SHORT, (1,)), (262, _SHORT, (2,))]
        else:
            raise ValueError(f"preview_kind must be 'jpeg' or 'bitmap', got {preview_kind!r}")
        at = tiff.block(data)
        preview_ifd = [
            (254, _LONG, (1,)), (256, _LONG, (pw,)), (257, _LONG, (ph,)), (258, _SHORT, (8, 8, 8)),
            (273, _LONG, (at,)), (277, _SHORT, (3,)), (278, _LONG, (ph,)), (279, _LONG, (len(data),)),
            (284, _SHORT, (1,)), *coding,
        ]
        if preview_in == "ifd0":
            ifd0 = tiff.ifd(preview_ifd + tags + [(330, _LONG, (tiff.ifd(raw_ifd),))])
        elif preview_in == "subifd":
            ifd0 = tiff.ifd(raw_ifd + tags + [(330, _LONG, (tiff.ifd(preview_ifd),))])
        else:
            raise ValueError(f"preview_in must be 'ifd0' or 'subifd', got {preview_in!r}")
    tiff.buf[4:8] = struct.pack("<I", ifd0)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bytes(tiff.buf))
    return path


# --------------------------------------------------------------------------- sample folder

# One row per kind of file: (Pillow format, save options, EXIF kind). EXIF kinds:
# None (no EXIF), "camera" (date, make, model, orientation 1), "portrait" (camera,
# held upright: stored landscape with orientation 6 or 8), "flip" (orientation 3).
_SAMPLE_KINDS: tuple[tuple[str, dict[str, Any], str | None], ...] = (
    ("JPEG", {"quality": 88}, "camera"),
    ("PNG", {}, None),
    ("WEBP", {"quality": 82}, None),
    ("JPEG", {"quality": 85}, "portrait"),
    ("TIFF", {}, "camera"),  # uncompressed: libtiff cannot write the EXIF sub-IFD
    ("BMP", {}, None),
    ("GIF", {}, None),
    ("HEIF", {"quality": 70}, "camera"),
    ("JPEG", {"quality": 80}, None),
    ("PNG", {}, "camera"),
    ("WEBP", {"lossless": True}, "camera"),
    ("AVIF", {"quality": 70}, "flip"),
)

_SUBFOLDERS = ("", "2023 summer", "2024/city")


def make_sample_folder(
    dest: Path, n: int = 24, *, seed: int = 0, size: tuple[int, int] = (320, 240)
) -> list[Path]:
    """Write `n` real image files of mixed formats under `dest`; returns their paths.

    Formats rotate through JPEG (with and without EXIF, some with orientation 3/6/8),
    PNG, WebP, TIFF, BMP, GIF, HEIC and AVIF (the last two fall back to JPEG where the
    encoder is missing), spread over `dest` and two subfolders. `size` is the stored
    (sensor) size; files with orientation 6/8 display as portrait.
    """
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    have_heif = _heif_encoder_available()
    have_avif = _avif_encoder_available()
    start = datetime(2019, 1, 1, 8, 0, 0)
    paths: list[Path] = []
    for i in range(n):
        fmt, options, exif_kind = _SAMPLE_KINDS[i % len(_SAMPLE_KINDS)]
        if (fmt == "HEIF" and not have_heif) or (fmt == "AVIF" and not have_avif):
            fmt, options = "JPEG", {"quality": 85}
        # Draw every random number in the same order whatever the format, so a missing
        # encoder changes only that file, not the rest of the folder.
        make, model = _CAMERAS[int(rng.integers(0, len(_CAMERAS)))]
        when = start + timedelta(seconds=int(rng.integers(0, 5 * 365 * 86400)))
        portrait_tag = 6 if rng.random() < 0.5 else 8
        orientation = {"portrait": portrait_tag, "flip": 3}.get(exif_kind or "", 1)
        upright_size = size[::-1] if orientation in (6, 8) else size
        upright = procedural_picture(rng, (int(upright_size[0]), int(upright_size[1])))
        stored = stored_for_orientation(upright, orientation)
        if fmt == "GIF":
            stored = stored.quantize(colors=128, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)

        sub = _SUBFOLDERS[i % len(_SUBFOLDERS)]
        folder = dest / sub if sub else dest
        path = folder / f"sample_{i:03d}{_EXT_FOR_FORMAT[fmt]}"
        exif: dict[str, Any] = {}
        if exif_kind is not None:
            exif = {"date": when, "make": make, "model": model, "orientation": orientation}
        write_image(path, stored, fmt, **exif, **options)
        paths.append(path)
    return paths


# --------------------------------------------------------------------------- problem files


def make_problem_files(dest: Path) -> dict[str, Path]:
    """Write files that exercise every decoding edge case; returns name -> path.

    Bad files: "empty" (0-byte .jpg), "text" (text named .jpg), "truncated_jpeg",
    "bomb_png" (header says 30000x30000), "mislabelled_pcx" (a PCX named .jpg),
    "directory" (a folder named .jpg).
    Awkward but valid: "png16" (16-bit grey ramp, dark left to bright right),
    "cmyk_jpeg" (Adobe inverted CMYK, pure red), "cmyk_jpeg_plain" (CMYK without
    Adobe marker, pure red), "gray_jpeg", "onebit_png" (black/white halves),
    "palette_alpha_png" (left half transparent, right half red), "rgba_png" (left
    transparent, right blue), "animated_gif"/"animated_webp" (red, green, blue frames),
    "bad_exif_jpeg" (garbage EXIF, fine pixels), and "orientation_1" .. "orientation_8"
    (JPEGs that all display as `marker_picture()`).
    """
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    out: dict[str, Path] = {}

    out["empty"] = dest / "empty.jpg"
    out["empty"].write_bytes(b"")

    out["text"] = dest / "notes.jpg"
    out["text"].write_text("This is a shopping list, not a photo.\nmilk\neggs\n", encoding="utf-8")

    rng = np.random.default_rng(1234)
    noisy = procedural_picture(rng, (320, 240))
    full = dest / "_full.jpg"
    noisy.save(full, "JPEG", quality=90)
    data = full.read_bytes()
    full.unlink()
    out["truncated_jpeg"] = dest / "truncated.jpg"
    out["truncated_jpeg"].write_bytes(data[: len(data) // 2])

    out["bomb_png"] = dest / "bomb.png"
    _write_bomb_png(out["bomb_png"], *BOMB_SIZE)

    out["mislabelled_pcx"] = dest / "mislabelled_pcx.jpg"
    noisy.save(out["mislabelled_pcx"], "PCX")

    out["directory"] = dest / "folder.jpg"
    out["directory"].mkdir(exist_ok=True)

    ramp = np.tile(np.linspace(0, 65535, 64).round().astype(np.uint16), (32, 1))
    out["png16"] = dest / "gray16.png"
    Image.fromarray(ramp).save(out["png16"], "PNG")  # mode I;16 -> 16-bit greyscale PNG

    red_cmyk = Image.new("CMYK", (64, 48), (0, 255, 255, 0))
    out["cmyk_jpeg"] = dest / "cmyk_adobe.jpg"
    red_cmyk.save(out["cmyk_jpeg"], "JPEG", quality=95)
    out["cmyk_jpeg_plain"] = dest / "cmyk_plain.jpg"
    _write_plain_cmyk_jpeg(out["cmyk_jpeg_plain"], red_cmyk)

    grey = Image.fromarray(np.tile(np.linspace(0, 255, 64).astype(np.uint8), (48, 1)), "L")
    out["gray_jpeg"] = dest / "gray.jpg"
    grey.save(out["gray_jpeg"], "JPEG", quality=95)

    bits = Image.new("1", (64, 48), 0)
    ImageDraw.Draw(bits).rectangle((32, 0, 63, 47), fill=1)
    out["onebit_png"] = dest / "onebit.png"
    bits.save(out["onebit_png"], "PNG")

    pal = Image.new("P", (64, 48), 0)
    pal.putpalette([0, 0, 0, 255, 0, 0] + [0] * (256 - 2) * 3)
    ImageDraw.Draw(pal).rectangle((32, 0, 63, 47), fill=1)
    out["palette_alpha_png"] = dest / "palette_alpha.png"
    pal.save(out["palette_alpha_png"], "PNG", transparency=0)

    rgba = Image.new("RGBA", (64, 48), (0, 0, 0, 0))
    ImageDraw.Draw(rgba).rectangle((32, 0, 63, 47), fill=(0, 0, 255, 255))
    out["rgba_png"] = dest / "rgba.png"
    rgba.save(out["rgba_png"], "PNG")

    frames = [Image.new("RGB", (64, 48), c) for c in ((255, 0, 0), (0, 255, 0), (0, 0, 255))]
    out["animated_gif"] = dest / "animated.gif"
    frames[0].save(out["animated_gif"], "GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)
    out["animated_webp"] = dest / "animated.webp"
    frames[0].save(
        out["animated_webp"],
        "WEBP",
        save_all=True,
        append_images=frames[1:],
        duration=100,
        loop=0,
        lossless=True,
    )

    out["bad_exif_jpeg"] = dest / "bad_exif.jpg"
    garbage_exif = b"Exif\x00\x00II*\x00\xff\xff\xff\x7f" + bytes(range(256)) * 2
    noisy.save(out["bad_exif_jpeg"], "JPEG", quality=90, exif=garbage_exif)

    upright = marker_picture()
    for o in range(1, 9):
        p = dest / f"orientation_{o}.jpg"
        write_image(p, stored_for_orientation(upright, o), "JPEG", orientation=o, quality=95)
        out[f"orientation_{o}"] = p
    return out


def _png_chunk(kind: bytes, body: bytes) -> bytes:
    return (
        struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)
    )


def _write_bomb_png(path: Path, width: int, height: int) -> None:
    """A valid, all-black 1-bit PNG of width x height, streamed row by row.

    Pillow would need width*height bytes to build this image in memory (900 MB for
    30000x30000); writing it this way needs one row. The file is ~100 KB.
    """
    row = b"\x00" * (1 + (width + 7) // 8)  # filter byte "None" + packed bits
    comp = zlib.compressobj(9)
    parts = []
    for _ in range(height):
        chunk = comp.compress(row)
        if chunk:
            parts.append(chunk)
    parts.append(comp.flush())
    ihdr = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)  # 1-bit greyscale
    with open(path, "wb") as fh:
        fh.write(b"\x89PNG\r\n\x1a\n")
        fh.write(_png_chunk(b"IHDR", ihdr))
        fh.write(_png_chunk(b"IDAT", b"".join(parts)))
        fh.write(_png_chunk(b"IEND", b""))


def _write_plain_cmyk_jpeg(path: Path, cmyk: Image.Image) -> None:
    """A CMYK JPEG with plain (non-inverted) values and no Adobe APP14 marker.

    Pillow inverts CMYK on save and always adds the Adobe marker; pre-inverting the
    input and cutting the marker out leaves what other encoders (plain libjpeg) write.
    """
    import io

    buf = io.BytesIO()
    Image.eval(cmyk, lambda v: 255 - v).save(buf, "JPEG", quality=95)
    data = buf.getvalue()
    out = bytearray(data[:2])
    pos = 2
    while pos + 4 <= len(data) and data[pos] == 0xFF:
        marker = data[pos + 1]
        if marker == 0xDA:  # start of scan: the rest is entropy-coded data
            break
        length = int.from_bytes(data[pos + 2 : pos + 4], "big")
        segment = data[pos : pos + 2 + length]
        if not (marker == 0xEE and segment[4:9] == b"Adobe"):
            out += segment
        pos += 2 + length
    out += data[pos:]
    path.write_bytes(bytes(out))
