"""engine.sceneworld: determinism, vocabulary, truth of every text against the scene graph,
masks against pixels, hard negatives, wording variety, and the on-disk layouts."""

from __future__ import annotations

import hashlib
import io
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from engine.sceneworld import (
    COLOURS,
    EVAL_SEED_MIN,
    Scene,
    check_eval_seed,
    check_train_seed,
    describe_world,
    generate_scene,
    generate_scenes,
    relation_holds,
    render_batch,
    render_scene,
)
from engine.sceneworld import language as lang
from engine.sceneworld.export import (
    PARAGRAPH_SCORE,
    write_coco_layout,
    write_collection,
    write_docci_layout,
    write_training_jsonl,
)
from engine.sceneworld.render import silhouettes
from engine.sceneworld.world import CONTAINER_KINDS, KINDS

N_SAMPLE = 300


@pytest.fixture(scope="module")
def scenes() -> list[Scene]:
    return generate_scenes(7, 0, N_SAMPLE)


# --------------------------------------------------------------------------- helpers


def _png(scene: Scene, size: int) -> bytes:
    buf = io.BytesIO()
    render_scene(scene, size)[0].save(buf, format="PNG")
    return buf.getvalue()


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9'-]+", text.lower())


# Surface form -> (family, value), longest forms first so "polka dots" wins over "dots".
_LEX = sorted(lang.ATTRIBUTE_LEXICON.items(), key=lambda kv: -len(kv[0]))


def parse_np(text: str) -> dict[str, object]:
    """What an object phrase claims, read with the generator's vocabulary only."""
    low = " " + text.lower() + " "
    claims: dict[str, set[str]] = {}
    for surface, (fam, val) in _LEX:
        pat = re.compile(r"(?<![a-z-])" + re.escape(surface) + r"(?![a-z-])")
        if pat.search(low):
            claims.setdefault(fam, set()).add(val)
            low = pat.sub(" # ", low)
    out: dict[str, object] = {f: (claims[f].pop() if len(claims.get(f, ())) == 1 else claims.get(f))
                              for f in ("kind", "colour", "size", "pattern")}
    if "number" in claims:
        out["number"] = int(next(iter(claims["number"])))
    else:
        first = text.lower().split()[0]
        kind = out["kind"]
        plural = isinstance(kind, str) and KINDS[kind].plural != KINDS[kind].noun and \
            re.search(r"\b" + KINDS[kind].plural + r"\b", text.lower()) is not None
        out["number"] = 1 if first in ("a", "an") or not plural else None
    return out


def _all_texts(scene: Scene, with_negatives: bool = True):
    yield "original", scene.original_caption
    for t in scene.positives:
        yield "positive", t
    if with_negatives:
        for t in scene.negatives:
            yield "negative", t
    yield "paragraph", scene.paragraph


def _geo(pred: str, a, b) -> bool:
    """Independent, looser geometry of each relation, from the boxes and draw order."""
    ax0, ay0, ax1, ay1 = a.box_norm
    bx0, by0, bx1, by1 = b.box_norm
    acx, acy, bcx, bcy = (ax0 + ax1) / 2, (ay0 + ay1) / 2, (bx0 + bx1) / 2, (by0 + by1) / 2
    v_overlap = min(ay1, by1) > max(ay0, by0)
    h_overlap = min(ax1, bx1) > max(ax0, bx0)
    if pred == "left_of":
        return acx < bcx - 0.15 and v_overlap
    if pred == "right_of":
        return _geo("left_of", b, a)
    if pred == "above":
        return acy < bcy - 0.15 and h_overlap
    if pred == "below":
        return _geo("above", b, a)
    if pred == "next_to":
        gap = max(bx0 - ax1, ax0 - bx1)
        return abs(acx - bcx) >= 0.15 and v_overlap and gap <= 0.15
    if pred == "in_front_of":
        return v_overlap and h_overlap and a.depth > b.depth
    if pred == "behind":
        return _geo("in_front_of", b, a)
    if pred == "inside":
        inside = bx0 <= ax0 and ax1 <= bx1 and by0 <= ay0 and ay1 <= by1
        return inside and b.kind in CONTAINER_KINDS and a.depth > b.depth
    if pred == "contains":
        return _geo("inside", b, a)
    raise AssertionError(pred)


# --------------------------------------------------------------------------- determinism


