"""Camera RAW files through LibRaw (rawpy): CR2, CR3, NEF, ARW, DNG, RAF, ORF, RW2, PEF.

engine.indexing.decode hands a RAW file here whole, in memory, as read through
engine.fileutil (LibRaw parses a buffer; it never opens the path itself). The picture comes
from the cheaper of two sources:

* The embedded preview (the camera's JPEG, or a bitmap), when its short side is at least
  what the caller needs (`target_size`: the model's input size when indexing). Most cameras
  embed a full-size or 1-2 MP JPEG, so indexing a RAW then costs about what a JPEG does.
  Previews are stored as the sensor was held: the RAW's orientation (LibRaw's `sizes.flip`,
  which LibRaw reads from each maker's own tags) is applied here, and any orientation tag
  inside the preview is ignored, as darktable and digiKam do.
* Otherwise a half-size demosaic: each 2x2 colour-filter block becomes one pixel (no
  interpolation, about 4x less work than a full demosaic), camera white balance, 8 bits;
  LibRaw turns the result upright itself. Half of a 24 MP sensor is 3000x2000, far above any
  model input or screen.

Without `target_size` (the inspector, grounding) the need is the half-size picture's short
side: a preview that large is used, else the demosaic; a RAW too large to demosaic (over
`max_pixels`) is then shown from its preview rather than refused, since nothing more is
allocated. With `target_size` the limits refuse such a file unless its preview is enough.

The pixel limit is checked against the raw size LibRaw reads from the header, before
anything is unpacked. Capture date, make and model come from the RAW's own TIFF structure
(CR2, NEF, ARW, DNG, ORF, RW2, PEF), the CMT boxes of a CR3, or else the preview's EXIF
(RAF and others whose preview carries it).
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image

from engine.errors import DecodeError
from engine.indexing.decode import NO_EXIF, ExifFields, capture_date, fields_from_exif, upright
from engine.types import ImageMeta

__all__ = ["decode_raw", "orientation_of_flip", "raw_exif_fields", "raw_looks_truncated", "read_raw_meta"]

# LibRaw's flip is dcraw's bit field (1: mirror left-right, 2: mirror top-bottom, 4: transpose);
# LibRaw builds it from the EXIF tag as "50132467"[orientation & 7]. This is the inverse.
_FLIP_TO_ORIENTATION: dict[int, int] = {0: 1, 1: 2, 2: 4, 3: 3, 4: 5, 5: 8, 6: 6, 7: 7}

# TIFF-structured RAW headers: byte order, and whether the magic number is TIFF's own.
# ORF: "IIRO"/"IIRS"/"MMOR"; RW2: "IIU\0". Their IFDs are ordinary TIFF IFDs.
_TIFF_HEADS: dict[bytes, str] = {
    b"II*\x00": "<", b"MM\x00*": ">", b"IIRO": "<", b"IIRS": "<", b"MMOR": ">", b"IIU\x00": "<",
}
_TAG_DNG_VERSION = 50706
_RAF_MAGIC = b"FUJIFILMCCD-RAW"


def orientation_of_flip(flip: int) -> int:
    """The EXIF orientation (1..8) of LibRaw's `sizes.flip`."""
    return _FLIP_TO_ORIENTATION.get(int(flip) & 7, 1)


@dataclass
class _Preview:
    image: Image.Image  # opened (a JPEG: header only) or built from a bitmap; stored as the sensor was held
    fields: ExifFields  # the preview's own EXIF (a JPEG's), for what the RAW's structure lacks


