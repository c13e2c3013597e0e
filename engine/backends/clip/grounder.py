"""Grounding for CLIP-family models (OpenAI CLIP, Long-CLIP): per-phrase maps from the vision
tower's patch tokens, and support scores from image-text cosines.

CLIP is trained on one pooled token: its patch tokens after the last block are not in the text
space (the last block's attention pools everything into [CLS], and each patch's residual stream
carries mostly global content). Two ways to get a map for a phrase anyway:

* method "value" (the default): the value-path trick of MaskCLIP (Zhou et al., ECCV 2022;
  github.com/chongzhou96/MaskCLIP), refined by ClearCLIP (Lan et al., ECCV 2024;
  github.com/mc-lan/ClearCLIP) and related to SCLIP and CLIP Surgery. In the last vision block
  the q.k attention is skipped: each patch token x goes through the value path alone,
  out_proj(v_proj(layer_norm1(x))), then post_layernorm and visual_projection, which gives one
  embedding per patch in the space the text tower writes to; a phrase's map is the cosine of
  its text embedding with every patch embedding, on the patch grid (14 x 14 for ViT-B/16 at
  224 px, 24 x 24 for ViT-L/14 at 336 px). As in ClearCLIP's code (ignore_residual with
  MaskCLIP's identity attention) the block's residual connection and MLP are dropped: ClearCLIP
  identifies the residual stream as the main source of noise in CLIP's dense predictions.
  `residual=True` keeps them (MaskCLIP's published form: x + value path, then the MLP).
* method "gradcam": Grad-CAM (Selvaraju et al.) on the last vision block: the activations A are
  the tokens entering the last block, the target is the cosine of the image embedding with the
  phrase's text embedding; channel weights are the gradient averaged over patches, the map is
  relu(sum over channels of weight * A) per patch. One batched backward through the last block
  per image (phrases are copies of the same activations); `gradcam_layer=i` takes the tokens
  entering block i instead.

Why "value" is the default: it costs one forward pass per image whatever the number of phrases
(maps are dot products with text embeddings the supports need anyway) and no backward pass; it is
deterministic and read straight from the embedding space the supports use; and gradient maps of
CLIP's image-text similarity are known to highlight background more than the object named
(the "opposite visualisation" CLIP Surgery reports, arXiv 2304.05653), while the training-free
value-path maps are what the open-vocabulary segmentation work above builds on. (Pointing-game
figures need pretrained weights, which the project's machines cannot fetch; see
docs/grounding.md.)

Supports. Features per level (calibration.py fits a Platt model per level on them):
phrase [cosine of the phrase with the image, best patch cosine], relation [geometry of the
subject's and object's value maps (whatever the method shown, so supports and their calibration
do not depend on it), cosine of the claim], sentence [cosine, weakest phrase cosine,
weakest phrase patch maximum, weakest relation geometry]. Without a calibration for the exact
weights, a fixed squashing of the cosine is used and the grounding says calibrated=False:
CLIP cosines of matching pairs sit around 0.2-0.35 depending on the model, so no fixed mapping
means "undecided" at 0.5.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F

from engine.errors import LonglensError
from engine.grounding.base import Analysis, BaseGrounder, claims_and_sentences, map_relation
from engine.grounding.calibration import Calibration, sigmoid
from engine.grounding.chunking import Chunking
from engine.grounding.maps import normalise

if TYPE_CHECKING:
    from PIL import Image

METHODS = ("value", "gradcam")
DEFAULT_METHOD = "value"
# Phrases whose Grad-CAM is computed in one batched backward pass (memory: copies of the tokens).
GRADCAM_BATCH = 16
# The fixed mapping used until a calibration is fitted: sigmoid(SLOPE * (cosine - CENTRE)).
UNCALIBRATED_CENTRE = 0.2
UNCALIBRATED_SLOPE = 20.0
UNCALIBRATED_GEOMETRY_SLOPE = 10.0


@dataclass
class ClipImageFeatures:
    last_input: torch.Tensor  # (1, 1 + P, C): the tokens entering the last vision block (no grad)
    patch_feats: torch.Tensor  # (P, D) float32, normalised value-path patch embeddings
    global_feat: torch.Tensor  # (D,) float32, the normalised image embedding
    pixels: torch.Tensor  # (1, 3, S, S), for Grad-CAM at an earlier block


def make_grounder(embedder: Any, calibration: Calibration | None, *, method: str | None = None,
                  **options: Any) -> ClipGrounder:
    """The clip backend's make_grounder hook (engine/models/backend.py)."""
    return ClipGrounder(embedder, calibration, method=method, **options)


# --------------------------------------------------------------------------- the vision tower, by hand


def attention(attn: Any, x_q: torch.Tensor, x_kv: torch.Tensor) -> torch.Tensor:
    """CLIPAttention of queries x_q (B, Tq, C) over keys/values x_kv (B, Tk, C), no mask."""
    b, tq, c = x_q.shape
    tk = x_kv.shape[1]
    heads, head_dim = attn.num_heads, attn.head_dim
    q = attn.q_proj(x_q).view(b, tq, heads, head_dim).transpose(1, 2)
    k = attn.k_proj(x_kv).view(b, tk, heads, head_dim).transpose(1, 2)
    v = attn.v_proj(x_kv).view(b, tk, heads, head_dim).transpose(1, 2)
    # SDPA's default scale is 1/sqrt(head_dim), CLIPAttention's.
    o = F.scaled_dot_product_attention(q, k, v)
    return attn.out_proj(o.transpose(1, 2).reshape(b, tq, c))


