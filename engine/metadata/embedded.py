"""Finding the XMP packet embedded in a picture, without decoding a single pixel.

Where each container keeps it (the Adobe XMP specification, part 3, and the formats' own specs):

  JPEG       an APP1 segment whose payload starts with "http://ns.adobe.com/xap/1.0/\\0"
  TIFF, DNG and the TIFF-based RAWs (CR2, NEF, ARW, PEF, ORF, RW2)   tag 700 of an IFD
  PNG        an iTXt chunk with the keyword "XML:com.adobe.xmp" (possibly deflated)
  WebP       the "XMP " chunk of the RIFF container
  HEIC, AVIF (ISO base media)   an item of type "mime" with content type application/rdf+xml in
             the meta box (located through iloc); CR3 and other ISO files: a uuid box with the XMP UUID

The container is recognised by its first bytes, not by the file name. Every read is bounded (a
packet of at most MAX_XMP_BYTES, a bounded number of segments, chunks, boxes and IFDs), so a
hostile or truncated file costs little and yields None. Files are opened only through
engine.fileutil.open_user_file.

JPEG's extended XMP (XMP specification part 3, 1.1.3.1): a packet over 64 KB is split into a
main packet, whose xmpNote:HasExtendedXMP names a GUID, and APP1 segments with the signature
"http://ns.adobe.com/xmp/extension/\\0", that GUID (32 hex digits, the MD5 of the whole extended
packet), the extended packet's full length and the offset of the segment's part. Photoshop and
exiftool move what does not fit (a long dc:subject, a Lightroom history) there; exiv2 0.28 does not
join it (a JPEG whose dc:subject exiftool moved to the extended packet reads no keywords through
python-exiv2), so it is joined here: the parts of that GUID only, each within the full length, the
whole at most MAX_XMP_BYTES, its MD5 checked. Parts that do not make the whole packet (one missing,
another GUID, a wrong MD5) are left out with a problem; the main packet is read all the same.
"""

from __future__ import annotations

import hashlib
import os
import re
import struct
import zlib
from dataclasses import dataclass, field
from typing import BinaryIO

from engine.fileutil import open_user_file
from engine.metadata.xmp import MAX_XMP_BYTES

JPEG_XMP_SIGNATURE = b"http://ns.adobe.com/xap/1.0/\x00"
JPEG_EXTENDED_XMP_SIGNATURE = b"http://ns.adobe.com/xmp/extension/\x00"
MAX_EXTENDED_GUIDS = 4  # distinct extended packets gathered in one JPEG (one is used)
# xmpNote:HasExtendedXMP as an attribute or an element, whatever prefix names the namespace.
_HAS_EXTENDED = re.compile(rb"HasExtendedXMP(?:\s*=\s*[\"']|\s*>\s*)([0-9A-Fa-f]{32})")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PNG_XMP_KEYWORD = b"XML:com.adobe.xmp"
TIFF_XMP_TAG = 700
# The UUID of XMP boxes in ISO base media files (be7acfcb-97a9-42e8-9c71-999491e3afac).
XMP_UUID = bytes.fromhex("be7acfcb97a942e89c71999491e3afac")
MAX_STEPS = 10_000  # segments, chunks, boxes or IFD entries looked at before giving up
MAX_IFDS = 8
_TIFF_MAGIC = {b"II*\x00": "<", b"MM\x00*": ">", b"IIRO": "<", b"IIU\x00": "<", b"MMOR": ">", b"II+\x00": "<",
               b"MM\x00+": ">"}


@dataclass
class EmbeddedXmp:
    """The XMP embedded in a picture: its (main) packet, and a JPEG's extended packet joined."""

    packet: bytes
    extended: bytes | None = None
    problems: list[str] = field(default_factory=list)


def read_embedded_xmp(path: os.PathLike[str] | str, *, follow_symlinks: bool = True) -> bytes | None:
    """The XMP packet embedded in the picture at `path`, or None when it holds none (or its
    container is too damaged to find one). Raises OSError when the file cannot be opened."""
    found = read_embedded_xmp_parts(path, follow_symlinks=follow_symlinks)
    return found.packet if found is not None else None


def read_embedded_xmp_parts(path: os.PathLike[str] | str, *, follow_symlinks: bool = True) -> EmbeddedXmp | None:
    """The XMP embedded in the picture at `path`, a JPEG's extended packet joined (EmbeddedXmp),
    or None. Raises OSError when the file cannot be opened."""
    with open_user_file(path, follow_symlinks=follow_symlinks) as f:
        return find_xmp_parts(f, f.size, os.path.basename(os.fspath(path)))


