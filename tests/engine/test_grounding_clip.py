"""Grounding for CLIP-family models (engine/backends/clip/grounder.py) on tiny random CLIP ViT-B/16 and
Long-CLIP-B folders: maps on the patch grid, the value path checked against transformers' own modules
and on weights built so that one patch region carries a phrase's direction, Grad-CAM against one
computed by hand (autograd through transformers' last block, its gradient checked by finite
differences), and supports that stay uncalibrated until a calibration is fitted for the exact
weights, then use the stored parameters."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from engine.backends.clip.embedder import ClipEmbedder
from engine.backends.clip.grounder import ClipGrounder
from engine.config import get_paths
from engine.errors import LonglensError
from engine.evaluation.grounding_calibration import (
    MIN_PER_CLASS,
    CalibrationRequest,
    calibrate_job,
    parse_label,
    read_labelled_captions,
)
from engine.grounding import get_grounder
from engine.grounding.calibration import calibration_key, load_all, sigmoid, user_calibration_file
from engine.jobs import CancelToken, run_to_end

PARAGRAPH = ("A red ball lies to the left of a small wooden bench. Two white clouds drift across "
             "the blue sky above the green grass.")


def photo(seed: int = 0, size: tuple[int, int] = (96, 72)) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray((rng.random((size[1], size[0], 3)) * 255).astype(np.uint8))


@pytest.fixture(scope="module")
def clip_b16(clip_b16_tiny_checkpoint) -> ClipEmbedder:
    return ClipEmbedder(clip_b16_tiny_checkpoint)


@pytest.fixture(scope="module")
def longclip(longclip_b_tiny_checkpoint) -> ClipEmbedder:
    return ClipEmbedder(longclip_b_tiny_checkpoint)


# --------------------------------------------------------------------------- maps


@pytest.mark.parametrize("which", ["clip_b16", "longclip"])
@pytest.mark.parametrize("method", ["value", "gradcam"])
def test_maps_are_on_the_patch_grid_finite_and_in_range(request, which, method):
    emb = request.getfixturevalue(which)
    g = get_grounder(emb, method=method)
    assert isinstance(g, ClipGrounder) and g.kind == method
    grid = emb.config.vision_config.image_size // emb.config.vision_config.patch_size
    res = g.ground(photo(), PARAGRAPH)
    assert res.method == ("value-path" if method == "value" else f"gradcam-layer{g.n_layers - 1}")
    assert not res.calibrated and res.model_id == emb.model_id
    texts = [pm.phrase.text for pm in res.phrases]
    assert "A red ball" in texts and "a small wooden bench" in texts
    assert any(pm.phrase.kind == "relation" for pm in res.phrases)
    for pm in res.phrases:
        assert pm.heatmap.shape == (grid, grid) and pm.heatmap.dtype == np.float32
        assert np.isfinite(pm.heatmap).all() and 0 <= pm.heatmap.min() and pm.heatmap.max() <= 1
        assert 0 <= pm.support <= 1 and np.isfinite(pm.score)
    nouns = [pm for pm in res.phrases if pm.phrase.kind == "noun_phrase"]
    assert all(pm.heatmap.max() == 1.0 for pm in nouns)  # a real map, not a flat one
    assert len(res.sentence_supports) == len(res.sentences) == 2


def test_the_image_embedding_of_the_hand_written_tower_is_the_embedders(longclip):
    g = ClipGrounder(longclip)
    images = [photo(1), photo(2, (64, 200))]
    for image, ref in zip(images, longclip.encode_images(images), strict=True):
        np.testing.assert_allclose(g.image_features(image).global_feat.numpy(), ref, atol=1e-5)


def _reference_last_block_input(emb: ClipEmbedder, image: Image.Image) -> torch.Tensor:
    """transformers' own tokens entering the last vision block (its hidden_states)."""
    pixels = torch.from_numpy(emb.preprocess([image]))
    with torch.no_grad():
        return emb.model.vision_model(pixel_values=pixels, output_hidden_states=True).hidden_states[-2]


