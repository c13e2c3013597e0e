"""SceneWorld on disk: image folders, ground-truth JSONL, training JSONL, benchmark layouts.

All files are written atomically (temp file + rename), and every file is a pure function
of its arguments: writing the same collection twice gives byte-identical files. Index
files (JSONL/JSON) are also fsynced and written last; image files are not fsynced, because
an fsync per image made bulk exports ~8x slower and a lost image after a crash is simply
rewritten by the next export.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Literal

from PIL import Image

from engine.fileutil import atomic_write_text
from engine.sceneworld import generate_scene, render_scene
from engine.sceneworld.world import Scene

__all__ = [
    "PARAGRAPH_SCORE",
    "image_name",
    "write_coco_layout",
    "write_collection",
    "write_docci_layout",
    "write_training_jsonl",
]

ImageFormat = Literal["jpeg", "png"]
# Faithfulness score of a SceneWorld paragraph on the 0-10 scale of generated data: the
# texts are derived from the scene graph, so they are exact.
PARAGRAPH_SCORE = 10.0
_EXT = {"jpeg": ".jpg", "png": ".png"}


def image_name(seed: int, index: int, fmt: ImageFormat = "jpeg") -> str:
    if fmt not in _EXT:
        raise ValueError(f"fmt must be 'jpeg' or 'png', got {fmt!r}")
    return f"scene_{seed}_{index:05d}{_EXT[fmt]}"


def _encode(image: Image.Image, fmt: ImageFormat) -> bytes:
    buf = io.BytesIO()
    if fmt == "jpeg":
        # 4:4:4 chroma: 4:2:0 would smear the colour of 10-20 px objects into the background.
        image.save(buf, format="JPEG", quality=92, subsampling=0)
    else:
        image.save(buf, format="PNG", optimize=False)
    return buf.getvalue()


def _write_atomic(path: Path, data: bytes) -> None:
    """Temp file in the same folder + rename: readers see the old file or the whole new one."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _write_images(folder: Path, seed: int, n: int, size: int, fmt: ImageFormat,
                  start: int = 0) -> list[tuple[Scene, Path]]:
    folder.mkdir(parents=True, exist_ok=True)
    out: list[tuple[Scene, Path]] = []
    for index in range(start, start + n):
        scene = generate_scene(seed, index)
        image, _ = render_scene(scene, size)
        path = folder / image_name(seed, index, fmt)
        _write_atomic(path, _encode(image, fmt))
        out.append((scene, path))
    return out


def _jsonl(rows: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in rows)


def write_collection(dest: Path, seed: int, n: int, size: int = 256, fmt: ImageFormat = "jpeg") -> list[Path]:
    """A folder of n image files plus `sceneworld.jsonl` with each scene's full ground truth.

    Each JSONL line is `Scene.to_dict()` plus "file" (name in dest), "size" and "boxes_px"
    (per object, at that size). Masks are not stored: `render_scene(scene, size)` recomputes
    them exactly.
    """
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    written = _write_images(dest, seed, n, size, fmt)
    rows = []
    for scene, path in written:
        row = scene.to_dict()
        row.update(file=path.name, size=size, boxes_px=scene.boxes_px(size).tolist())
        rows.append(row)
    atomic_write_text(dest / "sceneworld.jsonl", _jsonl(rows))
    return [p for _, p in written]


def write_training_jsonl(dest_jsonl: Path, image_dir: Path, seed: int, n: int, size: int,
                         start: int = 0) -> Path:
    """Training data: PNG images in image_dir and one JSON object per line in dest_jsonl.

    Line schema: {"image": path relative to the JSONL's folder, "original_caption": str,
    "positives": [5 str], "negatives": [5 str], "paragraph": str, "paragraph_score": 10.0,
    "meta": {"source": "sceneworld", "seed", "index"}}.
    """
    dest_jsonl, image_dir = Path(dest_jsonl), Path(image_dir)
    image_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for scene, path in _write_images(image_dir, seed, n, size, "png", start):
        rel = os.path.relpath(path.resolve(), dest_jsonl.parent.resolve())
        rows.append({
            "image": Path(rel).as_posix(),
            "original_caption": scene.original_caption.text,
            "positives": [t.text for t in scene.positives],
            "negatives": [t.text for t in scene.negatives],
            "paragraph": scene.paragraph.text,
            "paragraph_score": PARAGRAPH_SCORE,
            "meta": {"source": "sceneworld", "seed": scene.seed, "index": scene.index},
        })
    atomic_write_text(dest_jsonl, _jsonl(rows))
    return dest_jsonl


def write_docci_layout(dest: Path, seed: int, n: int, size: int, fmt: ImageFormat = "jpeg") -> Path:
    """DOCCI-like test set: images/ and docci_descriptions.jsonlines, one paragraph per image.

    Lines: {"example_id", "image_file" (name inside images/), "description", "split": "test"}.
    """
    dest = Path(dest)
    rows = []
    for scene, path in _write_images(dest / "images", seed, n, size, fmt):
        rows.append({
            "example_id": f"sceneworld_{scene.seed}_{scene.index:05d}",
            "image_file": path.name,
            "description": scene.paragraph.text,
            "split": "test",
        })
    out = dest / "docci_descriptions.jsonlines"
    atomic_write_text(out, _jsonl(rows))
    return out


def write_coco_layout(dest: Path, seed: int, n: int, size: int, fmt: ImageFormat = "jpeg") -> dict[str, Path]:
    """COCO/Flickr-style test set with the 5 positive captions per image.

    Writes images/, annotations/captions_test.json (COCO captions format: "images" with
    id/file_name/width/height, "annotations" with id/image_id/caption) and
    dataset_coco.json (Karpathy split format: "images" with filename, filepath, imgid,
    split "test", sentids and sentences [{raw, tokens, imgid, sentid}]).
    """
    dest = Path(dest)
    images, annotations, karpathy = [], [], []
    sent_id = 0
    for img_id, (scene, path) in enumerate(_write_images(dest / "images", seed, n, size, fmt)):
        images.append({"id": img_id, "file_name": path.name, "width": size, "height": size})
        sentences, sentids = [], []
        for t in scene.positives:
            annotations.append({"id": sent_id, "image_id": img_id, "caption": t.text})
            tokens = [w.strip(",.;") for w in t.text.lower().split() if w.strip(",.;")]
            sentences.append({"raw": t.text, "tokens": tokens, "imgid": img_id, "sentid": sent_id})
            sentids.append(sent_id)
            sent_id += 1
        karpathy.append({
            "filename": path.name,
            "filepath": "images",
            "imgid": img_id,
            "split": "test",
            "sentids": sentids,
            "sentences": sentences,
            "sceneworld": {"seed": scene.seed, "index": scene.index},
        })
    coco_path = dest / "annotations" / "captions_test.json"
    karpathy_path = dest / "dataset_coco.json"
    info = {"description": f"SceneWorld seed {seed}, {n} scenes at {size} px"}
    atomic_write_text(coco_path, json.dumps({"info": info, "images": images, "annotations": annotations}))
    atomic_write_text(karpathy_path, json.dumps({"dataset": "sceneworld", "images": karpathy}))
    return {"images": dest / "images", "coco": coco_path, "karpathy": karpathy_path}
