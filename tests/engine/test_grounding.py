"""Grounding with the shipped sceneworld-mini: maps point at the referred objects, supports are
calibrated for these exact weights, and the acceptance numbers hold on a sample.

The evaluation sample uses seed 2000 (test split); calibration was fitted on seed 1500.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from engine.evaluation.grounding_benchmark import roc_auc
from engine.evaluation.grounding_calibration import fit_platt
from engine.grounding import get_grounder
from engine.grounding.calibration import (
    CALIBRATION_FILE,
    Calibration,
    Platt,
    load_calibration,
    save_calibration,
    sigmoid,
)
from engine.grounding.maps import background_map, colourise, normalise, overlay, upsample
from engine.models.registry import bundled_model_dir

MODEL_DIR = bundled_model_dir("sceneworld-mini")
needs_model = pytest.mark.skipif(not (MODEL_DIR / "model.safetensors").is_file(),
                                 reason="sceneworld-mini weights are not in this checkout")


@pytest.fixture(scope="module")
def mini():
    from engine.backends.sceneworld_mini.embedder import SceneWorldMiniEmbedder

    return SceneWorldMiniEmbedder(MODEL_DIR, device="cpu")


@pytest.fixture(scope="module")
def sample_eval(mini):
    from engine.evaluation.grounding_benchmark import evaluate_grounding

    return evaluate_grounding(mini, seed=2000, n=80, timing_images=3)


# -- pure helpers ------------------------------------------------------------------------
def test_normalise_and_upsample():
    m = np.array([[0.0, 2.0], [4.0, 8.0]], np.float32)
    n = normalise(m)
    assert n.dtype == np.float32 and n.min() == 0.0 and n.max() == 1.0
    assert np.allclose(n, m / 8)
    assert not normalise(np.full((3, 3), 5.0)).any()  # flat: nothing stands out
    assert normalise(np.array([[np.nan, 1.0]])).tolist() == [[0.0, 1.0]]
    up = upsample(n, 10, 6)
    assert up.shape == (6, 10) and up.min() >= 0 and up.max() <= 1
    assert up[0, 0] == pytest.approx(0.0, abs=1e-6) and up[-1, -1] == pytest.approx(1.0, abs=1e-6)


def test_overlay_blends_only_where_the_map_is_high():
    from PIL import Image

    img = Image.new("RGB", (20, 10), (10, 200, 10))
    heat = np.zeros((2, 4), np.float32)
    heat[0, 0] = 1.0
    out = np.asarray(overlay(img, heat))
    assert out.shape == (10, 20, 3)
    assert tuple(out[-1, -1]) == (10, 200, 10)  # map 0: the picture untouched
    assert tuple(out[0, 0]) != (10, 200, 10)
    assert colourise(np.array([[0.0, 1.0]])).shape == (1, 2, 3)


def test_background_map_is_where_the_objects_are_not():
    ball = np.zeros((4, 4), np.float32)
    ball[0, 0] = 1.0
    box = np.zeros((4, 4), np.float32)
    box[3, 3] = 0.5
    bg = background_map([ball, box], (4, 4))
    assert bg.dtype == np.float32 and bg.max() == pytest.approx(1.0)
    assert bg[0, 0] == 0.0 and bg[3, 3] == pytest.approx(0.5) and bg[1, 2] == pytest.approx(1.0)
    # No object named: the whole picture; objects everywhere: still the whole picture.
    assert (background_map([], (2, 3)) == 1).all() and background_map([], (2, 3)).shape == (2, 3)
    assert (background_map([np.ones((2, 2))], (2, 2)) == 1).all()


def test_platt_fit_recovers_a_logistic_model():
    rng = np.random.default_rng(0)
    x = rng.normal(size=4000)
    y = (rng.random(4000) < sigmoid(3 * x - 1)).astype(float)
    p = fit_platt(x[:, None], y)
    # Balanced weighting moves the intercept by the log prior ratio; the slope is recovered.
    assert p.w[0] == pytest.approx(3, rel=0.15)
    prior = math.log(y.mean() / (1 - y.mean()))
    assert p.b == pytest.approx(-1 - prior, abs=0.2)


def test_roc_auc():
    assert roc_auc([3, 4], [1, 2]) == 1.0
    assert roc_auc([1, 2], [3, 4]) == 0.0
    assert roc_auc([1, 1], [1, 1]) == 0.5
    assert math.isnan(roc_auc([], [1]))


def test_calibration_file_round_trip(tmp_path):
    cal = Calibration("m@abc", {"phrase": Platt([2.0], -0.5)}, {"image_mean": [0.1, 0.2]}, {"seed": 1500})
    path = tmp_path / "cal.json"
    save_calibration(cal, path)

    class E:
        text_model_id = "m"
        model_dir = None

    assert load_calibration(E(), path) is None  # the key includes the weights hash
    from engine.grounding.calibration import load_all

    back = Calibration.from_json("m@abc", load_all(path)["models"]["m@abc"])
    assert back.levels["phrase"].w == [2.0] and back.stats["image_mean"] == [0.1, 0.2]


def test_unknown_embedder_has_no_grounder():
    assert get_grounder(object()) is None


# -- the shipped model -------------------------------------------------------------------
@needs_model
def test_stored_calibration_matches_the_shipped_weights(mini):
    cal = load_calibration(mini)
    assert cal is not None, f"regenerate {CALIBRATION_FILE.name}: python -m engine.evaluation.grounding_calibration"
    assert set(cal.levels) == {"phrase", "relation", "sentence"}
    assert cal.meta["validation"]["seed"] < 2000  # never the test split
    assert len(cal.stats["image_mean"]) == mini.dim


@needs_model
def test_ground_output_shapes_and_determinism(mini):
    from engine.sceneworld import generate_scene, render_scene

    scene = generate_scene(2000, 3)
    image, _ = render_scene(scene, 256)
    g = get_grounder(mini)
    assert g is get_grounder(mini)  # cached per embedder
    a = g.ground(image, scene.paragraph.text)
    b = g.ground(image, scene.paragraph.text)
    assert a.calibrated and a.model_id == "sceneworld-mini"
    assert a.sentences == [(s.start, s.end) for s in scene.paragraph.sentences]
    assert len(a.sentence_supports) == len(a.sentences)
    assert a.phrases
    for pa, pb in zip(a.phrases, b.phrases, strict=True):
        assert pa.heatmap.shape == (16, 16) and pa.heatmap.dtype == np.float32
        assert pa.heatmap.min() >= 0 and pa.heatmap.max() <= 1
        assert 0 <= pa.support <= 1
        assert a.text[pa.phrase.start:pa.phrase.end] == pa.phrase.text
        np.testing.assert_array_equal(pa.heatmap, pb.heatmap)
        assert pa.support == pb.support
    assert a.sentence_supports == b.sentence_supports


@needs_model
def test_map_points_at_the_object_of_its_colour(mini):
    """A hand-checkable case: the map of each object's phrase peaks inside that object's box."""
    from engine.grounding.maps import argmax_point
    from engine.sceneworld import generate_scene, render_scene

    scene = generate_scene(2000, 1)  # a striped red umbrella, a checked grey book, a dotted brown tree
    image, _ = render_scene(scene, 256)
    g = get_grounder(mini).ground(image, scene.paragraph.text)
    checked = 0
    for pm in g.phrases:
        for o in scene.objects:
            if pm.phrase.text.lower().startswith(f"a {o.colour} {o.kind}"):
                r, c = argmax_point(upsample(pm.heatmap, 256, 256))
                x0, y0, x1, y1 = o.box_px(256)
                assert x0 <= c < x1 and y0 <= r < y1, pm.phrase.text
                checked += 1
    assert checked >= 2


@needs_model
def test_a_setting_gets_the_background_not_an_object(mini):
    """ "On a sandy beach": the beach is where the objects are not, not the sand-coloured object."""
    from engine.grounding.maps import argmax_point
    from engine.sceneworld import generate_scene, render_scene

    scene = generate_scene(2000, 1)
    image, _ = render_scene(scene, 256)
    o = scene.objects[0]
    text = f"On a sandy beach, a {o.colour} {o.kind} lies in the sand."
    g = get_grounder(mini).ground(image, text)
    assert [(pm.phrase.kind, pm.phrase.text) for pm in g.phrases] == [
        ("setting", "a sandy beach"), ("noun_phrase", f"a {o.colour} {o.kind}"), ("setting", "the sand")]
    obj = g.phrases[1]  # no relation "in the sand": nothing to check against a setting
    r, c = argmax_point(obj.heatmap)
    for setting in (g.phrases[0], g.phrases[2]):
        assert setting.heatmap[r, c] < 0.1  # dark where the object is
        assert setting.heatmap.mean() > 0.6  # bright over the rest of the picture
        assert 0 <= setting.support <= 1


@needs_model
def test_acceptance_pointing_game_on_a_sample(sample_eval):
    r = sample_eval
    assert r["n_object_phrases"] > 800
    # Acceptance on 1,000 scenes is >= 0.80 (measured 0.99 with the matching head's alignment
    # maps, docs/grounding.md); this 80-scene sample must clear it with margin, far above both
    # baselines.
    assert r["pointing_game"] >= 0.90
    assert r["pointing_game"] > r["pointing_game_centre_baseline"] + 0.5
    assert r["pointing_game"] > r["pointing_game_random_baseline"] + 0.5
    assert 0.3 < r["mask_iou"] < 1


@needs_model
def test_supports_separate_every_error_type(sample_eval):
    r = sample_eval
    assert r["calibrated"]
    by = r["faithfulness_auc_by_error"]
    # Kinds and attributes are read by the matching head trained with patch labels and
    # phrase-patch alignment (object errors were at chance, 0.51, before those terms).
    assert by["attribute"] > 0.9 and by["object"] > 0.85
    assert by["count"] > 0.85
    # Relations are checked on the alignment maps (left/right/above/below).
    assert by["relation"] > 0.7
    assert r["support_true_above_half"] > 0.8 and r["support_wrong_below_half"] > 0.65
    assert r["chunking"]["object_phrase_recall"] > 0.97


@needs_model
def test_acceptance_faithfulness_auc(sample_eval):
    # Acceptance: >= 0.90 on 1,000 test scenes; the 80-scene sample must reach it too.
    assert sample_eval["faithfulness_auc"] >= 0.90


@needs_model
def test_matching_head_reranking_keeps_or_lifts_long_query_r_at_1(mini):
    """Re-ranking the ANN top 32 with the head (docs/grounding.md: 0.892 -> see there on 1,000
    test scenes) must not lose a right answer the ANN found on a 48-scene test sample."""
    from engine.models.registry import rerank_scores, rerank_support
    from engine.sceneworld import generate_scene, render_scene

    assert rerank_support(mini) == (True, "")
    scenes = [generate_scene(2000, i) for i in range(48)]
    images = [render_scene(s, 256)[0] for s in scenes]
    img = mini.encode_images(images)
    hits_ann = hits_rr = 0
    for i, s in enumerate(scenes):
        q = mini.encode_texts([s.paragraph.text])[0]
        sims = img @ q
        top = np.argsort(-sims)[:32]
        rr = rerank_scores(mini, [images[j] for j in top], s.paragraph.text, sims[top])
        hits_ann += int(top[0] == i)
        hits_rr += int(top[int(np.argmax(rr))] == i)
    assert hits_rr >= hits_ann and hits_rr >= 46, (hits_ann, hits_rr)
