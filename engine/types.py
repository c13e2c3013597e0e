"""Plain data passed between engine layers, the CLI and the GUI."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# Image row status values in the catalog.
STATUS_OK = "ok"
STATUS_UNREADABLE = "unreadable"
STATUS_DELETED = "deleted"

# Library status values.
LIBRARY_ONLINE = "online"
LIBRARY_OFFLINE = "offline"


@dataclass
class Library:
    id: int
    root: str
    status: str = LIBRARY_ONLINE
    added_at: float = 0.0
    last_scan_at: float | None = None


@dataclass
class ImageMeta:
    """What decoding learns about a file besides its pixels."""

    width: int
    height: int
    exif_date: str | None = None  # ISO 8601, local time as the camera wrote it
    camera_make: str | None = None
    camera_model: str | None = None
    orientation: int | None = None  # EXIF orientation tag 1..8, as found in the file
    format: str | None = None


@dataclass(frozen=True)
class MetadataField:
    """One field as a tool wrote it, for the inspector and `--json`: `name` in exiv2's key form
    (what digiKam and `exiv2 -pa` show: "Exif.Photo.DateTimeOriginal", "Iptc.Application2.Keywords",
    "Xmp.dc.subject"), `value` as written (entries of an array joined by ", "), `source` where it
    was read ("IMG_0001.CR2.xmp", "IMG_0001.jpg (embedded XMP)", "IMG_0001.jpg (EXIF)",
    "IMG_0001.jpg (IPTC)"), `used` whether it is the value in effect (False: a source of higher
    precedence set that group, or the value was recognised as not the picture's, with `note` saying
    why, e.g. darktable's copy of the file time)."""

    name: str
    value: str
    source: str
    used: bool = True
    note: str = ""


@dataclass
class PhotoMetadata:
    """What a picture's metadata says about it (its XMP sidecars, the XMP packet embedded in the
    file, its IPTC-IIM and EXIF), as engine.metadata reads it and the catalog stores it. Keywords:
    `subjects` are flat (dc:subject, IPTC Keywords), `hierarchy` holds paths with '|' between
    levels ("Places|Norway|Oslo": lr:hierarchicalSubject, digiKam:TagsList, mwg-kw)."""

    title: str | None = None
    description: str | None = None
    subjects: tuple[str, ...] = ()
    hierarchy: tuple[str, ...] = ()
    rating: int | None = None  # xmp:Rating, -1 (rejected) to 5
    label: str | None = None  # xmp:Label as written ("Red", "Green", ...)
    taken_at: str | None = None  # ISO 8601 local time as written, e.g. 2023-06-14T10:22:31 (or a date)
    gps_lat: float | None = None  # decimal degrees, north positive
    gps_lon: float | None = None  # decimal degrees, east positive
    # Issue 28: what EXIF, IPTC-IIM and the wider XMP vocabulary add.
    camera_make: str | None = None  # EXIF Make, else XMP tiff:Make (a Lightroom sidecar of a RAW)
    camera_model: str | None = None  # EXIF Model, else XMP tiff:Model
    lens: str | None = None  # EXIF LensModel, else XMP exifEX:LensModel / aux:Lens
    pick: str | None = None  # "rejected" | "pending" | "accepted" (digiKam:PickLabel)
    # Which kind of source gave taken_at: "xmp" or "iptc" (engine.catalog.dates labels the date)
    taken_from: str | None = None
    # Every language's entry of dc:title / dc:description: ((language, text), ...), x-default first
    titles: tuple[tuple[str, str], ...] = ()
    descriptions: tuple[tuple[str, str], ...] = ()
    # Every field read from every source, in precedence order (MetadataField)
    fields: tuple[MetadataField, ...] = ()
    sources: tuple[str, ...] = ()  # where the values came from: sidecar file names, "embedded"
    problems: tuple[str, ...] = ()  # why a sidecar or field was not read, naming the file (and field)
    # What the values were read from (reader version, the sidecars' names, sizes and mtimes): a
    # re-scan compares it with the files now there to find added, edited or removed sidecars.
    state: str = ""

    def is_empty(self) -> bool:
        return not (self.title or self.description or self.subjects or self.hierarchy or self.label
                    or self.rating is not None or self.taken_at or self.gps_lat is not None)


@dataclass(kw_only=True)
class ImageFields:
    """What the catalog stores about one image file: shared by its rows (ImageRecord) and its
    batch writes (engine.catalog.ImageWrite)."""

    library_id: int
    rel_path: str
    size: int
    mtime_ns: int
    content_hash: str | None
    status: str = STATUS_OK
    reason: str | None = None
    width: int | None = None
    height: int | None = None
    exif_date: str | None = None
    camera_make: str | None = None
    camera_model: str | None = None
    orientation: int | None = None


@dataclass(kw_only=True)
class ImageRecord(ImageFields):
    id: int


@dataclass
class SearchHit:
    rank: int
    image_id: int
    path: str  # absolute path on this machine
    score: float
    library_id: int
    rel_path: str
    exif_date: str | None = None
    camera: str | None = None  # as photo tools show it (engine.catalog.camera.camera_display)
    # The date shown, sorted and filtered by: the EXIF date, else the XMP or IPTC date, else the
    # file's mtime; date_source says which ("exif" | "xmp" | "iptc" | "file time",
    # engine.catalog.dates). A date known only in part stays partial ("2023-06"); it is sorted and
    # filtered as the start of its period.
    date: str | None = None
    date_source: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("extra")
        d.update(self.extra)
        return d


@dataclass
class SearchResult:
    hits: list[SearchHit]
    tokens_used: int | None = None
    tokens_total: int | None = None
    truncated: bool = False
    model_id: str = ""
    timings_ms: dict[str, float] = field(default_factory=dict)
    #: How many of the top hits were re-scored by re-ranking (0: ANN order only).
    reranked: int = 0
    #: Things the user should know about this search (e.g. why re-ranking was not done).
    notes: list[str] = field(default_factory=list)
    #: Reasons to doubt the results themselves (e.g. the query is not in a language the model
    #: was trained on, engine.text.language), shown before the results.
    warnings: list[str] = field(default_factory=list)
    #: The order of `hits` (engine.options.RESULT_ORDER: relevance, date-new, date-old).
    order: str = "relevance"
    #: Where a relevance cut-off ended the results (engine.search.ordering.Cutoff), None without one.
    cutoff: Any = None