def decode_raw(
    data: bytes, ext: str, target_size: int | None, max_pixels: int
) -> tuple[Image.Image, ImageMeta]:
    """The upright RGB picture of a RAW file's bytes and its metadata (see the module docstring).
    Raises DecodeError; `ext` (".nef") names the format when the content does not."""
    rawpy = _rawpy()
    raw = _open(rawpy, data)
    with raw:
        sizes = raw.sizes
        orientation = orientation_of_flip(sizes.flip)
        width, height = _upright_size(sizes)
        raw_pixels = int(sizes.raw_width) * int(sizes.raw_height)
        fits = raw_pixels <= max_pixels
        preview = _preview(raw, max_pixels)
        needed = target_size if target_size is not None else max(1, min(width, height) // 2)
        image = None
        if preview is not None and (min(preview.image.size) >= needed or (target_size is None and not fits)):
            try:
                image = upright(_scaled(preview.image, target_size), orientation)
            except DecodeError:
                if not fits:
                    raise
            except Exception as exc:  # a damaged preview: the sensor data may still be fine
                if not fits:
                    raise DecodeError("decode error", f"embedded preview: {type(exc).__name__}: {exc}") from exc
        if image is None:
            if not fits:
                raise DecodeError("too large", f"{sizes.raw_width}x{sizes.raw_height} = {raw_pixels / 1e6:.1f} MP "
                                  f"RAW exceeds {max_pixels / 1e6:.1f} MP, and it has no preview of "
                                  f"{needed} pixels")
            image = _scaled(_demosaic(raw, rawpy, data), target_size)
        meta = _meta(data, ext, sizes, orientation, (width, height), preview)
    return image, meta


def read_raw_meta(data: bytes, ext: str) -> ImageMeta:
    """A RAW file's metadata: header and EXIF only, no pixel is unpacked (the preview's header is
    read for its EXIF)."""
    rawpy = _rawpy()
    raw = _open(rawpy, data)
    with raw:
        sizes = raw.sizes
        preview = _preview(raw, None)
        return _meta(data, ext, sizes, orientation_of_flip(sizes.flip), _upright_size(sizes), preview)


# --------------------------------------------------------------------------- LibRaw


def _rawpy() -> Any:
    try:
        import rawpy
    except Exception as exc:  # not installed, or its LibRaw library does not load here
        raise DecodeError("unsupported RAW", f"rawpy (LibRaw) cannot be loaded: {exc}") from exc
    return rawpy


class _Buffer:
    """What rawpy's open_buffer reads: the file's bytes themselves, so they are not copied."""

    def __init__(self, data: bytes) -> None:
        self._data = data

    def read(self, *_args: Any) -> bytes:
        return self._data


def _open(rawpy: Any, data: bytes) -> Any:
    raw = rawpy.RawPy()
    try:
        raw.open_buffer(_Buffer(data))
    except Exception as exc:
        raw.close()
        mapped = _libraw_error(rawpy, exc, data, "open")
        if mapped is None:
            raise
        raise mapped from exc
    return raw


def _libraw_error(rawpy: Any, exc: Exception, data: bytes, step: str) -> DecodeError | None:
    """The DecodeError for a LibRaw failure at `step`; None for an error that is not LibRaw's."""
    if isinstance(exc, MemoryError) or isinstance(
            exc, (rawpy.LibRawTooBigError, rawpy.LibRawUnsufficientMemoryError, rawpy.LibRawMemPoolOverflowError)):
        return DecodeError("too large", f"LibRaw ran out of memory ({step})")
    if not isinstance(exc, (rawpy.LibRawError, OSError)):
        return None
    message = _text(exc)
    if raw_looks_truncated(data):
        return DecodeError("truncated", f"the RAW file ends before its data does (LibRaw: {message})")
    if step == "open" and isinstance(exc, rawpy.LibRawFileUnsupportedError):
        return DecodeError("unsupported RAW", f"LibRaw {'.'.join(map(str, rawpy.libraw_version))} cannot "
                           f"read this file: a camera it does not know yet, or not a RAW file ({message})")
    return DecodeError("decode error", f"LibRaw could not {step} the RAW data: {message}")


def _text(exc: BaseException) -> str:
    arg = exc.args[0] if exc.args else exc
    return arg.decode("utf-8", "replace") if isinstance(arg, bytes) else str(arg)


def _upright_size(sizes: Any) -> tuple[int, int]:
    w, h = int(sizes.width), int(sizes.height)
    if w <= 0 or h <= 0:
        raise DecodeError("decode error", f"invalid RAW size {w}x{h}")
    return (h, w) if int(sizes.flip) & 4 else (w, h)


def _preview(raw: Any, max_pixels: int | None) -> _Preview | None:
    """The largest embedded preview, opened but not decoded; None when there is none, LibRaw
    cannot give it, it does not parse, or it is over `max_pixels`."""
    import rawpy

    try:
        thumb = raw.extract_thumb()
    except Exception:  # LibRawNoThumbnailError, an unsupported kind (a HEIF preview), a damaged one
        return None
    try:
        if thumb.format == rawpy.ThumbFormat.JPEG:
            im = Image.open(io.BytesIO(thumb.data), formats=("JPEG",))
            fields = _jpeg_fields(im)
        elif thumb.format == rawpy.ThumbFormat.BITMAP:
            im = _bitmap_image(np.asarray(thumb.data))
            fields = NO_EXIF
        else:
            return None
    except Exception:
        return None
    w, h = im.size
    if w <= 0 or h <= 0 or (max_pixels is not None and w * h > max_pixels):
        return None
    return _Preview(im, fields)


def _jpeg_fields(im: Image.Image) -> ExifFields:
    try:
        return fields_from_exif(im.getexif())
    except Exception:
        return NO_EXIF


def _bitmap_image(arr: np.ndarray) -> Image.Image:
    if arr.dtype == np.uint16:
        arr = (arr >> 8).astype(np.uint8)
    if arr.ndim == 3 and arr.shape[2] == 1:
        arr = arr[:, :, 0]
    if arr.ndim == 2:
        return Image.fromarray(np.ascontiguousarray(arr), "L").convert("RGB")
    return Image.fromarray(np.ascontiguousarray(arr[:, :, :3]), "RGB")


def _scaled(im: Image.Image, target_size: int | None) -> Image.Image:
    """RGB, reduced by a whole factor while both sides stay >= target_size (JPEG: DCT scaling)."""
    if target_size is not None and im.format == "JPEG":
        im.draft("RGB", (target_size, target_size))
    try:
        im.load()
    except (OSError, SyntaxError, ValueError) as exc:
        raise DecodeError("decode error", f"embedded preview: {exc}") from exc
    rgb = im if im.mode == "RGB" else im.convert("RGB")
    if target_size is not None:
        factor = min(rgb.width // target_size, rgb.height // target_size)
        if factor >= 2:
            rgb = rgb.reduce(factor)
    return rgb


def _demosaic(raw: Any, rawpy: Any, data: bytes) -> Image.Image:
    try:
        rgb = raw.postprocess(half_size=True, use_camera_wb=True, output_bps=8)
    except Exception as exc:
        mapped = _libraw_error(rawpy, exc, data, "demosaic")
        if mapped is None:
            raise
        raise mapped from exc
    return Image.fromarray(np.ascontiguousarray(rgb[:, :, :3]), "RGB")


def _meta(data: bytes, ext: str, sizes: Any, orientation: int, size: tuple[int, int],
          preview: _Preview | None) -> ImageMeta:
    (date, make, model, tagged), is_dng = _container_fields(data)
    if preview is not None:
        p_date, p_make, p_model, _ = preview.fields
        date, make, model = date or p_date, make or p_make, model or p_model
    # The orientation applied (LibRaw's reading of the maker's tags); None when the file has none.
    found = orientation if (int(sizes.flip) or tagged is not None) else None
    fmt = "DNG" if is_dng else (ext.lstrip(".").upper() or "RAW")
    return ImageMeta(width=size[0], height=size[1], exif_date=date, camera_make=make, camera_model=model,
                     orientation=found, format=fmt)


# --------------------------------------------------------------------------- the RAW's own metadata


def raw_exif_fields(data: bytes) -> ExifFields:
    """(capture date, make, model, orientation) from a RAW's own structure: the TIFF IFDs of the
    TIFF-based formats, the CMT1/CMT2 boxes of a CR3. NO_EXIF for other formats or broken data."""
    return _container_fields(data)[0]


def _container_fields(data: bytes) -> tuple[ExifFields, bool]:
    """(raw_exif_fields, whether IFD0 has a DNGVersion tag)."""
    try:
        exif = _tiff_exif(data)
        if exif is not None:
            return fields_from_exif(exif), _TAG_DNG_VERSION in exif
        if data[4:12] == b"ftypcrx ":
            return _cr3_fields(data), False
    except Exception:
        pass
    return NO_EXIF, False


def _tiff_exif(data: bytes) -> Image.Exif | None:
    endian = _TIFF_HEADS.get(data[:4])
    if endian is None:
        return None
    ifd0 = int.from_bytes(data[4:8], "little" if endian == "<" else "big")
    exif = Image.Exif()
    exif.endian = endian  # what Pillow writes into the synthetic TIFF header for the IFD reader
    exif.load_from_fp(io.BytesIO(data), ifd0)
    return exif


def _cr3_fields(data: bytes) -> ExifFields:
    """CR3 (ISO base media): the CMT1 box holds a TIFF IFD0 (make, model, orientation), CMT2 one
    whose IFD0 holds the EXIF tags (capture date). Both sit in the moov box near the start."""
    head = data[: 1 << 20]
    make = model = date = None
    orientation = None
    cmt1 = _box_payload(head, b"CMT1")
    if cmt1 is not None:
        exif = Image.Exif()
        exif.load(cmt1)
        _, make, model, orientation = fields_from_exif(exif)
    cmt2 = _box_payload(head, b"CMT2")
    if cmt2 is not None:
        exif = Image.Exif()
        exif.load(cmt2)
        date = capture_date(exif)
    return date, make, model, orientation


def _box_payload(data: bytes, kind: bytes) -> bytes | None:
    at = data.find(kind)
    if at < 4:
        return None
    size = int.from_bytes(data[at - 4 : at], "big")
    if size < 8 or at - 4 + size > len(data):
        return None
    return data[at + 4 : at - 4 + size]


# --------------------------------------------------------------------------- truncation


def raw_looks_truncated(data: bytes) -> bool:
    """Whether a RAW's own structure points past the end of `data`: an IFD, strip, tile or
    preview of a TIFF-based RAW, a header block of a RAF, a box of a CR3. False when the
    structure is not recognised (then the file is "unsupported", not "truncated")."""
    try:
        if data[:4] in _TIFF_HEADS:
            return _tiff_truncated(data)
        if data.startswith(_RAF_MAGIC):
            return _raf_truncated(data)
        if data[4:8] == b"ftyp":
            return _bmff_truncated(data)
    except (struct.error, IndexError, ValueError):
        return True  # a field cut short is itself past the end
    return False


_TIFF_TYPE_SIZES = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 1, 7: 1, 8: 2, 9: 4, 10: 8, 11: 4, 12: 8, 13: 4}
# (offsets tag, byte counts tag): strips, tiles, the old JPEG preview pointer.
_EXTENT_TAGS = ((273, 279), (324, 325), (513, 514))
_SUB_IFD_TAGS = (330, 34665)  # SubIFDs (the DNG raw image, NEF's), the EXIF IFD


def _tiff_truncated(data: bytes) -> bool:
    order = "<" if data[:2] == b"II" else ">"
    n = len(data)
    todo = [struct.unpack(order + "I", data[4:8])[0]]
    seen: set[int] = set()
    while todo and len(seen) < 64:
        offset = todo.pop()
        if offset == 0 or offset in seen:
            continue
        seen.add(offset)
        if offset + 2 > n:
            return True
        count = struct.unpack(order + "H", data[offset : offset + 2])[0]
        end = offset + 2 + 12 * count
        if end + 4 > n:
            return True
        values: dict[int, list[int]] = {}
        for i in range(count):
            entry = data[offset + 2 + 12 * i : offset + 14 + 12 * i]
            tag, kind, num = struct.unpack(order + "HHI", entry[:8])
            size = _TIFF_TYPE_SIZES.get(kind, 1) * num
            at = offset + 10 + 12 * i if size <= 4 else struct.unpack(order + "I", entry[8:12])[0]
            if at + size > n:
                return True
            if kind in (3, 4, 13) and (tag in _SUB_IFD_TAGS or any(tag in pair for pair in _EXTENT_TAGS)):
                fmt, width = ("H", 2) if kind == 3 else ("I", 4)
                k = min(num, 4096)  # a real RAW has a few hundred strips at most
                values[tag] = list(struct.unpack(f"{order}{k}{fmt}", data[at : at + k * width]))
        for offsets_tag, counts_tag in _EXTENT_TAGS:
            for start, length in zip(values.get(offsets_tag, []), values.get(counts_tag, []), strict=False):
                if start + length > n:
                    return True
        for tag in _SUB_IFD_TAGS:
            todo.extend(values.get(tag, []))
        todo.append(struct.unpack(order + "I", data[end : end + 4])[0])
    return False


def _raf_truncated(data: bytes) -> bool:
    # Big-endian (offset, length) pairs at 84: the JPEG preview, the metadata block, the CFA data.
    n = len(data)
    for at in (84, 92, 100):
        offset, length = struct.unpack(">II", data[at : at + 8])
        if offset + length > n:
            return True
    return False


def _bmff_truncated(data: bytes) -> bool:
    n, at = len(data), 0
    while at < n:
        size = int.from_bytes(data[at : at + 4], "big")
        if size == 1:
            size = int.from_bytes(data[at + 8 : at + 16], "big")
        elif size == 0:
            return False  # the last box runs to the end of the file
        if size < 8:
            return False  # not a box structure we can judge
        if at + size > n:
            return True
        at += size
    return False
