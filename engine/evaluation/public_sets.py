"""The published layouts of the public long-caption sets, read in one place for evaluation and training.

DOCCI, ShareGPT4V and DCI each have one reader here. A reader returns a `SourceStream`: the
set's records in file order, each a `SourceRecord` (image, long description, the set's own short
caption and generated texts where it has them) or a `SourceProblem` (file, line, field, reason)
for a record that cannot be used. `longlens eval` (engine.evaluation.loaders) stops at the first
problem, since a benchmark must be complete; `longlens train convert` (engine.training.public_data)
skips bad records and reports them. A file that is unusable as a whole (missing, not the expected
kind of document, broken JSON in a JSON document) raises the caller's error class at once.

Layouts (as published; `root` is the folder the user downloaded into):

* DOCCI (google.github.io/docci): root/docci_descriptions.jsonlines, one JSON object per line
  {"example_id", "split", "image_file", "description"}; splits "train", "test", "qual_dev",
  "qual_test"; images in root/images/<image_file> (docci_images.tar.gz extracts to images/).
* ShareGPT4V (huggingface.co/datasets/Lin-Chen/ShareGPT4V): one JSON file holding a list of
  {"id", "image", "conversations": [{"from": "human", "value"}, {"from": "gpt", "value"}]}; the
  first "gpt" turn is the description. Image paths are relative to root, or to root/data (the
  project's own layout: data/coco/train2017/..., data/sam/images/..., data/llava/...). The list is
  streamed item by item: the 1.2M-entry file is never held in memory whole.
* DCI (github.com/facebookresearch/DCI, dci.tar.gz): a folder densely_captioned_images/ (root may be
  it, its parent, or the parent of data/) holding splits.json ({"train": [...], "valid": [...],
  "test": [...]}, names of per-image JSON files), complete/<name> (the annotation plus LLaMA-2
  "summaries" and "negatives"), annotations/<name> (the annotation alone) and photos/ (the images
  from SA-1B's sa_000138.tar, downloaded separately). A record: {"image", "short_caption",
  "extra_caption", "mask_data", "mask_keys", "summaries": {"base": str | [str], ...},
  "negatives": {"base": {"swaps": [...], "layout": [...], "basic": [...]}, ...}}.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine import limits
from engine.errors import LonglensError
from engine.jsonfile import JsonTooDeepError, loads_bounded

__all__ = [
    "DCI_NEGATIVE_KINDS", "DOCCI_ANNOTATIONS", "PublicDataError", "SourceProblem", "SourceRecord", "SourceStream",
    "dci_folder", "iter_json_list", "read_dci", "read_docci", "read_sharegpt4v", "sharegpt4v_annotation_file",
]

DOCCI_ANNOTATIONS = "docci_descriptions.jsonlines"
# The kinds of LLM negatives DCI generated per caption, in the order they are taken (round robin, so
# five negatives mix the kinds): object/attribute swaps, layout changes, basic edits.
DCI_NEGATIVE_KINDS = ("swaps", "layout", "basic")
# A DCI record is one JSON file holding base64 PNG masks of every annotated region, so it is far
# bigger than its text; no published record comes near this bound, which only keeps memory bounded
# when a wrong folder is given.
MAX_DCI_RECORD_BYTES = 64 * 1024 * 1024
_CHUNK = 1 << 20
_WS = re.compile(r"[ \t\n\r]*")


class PublicDataError(LonglensError):
    """A public data set's file cannot be used at all (missing, unreadable, not the published layout)."""


@dataclass(frozen=True)
class SourceProblem:
    """A record that cannot be used: where it is and what is wrong with which field."""

    file: Path
    line: int | None  # 1-based line where the record starts; None for a record that is a whole file
    field: str  # the offending field ("[3].conversations" in a JSON list), or "line" / "record"
    reason: str

    def format(self) -> str:
        where = f"{self.file}:{self.line}" if self.line is not None else str(self.file)
        return f"{where}: {self.field}: {self.reason}"


@dataclass(frozen=True)
class SourceRecord:
    """One image of a public set with its texts, and where it was read."""

    file: Path
    line: int | None
    key: str  # the set's own id (DOCCI example_id, ShareGPT4V id, DCI file name)
    image: Path  # resolved against the set's image folder
    description: str  # the long human or GPT-4V description
    split: str | None = None
    short_caption: str = ""  # the set's own short caption; "" when it has none (DOCCI, ShareGPT4V)
    positives: tuple[str, ...] = ()  # generated short captions (DCI's LLaMA-2 summaries)
    negatives: tuple[str, ...] = ()  # generated hard negatives (DCI's)
    index: int | None = None  # position in a JSON list

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}" if self.line is not None else str(self.file)


