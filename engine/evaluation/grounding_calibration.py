"""Fitting support calibrations (maintenance; the app only loads and applies them, see
engine/grounding/calibration.py, which documents the scheme).

Regenerate with:  longlens dev calibrate --model sceneworld-mini

Each level ("phrase", "relation", "sentence") is a logistic regression (Platt scaling) on a
few features, fitted on balanced positives and negatives, so p = 0.5 is the point where a
true and a one-detail-wrong text are equally likely.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from engine import options
from engine.evaluation.grounding_benchmark import collect_support_features
from engine.grounding.calibration import (
    CALIBRATION_FILE,
    REGENERATE,
    VALIDATION_SEED,
    Calibration,
    Platt,
    calibration_key,
    model_dir_of,
    save_calibration,
    sigmoid,
    weights_sha256,
)
from engine.outputs import check_script_output


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


def fit_calibration(embedder: Any, *, seed: int = VALIDATION_SEED, n: int = 400) -> Calibration:
    """Fit every level of the embedder's grounder on SceneWorld validation scenes."""
    from engine.grounding import get_grounder

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
    ap = argparse.ArgumentParser(prog="longlens dev calibrate",
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