@pytest.mark.parametrize("residual", [False, True])
def test_value_path_is_out_proj_of_v_proj_then_post_layernorm_and_projection(clip_b16, residual):
    image = photo(3)
    g = ClipGrounder(clip_b16, residual=residual)
    h = _reference_last_block_input(clip_b16, image)[:, 1:]
    vm, last = clip_b16.model.vision_model, clip_b16.model.vision_model.encoder.layers[-1]
    with torch.no_grad():
        x = last.layer_norm1(h)
        v = last.self_attn.out_proj(last.self_attn.v_proj(x))  # q.k skipped: no mixing across patches
        if residual:  # MaskCLIP's published form
            v = h + v
            v = v + last.mlp(last.layer_norm2(v))
        ref = F.normalize(clip_b16.model.visual_projection(vm.post_layernorm(v))[0], dim=-1)
    feats = g.image_features(image)
    np.testing.assert_allclose(feats.patch_feats.numpy(), ref.numpy(), atol=1e-5)
    t = clip_b16.encode_texts(["a red ball"])
    np.testing.assert_allclose(g.value_maps(feats, t)[0].ravel(), ref.numpy() @ t[0], atol=1e-5)
    assert g.method == ("value-path-residual" if residual else "value-path")


def _aligned_checkpoint(base: Path, out: Path, phrase: str) -> Path:
    """The tiny CLIP ViT-B/16 with weights set so that a patch's value-path embedding points along
    `phrase`'s text embedding when the patch is red, and away from it when it is green:

    patch embedding = u * (red channel sum) + w * (green channel sum), u and w orthonormal and
    zero-mean (so every LayerNorm keeps their directions), no position embeddings, the first block
    made the identity (zero attention output and MLP output), the last block's v_proj and out_proj
    the identity, and visual_projection = t u^T + r w^T with t the phrase's normalised text
    embedding and r a unit vector orthogonal to it."""
    from transformers import CLIPModel

    shutil.copytree(base, out)
    emb = ClipEmbedder(out)
    t = torch.from_numpy(emb.encode_texts([phrase])[0])
    model = CLIPModel.from_pretrained(str(out), local_files_only=True, use_safetensors=True)
    vm = model.vision_model
    c = vm.config.hidden_size
    gen = torch.Generator().manual_seed(5)
    basis = torch.linalg.qr(torch.cat([torch.ones(c, 1), torch.randn(c, 2, generator=gen)], dim=1))[0]
    u, w = basis[:, 1], basis[:, 2]  # orthogonal to the all-ones vector: zero-mean
    r = torch.randn(t.shape[0], generator=gen)
    r = F.normalize(r - (r @ t) * t, dim=0)
    patch = vm.config.patch_size
    with torch.no_grad():
        pe = vm.embeddings.patch_embedding.weight
        pe.zero_()
        pe[:, 0] = u[:, None, None] / patch ** 2
        pe[:, 1] = w[:, None, None] / patch ** 2
        vm.embeddings.position_embedding.weight.zero_()
        for norm in [vm.pre_layrnorm, vm.post_layernorm] + [m for layer in vm.encoder.layers
                                                              for m in (layer.layer_norm1, layer.layer_norm2)]:
            norm.weight.fill_(1.0)
            norm.bias.zero_()
        for layer in vm.encoder.layers[:-1]:
            for lin in (layer.self_attn.out_proj, layer.mlp.fc2):
                lin.weight.zero_()
                lin.bias.zero_()
        last = vm.encoder.layers[-1].self_attn
        for lin in (last.v_proj, last.out_proj):
            lin.weight.copy_(torch.eye(c))
            lin.bias.zero_()
        model.visual_projection.weight.copy_(torch.outer(t, u) + torch.outer(r, w))
    model.save_pretrained(str(out))
    return out


def _red_patch_image(size: int, patch: int, row: int, col: int) -> Image.Image:
    a = np.zeros((size, size, 3), np.uint8)
    a[..., 1] = 255  # green everywhere
    a[row * patch:(row + 1) * patch, col * patch:(col + 1) * patch] = (255, 0, 0)
    return Image.fromarray(a)