@dataclass
class SourceStream:
    """A set's records in file order (`items`), the files and folders it reads (`inputs`: an
    output may be none of them) and how far the reading has got (`done` of `total` `unit`s:
    bytes of the annotation file, or records of a split)."""

    name: str
    split: str | None
    annotations: Path
    inputs: tuple[Path, ...]
    total: int
    unit: str
    items: Iterator[SourceRecord | SourceProblem] = field(repr=False, default_factory=lambda: iter(()))
    done: int = 0

    def __iter__(self) -> Iterator[SourceRecord | SourceProblem]:
        return self.items


def _str_field(obj: dict, key: str) -> tuple[str, str | None]:
    """(stripped text, None) or ("", reason) for a required string field."""
    value = obj.get(key)
    if value is None:
        return "", "missing"
    if not isinstance(value, str) or not value.strip():
        return "", f"must be a non-empty string, got {json.dumps(value)[:60]}"
    return value.strip(), None


def _file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _open_error(path: Path, exc: OSError, label: str, error: type[LonglensError]) -> LonglensError:
    from engine.text.captions import open_error_message

    return error(open_error_message(path, exc, label))


# -- DOCCI ----------------------------------------------------------------------------------------
def read_docci(root: Path, split: str | None = "train", *, annotations: Path | None = None,
               images: Path | None = None, error: type[LonglensError] = PublicDataError) -> SourceStream:
    """DOCCI's records of `split` (None: every split). Lines that are not JSON objects are problems
    whatever their split; field problems are reported for the lines of `split` only."""
    from engine.text.captions import text_lines

    root = Path(root)
    ann = Path(annotations or root / DOCCI_ANNOTATIONS)
    image_dir = Path(images or root / "images")
    if not ann.exists() and annotations is None:
        raise error(f"{ann} does not exist (is the dataset folder the DOCCI folder?)", settings=("root",))
    stream = SourceStream("docci", split, ann, (ann, image_dir), _file_size(ann), "B")

    def counted(n: bytes) -> None:
        stream.done += len(n)

    def items() -> Iterator[SourceRecord | SourceProblem]:
        for tl in text_lines(ann, label="the DOCCI descriptions", error=error, on_bytes=counted):
            if tl.problem:
                yield SourceProblem(ann, tl.line_no, "line", tl.problem)
                continue
            if not tl.text.strip():
                continue
            try:
                obj = loads_bounded(tl.text, f"line {tl.line_no}")
            except JsonTooDeepError as exc:
                yield SourceProblem(ann, tl.line_no, "line", f"nests deeper than {exc.limit} levels (the limit)")
                continue
            except ValueError as exc:
                yield SourceProblem(ann, tl.line_no, "line", f"not valid JSON ({exc})")
                continue
            if not isinstance(obj, dict):
                yield SourceProblem(ann, tl.line_no, "line", f"expected a JSON object, got {type(obj).__name__}")
                continue
            if split is not None and obj.get("split") != split:
                continue
            fname, bad = _str_field(obj, "image_file")
            if bad:
                yield SourceProblem(ann, tl.line_no, "image_file", bad)
                continue
            desc, bad = _str_field(obj, "description")
            if bad:
                yield SourceProblem(ann, tl.line_no, "description", bad)
                continue
            key = obj.get("example_id") if isinstance(obj.get("example_id"), str) else fname
            yield SourceRecord(ann, tl.line_no, key, image_dir / fname, desc,
                               split=obj.get("split") if isinstance(obj.get("split"), str) else None)

    stream.items = items()
    return stream


