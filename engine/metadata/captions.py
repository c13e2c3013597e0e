"""The captions already in the catalog: each picture's XMP description (dc:description), else
its title (dc:title), as the user's photo tools wrote them. `longlens check --from-catalog` checks
them and the Review view opens them as a caption file, so a photographer can check what is
already written without exporting anything first. Read from the catalog only: no picture or
sidecar is opened here (the index read them)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from engine.catalog import Catalog
from engine.errors import LonglensError
from engine.fileutil import atomic_write_text


@dataclass(frozen=True)
class CatalogCaption:
    image: Path
    caption: str
    field: str  # "dc:description" or "dc:title": where the caption came from


def catalog_captions(catalog: Catalog, library_roots: Sequence[Path | str] = ()) -> list[CatalogCaption]:
    """Every described picture of the given libraries (all when none are given), library by
    library in path order. Raises LonglensError naming a root that is not an indexed library."""
    libraries = catalog.libraries()
    if library_roots:
        wanted = []
        for root in library_roots:
            lib = catalog.library_by_root(Path(root).expanduser().resolve())
            if lib is None:
                known = ", ".join(lib.root for lib in libraries) or "none yet"
                raise LonglensError(f"{root} is not an indexed library (indexed: {known})", settings=("library",))
            wanted.append(lib)
        libraries = wanted
    out = []
    for lib in libraries:
        for rel, description, title in catalog.described_pictures(lib.id):
            text, field = ((description, "dc:description") if description and description.strip()
                           else (title, "dc:title"))
            if text and text.strip():
                out.append(CatalogCaption(Path(lib.root) / rel, text.strip(), field))
    return out


def write_catalog_caption_file(captions: Sequence[CatalogCaption], dest: Path) -> Path:
    """The captions as a JSONL caption file (image, caption, caption_source), written atomically,
    for Review to open. Raises LonglensError when there is nothing to write."""
    if not captions:
        raise LonglensError("no picture in the catalog has an XMP description or title yet "
                            "(index the folders whose sidecars hold them)")
    atomic_write_text(dest, "".join(json.dumps({"image": str(c.image), "caption": c.caption,
                                                "caption_source": c.field}, ensure_ascii=False) + "\n"
                                    for c in captions))
    return dest
