"""What the pipeline captions: images from a folder or a list file, and their data URLs.

A list file is one of
  * JSON lines: {"image": PATH, "caption": TEXT} ("original_caption" is accepted too; the
    caption is optional),
  * CSV / TSV with a header that has an `image` column and optionally a `caption` column,
  * plain text (.txt or any other name): one image path per line, '#' starts a comment.
Relative paths are resolved against the list file's folder. Every bad line is reported with its
line number before any request is sent, so a typo does not cost a half-finished run.
"""

from __future__ import annotations

import base64
import csv
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from engine import limits
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
    from engine.fileutil import NotARegularFileError

    path = Path(path).expanduser()
    if not path.exists():
        raise InputError(f"the image list {path} does not exist", settings=("list",))
    unread: list[str] = []

    def text_lines(split_cr: bool = False) -> Iterator[str]:
        # Bounded reads (engine.limits): an over-long line is reported, never held whole; it
        # stands in as an empty line so that the numbering stays the file's.
        try:
            for line in limits.iter_text_lines(path, split_cr=split_cr):
                if line.problem is not None:
                    unread.append(f"{path}:{line.line_no}: line: {line.problem}")
                yield line.text
        except NotARegularFileError as exc:
            raise InputError(f"the image list: {exc}", settings=("list",)) from None
        except OSError as exc:
            raise InputError(f"cannot read the image list {path}: {exc.strerror or exc}", settings=("list",)) from None

    base = path.resolve().parent
    items: list[ImageItem] = []
    problems: list[str] = []
    suffix = path.suffix.lower()

    def add(line_no: int, ref: object, caption: object) -> None:
        if not isinstance(ref, str) or not ref.strip():
            problems.append(f"{path}:{line_no}: image: missing or not a path")
            return
        if caption is not None and not isinstance(caption, str):
            problems.append(f"{path}:{line_no}: caption: must be text, got {type(caption).__name__}")
            return
        too_big = limits.caption_problem(caption.strip()) if caption else None
        if too_big is not None:
            problems.append(f"{path}:{line_no}: caption: {too_big}")
            return
        p = _resolve(ref, base)
        if not p.is_file():
            problems.append(f"{path}:{line_no}: image: file not found: {p}")
            return
        items.append(ImageItem(p, caption.strip() if caption and caption.strip() else None, f"{path}:{line_no}"))

    if suffix in (".jsonl", ".jsonlines", ".ndjson"):
        for n, line in enumerate(text_lines(), start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError as exc:
                problems.append(f"{path}:{n}: line: not valid JSON ({exc})")
                continue
            if not isinstance(obj, dict):
                problems.append(f"{path}:{n}: line: expected a JSON object with an 'image' field")
                continue
            add(n, obj.get("image"), obj.get("caption", obj.get("original_caption")))
    elif suffix in (".csv", ".tsv"):
        reader = csv.reader(text_lines(split_cr=True), delimiter="\t" if suffix == ".tsv" else ",")
        try:
            header = [h.strip().lower() for h in next(reader)]
        except StopIteration:
            raise InputError(f"the image list {path} is empty", settings=("list",)) from None
        if "image" not in header:
            raise InputError(f"{path}:1: the header has no 'image' column (found: {', '.join(header) or 'nothing'})")
        ci = header.index("image")
        cc = header.index("caption") if "caption" in header else None
        for row in reader:
            n = reader.line_num
            if not row or all(not c.strip() for c in row):
                continue
            if len(row) <= max(ci, cc or 0):
                problems.append(f"{path}:{n}: line: expected {len(header)} columns, found {len(row)}")
                continue
            add(n, row[ci], row[cc] if cc is not None else None)
    else:
        for n, line in enumerate(text_lines(), start=1):
            if line.strip() and not line.lstrip().startswith("#"):
                add(n, line.strip(), None)
    # Every message starts "PATH:LINE:"; the unreadable lines were found while reading, in order.
    problems = sorted(unread + problems, key=lambda p: int(p.removeprefix(f"{path}:").split(":", 1)[0]))
    if problems:
        more = f"\n... and {len(problems) - max_problems} more" if len(problems) > max_problems else ""
        raise InputError(f"the image list {path} has {len(problems)} bad line(s):\n" + "\n".join(problems[:max_problems]) + more)
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