def test_same_seed_gives_identical_scene_and_png() -> None:
    a, b = generate_scene(3, 17), generate_scene(3, 17)
    assert a.to_dict() == b.to_dict()
    assert _png(a, 96) == _png(b, 96)
    im, masks = render_scene(a, 96)
    im2, masks2 = render_scene(b, 96)
    assert np.array_equal(np.asarray(im), np.asarray(im2)) and np.array_equal(masks, masks2)


def test_identical_across_processes() -> None:
    code = (
        "import hashlib, io, json\n"
        "from engine.sceneworld import generate_scene, render_scene\n"
        "s = generate_scene(3, 17)\n"
        "buf = io.BytesIO(); render_scene(s, 96)[0].save(buf, format='PNG')\n"
        "print(hashlib.sha256(buf.getvalue()).hexdigest())\n"
        "print(hashlib.sha256(json.dumps(s.to_dict(), sort_keys=True).encode()).hexdigest())\n"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root,
                         env={"PYTHONHASHSEED": "12345", "PATH": ""})
    s = generate_scene(3, 17)
    png_hash = hashlib.sha256(_png(s, 96)).hexdigest()
    text_hash = hashlib.sha256(json.dumps(s.to_dict(), sort_keys=True).encode()).hexdigest()
    assert out.stdout.split() == [png_hash, text_hash]


def test_different_seed_or_index_differs() -> None:
    base = generate_scene(3, 17)
    for other in (generate_scene(4, 17), generate_scene(3, 18)):
        assert _png(other, 96) != _png(base, 96)
        assert other.paragraph.text != base.paragraph.text


def test_negative_seed_rejected() -> None:
    with pytest.raises(ValueError):
        generate_scene(-1, 0)


def test_eval_and_train_seed_checks() -> None:
    assert EVAL_SEED_MIN == 1000
    assert check_eval_seed(1000) == 1000
    with pytest.raises(ValueError, match="training seed"):
        check_eval_seed(999)
    assert check_train_seed(0) == 0
    with pytest.raises(ValueError, match="reserved for evaluation"):
        check_train_seed(1000)


def test_to_dict_is_json_and_round_trips(scenes: list[Scene]) -> None:
    for s in scenes[:30]:
        d = json.loads(json.dumps(s.to_dict()))
        assert Scene.from_dict(d) == s


# --------------------------------------------------------------------------- vocabulary


def test_vocabulary_coverage(scenes: list[Scene]) -> None:
    world = describe_world()
    assert len(world["settings"]) >= 6 and len(world["kinds"]) >= 15 and len(world["colours"]) >= 8
    assert len(world["patterns"]) >= 3
    assert len({s.setting for s in scenes}) >= 6
    assert len({o.kind for s in scenes for o in s.objects}) >= 15
    assert len({o.colour for s in scenes for o in s.objects}) >= 8
    assert {o.pattern for s in scenes for o in s.objects} == set(world["patterns"])
    assert {o.size for s in scenes for o in s.objects} == {"small", "large"}
    counts = Counter(len(s.objects) for s in scenes)
    assert set(counts) == {2, 3, 4, 5, 6}
    # Counted groups, containers and occlusion all occur.
    assert sum(any(c.number > 1 for c in s.counts) for s in scenes) > 30
    assert sum(any(r.predicate == "inside" for r in s.relations) for s in scenes) > 20
    assert sum(any(r.predicate == "in_front_of" for r in s.relations) for s in scenes) > 20


def test_scene_graph_consistency(scenes: list[Scene]) -> None:
    for s in scenes:
        kinds = [c.kind for c in s.counts]
        assert len(kinds) == len(set(kinds)), "one entity per kind keeps every mention unambiguous"
        assert sum(c.number for c in s.counts) == len(s.objects)
        assert sorted(o.depth for o in s.objects) == list(range(len(s.objects)))
        for o in s.objects:
            assert o.colour not in describe_world()["setting_forbidden_colours"][s.setting]
            x0, y0, x1, y1 = o.box_norm
            assert 0 <= x0 < x1 <= 1 and 0 <= y0 < y1 <= 1
            cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
            # Position words: thirds across, halves down, never a coin flip at a boundary.
            assert o.hpos == ("left" if cx < 1 / 3 else "right" if cx > 2 / 3 else "middle")
            assert o.vpos == ("top" if cy < 0.5 else "bottom")
            assert min(abs(cx - 1 / 3), abs(cx - 2 / 3), abs(cy - 0.5)) > 0.02
            assert o.pattern in KINDS[o.kind].patterns
        sizes = {o.size: max(o.box_norm[2] - o.box_norm[0], o.box_norm[3] - o.box_norm[1]) for o in s.objects}
        if len(sizes) == 2:
            assert sizes["large"] > 1.5 * sizes["small"] * 0.9


