"""Grounding for BLIP: ITM Grad-CAM maps (or patch-token similarity) and ITM supports.

Maps (method "gradcam", the default): BLIP's own visualisation (ALBEF/BLIP, LAVIS'
compute_gradcam). Each sentence goes through the ITM path once (text encoder with
cross-attention over all image patch states, ITM head). For the cross-attention of one
layer, the attention probabilities A (heads, text tokens, image tokens) and the gradient
dL/dA of the "match" logit are combined as mean over heads of A * relu(dL/dA); a phrase's
map is the mean of that over the phrase's word pieces, [CLS]-image column dropped, reshaped
to the patch grid (24 x 24 for ViT-B/16 at 384 px). One forward and one backward of the
text encoder per sentence; the image is encoded once without gradients.
The layer: LAVIS uses block 6 (0-based) of the 12 for BLIP; `longlens eval grounding` with
`--gradcam-layer` measures any layer on SceneWorld (see docs/grounding.md for why no layer
can be measured on this machine's random-weight models).

Method "patch": cheaper, no ITM: cosine of the phrase's projected text feature with each
patch token projected by vision_proj (the head was trained on [CLS] only, so this is an
approximation in the spirit of MaskCLIP).

Supports: the ITM match probability (2-way softmax, 0.5 = undecided by construction) of
each phrase's claim and each sentence; when a calibration for the exact weights exists it
re-maps the ITM logit difference (Platt) on SceneWorld validation scenes.

A BLIP model without cross-attention layers (a text config without is_decoder) has no ITM
path; then maps fall back to patch similarity and supports to the ITC cosine.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F

from engine.grounding.base import Analysis, BaseGrounder, claims_and_sentences
from engine.grounding.calibration import Calibration, sigmoid
from engine.grounding.chunking import Chunking
from engine.grounding.maps import normalise

if TYPE_CHECKING:
    from PIL import Image

DEFAULT_GRADCAM_LAYER = 6


@dataclass
class BlipImageFeatures:
    states: torch.Tensor  # (1, 1 + P, H) vision tokens
    patch_feats: torch.Tensor  # (P, D) normalised vision_proj(patch tokens)
    global_feat: torch.Tensor  # (D,) normalised image embedding


def gradcam_from(attn: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """Grad-CAM over cross-attention: mean over heads of attn * relu(grad).

    attn, grad: (B, heads, text tokens, image tokens) -> (B, text tokens, image tokens).
    """
    return (attn * grad.clamp(min=0)).mean(dim=1)


class CrossAttentionRecorder:
    """Forward hook on a cross-attention module that keeps its attention probabilities in the
    autograd graph, so their gradient can be asked for after the forward pass."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.attn: torch.Tensor | None = None
        self._thread = threading.get_ident()
        self._handle = module.register_forward_hook(self._hook)

    def _hook(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        # The module is shared: another thread's forward pass (a second grounding's ITM scores,
        # under inference mode) runs through the hook too and must not replace this pass's
        # attention (its tensor has no graph: "does not require grad", seen stepping through
        # results in the inspector).
        if threading.get_ident() != self._thread:
            return
        # BlipTextSelfAttention returns (context, attention_probs).
        self.attn = output[1]

    def remove(self) -> None:
        self._handle.remove()

    def __enter__(self) -> CrossAttentionRecorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def has_cross_attention(model: Any) -> bool:
    layers = model.text_encoder.encoder.layer
    return len(layers) > 0 and all(hasattr(layer, "crossattention") for layer in layers)


class BlipGrounder(BaseGrounder):
    feature_names = {
        "phrase": ["itm_logit_difference"],
        "relation": ["itm_logit_difference"],
        "sentence": ["itm_logit_difference"],
    }

    def __init__(self, embedder: Any, calibration: Calibration | None = None, *, method: str = "gradcam",
                 gradcam_layer: int = DEFAULT_GRADCAM_LAYER, enc_token: bool = True) -> None:
        super().__init__(embedder, calibration)
        # The GUI grounds from worker threads; a forward hook on a shared module must only
        # see its own forward pass.
        self._hook_lock = threading.Lock()
        self.model = embedder.model
        self.tokenizer = embedder.tokenizer
        self.itm = has_cross_attention(self.model)
        if method not in ("gradcam", "patch"):
            raise ValueError("method must be 'gradcam' or 'patch'")
        n_layers = len(self.model.text_encoder.encoder.layer)
        self.gradcam_layer = int(gradcam_layer) % max(n_layers, 1)
        self.kind = method if self.itm else "patch"
        self.method = f"itm-gradcam-layer{self.gradcam_layer}" if self.kind == "gradcam" else "patch-similarity"
        cfg = embedder.config.vision_config
        self.grid = int(cfg.image_size) // int(cfg.patch_size)
        # BLIP trains its ITM head with [ENC] in place of [CLS] (BLIP's blip_retrieval/LAVIS);
        # transformers' BlipForImageTextRetrieval feeds the ids as given.
        enc_id = self.tokenizer.convert_tokens_to_ids("[ENC]") if enc_token else None
        self.enc_id = enc_id if isinstance(enc_id, int) and enc_id != self.tokenizer.unk_token_id else None
        if not self.itm:
            self.feature_names = {k: ["itc_cosine"] for k in ("phrase", "relation", "sentence")}

    def fit_statistics(self, *, seed: int, n: int) -> dict[str, list[float]]:
        return {}

    def set_statistics(self, stats: dict[str, Any]) -> None:
        pass

    # -- features ------------------------------------------------------------------------
    @torch.no_grad()  # not inference_mode: Grad-CAM later runs autograd over these states
    def image_features(self, image: Image.Image) -> BlipImageFeatures:
        emb = self.embedder
        x = torch.from_numpy(emb.preprocess([image])).to(device=emb.device, dtype=emb.torch_dtype)
        states = emb.vision_states(x)
        proj = self.model.vision_proj(states[0]).float()
        return BlipImageFeatures(states, F.normalize(proj[1:], dim=-1), F.normalize(proj[0], dim=-1))

    def _tokenize(self, texts: list[str], offsets: bool = False) -> Any:
        return self.tokenizer(texts, truncation=True, max_length=self.embedder.max_text_tokens, padding=True,
                              return_tensors="pt", return_offsets_mapping=offsets)

    def itm_input_ids(self, ids: torch.Tensor) -> torch.Tensor:
        if self.enc_id is None:
            return ids
        ids = ids.clone()
        ids[:, 0] = self.enc_id
        return ids

    def itm_logits(self, feats: BlipImageFeatures, texts: list[str]) -> np.ndarray:
        """(k,) match-minus-no-match ITM logits (sigmoid of it = the ITM match probability)."""
        if not texts:
            return np.zeros(0)
        out = []
        bs = self.embedder.batch_size
        with torch.inference_mode():
            for start in range(0, len(texts), bs):
                enc = self._tokenize(texts[start : start + bs])
                ids = self.itm_input_ids(enc["input_ids"]).to(self.embedder.device)
                mask = enc["attention_mask"].to(self.embedder.device)
                img = feats.states.expand(len(ids), -1, -1)
                h = self.model.text_encoder(input_ids=ids, attention_mask=mask, encoder_hidden_states=img,
                                            encoder_attention_mask=torch.ones(img.shape[:2], dtype=torch.long,
                                                                              device=img.device)).last_hidden_state
                logits = self.model.itm_head(h[:, 0, :]).float()
                out.append((logits[:, 1] - logits[:, 0]).cpu().numpy())
        return np.concatenate(out).astype(np.float64)

    def _itc(self, feats: BlipImageFeatures, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """ITC text features (k, D) and their cosines with the image."""
        t = torch.from_numpy(self.embedder.encode_texts(texts)).to(feats.global_feat.device)
        return t, (t @ feats.global_feat).cpu().numpy().astype(np.float64)

    def sentence_gradcam(self, feats: BlipImageFeatures, sentence: str) -> tuple[np.ndarray, list[tuple[int, int]]]:
        """Per-token Grad-CAM maps (L, grid, grid) for a sentence, and each token's char span."""
        enc = self._tokenize([sentence], offsets=True)
        ids = self.itm_input_ids(enc["input_ids"]).to(self.embedder.device)
        mask = enc["attention_mask"].to(self.embedder.device)
        layer = self.model.text_encoder.encoder.layer[self.gradcam_layer].crossattention.self
        img = feats.states.detach()
        with self._hook_lock, torch.enable_grad(), CrossAttentionRecorder(layer) as rec:
            h = self.model.text_encoder(input_ids=ids, attention_mask=mask, encoder_hidden_states=img,
                                        encoder_attention_mask=torch.ones(img.shape[:2], dtype=torch.long,
                                                                          device=img.device)).last_hidden_state
            logit = self.model.itm_head(h[:, 0, :])[:, 1].sum()
            assert rec.attn is not None
            (grad,) = torch.autograd.grad(logit, rec.attn)
            cam = gradcam_from(rec.attn.detach().float(), grad.float())[0, :, 1:]  # drop image [CLS]
        g = self.grid
        maps = cam.reshape(cam.shape[0], g, g).cpu().numpy()
        spans = [tuple(map(int, o)) for o in enc["offset_mapping"][0].tolist()]
        return maps, spans

    # -- analysis --------------------------------------------------------------------------
    def _analyse(self, feats: BlipImageFeatures, text: str, chunking: Chunking) -> Analysis:
        phrases = chunking.phrases
        claims, sentences = claims_and_sentences(text, chunking)
        maps = np.zeros((len(phrases), self.grid, self.grid), np.float32)
        if self.itm:
            scores = self.itm_logits(feats, claims + sentences)
        else:
            _, scores = self._itc(feats, claims + sentences)
        ph_scores, sent_scores = scores[: len(claims)], scores[len(claims):]
        if self.kind == "gradcam":
            for si, (s0, _) in enumerate(chunking.sentences):
                own = [i for i, o in enumerate(chunking.phrase_sentence) if o == si]
                if not own:
                    continue
                token_maps, spans = self.sentence_gradcam(feats, sentences[si])
                for i in own:
                    p = phrases[i]
                    a, b = p.start - s0, p.end - s0
                    toks = [k for k, (x0, x1) in enumerate(spans) if x1 > x0 and x0 < b and x1 > a]
                    if toks:
                        maps[i] = normalise(token_maps[toks].mean(axis=0))
        elif phrases:
            t, _ = self._itc(feats, claims)
            sims = (t @ feats.patch_feats.T).cpu().numpy().reshape(len(phrases), self.grid, self.grid)
            for i in range(len(phrases)):
                maps[i] = normalise(sims[i])
        levels = ["relation" if p.kind == "relation" else "phrase" for p in phrases]
        return Analysis(text, chunking, maps, levels, [[float(s)] for s in ph_scores],
                        [[float(s)] for s in sent_scores])

    def gradcam_layers(self) -> list[int]:
        """The text encoder's layers (their cross-attention is what Grad-CAM reads)."""
        return list(range(len(self.model.text_encoder.encoder.layer)))

    def _uncalibrated(self, level: str, x: np.ndarray) -> np.ndarray:
        if self.itm:
            return sigmoid(x[:, 0])  # exactly the ITM head's softmax match probability
        return sigmoid((x[:, 0] - 0.2) * 20.0)  # ITC cosine: uncalibrated squashing
