"""The catalogue's captions written for Review survive a picture name that is not UTF-8 (a Linux
file name of Latin-1 bytes, kept by Python as surrogate escapes): the caption file is written, and
Review reads back the very same path."""

from __future__ import annotations

import os
from pathlib import Path

from engine.metadata.captions import CatalogCaption, write_catalog_caption_file
from engine.text.captions import CaptionRow, read_captions


def test_a_picture_name_that_is_not_utf8_is_written_and_read_back_unchanged(tmp_path):
    picture = tmp_path / os.fsdecode(b"fj\xf8rd.jpg")  # Latin-1 "fjørd.jpg"
    picture.write_bytes(b"not read here")
    dest = write_catalog_caption_file([CatalogCaption(picture, "A fjord at dusk.", "dc:description")],
                                      tmp_path / "captions.jsonl")
    dest.read_bytes().decode("utf-8")  # valid UTF-8 text, whatever the names were
    rows = [r for r in read_captions(dest) if isinstance(r, CaptionRow)]
    assert [Path(r.image) for r in rows] == [picture]
    assert os.path.exists(rows[0].image)