# --------------------------------------------------------------------------- phrases


def test_phrase_spans_index_the_text(scenes: list[Scene]) -> None:
    n = 0
    for s in scenes:
        for _, t in _all_texts(s):
            for p in t.phrases:
                assert t.text[p.start : p.end] == p.text
                assert p.kind in ("object", "relation", "setting")
                n += 1
            starts = [p.start for p in t.phrases]
            assert starts == sorted(starts)
    assert n > 10 * N_SAMPLE


def test_object_phrases_name_kind_and_colour_of_their_objects(scenes: list[Scene]) -> None:
    checked = 0
    for s in scenes[:150]:
        for _, t in _all_texts(s, with_negatives=False):
            for p in t.phrases:
                if p.kind == "setting":
                    assert p.object_ids == []
                    continue
                if p.kind == "relation":
                    assert len(p.object_ids) == 2 and p.relation in lang.REL_WORDS
                    allowed = lang.REL_WORDS[p.relation] + lang.REL_EXTRA_WORDS.get(p.relation, ())
                    assert p.text.lower() in allowed
                    continue
                assert p.object_ids
                objs = [s.objects[i] for i in p.object_ids]
                words = _words(p.text)
                claim = parse_np(p.text)
                for o in objs:
                    assert KINDS[o.kind].noun in words or KINDS[o.kind].plural in words, (p.text, o.kind)
                    assert o.colour in words, (p.text, o.colour)
                    # Whatever else the phrase states must be true of the object too.
                    assert claim["kind"] == o.kind and claim["colour"] == o.colour
                    assert claim["size"] in (None, o.size), (p.text, o)
                    assert claim["pattern"] in (None, o.pattern), (p.text, o)
                # A phrase about a group refers to the whole group and states its number.
                group = [o.id for o in s.objects if o.kind == objs[0].kind]
                assert sorted(p.object_ids) == group
                assert claim["number"] in (None, len(group)), p.text
                checked += 1
    assert checked > 1500


def test_paragraph_mentions_every_object_with_all_attributes(scenes: list[Scene]) -> None:
    for s in scenes:
        para = s.paragraph
        assert 3 <= len(para.sentences) <= 6
        # Sentences tile the text: consecutive, single-spaced, each ending with a full stop.
        assert para.sentences[0].start == 0 and para.sentences[-1].end == len(para.text)
        for a, b in zip(para.sentences, para.sentences[1:], strict=False):
            assert b.start == a.end + 1 and para.text[a.end] == " "
        for sp in para.sentences:
            sent = para.text[sp.start : sp.end]
            assert sent.endswith(".") and sent[0].isupper() and sent.count(". ") == 0
        obj_phrases = [p for p in para.phrases if p.kind == "object"]
        mentioned = {i for p in obj_phrases for i in p.object_ids}
        assert mentioned == {o.id for o in s.objects}
        # The first mention of each object gives kind, colour, size and pattern.
        for o in s.objects:
            first = next(p for p in obj_phrases if o.id in p.object_ids)
            claim = parse_np(first.text)
            assert (claim["kind"], claim["colour"], claim["size"], claim["pattern"]) == (
                o.kind, o.colour, o.size, o.pattern), first.text
            assert claim["number"] == len(first.object_ids)
        assert any(p.kind == "setting" for p in para.phrases)


def test_positive_captions(scenes: list[Scene]) -> None:
    for s in scenes:
        assert len(s.positives) == 5 and len({t.text for t in s.positives}) == 5
        for t in s.positives:
            assert 6 <= len(_words(t.text)) <= 20, t.text
            assert "." not in t.text
            assert any(p.kind == "object" for p in t.phrases)
        assert len(_words(s.original_caption.text)) <= 12
        assert [p.kind for p in s.original_caption.phrases].count("object") == 1