def test_value_path_map_peaks_on_the_patch_that_carries_the_phrase(clip_b16_tiny_checkpoint, tmp_path):
    phrase = "a red ball"
    folder = _aligned_checkpoint(clip_b16_tiny_checkpoint, tmp_path / "aligned", phrase)
    emb = ClipEmbedder(folder)
    cfg = emb.config.vision_config
    grid = cfg.image_size // cfg.patch_size
    g = ClipGrounder(emb)
    for row, col in [(2, 1), (0, 3)]:
        image = _red_patch_image(cfg.image_size, cfg.patch_size, row, col)
        feats = g.image_features(image)
        t = emb.encode_texts([phrase])
        cos = g.value_maps(feats, t)[0]
        # The red patch points along the phrase (cosine 1.93 / |(1.93, -1.75)| = 0.74 after
        # normalisation), every green patch away from it (-0.65).
        assert cos[row, col] == pytest.approx(0.74, abs=0.02)
        others = np.delete(cos.ravel(), row * grid + col)
        assert np.allclose(others, -0.65, atol=0.02)
        res = g.ground(image, phrase)
        assert [pm.phrase.text for pm in res.phrases] == [phrase]
        m = res.phrases[0].heatmap
        assert np.unravel_index(np.argmax(m), m.shape) == (row, col) and m[row, col] == 1.0
        assert np.count_nonzero(m > 0.5) == 1


def test_gradcam_matches_a_hand_computed_one(longclip):
    image = photo(4)
    phrases = ["a red ball", "the blue sky", "a small wooden bench"]
    t = longclip.encode_texts(phrases)
    model = longclip.model
    vm, proj = model.vision_model, model.visual_projection
    acts = _reference_last_block_input(longclip, image).double().requires_grad_(True)
    vm64, proj64 = _double(vm), _double(proj)
    last = vm64.encoder.layers[-1]

    def score(a: torch.Tensor, k: int) -> torch.Tensor:
        out = last(a, None)  # transformers' own CLIPEncoderLayer
        out = out[0] if isinstance(out, tuple) else out
        e = F.normalize(proj64(vm64.post_layernorm(out[:, 0])), dim=-1)
        return (e[0] * torch.from_numpy(t[k]).double()).sum()

    expected = []
    for k in range(len(phrases)):
        (grad,) = torch.autograd.grad(score(acts, k), acts)
        # The gradient itself, by central differences on a few entries.
        with torch.no_grad():
            for p, ch in [(1, 0), (5, 17), (16, 63)]:
                e = torch.zeros_like(acts)
                e[0, p, ch] = 1e-6
                fd = (score(acts + e, k) - score(acts - e, k)) / 2e-6
                assert float(fd) == pytest.approx(float(grad[0, p, ch]), rel=1e-4, abs=1e-9)
        g_p, a_p = grad[0, 1:].numpy(), acts.detach()[0, 1:].numpy()
        weights = g_p.mean(axis=0)  # channel weights: the gradient averaged over patches
        expected.append(np.maximum((a_p * weights).sum(axis=1), 0.0))
    grid = longclip.config.vision_config.image_size // longclip.config.vision_config.patch_size
    g = ClipGrounder(longclip, method="gradcam")
    got = g.gradcam_maps(g.image_features(image), t)
    assert got.shape == (3, grid, grid)
    scale = max(float(np.abs(e).max()) for e in expected)
    np.testing.assert_allclose(got.reshape(3, -1), np.stack(expected), atol=1e-4 * scale)
    assert all(float(e.max()) > 0 for e in expected)


def _double(module: torch.nn.Module) -> torch.nn.Module:
    import copy

    return copy.deepcopy(module).double()


def test_gradcam_layer_and_method_are_checked(longclip):
    g = ClipGrounder(longclip, method="gradcam", gradcam_layer=0)
    assert g.method == "gradcam-layer0" and g.gradcam_layers() == [0, 1]
    res = g.ground(photo(), "a red ball")
    assert np.isfinite(res.phrases[0].heatmap).all()
    with pytest.raises(LonglensError, match="map method 'patch'") as e:
        ClipGrounder(longclip, method="patch")
    assert e.value.settings == ("method",)
    with pytest.raises(LonglensError, match="Grad-CAM layer"):
        ClipGrounder(longclip, method="gradcam", gradcam_layer=2)


