"""Tiny copies of the public long-caption sets' published layouts, with real JPEG files and JSON in
the published schemas (engine/evaluation/public_sets.py lists them and where they come from)."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

from PIL import Image, ImageDraw

COLOURS = ["red", "green", "blue", "yellow", "purple", "orange", "white", "black"]
RGB = {"red": (200, 30, 30), "green": (30, 160, 60), "blue": (40, 60, 200), "yellow": (230, 210, 40),
       "purple": (130, 40, 150), "orange": (240, 140, 20), "white": (245, 245, 245), "black": (15, 15, 15)}
THINGS = ["cup", "bicycle", "dog", "lamp", "boat", "chair", "kite", "clock"]


def picture(path: Path, i: int, size: int = 48) -> Path:
    """A real JPEG: a background colour and a square of another, different per i."""
    bg, fg = COLOURS[i % 8], COLOURS[(i * 3 + 1) % 8]
    im = Image.new("RGB", (size, size), RGB[bg])
    d = ImageDraw.Draw(im)
    off = (i * 7) % (size // 2)
    d.rectangle([off, off, off + size // 3, off + size // 3], fill=RGB[fg])
    path.parent.mkdir(parents=True, exist_ok=True)
    im.save(path, "JPEG", quality=90)
    return path


def short_caption(i: int) -> str:
    return f"A {COLOURS[(i * 3 + 1) % 8]} {THINGS[i % 8]} on a {COLOURS[i % 8]} background."


def paragraph(i: int) -> str:
    fg, bg, thing = COLOURS[(i * 3 + 1) % 8], COLOURS[i % 8], THINGS[i % 8]
    return (f"{short_caption(i)} The {thing} sits near the top left corner of the frame. "
            f"Nothing else is in the picture, and the {bg} background is flat and even. "
            f"The light is soft, with no shadow under the {fg} {thing}.")


def _jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


# -- DOCCI: docci_descriptions.jsonlines + images/ -----------------------------------------------
def write_docci(root: Path, n_train: int = 6, n_test: int = 2, size: int = 48) -> Path:
    rows = []
    for split, n, start in (("train", n_train, 0), ("test", n_test, 100), ("qual_dev", 1, 200)):
        for k in range(n):
            i = start + k
            name = f"{split}_{k:05d}"
            picture(root / "images" / f"{name}.jpg", i, size)
            rows.append({"example_id": name, "split": split, "image_file": f"{name}.jpg", "description": paragraph(i)})
    ann = root / "docci_descriptions.jsonlines"
    ann.write_text(_jsonl(rows), encoding="utf-8")
    return ann


# -- ShareGPT4V: one JSON list, images under data/ -------------------------------------------------
SHAREGPT4V_FILE = "sharegpt4v_instruct_gpt4-vision_cap100k.json"


def sharegpt4v_entry(i: int, image: str) -> dict:
    return {"id": Path(image).stem, "image": image,
            "conversations": [{"from": "human", "value": "<image>\nWhat do you see happening in this image?"},
                              {"from": "gpt", "value": paragraph(i).replace(". The", ".\n\nThe", 1)}]}


def write_sharegpt4v(root: Path, n: int = 6, size: int = 48, indent: int | None = None) -> Path:
    """Images as the project lays them out (data/coco/train2017/, data/sam/images/)."""
    entries = []
    for i in range(n):
        image = f"coco/train2017/{i:012d}.jpg" if i % 2 == 0 else f"sam/images/sa_{i}.jpg"
        picture(root / "data" / image, 300 + i, size)
        entries.append(sharegpt4v_entry(300 + i, image))
    ann = root / SHAREGPT4V_FILE
    ann.write_text(json.dumps(entries, indent=indent), encoding="utf-8")
    return ann


# -- DCI: densely_captioned_images/{splits.json, complete/, annotations/, photos/} ----------------
def _mask_png(size: int) -> str:
    im = Image.new("L", (size, size), 0)
    ImageDraw.Draw(im).rectangle([2, 2, size // 2, size // 2], fill=255)
    buf = io.BytesIO()
    im.save(buf, "PNG")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def dci_record(i: int, size: int = 48, complete: bool = True) -> dict:
    """One per-image DCI JSON as the release stores it (complete/ adds summaries and negatives)."""
    fg, thing = COLOURS[(i * 3 + 1) % 8], THINGS[i % 8]
    rec = {
        "image": f"sa_{1000 + i}.jpg",
        "short_caption": short_caption(i),
        "extra_caption": paragraph(i).removeprefix(short_caption(i)).strip(),
        "mask_data": {"0": {"idx": 0, "outer_mask": _mask_png(size), "mask_quality": 0, "label": f"the {thing}",
                            "caption": f"A small {fg} {thing}.", "parent": -1, "requirements": [],
                            "bounds": {"topLeft": {"x": 2, "y": 2}, "bottomRight": {"x": size // 2, "y": size // 2}},
                            "area": (size // 2 - 2) ** 2}},
        "mask_keys": ["0"],
        "width": size,
        "height": size,
    }
    if complete:
        rec["summaries"] = {"base": [f"A {fg} {thing} in a plain picture.", f"Picture of one {fg} {thing}.",
                                     f"A {thing}, {fg}, alone."],
                            "m-0-sc": [f"A small {fg} {thing}."]}
        rec["negatives"] = {"base": {"swaps": [f"A {thing} {fg} in a plain picture." + " swapped" * k
                                               for k in range(3)],
                                     "layout": [f"A {fg} {thing} at the bottom of a plain picture, v{k}."
                                                for k in range(3)],
                                     "basic": [f"Two {fg} {thing}s in a plain picture, v{k}." for k in range(3)]},
                            "m-0-sc": {"swaps": ["x"], "layout": ["y"], "basic": ["z"]}}
    return rec


def write_dci(root: Path, n_train: int = 6, n_test: int = 2, size: int = 48, annotations_only: tuple[int, ...] = (),
              ) -> Path:
    """root/densely_captioned_images; records `annotations_only` exist only in annotations/."""
    base = root / "densely_captioned_images"
    splits: dict[str, list[str]] = {"train": [], "valid": [], "test": []}
    for split, n, start in (("train", n_train, 400), ("valid", 1, 500), ("test", n_test, 600)):
        for k in range(n):
            i = start + k
            name = f"{i}-data.json"
            splits[split].append(name)
            picture(base / "photos" / f"sa_{1000 + i}.jpg", i, size)
            (base / "annotations").mkdir(parents=True, exist_ok=True)
            (base / "annotations" / name).write_text(json.dumps(dci_record(i, size, complete=False)), encoding="utf-8")
            if k not in annotations_only or split != "train":
                (base / "complete").mkdir(parents=True, exist_ok=True)
                (base / "complete" / name).write_text(json.dumps(dci_record(i, size)), encoding="utf-8")
    (base / "splits.json").write_text(json.dumps(splits), encoding="utf-8")
    return base