def find_xmp(f: BinaryIO, size: int) -> bytes | None:
    """The XMP packet in an open, seekable picture file of `size` bytes, or None."""
    found = find_xmp_parts(f, size)
    return found.packet if found is not None else None


def find_xmp_parts(f: BinaryIO, size: int, name: str = "the picture") -> EmbeddedXmp | None:
    """The XMP in an open, seekable picture file of `size` bytes (EmbeddedXmp), or None."""
    head = f.read(16)
    try:
        if head[:2] == b"\xff\xd8":
            return _jpeg(f, name)
        packet = None
        if head[:8] == PNG_SIGNATURE:
            packet = _png(f)
        elif head[:4] == b"RIFF" and head[8:12] == b"WEBP":
            packet = _webp(f, size)
        elif head[:4] in _TIFF_MAGIC:
            packet = _tiff(f, head, size)
        elif head[4:8] == b"ftyp":
            packet = _isobmff(f, size)
    except (struct.error, ValueError, zlib.error, OverflowError):
        return None  # a damaged container: the decoder reports the picture itself
    return EmbeddedXmp(packet) if packet is not None else None


def _read_exact(f: BinaryIO, n: int) -> bytes:
    if n < 0 or n > MAX_XMP_BYTES:
        raise ValueError("length out of bounds")
    data = f.read(n)
    if len(data) != n:
        raise ValueError("truncated")
    return data


# --------------------------------------------------------------------------- JPEG


def _jpeg(f: BinaryIO, name: str) -> EmbeddedXmp | None:
    main: bytes | None = None
    # GUID -> (full length, {offset: part}); at most MAX_XMP_BYTES held in all
    parts: dict[bytes, tuple[int, dict[int, bytes]]] = {}
    held = 0
    wanted: bytes | None = None  # the GUID the main packet names, once it is seen
    problems: list[str] = []
    f.seek(2)
    for _ in range(MAX_STEPS):
        byte = f.read(1)
        if byte != b"\xff":
            break  # not at a marker: the stream is damaged
        marker = f.read(1)
        while marker == b"\xff":  # fill bytes
            marker = f.read(1)
        if not marker:
            break
        m = marker[0]
        if m == 0x01 or 0xD0 <= m <= 0xD8:
            continue  # markers without a length
        if m in (0xDA, 0xD9):
            break  # start of scan / end of image: every APPn segment comes before
        (length,) = struct.unpack(">H", _read_exact(f, 2))
        if length < 2:
            break
        body = length - 2
        if m == 0xE1 and body >= len(JPEG_XMP_SIGNATURE):
            sig = _read_exact(f, len(JPEG_XMP_SIGNATURE))
            rest = body - len(sig)
            if sig == JPEG_XMP_SIGNATURE and main is None:
                main = _read_exact(f, rest)
                named = _HAS_EXTENDED.search(main)
                wanted = named.group(1).upper() if named else b""
                for other in [g for g in parts if g != wanted]:  # parts of other packets, seen before
                    held -= sum(len(c) for c in parts.pop(other)[1].values())
                continue
            ext_sig = len(JPEG_EXTENDED_XMP_SIGNATURE)
            if sig == JPEG_EXTENDED_XMP_SIGNATURE[:len(sig)] and rest >= ext_sig - len(sig) + 40:
                tail = _read_exact(f, ext_sig - len(sig))
                rest -= len(tail)
                if sig + tail == JPEG_EXTENDED_XMP_SIGNATURE:
                    header = _read_exact(f, 40)
                    rest -= 40
                    guid, (full, offset) = header[:32].upper(), struct.unpack(">II", header[32:])
                    if wanted is not None and guid != wanted:
                        f.seek(rest, os.SEEK_CUR)
                        continue  # another packet's part (the main packet names which one is its)
                    known = parts.get(guid)
                    fits = (0 < full <= MAX_XMP_BYTES and offset + rest <= full and held + rest <= MAX_XMP_BYTES
                            and (known is None or known[0] == full)
                            and (known is not None or len(parts) < MAX_EXTENDED_GUIDS))
                    if fits:
                        parts.setdefault(guid, (full, {}))[1][offset] = _read_exact(f, rest)
                        held += rest
                        continue
                    problems.append(f"the extended XMP embedded in {name}: a part past its bounds (length, offset, "
                                    f"or over {MAX_EXTENDED_GUIDS} packets) was left out")
            f.seek(rest, os.SEEK_CUR)
        else:
            f.seek(body, os.SEEK_CUR)
    if main is None:
        return None
    found = EmbeddedXmp(main, problems=problems)
    guid = wanted
    if not guid:
        return found
    if guid not in parts:
        found.problems.append(f"the XMP embedded in {name} names an extended packet ({guid.decode()}) that is "
                              "not in the file; its fields were not read")
        return found
    full, chunks = parts[guid]
    joined = bytearray()
    for offset in sorted(chunks):
        if offset != len(joined):
            break
        joined += chunks[offset]
    if len(joined) != full:
        found.problems.append(f"the extended XMP embedded in {name} is incomplete ({len(joined):,} of {full:,} "
                              "bytes in order); its fields were not read")
    elif hashlib.md5(joined, usedforsecurity=False).hexdigest().upper().encode() != guid:
        found.problems.append(f"the extended XMP embedded in {name} does not match its MD5 "
                              f"({guid.decode()}); its fields were not read")
    else:
        found.extended = bytes(joined)
    return found