def encoder_block(layer: Any, h: torch.Tensor, *, cls_only: bool = False) -> torch.Tensor:
    """CLIPEncoderLayer (pre-norm) on (B, T, C); cls_only: only the [CLS] row is computed (the
    only one the image embedding reads), (B, 1, C)."""
    x = layer.layer_norm1(h)
    if cls_only:
        h_q, x_q = h[:, :1], x[:, :1]
    else:
        h_q, x_q = h, x
    h = h_q + attention(layer.self_attn, x_q, x)
    return h + layer.mlp(layer.layer_norm2(h))


def value_path(layer: Any, h: torch.Tensor, *, residual: bool = False) -> torch.Tensor:
    """The last block with its q.k attention skipped: out_proj(v_proj(layer_norm1(h))) per token
    (ClearCLIP's form); residual=True adds the residual and the MLP back (MaskCLIP's)."""
    attn = layer.self_attn
    a = attn.out_proj(attn.v_proj(layer.layer_norm1(h)))
    if not residual:
        return a
    z = h + a
    return z + layer.mlp(layer.layer_norm2(z))


def tokens_entering(vision: Any, pixels: torch.Tensor, block: int) -> torch.Tensor:
    """(B, 1 + P, C): the tokens entering vision block `block` (0: the embeddings after pre-LN)."""
    h = vision.pre_layrnorm(vision.embeddings(pixels))
    for layer in list(vision.encoder.layers)[:block]:
        h = encoder_block(layer, h)
    return h


def image_embedding_from(vision: Any, projection: Any, h: torch.Tensor, block: int) -> torch.Tensor:
    """(B, D) unnormalised image embedding from the tokens `h` entering block `block`."""
    layers = list(vision.encoder.layers)
    for layer in layers[block:-1]:
        h = encoder_block(layer, h)
    if block < len(layers):
        h = encoder_block(layers[-1], h, cls_only=True)
    return projection(vision.post_layernorm(h[:, 0]))


# --------------------------------------------------------------------------- the grounder


