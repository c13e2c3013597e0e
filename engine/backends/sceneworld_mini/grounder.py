"""Grounding for sceneworld-mini: region maps and calibrated supports.

With a matching head trained with phrase-patch alignment (engine/backends/sceneworld_mini/matcher.py; the
shipped one is) the default maps are its alignment maps (method "align"): they point at the
referred object for 0.99 of object phrases (docs/grounding.md), and the head's logit and
alignment maximum lead the support features. Otherwise, the patch-similarity maps below.

Maps. sceneworld-mini's image embedding is the projection of the mean patch token, so the
similarity of each patch's projected token with a phrase's text embedding decomposes the
global score. Measured on SceneWorld (docs/grounding.md), the plain cosine map points at the
right object for 0.62 of object phrases; two changes lift that to about 0.84:

* subtracting the text prior: the phrase embedding minus the mean embedding of phrases
  (`text_prior`, fitted on validation scenes) removes what every phrase has in common
  (the "there is a thing in a scene" direction), which otherwise lights up the background;
* half-patch shifts: the 64 px input is also encoded shifted by 4 px right, down and both
  (edge pixels replicated), and the four 8 x 8 maps are shifted back and averaged on a
  16 x 16 grid. Small objects cover about 2 x 2 patches; the shifts halve the quantisation.

Grad-CAM (gradient of the image-text cosine with respect to the patch tokens of a chosen
layer, channel weights averaged over patches) is available as method="gradcam"; it points
less well than the shifted similarity maps (docs/grounding.md) and needs a backward pass.

Supports. A phrase's raw score is its debiased similarity: image.text minus
mean_image.text, i.e. how much better this image matches the phrase than an average
SceneWorld image does. A relation is checked geometrically from its subject's and
object's maps (centroids), since the global embedding hardly separates "left of" from
"right of". A sentence combines its own debiased similarity with its weakest phrase and
relation. Logistic calibration (engine/grounding/calibration.py) turns these into
probabilities.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F

from engine.grounding.base import Analysis, BaseGrounder, claims_and_sentences, map_relation
from engine.grounding.calibration import Calibration, sigmoid
from engine.grounding.chunking import Chunking, chunk
from engine.grounding.maps import normalise

if TYPE_CHECKING:
    from PIL import Image

SHIFTS: tuple[tuple[int, int], ...] = ((0, 0), (0, 4), (4, 0), (4, 4))
MAP_GRID = 16  # half-patch resolution of the shifted maps


@dataclass
class MiniImageFeatures:
    global_emb: np.ndarray  # (D,) normalised
    patches: np.ndarray  # (len(SHIFTS), G*G, D) normalised patch embeddings
    pixels: torch.Tensor  # (1, 3, S, S), kept for Grad-CAM
    match_tokens: torch.Tensor | None = None  # (len(SHIFTS), G*G, width): the matcher's image tokens


class MiniGrounder(BaseGrounder):
    feature_names = {
        "phrase": ["debiased_similarity"],
        "relation": ["geometry", "debiased_similarity"],
        "sentence": ["debiased_similarity", "min_phrase_similarity", "min_relation_geometry"],
    }

    # With a matching head (engine/backends/sceneworld_mini/matcher.py) its logit leads every level's features.
    matcher_feature_names = {
        "phrase": ["match_logit", "debiased_similarity"],
        "relation": ["geometry", "debiased_similarity", "match_logit"],
        "sentence": ["match_logit", "debiased_similarity", "min_phrase_match", "min_relation_geometry"],
    }
    # A head with phrase-patch alignment adds each phrase's best patch alignment (does anything
    # in the image look like what the phrase says?) and draws the maps from it.
    alignment_feature_names = {
        "phrase": ["match_logit", "align_max", "debiased_similarity"],
        "relation": ["geometry", "debiased_similarity", "match_logit"],
        "sentence": ["match_logit", "debiased_similarity", "min_phrase_match", "min_relation_geometry",
                     "min_phrase_align"],
    }

    def __init__(self, embedder: Any, calibration: Calibration | None = None, *, method: str | None = None,
                 gradcam_layer: int = -1, stats: dict[str, list[float]] | None = None,
                 use_matcher: bool = True) -> None:
        super().__init__(embedder, calibration)
        self.matcher = None
        if use_matcher:
            from engine.backends.sceneworld_mini.matcher import load_matcher
            from engine.grounding.calibration import model_dir_of

            model_dir = model_dir_of(embedder)
            if model_dir is not None:
                self.matcher = load_matcher(model_dir, embedder.cfg, str(embedder.device))
        self.aligned = self.matcher is not None and self.matcher.has_alignment
        if self.matcher is not None:
            self.feature_names = self.alignment_feature_names if self.aligned else self.matcher_feature_names
        # A model trained with phrase-region alignment (the CAFT-style variant, docs/caft.md) also has
        # phrase vectors pooled in context, the ones its local loss aligned with regions (method
        # "context"). Not the default: on 200 test scenes its maps pointed right 0.245 of the time
        # against 0.395 for the same phrases encoded alone (docs/caft.md), context leaks in.
        self.contextual = getattr(embedder.cfg, "text_pooling", "mean") == "part_to_whole"
        if method is None:
            # Alignment maps point far better where the head has them (docs/grounding.md), and the
            # calibration is fitted on the default method's relation geometry.
            method = "align" if self.aligned else "patch"
        if method not in ("patch", "gradcam", "align", "context"):
            raise ValueError("method must be 'patch', 'gradcam', 'align' or 'context'")
        if method == "context" and not self.contextual:
            raise ValueError("method 'context' needs a model with part-to-whole text pooling (docs/caft.md)")
        if method == "align" and not self.aligned:
            raise ValueError("method 'align' needs a matching head trained with phrase-patch alignment")
        self.kind = method
        self.gradcam_layer = gradcam_layer
        self.method = {"patch": "patch-similarity-shifted", "align": "phrase-patch-alignment-shifted",
                       "context": "phrase-in-context-patch-similarity-shifted"}.get(
            method, f"gradcam-layer{gradcam_layer}")
        self.grid = int(embedder.cfg.grid)
        self._stats: dict[str, np.ndarray] = {}
        if stats is None and calibration is not None:
            stats = calibration.stats
        if stats:
            self.set_statistics(stats)

    # -- statistics (mean image embedding, text prior) -------------------------------------
    def set_statistics(self, stats: dict[str, Any]) -> None:
        self._stats = {k: np.asarray(v, dtype=np.float32) for k, v in stats.items()}

    def _stat(self, name: str) -> np.ndarray:
        if name not in self._stats:
            # No stored calibration for these weights: derive the statistics now from a small
            # validation sample (about a second), so maps and scores keep their meaning.
            from engine.grounding.calibration import VALIDATION_SEED

            self.set_statistics(self.fit_statistics(seed=VALIDATION_SEED, n=64))
        return self._stats[name]

    def fit_statistics(self, *, seed: int, n: int) -> dict[str, list[float]]:
        from engine.sceneworld import check_eval_seed, generate_scenes, render_scene

        check_eval_seed(seed)
        scenes = generate_scenes(seed, 0, n)
        images = [render_scene(s, max(256, self.embedder.image_size))[0] for s in scenes]
        img = self.embedder.encode_images(images)
        # Every noun phrase, settings included (as when they had no kind of their own).
        phrases = sorted({p.text for s in scenes for t in [s.paragraph, *s.positives]
                          for p in chunk(t.text).phrases if p.kind != "relation"})
        txt = self.embedder.encode_texts(phrases)
        stats = {"image_mean": img.mean(0).tolist(), "text_prior": txt.mean(0).tolist()}
        if self.contextual:
            # The same prior for phrase vectors pooled in context (method "context").
            ctx = []
            for s in scenes:
                for t in (s.paragraph, *s.positives):
                    spans = [(p.start, p.end) for p in chunk(t.text).phrases if p.kind != "relation"]
                    if spans:
                        ctx.append(self.embedder.phrase_vectors(t.text, spans))
            stats["context_prior"] = np.concatenate(ctx).mean(0).tolist()
        return stats

    # -- features ------------------------------------------------------------------------
    @torch.inference_mode()
    def image_features(self, image: Image.Image) -> MiniImageFeatures:
        emb = self.embedder
        x = torch.from_numpy(emb.preprocess([image])).to(emb.device)
        size = x.shape[-1]
        batch = torch.cat([
            F.pad(x, (dx, 0, dy, 0), mode="replicate")[:, :, :size, :size] if (dx or dy) else x
            for dy, dx in SHIFTS
        ])
        p = emb.model.vision.patch_embeddings(batch).float()
        g = F.normalize(p[0].mean(0), dim=-1)  # unshifted: exactly the image embedding
        # Alignment maps need the matcher's tokens of every shift; the match logit only the first.
        tokens = self.matcher.image_tokens(batch if self.aligned else x) if self.matcher is not None else None
        return MiniImageFeatures(g.cpu().numpy(), F.normalize(p, dim=-1).cpu().numpy(), x, tokens)

    @torch.inference_mode()
    def match_logits(self, feats: MiniImageFeatures, texts: list[str]) -> np.ndarray:
        """The matching head's logit for each text against the image (0: undecided)."""
        if self.matcher is None or feats.match_tokens is None or not texts:
            return np.zeros(len(texts), np.float32)
        from engine.backends.sceneworld_mini.matcher import MAX_TOKENS
        from engine.backends.sceneworld_mini.network import tokenize

        ids, mask = tokenize(self.embedder.tokenizer, texts, MAX_TOKENS)
        device = feats.match_tokens.device
        tokens = feats.match_tokens[:1].expand(len(texts), -1, -1)
        return self.matcher(tokens, ids.to(device), mask.to(device)).float().cpu().numpy()

    @torch.inference_mode()
    def align_maps(self, feats: MiniImageFeatures, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Phrase-patch alignment: (k, MAP_GRID, MAP_GRID) probability maps (shift-averaged) and
        each phrase's best unshifted patch logit."""
        from engine.backends.sceneworld_mini.matcher import MAX_TOKENS
        from engine.backends.sceneworld_mini.network import tokenize

        assert self.matcher is not None and feats.match_tokens is not None
        k, s = len(texts), len(SHIFTS)
        ids, mask = tokenize(self.embedder.tokenizer, texts, MAX_TOKENS)
        device = feats.match_tokens.device
        tokens = feats.match_tokens[None].expand(k, -1, -1, -1).reshape(k * s, *feats.match_tokens.shape[1:])
        logits = self.matcher.align_logits(tokens, ids.to(device).repeat_interleave(s, 0),
                                           mask.to(device).repeat_interleave(s, 0)).float()
        logits = logits.reshape(k, s, self.grid, self.grid)
        best = logits[:, 0].flatten(1).amax(1).cpu().numpy()
        probs = torch.sigmoid(logits).transpose(0, 1).cpu().numpy()  # (S, k, g, g)
        return self._unshift(probs), best

    def phrase_maps(self, feats: MiniImageFeatures, text_emb: np.ndarray, prior: str = "text_prior") -> np.ndarray:
        """(k, MAP_GRID, MAP_GRID) raw maps for k text embeddings (not normalised), minus `prior`."""
        if self.kind == "gradcam":
            return self._gradcam_maps(feats, text_emb)
        q = text_emb - self._stat(prior)[None]
        g = self.grid
        return self._unshift(np.einsum("spd,kd->skp", feats.patches, q).reshape(len(SHIFTS), len(q), g, g))

    def _unshift(self, m: np.ndarray) -> np.ndarray:
        """(len(SHIFTS), k, G, G) maps of the shifted inputs -> (k, MAP_GRID, MAP_GRID) averaged
        in original image coordinates."""
        size = self.embedder.image_size
        cell = size // self.grid
        k = m.shape[1]
        up = np.repeat(np.repeat(m, cell, axis=2), cell, axis=3)  # (S, k, size, size)
        acc = np.zeros((k, size, size), np.float32)
        for s, (dy, dx) in enumerate(SHIFTS):
            # The content moved by (+dy, +dx): original pixel y is shifted pixel y + dy.
            acc += np.pad(up[s], ((0, 0), (0, dy), (0, dx)), mode="edge")[:, dy:, dx:]
        f = size // MAP_GRID
        return (acc / len(SHIFTS)).reshape(k, MAP_GRID, f, MAP_GRID, f).mean(axis=(2, 4))

    def _gradcam_maps(self, feats: MiniImageFeatures, text_emb: np.ndarray) -> np.ndarray:
        vis = self.embedder.model.vision
        q = torch.from_numpy(text_emb - self._stat("text_prior")[None]).to(feats.pixels.device)
        k = len(q)
        with torch.enable_grad():
            x = feats.pixels.repeat(k, 1, 1, 1)
            z = vis.stem(x).flatten(2).transpose(1, 2) + vis.pos
            layers = list(vis.encoder.layers)
            target = self.gradcam_layer % (len(layers) + 1)  # 0: stem output, i: after layer i
            acts = z
            h = z
            for i, layer in enumerate(layers):
                if i == target:
                    acts = h
                h = layer(h)
            if target == len(layers):
                acts = h
            if target == 0:
                acts = z
            tokens = vis.norm(h)
            g = F.normalize(vis.proj(tokens.mean(1)), dim=-1)
            score = (g * q).sum()
            (grad,) = torch.autograd.grad(score, acts)
        w = grad.mean(1, keepdim=True)  # Grad-CAM: channel weights averaged over patches
        cam = torch.relu((w * acts).sum(-1)).detach().cpu().numpy().reshape(k, self.grid, self.grid)
        return cam

    # -- analysis --------------------------------------------------------------------------
    def _analyse(self, feats: MiniImageFeatures, text: str, chunking: Chunking) -> Analysis:
        phrases = chunking.phrases
        claims, sentences = claims_and_sentences(text, chunking)
        emb = self.embed_texts(claims + sentences)
        ph_emb, sent_emb = emb[: len(claims)], emb[len(claims):]
        mu = self._stat("image_mean")
        debiased = lambda e: (e @ feats.global_emb - e @ mu) if len(e) else np.zeros(0)  # noqa: E731
        ph_sim = debiased(ph_emb)
        sent_sim = debiased(sent_emb)
        with_matcher = self.matcher is not None
        if with_matcher:
            logits = self.match_logits(feats, claims + sentences)
            ph_match, sent_match = logits[: len(claims)], logits[len(claims):]

        nouns = [i for i, p in enumerate(phrases) if p.kind != "relation"]
        side = self.grid if self.kind == "gradcam" else MAP_GRID
        maps = np.zeros((len(phrases), side, side), np.float32)
        ph_align = np.zeros(len(phrases), np.float32)
        if nouns:
            if self.aligned:
                align_raw, best = self.align_maps(feats, [claims[i] for i in nouns])
                ph_align[nouns] = best
            if self.kind == "context":
                ctx = self.embedder.phrase_vectors(text, [(phrases[i].start, phrases[i].end) for i in nouns])
                raw = self.phrase_maps(feats, ctx, prior="context_prior")
            else:
                raw = align_raw if self.kind == "align" else self.phrase_maps(feats, ph_emb[nouns])
            for j, i in enumerate(nouns):
                maps[i] = normalise(raw[j])
        levels, x = [], []
        for i, p in enumerate(phrases):
            if p.kind == "relation":
                levels.append("relation")
                x.append([map_relation(maps, i, p, maps), float(ph_sim[i])] + ([float(ph_match[i])] if with_matcher else []))
            else:
                levels.append("phrase")
                x.append(([float(ph_match[i])] if with_matcher else [])
                         + ([float(ph_align[i])] if self.aligned else []) + [float(ph_sim[i])])
        sx = []
        for si in range(len(sentences)):
            own = [k for k, s in enumerate(chunking.phrase_sentence) if s == si]
            nps = [x[k][0] for k in own if levels[k] == "phrase"]
            rels = [x[k][0] for k in own if levels[k] == "relation"]
            own_sent = float(sent_match[si]) if with_matcher else float(sent_sim[si])
            row = [float(sent_sim[si]), min(nps) if nps else own_sent, min(rels) if rels else 0.0]
            if self.aligned:
                aligns = [x[k][1] for k in own if levels[k] == "phrase"]
                row.append(min(aligns) if aligns else 0.0)
            sx.append([own_sent, *row] if with_matcher else row)
        return Analysis(text, chunking, maps, levels, x, sx)

    def gradcam_layers(self) -> list[int]:
        """0 = the stem's patch tokens, i = the output of transformer layer i."""
        return list(range(len(self.embedder.model.vision.encoder.layers) + 1))

    def _uncalibrated(self, level: str, x: np.ndarray) -> np.ndarray:
        # Without a calibration for these weights: a fixed, monotone squashing (documented as
        # uncalibrated; Grounding.calibrated is False).
        if self.matcher is not None and level != "relation":
            return sigmoid(x[:, 0])  # the head was trained class-balanced: logit 0 = undecided
        scale = {"phrase": 20.0, "relation": 10.0, "sentence": 20.0}[level]
        return sigmoid(scale * x[:, 0])