# -- a JSON list, streamed ------------------------------------------------------------------------
class _JsonListReader:
    """Items of a file holding one JSON list, decoded from 1 MiB chunks: memory is bounded by the
    largest item (`max_item_chars`), not by the file."""

    def __init__(self, fh: Any, path: Path, error: type[LonglensError], on_bytes: Callable[[int], None] | None,
                 max_item_chars: int) -> None:
        self.fh, self.path, self.error, self.on_bytes = fh, path, error, on_bytes
        self.max_item_chars = max_item_chars
        self.utf8 = codecs.getincrementaldecoder("utf-8")()
        self.buf = ""
        self.pos = 0
        self.line = 1  # line of buf[pos]
        self.eof = False

    def _more(self) -> None:
        chunk = self.fh.read(_CHUNK)
        if self.on_bytes is not None and chunk:
            self.on_bytes(len(chunk))
        try:
            text = self.utf8.decode(chunk, final=not chunk)
        except UnicodeDecodeError as exc:
            raise self.error(f"{self.path}:{self.line}: not UTF-8 text ({exc.reason})") from None
        self.eof = not chunk
        self.buf = self.buf[self.pos:] + text
        self.pos = 0

    def _advance(self, end: int) -> None:
        self.line += self.buf.count("\n", self.pos, end)
        self.pos = end

    def _skip_ws(self) -> str:
        """The next non-blank character ("" at the end of the file)."""
        while True:
            self._advance(_WS.match(self.buf, self.pos).end())
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if self.eof:
                return ""
            self._more()

    def _end(self) -> None:
        self._advance(self.pos + 1)
        if self._skip_ws() != "":
            raise self.error(f"{self.path}:{self.line}: more data after the end of the list")

    def items(self, what: str) -> Iterator[tuple[int, int, Any]]:
        decoder = json.JSONDecoder()
        if self._skip_ws() != "[":
            raise self.error(f"{self.path}:{self.line}: expected a JSON list ({what})")
        self._advance(self.pos + 1)
        if self._skip_ws() == "]":
            return self._end()
        index = 0
        while True:
            if self._skip_ws() == "":
                raise self.error(f"{self.path}:{self.line}: the file ends inside the list (is it cut short?)")
            try:
                value, end = decoder.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as exc:
                if not self.eof and len(self.buf) - self.pos <= self.max_item_chars:
                    self._more()  # the item may simply continue in the next chunk
                    continue
                if not self.eof:
                    raise self.error(f"{self.path}:{self.line}: item [{index}] is longer than "
                                     f"{self.max_item_chars:,} characters") from None
                line = self.line + self.buf.count("\n", self.pos, exc.pos)
                raise self.error(f"{self.path}:{line}: not valid JSON ({exc.msg})") from None
            # A number cut by a chunk boundary ("-3.5" of "-3.5e2") decodes too: accept an item only
            # once the separator after it has been read (or the item is as long as allowed).
            after = _WS.match(self.buf, end).end()
            if (after == len(self.buf) or self.buf[after] not in ",]") and not self.eof \
                    and len(self.buf) - self.pos <= self.max_item_chars:
                self._more()
                continue
            yield index, self.line, value
            self._advance(end)
            index += 1
            sep = self._skip_ws()
            if sep == "]":
                return self._end()
            if sep != ",":
                raise self.error(f"{self.path}:{self.line}: expected ',' or ']' after item [{index - 1}]"
                                 + (" (the file ends inside the list: is it cut short?)" if sep == "" else ""))
            self._advance(self.pos + 1)


def iter_json_list(path: Path, *, what: str, label: str = "", error: type[LonglensError] = PublicDataError,
                   on_bytes: Callable[[int], None] | None = None,
                   max_item_chars: int = limits.MAX_LINE_BYTES) -> Iterator[tuple[int, int, Any]]:
    """(index, line where the item starts, item) for each item of the JSON list in `path`, read
    through engine.fileutil's safe open. Broken JSON raises `error` naming the line: the rest of a
    JSON document cannot be found again after a syntax error."""
    from engine.fileutil import open_user_file

    path = Path(path)
    try:
        fh = open_user_file(path)
    except OSError as exc:
        raise _open_error(path, exc, label, error) from None
    with fh:
        yield from _JsonListReader(fh, path, error, on_bytes, max_item_chars).items(what)


# -- ShareGPT4V -----------------------------------------------------------------------------------
def sharegpt4v_annotation_file(root: Path, annotations: Path | None = None,
                               error: type[LonglensError] = PublicDataError) -> Path:
    """The given annotation file, else the one *.json in root (the release has several: name one)."""
    if annotations is not None:
        return Path(annotations)
    candidates = sorted(p for p in Path(root).glob("*.json") if p.is_file())
    if len(candidates) != 1:
        found = f": {', '.join(p.name for p in candidates[:5])}" if candidates else ""
        raise error(f"expected exactly one ShareGPT4V .json file in {root}, found {len(candidates)}{found} "
                    "(name the annotation file)", settings=("annotations",))
    return candidates[0]


def _gpt_turn(conv: Any) -> tuple[str, str | None]:
    if not isinstance(conv, list):
        return "", f"must be a list of turns, got {type(conv).__name__}"
    value = next((t.get("value") for t in conv if isinstance(t, dict) and t.get("from") == "gpt"), None)
    if value is None:
        return "", "has no gpt turn"
    if not isinstance(value, str) or not value.strip():
        return "", f"the gpt turn's value must be a non-empty string, got {json.dumps(value)[:60]}"
    return " ".join(value.split()), None


