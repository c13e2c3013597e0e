"""What the pipeline captions: images from a folder or a list file, and their data URLs.

A list file is one of
  * JSON lines: {"image": PATH, "caption": TEXT} (every key engine.text.captions accepts,
    "original_caption" among them; the caption is optional),
  * CSV / TSV with a header that has an `image` column and optionally a `caption` column (or
    no header: image[, caption] columns),
  * plain text (.txt or any other name): one image path per line, '#' starts a comment.
Relative paths are resolved against the list file's folder. Every bad line is reported with its
line number before any request is sent, so a typo does not cost a half-finished run.
"""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass
from pathlib import Path

from engine.errors import DecodeError, LonglensError
from engine.indexing.decode import SUPPORTED_EXTENSIONS, decode_image

DEFAULT_MAX_SIDE = 768  # long side sent to the model: enough detail for captions, small requests


class InputError(LonglensError):
    """The image folder or list file cannot be used."""


@dataclass(frozen=True)
class ImageItem:
    path: Path  # absolute, resolved
    caption: str | None = None  # the original caption, when the source has one
    where: str = ""  # "LIST:LINE" for messages


def images_in_folder(folder: Path | str) -> list[ImageItem]:
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise InputError(f"the image folder {folder} is not a folder", settings=("images",))
    found = sorted(p.resolve() for p in folder.rglob("*")
                   if p.suffix.lower() in SUPPORTED_EXTENSIONS and p.is_file() and not p.name.startswith("."))
    if not found:
        raise InputError(f"the image folder {folder} holds no image files (looked for "
                         f"{', '.join(sorted(SUPPORTED_EXTENSIONS))})", settings=("images",))
    return [ImageItem(p) for p in found]


def _resolve(ref: str, base: Path) -> Path:
    p = Path(ref.strip()).expanduser()
    return (p if p.is_absolute() else base / p).resolve()


def read_image_list(path: Path | str, *, max_problems: int = 20) -> list[ImageItem]:
    """The images a list file names (engine.text.captions reads it: JSONL, CSV/TSV, else a
    plain list); every bad line is reported as FILE:LINE: FIELD: REASON."""
    from engine.text.captions import CSV_SUFFIXES, JSONL_SUFFIXES, RowProblem, read_captions

    path = Path(path).expanduser()
    if not path.exists():
        raise InputError(f"the image list {path} does not exist", settings=("list",))
    suffix = path.suffix.lower()
    # A .txt (or any other name) is a plain list, whatever its first line holds.
    fmt = "jsonl" if suffix in JSONL_SUFFIXES else suffix.lstrip(".") if suffix in CSV_SUFFIXES else "lines"
    items: list[ImageItem] = []
    problems: list[str] = []
    for row in read_captions(path, fmt, caption_required=False, label="the image list", error=InputError):
        if isinstance(row, RowProblem):
            problems.append(row.format(path))
        else:
            items.append(ImageItem(row.image.resolve(), row.caption, f"{path}:{row.line_no}"))
    if problems:
        more = f"\n... and {len(problems) - max_problems} more" if len(problems) > max_problems else ""
        raise InputError(f"the image list {path} has {len(problems)} bad line(s):\n" + "\n".join(problems[:max_problems])
                         + more, settings=("list",))
    if not items:
        raise InputError(f"the image list {path} names no images", settings=("list",))
    return items


def dedupe(items: list[ImageItem]) -> list[ImageItem]:
    """First occurrence of each image wins (a list naming an image twice would write it twice)."""
    seen: set[Path] = set()
    out = []
    for it in items:
        if it.path not in seen:
            seen.add(it.path)
            out.append(it)
    return out


def image_data_url(path: Path, max_side: int = DEFAULT_MAX_SIDE, quality: int = 90) -> str:
    """The upright image, its long side at most max_side, as a JPEG data URL."""
    try:
        im, _ = decode_image(path, target_size=max(1, max_side // 2))
    except DecodeError as exc:
        raise InputError(f"{path}: cannot read the image ({exc.reason})") from None
    if max(im.size) > max_side:
        im.thumbnail((max_side, max_side))
    buf = io.BytesIO()
    im.convert("RGB").save(buf, format="JPEG", quality=quality)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode("ascii")