def test_stated_relations_hold(scenes: list[Scene]) -> None:
    seen: Counter[str] = Counter()
    for s in scenes:
        full, visible = silhouettes(s.objects, 64)
        stored = {(r.subject, r.predicate, r.object) for r in s.relations}
        for _, t in _all_texts(s, with_negatives=False):
            for p in t.phrases:
                if p.kind != "relation":
                    continue
                a, b = (s.objects[i] for i in p.object_ids)
                assert (a.id, p.relation, b.id) in stored
                assert relation_holds(p.relation, a, b)
                assert _geo(p.relation, a, b), (p.text, a, b)
                if p.relation in ("in_front_of", "behind"):
                    front, back = (a, b) if p.relation == "in_front_of" else (b, a)
                    # Pixels of the back figure really are covered by the front one.
                    assert (full[back.id] & visible[front.id]).sum() > 0
                seen[p.relation] += 1
    assert set(seen) == {"left_of", "right_of", "above", "below", "next_to", "in_front_of", "behind",
                         "inside", "contains"}


def _position_claims(text: str) -> list[tuple[str, tuple[str, ...]]]:
    """(expression, what it asserts) for every position expression, longest first."""
    forms: list[tuple[str, tuple[str, ...]]] = []
    for (h, v), words in lang.POSITION_WORDS.items():
        forms += [(w, ("hv", h, v)) for w in words]
    for h, words in lang.H_POSITION_WORDS.items():
        forms += [(w, ("h", h)) for w in words]
    for v, words in lang.ROW_WORDS.items():
        forms += [(w, ("row", v)) for w in words]
    forms.sort(key=lambda f: -len(f[0]))
    low = text.lower()
    found = []
    for w, claim in forms:
        pat = re.compile(r"(?<![a-z-])" + re.escape(w) + r"(?![a-z-])")
        if pat.search(low):
            found.append((w, claim))
            low = pat.sub(" # ", low)
    return found


def test_stated_positions_hold(scenes: list[Scene]) -> None:
    n = 0
    for s in scenes:
        texts = [(s.paragraph.text, s.paragraph.phrases, s.paragraph.sentences)]
        texts += [(t.text, t.phrases, None) for t in s.positives]
        for text, phrases, sentences in texts:
            spans = [(sp.start, sp.end) for sp in sentences] if sentences else [(0, len(text))]
            for a, b in spans:
                local = [p for p in phrases if a <= p.start < b]
                # Blank out phrases: "on the right of" inside a relation is not a position.
                chars = list(text[a:b])
                for p in local:
                    chars[p.start - a : p.end - a] = "#" * (p.end - p.start)
                objs = [s.objects[i] for p in local if p.kind == "object" for i in p.object_ids]
                for expr, claim in _position_claims("".join(chars)):
                    if claim[0] == "hv":
                        ok = any((o.hpos, o.vpos) == claim[1:] for o in objs)
                    elif claim[0] == "h":
                        ok = any(o.hpos == claim[1] for o in objs)
                    else:
                        groups = [[o for o in s.objects if o.kind == k.kind] for k in s.counts if k.number > 1]
                        ok = any(all(o.vpos == claim[1] for o in g) for g in groups)
                    assert ok, (expr, text[a:b])
                    n += 1
    assert n > 3 * N_SAMPLE


# --------------------------------------------------------------------------- negatives


def _skeleton(t) -> str:
    out, last = [], 0
    for p in t.phrases:
        out += [t.text[last : p.start], f"<{p.kind}>"]
        last = p.end
    return "".join(out + [t.text[last:]])


