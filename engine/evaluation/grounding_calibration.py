"""Fitting support calibrations (the app only loads and applies them, see
engine/grounding/calibration.py, which documents the scheme).

Regenerate the shipped ones with:  longlens dev calibrate --model sceneworld-mini

A user fits one for any installed model (`longlens grounding calibrate`, or the GUI through
`calibrate_job`): on SceneWorld validation scenes, or on a labelled caption file (the caption
reader's JSONL/CSV with a true/false label per caption). It is stored in the home's
user calibration file under the model's calibration key and used from then on.

Each level ("phrase", "relation", "sentence") is a logistic regression (Platt scaling) on a
few features, fitted on balanced positives and negatives, so p = 0.5 is the point where a
true and a one-detail-wrong text are equally likely.

Labelled captions. Each caption is one unit (its sentence level is the whole caption: label it
true only if all of it holds). Its phrases are positives when the caption is true; when it is
false, the phrases that no true caption of the same image also has are negatives (the
SceneWorld rule: a wrong caption is wrong in what it changed), and a false caption with no true
caption beside it gives a phrase negative only when it holds a single phrase (otherwise which
phrase is wrong is unknown, and none is used). A level is fitted when it has at least
MIN_PER_CLASS positives and negatives; the others stay uncalibrated, and groundings that use
them say calibrated=False.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine import options
from engine.errors import LonglensError
from engine.evaluation.grounding_benchmark import (
    collect_support_features,
    empty_support_features,
    iter_support_features,
    roc_auc,
)
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
from engine.jobs import CancelToken, Progress, RateMeter
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


# --------------------------------------------------------------------------- a user's calibration

#: A level is fitted when it has at least this many positives and this many negatives.
MIN_PER_CLASS = 5
#: Labelled captions read from one file (the lines after it are reported, not read): a Platt fit of
#: a few features needs hundreds; the texts are held in memory to group the captions by image.
MAX_LABELLED_CAPTIONS = 10_000
LABEL_KEYS = ("label", "supported", "match", "correct")
_TRUE = frozenset({"1", "true", "t", "yes", "y", "supported", "match", "correct", "positive", "pos"})
_FALSE = frozenset({"0", "false", "f", "no", "n", "not supported", "unsupported", "mismatch", "wrong",
                    "incorrect", "negative", "neg"})
USER_COMMAND = "longlens grounding calibrate --model {model}"


@dataclass(frozen=True)
class CalibrationRequest:
    """What to fit on: exactly one of `data` (a labelled caption file) and `scenes` (that many
    SceneWorld validation scenes of `seed`)."""

    data: Path | None = None
    scenes: int | None = None
    seed: int = VALIDATION_SEED
    method: str | None = None  # the map method whose relation geometry the fit sees (default: the backend's)


@dataclass(frozen=True)
class LabelledCaption:
    line_no: int
    image: Path
    caption: str
    label: bool


def parse_label(value: Any) -> bool | None:
    """True/False from a label as JSON or CSV give it (true, 1, "yes", "supported", ...); None
    when it is neither."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        word = " ".join(value.strip().lower().split())
        if word in _TRUE:
            return True
        if word in _FALSE:
            return False
    return None


def read_labelled_captions(path: Path) -> tuple[list[LabelledCaption], list[str]]:
    """The labelled captions of a caption file and its problems as 'FILE:LINE: field: reason'."""
    from engine.text.captions import RowProblem, read_captions

    rows: list[LabelledCaption] = []
    problems: list[str] = []
    for row in read_captions(path, label="the labelled caption file", error=LonglensError):
        if isinstance(row, RowProblem):
            problems.append(row.format(path))
            continue
        present = [k for k in LABEL_KEYS if k in row.extra]
        if not present:
            problems.append(f"{path}:{row.line_no}: label: no label (expected one of: {', '.join(LABEL_KEYS)})")
            continue
        label = parse_label(row.extra[present[0]])
        if label is None:
            problems.append(f"{path}:{row.line_no}: label: {row.extra[present[0]]!r} is neither true nor false "
                            "(use true/false, 1/0 or yes/no)")
            continue
        if len(rows) >= MAX_LABELLED_CAPTIONS:
            problems.append(f"{path}:{row.line_no}: line: past the limit of {MAX_LABELLED_CAPTIONS:,} labelled "
                            "captions a calibration reads; not read")
            continue
        rows.append(LabelledCaption(row.line_no, row.image, row.caption or "", label))
    return rows, problems


