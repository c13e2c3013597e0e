"""Benchmark loaders: Flickr30k and COCO (Karpathy split JSON or COCO captions JSON),
ShareGPT4V (conversation JSON), DOCCI (JSON lines) and SceneWorld (generated), all turned
into one EvalSet: image files, texts, and the image each text belongs to. ShareGPT4V's and
DOCCI's layouts are read by engine.evaluation.public_sets, shared with `longlens train convert`.

Multi-caption rule (research brief §1): COCO and Flickr30k keep the first 5 captions of each
image (in annotation order; a few COCO images have 6-7), scored so that an image→text query is
a hit when ANY of its captions is in the top K. ShareGPT4V and DOCCI have one description per
image. Bad input raises BenchmarkDataError naming the file and line (JSON lines, ShareGPT4V's
list: the line where the entry starts, and its index) or the entry (other JSON documents).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.errors import LonglensError
from engine.evaluation.public_sets import (
    SourceProblem,
    SourceRecord,
    SourceStream,
    read_docci,
    read_sharegpt4v,
)

if TYPE_CHECKING:
    import numpy as np

    from engine.models.base import Embedder

BENCHMARKS = ("flickr30k", "coco", "sharegpt4v", "docci", "sceneworld")
CAPTIONS_PER_IMAGE = 5
# Token budgets of the paper's tables: captions at 77; ShareGPT4V at 77 in the main table (128
# in the data-efficiency table: pass max_tokens=128); DOCCI at 128.
DEFAULT_TOKENS = {"flickr30k": 77, "coco": 77, "sharegpt4v": 77, "docci": 128, "sceneworld": 128}
DEFAULT_SPLITS = {"flickr30k": "test", "coco": "test", "sharegpt4v": None, "docci": "test", "sceneworld": "long"}


class BenchmarkDataError(LonglensError):
    pass


@dataclass
class EvalSet:
    """images[i] is image i; texts[t] belongs to images[owner[t]]."""

    name: str
    split: str | None
    images: list[Path]
    texts: list[str]
    owner: list[int]
    default_tokens: int = 77
    source: str = ""  # the annotation file
    # Generated benchmarks embed their images themselves (SceneWorld renders in memory).
    embed_images: Callable[[Embedder], np.ndarray] | None = field(default=None, repr=False)
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.texts) != len(self.owner):
            raise ValueError("texts and owner differ in length")

    @property
    def n_images(self) -> int:
        return len(self.images) if self.embed_images is None else int(self.meta.get("n_images", len(self.images)))


# -- helpers ----------------------------------------------------------------------
def _read_json(path: Path) -> Any:
    from engine.fileutil import FileTooLargeError, read_user_text
    from engine.jsonfile import JsonTooDeepError, loads_bounded
    from engine.limits import MAX_DATASET_JSON_BYTES

    try:
        text = read_user_text(path, max_bytes=MAX_DATASET_JSON_BYTES)  # never blocks on a FIFO or device
    except FileNotFoundError:
        raise BenchmarkDataError(f"{path} does not exist") from None
    except FileTooLargeError as exc:
        raise BenchmarkDataError(str(exc)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise BenchmarkDataError(f"cannot read {path}: {exc}") from None
    try:
        return loads_bounded(text, path)
    except JsonTooDeepError as exc:
        raise BenchmarkDataError(str(exc)) from None
    except json.JSONDecodeError as exc:
        raise BenchmarkDataError(f"{path}:{exc.lineno}:{exc.colno}: not valid JSON ({exc.msg})") from None


def _first_existing(*candidates: Path) -> Path | None:
    return next((c for c in candidates if c.exists()), None)


def _check_images(images: list[Path], source: Path) -> None:
    missing = [p for p in images if not p.is_file()]
    if missing:
        raise BenchmarkDataError(f"{len(missing)} of {len(images)} images listed in {source} are missing, "
                                 f"e.g. {missing[0]} (is the dataset folder right?)", settings=("root",))


def _need_str(value: Any, where: str, what: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise BenchmarkDataError(f"{where}: {what} must be a non-empty string, got {json.dumps(value)[:60]}")
    return value.strip()


def _build(name: str, split: str | None, items: list[tuple[Path, list[str]]], source: Path,
           tokens: int, check_images: bool) -> EvalSet:
    if not items:
        raise BenchmarkDataError(f"{source} has no images in split {split!r}")
    images = [p for p, _ in items]
    if check_images:
        _check_images(images, source)
    texts, owner = [], []
    for i, (_, caps) in enumerate(items):
        texts += caps
        owner += [i] * len(caps)
    return EvalSet(name, split, images, texts, owner, tokens, str(source))


# -- Karpathy-style JSON (Flickr30k, COCO) -----------------------------------------
def load_karpathy(
    path: Path, image_root: Path, split: str = "test", *, name: str = "coco",
    captions_per_image: int = CAPTIONS_PER_IMAGE, check_images: bool = True,
) -> EvalSet:
    """dataset_coco.json / dataset_flickr30k.json: {"images": [{"filename", "filepath"?,
    "split", "sentences": [{"raw"}]}]}. Images at image_root/filepath/filename."""
    path = Path(path)
    doc = _read_json(path)
    entries = doc.get("images") if isinstance(doc, dict) else None
    if not isinstance(entries, list):
        raise BenchmarkDataError(f"{path}: expected an object with an 'images' list (Karpathy split format)")
    items: list[tuple[Path, list[str]]] = []
    for k, e in enumerate(entries):
        where = f"{path}: images[{k}]"
        if not isinstance(e, dict):
            raise BenchmarkDataError(f"{where}: expected an object")
        # Karpathy's COCO file puts the 5k-image "restval" images in train; only the named split counts.
        if e.get("split") != split:
            continue
        fname = _need_str(e.get("filename"), where, "filename")
        sub = e.get("filepath") or ""
        sents = e.get("sentences")
        if not isinstance(sents, list) or not sents:
            raise BenchmarkDataError(f"{where} ({fname}): 'sentences' must be a non-empty list")
        caps = []
        for j, s in enumerate(sents):
            raw = s.get("raw") if isinstance(s, dict) else None
            caps.append(_need_str(raw, f"{where}.sentences[{j}]", "raw"))
        items.append((Path(image_root) / sub / fname, caps[:captions_per_image]))
    return _build(name, split, items, path, DEFAULT_TOKENS.get(name, 77), check_images)


# -- COCO captions JSON -------------------------------------------------------------
def load_coco_captions(
    path: Path, image_dir: Path, *, name: str = "coco", split: str | None = None,
    captions_per_image: int = CAPTIONS_PER_IMAGE, check_images: bool = True,
) -> EvalSet:
    """captions_*.json: {"images": [{"id", "file_name"}], "annotations": [{"image_id", "caption"}]}.
    Images in image_dir/file_name; captions in annotation-id order, the first 5 kept."""
    path = Path(path)
    doc = _read_json(path)
    if not isinstance(doc, dict) or not isinstance(doc.get("images"), list) \
            or not isinstance(doc.get("annotations"), list):
        raise BenchmarkDataError(f"{path}: expected 'images' and 'annotations' lists (COCO captions format)")
    order: list[Any] = []
    files: dict[Any, str] = {}
    for k, im in enumerate(doc["images"]):
        where = f"{path}: images[{k}]"
        if not isinstance(im, dict) or "id" not in im:
            raise BenchmarkDataError(f"{where}: expected an object with an 'id'")
        if im["id"] in files:
            raise BenchmarkDataError(f"{where}: duplicate image id {im['id']}")
        files[im["id"]] = _need_str(im.get("file_name"), where, "file_name")
        order.append(im["id"])
    caps: dict[Any, list[tuple[Any, str]]] = {i: [] for i in order}
    for k, a in enumerate(doc["annotations"]):
        where = f"{path}: annotations[{k}]"
        if not isinstance(a, dict) or a.get("image_id") not in files:
            raise BenchmarkDataError(f"{where}: image_id {a.get('image_id') if isinstance(a, dict) else a!r} "
                                     "is not in 'images'")
        caps[a["image_id"]].append((a.get("id", k), _need_str(a.get("caption"), where, "caption")))
    items = []
    for i in order:
        if not caps[i]:
            raise BenchmarkDataError(f"{path}: image {i} ({files[i]}) has no captions")
        pairs = caps[i]
        if all(isinstance(a, int) for a, _ in pairs):
            pairs = sorted(pairs, key=lambda t: t[0])  # annotation ids give a file-order-free order
        texts = [c for _, c in pairs]
        items.append((Path(image_dir) / files[i], texts[:captions_per_image]))
    return _build(name, split, items, path, DEFAULT_TOKENS.get(name, 77), check_images)


def load_flickr30k(root: Path, split: str = "test", *, annotations: Path | None = None,
                   images: Path | None = None, check_images: bool = True) -> EvalSet:
    """root/dataset_flickr30k.json (Karpathy) with images in root/flickr30k-images, root/images
    or root; or a COCO-captions-format file given as `annotations`."""
    root = Path(root)
    ann = annotations or _first_existing(root / "dataset_flickr30k.json", root / "dataset_flickr.json")
    if ann is None:
        raise BenchmarkDataError(f"no dataset_flickr30k.json in {root} (name the annotation file)", settings=("annotations",))
    image_root = images or _first_existing(root / "flickr30k-images", root / "images", root / "Images") or root
    if _is_coco_captions(ann):
        return load_coco_captions(ann, image_root, name="flickr30k", split=split, check_images=check_images)
    return load_karpathy(ann, image_root, split, name="flickr30k", check_images=check_images)


def _is_coco_captions(path: Path) -> bool:
    doc = _read_json(path)
    return isinstance(doc, dict) and "annotations" in doc


def load_coco(root: Path, split: str = "test", *, annotations: Path | None = None,
              images: Path | None = None, check_images: bool = True) -> EvalSet:
    """root/dataset_coco.json (Karpathy; images at root/<filepath>/<filename>, e.g. val2014/),
    else root/annotations/captions_<split>*.json (COCO captions; images in root/images,
    root/<split>2014, root/<split>2017 or root/<split>)."""
    root = Path(root)
    ann = annotations
    if ann is None:
        karpathy = root / "dataset_coco.json"
        if karpathy.is_file():
            return load_karpathy(karpathy, images or root, split, name="coco", check_images=check_images)
        found = sorted((root / "annotations").glob(f"captions_{split}*.json"))
        if not found:
            raise BenchmarkDataError(f"neither dataset_coco.json nor annotations/captions_{split}*.json in {root}")
        ann = found[0]
    if not _is_coco_captions(ann):
        return load_karpathy(ann, images or root, split, name="coco", check_images=check_images)
    image_dir = images or _first_existing(root / "images", root / f"{split}2014", root / f"{split}2017",
                                          root / split) or root
    return load_coco_captions(ann, image_dir, name="coco", split=split, check_images=check_images)


# -- ShareGPT4V and DOCCI (their layouts: engine.evaluation.public_sets) --------------------------
def _records(stream: SourceStream, limit: int | None = None) -> list[SourceRecord]:
    """The stream's records; the first bad one raises (a benchmark is complete or not at all)."""
    out: list[SourceRecord] = []
    for n, item in enumerate(stream, start=1):
        if isinstance(item, SourceProblem):
            raise BenchmarkDataError(item.format())
        out.append(item)
        if limit and n >= limit:
            break
    return out


