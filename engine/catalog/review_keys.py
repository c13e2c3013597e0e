"""What a review verdict is keyed by: the image's content and the caption's text.

These strings are stored in the catalog (review_items, verdicts) and written by the v3
migration, so their format must never change.

* image key: "sha256:<hex>" of the image file's bytes, so a verdict follows the picture, not
  its name or its line in a caption file. When the file cannot be read (permission denied,
  gone between the check and the hash) there is no content to key by; the key is then
  "path:<absolute path>", the best identity left. It is sound because it cannot match the
  content key of a different picture: once the file is readable again its key becomes the
  content hash and the item shows as new (its verdicts under the path key stay in the
  catalog), never as another picture's verdicts.
* caption hash: SHA-256 of the caption's UTF-8 text exactly as reviewed (trimmed), so any
  edit of the caption, even one character, is a different caption with no verdicts yet.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from engine.fileutil import sha256_file

IMAGE_CONTENT_PREFIX = "sha256:"
IMAGE_PATH_PREFIX = "path:"


def caption_hash(caption: str) -> str:
    return hashlib.sha256(caption.encode("utf-8", "surrogatepass")).hexdigest()


def image_key(path: Path | str) -> str:
    """The content key of the image at `path`, or its path key when it cannot be read."""
    try:
        return IMAGE_CONTENT_PREFIX + sha256_file(Path(path))
    except (OSError, ValueError):
        return IMAGE_PATH_PREFIX + str(path)
