"""Grounding quality on generated SceneWorld scenes (seeds >= 1000, never used in training).

Metrics (docs/grounding.md):

* pointing game: for every object phrase of a scene's paragraph and positive captions (the
  generator's own phrase spans, so chunking errors do not enter), is the maximum of its map,
  upsampled to the render, inside the box of an object the phrase refers to?
  Baselines: the image centre as the predicted point, and the expected hit rate of a
  uniformly random point (the mean area share of the referred boxes).
* mask IoU: the upsampled map thresholded at 0.5 against the union of the referred objects'
  visible masks.
* faithfulness AUC: ROC AUC of the sentence support of the 5 true captions against the 5
  hard negatives (each wrong in one detail: attribute, relation, count or object), pooled
  over scenes, and per error type (true sources of that type's negatives against them).
  Captions are chunked by the production chunker, exactly as `longlens check` does.
* chunking: recall of the generator's object and relation phrase spans by the chunker, and
  exact sentence-split agreement on paragraphs.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from engine.grounding.api import Phrase
from engine.grounding.chunking import Chunking, chunk
from engine.grounding.maps import argmax_point, upsample

ERROR_TYPES = ("attribute", "relation", "count", "object")
MASK_THRESHOLD = 0.5


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


def render_size_for(embedder: Any) -> int:
    return max(256, int(embedder.image_size))


def _scenes(seed: int, n: int, size: int) -> Iterator[tuple[Any, Any, np.ndarray]]:
    from engine.sceneworld import check_eval_seed, generate_scene, render_scene

    check_eval_seed(seed)
    for i in range(n):
        scene = generate_scene(seed, i)
        image, masks = render_scene(scene, size)
        yield scene, image, masks


def gt_chunking(t: Any, sentences: list[tuple[int, int]] | None = None) -> tuple[Chunking, list[list[int]]]:
    """A Chunking made of a SceneWorld text's object phrases (and their referred object ids)."""
    objs = [p for p in t.phrases if p.kind == "object"]
    sents = sentences or [(0, len(t.text))]
    owner = [next((k for k, (s, e) in enumerate(sents) if s <= p.start < e), 0) for p in objs]
    phrases = [Phrase(p.text, p.start, p.end, "noun_phrase") for p in objs]
    return Chunking(t.text, sents, phrases, owner), [list(p.object_ids) for p in objs]


def _caption_items(scene: Any) -> list[tuple[str, int, str, int]]:
    """(text, label, error type or 'true', source positive index)."""
    items = [(p.text, 1, "true", k) for k, p in enumerate(scene.positives)]
    items += [(n.text, 0, n.error_type, n.source_index) for n in scene.negatives]
    return items


def empty_support_features() -> dict[str, tuple[list, list]]:
    return {"phrase": ([], []), "relation": ([], []), "sentence": ([], [])}


def collect_support_features(grounder: Any, *, seed: int, n: int) -> dict[str, tuple[list, list]]:
    """Raw support features with labels per level, for calibration fitting."""
    out = empty_support_features()
    for part in iter_support_features(grounder, seed=seed, n=n):
        for level, (x, y) in part.items():
            out[level][0].extend(x)
            out[level][1].extend(y)
    return out


def iter_support_features(grounder: Any, *, seed: int, n: int) -> Iterator[dict[str, tuple[list, list]]]:
    """collect_support_features one scene at a time (a job reports progress and checks its
    cancel token between scenes)."""
    size = render_size_for(grounder.embedder)
    for scene, image, _ in _scenes(seed, n, size):
        out = empty_support_features()
        feats = grounder.image_features(image)
        analyses = {}
        for text, label, etype, src in _caption_items(scene):
            a = grounder.analyse(None, text, feats=feats)
            analyses[(label, etype, src, text)] = a
            for x in a.sentence_x:
                out["sentence"][0].append(x)
                out["sentence"][1].append(label)
        true_claims = {
            src: {(p.kind, p.claim) for p in a.chunking.phrases}
            for (label, _, src, _), a in analyses.items() if label == 1
        }
        for (label, etype, src, _), a in analyses.items():
            for p, lv, x in zip(a.chunking.phrases, a.phrase_levels, a.phrase_x, strict=True):
                if label == 1:
                    out[lv][0].append(x)
                    out[lv][1].append(1)
                elif (p.kind, p.claim) not in true_claims.get(src, set()):
                    # Only the phrase the corruption changed is false; the rest stays true.
                    if (lv == "relation") == (etype == "relation"):
                        out[lv][0].append(x)
                        out[lv][1].append(0)
        yield out


