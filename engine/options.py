"""One set of validators for every numeric option: CLI flags, the settings file and the GUI.

A `Number` names its field in words ("batch size", never a flag) and its range, so the same
object is the argparse `type=` of a flag, the check of a settings key and the range of a GUI
spin box, and the engine's own defence-in-depth checks say the same thing. Nothing is clamped
or ignored: a value outside the range is refused with a message naming the field and the value.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.errors import ConfigError, LonglensError


class OptionError(LonglensError):
    """A numeric value is outside its field's range (or not a number at all)."""


@dataclass(frozen=True)
class Number:
    """An int or float field with an inclusive range [lo, hi] (`lo_open`: lo itself excluded)."""

    field: str
    kind: type = int
    lo: float = 1
    hi: float = 1_000_000
    lo_open: bool = False

    @property
    def __name__(self) -> str:  # argparse names the type in some of its own messages
        return self.field

    def describe(self) -> str:
        kind = "an integer" if self.kind is int else "a number"
        if self.lo_open:
            return f"{kind} greater than {self.lo:g} and at most {self.hi:g}"
        return f"{kind} from {self.lo:g} to {self.hi:g}"

    def check(self, value: Any) -> int | float:
        """The value itself when it is in range, else OptionError naming the field."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise OptionError(f"{self.field} must be {self.describe()}, got {value!r}")
        if self.kind is int and (isinstance(value, float) and not value.is_integer()):
            raise OptionError(f"{self.field} must be a whole number, got {value!r}")
        if isinstance(value, float) and not math.isfinite(value):
            raise OptionError(f"{self.field} must be {self.describe()}, got {value!r}")
        too_low = value <= self.lo if self.lo_open else value < self.lo
        if too_low:
            bound = f"greater than {self.lo:g}" if self.lo_open else f"at least {self.lo:g}"
            raise OptionError(f"{self.field} must be {bound}, got {value:g}")
        if value > self.hi:
            raise OptionError(f"{self.field} must be at most {self.hi:g}, got {value:g}")
        return self.kind(value)

    def parse(self, text: str) -> int | float:
        """Parse a command-line or text-field value, then check it."""
        raw = text.strip()
        try:
            value: int | float = int(raw) if self.kind is int else float(raw)
        except ValueError:
            raise OptionError(f"{self.field} must be {self.describe()}, got {text!r}") from None
        return self.check(value)

    def __call__(self, text: str) -> int | float:
        # argparse's `type=`: an ArgumentTypeError becomes a usage error (exit 2) that argparse
        # prefixes with the flag, so the message itself stays free of flag names.
        try:
            return self.parse(text)
        except OptionError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None


def probability(field: str) -> Number:
    return Number(field, float, 0.0, 1.0)


def count(field: str, lo: int = 1, hi: int = 1_000_000) -> Number:
    return Number(field, int, lo, hi)


# Shared fields: one definition per meaning, so `index --batch-size`, the settings file and the
# GUI spin box cannot drift apart.
BATCH_SIZE = count("batch size", 1, 4096)
TOP_K = count("number of results", 1, 1_000_000)
# A budget of 1 cannot hold the [CLS] and [SEP] tokens every text model adds; the model's own
# maximum is checked when the model is known (see `token_budget_for`).
TOKEN_BUDGET = count("token budget", 2, 4096)
RERANK_K = count("number of candidates to re-rank", 1, 10_000)
THRESHOLD = probability("support threshold")
SEED = count("seed", 0, 2**32 - 1)
SCENES = count("number of scenes", 1, 10_000_000)
EPOCHS = count("number of epochs", 1, 100_000)
STEPS = count("number of steps", 0, 1_000_000_000)
WORKERS = count("number of worker threads", 1, 256)
LEARNING_RATE = Number("learning rate", float, 0.0, 10.0, lo_open=True)
TEMPERATURE = Number("temperature", float, 0.0, 100.0, lo_open=True)
THUMBNAIL_CACHE_MB = count("thumbnail cache size (MB)", 16, 65536)
TRAIN_LAYERS = count("trained layers", 0, 4096)
# The relevance cut-off: results whose score is more than this below the best result's score (in
# cosine-similarity units, so at most 2) are not shown (engine.search.ordering.apply_cutoff).
RELEVANCE_CUTOFF = Number("relevance cut-off", float, 0.0, 2.0, lo_open=True)
# Duplicates (engine.duplicates): two pictures are near-duplicates when their 64-bit perceptual
# hashes differ in at most this many bits, and visually similar when the cosine similarity of
# their embeddings is at least the similarity threshold.
PHASH_DISTANCE = count("perceptual-hash distance", 0, 32)
SIMILARITY_THRESHOLD = Number("similarity threshold", float, 0.0, 1.0, lo_open=True)
# The share of a paragraph's sentences a training step keeps (the seed's sentence sampling).
SENTENCE_SAMPLING = Number("sentence-sampling fraction", float, 0.0, 1.0, lo_open=True)
# The weight of the local (phrase-region) alignment loss beside the global one (0: off); the same
# range TrainConfig.validate checks (engine/training/local_alignment.py).
LOCAL_ALIGNMENT = Number("local-alignment weight", float, 0.0, 100.0)
# The search filter on XMP ratings: at least this many stars (0 keeps all but rejected pictures).
MIN_RATING = count("minimum rating", 0, 5)
# The GPS filter's radius: more than 0, at most half the Earth's circumference (pi x 6371.0088 km,
# engine.catalog.geo.MAX_DISTANCE_KM, rounded up), which already reaches every place.
GPS_RADIUS_KM = Number("the 'km' radius", float, 0.0, 20015.2, lo_open=True)


def train_layers(value: str) -> int | str:
    """argparse `type=` of a trained-layer count: a number (top k layers) or "all"."""
    if value.strip() == "all":
        return "all"
    try:
        return TRAIN_LAYERS.parse(value)
    except OptionError as exc:
        raise argparse.ArgumentTypeError(f"{exc} (or 'all')") from None


train_layers.number = TRAIN_LAYERS  # type: ignore[attr-defined]  # its range, for the option tests


def token_budget_for(max_tokens: int | None, default: int, maximum: int, model: str) -> int:
    """The token budget to encode with: the model's default when none is given, else the given
    one if the model can take it. Never clamped: a budget over the model's maximum is refused."""
    if max_tokens is None:
        return min(default, maximum)
    TOKEN_BUDGET.check(max_tokens)
    if max_tokens > maximum:
        raise OptionError(f"token budget must be at most {maximum} for model {model}, got {max_tokens}")
    return int(max_tokens)


