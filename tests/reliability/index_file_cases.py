"""Crafted, truncated and bit-flipped vector index files, fed to the engine in a child process.

Run as ``python -m tests.reliability.index_file_cases WORKDIR MODE``: builds a real catalog with
vectors and its saved index (MODE exact or hnsw), then for every damaged variant of the file

* ``VectorIndex.load`` must raise IndexFileError (never load it, never crash), and
* a fresh ``IndexStore.get`` (the path the CLI and the GUI take) must rebuild the index from the
  catalog: the same ids as the catalog, searchable, with a note, and a valid file on disk again.

It prints one JSON object. A crash (segfault, abort, out-of-memory kill) shows as a negative
return code in the parent test, which is the point of running it in a child.
"""

from __future__ import annotations

import hashlib
import json
import random
import struct
import sys
from pathlib import Path

import numpy as np

from engine.catalog import Catalog, ImageWrite
from engine.errors import IndexFileError
from engine.index import vector_index as vi
from engine.index.store import IndexStore, index_path

MODEL = "crafted-test"
DIM = 32
N = 240
HNSW_M = 16
FIELD_NAMES = ("magic", "version", "mode", "dim", "M", "efc", "efs", "count", "capacity", "slots", "payload_len")
# Byte offset of each header field (the region boundaries of the fixed header).
FIELD_OFFSETS = (0, 8, 12, 16, 20, 24, 28, 32, 40, 48, 56)


def with_checksum(data: bytearray) -> bytes:
    """Recompute the SHA-256 so only the structural checks stand between the bytes and hnswlib."""
    f = vi._FIELDS.size
    data[f : f + 32] = hashlib.sha256(bytes(data[:f]) + bytes(data[vi._HEADER_SIZE :])).digest()
    return bytes(data)


def header_with(data: bytes, **changes: object) -> bytearray:
    values = dict(zip(FIELD_NAMES, vi._FIELDS.unpack_from(data), strict=True))
    values.update(changes)
    out = bytearray(data)
    out[: vi._FIELDS.size] = vi._FIELDS.pack(*values.values())
    return out