class ClipGrounder(BaseGrounder):
    feature_names = {
        "phrase": ["cosine", "patch_max"],
        "relation": ["geometry", "cosine"],
        "sentence": ["cosine", "min_phrase_cosine", "min_phrase_patch_max", "min_relation_geometry"],
    }

    def __init__(self, embedder: Any, calibration: Calibration | None = None, *, method: str | None = None,
                 gradcam_layer: int = -1, residual: bool = False) -> None:
        super().__init__(embedder, calibration)
        method = DEFAULT_METHOD if method is None else method
        if method not in METHODS:
            raise LonglensError(f"the map method {method!r} is not one a CLIP model has; use one of: "
                                f"{', '.join(METHODS)}", settings=("method",))
        self.kind = method
        self.model = embedder.model
        self.vision = self.model.vision_model
        self.n_layers = len(self.vision.encoder.layers)
        if self.n_layers < 1:
            raise LonglensError(f"the CLIP model {self.model_id!r} has no vision blocks to ground with")
        if not -self.n_layers <= int(gradcam_layer) < self.n_layers:
            raise LonglensError(f"the Grad-CAM layer must be one of the model's {self.n_layers} vision blocks "
                                f"(0 to {self.n_layers - 1}, or -1 for the last), got {gradcam_layer}",
                                settings=("gradcam_layer",))
        self.gradcam_layer = int(gradcam_layer) % self.n_layers
        self.residual = bool(residual)
        if method == "value":
            self.method = "value-path-residual" if self.residual else "value-path"
        else:
            self.method = f"gradcam-layer{self.gradcam_layer}"
        cfg = embedder.config.vision_config
        self.grid = int(cfg.image_size) // int(cfg.patch_size)

    # -- statistics: none (the hooks fit_calibration calls) -----------------------------
    def fit_statistics(self, *, seed: int, n: int) -> dict[str, list[float]]:
        return {}

    def set_statistics(self, stats: dict[str, Any]) -> None:
        pass

    # -- features ------------------------------------------------------------------------
    @torch.no_grad()  # not inference_mode: Grad-CAM later runs autograd over these tokens
    def image_features(self, image: Image.Image) -> ClipImageFeatures:
        emb = self.embedder
        pixels = torch.from_numpy(emb.preprocess([image])).to(device=emb.device, dtype=emb.torch_dtype)
        last = self.n_layers - 1
        h = tokens_entering(self.vision, pixels, last)
        g = image_embedding_from(self.vision, self.model.visual_projection, h, last)
        layer = self.vision.encoder.layers[last]
        patches = value_path(layer, h[:, 1:], residual=self.residual)
        p = self.model.visual_projection(self.vision.post_layernorm(patches))[0]
        return ClipImageFeatures(h, F.normalize(p.float(), dim=-1), F.normalize(g[0].float(), dim=-1), pixels)

    def value_maps(self, feats: ClipImageFeatures, text_emb: np.ndarray) -> np.ndarray:
        """(k, grid, grid) cosines of k normalised text embeddings with the value-path patches."""
        t = torch.from_numpy(np.asarray(text_emb, np.float32)).to(feats.patch_feats.device)
        sims = (t @ feats.patch_feats.T).cpu().numpy()
        return sims.reshape(len(t), self.grid, self.grid)

    def gradcam_maps(self, feats: ClipImageFeatures, text_emb: np.ndarray) -> np.ndarray:
        """(k, grid, grid) Grad-CAM of cos(image, text_k) over the tokens entering the chosen block."""
        block = self.gradcam_layer
        if block == self.n_layers - 1:
            acts0 = feats.last_input
        else:
            with torch.no_grad():
                acts0 = tokens_entering(self.vision, feats.pixels, block)
        out = []
        for start in range(0, len(text_emb), GRADCAM_BATCH):
            t = torch.from_numpy(np.asarray(text_emb[start:start + GRADCAM_BATCH], np.float32)).to(acts0.device)
            with torch.enable_grad():
                acts = acts0.detach().expand(len(t), -1, -1).clone().requires_grad_(True)
                g = image_embedding_from(self.vision, self.model.visual_projection, acts, block)
                score = (F.normalize(g.float(), dim=-1) * t).sum()
                (grad,) = torch.autograd.grad(score, acts)
            grad, a = grad[:, 1:].float(), acts.detach()[:, 1:].float()  # patches only, [CLS] dropped
            weights = grad.mean(dim=1, keepdim=True)
            out.append(torch.relu((weights * a).sum(-1)).cpu().numpy())
        if not out:
            return np.zeros((0, self.grid, self.grid), np.float32)
        return np.concatenate(out).reshape(len(text_emb), self.grid, self.grid)

    # -- analysis --------------------------------------------------------------------------
    def _analyse(self, feats: ClipImageFeatures, text: str, chunking: Chunking) -> Analysis:
        phrases = chunking.phrases
        claims, sentences = claims_and_sentences(text, chunking)
        emb = self.embed_texts(claims + sentences)
        ph_emb, sent_emb = emb[: len(claims)], emb[len(claims):]
        g = feats.global_feat.cpu().numpy()
        ph_cos = ph_emb @ g if len(ph_emb) else np.zeros(0, np.float32)
        sent_cos = sent_emb @ g if len(sent_emb) else np.zeros(0, np.float32)
        value = self.value_maps(feats, ph_emb) if len(ph_emb) else np.zeros((0, self.grid, self.grid), np.float32)
        patch_max = value.reshape(len(value), -1).max(axis=1) if len(value) else np.zeros(0, np.float32)

        nouns = [i for i, p in enumerate(phrases) if p.kind != "relation"]
        # Relation geometry is read from the value maps whichever maps are shown, so supports (and
        # their calibration) do not depend on the map method.
        value_norm = np.zeros((len(phrases), self.grid, self.grid), np.float32)
        for i in nouns:
            value_norm[i] = normalise(value[i])
        if self.kind == "value" or not nouns:
            maps = value_norm.copy()
        else:
            maps = np.zeros_like(value_norm)
            for j, cam in zip(nouns, self.gradcam_maps(feats, ph_emb[nouns]), strict=True):
                maps[j] = normalise(cam)
        levels: list[str] = []
        x: list[list[float]] = []
        for i, p in enumerate(phrases):
            if p.kind == "relation":
                levels.append("relation")
                x.append([float(map_relation(maps, i, p, value_norm)), float(ph_cos[i])])
            else:
                levels.append("phrase")
                x.append([float(ph_cos[i]), float(patch_max[i])])
        sx = []
        for si in range(len(sentences)):
            own = [k for k, s in enumerate(chunking.phrase_sentence) if s == si]
            nps = [x[k] for k in own if levels[k] == "phrase"]
            rels = [x[k][0] for k in own if levels[k] == "relation"]
            own_cos = float(sent_cos[si])
            sx.append([own_cos, min(v[0] for v in nps) if nps else own_cos,
                       min(v[1] for v in nps) if nps else own_cos, min(rels) if rels else 0.0])
        return Analysis(text, chunking, maps, levels, x, sx)

    def gradcam_layers(self) -> list[int]:
        """i = Grad-CAM over the tokens entering vision block i (the default: the last block)."""
        return list(range(self.n_layers))

    def _uncalibrated(self, level: str, x: np.ndarray) -> np.ndarray:
        # A fixed, monotone squashing of the cosine (Grounding.calibrated is False).
        if level == "relation":
            return sigmoid(UNCALIBRATED_SLOPE * (x[:, 1] - UNCALIBRATED_CENTRE) + UNCALIBRATED_GEOMETRY_SLOPE * x[:, 0])
        return sigmoid(UNCALIBRATED_SLOPE * (x[:, 0] - UNCALIBRATED_CENTRE))
