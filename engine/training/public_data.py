"""`longlens train convert`: the public long-caption sets as training JSONL (docs/public-data.md).

The sets' layouts are read by engine.evaluation.public_sets, the same readers `longlens eval` uses.
Each usable record becomes one line of the training format (docs/training.md, "Data format"):

| set        | paragraph                      | original_caption                  | positives / negatives        |
|------------|--------------------------------|-----------------------------------|------------------------------|
| DOCCI      | description                    | the description's first sentence  | none                         |
| ShareGPT4V | the first gpt turn             | its first sentence                | none                         |
| DCI        | short_caption + extra_caption  | short_caption                     | summaries.base / negatives.base (first 5) |

`meta` keeps the set, its id for the record, the split and the licence. No paragraph_score is
written: the descriptions are the sets' own, not generated and scored. Image paths are written
relative to the output file's folder.

A record that cannot be used (a bad field, a missing image, a text over engine.limits) is skipped
and reported as `FILE:LINE: field: reason`; `strict` stops at the first one instead and writes
nothing. Every written line is checked with the training reader's own line check, so a converted
file passes `longlens train validate`. The output is written under a temporary name and renamed
at the end: a cancelled or failed conversion leaves no partial file (and an older file intact).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine import limits
from engine.errors import LonglensError
from engine.evaluation.public_sets import SourceProblem, SourceRecord, SourceStream
from engine.jobs import CancelToken, Progress, RateMeter

SOURCES = ("docci", "sharegpt4v", "dci")
DEFAULT_SPLITS: dict[str, str | None] = {"docci": "train", "sharegpt4v": None, "dci": "train"}
# As the publishers state them (docs/public-data.md has the sources): written into every line's meta.
LICENCES = {
    "docci": "CC-BY-4.0",
    "sharegpt4v": "CC-BY-NC-4.0; use must also follow OpenAI's terms of use",
    "dci": "CC-BY-NC-4.0 (annotations); images under the SA-1B licence",
}
IMAGE_HINTS = {
    "docci": "docci_images.tar.gz extracts to images/ next to docci_descriptions.jsonlines",
    "sharegpt4v": "image paths are relative to the folder or its data/ subfolder (data/coco/train2017/...)",
    "dci": "DCI's photos/ come from SA-1B's sa_000138.tar, downloaded separately",
}
# Where each training field comes from, to name the source's field in a problem.
SOURCE_FIELDS = {
    "docci": {"paragraph": "description", "original_caption": "description (first sentence)", "image": "image_file"},
    "sharegpt4v": {"paragraph": "conversations (gpt turn)", "original_caption": "conversations (first sentence)"},
    "dci": {"paragraph": "short_caption + extra_caption", "original_caption": "short_caption",
            "positives": "summaries.base", "negatives": "negatives.base"},
}
KEPT_PROBLEMS = 1000  # problems listed in the summary; all are counted
PROGRESS_EVERY = 256  # records between progress reports


class ConvertError(LonglensError):
    """A conversion cannot go on (strict and a bad record, nothing usable, an unknown set or split)."""


@dataclass
class ConvertRequest:
    source: str  # one of SOURCES
    root: Path  # the folder the set was downloaded into
    out: Path  # the training JSONL to write
    split: str | None = None  # None: DEFAULT_SPLITS[source]
    limit: int | None = None  # at most this many lines written
    skip: int = 0  # records of the source (in file order, bad ones included) left out before converting
    strict: bool = False  # stop at the first bad record, write nothing
    annotations: Path | None = None  # the annotation file, when not the layout's default
    images: Path | None = None  # the image folder, when not the layout's default
    library_roots: tuple[Path, ...] = ()  # indexed libraries: the output may lie in none of them


def open_source(req: ConvertRequest) -> SourceStream:
    """The set's records through its reader (file-level problems raise ConvertError)."""
    from engine.evaluation.public_sets import read_dci, read_docci, read_sharegpt4v

    if req.source not in SOURCES:
        raise ConvertError(f"unknown data set {req.source!r}; one of {', '.join(SOURCES)}", settings=("source",))
    split = req.split if req.split is not None else DEFAULT_SPLITS[req.source]
    if req.source == "docci":
        return read_docci(req.root, split, annotations=req.annotations, images=req.images, error=ConvertError)
    if req.source == "sharegpt4v":
        if req.split is not None:
            raise ConvertError("ShareGPT4V has no splits: choose records by how many to skip and convert "
                               "(the first 1,000 are Long-CLIP's ShareGPT4V-1k test set)", settings=("split",))
        return read_sharegpt4v(req.root, annotations=req.annotations, images=req.images, error=ConvertError)
    if req.annotations is not None:
        raise ConvertError("DCI has one record file per image under complete/: give its folder, not an "
                           "annotation file", settings=("annotations",))
    return read_dci(req.root, split or "train", images=req.images, error=ConvertError)


def first_sentence(text: str) -> str:
    """The first sentence of `text` by the one sentence splitter (the whole text if it has one)."""
    from engine.text.sentences import split_sentences

    spans = split_sentences(text, max_chars=None)
    return text[spans[0][0]:spans[0][1]] if spans else text


