"""What a grounding run writes: its JSON record (verdict, supports per sentence and phrase), the
overlay PNGs and map arrays per phrase, and the HTML page of `longlens check`."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

# A support below this is flagged low (0.5: undecided).
LOW_SUPPORT = 0.5
# Saved full-resolution maps are capped at this many pixels on the long side (a 24 MP photo
# would otherwise give a gigabyte of float32 per paragraph).
MAX_MAP_SIDE = 1024


def grounding_json(g: Any, threshold: float = LOW_SUPPORT) -> dict[str, Any]:
    sents = []
    for i, (s, e) in enumerate(g.sentences):
        sup = g.sentence_supports[i] if i < len(g.sentence_supports) else None
        sents.append({"index": i, "text": g.text[s:e], "start": s, "end": e,
                      "support": None if sup is None else round(float(sup), 4),
                      "low_support": bool(sup is not None and sup < threshold)})
    phrases = []
    for i, pm in enumerate(g.phrases):
        p = pm.phrase
        phrases.append({"index": i, "text": p.text, "kind": p.kind, "start": p.start, "end": p.end,
                        "sentence": pm.sentence, "claim": p.claim, "support": round(float(pm.support), 4),
                        "low_support": bool(pm.support < threshold)})
    supports = [s["support"] for s in sents if s["support"] is not None]
    if not supports:
        verdict = "no claims"
    elif all(s >= threshold for s in supports):
        verdict = "supported"
    elif all(s < threshold for s in supports):
        verdict = "not supported"
    else:
        verdict = "partly supported"
    return {"model": g.model_id, "method": g.method, "calibrated": g.calibrated, "verdict": verdict,
            "support": round(min(supports), 4) if supports else None, "sentences": sents, "phrases": phrases}


def _slug(text: str, n: int = 32) -> str:
    keep = "".join(ch if ch.isalnum() else "-" for ch in text.lower())
    return "-".join(x for x in keep.split("-") if x)[:n] or "phrase"


def write_outputs(image: Any, g: Any, out: Path, prefix: str = "") -> dict[str, Any]:
    """Overlay PNGs per phrase and the maps as arrays (patch and image resolution)."""
    import numpy as np

    from engine.grounding.maps import overlay, upsample

    out.mkdir(parents=True, exist_ok=True)
    w, h = image.size
    scale = min(1.0, MAX_MAP_SIDE / max(w, h))
    mw, mh = max(1, round(w * scale)), max(1, round(h * scale))
    files = []
    patch = np.stack([pm.heatmap for pm in g.phrases]) if g.phrases else np.zeros((0, 1, 1), np.float32)
    full = np.stack([upsample(m, mw, mh) for m in patch]) if len(patch) else np.zeros((0, mh, mw), np.float32)
    for i, pm in enumerate(g.phrases):
        name = f"{prefix}phrase_{i:02d}_{_slug(pm.phrase.text)}.png"
        overlay(image, pm.heatmap).save(out / name)
        files.append(name)
    arrays = f"{prefix}maps.npz"
    np.savez_compressed(out / arrays, patch=patch.astype(np.float32), image=full.astype(np.float16))
    return {"overlays": files, "arrays": arrays, "array_shapes": {"patch": list(patch.shape), "image": list(full.shape)}}


def _tint(support: float | None) -> str:
    if support is None:
        return "#ddd"
    s = max(0.0, min(1.0, float(support)))
    return f"hsl({int(120 * s)}, 70%, 80%)"


def html_report(records: list[dict[str, Any]], files_dir: str, threshold: float, run_id: str = "") -> str:
    parts = ["<!doctype html><meta charset='utf-8'><title>Longlens caption check</title>",
             f"<meta name='longlens-run' content='{html.escape(run_id)}'>",
             "<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto}"
             ".item{border-top:1px solid #ccc;padding:1em 0}.ov{display:inline-block;margin:4px;"
             "font-size:12px;width:200px;vertical-align:top}.ov img{width:200px}"
             "span.s{padding:1px 2px;border-radius:3px}.err{color:#b00}</style>",
             f"<h1>Caption check</h1><p>Tint: support (red low, green high); threshold {threshold}.</p>"]
    for r in records:
        parts.append(f"<div class='item'><h3>line {r['line']}: {html.escape(str(r.get('image', '')))}"
                     f" &mdash; {html.escape(r['verdict'])}</h3>")
        if r["verdict"] == "error":
            parts.append(f"<p class='err'>{html.escape(r.get('error', ''))}</p></div>")
            continue
        parts.append("<p>" + " ".join(
            f"<span class='s' style='background:{_tint(s['support'])}' title='support {s['support']}'>"
            f"{html.escape(s['text'])}</span>" for s in r["sentences"]) + "</p>")
        for p, f in zip(r["phrases"], r.get("files", {}).get("overlays", []), strict=False):
            parts.append(f"<div class='ov'><img src='{html.escape(files_dir)}/{html.escape(f)}'><br>"
                         f"<span class='s' style='background:{_tint(p['support'])}'>{html.escape(p['text'])}"
                         f"</span> {p['support']:.2f}</div>")
        parts.append("</div>")
    return "\n".join(parts) + "\n"