def load_sharegpt4v(root: Path, *, annotations: Path | None = None, images: Path | None = None,
                    limit: int | None = None, check_images: bool = True) -> EvalSet:
    """A ShareGPT4V JSON list of {"image": relative path, "conversations": [{"from": "human", ...},
    {"from": "gpt", "value": description}]}; the first gpt turn is the description (newlines
    become spaces). Images relative to `images` (default root, or root/data when that holds
    them). `limit`: the first N entries (Long-CLIP's ShareGPT4V-1k protocol uses the first 1,000)."""
    stream = read_sharegpt4v(Path(root), annotations=annotations, images=images, error=BenchmarkDataError)
    items = [(r.image, [r.description]) for r in _records(stream, limit)]
    return _build("sharegpt4v", None, items, stream.annotations, DEFAULT_TOKENS["sharegpt4v"], check_images)


def load_docci(root: Path, split: str = "test", *, annotations: Path | None = None,
               images: Path | None = None, check_images: bool = True) -> EvalSet:
    """root/docci_descriptions.jsonlines: {"example_id", "image_file", "description", "split"}
    per line; images in root/images."""
    stream = read_docci(Path(root), split, annotations=annotations, images=images, error=BenchmarkDataError)
    items = [(r.image, [r.description]) for r in _records(stream)]
    return _build("docci", split, items, stream.annotations, DEFAULT_TOKENS["docci"], check_images)