def build_catalog(work: Path, mode: str) -> tuple[Catalog, int, dict]:
    rng = np.random.default_rng(3)
    vecs = rng.standard_normal((N, DIM)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    cat = Catalog(work / "catalog.sqlite3")
    lib = cat.add_library(work)
    cat.write_batch(MODEL, [
        ImageWrite(library_id=lib.id, rel_path=f"img-{i}.jpg", size=1, mtime_ns=1, content_hash=f"h{i}",
                   status="ok", vector=vecs[i])
        for i in range(N)
    ])
    params = {"exact_threshold": 10_000 if mode == "exact" else 50, "M": HNSW_M}
    return cat, lib.id, params


def region_boundaries(data: bytes, mode: str, count: int) -> list[int]:
    """Offsets where one region of the file ends and the next begins (plus one byte either side)."""
    h = vi._HEADER_SIZE
    cuts = [*FIELD_OFFSETS, 64, 96, h]
    if mode == "exact":
        cuts += [h + 8, h + 8 * count, h + 8 * count + 4 * DIM]
    else:
        sdpe = vi._level0_bytes(DIM, HNSW_M)
        off0 = h + vi._HNSW_HEADER.size
        hnsw_fields = [0, 8, 16, 24, 32, 40, 48, 52, 56, 64, 72, 80, 88]
        cuts += [h + o for o in hnsw_fields]
        cuts += [off0 + i * sdpe + o for i in (0, 1, count // 2, count - 1) for o in (0, 4, 4 + 8 * HNSW_M, sdpe - 8)]
        cuts += [off0 + count * sdpe, off0 + count * sdpe + 4]
    cuts.append(len(data))
    out = sorted({c + d for c in cuts for d in (-1, 0, 1) if 0 <= c + d < len(data)})
    return out


def variants(data: bytes, mode: str) -> dict[str, bytes]:
    fields = dict(zip(FIELD_NAMES, vi._FIELDS.unpack_from(data), strict=True))
    count = fields["count"]
    out: dict[str, bytes] = {}
    # Crafted headers, each with a valid checksum.
    crafted = {
        "huge counts": {"count": 2**40, "slots": 2**40, "capacity": 2**40},
        "count above slots": {"count": fields["slots"] + 1},
        "capacity near 2**64": {"capacity": 2**64 - 1},
        "payload length huge": {"payload_len": 2**63},
        "payload length zero": {"payload_len": 0},
        "dim doubled": {"dim": DIM * 2},
        "dim zero": {"dim": 0},
        "dim 2**31": {"dim": 2**31},
        "M zero": {"M": 0},
        "M huge": {"M": 2**31},
        "ef_construction zero": {"efc": 0},
        "ef_search huge": {"efs": 2**32 - 1},
        "mode unknown": {"mode": 9},
        "mode flipped": {"mode": 1 - fields["mode"]},
        "newer version": {"version": 2},
        "version zero": {"version": 0},
        "wrong magic": {"magic": b"GGUF\x00\x00\x00\x00"},
    }
    for name, change in crafted.items():
        out[f"crafted header: {name}"] = with_checksum(header_with(data, **change))
    reserved = bytearray(data)
    reserved[127] = 0xFF
    out["crafted header: reserved byte set"] = with_checksum(reserved)
    if mode == "hnsw":
        h = vi._HEADER_SIZE
        hnsw_patches = {
            "hnsw element count huge": (h + 16, struct.pack("<Q", 2**40)),
            "hnsw capacity below count": (h + 8, struct.pack("<Q", 1)),
            "hnsw bytes per element huge": (h + 24, struct.pack("<Q", 2**40)),
            "hnsw top level huge": (h + 48, struct.pack("<i", 10**6)),
            "hnsw top level negative": (h + 48, struct.pack("<i", -5)),
            "hnsw entry point past the end": (h + 52, struct.pack("<I", 2**31)),
            "hnsw level multiplier NaN": (h + 80, struct.pack("<d", float("nan"))),
            "hnsw link past the end": (h + vi._HNSW_HEADER.size + 4, struct.pack("<I", 2**31)),
            "hnsw neighbour count huge": (h + vi._HNSW_HEADER.size, struct.pack("<H", 60000)),
            "hnsw upper list length odd": (h + vi._HNSW_HEADER.size + count * vi._level0_bytes(DIM, HNSW_M),
                                           struct.pack("<I", 7)),
        }
        for name, (off, patch) in hnsw_patches.items():
            b = bytearray(data)
            b[off : off + len(patch)] = patch
            out[f"crafted payload: {name}"] = with_checksum(b)
    # Truncated at every region boundary: as written (header unchanged), and with the header's
    # payload length and checksum rewritten to match (so only the structure can give it away).
    for cut in region_boundaries(data, mode, count):
        out[f"truncated at {cut}"] = data[:cut]
        if cut > vi._HEADER_SIZE:
            b = header_with(data[:cut], payload_len=cut - vi._HEADER_SIZE)
            out[f"truncated at {cut}, header and checksum rewritten"] = with_checksum(b)
    out["padded by one byte"] = data + b"\0"
    out["empty"] = b""
    out["not an index (JPEG bytes)"] = b"\xff\xd8\xff\xe0" + bytes(200)
    return out


def bit_flips(data: bytes, rnd: random.Random) -> list[tuple[int, int]]:
    """Every bit of the 128-byte header, plus 256 random payload bits."""
    flips = [(byte, bit) for byte in range(vi._HEADER_SIZE) for bit in range(8)]
    flips += [(rnd.randrange(vi._HEADER_SIZE, len(data)), rnd.randrange(8)) for _ in range(256)]
    return flips


def main(work: Path, mode: str) -> dict:
    cat, lib_id, params = build_catalog(work, mode)
    truth = cat.embedded_ids(lib_id, MODEL)
    good_store = IndexStore(work / "indexes", cat, **params)
    good = good_store.get(lib_id, MODEL, DIM)
    good_store.save(lib_id, MODEL)
    path = index_path(work / "indexes", lib_id, MODEL)
    data = path.read_bytes()
    probe = cat.vectors_for([min(truth)], MODEL)
    expected_top = good.query(probe, 5)[0][0].tolist()
    result: dict = {"mode": good.mode, "file_bytes": len(data), "cases": 0, "loaded": [], "bad_rebuilds": [],
                    "flips": 0, "flips_loaded": []}

    for name, blob in variants(data, mode).items():
        result["cases"] += 1
        path.write_bytes(blob)
        try:
            vi.VectorIndex.load(path, DIM, exact_threshold=params["exact_threshold"])
            result["loaded"].append(name)
        except IndexFileError:
            pass
        store = IndexStore(work / "indexes", cat, **params)  # a fresh start of the app
        idx = store.get(lib_id, MODEL, DIM)
        ok = (set(idx.ids().tolist()) == truth and idx.query(probe, 5)[0][0].tolist() == expected_top
              and any("rebuilt from the catalog" in n for n in store.notes))
        again = vi.VectorIndex.load(path, DIM, exact_threshold=params["exact_threshold"])
        if not ok or set(again.ids().tolist()) != truth:
            result["bad_rebuilds"].append(name)
        leftovers = sorted(p.name for p in path.parent.iterdir() if p != path)
        if leftovers:
            result["bad_rebuilds"].append(f"{name}: left {leftovers}")

    for byte, bit in bit_flips(data, random.Random(11)):
        result["flips"] += 1
        b = bytearray(data)
        b[byte] ^= 1 << bit
        path.write_bytes(bytes(b))
        try:
            vi.VectorIndex.load(path, DIM, exact_threshold=params["exact_threshold"])
            result["flips_loaded"].append(f"byte {byte} bit {bit}")
        except IndexFileError:
            pass
    cat.close()
    return result


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]), sys.argv[2])))
