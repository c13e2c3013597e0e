"""Safe, fast image decoding for indexing and queries.

Every photo of a collection passes through `decode_image`, so two things matter:

* Safety. A bad file (empty, truncated, mislabelled, hostile) must never crash the
  indexer or exhaust memory. Every failure becomes a `DecodeError` whose `reason` is
  one of `DECODE_REASONS`; the catalog stores that tag for the "unreadable" list.
* Speed. JPEGs are decoded with libjpeg's DCT scaling ("draft" mode) when only a
  model-sized picture is needed, which skips most of the work for camera-size files.

Reason tags (`DecodeError.reason`):

==================== ==========================================================
"not found"          the path does not exist (e.g. deleted since the scan)
"not a file"         a directory, FIFO, socket or device (checked on the open descriptor,
                     so also one swapped in since the scan), or a symbolic link where
                     the scan saw a plain file
"permission denied"  the OS refused to open or read it
"read error"         the OS reported an I/O error while reading (failing disk, ...)
"empty file"         zero bytes
"not an image"       no image format recognises the content
"unsupported format" an image, but in a format or colour mode we do not decode
"too large"          the header claims more than `max_pixels`, or memory ran out; a RAW file
                     over MAX_RAW_BYTES
"truncated"          the file ends before the image data does
"unsupported RAW"    a RAW file (by extension) that LibRaw cannot read: a camera newer than
                     the LibRaw in use, or not a RAW file at all
"decode error"       anything else: corrupt data inside an otherwise valid file
==================== ==========================================================

RAW files (RAW_EXTENSIONS) go through LibRaw, in engine.indexing.raw: the embedded preview
when it is large enough for the caller, else a half-size demosaic.

Files are opened only through engine.fileutil.open_user_file: never blocking (a FIFO),
never reading without end (a device, a file still growing), with no stat-then-open race.

Pillow's global state is left alone: no change to `Image.MAX_IMAGE_PIXELS` or
`ImageFile.LOAD_TRUNCATED_IMAGES` (the latter would turn truncated JPEGs into silently
grey-bottomed pictures that then get indexed). The only global effect is registering
pillow-heif's HEIF opener, which is what any HEIC-aware code in the process wants.
"""

from __future__ import annotations

import errno
import re
import threading
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, UnidentifiedImageError

from engine.errors import DecodeError
from engine.fileutil import NotARegularFileError, UserFile, open_user_file
from engine.types import ImageMeta

__all__ = [
    "DECODE_REASONS",
    "MAX_PIXELS",
    "MAX_RAW_BYTES",
    "NO_EXIF",
    "RAW_EXTENSIONS",
    "SUPPORTED_EXTENSIONS",
    "ExifFields",
    "capture_date",
    "decode_image",
    "fields_from_exif",
    "open_error",
    "read_meta",
    "upright",
]

DECODE_REASONS: frozenset[str] = frozenset(
    {
        "not found",
        "not a file",
        "permission denied",
        "read error",
        "empty file",
        "not an image",
        "unsupported format",
        "too large",
        "truncated",
        "unsupported RAW",
        "decode error",
    }
)

# Pixel limit checked against the header size before any pixel is decoded.
# 120 MP sits above the largest common camera sensors (~102 MP medium format, e.g.
# Fujifilm GFX100 / Hasselblad X2D at about 11650x8740), so no ordinary photo is refused,
# while a full RGB decode at the limit costs ~360 MB, affordable on a desktop for the
# one or two decodes in flight. Bigger files are mostly giant stitched panoramas or
# decompression bombs; callers that want them pass `max_pixels`. Note that Pillow's own
# guard still refuses anything above 2 * Image.MAX_IMAGE_PIXELS (~179 MP by default) and
# warns (DecompressionBombWarning) between ~89.5 MP and that; we do not alter it.
MAX_PIXELS: int = 120_000_000


def _avif_available() -> bool:
    # Pillow >= 11.2 wheels bundle libavif; older or custom builds may lack it.
    try:
        from PIL import features

        return bool(features.check("avif"))
    except Exception:
        return False


