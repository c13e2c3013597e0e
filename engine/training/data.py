"""The training data format (one JSON object per line) and its validator.

Schema of a line (docs/training.md, "Data format"):

    {"image": "images/0001.jpg",          # path relative to the JSONL's folder, or absolute
     "original_caption": "a dog on a beach",
     "positives": [5 generated captions],
     "negatives": [5 hard negatives, each wrong in one detail],
     "paragraph": "a 3-6 sentence description",
     "paragraph_score": 8.5,              # faithfulness, 0-10
     "meta": {...}}                       # optional, free-form, ignored

Every problem is reported as (line number, field, reason). An *error* skips the line (the
rest of the file still loads); a *warning* keeps it. Which problems are errors depends on the
configuration: a line without a paragraph is fine for C1 but unusable for C5. `strict=True`
turns any error into an exception, so nothing is skipped silently in a pipeline.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from engine import limits
from engine.errors import LonglensError
from engine.jsonfile import JsonTooDeepError, loads_bounded

if TYPE_CHECKING:
    from engine.training.configs import TrainConfig
    from engine.training.trainer import Example

EXPECTED_COUNT = 5  # generated positives and hard negatives per image (research brief §1)
SCORE_RANGE = (0.0, 10.0)
TEXT_LIST_FIELDS = ("positives", "negatives")
Severity = Literal["error", "warning"]


class TrainingDataError(LonglensError):
    """A training data file cannot be used (unreadable, or --strict and some line is bad)."""


@dataclass(frozen=True)
class Problem:
    line: int  # 1-based line number in the JSONL file
    field: str  # the offending field, or "line" for the line as a whole
    reason: str
    severity: Severity = "error"

    def format(self, path: Path | str | None = None) -> str:
        where = f"{path}:{self.line}" if path is not None else f"line {self.line}"
        return f"{where}: {self.severity}: {self.field}: {self.reason}"


@dataclass(frozen=True)
class TrainingRecord:
    """One valid line: an image and its texts (lists may be empty when no config needs them)."""

    line: int
    image: Path  # resolved against the JSONL's folder
    image_ref: str  # as written in the file
    original: str
    positives: tuple[str, ...] = ()
    negatives: tuple[str, ...] = ()
    paragraph: str = ""
    paragraph_score: float | None = None

    def to_example(self) -> Example:
        from engine.training.trainer import Example

        return Example(key=self.image_ref, original=self.original, positives=list(self.positives),
                       negatives=list(self.negatives), paragraph=self.paragraph)


@dataclass
class TrainingData:
    path: Path
    records: list[TrainingRecord]
    problems: list[Problem]
    n_lines: int  # non-blank lines read

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "error"]

    @property
    def warnings(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "warning"]

    @property
    def skipped_lines(self) -> list[int]:
        return sorted({p.line for p in self.errors})

    def examples(self) -> list[Example]:
        return [r.to_example() for r in self.records]

    def summary(self) -> dict[str, Any]:
        return {
            "file": str(self.path),
            "lines": self.n_lines,
            "valid": len(self.records),
            "skipped": len(self.skipped_lines),
            "errors": len(self.errors),
            "warnings": len(self.warnings),
        }


@dataclass(frozen=True)
class Requirements:
    """What a configuration needs from every line; lines that cannot supply it are skipped."""

    positives: int = 0
    negatives: int = 0
    paragraph: bool = False
    needed_by: str = ""  # config name, for messages

    @classmethod
    def for_config(cls, cfg: TrainConfig) -> Requirements:
        sources = {i.source for i in cfg.inputs}
        # generated_all takes up to 5 captions, but fewer still train (multi-positive InfoNCE
        # handles any K ≥ 1), so one is the minimum; caption_any can fall back on the original.
        positives = 1 if sources & {"generated_one", "generated_all"} else 0
        negatives = cfg.hard_negatives if cfg.loss == "hardneg" else 0
        return cls(positives, negatives, "paragraph" in sources, cfg.name)


@dataclass
class _LineCheck:
    line: int
    problems: list[Problem] = field(default_factory=list)

    def error(self, fld: str, reason: str) -> None:
        self.problems.append(Problem(self.line, fld, reason, "error"))

    def warn(self, fld: str, reason: str) -> None:
        self.problems.append(Problem(self.line, fld, reason, "warning"))

    @property
    def ok(self) -> bool:
        return not any(p.severity == "error" for p in self.problems)


def _text(obj: dict, key: str, chk: _LineCheck, *, required: bool, needed_by: str = "") -> str:
    if key not in obj or obj[key] is None:
        if required:
            chk.error(key, "missing" + (f" (config {needed_by} needs it)" if needed_by else ""))
        return ""
    value = obj[key]
    if not isinstance(value, str):
        chk.error(key, f"must be a string, got {type(value).__name__}")
        return ""
    if not value.strip():
        if required:
            chk.error(key, "empty" + (f" (config {needed_by} needs it)" if needed_by else ""))
        return ""
    too_big = limits.caption_problem(value.strip())
    if too_big is not None:
        chk.error(key, too_big)
        return ""
    return value.strip()


def _text_list(obj: dict, key: str, chk: _LineCheck, need: int, needed_by: str) -> tuple[str, ...]:
    if key not in obj or obj[key] is None:
        if need:
            chk.error(key, f"missing (config {needed_by} needs {need})")
        else:
            chk.warn(key, "missing")
        return ()
    value = obj[key]
    if not isinstance(value, list):
        chk.error(key, f"must be a list of strings, got {type(value).__name__}")
        return ()
    bad = [i for i, t in enumerate(value) if not isinstance(t, str) or not t.strip()]
    if bad:
        chk.error(key, f"item {bad[0]} is not a non-empty string" + (f" ({len(bad)} such items)" if len(bad) > 1 else ""))
        return ()
    texts = tuple(t.strip() for t in value)
    for i, t in enumerate(texts):
        too_big = limits.caption_problem(t)
        if too_big is not None:
            chk.error(key, f"item {i}: {too_big}")
            return ()
    if len(texts) < need:
        chk.error(key, f"{len(texts)} given, config {needed_by} needs {need}")
    elif len(texts) != EXPECTED_COUNT:
        chk.warn(key, f"{len(texts)} given, the format expects {EXPECTED_COUNT}")
    return texts


def _score(obj: dict, chk: _LineCheck) -> float | None:
    if "paragraph_score" not in obj or obj["paragraph_score"] is None:
        chk.warn("paragraph_score", "missing")
        return None
    value = obj["paragraph_score"]
    # bool is an int subclass in Python; true/false is not a score.
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        chk.error("paragraph_score", f"must be a number, got {json.dumps(value)[:40]}")
        return None
    lo, hi = SCORE_RANGE
    if not lo <= value <= hi:
        chk.warn("paragraph_score", f"{value} is outside {lo:g}..{hi:g}")
    return float(value)


def check_line(
    text: str, line: int, base_dir: Path, req: Requirements = Requirements(), *, check_images: bool = True
) -> tuple[TrainingRecord | None, list[Problem]]:
    """Validate one JSONL line; the record is None when the line has an error."""
    chk = _LineCheck(line)
    try:
        obj = loads_bounded(text, "the line")
    except JsonTooDeepError as exc:
        chk.error("line", f"nests deeper than {exc.limit} levels (the limit); not read")
        return None, chk.problems
    except ValueError as exc:
        chk.error("line", f"not valid JSON ({exc})")
        return None, chk.problems
    if not isinstance(obj, dict):
        chk.error("line", f"must be a JSON object, got {type(obj).__name__}")
        return None, chk.problems
    image_ref = _text(obj, "image", chk, required=True)
    image = Path()
    if image_ref:
        image = Path(image_ref) if Path(image_ref).is_absolute() else base_dir / image_ref
        if check_images and not image.is_file():
            chk.error("image", f"file not found: {image}")
    original = _text(obj, "original_caption", chk, required=True)
    positives = _text_list(obj, "positives", chk, req.positives, req.needed_by)
    negatives = _text_list(obj, "negatives", chk, req.negatives, req.needed_by)
    paragraph = _text(obj, "paragraph", chk, required=req.paragraph, needed_by=req.needed_by)
    if not paragraph and not req.paragraph and "paragraph" not in {p.field for p in chk.problems}:
        chk.warn("paragraph", "missing or empty")
    score = _score(obj, chk)
    if not chk.ok:
        return None, chk.problems
    record = TrainingRecord(line, image, image_ref, original, positives, negatives, paragraph, score)
    return record, chk.problems


def _lines(path: Path) -> Iterator[tuple[int, str | None, str]]:
    """(line number, text, "") per line, or (line number, None, reason) for a line that is not
    UTF-8 — decoded line by line, so one bad byte costs only its own line."""
    from engine.text.captions import text_lines

    # Bounded reads (engine.limits) through the safe open, with the shared open-error wording.
    for line in text_lines(path, label="training data", error=TrainingDataError):
        yield line.line_no, (None if line.problem else line.text), line.problem or ""


def read_training_jsonl(
    path: Path | str,
    cfg: TrainConfig | None = None,
    *,
    strict: bool = False,
    check_images: bool = True,
    max_reported: int = 20,
) -> TrainingData:
    """Read and validate a training JSONL. Bad lines are skipped and listed in `problems`;
    with strict=True any error raises TrainingDataError (first `max_reported` listed).
    Blank lines are ignored. Duplicate images are a warning: they stay, but two copies in one
    batch act as false negatives for each other."""
    path = Path(path)
    req = Requirements.for_config(cfg) if cfg is not None else Requirements()
    base_dir = path.parent
    records: list[TrainingRecord] = []
    problems: list[Problem] = []
    seen: dict[str, int] = {}
    n_lines = 0
    for line_no, raw, undecodable in _lines(path):
        if raw is None:
            n_lines += 1
            problems.append(Problem(line_no, "line", undecodable, "error"))
            continue
        if not raw.strip():
            continue
        n_lines += 1
        record, probs = check_line(raw, line_no, base_dir, req, check_images=check_images)
        problems.extend(probs)
        if record is None:
            continue
        key = str(record.image)
        if key in seen:
            problems.append(Problem(line_no, "image", f"same image as line {seen[key]}", "warning"))
        else:
            seen[key] = line_no
        records.append(record)
    data = TrainingData(path, records, problems, n_lines)
    if strict and data.errors:
        raise TrainingDataError(format_problems(data, limit=max_reported, severity="error"))
    if n_lines == 0:
        raise TrainingDataError(f"{path} holds no training lines")
    return data


def format_problems(data: TrainingData, *, limit: int = 20, severity: Severity | None = None) -> str:
    """Problems as 'FILE:LINE: severity: field: reason' lines, at most `limit` of them."""
    items = [p for p in data.problems if severity is None or p.severity == severity]
    shown = [p.format(data.path) for p in items[:limit]]
    if len(items) > limit:
        shown.append(f"... and {len(items) - limit} more")
    return "\n".join(shown)


def write_training_lines(path: Path, rows: Iterable[dict[str, Any]]) -> Path:
    """Write rows in the training format (sorted keys, UTF-8, one object per line), atomically."""
    from engine.fileutil import atomic_write_text

    atomic_write_text(Path(path), "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in rows))
    return Path(path)


def sample_sentences(paragraph: str, rng: Any, sampling: float | int | None) -> str:
    """A random subset of a paragraph's sentences, in their order (the recipe's "sentence
    sampling" augmentation, arXiv 2412.15396): `sampling` is a fraction in (0, 1] of the
    sentences (at least one is kept) or a count (at most all); None: the paragraph unchanged.
    Sentences are the one splitter's (engine.text.sentences); `rng` is a numpy Generator."""
    from engine.text.sentences import split_sentences

    if sampling is None:
        return paragraph
    spans = split_sentences(paragraph)
    n = len(spans)
    if n <= 1:
        return paragraph
    if isinstance(sampling, bool) or not isinstance(sampling, (int, float)) or sampling <= 0:
        raise ValueError(f"sentence sampling {sampling!r}: use a fraction in (0, 1] or a count >= 1")
    if isinstance(sampling, float):
        if sampling > 1.0:
            raise ValueError(f"sentence sampling fraction {sampling} is above 1")
        k = max(1, min(n, round(sampling * n)))
    else:
        k = min(int(sampling), n)
    keep = sorted(int(i) for i in rng.choice(n, size=k, replace=False))
    return " ".join(paragraph[spans[i][0] : spans[i][1]] for i in keep)
