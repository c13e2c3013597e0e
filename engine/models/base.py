"""The Embedder protocol every model backend implements.

Vectors are float32 and L2-normalised so that inner product == cosine similarity,
which is what both the exact search and hnswlib's "ip" space compute.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    from PIL import Image


@runtime_checkable
class Embedder(Protocol):
    #: The model's name as the user knows it (shown in every report; never a storage key).
    model_id: str
    #: Display name of the text tower (differs from model_id when a paragraph-trained override is loaded).
    text_model_id: str
    #: What computed the image vectors ("NAME@<hash of weights and configs>", see
    #: engine.models.registry.model_identity): stored next to every vector in the catalog and naming
    #: the ANN index, so a replaced model never serves vectors of its predecessor.
    identity: str
    #: The same for the text side (includes tokenizer and any text tower): keys text-side derived data.
    text_identity: str
    dim: int
    image_size: int
    #: Hard limit of the text tower's position embeddings.
    max_text_tokens: int
    #: Budget used when the caller does not pass max_tokens.
    default_text_tokens: int
    device: str

    def preprocess(self, images: Sequence[Image.Image]) -> np.ndarray:
        """RGB PIL images -> pixel values (N, 3, S, S) float32, exactly as the model expects."""
        ...

    def encode_pixels(self, pixel_values: np.ndarray) -> np.ndarray:
        """Pixel values from preprocess() -> (N, D) float32, L2-normalised."""
        ...

    def encode_images(self, images: Sequence[Image.Image]) -> np.ndarray:
        """RGB PIL images -> (N, D) float32, L2-normalised."""
        ...

    def encode_texts(self, texts: Sequence[str], max_tokens: int | None = None) -> np.ndarray:
        """Texts -> (N, D) float32, L2-normalised; each truncated to max_tokens (incl. special tokens)."""
        ...

    def token_count(self, text: str) -> int:
        """Number of tokens the text would take untruncated, special tokens included."""
        ...


def l2_normalise(x: np.ndarray, eps: float = 1e-12) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    return (x / np.maximum(norms, eps)).astype(np.float32, copy=False)


def to_rgb(image: Image.Image) -> Image.Image:
    """RGB the way transformers' convert_to_rgb does it: transparency is composited onto white.
    Every backend's preprocessing and the grounding overlays convert through it."""
    from PIL import Image

    has_alpha = "A" in image.getbands() or image.info.get("transparency") is not None
    if has_alpha:
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    if image.mode == "RGB":
        return image
    return image.convert("RGB")