_AVIF = _avif_available()

# Camera RAW files, decoded by LibRaw (rawpy): Canon (CR2, CR3), Nikon (NEF), Sony (ARW), Adobe
# and many phones and cameras (DNG), Fujifilm (RAF), Olympus/OM System (ORF), Panasonic (RW2),
# Pentax (PEF). Picked by extension: TIFF-based RAWs look like TIFFs to Pillow, whose reading of
# them would give the small first-IFD thumbnail or the undemosaiced sensor data.
RAW_EXTENSIONS: frozenset[str] = frozenset({".cr2", ".cr3", ".nef", ".arw", ".dng", ".raf", ".orf", ".rw2", ".pef"})

# A RAW is handed to LibRaw whole, in memory. 512 MiB is above the largest camera RAWs of these
# formats (an uncompressed 102 MP Fujifilm GFX100 RAF is about 205 MB, a 61 MP Sony ARW about
# 125 MB); larger files are stitched panorama DNGs or not camera files.
MAX_RAW_BYTES: int = 512 * 1024 * 1024


def _rawpy_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("rawpy") is not None


_RAW = _rawpy_installed()

# Extensions the scanner should hand to decode_image (lower-case, with the dot).
# .jfif is what Windows names many JPEGs saved from browsers; .hif is the HEIF
# extension Fujifilm and Canon cameras write.
SUPPORTED_EXTENSIONS: frozenset[str] = frozenset(
    {
        ".jpg", ".jpeg", ".jpe", ".jfif",
        ".png",
        ".webp",
        ".tif", ".tiff",
        ".bmp",
        ".gif",
        ".heic", ".heif", ".hif",
    }
    | ({".avif"} if _AVIF else set())
    | (RAW_EXTENSIONS if _RAW else set())
)  # fmt: skip

# Pillow plugins we let identify a file, in priority order. Restricting the list keeps
# exotic plugins (EPS via Ghostscript, PSD, FITS, ...) away from untrusted bytes.
# "JPEG" also yields MPO files (multi-picture JPEGs from many phones and cameras).
# AVIF comes before HEIF so pillow-heif never tries an AVIF container.
_OPEN_FORMATS: tuple[str, ...] = ("JPEG", "PNG", "WEBP", "TIFF", "BMP", "GIF", "AVIF", "HEIF")

# Decode-side transform for each EXIF orientation: the stored pixels become upright.
_TRANSPOSE: dict[int, Image.Transpose] = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}

_TAG_ORIENTATION = 0x0112
_TAG_MAKE = 0x010F
_TAG_MODEL = 0x0110
_IFD_EXIF = 0x8769
_TAG_DATETIME_ORIGINAL = 0x9003
_TAG_DATETIME_DIGITIZED = 0x9004

_EXIF_DATE_RE = re.compile(r"^\s*(\d{4})[:\-/.](\d{2})[:\-/.](\d{2})[ T](\d{2}):(\d{2}):(\d{2})")

_WHITE = (255, 255, 255)

_init_lock = threading.RLock()  # decoding runs in worker threads; first use may race
_heif_state: bool | None = None  # None: not tried yet; then whether the opener is registered


def ensure_heif() -> bool:
    """Register pillow-heif's opener once, on first use.

    Lazy so that importing this module stays cheap and a broken libheif only affects
    HEIC files, not the import of the whole engine.
    """
    global _heif_state
    if _heif_state is not None:
        return _heif_state
    with _init_lock:
        if _heif_state is None:
            try:
                import pillow_heif

                pillow_heif.register_heif_opener()
                _heif_state = True
            except Exception:
                _heif_state = False
    return _heif_state


_formats_cache: tuple[str, ...] | None = None


def _open_formats() -> tuple[str, ...]:
    """_OPEN_FORMATS minus those with no opener here.

    Image.open(formats=...) raises KeyError, not UnidentifiedImageError, for a name
    no plugin registered (e.g. HEIF without pillow-heif).
    """
    global _formats_cache
    if _formats_cache is not None:
        return _formats_cache
    with _init_lock:
        if _formats_cache is None:
            ensure_heif()
            Image.init()
            _formats_cache = tuple(f for f in _OPEN_FORMATS if f in Image.OPEN)
    return _formats_cache


