"""Thumbnails: upright, bounded size, cached on disk by path/size/mtime, LRU-evicted, originals untouched."""

from __future__ import annotations

import os
import time

import pytest
from PIL import Image

from engine.errors import DecodeError
from engine.samples import marker_picture, stored_for_orientation, write_image
from engine.thumbnails import ThumbnailCache, make_thumbnail, thumbnail_key


def test_thumbnails_are_upright_and_bounded(tmp_path):
    upright = marker_picture((400, 300))
    p = write_image(tmp_path / "o6.jpg", stored_for_orientation(upright, 6), "JPEG", orientation=6, quality=95)
    before = (p.read_bytes(), p.stat().st_mtime_ns)
    th = make_thumbnail(p, 100)
    assert th.size == (100, 75)
    r, g, b = th.getpixel((5, 5))
    assert r > 200 and g < 80  # red marker top-left, as displayed
    assert (p.read_bytes(), p.stat().st_mtime_ns) == before


def test_cache_hits_and_invalidation(tmp_path):
    p = tmp_path / "a.png"
    Image.new("RGB", (300, 200), (10, 200, 10)).save(p)
    cache = ThumbnailCache(tmp_path / "cache", max_bytes=10_000_000)
    t1 = cache.get(p, 64)
    files = list((tmp_path / "cache").rglob("*.jpg"))
    assert len(files) == 1 and t1.size == (64, 43)
    assert cache.get(p, 64).size == t1.size
    assert len(list((tmp_path / "cache").rglob("*.jpg"))) == 1  # a hit, nothing new
    key = thumbnail_key(p, 64)
    Image.new("RGB", (300, 200), (200, 10, 10)).save(p)
    os.utime(p, ns=(time.time_ns(), time.time_ns() + 10**9))
    assert thumbnail_key(p, 64) != key
    assert cache.get(p, 64).getpixel((5, 5))[0] > 150  # the new content
    files[0].write_bytes(b"garbage")  # a damaged cache file is re-rendered, not an error
    assert make_thumbnail(p, 64, cache).size == (64, 43)


def test_lru_eviction_keeps_recently_used(tmp_path):
    srcs = []
    for i in range(7):
        p = tmp_path / f"{i}.png"
        Image.effect_noise((256, 256), 60 + i).convert("RGB").save(p)
        srcs.append(p)
    cache = ThumbnailCache(tmp_path / "cache", max_bytes=10**9)
    cache.get(srcs[0], 128)
    one = cache.size_bytes()
    cache = ThumbnailCache(tmp_path / "cache", max_bytes=int(one * 5.5))
    for i, p in enumerate(srcs[1:6], start=1):
        cache.get(p, 128)
        os.utime(next((tmp_path / "cache").rglob(f"{thumbnail_key(p, 128)}.jpg")), (1000 + i, 1000 + i))
    os.utime(next((tmp_path / "cache").rglob(f"{thumbnail_key(srcs[0], 128)}.jpg")), (900, 900))
    cache.get(srcs[0], 128)  # the oldest entry, but used just now: a hit makes it recent
    cache.get(srcs[6], 128)  # over the budget: the least recently used go
    assert cache.size_bytes() <= int(one * 5.5)
    names = {f.stem for f in (tmp_path / "cache").rglob("*.jpg")}
    assert thumbnail_key(srcs[0], 128) in names and thumbnail_key(srcs[6], 128) in names
    assert thumbnail_key(srcs[1], 128) not in names and thumbnail_key(srcs[5], 128) in names


def test_unreadable_files_raise_decode_error(tmp_path):
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"")
    with pytest.raises(DecodeError):
        make_thumbnail(bad, 64, ThumbnailCache(tmp_path / "cache"))