def labelled_features(grounder: Any, analyses: list[tuple[bool, Any]], out: dict[str, tuple[list, list]]) -> None:
    """Add the features of one image's labelled captions (label, Analysis) to `out` (the rule in
    this module's docstring)."""
    true_claims = {(p.kind, p.claim) for label, a in analyses if label for p in a.chunking.phrases}
    has_true = any(label for label, _ in analyses)
    for label, a in analyses:
        for x in a.sentence_x:
            out["sentence"][0].append(x)
            out["sentence"][1].append(int(label))
        single = len(a.chunking.phrases) == 1
        for p, lv, x in zip(a.chunking.phrases, a.phrase_levels, a.phrase_x, strict=True):
            if label:
                out[lv][0].append(x)
                out[lv][1].append(1)
            elif (has_true and (p.kind, p.claim) not in true_claims) or (not has_true and single):
                out[lv][0].append(x)
                out[lv][1].append(0)


def fit_levels(feats: dict[str, tuple[list, list]], min_per_class: int = MIN_PER_CLASS,
               ) -> tuple[dict[str, Platt], dict[str, dict[str, Any]]]:
    """A Platt model per level with enough of both classes, and per level its counts, in-sample
    AUC of the leading feature and calibrated support, or why it was not fitted."""
    levels: dict[str, Platt] = {}
    report: dict[str, dict[str, Any]] = {}
    for level, (x, y) in feats.items():
        y_arr = np.asarray(y, dtype=np.int64)
        pos, neg = int(y_arr.sum()), int(len(y_arr) - y_arr.sum())
        entry: dict[str, Any] = {"positives": pos, "negatives": neg}
        if pos < min_per_class or neg < min_per_class:
            entry["fitted"] = False
            entry["why"] = (f"{pos} positives and {neg} negatives; a fit needs at least {min_per_class} of each")
        else:
            x_arr = np.asarray(x, dtype=np.float64)
            platt = fit_platt(x_arr, y_arr)
            levels[level] = platt
            p = platt.prob(x_arr)
            entry.update(fitted=True, auc=round(roc_auc(p[y_arr == 1], p[y_arr == 0]), 4))
        report[level] = entry
    return levels, report