# --------------------------------------------------------------------------- public API


def decode_image(
    path: Path, target_size: int | None = None, *, max_pixels: int = MAX_PIXELS, follow_symlinks: bool = True
) -> tuple[Image.Image, ImageMeta]:
    """Decode `path` to an upright RGB image plus its metadata.

    With `target_size`, the returned image may be smaller than the file but both of its
    sides stay >= target_size (or the full size when the file is smaller); the caller
    resizes to the model's square input afterwards. JPEGs use DCT-scaled decoding,
    other formats are box-reduced after decoding. Without it, the full resolution.

    `ImageMeta.width/height` are always those of the upright full-resolution image.
    Raises DecodeError (reason in DECODE_REASONS) for any unreadable file; a path that is now a
    FIFO, device, socket or folder is "not a file" (never a hang), and so is a symbolic link when
    `follow_symlinks` is False (the scan saw a plain file there).

    A RAW file (RAW_EXTENSIONS) comes from its embedded preview when that is at least
    `target_size` on its short side, else from a half-size demosaic; without `target_size`, at
    about half the sensor's resolution (engine.indexing.raw says why).
    """
    if target_size is not None and target_size < 1:
        raise ValueError(f"target_size must be positive, got {target_size}")
    path = Path(path)
    try:
        with _open_file(path, follow_symlinks) as fh:
            if _is_raw(path, fh):
                from engine.indexing.raw import decode_raw

                return decode_raw(_read_raw(fh, path), path.suffix.lower(), target_size, max_pixels)
            im = _open(fh, path, fh.size)
            try:
                rgb, meta = _decode_opened(im, target_size, max_pixels)
            except BaseException:
                im.close()
                raise
            if rgb is not im:
                im.close()
            # else: the loaded file image itself is the result; closing it would free its
            # pixels, and copying 12 MP costs ~15 ms. Its file handle closes with `fh`.
            return rgb, meta
    except DecodeError:
        raise
    except Exception as exc:  # the whole point: nothing escapes for a bad file
        raise _classify(exc, path, follow_symlinks) from exc


def read_meta(path: Path, *, follow_symlinks: bool = True) -> ImageMeta:
    """Metadata from the header and EXIF only; no pixel data is decoded.

    Does not apply `max_pixels` (nothing is allocated), so a big file still reports its
    size; only Pillow's own hard limit (~179 MP by default) raises "too large" here.
    EXIF stored in a PNG after the image data is not seen here.
    """
    path = Path(path)
    try:
        with _open_file(path, follow_symlinks) as fh:
            if _is_raw(path, fh):
                from engine.indexing.raw import read_raw_meta

                return read_raw_meta(_read_raw(fh, path), path.suffix.lower())
            im = _open(fh, path, fh.size)
            try:
                # PngImageFile.getexif() decodes all pixels when the eXIf chunk is not
                # ahead of the image data; such EXIF is skipped here rather than decode.
                fields = NO_EXIF if _png_exif_pending(im) else _exif_fields(im)
                return _build_meta(im, im.size, fields, _pending_without_load(im, fields))
            finally:
                im.close()
    except DecodeError:
        raise
    except Exception as exc:
        raise _classify(exc, path, follow_symlinks) from exc


# --------------------------------------------------------------------------- internals


def open_error(exc: OSError, path: Path) -> DecodeError:
    """The DecodeError (reason in DECODE_REASONS) for an OSError from opening or reading `path`;
    shared with the steps that read a file before decoding it (hashing)."""
    if isinstance(exc, NotARegularFileError):
        return DecodeError("not a file", str(exc))
    if isinstance(exc, (FileNotFoundError, NotADirectoryError)):
        return DecodeError("not found", str(path))
    if isinstance(exc, PermissionError):
        return DecodeError("permission denied", str(path))
    return DecodeError("read error", f"{path}: {exc.strerror or exc}")


