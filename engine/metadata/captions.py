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

# Where the app keeps the caption file it makes from the catalogue (under the home's data folder):
# one fixed name, so reopening it resumes the review, and a re-made file after a re-index keeps
# the verdicts of the captions that did not change (engine.review marks new and changed ones).
CATALOG_CAPTION_FILE = Path("review") / "catalogue-captions.jsonl"
NO_CATALOG_CAPTIONS = ("no indexed picture has an XMP description or title yet; index the folders whose "
                       "sidecars hold them")


class NoCatalogCaptionsError(LonglensError):
    """The catalogue holds no caption to check or review."""


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


def require_catalog_captions(catalog: Catalog, library_roots: Sequence[Path | str] = ()) -> list[CatalogCaption]:
    """catalog_captions, refused with NoCatalogCaptionsError when there are none: what
    `longlens check --from-catalog` and the app's Review check before they start."""
    captions = catalog_captions(catalog, library_roots)
    if not captions:
        raise NoCatalogCaptionsError(NO_CATALOG_CAPTIONS)
    return captions


def write_catalog_caption_file(captions: Sequence[CatalogCaption], dest: Path) -> Path:
    """The captions as a JSONL caption file (image, caption, caption_source), written atomically,
    for Review to open. Raises NoCatalogCaptionsError when there is nothing to write."""
    if not captions:
        raise NoCatalogCaptionsError(NO_CATALOG_CAPTIONS)
    # ASCII escapes: a picture name that is not UTF-8 (surrogate escapes in Python) cannot be
    # written as UTF-8 text, and JSON's \u escapes bring it back unchanged when Review reads it.
    atomic_write_text(dest, "".join(json.dumps({"image": str(c.image), "caption": c.caption,
                                                "caption_source": c.field}) + "\n"
                                    for c in captions))
    return dest


def catalog_caption_file(catalog: Catalog, data_folder: Path, library_roots: Sequence[Path | str] = ()) -> Path:
    """The catalogue's captions written as the Review caption file in the home (data_folder /
    CATALOG_CAPTION_FILE), after the same checks as `longlens check --from-catalog`."""
    return write_catalog_caption_file(require_catalog_captions(catalog, library_roots),
                                      Path(data_folder) / CATALOG_CAPTION_FILE)
