"""Image-encode throughput: the naive sequential pipeline against Longlens' fast path, same run.

naive  = for each file: full decode, one bicubic resize of the full picture, transformers'
         eager float32 forward at batch 1 (compute="reference").
fast   = what `longlens index` does: the Indexer (hash, draft-mode decode and preprocessing in
         a thread pool overlapping the model, catalog commit, index update) with the
         registry's compute="fast" embedder.

Stages (decode / preprocess / model) are also timed one after the other for both, so the
report shows where the time goes. Models are BLIP architectures with random weights (speed
does not depend on weight values); files are real JPEGs written for the run.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

Log = Callable[[str], None]


# ---------------------------------------------------------------------- files


def write_camera_jpegs(folder: Path, n: int, size: tuple[int, int], *, seed: int = 0) -> list[Path]:
    """n camera-size JPEGs (quality 90) with natural-image-like content: SceneWorld renders
    upscaled to `size`, plus fine luminance grain and a low-frequency shading field, so the
    JPEG coder has real detail to encode (files of ~1.5-3 bits per pixel)."""
    from engine.sceneworld import generate_scene
    from engine.sceneworld.render import render_scene

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    w, h = size
    out = []
    for i in range(n):
        image, _ = render_scene(generate_scene(1000, 500 + i), 512)
        big = np.asarray(image.resize((w, h), Image.Resampling.BICUBIC), dtype=np.int16)
        shade = rng.normal(0.0, 18.0, (h // 64 + 1, w // 64 + 1)).astype(np.float32)
        shade_img = Image.fromarray(shade, mode="F").resize((w, h), Image.Resampling.BICUBIC)
        grain = rng.integers(-9, 10, (h, w), dtype=np.int16)
        big += (np.asarray(shade_img).astype(np.int16) + grain)[..., None]
        path = folder / f"camera_{i:04d}.jpg"
        Image.fromarray(np.clip(big, 0, 255).astype(np.uint8)).save(path, "JPEG", quality=90)
        out.append(path)
    return out


def write_sceneworld_jpegs(folder: Path, n: int, size: int, *, seed: int = 1000) -> list[Path]:
    from engine.sceneworld.export import write_collection

    return sorted(write_collection(folder, seed, n, size=size, fmt="jpeg"))


# ---------------------------------------------------------------------- measurement


def naive_encode(paths: Sequence[Path], embedder: Any) -> dict[str, Any]:
    """Full decode, one resize, eager float32 at batch 1, strictly one after the other."""
    decode = preprocess = model = 0.0
    vectors = []
    t_all = time.perf_counter()
    for path in paths:
        t0 = time.perf_counter()
        with Image.open(path) as im:
            rgb = im.convert("RGB")  # full-resolution decode
        t1 = time.perf_counter()
        pixels = embedder.preprocess([rgb])  # bicubic resize of the full picture + normalise
        t2 = time.perf_counter()
        vectors.append(embedder.encode_pixels(pixels)[0])
        t3 = time.perf_counter()
        decode, preprocess, model = decode + t1 - t0, preprocess + t2 - t1, model + t3 - t2
    wall = time.perf_counter() - t_all
    n = len(paths)
    return {
        "images": n,
        "images_per_s": n / wall,
        "stage_ms_per_image": {"decode": 1000 * decode / n, "preprocess": 1000 * preprocess / n,
                               "model": 1000 * model / n},
        "vectors": np.stack(vectors),
    }


def fast_stages(paths: Sequence[Path], embedder: Any, batch_size: int) -> dict[str, Any]:
    """The fast path's stages timed one after the other (draft decode, preprocess, batched model)."""
    from engine.indexing.decode import decode_image

    t0 = time.perf_counter()
    images = [decode_image(p, target_size=embedder.image_size)[0] for p in paths]
    t1 = time.perf_counter()
    pixels = embedder.preprocess(images)
    t2 = time.perf_counter()
    vectors = [embedder.encode_pixels(pixels[s : s + batch_size]) for s in range(0, len(pixels), batch_size)]
    t3 = time.perf_counter()
    n = len(paths)
    return {
        "images": n,
        "batch_size": batch_size,
        "sequential_images_per_s": n / (t3 - t0),
        "stage_ms_per_image": {"decode": 1000 * (t1 - t0) / n, "preprocess": 1000 * (t2 - t1) / n,
                               "model": 1000 * (t3 - t2) / n},
        "vectors": np.concatenate(vectors),
    }


def fast_end_to_end(folder: Path, embedder: Any, home: Path, batch_size: int) -> dict[str, Any]:
    """`longlens index` on the folder (fresh catalog): files -> catalog + ANN index."""
    from engine.config import get_paths
    from engine.jobs import run_to_end
    from engine.services import Services

    paths = get_paths(home).ensure()
    with Services(paths) as svc:
        indexer = svc.indexer(embedder, batch_size=batch_size)
        t = time.perf_counter()
        last = run_to_end(indexer.run(folder))
        wall = time.perf_counter() - t
    summary = last.extra["summary"]
    if summary.embedded != summary.scanned or summary.unreadable:
        raise RuntimeError(f"benchmark indexing did not embed every file: {summary.as_dict()}")
    return {"images": summary.embedded, "images_per_s": summary.embedded / wall, "wall_s": wall,
            "batch_size": batch_size}