def calibrate_job(embedder: Any, req: CalibrationRequest, out: Path,
                  cancel: CancelToken | None = None) -> Iterator[Progress]:
    """Fit the embedder's support calibration on `req` and store it in `out` (a user calibration
    file: engine.grounding.calibration.user_calibration_file(paths)) under its calibration key.

    A job: Progress per scene or image; a cancel stops between them and stores nothing. The last
    Progress ("done") carries the summary in extra: key, file, levels (counts, AUC, or why a
    level was not fitted), problems ('FILE:LINE: field: reason' for each skipped line).
    """
    from engine.grounding import get_grounder

    cancel = cancel or CancelToken()
    if (req.data is None) == (req.scenes is None):
        raise LonglensError("choose one source to calibrate on: a labelled caption file or a number of "
                            "SceneWorld scenes", settings=("data", "scenes"))
    if req.scenes is not None:
        options.SCENES.check(req.scenes)
        if not 1000 <= int(req.seed) < 2000:
            raise LonglensError(f"SceneWorld calibration uses the validation seeds 1000-1999 (test numbers use "
                                f"2000 and above), got {req.seed}", settings=("seed",))
    grounder = get_grounder(embedder, calibrated=False, method=req.method)
    if grounder is None:
        raise LonglensError(f"grounding is not available for model {embedder.model_id!r}, so there is no "
                            "support to calibrate")
    t0 = time.monotonic()
    stats_n = min(req.scenes or 256, 256)
    stats = grounder.fit_statistics(seed=VALIDATION_SEED if req.scenes is None else req.seed, n=stats_n)
    grounder.set_statistics(stats)
    feats = empty_support_features()
    problems: list[str] = []
    if req.scenes is not None:
        n = int(req.scenes)
        meter = RateMeter(n)
        for i, part in enumerate(iter_support_features(grounder, seed=req.seed, n=n)):
            for level, (x, y) in part.items():
                feats[level][0].extend(x)
                feats[level][1].extend(y)
            cancel.raise_if_cancelled()
            yield meter.progress("scenes", i + 1, f"scene {i + 1} of {n}")
        source: dict[str, Any] = {"benchmark": "sceneworld", "seed": int(req.seed), "n_scenes": n}
    else:
        assert req.data is not None
        yield from _labelled(grounder, req.data, feats, problems, cancel)
        from engine.fileutil import sha256_file

        source = {"labelled": str(req.data), "sha256": sha256_file(req.data),
                  "n_captions": len(feats["sentence"][1])}
    levels, report = fit_levels(feats)
    if "sentence" not in levels:
        what = ("labelled captions: at least {n} true and {n} false ones are needed" if req.data is not None
                else "SceneWorld captions: use more scenes").format(n=MIN_PER_CLASS)
        raise LonglensError(f"not enough to fit a calibration from {req.data or 'the scenes'} "
                            f"({report['sentence']['why']}); {what}", settings=("data", "scenes"))
    cancel.raise_if_cancelled()
    key = calibration_key(embedder)
    meta = {
        "model_id": embedder.model_id,
        "text_model_id": getattr(embedder, "text_model_id", embedder.model_id),
        "weights_sha256": weights_sha256(model_dir_of(embedder)),
        "validation": source,
        "features": grounder.feature_names,  # type: ignore[attr-defined]
        "method": grounder.method,  # type: ignore[attr-defined]
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "fit_seconds": round(time.monotonic() - t0, 1),
        "command": USER_COMMAND.format(model=embedder.model_id),
    }
    cal = Calibration(key, levels, {k: list(map(float, v)) for k, v in stats.items()}, meta)
    from engine.config import ensure_folder

    ensure_folder(Path(out).parent)
    save_calibration(cal, out)
    fitted = [lv for lv in ("phrase", "relation", "sentence") if lv in levels]
    message = (f"calibration for {embedder.model_id} ({', '.join(fitted)}) stored in {out}"
               + (f"; {len(problems)} lines skipped" if problems else ""))
    yield Progress("done", 1, 1, message, extra={
        "key": key, "file": str(out), "model": embedder.model_id, "method": meta["method"],
        "levels": report, "fitted": fitted, "source": source, "problems": problems,
        "skipped": len(problems), "fit_seconds": meta["fit_seconds"]})


def _labelled(grounder: Any, path: Path, feats: dict[str, tuple[list, list]], problems: list[str],
              cancel: CancelToken) -> Iterator[Progress]:
    from engine.grounding.items import check_caption, load_image

    rows, read_problems = read_labelled_captions(path)
    problems.extend(read_problems)
    by_image: dict[Path, list[LabelledCaption]] = {}
    for row in rows:
        by_image.setdefault(row.image, []).append(row)
    meter = RateMeter(len(rows))
    done = 0
    for image_path, group in by_image.items():
        cancel.raise_if_cancelled()
        analyses: list[tuple[bool, Any]] = []
        try:
            image = load_image(image_path)
            image_feats = grounder.image_features(image)
        except LonglensError as exc:
            problems.extend(f"{path}:{row.line_no}: image: {exc}" for row in group)
            image_feats = None
        for row in group if image_feats is not None else ():
            try:
                check_caption(row.caption)
            except LonglensError as exc:
                problems.append(f"{path}:{row.line_no}: caption: {exc}")
                continue
            # The whole caption is one unit: its label says nothing about one sentence of it.
            analyses.append((row.label, grounder.analyse(None, row.caption, feats=image_feats,
                                                        sentences=[(0, len(row.caption))])))
        labelled_features(grounder, analyses, feats)
        done += len(group)
        yield meter.progress("captions", done, f"{image_path.name}")
    problems.sort(key=_line_of)


def _line_of(problem: str) -> int:
    """The line number of a 'FILE:LINE: field: reason' problem (the file name may hold colons)."""
    head = problem.split(": ", 1)[0]
    try:
        return int(head.rsplit(":", 1)[1])
    except (IndexError, ValueError):
        return 0


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
