"""Benchmark loaders on real on-disk layouts (written by engine.sceneworld.export), clear errors for
bad input, and the harness: recall, token budgets, truncation analysis and reports."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from engine.evaluation.harness import (
    build_report,
    embed_images,
    evaluate_set,
    render_markdown,
    truncation_analysis,
    write_report,
)
from engine.evaluation.loaders import (
    BenchmarkDataError,
    EvalSet,
    load_benchmark,
    load_coco,
    load_docci,
    load_flickr30k,
    load_sceneworld,
    load_sharegpt4v,
)
from engine.sceneworld import generate_scene
from engine.sceneworld.export import write_coco_layout, write_docci_layout


@pytest.fixture(scope="module")
def coco_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("coco")
    write_coco_layout(root, seed=1001, n=5, size=48)
    return root


@pytest.fixture(scope="module")
def docci_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("docci")
    write_docci_layout(root, seed=1002, n=6, size=48)
    return root


def _copy(src: Path, dest: Path) -> Path:
    shutil.copytree(src, dest)
    return dest


def test_coco_karpathy_and_captions_json_give_the_same_set(coco_root, tmp_path):
    karpathy = load_coco(coco_root)  # dataset_coco.json wins when present
    assert karpathy.name == "coco" and karpathy.split == "test" and karpathy.default_tokens == 77
    assert len(karpathy.images) == 5 and len(karpathy.texts) == 25
    assert karpathy.owner == [i for i in range(5) for _ in range(5)]
    assert karpathy.texts[:5] == [t.text for t in generate_scene(1001, 0).positives]
    assert karpathy.images[3] == coco_root / "images" / "scene_1001_00003.jpg"

    root = _copy(coco_root, tmp_path / "coco")
    (root / "dataset_coco.json").unlink()
    captions = load_coco(root)  # annotations/captions_test.json
    assert captions.texts == karpathy.texts and captions.owner == karpathy.owner
    assert [p.name for p in captions.images] == [p.name for p in karpathy.images]


def test_only_the_first_five_captions_count_and_other_splits_are_left_out(coco_root, tmp_path):
    root = _copy(coco_root, tmp_path / "coco")
    ann = root / "annotations" / "captions_test.json"
    doc = json.loads(ann.read_text())
    doc["annotations"].insert(0, {"id": 999, "image_id": 2, "caption": "a sixth caption"})
    ann.write_text(json.dumps(doc))
    kp = json.loads((root / "dataset_coco.json").read_text())
    kp["images"][4]["split"] = "train"
    (root / "dataset_coco.json").write_text(json.dumps(kp))

    caps = load_coco(root, annotations=ann)
    assert "a sixth caption" not in caps.texts  # id 999 sorts last; the first 5 by id are kept
    assert caps.owner.count(2) == 5
    assert len(load_coco(root).images) == 4  # the Karpathy file's train image is not in test


def test_flickr30k_karpathy_layout(coco_root, tmp_path):
    root = tmp_path / "flickr"
    shutil.copytree(coco_root / "images", root / "flickr30k-images")
    kp = json.loads((coco_root / "dataset_coco.json").read_text())
    for im in kp["images"]:
        del im["filepath"]  # Flickr30k's Karpathy file has no filepath
    (root / "dataset_flickr30k.json").write_text(json.dumps({"dataset": "flickr30k", "images": kp["images"]}))
    fl = load_flickr30k(root)
    assert fl.name == "flickr30k" and len(fl.images) == 5 and len(fl.texts) == 25
    assert all(p.parent == root / "flickr30k-images" and p.is_file() for p in fl.images)


def test_docci_jsonlines(docci_root, tmp_path):
    d = load_docci(docci_root)
    assert d.default_tokens == 128 and len(d.images) == 6 and d.owner == list(range(6))
    assert d.texts[2] == generate_scene(1002, 2).paragraph.text
    root = _copy(docci_root, tmp_path / "docci")
    ann = root / "docci_descriptions.jsonlines"
    lines = ann.read_text().splitlines()
    lines.append(json.dumps({"example_id": "x", "image_file": "scene_1002_00000.jpg",
                             "description": "train only", "split": "train"}))
    ann.write_text("\n".join(lines) + "\n")
    assert len(load_docci(root).texts) == 6 and load_docci(root, "train").texts == ["train only"]
    lines.insert(2, '{"example_id": "broken", "image_file": 12, "split": "test"}')
    ann.write_text("\n".join(lines) + "\n")
    with pytest.raises(BenchmarkDataError, match=r"docci_descriptions\.jsonlines:3: image_file: must be"):
        load_docci(root)
    lines[2] = "{not json"
    ann.write_text("\n".join(lines) + "\n")
    with pytest.raises(BenchmarkDataError, match=r"jsonlines:3: line: not valid JSON"):
        load_docci(root)


def test_sharegpt4v_conversations(docci_root, tmp_path):
    root = tmp_path / "share"
    shutil.copytree(docci_root / "images", root / "data" / "images")
    names = sorted(p.name for p in (root / "data" / "images").iterdir())
    entries = [{"id": n, "image": f"images/{n}",
                "conversations": [{"from": "human", "value": "<image>\nDescribe the picture."},
                                  {"from": "gpt", "value": f"Picture {i}.\nIt has\n\nthings."}]}
               for i, n in enumerate(names)]
    (root / "share-captioner.json").write_text(json.dumps(entries))
    s = load_sharegpt4v(root)
    assert s.default_tokens == 77 and len(s.images) == 6 and s.images[0] == root / "data" / "images" / names[0]
    assert s.texts[1] == "Picture 1. It has things."  # newlines folded
    assert len(load_sharegpt4v(root, limit=4).texts) == 4
    entries[3]["conversations"] = entries[3]["conversations"][:1]
    (root / "share-captioner.json").write_text(json.dumps(entries))
    with pytest.raises(BenchmarkDataError, match=r"share-captioner\.json:1: \[3\]\.conversations: has no gpt turn"):
        load_sharegpt4v(root)


def test_clear_errors_for_missing_files_and_bad_json(coco_root, tmp_path):
    root = _copy(coco_root, tmp_path / "coco")
    (root / "images" / "scene_1001_00002.jpg").unlink()
    with pytest.raises(BenchmarkDataError, match=r"1 of 5 images listed in .*dataset_coco\.json are missing"):
        load_coco(root)
    (root / "dataset_coco.json").write_text('{"images": [\n  {"filename": }\n]}')
    with pytest.raises(BenchmarkDataError, match=r"dataset_coco\.json:2:\d+: not valid JSON"):
        load_coco(root)
    with pytest.raises(BenchmarkDataError, match="dataset_flickr30k.json"):
        load_flickr30k(tmp_path)
    with pytest.raises(BenchmarkDataError, match="needs its dataset folder"):
        load_benchmark("docci", None)


def test_sceneworld_loader_uses_evaluation_seeds_only():
    s = load_sceneworld("short", seed=1003, n=4)
    assert len(s.texts) == 20 and s.owner[:6] == [0, 0, 0, 0, 0, 1] and s.n_images == 4
    assert s.texts[0] == generate_scene(1003, 0).positives[0].text
    with pytest.raises(BenchmarkDataError, match="1000"):
        load_sceneworld("long", seed=3, n=4)


# -- harness ---------------------------------------------------------------------------------
class WordEmbedder:
    """Sees only the first `max_tokens - 2` words (like [CLS] ... [SEP]); a text's vector is the
    one-hot of the first word 'imgK' it sees, so truncation decides whether it can be matched."""

    model_id = text_model_id = "words"
    dim = 8
    image_size = 16
    max_text_tokens = 512
    default_text_tokens = 128

    def encode_texts(self, texts, max_tokens=None):
        out = np.zeros((len(texts), self.dim), np.float32)
        for i, t in enumerate(texts):
            seen = [w for w in t.split()[: (max_tokens or 128) - 2] if w.startswith("img")]
            out[i, int(seen[0][3:]) if seen else 7] = 1.0
        return out

    def token_count(self, text):
        return len(text.split()) + 2


def _word_set() -> EvalSet:
    texts = [" ".join(["filler"] * 30 + [f"img{i}"]) for i in range(6)]  # the clue is word 31
    return EvalSet("toy", None, [], texts, list(range(6)), 77,
                   embed_images=lambda emb: np.eye(8, dtype=np.float32)[:6], meta={"n_images": 6})


def test_truncation_analysis_moves_only_the_cut():
    emb, s = WordEmbedder(), _word_set()
    rows = truncation_analysis(emb, s, (20, 40))
    assert [r["max_tokens"] for r in rows] == [20, 40]
    assert rows[0]["truncated_texts"] == 1.0 and rows[1]["truncated_texts"] == 0.0
    assert rows[1]["i2t"]["R@1"] == 1.0 and rows[1]["t2i"]["R@1"] == 1.0  # clue visible at 40 tokens
    assert rows[0]["t2i"]["R@1"] < 0.5  # all texts look alike at 20 tokens
    main = evaluate_set(emb, s)
    assert main["max_tokens"] == 77 and main["n_images"] == 6 and main["mean_text_tokens"] == 33.0


def test_reports_json_markdown_and_png(tmp_path):
    from PIL import Image

    emb, s = WordEmbedder(), _word_set()
    img = embed_images(emb, s)
    report = build_report(s, [evaluate_set(emb, s, image_emb=img)],
                          {"words": truncation_analysis(emb, s, (20, 40, 60), image_emb=img)})
    files = write_report(report, tmp_path / "rep")
    assert json.loads(files["json"].read_text())["results"][0]["i2t"]["R@1"] == 1.0
    md = files["markdown"].read_text()
    assert "| words | 77 | 0.0% | 100.0 |" in md and "| model | direction | 20 | 40 | 60 |" in md
    assert "| words | I2T | 0.0 | 100.0 | 100.0 |" in md and "truncation.png" in md
    with Image.open(files["plot"]) as im:
        assert im.format == "PNG" and im.size == (960, 600)
        # Lines were drawn in the first palette colour.
        assert (31, 119, 180) in {c for _, c in im.convert("RGB").getcolors(1 << 16)}
    plain = render_markdown(build_report(s, [evaluate_set(emb, s)]))
    assert plain.count("\n|") == 3 and "Truncation" not in plain  # header, rule, one model


def test_real_files_are_embedded_like_the_embedder_does(docci_root, blip_tiny_checkpoint, one_thread):
    from engine.backends.blip.embedder import BlipEmbedder
    from engine.indexing.decode import decode_image

    emb = BlipEmbedder(blip_tiny_checkpoint, device="cpu")
    s = load_docci(docci_root)
    img = embed_images(emb, s)
    direct = emb.encode_images([decode_image(p, target_size=emb.image_size)[0] for p in s.images])
    np.testing.assert_allclose(img, direct, rtol=1e-5, atol=1e-6)
    res = evaluate_set(emb, s, image_emb=img)
    assert res["max_tokens"] == 128 and res["n_texts"] == 6 and res["image_model"] == emb.model_id
    assert res["t2i"]["R@10"] == 1.0 and 0 <= res["i2t"]["R@1"] <= res["i2t"]["R@5"] <= 1
