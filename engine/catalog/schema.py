"""Catalog tables (SQLAlchemy Core). The catalog holds every vector; ANN indexes derive from it."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    UniqueConstraint,
)

metadata = MetaData()

meta = Table(
    "meta",
    metadata,
    Column("key", String, primary_key=True),
    Column("value", Text, nullable=False),
)

libraries = Table(
    "libraries",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("root", Text, nullable=False, unique=True),
    Column("status", String, nullable=False, default="online"),
    Column("added_at", Float, nullable=False),
    Column("last_scan_at", Float),
)

images = Table(
    "images",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("library_id", Integer, ForeignKey("libraries.id", ondelete="CASCADE"), nullable=False),
    # Relative to the library root, '/'-separated; see catalog.paths for non-UTF-8 names.
    Column("rel_path", Text, nullable=False),
    Column("size", BigInteger, nullable=False),
    Column("mtime_ns", BigInteger, nullable=False),
    Column("content_hash", String),
    Column("width", Integer),
    Column("height", Integer),
    Column("exif_date", String),
    Column("camera_make", String),
    Column("camera_model", String),
    Column("orientation", Integer),
    Column("status", String, nullable=False),
    Column("reason", Text),
    Column("added_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
    UniqueConstraint("library_id", "rel_path", name="uq_images_library_path"),
)
Index("ix_images_hash", images.c.library_id, images.c.content_hash)
Index("ix_images_status", images.c.library_id, images.c.status)

embeddings = Table(
    "embeddings",
    metadata,
    Column("image_id", Integer, ForeignKey("images.id", ondelete="CASCADE"), nullable=False),
    Column("model_id", String, nullable=False),
    Column("dims", Integer, nullable=False),
    Column("vector", LargeBinary, nullable=False),  # float32 little-endian, L2-normalised
    Column("created_at", Float, nullable=False),
    PrimaryKeyConstraint("image_id", "model_id", name="pk_embeddings"),
)
Index("ix_embeddings_model", embeddings.c.model_id)

# --- version 2: review of captions by annotators; version 3: verdicts keyed by content -----
# The migration steps in db.py create these with frozen SQL; keep both in step (a test checks).

review_sessions = Table(
    "review_sessions",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("caption_file", Text, nullable=False),  # absolute path of the JSONL/CSV file
    # SHA-256 of its bytes: a session is one version of the file (its position, its item list);
    # the verdicts are not the session's but the items' (see verdicts).
    Column("file_hash", String, nullable=False),
    Column("position", Integer, nullable=False),  # index of the item the annotator was on
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
    UniqueConstraint("caption_file", "file_hash", name="uq_review_sessions_file"),
)

review_items = Table(
    "review_items",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("session_id", Integer, ForeignKey("review_sessions.id", ondelete="CASCADE"), nullable=False),
    Column("line_no", Integer, nullable=False),  # 1-based line of the caption file
    Column("image_path", Text, nullable=False),
    Column("caption", Text, nullable=False),
    # What the verdicts are keyed by (catalog.review_keys): the image's content, the caption's text.
    Column("image_key", Text, nullable=False),
    Column("caption_hash", String, nullable=False),
    # Against the previous version of the same caption file: new | changed | kept; NULL for the
    # first version (nothing to compare with) and for items made before schema 3.
    Column("change", String),
    # The image file's size and mtime when image_key was computed: an unchanged file reuses the
    # key instead of being hashed again at every open.
    Column("image_size", BigInteger),
    Column("image_mtime_ns", BigInteger),
    UniqueConstraint("session_id", "line_no", name="uq_review_items_line"),
)
Index("ix_review_items_image", review_items.c.image_path)

verdicts = Table(
    "verdicts",
    metadata,
    Column("id", Integer, primary_key=True),
    # Keyed by (image content, caption text, sentence index), not by a session's item: every
    # unchanged (image, caption) keeps its verdicts whatever else changes in the caption file.
    Column("image_key", Text, nullable=False),
    Column("caption_hash", String, nullable=False),
    Column("sentence_index", Integer),  # NULL: the verdict on the whole item
    Column("verdict", String),  # faithful | unfaithful | unsure; NULL while only a note is kept
    Column("note", Text, nullable=False),
    Column("updated_at", Float, nullable=False),
)

# --- version 5: what XMP (embedded packets, sidecar files) says about each picture --------------
# Filled by indexing (engine.metadata reads it); a picture with no row has not been read yet.

image_metadata = Table(
    "image_metadata",
    metadata,
    Column("image_id", Integer, ForeignKey("images.id", ondelete="CASCADE"), primary_key=True),
    # engine.metadata.sidecar_state: the reader version and the sidecars' names, sizes and mtimes.
    Column("state", Text, nullable=False),
    Column("title", Text),
    Column("description", Text),
    Column("rating", Integer),  # -1 (rejected) to 5; NULL: none written (counts as 0 in filters)
    Column("label", Text),
    Column("label_key", Text),  # the label casefolded, for filters
    Column("taken_at", String),
    Column("gps_lat", Float),
    Column("gps_lon", Float),
    Column("sources", Text, nullable=False),  # JSON list: sidecar file names, "embedded"
    Column("problems", Text, nullable=False),  # JSON list of reasons, each naming its file
    Column("read_at", Float, nullable=False),
    # version 6 (issue 28): EXIF, IPTC-IIM and more of XMP
    Column("camera_make", Text),  # EXIF Make, else XMP tiff:Make (a Lightroom sidecar of a RAW)
    Column("camera_model", Text),
    Column("lens", Text),
    Column("pick", String),  # rejected | pending | accepted (digiKam:PickLabel)
    Column("taken_from", String),  # the kind of source of taken_at: xmp | iptc (engine.catalog.dates)
    Column("titles", Text, nullable=False, server_default="[]"),  # JSON [[language, text], ...]
    Column("descriptions", Text, nullable=False, server_default="[]"),
    Column("fields", Text, nullable=False, server_default="[]"),  # JSON [{name, value, source, used, note}]
)
Index("ix_image_metadata_gps", image_metadata.c.gps_lat, image_metadata.c.gps_lon)

image_keywords = Table(
    "image_keywords",
    metadata,
    Column("image_id", Integer, ForeignKey("images.id", ondelete="CASCADE"), nullable=False),
    Column("kind", String, nullable=False),  # subject (flat, dc:subject) | path (levels joined by '|')
    Column("keyword", Text, nullable=False),  # as written
    Column("keyword_key", Text, nullable=False),  # casefolded, for filters
    PrimaryKeyConstraint("image_id", "kind", "keyword", name="pk_image_keywords"),
)
Index("ix_image_keywords_key", image_keywords.c.keyword_key)
