"""Long-query retrieval on the SceneWorld lexical-shift set (engine/sceneworld/lexical_shift.py).

For each image of a fixed test set (seed 1000, scenes 0..n-1) the query is its paragraph in one
of several wordings: the grammar's own ("grammar"), every vocabulary class shifted to everyday
words ("shift"), the grammar's sentences reordered / merged, shifted and reordered / merged, and
one vocabulary class shifted at a time ("shift:colour", ...). Text-to-image R@1/5/10 and the
median rank of the right image, plus image-to-text R@1, over the same image embeddings.

The text side is any callable that maps a list of texts to L2-normalised vectors in the image
space, so a different text tower (`--text-tower FOLDER`) is measured by the same code: a
sceneworld-mini text-tower folder is loaded over the model's own; an LM text-tower folder (one with
lm_tower.json, engine/models/lm_tower.py) encodes the texts itself (images still come from the
model's vision tower), and its report goes to a section of its own (`lexical-shift-FOLDERNAME`
unless `--section`).

`longlens dev lexical-shift [--n 1000] [--seed 1000] [--text-tower FOLDER] [--section NAME] [--out docs/language-towers.md]`
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from engine import options
from engine.outputs import check_script_output

EncodeTexts = Callable[[Sequence[str]], np.ndarray]

SECTION = "lexical-shift"
MAIN_CONDITIONS = ("grammar", "shift", "reordered", "merged", "shift+reordered", "shift+merged")


def conditions(scenes: Sequence, rng_seed: int = 0, *, per_class: bool = True) -> dict[str, list[str]]:
    """condition -> one paragraph per scene."""
    from engine.sceneworld.lexical_shift import CLASSES, VARIANTS, rewrite_paragraph, shifted_paragraph

    out: dict[str, list[str]] = {"grammar": [s.paragraph.text for s in scenes]}
    for v in VARIANTS:
        out[v] = [shifted_paragraph(s, rng_seed, v).text for s in scenes]
    if per_class:
        for c in CLASSES:
            out[f"shift:{c}"] = [rewrite_paragraph(s, rng_seed, classes=(c,)).text for s in scenes]
    return out


def retrieval(image_emb: np.ndarray, text_emb: np.ndarray) -> dict[str, float]:
    """One text per image, text i belongs to image i."""
    sim = image_emb.astype(np.float32) @ text_emb.astype(np.float32).T  # (N images, N texts)
    n = sim.shape[0]
    own = sim[np.arange(n), np.arange(n)]
    # Ties count against the query (as engine.evaluation.retrieval does).
    rank_t2i = (sim.T >= own[:, None]).sum(axis=1) - 1  # 0 = the right image first
    rank_i2t = (sim >= own[:, None]).sum(axis=1) - 1
    return {
        "t2i_R@1": float((rank_t2i < 1).mean()),
        "t2i_R@5": float((rank_t2i < 5).mean()),
        "t2i_R@10": float((rank_t2i < 10).mean()),
        "t2i_median_rank": float(np.median(rank_t2i + 1)),
        "i2t_R@1": float((rank_i2t < 1).mean()),
    }


def measure(image_emb: np.ndarray, scenes: Sequence, encode_texts: EncodeTexts, *, rng_seed: int = 0,
            per_class: bool = True) -> dict[str, dict[str, float]]:
    """condition -> retrieval numbers, for images (N, D) and their scenes, with any text encoder."""
    if len(scenes) != len(image_emb):
        raise ValueError(f"{len(image_emb)} image embeddings for {len(scenes)} scenes")
    out = {}
    for name, texts in conditions(scenes, rng_seed, per_class=per_class).items():
        out[name] = retrieval(image_emb, np.asarray(encode_texts(texts)))
    return out


def is_lm_tower(folder: Path | None) -> bool:
    """Whether `folder` is an LM text-tower folder (lm_tower.json), not a sceneworld-mini text tower."""
    if folder is None:
        return False
    from engine.models.lm_tower import is_tower_folder

    return is_tower_folder(folder)


def length_sorted(encode: EncodeTexts) -> EncodeTexts:
    """`encode` over texts sorted by length (less padding per batch), results in the input order."""
    def run(texts: Sequence[str]) -> np.ndarray:
        from engine.models.batching import length_order

        texts = list(texts)
        order = length_order([len(t) for t in texts])
        out = np.asarray(encode([texts[i] for i in order]))
        back = np.empty_like(out)
        back[np.asarray(order, dtype=np.int64)] = out
        return back
    return run


def run(model_dir: Path, seed: int, n: int, *, text_tower: Path | None = None, rng_seed: int = 0,
        per_class: bool = True, device: str = "cpu") -> dict:
    from engine.backends.sceneworld_mini.embedder import SceneWorldMiniEmbedder
    from engine.bench.report import machine_description
    from engine.evaluation.sceneworld import embed_scenes

    lm = is_lm_tower(text_tower)
    emb = SceneWorldMiniEmbedder(model_dir, device=device, text_tower_dir=None if lm else text_tower)
    if lm:
        from engine.models.lm_tower import load_tower

        tower = load_tower(text_tower, device)
        if tower.dim != emb.dim:
            raise ValueError(f"the LM text tower in {text_tower} projects to {tower.dim} dimensions, the model's "
                             f"image embeddings have {emb.dim}")
        encode: EncodeTexts = length_sorted(lambda texts: tower.encode(list(texts)))
        text_model, max_tokens = f"{emb.model_id} images + LM tower {tower.cfg.name or text_tower.name}", tower.cfg.max_tokens
    else:
        encode = lambda texts: emb.encode_texts(list(texts))  # noqa: E731
        text_model, max_tokens = emb.text_model_id, emb.default_text_tokens
    t = time.perf_counter()
    data = embed_scenes(emb, seed, n)
    image_s = time.perf_counter() - t
    t = time.perf_counter()
    results = measure(data.images, data.scenes, encode, rng_seed=rng_seed, per_class=per_class)
    return {"benchmark": "sceneworld-lexical-shift", "seed": seed, "n": n, "rng_seed": rng_seed,
            "model_dir": str(model_dir), "text_tower": str(text_tower) if text_tower else None,
            "text_tower_kind": "lm" if lm else ("sceneworld-mini" if text_tower else None),
            "text_model": text_model, "max_tokens": max_tokens,
            "image_embed_s": round(image_s, 1), "text_s": round(time.perf_counter() - t, 1),
            "machine": machine_description(), "results": results}


def _row(name: str, r: dict[str, float]) -> str:
    return (f"| {name} | {r['t2i_R@1']:.3f} | {r['t2i_R@5']:.3f} | {r['t2i_R@10']:.3f} | "
            f"{r['t2i_median_rank']:g} | {r['i2t_R@1']:.3f} |")


def render(m: dict, command: str) -> str:
    res = m["results"]
    mach = m["machine"]
    lines = [
        f"Measured by `{command}` on {m['n']} generated test scenes (seed {m['seed']}, rewrite seed "
        f"{m['rng_seed']}), text tower `{m['text_model']}` at {m['max_tokens']} tokens, on {mach.get('cores')} CPU "
        f"cores ({mach.get('cpu')}; torch threads {mach.get('torch_threads', '?')}): images {m['image_embed_s']} s, "
        f"all texts {m['text_s']} s. One paragraph per image; chance R@1 = {1 / m['n']:.4f}. "
        "SceneWorld synthetic pictures, not real photos.",
        "",
        "| query wording | T2I R@1 | T2I R@5 | T2I R@10 | T2I median rank | I2T R@1 |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    labels = {"grammar": "(a) the grammar's own paragraph", "shift": "(b) lexical shift (every class)",
              "reordered": "(c) grammar words, sentences reordered",
              "merged": "(d) grammar words, sentences merged in pairs",
              "shift+reordered": "(b)+(c) shifted and reordered", "shift+merged": "(b)+(d) shifted and merged"}
    for k in MAIN_CONDITIONS:
        if k in res:
            lines.append(_row(labels[k], res[k]))
    per = [k for k in res if k.startswith("shift:")]
    if per:
        lines += ["", "One vocabulary class shifted at a time (everything else in the grammar's words):", "",
                  "| shifted class | T2I R@1 | T2I R@5 | T2I R@10 | T2I median rank | I2T R@1 |",
                  "|---|---:|---:|---:|---:|---:|"]
        lines += [_row(k.split(":", 1)[1], res[k]) for k in per]
    return "\n".join(lines) + "\n"


COMPARE_SECTION = "lexical-shift-compare"


def read_measurement(path: Path) -> dict:
    """A `--json-out` file of this command, checked enough to be compared."""
    from engine.jsonfile import read_json_file
    from engine.limits import MAX_SMALL_JSON_BYTES

    try:
        m = read_json_file(Path(path), max_bytes=MAX_SMALL_JSON_BYTES)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: not a lexical-shift measurement ({exc})") from None
    if not isinstance(m, dict) or m.get("benchmark") != "sceneworld-lexical-shift" or not isinstance(m.get("results"), dict):
        raise ValueError(f"{path}: not a lexical-shift measurement (no 'sceneworld-lexical-shift' results)")
    return m


def render_comparison(named: Sequence[tuple[str, dict]]) -> str:
    """Text-to-image R@1 of several measurements side by side, one row per condition; only
    measurements of the same test scenes and rewrites are compared."""
    first = named[0][1]
    for name, m in named[1:]:
        if (m["seed"], m["n"], m["rng_seed"]) != (first["seed"], first["n"], first["rng_seed"]):
            raise ValueError(f"{name} was measured on other scenes (seed {m['seed']}, n {m['n']}, rewrite seed "
                             f"{m['rng_seed']}) than {named[0][0]}")
    conds = [k for k in (*MAIN_CONDITIONS, *[c for c in first["results"] if c.startswith("shift:")])
             if all(k in m["results"] for _, m in named)]
    labels = {"grammar": "(a) grammar", "shift": "(b) lexical shift", "reordered": "(c) reordered",
              "merged": "(d) merged", "shift+reordered": "(b)+(c)", "shift+merged": "(b)+(d)"}
    lines = [f"Text-to-image R@1 on {first['n']} test scenes (seed {first['seed']}, rewrite seed {first['rng_seed']}); "
             "SceneWorld synthetic pictures, not real photos.", "",
             "| query wording | " + " | ".join(name for name, _ in named) + " |",
             "|---|" + "---:|" * len(named)]
    for k in conds:
        label = labels.get(k, k.replace("shift:", "shift: "))
        lines.append(f"| {label} | " + " | ".join(f"{m['results'][k]['t2i_R@1']:.3f}" for _, m in named) + " |")
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="longlens dev lexical-shift",
                                 description="Long-query retrieval on the SceneWorld lexical-shift set.")
    ap.add_argument("--model-dir", type=Path, default=None, help="default: the bundled sceneworld-mini")
    ap.add_argument("--text-tower", type=Path, default=None,
                    help="a text-tower folder to load over the model's own (default: the model's text tower)")
    ap.add_argument("--seed", type=options.SEED, default=1000, help="SceneWorld test seed (>= 1000)")
    ap.add_argument("--n", type=options.SCENES, default=1000, help="test scenes (default 1000)")
    ap.add_argument("--rng-seed", type=options.SEED, default=0, help="seed of the rewrites (default 0)")
    ap.add_argument("--no-per-class", action="store_true", help="skip the one-class-at-a-time conditions")
    ap.add_argument("--out", type=Path, help="Markdown file whose 'lexical-shift' section is (re)written")
    ap.add_argument("--section", default=None,
                    help="the section of --out to (re)write (default 'lexical-shift'; for an LM text tower "
                         "'lexical-shift-FOLDERNAME', so the baseline section stays)")
    ap.add_argument("--json-out", type=Path, help="write the measurement as JSON here")
    ap.add_argument("--compare", nargs="+", metavar="NAME=JSON",
                    help="measure nothing: put earlier --json-out files side by side (T2I R@1 per condition) in the "
                         f"'{COMPARE_SECTION}' section of --out (or --section)")
    return ap


def section_name(section: str | None, text_tower: Path | None) -> str:
    if section:
        return section
    if is_lm_tower(text_tower):
        return f"{SECTION}-{Path(text_tower).resolve().name}"
    return SECTION


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    inputs = [p for p in (args.model_dir, args.text_tower) if p]
    for out in (args.out, args.json_out):
        check_script_output(parser, out, what="report", inputs=inputs)
    if args.compare:
        return _compare(parser, args)
    from engine.sceneworld import check_eval_seed

    try:
        check_eval_seed(args.seed)
    except ValueError as exc:
        parser.error(str(exc))
    from engine.models.registry import bundled_model_dir

    model_dir = args.model_dir or bundled_model_dir("sceneworld-mini")
    m = run(model_dir, args.seed, args.n, text_tower=args.text_tower, rng_seed=args.rng_seed,
            per_class=not args.no_per_class)
    command = "longlens dev lexical-shift" + (f" --n {args.n}" if args.n != 1000 else "") + (
        f" --seed {args.seed}" if args.seed != 1000 else "") + (
        f" --text-tower {args.text_tower}" if args.text_tower else "") + (
        " --no-per-class" if args.no_per_class else "")
    text = render(m, command)
    if args.out:
        from engine.bench.report import update_section

        update_section(args.out, section_name(args.section, args.text_tower), text)
    if args.json_out:
        from engine.fileutil import atomic_write_text

        atomic_write_text(args.json_out, json.dumps(m, indent=2) + "\n")
    print(text)
    return 0


def _compare(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    named = []
    for item in args.compare:
        name, sep, path = item.rpartition("=")
        if not sep or not name or not path:
            parser.error(f"{item!r}: give NAME=JSON")
        try:
            named.append((name, read_measurement(Path(path))))
        except ValueError as exc:
            parser.error(str(exc))
    try:
        text = render_comparison(named)
    except ValueError as exc:
        parser.error(str(exc))
    if args.out:
        from engine.bench.report import update_section

        update_section(args.out, args.section or COMPARE_SECTION, text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