@dataclass(frozen=True)
class Choice:
    """A text field with a fixed set of values: the argparse `type=` of a flag, the check of a
    settings key and the entries of a GUI list, with one message for all three."""

    field: str
    choices: tuple[str, ...]

    @property
    def __name__(self) -> str:
        return self.field

    def check(self, value: Any) -> str:
        """The value itself when it is one of the choices, else OptionError naming the field."""
        if not isinstance(value, str) or value not in self.choices:
            raise OptionError(f"{self.field} must be one of {', '.join(self.choices)}, got {value!r}")
        return value

    def __call__(self, text: str) -> str:
        try:
            return self.check(text.strip())
        except OptionError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None


# What `index` does with a RAW file and a JPEG (or HEIF) of the same name in the same folder:
# index the JPEG only (the default: one shot, one result), the RAW only, or both.
RAW_JPEG_PAIRS = Choice("RAW+JPEG pairs", ("jpeg", "raw", "both"))

# The order search results are shown in: by relevance (the model's ranking), or the same results
# by the picture's date, newest or oldest first (engine.search.ordering).
RESULT_ORDER = Choice("result order", ("relevance", "date-new", "date-old"))

# settings.json keys that hold one of a fixed set of values.
SETTINGS_CHOICES: dict[str, Choice] = {
    "raw_jpeg_pairs": RAW_JPEG_PAIRS,
}

# settings.json keys that hold numbers; None (where allowed) means "the default".
SETTINGS_NUMBERS: dict[str, tuple[Number, bool]] = {
    "batch_size": (BATCH_SIZE, False),
    "decode_workers": (count("number of decoding threads", 1, 32), False),
    "thumbnail_cache_mb": (THUMBNAIL_CACHE_MB, False),
    "top_k": (TOP_K, False),
    "max_tokens": (TOKEN_BUDGET, True),
}


def validate_settings(values: Mapping[str, Any], source: Path | str) -> dict[str, Any]:
    """The settings unchanged when every numeric and choice key is valid, else ConfigError naming the file
    (`source`) and the key: a bad value is never replaced silently by a default."""
    for key, (number, nullable) in SETTINGS_NUMBERS.items():
        if key not in values or (nullable and values[key] is None):
            continue
        try:
            number.check(values[key])
        except OptionError as exc:
            raise ConfigError(f"{source}: setting {key!r}: {exc}") from None
    for key, choice in SETTINGS_CHOICES.items():
        if key not in values:
            continue
        try:
            choice.check(values[key])
        except OptionError as exc:
            raise ConfigError(f"{source}: setting {key!r}: {exc}") from None
    return dict(values)


@dataclass(frozen=True)
class NumberList:
    """A comma-separated list of `number` values (e.g. index sizes 10000,100000)."""

    number: Number

    @property
    def __name__(self) -> str:
        return f"list of {self.number.field}"

    def parse(self, text: str) -> list[int | float]:
        values = [self.number.parse(part.replace("_", "")) for part in text.split(",") if part.strip()]
        if not values:
            raise OptionError(f"{self.number.field}: expected comma-separated values, got {text!r}")
        return values

    def __call__(self, text: str) -> list[int | float]:
        try:
            return self.parse(text)
        except OptionError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
