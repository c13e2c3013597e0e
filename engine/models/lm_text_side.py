"""Any backend's embedder with its texts read by a trained LM text tower (engine/models/lm_tower.py).

`longlens train --text-tower MINILM_OR_FOLDER` writes an LM tower folder (lm_tower.json, ...)
trained into a base model's image space; `--text-tower FOLDER` on search, index, check and the
GUI settings then loads the base model as always and lets the tower encode the queries. Images,
pixels, the image identity, re-ranking and grounding stay the base embedder's (its attributes are
served through); the text side — encode_texts, token_count, the token limit, the text identity
(which hashes the tower folder, tokenizer included) — is the tower's.

Importing this module loads neither torch nor transformers (the registry imports it); the tower
is loaded when an embedder is built.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from engine.errors import ModelError

#: The file that marks an LM tower folder (engine.models.lm_tower.TOWER_CONFIG_FILE; a test keeps them equal).
LM_TOWER_MARKER = "lm_tower.json"


def is_lm_tower_folder(folder: Path | str | None) -> bool:
    return folder is not None and (Path(folder) / LM_TOWER_MARKER).is_file()


class LMTowerTextSide:
    """An Embedder: `base` for images, the LM tower in `tower_dir` for texts."""

    def __init__(self, base: Any, tower_dir: Path, *, text_identity: str | None = None) -> None:
        from engine.models.lm_tower import load_tower

        self._base = base
        self.tower = load_tower(Path(tower_dir), str(getattr(base, "device", "cpu")))
        if self.tower.dim != base.dim:
            raise ModelError(f"the text tower in {tower_dir} projects to {self.tower.dim} dimensions, but model "
                             f"{base.model_id!r} embeds images in {base.dim}: it was trained for another model")
        self.text_tower_dir = Path(tower_dir)
        self.text_model_id = self.tower.cfg.name or Path(tower_dir).name
        self.text_identity = text_identity or f"{base.text_identity}+{self.text_model_id}"
        self.max_text_tokens = self.tower.max_text_tokens
        self.default_text_tokens = min(int(base.default_text_tokens), self.max_text_tokens)

    @property
    def text_cleaning(self) -> Any:
        """The tower's (its tokenizer's normaliser), never the base model's: the tower reads the texts."""
        return self.tower.text_cleaning

    def __getattr__(self, name: str) -> Any:
        # Only reached for what this class does not define: the base embedder's image side.
        return getattr(self._base, name)

    def encode_texts(self, texts: Sequence[str], max_tokens: int | None = None) -> np.ndarray:
        return self.tower.encode(texts, self.default_text_tokens if max_tokens is None else max_tokens)

    def token_count(self, text: str) -> int:
        return self.tower.token_count(text)


def with_text_tower(base: Any, tower_dir: Path | None, *, text_identity: str | None = None) -> Any:
    """`base` itself, or `base` reading texts with the LM tower in `tower_dir`."""
    if not is_lm_tower_folder(tower_dir):
        return base
    return LMTowerTextSide(base, Path(tower_dir), text_identity=text_identity)
