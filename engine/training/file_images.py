"""The trainer's ImageSource over a training file's image files, for what needs the pictures
themselves and not only their cached embeddings (local phrase-region alignment: the regions).

Each call decodes the files with the indexer's safe decoder (engine.indexing.decode: upright, never
blocking on a file that is now a FIFO or a folder) and preprocesses them with the base model's own
`preprocess`, so the pixels are the ones its embeddings were cached from.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

from engine.errors import DecodeError, LonglensError

#: Decoding threads per batch (decoding is most of the cost; the model runs after it).
DECODE_WORKERS = 4


class FileImages:
    """`pixels(indices)` of image files: decoded at `image_size` or larger, then `preprocess`ed."""

    def __init__(self, paths: Sequence[Path], preprocess: Callable[[list[Any]], np.ndarray], image_size: int,
                 *, workers: int = DECODE_WORKERS) -> None:
        self.paths = [Path(p) for p in paths]
        self.preprocess = preprocess
        self.image_size = int(image_size)
        self.workers = max(1, int(workers))

    def __len__(self) -> int:
        return len(self.paths)

    def _decode(self, path: Path) -> Any:
        from engine.indexing.decode import decode_image

        try:
            return decode_image(path, target_size=self.image_size)[0]
        except DecodeError as exc:
            # It decoded when its embedding was cached: the file changed during the run.
            raise LonglensError(f"{path}: cannot decode the image any more ({exc.reason}); it changed after its "
                                "embedding was cached") from None

    def pixels(self, indices: np.ndarray) -> torch.Tensor:
        paths = [self.paths[int(i)] for i in indices]
        with ThreadPoolExecutor(max_workers=min(self.workers, max(1, len(paths)))) as pool:
            images = list(pool.map(self._decode, paths))
        return torch.from_numpy(np.ascontiguousarray(self.preprocess(images), dtype=np.float32))