def _open_file(path: Path, follow_symlinks: bool) -> UserFile:
    """The file through open_user_file (no stat-then-open race: the open descriptor is checked, a
    FIFO never blocks, reads end at the size seen), OS failures as DecodeError."""
    try:
        fh = open_user_file(path, follow_symlinks=follow_symlinks)
    except OSError as exc:
        raise open_error(exc, path) from exc
    if fh.size == 0:
        fh.close()
        raise DecodeError("empty file", str(path))
    return fh


def _is_raw(path: Path, fh: UserFile) -> bool:
    """Whether the file goes to LibRaw: a RAW extension, unless the content is plainly another
    picture format (a JPEG or HEIF saved under a RAW name), which LibRaw would refuse. TIFF
    content stays RAW: most RAW formats are TIFF-based."""
    if path.suffix.lower() not in RAW_EXTENSIONS:
        return False
    head = fh.read(32)
    fh.seek(0)
    return _sniff(head) in (None, "TIFF")


def _read_raw(fh: UserFile, path: Path) -> bytes:
    """The whole RAW file (LibRaw parses it in memory), refused before reading when over MAX_RAW_BYTES."""
    if fh.size > MAX_RAW_BYTES:
        raise DecodeError("too large", f"{fh.size / 2**20:.0f} MiB RAW file exceeds {MAX_RAW_BYTES / 2**20:.0f} MiB")
    if not _RAW:
        raise DecodeError("unsupported RAW", "rawpy (LibRaw) is not installed")
    try:
        return fh.read()
    except OSError as exc:
        raise open_error(exc, path) from exc


def _open(fh: Any, path: Path, file_size: int) -> Image.Image:
    try:
        return Image.open(fh, formats=_open_formats())
    except UnidentifiedImageError:
        pass
    fh.seek(0)
    head = fh.read(32)
    claimed = _sniff(head)
    if claimed is not None:
        # Looks like a format we decode, but its header does not parse.
        if _looks_truncated(fh, claimed, file_size):
            raise DecodeError("truncated", f"{claimed} header cut short") from None
        raise DecodeError("decode error", f"corrupt {claimed} header") from None
    other = _identify_any(fh)
    if other is not None:
        raise DecodeError("unsupported format", other) from None
    raise DecodeError("not an image", "content is not a recognised image format") from None