def test_negatives_differ_in_exactly_one_false_detail(scenes: list[Scene]) -> None:
    types: Counter[str] = Counter()
    for s in scenes:
        assert len(s.negatives) == 5
        present = {o.kind for o in s.objects}
        positives = {t.text for t in s.positives}
        for neg in s.negatives:
            assert neg.error_type in ("attribute", "relation", "count", "object")
            types[neg.error_type] += 1
            assert neg.text not in positives
            src = s.positives[neg.source_index]
            # Same words outside the phrases, same phrase structure, one phrase changed.
            assert _skeleton(neg) == _skeleton(src)
            assert [(p.kind, p.object_ids) for p in neg.phrases] == [(p.kind, p.object_ids) for p in src.phrases]
            changed = [(p, q) for p, q in zip(src.phrases, neg.phrases, strict=True) if p.text != q.text]
            assert len(changed) == 1, (src.text, neg.text)
            old, new = changed[0]
            if neg.error_type == "relation":
                assert new.kind == "relation" and new.relation != old.relation
                a, b = (s.objects[i] for i in new.object_ids)
                assert not relation_holds(new.relation, a, b), (neg.text, neg.detail)
                if new.relation == {"left_of": "right_of", "right_of": "left_of", "above": "below",
                                    "below": "above", "in_front_of": "behind", "behind": "in_front_of"
                                    }.get(old.relation):
                    assert not _geo(new.relation, a, b)
                continue
            assert new.kind == "object"
            was, now = parse_np(old.text), parse_np(new.text)
            diff = {k for k in ("kind", "colour", "size", "pattern", "number") if was[k] != now[k]}
            obj = s.objects[new.object_ids[0]]
            true_count = len(new.object_ids)
            if neg.error_type == "attribute":
                assert len(diff) == 1 and diff <= {"colour", "size", "pattern"}, (old.text, new.text)
                field = diff.pop()
                assert now[field] != getattr(obj, field) and now[field] is not None
            elif neg.error_type == "object":
                assert diff == {"kind"}, (old.text, new.text)
                assert now["kind"] not in present
            else:
                assert diff == {"number"}, (old.text, new.text)
                assert now["number"] != true_count and now["number"] is not None
    assert all(types[t] >= 0.1 * 5 * N_SAMPLE for t in ("attribute", "relation", "count", "object")), types


# --------------------------------------------------------------------------- pixels


def _nearest_colour(pixels: np.ndarray) -> np.ndarray:
    pal = np.array(list(COLOURS.values()), dtype=np.float32)
    return np.argmin(((pixels[:, None, :].astype(np.float32) - pal[None]) ** 2).sum(-1), axis=1)


def test_masks_are_visible_objects_in_their_colour(scenes: list[Scene]) -> None:
    names = list(COLOURS)
    dominant = total = 0
    for s in scenes[:80]:
        for size in (96,) if s.index % 10 else (64, 96, 256):
            img, masks = render_scene(s, size)
            assert img.size == (size, size) and img.mode == "RGB"
            assert masks.shape == (len(s.objects), size, size) and masks.dtype == bool
            assert masks.sum(0).max() <= 1, "a pixel shows one object at most"
            pix = np.asarray(img).reshape(-1, 3)
            boxes = s.boxes_px(size)
            for o in s.objects:
                m = masks[o.id]
                x0, y0, x1, y1 = boxes[o.id]
                assert m.sum() > 0, o
                outside = m.copy()
                outside[y0:y1, x0:x1] = False
                assert not outside.any(), "mask leaves its box"
                votes = np.bincount(_nearest_colour(pix[m.reshape(-1)]), minlength=len(names))
                frac = votes[names.index(o.colour)] / votes.sum()
                assert frac >= 0.25, (o, frac)
                dominant += int(votes.argmax() == names.index(o.colour))
                total += 1
    assert dominant >= 0.98 * total, (dominant, total)


def test_render_batch_matches_render_scene(scenes: list[Scene]) -> None:
    batch = render_batch(scenes[:3], 64)
    assert batch.shape == (3, 64, 64, 3) and batch.dtype == np.uint8
    for i in range(3):
        assert np.array_equal(batch[i], np.asarray(render_scene(scenes[i], 64)[0]))


def test_large_objects_are_drawn_larger(scenes: list[Scene]) -> None:
    areas: dict[str, list[int]] = {"small": [], "large": []}
    for s in scenes[:60]:
        full, _ = silhouettes(s.objects, 96)
        for o in s.objects:
            if o.container is None:
                areas[o.size].append(int(full[o.id].sum()))
    assert np.median(areas["large"]) > 2.5 * np.median(areas["small"])


# --------------------------------------------------------------------------- variety


def test_paragraph_wording_variety(scenes: list[Scene]) -> None:
    paras = [s.paragraph for s in scenes[:200]]
    first4 = Counter(" ".join(p.text.split()[:4]) for p in paras)
    assert len(first4) >= 50, first4.most_common(10)
    assert first4.most_common(1)[0][1] <= 30
    words = [w for p in paras for w in _words(p.text)]
    trigrams = list(zip(words, words[1:], words[2:], strict=False))
    assert len(set(trigrams)) / len(trigrams) >= 0.3
    # Sentence shapes with the phrases blanked out: many realisations, not one template.
    shapes = Counter()
    for p in paras:
        sk = _skeleton(p)
        for sent in sk.split(". "):
            shapes[sent.strip(". ")] += 1
    assert len(shapes) >= 250, len(shapes)
    assert len({p.text for p in paras}) == 200