def _chunking_recall(scene: Any, stats: dict[str, list[int]]) -> None:
    for ti, t in enumerate([scene.paragraph, *scene.positives]):
        c = chunk(t.text)
        got = {(p.start, p.end) for p in c.phrases}
        for p in t.phrases:
            if p.kind in ("object", "relation"):
                stats[p.kind].append(int((p.start, p.end) in got))
        if ti == 0:
            stats["sentences"].append(int(c.sentences == [(s.start, s.end) for s in t.sentences]))


def evaluate_grounding(embedder: Any, *, seed: int, n: int, method: str | None = None,
                       gradcam_layer: int | None = None, timing_images: int = 20,
                       calibration: Any = None) -> dict:
    """Pointing game, mask IoU, faithfulness AUC (overall and per error type) on n scenes.

    `method`/`gradcam_layer` choose the map method and Grad-CAM layer (default: the backend's);
    `calibration`, one fitted for these weights but not stored (default: the stored one).
    """
    from engine.errors import LonglensError
    from engine.grounding import get_grounder
    from engine.sceneworld import check_eval_seed

    if n < 1:
        raise LonglensError("the number of scenes must be at least 1", settings=("n",))
    try:
        check_eval_seed(seed)
    except ValueError as exc:
        raise LonglensError(str(exc)) from None
    options = {} if gradcam_layer is None else {"gradcam_layer": int(gradcam_layer)}
    if calibration is not None:
        from engine.grounding import grounder_with_calibration

        grounder = grounder_with_calibration(embedder, calibration, method=method, **options)
    else:
        grounder = get_grounder(embedder, method=method, **options)
    if grounder is None:
        raise LonglensError(f"grounding is not available for model {getattr(embedder, 'model_id', '?')!r}")
    size = render_size_for(embedder)
    centre = size // 2
    hits, centre_hits, random_hits, ious = [], [], [], []
    scores: list[tuple[float, int, str, tuple[int, int]]] = []  # support, label, type, (scene, src)
    chunk_stats: dict[str, list[int]] = {"object": [], "relation": [], "sentences": []}
    ground_ms: list[float] = []
    t_start = time.perf_counter()
    for si, (scene, image, masks) in enumerate(_scenes(seed, n, size)):
        if si < timing_images:
            t0 = time.perf_counter()
            grounder.ground(image, scene.paragraph.text)
            ground_ms.append((time.perf_counter() - t0) * 1000)
        feats = grounder.image_features(image)
        texts = [(scene.paragraph, [(s.start, s.end) for s in scene.paragraph.sentences])]
        texts += [(t, None) for t in scene.positives]
        for t, sents in texts:
            c, ids = gt_chunking(t, sents)
            if not c.phrases:
                continue
            a = grounder.analyse(None, t.text, feats=feats, chunking=c)
            for m, obj_ids in zip(a.maps, ids, strict=True):
                up = upsample(m, size, size)
                r, col = argmax_point(up)
                boxes = [scene.objects[o].box_px(size) for o in obj_ids]
                hits.append(any(b[0] <= col < b[2] and b[1] <= r < b[3] for b in boxes))
                centre_hits.append(any(b[0] <= centre < b[2] and b[1] <= centre < b[3] for b in boxes))
                box_mask = np.zeros((size, size), bool)
                for b in boxes:
                    box_mask[b[1]:b[3], b[0]:b[2]] = True
                random_hits.append(float(box_mask.mean()))
                truth = masks[obj_ids].any(axis=0)
                pred = up >= MASK_THRESHOLD
                union = int((pred | truth).sum())
                ious.append(float((pred & truth).sum()) / union if union else 0.0)
        for text, label, etype, src in _caption_items(scene):
            a = grounder.analyse(None, text, feats=feats)
            _, sent = grounder.supports(a)
            support = min(sent) if sent else 0.5
            scores.append((support, label, etype, (si, src)))
        _chunking_recall(scene, chunk_stats)
    elapsed = time.perf_counter() - t_start

    sup = np.array([s[0] for s in scores])
    lab = np.array([s[1] for s in scores])
    by_error = {}
    for et in ERROR_TYPES:
        neg = [s[0] for s in scores if s[2] == et]
        srcs = {s[3] for s in scores if s[2] == et}
        pos = [s[0] for s in scores if s[1] == 1 and s[3] in srcs]
        by_error[et] = roc_auc(pos, neg)
    cal = grounder.calibration
    return {
        "benchmark": "sceneworld-grounding",
        "model": grounder.model_id,
        "method": grounder.method,
        "seed": seed,
        "n_scenes": n,
        "render_size": size,
        "n_object_phrases": len(hits),
        "pointing_game": float(np.mean(hits)) if hits else float("nan"),
        "pointing_game_centre_baseline": float(np.mean(centre_hits)) if hits else float("nan"),
        "pointing_game_random_baseline": float(np.mean(random_hits)) if hits else float("nan"),
        "mask_iou": float(np.mean(ious)) if ious else float("nan"),
        "mask_iou_threshold": MASK_THRESHOLD,
        "faithfulness_auc": roc_auc(sup[lab == 1], sup[lab == 0]),
        "faithfulness_auc_by_error": by_error,
        "n_captions": {"true": int((lab == 1).sum()), "wrong": int((lab == 0).sum())},
        "support_true_above_half": float(np.mean(sup[lab == 1] > 0.5)) if len(sup) else float("nan"),
        "support_wrong_below_half": float(np.mean(sup[lab == 0] < 0.5)) if len(sup) else float("nan"),
        "calibrated": cal is not None,
        "calibration_key": cal.key if cal is not None else None,
        "chunking": {
            "object_phrase_recall": float(np.mean(chunk_stats["object"])),
            "relation_phrase_recall": float(np.mean(chunk_stats["relation"])) if chunk_stats["relation"]
            else float("nan"),
            "paragraph_sentence_split_exact": float(np.mean(chunk_stats["sentences"])),
        },
        "ms_per_paragraph_image": float(np.median(ground_ms)) if ground_ms else float("nan"),
        "device": str(getattr(embedder, "device", "cpu")),
        "seconds": round(elapsed, 1),
    }


def gradcam_layer_sweep(embedder: Any, *, seed: int, n: int, layers: list[int] | None = None) -> dict[int, dict]:
    """Pointing game and mask IoU of Grad-CAM maps per layer: how the default layer is chosen.

    BLIP: the cross-attention layers of the text encoder; sceneworld-mini: 0 = the stem's
    patch tokens, i = the output of transformer layer i.
    """
    if layers is None:
        from engine.errors import LonglensError
        from engine.grounding import get_grounder

        grounder = get_grounder(embedder, method="gradcam")
        if grounder is None:
            raise LonglensError(f"grounding is not available for model {getattr(embedder, 'model_id', '?')!r}")
        layers = grounder.gradcam_layers()
    out = {}
    for layer in layers:
        r = evaluate_grounding(embedder, seed=seed, n=n, method="gradcam", gradcam_layer=layer, timing_images=0)
        out[layer] = {k: r[k] for k in ("pointing_game", "mask_iou", "method")}
    return out