# --------------------------------------------------------------------------- PNG and WebP


def _png(f: BinaryIO) -> bytes | None:
    f.seek(8)
    for _ in range(MAX_STEPS):
        header = f.read(8)
        if len(header) < 8:
            return None
        length, kind = struct.unpack(">I4s", header)
        if kind == b"IEND":
            return None
        if kind == b"iTXt" and length <= MAX_XMP_BYTES:
            data = _read_exact(f, length)
            f.seek(4, os.SEEK_CUR)  # CRC
            keyword, _, rest = data.partition(b"\x00")
            if keyword != PNG_XMP_KEYWORD or len(rest) < 2:
                continue
            compressed = rest[0] == 1
            _lang, _, rest = rest[2:].partition(b"\x00")
            _translated, _, text = rest.partition(b"\x00")
            if compressed:
                inflater = zlib.decompressobj()
                text = inflater.decompress(text, MAX_XMP_BYTES)
                if inflater.unconsumed_tail:
                    return None  # inflates past the limit: a bomb, not a packet
            return text
        f.seek(length + 4, os.SEEK_CUR)
    return None


def _webp(f: BinaryIO, size: int) -> bytes | None:
    f.seek(12)
    for _ in range(MAX_STEPS):
        header = f.read(8)
        if len(header) < 8:
            return None
        kind, length = struct.unpack("<4sI", header)
        if kind == b"XMP ":
            return _read_exact(f, length)
        if f.tell() + length > size:
            return None
        f.seek(length + (length & 1), os.SEEK_CUR)
    return None


# --------------------------------------------------------------------------- TIFF family


def _tiff(f: BinaryIO, head: bytes, size: int) -> bytes | None:
    endian = _TIFF_MAGIC[head[:4]]
    big = head[2:4] in (b"+\x00", b"\x00+")  # BigTIFF: 8-byte offsets and counts
    if big:
        (offset,) = struct.unpack(endian + "Q", head[8:16])
    else:
        (offset,) = struct.unpack(endian + "I", head[4:8])
    seen: set[int] = set()
    steps = 0
    for _ in range(MAX_IFDS):
        if offset == 0 or offset in seen or offset >= size:
            return None
        seen.add(offset)
        f.seek(offset)
        if big:
            (count,) = struct.unpack(endian + "Q", _read_exact(f, 8))
        else:
            (count,) = struct.unpack(endian + "H", _read_exact(f, 2))
        entry_size = 20 if big else 12
        if count > MAX_STEPS - steps:
            return None
        steps += count
        entries = _read_exact(f, count * entry_size)
        for i in range(count):
            e = entries[i * entry_size:(i + 1) * entry_size]
            if big:
                tag, kind, n = struct.unpack(endian + "HHQ", e[:12])
                inline, value = 8, e[12:20]
            else:
                tag, kind, n = struct.unpack(endian + "HHI", e[:8])
                inline, value = 4, e[8:12]
            if tag != TIFF_XMP_TAG or kind not in (1, 7):  # BYTE or UNDEFINED
                continue
            if n <= inline:
                return value[:n]
            (at,) = struct.unpack(endian + ("Q" if big else "I"), value)
            if at + n > size:
                return None
            f.seek(at)
            return _read_exact(f, n)
        (offset,) = struct.unpack(endian + ("Q" if big else "I"), _read_exact(f, 8 if big else 4))
    return None


# --------------------------------------------------------------------------- ISO base media (HEIC, AVIF, CR3)


def _boxes(f: BinaryIO, start: int, end: int):
    """(type, payload start, payload end) of the boxes between start and end."""
    at = start
    for _ in range(MAX_STEPS):
        if at + 8 > end:
            return
        f.seek(at)
        size, kind = struct.unpack(">I4s", _read_exact(f, 8))
        header = 8
        if size == 1:
            (size,) = struct.unpack(">Q", _read_exact(f, 8))
            header = 16
        elif size == 0:
            size = end - at
        if size < header or at + size > end:
            return
        yield kind, at + header, at + size
        at += size