# -- SceneWorld (generated) ---------------------------------------------------------
def load_sceneworld(split: str = "long", *, seed: int = 1000, n: int = 1000) -> EvalSet:
    """Generated test scenes (seed ≥ 1000): the 5 positive captions per image (short split) or
    the paragraph (long split). Images are rendered in memory when the set is embedded."""
    from engine.evaluation.sceneworld import SPLITS, embed_scenes, texts_for_split
    from engine.sceneworld import check_eval_seed, generate_scenes

    if split not in SPLITS:
        raise BenchmarkDataError(f"SceneWorld split must be one of {SPLITS}, got {split!r}")
    try:
        check_eval_seed(seed)
    except ValueError as exc:
        raise BenchmarkDataError(str(exc)) from None
    scenes = generate_scenes(seed, 0, n)
    texts, owner = texts_for_split(scenes, split)
    return EvalSet("sceneworld", split, [], texts, owner, 77 if split == "short" else 128,
                   f"sceneworld seed {seed}", embed_images=lambda emb: embed_scenes(emb, seed, n).images,
                   meta={"seed": seed, "n_images": n})


def load_benchmark(name: str, root: Path | None, split: str | None = None, **kw: Any) -> EvalSet:
    """Dispatch by benchmark name (BENCHMARKS); `split` None means the benchmark's default."""
    split = split or DEFAULT_SPLITS.get(name)
    if name == "sceneworld":
        return load_sceneworld(split or "long", seed=kw.get("seed", 1000), n=kw.get("n", 1000))
    if root is None:
        raise BenchmarkDataError(f"benchmark {name} needs its dataset folder", settings=("root",))
    common = {k: kw[k] for k in ("annotations", "images", "check_images") if kw.get(k) is not None}
    if name == "flickr30k":
        return load_flickr30k(root, split or "test", **common)
    if name == "coco":
        return load_coco(root, split or "test", **common)
    if name == "sharegpt4v":
        return load_sharegpt4v(root, limit=kw.get("limit"), **common)
    if name == "docci":
        return load_docci(root, split or "test", **common)
    raise BenchmarkDataError(f"unknown benchmark {name!r}; one of {', '.join(BENCHMARKS)}")