def training_row(rec: SourceRecord, source: str, out_dir: Path) -> dict[str, Any]:
    """The training-format line of one record; its image relative to `out_dir` where possible."""
    from engine.training.data import EXPECTED_COUNT

    try:
        ref = Path(os.path.relpath(rec.image.resolve(), out_dir.resolve())).as_posix()
    except ValueError:  # another drive (Windows): no relative path exists
        ref = str(rec.image.resolve())
    meta: dict[str, Any] = {"source": source, "id": rec.key, "licence": LICENCES[source]}
    if rec.split is not None:
        meta["split"] = rec.split
    if rec.index is not None:
        meta["index"] = rec.index
    row: dict[str, Any] = {"image": ref, "original_caption": rec.short_caption or first_sentence(rec.description),
                           "paragraph": rec.description, "meta": meta}
    if rec.positives:
        row["positives"] = list(rec.positives[:EXPECTED_COUNT])
    if rec.negatives:
        row["negatives"] = list(rec.negatives[:EXPECTED_COUNT])
    return row


def _line_problem(rec: SourceRecord, source: str, field: str, reason: str) -> SourceProblem:
    named = SOURCE_FIELDS[source].get(field)
    return SourceProblem(rec.file, rec.line, f"{named} -> {field}" if named else field, reason)


class _Tally:
    """Counts and the first KEPT_PROBLEMS problems; strict turns the first problem into an error."""

    def __init__(self, strict: bool) -> None:
        self.strict = strict
        self.problems: list[str] = []
        self.count = 0
        self.missing_images = 0
        self.first_missing: str | None = None

    def add(self, problem: SourceProblem) -> None:
        self.count += 1
        text = problem.format()
        if self.strict:
            raise ConvertError(f"{text} (stopped at the first bad record; nothing was written)")
        if len(self.problems) < KEPT_PROBLEMS:
            self.problems.append(text)


def convert_job(req: ConvertRequest, cancel: CancelToken | None = None) -> Iterator[Progress]:
    """Read the set, write the training JSONL. Yields Progress (stage "read": bytes of the
    annotation file, or "convert": records of a DCI split); the final report (stage "done")
    carries the summary in extra. A cancel stops between records and writes nothing."""
    from engine.fileutil import AtomicTextWriter
    from engine.outputs import check_output
    from engine.training.data import check_line

    cancel = cancel or CancelToken()
    stream = open_source(req)
    out = Path(req.out)
    check_output(out, what="training data file", kind="train-convert", inputs=stream.inputs,
                 library_roots=req.library_roots)
    stage = "read" if stream.unit == "B" else "convert"
    meter = RateMeter(stream.total)
    tally = _Tally(req.strict)
    seen_images: set[str] = set()
    counts = {"records": 0, "skipped_first": 0, "written": 0, "duplicate_images": 0}
    left_out_at_limit = False

    def report(message: str = "") -> Progress:
        return meter.progress(stage, stream.done, message, written=counts["written"], skipped=tally.count)

    yield report(f"reading {stream.annotations}")
    with AtomicTextWriter(out) as writer:
        for n, item in enumerate(stream, start=1):
            if cancel.cancelled:
                break
            if n % PROGRESS_EVERY == 0:
                yield report()
            if counts["skipped_first"] < req.skip:
                counts["skipped_first"] += 1
                continue
            if req.limit is not None and counts["written"] >= req.limit:
                break
            if counts["written"] >= limits.MAX_FILE_LINES:
                tally.add(SourceProblem(item.file, item.line, "record",
                                        f"more than {limits.MAX_FILE_LINES:,} lines, the most a training file may "
                                        "hold: this record and the rest are left out (convert fewer, or skip "
                                        "the ones already converted)"))
                left_out_at_limit = True
                break
            counts["records"] += 1
            if isinstance(item, SourceProblem):
                tally.add(item)
                continue
            if not item.image.is_file():
                tally.missing_images += 1
                tally.first_missing = tally.first_missing or str(item.image)
                tally.add(SourceProblem(item.file, item.line, "image", f"file not found: {item.image}"))
                continue
            row = training_row(item, req.source, out.parent)
            text = json.dumps(row, ensure_ascii=False, sort_keys=True)
            # The training reader's own check: what is written here, `train validate` accepts.
            record, problems = check_line(text, counts["written"] + 1, out.parent, check_images=False)
            if record is None:
                bad = next(p for p in problems if p.severity == "error")
                tally.add(_line_problem(item, req.source, bad.field, bad.reason))
                continue
            key = str(record.image)
            if key in seen_images:
                counts["duplicate_images"] += 1  # kept: `train validate` warns about them
            seen_images.add(key)
            writer.write(text + "\n")
            counts["written"] += 1
        cancelled = cancel.cancelled
        yield report()
        if not cancelled:
            if counts["written"] == 0:
                hint = ""
                if tally.missing_images:
                    hint = (f"; {tally.missing_images} images are missing, e.g. {tally.first_missing} "
                            f"({IMAGE_HINTS[req.source]})")
                first = f"; first problem: {tally.problems[0]}" if tally.problems else ""
                raise ConvertError(f"no usable records in {stream.annotations} (split {stream.split!r}){hint}{first}; "
                                   "nothing was written", settings=("root",))
            writer.commit()
    summary = {
        "source": req.source, "split": stream.split, "root": str(req.root), "annotations": str(stream.annotations),
        "out": str(out), **counts, "skipped": tally.count, "missing_images": tally.missing_images,
        "left_out_at_line_limit": left_out_at_limit, "problems": tally.problems, "licence": LICENCES[req.source],
        "cancelled": cancelled,
    }
    if cancelled:
        message = "cancelled; nothing was written"
    else:
        message = (f"wrote {counts['written']} lines to {out} ({req.source}"
                   + (f" {stream.split}" if stream.split else "") + f"): {counts['records']} records read, "
                   f"{tally.count} skipped ({tally.missing_images} missing images)")
    yield Progress("done", stream.done, stream.total, message, extra=summary)