def read_sharegpt4v(root: Path, *, annotations: Path | None = None, images: Path | None = None,
                    error: type[LonglensError] = PublicDataError) -> SourceStream:
    """ShareGPT4V's records in list order; the description (the first gpt turn) with its newlines
    folded into spaces. Images relative to `images`, else root/data when it holds the first
    record's image, else root."""
    root = Path(root)
    ann = sharegpt4v_annotation_file(root, annotations, error)
    stream = SourceStream("sharegpt4v", None, ann, (ann,), _file_size(ann), "B")

    def counted(n: int) -> None:
        stream.done += n

    def items() -> Iterator[SourceRecord | SourceProblem]:
        image_root = Path(images) if images is not None else None
        for k, line, e in iter_json_list(ann, what="ShareGPT4V format", label="the ShareGPT4V annotations",
                                         error=error, on_bytes=counted):
            if not isinstance(e, dict):
                yield SourceProblem(ann, line, f"[{k}]", f"expected an object, got {type(e).__name__}")
                continue
            ref, bad = _str_field(e, "image")
            if bad:
                yield SourceProblem(ann, line, f"[{k}].image", bad)
                continue
            desc, bad = _gpt_turn(e.get("conversations"))
            if bad:
                yield SourceProblem(ann, line, f"[{k}].conversations", bad)
                continue
            if image_root is None:
                image_root = root / "data" if (root / "data" / ref).is_file() else root
            key = e.get("id") if isinstance(e.get("id"), str | int) and not isinstance(e.get("id"), bool) else k
            yield SourceRecord(ann, line, str(key), image_root / ref, desc, index=k)

    stream.items = items()
    return stream


# -- DCI ------------------------------------------------------------------------------------------
def dci_folder(root: Path, error: type[LonglensError] = PublicDataError) -> Path:
    """The densely_captioned_images folder: root itself, root/densely_captioned_images or
    root/data/densely_captioned_images (the DCI repository's default data folder)."""
    root = Path(root)
    for cand in (root, root / "densely_captioned_images", root / "data" / "densely_captioned_images"):
        if (cand / "splits.json").is_file():
            return cand
    raise error(f"no splits.json in {root} or {root / 'densely_captioned_images'} (is the folder the one "
                "dci.tar.gz was extracted into?)", settings=("root",))


def _read_json_file(path: Path, label: str, error: type[LonglensError]) -> Any:
    from engine.fileutil import FileTooLargeError, read_user_text
    from engine.limits import MAX_DATASET_JSON_BYTES

    try:
        text = read_user_text(path, max_bytes=MAX_DATASET_JSON_BYTES)
    except FileTooLargeError as exc:
        raise error(str(exc)) from None
    except OSError as exc:
        raise _open_error(path, exc, label, error) from None
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    try:
        return loads_bounded(text, path)
    except JsonTooDeepError as exc:
        raise error(str(exc)) from None
    except json.JSONDecodeError as exc:
        raise error(f"{path}:{exc.lineno}:{exc.colno}: not valid JSON ({exc.msg})") from None


