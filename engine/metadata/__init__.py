"""Photo metadata written by other tools: XMP packets embedded in pictures and XMP sidecar files
(Lightroom Classic, Capture One, darktable, digiKam). Reading never writes a file; xmp_write
merges review results into a sidecar's text for the explicit export (engine.xmp_export)."""

from engine.metadata.photo import (
    SidecarFile,
    display_keywords,
    is_sidecar_name,
    match_sidecars,
    read_photo_metadata,
    sidecar_state,
)
from engine.metadata.xmp import XmpError, normalise_keyword, parse_xmp

__all__ = [
    "SidecarFile",
    "XmpError",
    "display_keywords",
    "is_sidecar_name",
    "match_sidecars",
    "normalise_keyword",
    "parse_xmp",
    "read_photo_metadata",
    "sidecar_state",
]
