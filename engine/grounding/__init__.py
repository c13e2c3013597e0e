"""Grounding: which parts of a query an image supports, and where (interface + factory).

`get_grounder(embedder)` returns the grounder the embedder's backend makes (looked up in
engine.models.registry; sceneworld-mini: patch-similarity or alignment maps; BLIP: ITM Grad-CAM
maps and ITM supports; CLIP: value-path or Grad-CAM maps and cosine supports), or None for a
model without one; callers treat None as "grounding not available for this model".
Heavy modules (torch) load only when a grounder is built.
"""

from __future__ import annotations

import threading
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.grounding.api import Grounder, Grounding, Phrase, PhraseMap
from engine.grounding.calibration import user_calibration_file
from engine.models.base import Embedder

if TYPE_CHECKING:
    from engine.config import Paths

__all__ = ["Grounder", "Grounding", "Phrase", "PhraseMap", "get_grounder"]

_cache: weakref.WeakKeyDictionary[Any, dict[tuple, Grounder]] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def get_grounder(embedder: Embedder, *, calibrated: bool = True, method: str | None = None,
                 paths: Paths | None = None, **options: Any) -> Grounder | None:
    """The grounder for `embedder`'s model, or None when none is available.

    calibrated=False ignores stored calibrations (used when fitting them); `method` picks a
    map method ("patch", "align" (sceneworld-mini with an aligned head), "gradcam", or "value"
    (CLIP); default: the backend's best one). `paths`: the Longlens home whose user-fitted
    calibrations (`longlens grounding calibrate`) come before the shipped ones; None: shipped only.
    Grounders are cached per embedder, so repeated GUI requests reuse loaded statistics; a
    calibration fitted since (the user file changed) builds a new one.
    """
    user_file = user_calibration_file(paths) if paths is not None and calibrated else None
    key = (calibrated, method, tuple(sorted(options.items())), _stamp(user_file))
    try:
        with _lock:
            hit = _cache.get(embedder, {}).get(key)
    except TypeError:  # not weak-referenceable: no caching
        hit = None
    if hit is not None:
        return hit
    grounder = _build(embedder, calibrated=calibrated, method=method, user_file=user_file, **options)
    if grounder is not None:
        try:
            with _lock:
                _cache.setdefault(embedder, {})[key] = grounder
        except TypeError:
            pass
    return grounder


def grounder_with_calibration(embedder: Embedder, calibration: Any, *, method: str | None = None,
                              **options: Any) -> Grounder | None:
    """A grounder for `embedder` with the given calibration (fitted just now, not stored): for
    evaluating models that have no stored calibration, e.g. the experiments of docs/caft.md."""
    from engine.models.registry import backend_of

    backend = backend_of(embedder)
    if backend is None or backend.make_grounder is None:
        return None
    return backend.make_grounder(embedder, calibration, method=method, **options)


def _stamp(path: Path | None) -> tuple[str, int, int] | None:
    """What identifies a version of the user's calibration file (it is rewritten whole on save)."""
    if path is None:
        return None
    try:
        st = path.stat()
    except OSError:
        return (str(path), -1, -1)
    return (str(path), st.st_mtime_ns, st.st_size)


def _build(embedder: Any, *, calibrated: bool, method: str | None, user_file: Path | None,
           **options: Any) -> Grounder | None:
    # The registry picks the backend (engine/models/registry.py: the one dispatch point).
    from engine.models.registry import backend_of

    backend = backend_of(embedder)
    if backend is None or backend.make_grounder is None:
        return None
    from engine.grounding.calibration import load_calibration

    cal = load_calibration(embedder, user_file=user_file) if calibrated else None
    return backend.make_grounder(embedder, cal, method=method, **options)