# --------------------------------------------------------------------------- supports and calibration


def test_labels_are_read_from_json_and_csv(tmp_path):
    assert [parse_label(v) for v in (True, 0, 1.0, " Yes ", "not  supported", "F", "maybe", 2, None)] == [
        True, False, True, True, False, False, None, None, None]
    Image.new("RGB", (8, 8)).save(tmp_path / "a.png")
    (tmp_path / "l.csv").write_text("image,caption,label\na.png,a red ball,true\na.png,a cat,no\na.png,a dog,?\n",
                                    encoding="utf-8")
    rows, problems = read_labelled_captions(tmp_path / "l.csv")
    assert [(r.line_no, r.caption, r.label) for r in rows] == [(2, "a red ball", True), (3, "a cat", False)]
    assert problems == [f"{tmp_path / 'l.csv'}:4: label: '?' is neither true nor false (use true/false, 1/0 or yes/no)"]


def _labelled_file(folder: Path, n_images: int = 6) -> Path:
    """Per image a true caption and a one-detail-wrong one (plus, per image, a caption the model
    cannot know is wrong only from the image: a lone false phrase)."""
    lines = []
    for i in range(n_images):
        photo(10 + i).save(folder / f"p{i}.png")
        lines.append({"image": f"p{i}.png", "caption": f"a red ball next to a wooden bench number {i}", "label": True})
        lines.append({"image": f"p{i}.png", "caption": f"a green cat next to a wooden bench number {i}", "label": 0})
        lines.append({"image": f"p{i}.png", "caption": "a purple elephant", "label": "false"})
    text = "\n".join(json.dumps(x) for x in lines)
    text += "\n" + json.dumps({"image": "missing.png", "caption": "a ball", "label": 1})
    text += "\n" + json.dumps({"image": "p0.png", "caption": "no label here"})
    path = folder / "labelled.jsonl"
    path.write_text(text + "\n", encoding="utf-8")
    return path


def test_uncalibrated_until_a_calibration_is_fitted_then_its_parameters_are_used(longclip_b_tiny_checkpoint, tmp_path):
    home = get_paths(tmp_path / "home")
    folder = tmp_path / "model"
    shutil.copytree(longclip_b_tiny_checkpoint, folder)
    emb = ClipEmbedder(folder)
    before = get_grounder(emb, paths=home)
    res = before.ground(photo(), PARAGRAPH)
    assert not before.calibrated and not res.calibrated and before.calibration is None
    # Uncalibrated: the documented fixed squashing of the cosine.
    ph = next(pm for pm in res.phrases if pm.phrase.kind == "noun_phrase")
    assert ph.support == pytest.approx(float(sigmoid(20.0 * (ph.score - 0.2))))

    data = _labelled_file(tmp_path)
    out = user_calibration_file(home)
    last = run_to_end(calibrate_job(emb, CalibrationRequest(data=data), out))
    summary = last.extra
    assert last.stage == "done" and summary["file"] == str(out) and summary["key"] == calibration_key(emb)
    assert summary["levels"]["sentence"] == {"positives": 6, "negatives": 12, "fitted": True,
                                             "auc": summary["levels"]["sentence"]["auc"]}
    assert summary["levels"]["phrase"]["fitted"] and summary["levels"]["phrase"]["negatives"] >= MIN_PER_CLASS
    assert summary["skipped"] == 2
    assert summary["problems"][0] == f"{data}:19: image: image not found: missing.png"
    assert summary["problems"][1].startswith(f"{data}:20: label: no label")
    stored = load_all(out)["models"][calibration_key(emb)]
    assert stored["validation"]["labelled"] == str(data) and stored["validation"]["n_captions"] == 18
    assert stored["features"] == ClipGrounder.feature_names

    after = get_grounder(emb, paths=home)
    assert after is not before  # the user file changed: a new grounder with the calibration
    assert after.calibration is not None and after.calibration.source == out
    assert after.calibrated_levels() == frozenset(summary["fitted"])
    g = after.ground(photo(), "A red ball. Two white clouds.")
    assert {"phrase", "sentence"} <= set(summary["fitted"]) and g.calibrated
    a = after.analyse(photo(), "A red ball. Two white clouds.")
    w, b = np.array(stored["levels"]["sentence"]["w"]), stored["levels"]["sentence"]["b"]
    expected = sigmoid(np.asarray(a.sentence_x) @ w + b)
    np.testing.assert_allclose(g.sentence_supports, expected, rtol=1e-9)
    # Without the home, or for other weights under the same name, nothing is calibrated.
    assert not get_grounder(emb).calibrated
    other = tmp_path / "other" / "model"
    from engine.backends.clip.checkpoints import save_random_clip_checkpoint

    save_random_clip_checkpoint(other, name="longclip-b", size="tiny", seed=1)
    emb2 = ClipEmbedder(other)
    assert emb2.model_id == emb.model_id and calibration_key(emb2) != calibration_key(emb)
    assert not get_grounder(emb2, paths=home).calibrated