def _decode_opened(
    im: Image.Image, target_size: int | None, max_pixels: int
) -> tuple[Image.Image, ImageMeta]:
    full_size = im.size
    w, h = full_size
    if w <= 0 or h <= 0:
        raise DecodeError("decode error", f"invalid size {w}x{h}")
    if w * h > max_pixels:
        raise DecodeError("too large", f"{w}x{h} = {w * h / 1e6:.1f} MP exceeds {max_pixels / 1e6:.1f} MP")

    # EXIF before load(): Pillow's TIFF loader applies and deletes the orientation tag.
    # Not for PNG, whose getexif() would itself decode all pixels when the eXIf chunk
    # was not ahead of the image data; that case is read after load().
    fields = None if _png_exif_pending(im) else _exif_fields(im)

    if target_size is not None and im.format in ("JPEG", "MPO"):
        # DCT scaling by 1/2, 1/4 or 1/8: Pillow picks the largest factor that keeps both
        # sides >= the requested box, which is what the square model input needs.
        im.draft("RGB", (target_size, target_size))

    im.load()
    if fields is None:
        fields = _exif_fields(im)
    # What is left to do after load(): pillow-heif (HEIF) and Pillow (TIFF) turn the
    # pixels upright themselves and drop the tag, so only the remaining tag is applied.
    pending = _orientation_of(im)
    meta = _build_meta(im, full_size, fields, pending)

    rgb = _to_rgb(im)
    if target_size is not None:
        factor = min(rgb.width // target_size, rgb.height // target_size)
        if factor >= 2:
            # ceil(side / factor) >= target_size for both sides, by choice of factor.
            rgb = rgb.reduce(factor)
    return upright(rgb, pending), meta


def upright(image: Image.Image, orientation: int | None) -> Image.Image:
    """`image` turned as EXIF `orientation` (1..8) says the stored pixels must be to stand upright;
    the same image for 1 or None."""
    if orientation not in _TRANSPOSE:
        return image
    turned = image.transpose(_TRANSPOSE[orientation])
    # The copied info still says "rotate me"; drop it so that code which later calls
    # ImageOps.exif_transpose on our result does not turn the picture twice.
    for key in ("exif", "xmp", "XML:com.adobe.xmp"):
        turned.info.pop(key, None)
    return turned


def _to_rgb(im: Image.Image) -> Image.Image:
    """Any decoded mode -> 8-bit RGB, transparency flattened onto white.

    White, not black: transparent pixels carry arbitrary colour (often black) under
    alpha 0, and cut-outs, logos and screenshots are designed to be seen on a light
    page, which is how viewers show them; the model then sees the intended picture.
    """
    mode = im.mode
    if mode == "CMYK":
        return _cmyk_to_rgb(im)
    if mode.startswith("I;16") or mode in ("I", "F"):
        return _high_depth_to_rgb(im)
    if mode in ("P", "L", "RGB") and "transparency" in im.info:
        im = im.convert("RGBA")
        mode = "RGBA"
    elif mode in ("PA", "LA", "La", "RGBa"):
        im = im.convert("RGBA")
        mode = "RGBA"
    if mode == "RGBA":
        out = Image.new("RGB", im.size, _WHITE)
        out.paste(im, mask=im.getchannel("A"))
        return out
    if mode == "RGB":
        return im
    try:
        return im.convert("RGB")
    except ValueError as exc:
        raise DecodeError("unsupported format", f"colour mode {mode}") from exc


def _cmyk_to_rgb(im: Image.Image) -> Image.Image:
    if im.format in ("JPEG", "MPO") and "adobe" not in im.info:
        # Pillow always reads CMYK JPEGs with Adobe's inverted convention. Without an
        # Adobe APP14 marker the values are stored plainly (as browsers assume too), so
        # undo Pillow's inversion.
        im = Image.eval(im, lambda v: 255 - v)
    icc = im.info.get("icc_profile")
    if icc:
        # A CMYK profile gives far better colour than the naive formula; fall back to the
        # formula if the profile is unusable.
        try:
            import io

            from PIL import ImageCms

            src = ImageCms.ImageCmsProfile(io.BytesIO(icc))
            dst = ImageCms.createProfile("sRGB")
            out = ImageCms.profileToProfile(im, src, dst, outputMode="RGB")
            if out is not None:
                return out
        except Exception:
            pass
    return im.convert("RGB")


def _high_depth_to_rgb(im: Image.Image) -> Image.Image:
    # Pillow's own I;16/I -> RGB conversion clips at 255 (a 16-bit picture turns white),
    # so scale the values down ourselves.
    arr = np.asarray(im)
    if im.mode == "F":
        arr = np.nan_to_num(arr.astype(np.float64), nan=0.0, posinf=0.0, neginf=0.0)
        top = float(arr.max()) if arr.size else 0.0
        scale = 255.0 if 0.0 <= top <= 1.0 else 1.0  # 0..1 floats vs. already 0..255
        grey = np.clip(arr * scale + 0.5, 0, 255).astype(np.uint8)
    else:
        arr = arr.astype(np.int64)
        if im.mode.startswith("I;16") or (arr.size and int(arr.max()) > 255):
            grey = ((np.clip(arr, 0, 65535) + 128) // 257).astype(np.uint8)
        else:
            grey = np.clip(arr, 0, 255).astype(np.uint8)
    return Image.fromarray(grey, "L").convert("RGB")


ExifFields = tuple[str | None, str | None, str | None, int | None]  # date, make, model, orientation
NO_EXIF: ExifFields = (None, None, None, None)


def _png_exif_pending(im: Image.Image) -> bool:
    return im.format == "PNG" and "exif" not in im.info and "Raw profile type exif" not in im.info


def _pending_without_load(im: Image.Image, fields: ExifFields) -> int | None:
    """The orientation decode_image would still apply, judged from the header alone."""
    if im.format == "HEIF":
        return None  # libheif decodes upright
    orientation = fields[3]
    if im.format == "TIFF" and orientation in (5, 6, 7, 8):
        # Pillow reports a TIFF's size already turned when its loader will turn the pixels.
        try:
            stored = (int(im.tag_v2[256]), int(im.tag_v2[257]))  # type: ignore[attr-defined]
        except Exception:
            stored = im.size
        if im.size != stored:
            return None
    return orientation


def _build_meta(
    im: Image.Image, size: tuple[int, int], fields: ExifFields, pending: int | None
) -> ImageMeta:
    """`size` as reported at open; turned when the still-pending orientation swaps sides."""
    date, make, model, found = fields
    if im.format == "HEIF":
        # pillow-heif resets the EXIF tag to 1 after libheif has turned the pixels; the
        # tag as found in the file is kept here.
        original = _valid_orientation(im.info.get("original_orientation"))
        found = original if original is not None else found
    swap = pending in (5, 6, 7, 8)
    w, h = size
    fmt = "JPEG" if im.format == "MPO" else im.format
    return ImageMeta(
        width=h if swap else w,
        height=w if swap else h,
        exif_date=date,
        camera_make=make,
        camera_model=model,
        orientation=found,
        format=fmt,
    )


def _exif_fields(im: Image.Image) -> ExifFields:
    # Broken EXIF must not cost the picture: any parse failure just means "no EXIF".
    try:
        exif = im.getexif()
    except Exception:
        return NO_EXIF
    return fields_from_exif(exif)


def fields_from_exif(exif: Image.Exif) -> ExifFields:
    """(capture date, make, model, orientation) of a parsed EXIF block; None for what it lacks or
    has broken."""
    try:
        orientation = _valid_orientation(exif.get(_TAG_ORIENTATION))
        make = _clean_text(exif.get(_TAG_MAKE))
        model = _clean_text(exif.get(_TAG_MODEL))
    except Exception:
        return NO_EXIF
    try:
        date = capture_date(exif.get_ifd(_IFD_EXIF))
    except Exception:
        date = None
    return date, make, model, orientation


def capture_date(exif_ifd: Mapping[int, Any]) -> str | None:
    """The capture time in an EXIF sub-IFD's tags, as 'YYYY-MM-DDTHH:MM:SS', or None.

    DateTimeDigitized is the capture time for scans and some phones that omit DateTimeOriginal;
    IFD0 DateTime is the last edit, so it is not used."""
    return _parse_exif_date(exif_ifd.get(_TAG_DATETIME_ORIGINAL)) or _parse_exif_date(
        exif_ifd.get(_TAG_DATETIME_DIGITIZED)
    )


def _orientation_of(im: Image.Image) -> int | None:
    try:
        return _valid_orientation(im.getexif().get(_TAG_ORIENTATION))
    except Exception:
        return None


def _valid_orientation(value: Any) -> int | None:
    if isinstance(value, tuple) and value:
        value = value[0]
    try:
        o = int(value)
    except (TypeError, ValueError):
        return None
    return o if 1 <= o <= 8 else None


def _clean_text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if not isinstance(value, str):
        return None
    text = value.replace("\x00", " ").strip()
    text = " ".join(text.split())
    return text or None


def _parse_exif_date(value: Any) -> str | None:
    """'YYYY:MM:DD HH:MM:SS' (and common variants) -> 'YYYY-MM-DDTHH:MM:SS', else None."""
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    if not isinstance(value, str):
        return None
    m = _EXIF_DATE_RE.match(value)
    if not m:
        return None
    try:
        dt = datetime(*(int(g) for g in m.groups()))
    except ValueError:  # "0000:00:00 00:00:00" placeholders, impossible dates
        return None
    return dt.strftime("%Y-%m-%dT%H:%M:%S")


# Magic numbers of the formats we decode, to tell "corrupt X" from "not an image".
_SIGNATURES: tuple[tuple[bytes, str], ...] = (
    (b"\xff\xd8\xff", "JPEG"),
    (b"\x89PNG\r\n\x1a\n", "PNG"),
    (b"GIF8", "GIF"),
    (b"RIFF", "WEBP"),
)


def _sniff(head: bytes) -> str | None:
    if 0 < len(head) < 8:
        # A file cut inside its magic number is still recognisably that format.
        for sig, fmt in _SIGNATURES:
            if sig.startswith(head) or head.startswith(sig):
                return fmt
    if head.startswith(b"\xff\xd8\xff"):
        return "JPEG"
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "PNG"
    if head[:6] in (b"GIF87a", b"GIF89a"):
        return "GIF"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "WEBP"
    if head[:4] in (b"II*\x00", b"MM\x00*"):
        return "TIFF"
    if head[:2] == b"BM":
        return "BMP"
    if head[4:8] == b"ftyp":
        brand = head[8:12]
        if brand in (b"avif", b"avis"):
            return "AVIF"
        if brand in (b"heic", b"heix", b"heim", b"heis", b"hevc", b"hevx", b"mif1", b"msf1"):
            return "HEIF"
    return None


# Bytes a complete file of the format ends with (allowing a little trailing padding).
_TRAILERS: dict[str, bytes] = {"JPEG": b"\xff\xd9", "PNG": b"IEND", "GIF": b"\x3b"}


def _looks_truncated(fh: Any, fmt: str, file_size: int) -> bool:
    trailer = _TRAILERS.get(fmt)
    try:
        if trailer is None:
            if fmt == "WEBP":
                # RIFF size field: bytes after the first 8 that a complete file has.
                fh.seek(4)
                declared = int.from_bytes(fh.read(4), "little")
                return file_size < declared + 8
            return False
        fh.seek(max(0, file_size - 64))
        tail = fh.read(64)
    except Exception:
        return False
    if fmt == "GIF":
        return not tail.rstrip(b"\x00").endswith(trailer)
    return trailer not in tail


def _identify_any(fh: Any) -> str | None:
    """Name of a format Pillow knows but we do not decode, if the bytes are one."""
    try:
        fh.seek(0)
        with Image.open(fh) as other:
            return str(other.format or "unknown image format")
    except Exception:
        return None


def _classify(exc: BaseException, path: Path, follow_symlinks: bool = True) -> DecodeError:
    if isinstance(exc, Image.DecompressionBombError):
        return DecodeError("too large", str(exc))
    if isinstance(exc, MemoryError):
        return DecodeError("too large", "out of memory while decoding")
    if isinstance(exc, PermissionError):
        return DecodeError("permission denied", str(path))
    if isinstance(exc, FileNotFoundError):
        return DecodeError("not found", str(path))
    if isinstance(exc, (IsADirectoryError, NotARegularFileError)):
        return DecodeError("not a file", str(path))
    if isinstance(exc, OSError) and exc.errno is not None and exc.errno != errno.ENOENT:
        # A real I/O error from the OS carries an errno; Pillow's own OSErrors do not.
        return DecodeError("read error", f"{path}: {exc.strerror or exc}")
    message = str(exc) or type(exc).__name__
    if isinstance(exc, EOFError) or "truncated" in message.lower():
        return DecodeError("truncated", message)
    if _file_looks_truncated(path, follow_symlinks):
        return DecodeError("truncated", message)
    return DecodeError("decode error", f"{type(exc).__name__}: {message}")


def _file_looks_truncated(path: Path, follow_symlinks: bool = True) -> bool:
    try:
        with open_user_file(path, follow_symlinks=follow_symlinks) as fh:
            head = fh.read(32)
            fmt = _sniff(head)
            if fmt is None:
                return False
            return _looks_truncated(fh, fmt, fh.size)
    except Exception:
        return False