def _text_list(value: Any, where: str) -> tuple[tuple[str, ...], str | None]:
    """A string or a list of strings as a tuple of stripped texts, or the reason it is neither."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        return (), f"{where} must be a string or a list of strings, got {json.dumps(value)[:60]}"
    return tuple(" ".join(t.split()) for t in value if t.strip()), None


def _dci_negatives(negatives: Any) -> tuple[tuple[str, ...], str | None]:
    """The image-level negatives ("base"), round robin over DCI_NEGATIVE_KINDS then any other kind."""
    if negatives is None:
        return (), None
    if not isinstance(negatives, dict):
        return (), f"must be an object, got {type(negatives).__name__}"
    base = negatives.get("base")
    if base is None:
        return (), None
    if not isinstance(base, dict):
        return (), f"base must be an object of negative kinds, got {type(base).__name__}"
    kinds = [k for k in DCI_NEGATIVE_KINDS if k in base] + sorted(k for k in base if k not in DCI_NEGATIVE_KINDS)
    lists = []
    for kind in kinds:
        texts, bad = _text_list(base[kind], f"base.{kind}")
        if bad:
            return (), bad
        lists.append(texts)
    out: list[str] = []
    for i in range(max((len(t) for t in lists), default=0)):
        out += [t[i] for t in lists if i < len(t) and t[i] not in out]
    return tuple(out), None


def _load_dci_json(path: Path) -> tuple[Any, SourceProblem | None]:
    """A DCI record file's JSON, or the problem that keeps it from being read (one bad file is
    one skipped record, not a failed conversion)."""
    from engine.fileutil import FileTooLargeError, NotARegularFileError, read_user_text

    try:
        text = read_user_text(path, max_bytes=MAX_DCI_RECORD_BYTES)
    except FileTooLargeError as exc:
        return None, SourceProblem(path, None, "record", f"too large ({exc.size:,} bytes; the limit is {exc.limit:,})")
    except NotARegularFileError as exc:
        return None, SourceProblem(path, None, "record", f"is {exc.kind}, not a regular file")
    except OSError as exc:
        return None, SourceProblem(path, None, "record", f"cannot be read ({exc.strerror or exc})")
    except UnicodeDecodeError as exc:
        return None, SourceProblem(path, None, "record", f"not UTF-8 text ({exc.reason} at byte {exc.start})")
    try:
        return loads_bounded(text, path), None
    except JsonTooDeepError as exc:
        return None, SourceProblem(path, None, "record", f"nests deeper than {exc.limit} levels (the limit)")
    except json.JSONDecodeError as exc:
        return None, SourceProblem(path, exc.lineno, "record", f"not valid JSON ({exc.msg})")


def _dci_record(path: Path, key: str, split: str, photos: Path) -> SourceRecord | SourceProblem:
    obj, problem = _load_dci_json(path)
    if problem is not None:
        return problem
    if not isinstance(obj, dict):
        return SourceProblem(path, None, "record", f"expected a JSON object, got {type(obj).__name__}")
    texts: dict[str, str] = {}
    for name in ("image", "short_caption", "extra_caption"):
        texts[name], bad = _str_field(obj, name)
        if bad:
            return SourceProblem(path, None, name, bad)
    positives: tuple[str, ...] = ()
    summaries = obj.get("summaries")
    if summaries is not None:
        if not isinstance(summaries, dict):
            return SourceProblem(path, None, "summaries", f"must be an object, got {type(summaries).__name__}")
        if summaries.get("base") is not None:
            positives, bad = _text_list(summaries["base"], "base")
            if bad:
                return SourceProblem(path, None, "summaries", bad)
    negatives, bad = _dci_negatives(obj.get("negatives"))
    if bad:
        return SourceProblem(path, None, "negatives", bad)
    # The full description as DCI's own loaders build it (short caption, then the extra caption);
    # the per-region mask captions are left out: they would run far past any text tower's budget.
    description = " ".join(f"{texts['short_caption']} {texts['extra_caption']}".split())
    return SourceRecord(path, None, key, photos / texts["image"], description, split=split,
                        short_caption=" ".join(texts["short_caption"].split()), positives=positives,
                        negatives=negatives)


def read_dci(root: Path, split: str = "train", *, images: Path | None = None,
             error: type[LonglensError] = PublicDataError) -> SourceStream:
    """DCI's records of `split` in splits.json order, each from complete/<name> (with summaries and
    negatives), else annotations/<name> (without them)."""
    folder = dci_folder(root, error)
    splits_file = folder / "splits.json"
    splits = _read_json_file(splits_file, "the DCI splits", error)
    if not isinstance(splits, dict) or not all(isinstance(v, list) for v in splits.values()):
        raise error(f"{splits_file}: expected an object of split names to lists of record files")
    if split not in splits:
        raise error(f"{splits_file} has no split {split!r}; it has {', '.join(map(repr, splits))}",
                    settings=("split",))
    names = splits[split]
    photos = Path(images or folder / "photos")
    complete, plain = folder / "complete", folder / "annotations"
    stream = SourceStream("dci", split, splits_file, (splits_file, complete, plain, photos), len(names), "record")

    def items() -> Iterator[SourceRecord | SourceProblem]:
        for k, name in enumerate(names):
            stream.done = k + 1
            if not isinstance(name, str) or not name.strip() or Path(name).name != name:
                yield SourceProblem(splits_file, None, f"{split}[{k}]",
                                    f"must be the name of a record file, got {json.dumps(name)[:60]}")
                continue
            path = complete / name if (complete / name).is_file() else plain / name
            if not path.is_file():
                yield SourceProblem(splits_file, None, f"{split}[{k}]", f"{name} is in neither {complete} nor {plain}")
                continue
            yield _dci_record(path, name, split, photos)

    stream.items = items()
    return stream