def model_only(embedder: Any, batch_sizes: Sequence[int], n: int) -> dict[str, float]:
    """images/s of encode_pixels on random pixels at each batch size (after one warm-up call)."""
    rng = np.random.default_rng(0)
    size = embedder.image_size
    pixels = rng.standard_normal((n, 3, size, size)).astype(np.float32)
    saved = embedder.batch_size
    out = {}
    try:
        embedder.encode_pixels(pixels[:1])
        for b in batch_sizes:
            embedder.batch_size = b
            t = time.perf_counter()
            embedder.encode_pixels(pixels[: max(b, n - n % b)])
            out[str(b)] = max(b, n - n % b) / (time.perf_counter() - t)
    finally:
        embedder.batch_size = saved
    return out


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.einsum("ij,ij->i", a, b)


def top_k_overlap(ref: np.ndarray, fast: np.ndarray, queries_ref: np.ndarray, queries_fast: np.ndarray,
                  k: int) -> float:
    """Mean |top-k(ref) ∩ top-k(fast)| / k over the queries (each side ranks its own vectors)."""
    k = min(k, len(ref))
    overlaps = []
    for qr, qf in zip(queries_ref, queries_fast, strict=True):
        a = set(np.argsort(-(ref @ qr), kind="stable")[:k].tolist())
        b = set(np.argsort(-(fast @ qf), kind="stable")[:k].tolist())
        overlaps.append(len(a & b) / k)
    return float(np.mean(overlaps))


def run(
    *,
    checkpoint: Path,
    work: Path,
    camera_n: int,
    camera_size: tuple[int, int],
    sceneworld_n: int,
    batch_size: int,
    log: Log,
) -> dict[str, Any]:
    from engine.backends.blip.embedder import BlipEmbedder
    from engine.sceneworld import generate_scene

    reference = BlipEmbedder(checkpoint, device="cpu", compute="reference")
    reference.batch_size = 1
    fast = BlipEmbedder(checkpoint, device="cpu", compute="fast")
    result: dict[str, Any] = {
        "baseline": "naive: full decode + one bicubic resize + eager float32 (transformers) at batch 1",
        "fast": f"Indexer end to end, draft-mode decode in a 2-thread pool overlapping the model, "
                f"compute='fast' ({fast.compute_dtype} towers, SDPA), batch {batch_size}",
        "fast_compute_dtype": fast.compute_dtype,
    }
    sets = {
        "camera": (work / "camera", lambda f: write_camera_jpegs(f, camera_n, camera_size)),
        "sceneworld": (work / "sceneworld", lambda f: write_sceneworld_jpegs(f, sceneworld_n, 384)),
    }
    for name, (folder, make) in sets.items():
        log(f"encode/{name}: writing files")
        files = make(folder)
        sizes = {Image.open(files[0]).size}
        log(f"encode/{name}: naive pipeline on {len(files)} files")
        naive = naive_encode(files, reference)
        log(f"encode/{name}: fast stages")
        stages = fast_stages(files, fast, batch_size)
        log(f"encode/{name}: fast end to end (Indexer)")
        e2e = fast_end_to_end(folder, fast, work / f"home-{name}", batch_size)
        cos = _cosines(stages["vectors"], naive["vectors"])
        result[name] = {
            "files": len(files),
            "file_size": "x".join(str(v) for v in sizes.pop()),
            "mean_file_bytes": int(np.mean([f.stat().st_size for f in files])),
            "naive": {k: v for k, v in naive.items() if k != "vectors"},
            "fast_stages": {k: v for k, v in stages.items() if k != "vectors"},
            "fast_end_to_end": e2e,
            "speedup_end_to_end_vs_naive": e2e["images_per_s"] / naive["images_per_s"],
            "cosine_fast_vs_naive": {"min": float(cos.min()), "mean": float(cos.mean())},
        }
        if name == "sceneworld":
            k = min(10, len(files) - 1)
            texts = [generate_scene(1000, i).paragraph.text for i in range(len(files))]
            t_ref, t_fast = reference.encode_texts(texts), fast.encode_texts(texts)
            result[name]["top10_overlap"] = {
                "k": k,
                "image_to_image": top_k_overlap(naive["vectors"], stages["vectors"], naive["vectors"],
                                                stages["vectors"], k),
                "text_to_image": top_k_overlap(naive["vectors"], stages["vectors"], t_ref, t_fast, k),
                "text_cosine_min": float(_cosines(t_ref, t_fast).min()),
            }
        log(f"encode/{name}: naive {naive['images_per_s']:.2f} img/s, fast {e2e['images_per_s']:.2f} img/s")
    log("encode: model-only batch sweep")
    n = max(8, batch_size)
    result["model_only_images_per_s"] = {
        "reference_fp32_eager": model_only(reference, (1, batch_size), n),
        "fast": model_only(fast, (1, batch_size), n),
    }
    return result