def _isobmff(f: BinaryIO, size: int) -> bytes | None:
    for kind, start, end in _boxes(f, 0, size):
        if kind == b"uuid":
            found = _uuid_xmp(f, start, end)
            if found is not None:
                return found
        elif kind == b"meta":
            found = _meta_xmp(f, start + 4, end)  # meta is a full box: version and flags first
            if found is not None:
                return found
        elif kind == b"moov":
            for inner, s, e in _boxes(f, start, end):
                if inner == b"uuid":
                    found = _uuid_xmp(f, s, e)
                    if found is not None:
                        return found
    return None


def _uuid_xmp(f: BinaryIO, start: int, end: int) -> bytes | None:
    f.seek(start)
    if end - start < 16 or f.read(16) != XMP_UUID:
        return None
    return _read_exact(f, end - start - 16)


def _cstring(data: bytes, at: int) -> tuple[bytes, int]:
    stop = data.find(b"\x00", at)
    if stop < 0:
        return data[at:], len(data)
    return data[at:stop], stop + 1


def _meta_xmp(f: BinaryIO, start: int, end: int) -> bytes | None:
    xmp_item: int | None = None
    iloc: bytes | None = None
    idat_start = None
    for kind, s, e in _boxes(f, start, end):
        if kind == b"iinf":
            xmp_item = _xmp_item_id(f, s, e)
        elif kind == b"iloc":
            f.seek(s)
            iloc = _read_exact(f, e - s)
        elif kind == b"idat":
            idat_start = s
    if xmp_item is None or iloc is None:
        return None
    extents = _item_extents(iloc, xmp_item)
    if not extents:
        return None
    parts, total = [], 0
    for method, offset, length in extents:
        if method == 1:
            if idat_start is None:
                return None
            offset += idat_start
        elif method != 0:
            return None  # construction from other items: not used for XMP
        total += length
        if total > MAX_XMP_BYTES:
            return None
        f.seek(offset)
        parts.append(_read_exact(f, length))
    return b"".join(parts)


def _xmp_item_id(f: BinaryIO, start: int, end: int) -> int | None:
    f.seek(start)
    version = _read_exact(f, 4)[0]
    count_size = 2 if version == 0 else 4
    f.seek(start + 4 + count_size)
    for kind, s, e in _boxes(f, start + 4 + count_size, end):
        if kind != b"infe" or e - s > 4096:
            continue
        f.seek(s)
        data = _read_exact(f, e - s)
        v = data[0]
        if v >= 2:
            id_size = 2 if v == 2 else 4
            item_id = int.from_bytes(data[4:4 + id_size], "big")
            at = 4 + id_size + 2
            item_type = data[at:at + 4]
            if item_type != b"mime":
                continue
            _name, at = _cstring(data, at + 4)
            content_type, _ = _cstring(data, at)
        else:
            item_id = int.from_bytes(data[4:6], "big")
            _name, at = _cstring(data, 8)
            content_type, _ = _cstring(data, at)
        if content_type.strip().lower() == b"application/rdf+xml":
            return item_id
    return None


def _item_extents(data: bytes, wanted: int) -> list[tuple[int, int, int]]:
    """(construction method, offset, length) of the item's extents in an iloc box's payload."""
    version = data[0]
    sizes = data[4]
    offset_size, length_size = sizes >> 4, sizes & 0x0F
    second = data[5]
    base_size = second >> 4
    index_size = second & 0x0F if version in (1, 2) else 0
    at = 6
    if version < 2:
        count, at = int.from_bytes(data[at:at + 2], "big"), at + 2
    else:
        count, at = int.from_bytes(data[at:at + 4], "big"), at + 4

    def number(n: int) -> int:
        nonlocal at
        if n not in (0, 2, 4, 8) or at + n > len(data):
            raise ValueError("bad iloc field")
        value = int.from_bytes(data[at:at + n], "big")
        at += n
        return value

    for _ in range(min(count, MAX_STEPS)):
        item_id = number(2 if version < 2 else 4)
        method = 0
        if version in (1, 2):
            method = number(2) & 0x0F
        number(2)  # data reference index
        base = number(base_size)
        extent_count = number(2)
        extents = []
        for _ in range(extent_count):
            if index_size:
                number(index_size)
            off = number(offset_size)
            length = number(length_size)
            extents.append((method, base + off, length))
        if item_id == wanted:
            return extents
    return []
