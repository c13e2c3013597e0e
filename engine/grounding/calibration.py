"""Support calibration: raw scores -> probabilities where 0.5 means "undecided".

Calibration is fitted on a SceneWorld *validation* split (seeds 1000-1999 are reserved for
evaluation; this module uses seed 1500, the test numbers use seed 2000) and stored in
`engine/grounding/calibration.json` (the model folder in resources/ is read-only), keyed by
the text model id and the SHA-256 of the model weights from the model's
longlens-manifest.json, so a retrained model never silently reuses stale parameters.

Regenerate with:  longlens dev calibrate --model sceneworld-mini
(this module only loads and applies calibrations; fitting lives in
engine/evaluation/grounding_calibration.py, beside the benchmark).

A user fits calibrations for any installed model (a CLIP model, a retrained one) with
`longlens grounding calibrate`, on a labelled caption file or on SceneWorld validation scenes;
those are stored in the Longlens home (`user_calibration_file(paths)`, same format and keys)
and are looked up before the shipped file, so they are used from then on by every grounder
built with that home (CLI and GUI).

Each level ("phrase", "relation", "sentence") is a logistic regression (Platt scaling) on a
few features, fitted on balanced positives and negatives, so p = 0.5 is the point where a
true and a one-detail-wrong text are equally likely.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from engine.jsonfile import read_json_file
from engine.limits import MAX_MANIFEST_BYTES

CALIBRATION_FILE = Path(__file__).with_name("calibration.json")
# Calibrations a user fitted, in the Longlens home's data folder.
USER_CALIBRATION_NAME = "grounding-calibrations.json"
CALIBRATION_FORMAT = 1
VALIDATION_SEED = 1500
TEST_SEED = 2000
REGENERATE = "longlens dev calibrate --model {model}"


@dataclass
class Platt:
    """p = sigmoid(w . x + b)."""

    w: list[float]
    b: float

    def logit(self, x: Sequence[float] | np.ndarray) -> np.ndarray:
        x = np.atleast_2d(np.asarray(x, dtype=np.float64))
        return x @ np.asarray(self.w, dtype=np.float64) + self.b

    def prob(self, x: Sequence[float] | np.ndarray) -> np.ndarray:
        return sigmoid(self.logit(x))

    def to_json(self) -> dict[str, Any]:
        return {"w": [round(float(v), 6) for v in self.w], "b": round(float(self.b), 6)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Platt:
        return cls([float(v) for v in d["w"]], float(d["b"]))


def sigmoid(z: np.ndarray | float) -> np.ndarray:
    z = np.clip(np.asarray(z, dtype=np.float64), -60, 60)
    return 1.0 / (1.0 + np.exp(-z))


# --------------------------------------------------------------------------- storage


def weights_sha256(model_dir: Path | None, name: str = "model.safetensors") -> str:
    """The SHA-256 of a weights file as recorded in longlens-manifest.json (hashed if absent)."""
    if model_dir is None:
        return ""
    model_dir = Path(model_dir)
    try:
        manifest = read_json_file(model_dir / "longlens-manifest.json", max_bytes=MAX_MANIFEST_BYTES)
        sha = manifest["files"][name]["sha256"]
        if isinstance(sha, str) and len(sha) == 64:
            return sha
    except (OSError, ValueError, KeyError, TypeError):
        pass
    path = model_dir / name
    if path.is_file():
        from engine.fileutil import sha256_file

        return sha256_file(path)
    return ""


def model_dir_of(embedder: Any) -> Path | None:
    for attr in ("model_dir", "checkpoint_dir"):
        d = getattr(embedder, attr, None)
        if d is not None:
            return Path(d)
    return None


MATCHER_WEIGHTS = "matcher/matcher.safetensors"


def calibration_key(embedder: Any) -> str:
    """'<text model id>@<weights sha256>'; a text-tower override has its own id, hence its own key.

    A model with a matching head (sceneworld-mini's matcher/) adds '+matcher@<its sha256>': the
    head's logit is a support feature, so a retrained head needs its own calibration."""
    model_dir = model_dir_of(embedder)
    key = f"{getattr(embedder, 'text_model_id', '?')}@{weights_sha256(model_dir)}"
    tower_dir = getattr(embedder, "text_tower_dir", None)
    if tower_dir is not None:
        # The tower's name alone would let a retrained tower of the same name reuse a calibration.
        key += f"+tower@{_tower_weights_sha256(Path(tower_dir))}"
    if model_dir is not None and (model_dir / MATCHER_WEIGHTS).is_file():
        key += f"+matcher@{weights_sha256(model_dir, MATCHER_WEIGHTS)}"
    return key


def _tower_weights_sha256(tower_dir: Path) -> str:
    from engine.fileutil import sha256_file

    weights = sorted(tower_dir.glob("*.safetensors"))
    return sha256_file(weights[0]) if weights else ""


@dataclass
class Calibration:
    key: str
    levels: dict[str, Platt]
    stats: dict[str, list[float]] = field(default_factory=dict)  # e.g. mean image/text embedding
    meta: dict[str, Any] = field(default_factory=dict)
    #: The file it was read from (None: made in this process).
    source: Path | None = field(default=None, compare=False)

    def prob(self, level: str, x: Sequence[float] | np.ndarray) -> np.ndarray:
        return self.levels[level].prob(x)

    def to_json(self) -> dict[str, Any]:
        return {
            "levels": {k: v.to_json() for k, v in self.levels.items()},
            "stats": {k: [round(float(x), 6) for x in v] for k, v in self.stats.items()},
            **self.meta,
        }

    @classmethod
    def from_json(cls, key: str, d: dict[str, Any]) -> Calibration:
        meta = {k: v for k, v in d.items() if k not in ("levels", "stats")}
        return cls(
            key,
            {k: Platt.from_json(v) for k, v in d.get("levels", {}).items()},
            {k: [float(x) for x in v] for k, v in d.get("stats", {}).items()},
            meta,
        )


def load_all(path: Path = CALIBRATION_FILE) -> dict[str, Any]:
    try:
        # A user may name the file: never blocks on a FIFO, bounded in size and nesting (46 kB with
        # every shipped model; the manifest limit leaves room for hundreds more).
        data = read_json_file(path, max_bytes=MAX_MANIFEST_BYTES)
    except (OSError, ValueError):
        return {"format": CALIBRATION_FORMAT, "models": {}}
    if not isinstance(data, dict) or data.get("format") != CALIBRATION_FORMAT:
        return {"format": CALIBRATION_FORMAT, "models": {}}
    data.setdefault("models", {})
    return data


def user_calibration_file(paths: Any) -> Path:
    """Where the calibrations fitted by a user live: the home's data folder (engine.config.Paths)."""
    return Path(paths.data) / USER_CALIBRATION_NAME


def load_calibration(embedder: Any, path: Path = CALIBRATION_FILE, *,
                     user_file: Path | None = None) -> Calibration | None:
    """The calibration for the embedder's exact weights: the user's own (`user_file`) first, then
    the one in `path` (the shipped file); None when neither has one."""
    key = calibration_key(embedder)
    for source in ([user_file] if user_file is not None else []) + [path]:
        entry = load_all(source)["models"].get(key)
        if isinstance(entry, dict):
            cal = Calibration.from_json(key, entry)
            cal.source = Path(source)
            return cal
    return None


def save_calibration(cal: Calibration, path: Path = CALIBRATION_FILE) -> None:
    from engine.fileutil import atomic_write_text

    data = load_all(path)
    data["models"][cal.key] = cal.to_json()
    data["models"] = dict(sorted(data["models"].items()))
    atomic_write_text(Path(path), json.dumps(data, indent=1, sort_keys=False) + "\n")