def test_sceneworld_calibration_and_its_refusals(longclip, tmp_path):
    out = tmp_path / "cal.json"
    with pytest.raises(LonglensError, match="choose one source"):
        run_to_end(calibrate_job(longclip, CalibrationRequest(), out))
    with pytest.raises(LonglensError, match="validation seeds") as e:
        run_to_end(calibrate_job(longclip, CalibrationRequest(scenes=2, seed=2000), out))
    assert e.value.settings == ("seed",)
    token = CancelToken()
    job = calibrate_job(longclip, CalibrationRequest(scenes=3), out, token)
    assert next(job).stage == "scenes"
    token.cancel()
    with pytest.raises(Exception, match="cancelled"):
        run_to_end(job)
    assert not out.exists()  # a cancelled fit stores nothing
    reports = list(calibrate_job(longclip, CalibrationRequest(scenes=3, method="gradcam"), out))
    assert [r.stage for r in reports] == ["scenes"] * 3 + ["done"]
    summary = reports[-1].extra
    assert summary["source"] == {"benchmark": "sceneworld", "seed": 1500, "n_scenes": 3}
    assert summary["levels"]["sentence"] == {"positives": 15, "negatives": 15, "fitted": True,
                                             "auc": summary["levels"]["sentence"]["auc"]}
    assert summary["method"] == "gradcam-layer1"
    stored = load_all(out)["models"][calibration_key(longclip)]
    assert set(stored["levels"]) == set(summary["fitted"]) and "sentence" in stored["levels"]


def test_too_few_labels_is_refused_with_what_is_needed(longclip, tmp_path):
    photo(0).save(tmp_path / "a.png")
    (tmp_path / "few.jsonl").write_text(json.dumps({"image": "a.png", "caption": "a ball", "label": 1}) + "\n",
                                        encoding="utf-8")
    with pytest.raises(LonglensError, match=r"1 positives and 0 negatives.*at least 5 true and 5 false"):
        run_to_end(calibrate_job(longclip, CalibrationRequest(data=tmp_path / "few.jsonl"), tmp_path / "c.json"))
    assert not (tmp_path / "c.json").exists()


def test_a_calibration_stored_with_other_features_is_not_applied(longclip, tmp_path):
    from engine.grounding.calibration import Calibration, Platt, save_calibration

    out = tmp_path / "cal.json"
    names = dict(ClipGrounder.feature_names)
    cal = Calibration(calibration_key(longclip), {"phrase": Platt([1.0], 0.0), "sentence": Platt([1.0, 1, 1, 1], 0.0),
                                                  "relation": Platt([1.0, 1.0], 0.0)},
                      meta={"features": {**names, "phrase": ["something_else"]}})
    save_calibration(cal, out)
    from engine.grounding.calibration import load_calibration

    g = ClipGrounder(longclip, load_calibration(longclip, out))
    assert g.calibrated_levels() == frozenset({"sentence", "relation"}) and not g.calibrated
    res = g.ground(photo(), "A red ball.")
    assert not res.calibrated  # its phrase is scored by the fixed mapping