def test_caption_wording_variety(scenes: list[Scene]) -> None:
    caps = [t.text for s in scenes[:200] for t in s.positives]
    assert len(Counter(" ".join(c.split()[:3]) for c in caps)) >= 150
    assert len(set(caps)) == len(caps)


# --------------------------------------------------------------------------- export


def test_training_jsonl(tmp_path: Path) -> None:
    out = tmp_path / "data" / "train.jsonl"
    write_training_jsonl(out, tmp_path / "data" / "images", seed=5, n=4, size=64)
    lines = out.read_text().splitlines()
    assert len(lines) == 4
    for i, line in enumerate(lines):
        row = json.loads(line)
        assert set(row) == {"image", "original_caption", "positives", "negatives", "paragraph",
                            "paragraph_score", "meta"}
        assert row["meta"] == {"source": "sceneworld", "seed": 5, "index": i}
        assert len(row["positives"]) == 5 and len(row["negatives"]) == 5
        assert all(isinstance(x, str) and x for x in row["positives"] + row["negatives"])
        assert row["paragraph_score"] == PARAGRAPH_SCORE == 10.0
        scene = generate_scene(5, i)
        assert row["paragraph"] == scene.paragraph.text
        assert row["original_caption"] == scene.original_caption.text
        path = out.parent / row["image"]
        assert not Path(row["image"]).is_absolute() and path.exists()
        with Image.open(path) as im:
            assert im.size == (64, 64)
            assert np.array_equal(np.asarray(im.convert("RGB")), np.asarray(render_scene(scene, 64)[0]))


def test_collection_is_deterministic_and_carries_ground_truth(tmp_path: Path) -> None:
    paths = write_collection(tmp_path / "a", seed=9, n=3, size=96)
    assert [p.name for p in paths] == [f"scene_9_{i:05d}.jpg" for i in range(3)]
    for p in paths:
        with Image.open(p) as im:
            assert im.format == "JPEG" and im.size == (96, 96)
    rows = [json.loads(x) for x in (tmp_path / "a" / "sceneworld.jsonl").read_text().splitlines()]
    assert [r["file"] for r in rows] == [p.name for p in paths]
    for i, r in enumerate(rows):
        scene = Scene.from_dict(r)
        assert scene == generate_scene(9, i)
        assert r["boxes_px"] == scene.boxes_px(96).tolist()
    again = write_collection(tmp_path / "b", seed=9, n=3, size=96)
    assert [p.read_bytes() for p in paths] == [p.read_bytes() for p in again]
    assert (tmp_path / "a" / "sceneworld.jsonl").read_bytes() == (tmp_path / "b" / "sceneworld.jsonl").read_bytes()
    png = write_collection(tmp_path / "c", seed=9, n=1, size=64, fmt="png")
    assert png[0].suffix == ".png"


def test_docci_and_coco_layouts(tmp_path: Path) -> None:
    docci = write_docci_layout(tmp_path / "docci", seed=1000, n=3, size=64)
    rows = [json.loads(x) for x in docci.read_text().splitlines()]
    assert len(rows) == 3
    for i, r in enumerate(rows):
        assert set(r) == {"example_id", "image_file", "description", "split"} and r["split"] == "test"
        assert r["description"] == generate_scene(1000, i).paragraph.text
        assert (tmp_path / "docci" / "images" / r["image_file"]).exists()
    out = write_coco_layout(tmp_path / "coco", seed=1000, n=3, size=64)
    coco = json.loads(out["coco"].read_text())
    assert [im["id"] for im in coco["images"]] == [0, 1, 2]
    assert all(im["width"] == im["height"] == 64 for im in coco["images"])
    assert len(coco["annotations"]) == 15 and len({a["id"] for a in coco["annotations"]}) == 15
    for im in coco["images"]:
        caps = [a["caption"] for a in coco["annotations"] if a["image_id"] == im["id"]]
        assert caps == [t.text for t in generate_scene(1000, im["id"]).positives]
        assert (out["images"] / im["file_name"]).exists()
    karpathy = json.loads(out["karpathy"].read_text())
    for im in karpathy["images"]:
        assert im["split"] == "test" and len(im["sentences"]) == 5
        assert all(set(s) >= {"raw", "tokens"} for s in im["sentences"])
        assert (tmp_path / "coco" / im["filepath"] / im["filename"]).exists()
