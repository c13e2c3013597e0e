"""Support calibration: raw scores -> probabilities where 0.5 means "undecided".

Calibration is fitted on a SceneWorld *validation* split (seeds 1000-1999 are reserved for
evaluation; this module uses seed 1500, the test numbers use seed 2000) and stored in
`engine/grounding/calibration.json` (the model folder in resources/ is read-only), keyed by
the text model id and the SHA-256 of the model weights from the model's
longlens-manifest.json, so a retrained model never silently reuses stale parameters.

Regenerate with:  python -m engine.grounding.calibration --model sceneworld-mini

Each level ("phrase", "relation", "sentence") is a logistic regression (Platt scaling) on a
few features, fitted on balanced positives and negatives, so p = 0.5 is the point where a
true and a one-detail-wrong text are equally likely.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from engine import options
from engine.fileutil import read_user_text
from engine.outputs import check_script_output

CALIBRATION_FILE = Path(__file__).with_name("calibration.json")
CALIBRATION_FORMAT = 1
VALIDATION_SEED = 1500
TEST_SEED = 2000
REGENERATE = "python -m engine.grounding.calibration --model {model}"


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


def fit_platt(x: np.ndarray, y: np.ndarray, l2: float = 1e-3, iters: int = 100) -> Platt:
    """Logistic regression by Newton's method, classes re-weighted to equal total weight.

    The balancing is what makes 0.5 mean "undecided" whatever the ratio of positives to
    negatives in the validation data.
    """
    x = np.atleast_2d(np.asarray(x, dtype=np.float64))
    if x.shape[0] == 1 and len(y) != 1:
        x = x.T
    y = np.asarray(y, dtype=np.float64)
    n_pos, n_neg = float(y.sum()), float(len(y) - y.sum())
    if n_pos == 0 or n_neg == 0:
        raise ValueError("calibration needs both positives and negatives")
    sw = np.where(y > 0.5, 0.5 / n_pos, 0.5 / n_neg)
    mu, sd = x.mean(0), x.std(0) + 1e-12
    z = np.concatenate([(x - mu) / sd, np.ones((len(x), 1))], axis=1)
    beta = np.zeros(z.shape[1])
    reg = np.full(z.shape[1], l2)
    reg[-1] = 0.0
    for _ in range(iters):
        p = sigmoid(z @ beta)
        grad = z.T @ (sw * (p - y)) + reg * beta
        hess = (z * (sw * p * (1 - p))[:, None]).T @ z + np.diag(reg + 1e-12)
        step = np.linalg.solve(hess, grad)
        beta -= step
        if np.max(np.abs(step)) < 1e-9:
            break
    w = beta[:-1] / sd
    b = beta[-1] - float(np.sum(beta[:-1] * mu / sd))
    return Platt([float(v) for v in w], float(b))


def roc_auc(pos: Sequence[float] | np.ndarray, neg: Sequence[float] | np.ndarray) -> float:
    """Mann-Whitney AUC (ties count half); nan when a class is empty."""
    pos = np.asarray(pos, dtype=np.float64)
    neg = np.asarray(neg, dtype=np.float64)
    if not len(pos) or not len(neg):
        return float("nan")
    allv = np.concatenate([pos, neg])
    order = allv.argsort(kind="mergesort")
    ranks = np.empty(len(allv), dtype=np.float64)
    sorted_v = allv[order]
    i = 0
    while i < len(allv):
        j = i
        while j + 1 < len(allv) and sorted_v[j + 1] == sorted_v[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    r_pos = ranks[: len(pos)].sum()
    return float((r_pos - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))


# --------------------------------------------------------------------------- storage


def weights_sha256(model_dir: Path | None, name: str = "model.safetensors") -> str:
    """The SHA-256 of a weights file as recorded in longlens-manifest.json (hashed if absent)."""
    if model_dir is None:
        return ""
    model_dir = Path(model_dir)
    try:
        manifest = json.loads((model_dir / "longlens-manifest.json").read_text(encoding="utf-8"))
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
        data = json.loads(read_user_text(path))  # a user may name the file: never blocks on a FIFO
    except (OSError, ValueError):
        return {"format": CALIBRATION_FORMAT, "models": {}}
    if not isinstance(data, dict) or data.get("format") != CALIBRATION_FORMAT:
        return {"format": CALIBRATION_FORMAT, "models": {}}
    data.setdefault("models", {})
    return data


def load_calibration(embedder: Any, path: Path = CALIBRATION_FILE) -> Calibration | None:
    key = calibration_key(embedder)
    entry = load_all(path)["models"].get(key)
    return Calibration.from_json(key, entry) if isinstance(entry, dict) else None


def save_calibration(cal: Calibration, path: Path = CALIBRATION_FILE) -> None:
    from engine.fileutil import atomic_write_text

    data = load_all(path)
    data["models"][cal.key] = cal.to_json()
    data["models"] = dict(sorted(data["models"].items()))
    atomic_write_text(Path(path), json.dumps(data, indent=1, sort_keys=False) + "\n")


# --------------------------------------------------------------------------- fitting


def fit_calibration(embedder: Any, *, seed: int = VALIDATION_SEED, n: int = 400) -> Calibration:
    """Fit every level of the embedder's grounder on SceneWorld validation scenes."""
    from engine.grounding import get_grounder
    from engine.grounding.evaluate import collect_support_features

    if not 1000 <= seed < 2000:
        raise ValueError("calibration uses the validation seeds 1000-1999 (test numbers use 2000+)")
    grounder = get_grounder(embedder, calibrated=False)
    if grounder is None:
        raise ValueError(f"no grounder for model {embedder.model_id!r}")
    t0 = time.monotonic()
    stats = grounder.fit_statistics(seed=seed, n=min(n, 256))  # type: ignore[attr-defined]
    grounder.set_statistics(stats)  # type: ignore[attr-defined]
    feats = collect_support_features(grounder, seed=seed, n=n)
    levels = {}
    for level, (x, y) in feats.items():
        if len(set(np.asarray(y).tolist())) == 2:
            levels[level] = fit_platt(np.asarray(x), np.asarray(y))
    key = calibration_key(embedder)
    meta = {
        "model_id": embedder.model_id,
        "text_model_id": getattr(embedder, "text_model_id", embedder.model_id),
        "weights_sha256": weights_sha256(model_dir_of(embedder)),
        "validation": {"benchmark": "sceneworld", "seed": seed, "n_scenes": n},
        "features": grounder.feature_names,  # type: ignore[attr-defined]
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "fit_seconds": round(time.monotonic() - t0, 1),
        "command": REGENERATE.format(model=embedder.model_id),
    }
    return Calibration(key, levels, {k: list(map(float, v)) for k, v in stats.items()}, meta)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m engine.grounding.calibration",
                                 description="Fit support calibration on SceneWorld validation scenes.")
    ap.add_argument("--model", default="sceneworld-mini")
    ap.add_argument("--seed", type=options.SEED, default=VALIDATION_SEED)
    ap.add_argument("--n", type=options.SCENES, default=400)
    ap.add_argument("--home", help="Longlens home (default: $LONGLENS_HOME or the user's)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", type=Path, default=CALIBRATION_FILE)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_script_output(parser, args.out, what="calibration file", home=args.home)
    from engine.config import get_paths
    from engine.models.registry import load_embedder

    embedder = load_embedder(args.model, get_paths(args.home), device=args.device)
    cal = fit_calibration(embedder, seed=args.seed, n=args.n)
    save_calibration(cal, args.out)
    print(json.dumps({"key": cal.key, "levels": {k: v.to_json() for k, v in cal.levels.items()}}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
