"""Bundle a trained LM text tower with a model, as a query reader chosen by name.

    longlens dev ship-text-tower --tower build/lm-towers/s2-k6 --name minilm-k6 \
        --licence Apache-2.0 --source "sentence-transformers/all-MiniLM-L6-v2"

writes MODEL_DIR/text-towers/NAME/ (default MODEL_DIR: the bundled sceneworld-mini): the tower's
weights as fp16 safetensors (loading converts back to fp32; the round trip is checked here: every
probe embedding must keep a cosine of at least 0.999 with the fp32 tower's), its LM config and
tokenizer, a NOTICE naming the language model and its licence, and in lm_tower.json the image
identity of the model it was trained for (engine/models/text_towers.py refuses it against other
image weights). Its files are then listed in the model's manifest, so the model still verifies.
The copy is written beside the target and moved into place, so a failed run leaves the old one.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from engine.errors import ModelError
from engine.models.text_towers import TEXT_TOWERS_DIR, is_tower_name, trained_for

#: The least cosine between a probe text's fp32 and fp16-stored embeddings.
MIN_ROUND_TRIP_COSINE = 0.999
NOTICE_FILE = "NOTICE"
PROBE_TEXTS = (
    "A small red square in the upper left, and two big blue circles to the right of it.",
    "This is a photo of a harbour at dusk: three boats, one with a striped sail, moored near the pier.",
)


def ship(tower_dir: Path, model_dir: Path, name: str, *, licence: str, source: str) -> Path:
    """Write model_dir/text-towers/NAME from the tower in `tower_dir`; returns the new folder."""
    import numpy as np

    from engine.models.download import list_subfolder_in_manifest
    from engine.models.lm_tower import load_tower, read_tower_config, save_tower
    from engine.models.registry import model_identity, read_manifest

    if not is_tower_name(name):
        raise ModelError(f"tower name {name!r}: a tower name is one word, without folder separators")
    manifest = read_manifest(model_dir)
    image_identity = model_identity(manifest["name"], manifest).image
    _, meta = read_tower_config(tower_dir)
    tower = load_tower(tower_dir)
    keep = {k: v for k, v in meta.items() if k not in ("format", "tower", "dtype", "tokenizer")}
    keep.update(trained_for(image_identity), licence=licence, source=source)
    target = model_dir / TEXT_TOWERS_DIR / name
    staging = target.with_name(f".{name}.staging")
    shutil.rmtree(staging, ignore_errors=True)
    save_tower(tower, staging, half=True, extra=keep)
    (staging / NOTICE_FILE).write_text(
        f"{name}: a text tower fine-tuned by Longlens from {source}.\n"
        f"The language model's weights and tokenizer are distributed under the {licence} licence;\n"
        "the fine-tuned layers and the projection are a derivative of them under the same licence.\n",
        encoding="utf-8")
    shipped = load_tower(staging)
    a, b = tower.encode(list(PROBE_TEXTS)), shipped.encode(list(PROBE_TEXTS))
    worst = float(np.min(np.sum(a * b, axis=1)))
    if worst < MIN_ROUND_TRIP_COSINE:
        shutil.rmtree(staging, ignore_errors=True)
        raise ModelError(f"{tower_dir}: stored as fp16 its embeddings drift (cosine {worst:.4f} < "
                         f"{MIN_ROUND_TRIP_COSINE}); not shipped")
    old = target.with_name(f".{name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        target.replace(old)
    staging.replace(target)
    shutil.rmtree(old, ignore_errors=True)
    list_subfolder_in_manifest(model_dir, f"{TEXT_TOWERS_DIR}/{name}")
    return target


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="longlens dev ship-text-tower", description=__doc__.split("\n")[0])
    ap.add_argument("--tower", type=Path, required=True, help="the trained LM tower folder (lm_tower.json, ...)")
    ap.add_argument("--name", required=True, help="the name users choose it by (--text-tower NAME)")
    ap.add_argument("--model-dir", type=Path, default=None, help="default: the bundled sceneworld-mini")
    ap.add_argument("--licence", required=True, help="the language model's licence, e.g. Apache-2.0")
    ap.add_argument("--source", required=True, help="the language model it was fine-tuned from")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    from engine.models.registry import bundled_model_dir

    args = build_parser().parse_args(argv)
    model_dir = args.model_dir or bundled_model_dir("sceneworld-mini")
    try:
        target = ship(args.tower, model_dir, args.name, licence=args.licence, source=args.source)
    except ModelError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"shipped {target} (--text-tower {args.name})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
