"""Fixtures for the scale-out tests: a generated photo folder, Longlens homes with the tiny BLIP model,
and the single-process index every cluster result is compared with."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.config import Paths, get_paths
from engine.jobs import run_to_end
from engine.models.download import import_model
from engine.models.registry import installed_identity
from engine.samples import make_sample_folder
from engine.services import Services

MODEL = "tiny"
N_PHOTOS = 300
QUERIES = (
    "A red bicycle leans against a blue door next to a window with white shutters.",
    "Two dogs run across a sandy beach under a grey sky while waves break behind them.",
    "A small wooden table with a bowl of green apples stands in a bright kitchen.",
)


def make_home(root: Path, checkpoint: Path) -> Paths:
    paths = get_paths(root).ensure()
    import_model(checkpoint, MODEL, paths)
    return paths


@pytest.fixture(scope="session")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A few hundred real image files (JPEG, PNG, WebP, TIFF, BMP, GIF, HEIC/AVIF) in three folders,
    plus one unreadable file. Shared: tests that change files copy the folder first."""
    root = tmp_path_factory.mktemp("cluster") / "photos"
    make_sample_folder(root, n=N_PHOTOS, seed=11, size=(64, 48))
    (root / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    return root


@pytest.fixture(scope="session")
def single_process_home(tmp_path_factory, blip_tiny_checkpoint, photos) -> Paths:
    """`photos` indexed the ordinary way (engine.indexing.pipeline.Indexer) in its own catalog."""
    paths = make_home(tmp_path_factory.mktemp("single") / "home", blip_tiny_checkpoint)
    with Services(paths) as svc:
        last = run_to_end(svc.indexer(svc.embedder(MODEL)).run(photos))
    s = last.extra["summary"]
    assert s.new == N_PHOTOS and s.unreadable == [{"path": "broken.jpg", "reason": "truncated"}]
    return paths


@pytest.fixture
def cluster_home(tmp_path, blip_tiny_checkpoint) -> Paths:
    return make_home(tmp_path / "home", blip_tiny_checkpoint)


def rankings(paths: Paths, photos: Path) -> list[list[tuple[str, float]]]:
    """Full rankings (every image) for the text queries and three query images."""
    with Services(paths) as svc:
        searcher = svc.searcher(svc.embedder(MODEL))
        out = [[(h.rel_path, h.score) for h in searcher.search_text(q, top_k=1000).hits] for q in QUERIES]
        for name in ("sample_000.jpg", "2023 summer/sample_001.png", "2024/city/sample_002.webp"):
            out.append([(h.rel_path, h.score) for h in searcher.search_image(photos / name, top_k=1000).hits])
    return out


def assert_same_results(a: list[list[tuple[str, float]]], b: list[list[tuple[str, float]]]) -> None:
    """Same images, same scores and the same order; vectors computed in batches of another
    composition differ in the last float bit (~1e-7), so only images whose scores tie to within
    1e-5 may trade places, and then the score at each rank still agrees."""
    assert len(a) == len(b)
    for ra, rb in zip(a, b, strict=True):
        assert len(ra) == len(rb) > 0
        sa, sb = dict(ra), dict(rb)
        assert sa.keys() == sb.keys()
        for path, score in sa.items():
            assert sb[path] == pytest.approx(score, abs=1e-5), path
        for (pa, score_a), (pb, _) in zip(ra, rb, strict=True):
            assert pa == pb or abs(sa[pb] - score_a) < 1e-5, (pa, pb)


def catalog_state(paths: Paths) -> tuple[dict[str, tuple], dict[str, np.ndarray]]:
    """Of the one library: rel_path -> (status, reason, size, mtime, hash, width, height, EXIF fields),
    and rel_path -> vector."""
    with Services(paths) as svc:
        (lib,) = svc.catalog.libraries()
        recs = svc.catalog.image_records(lib.id)
        ids, vecs = svc.catalog.all_vectors(lib.id, installed_identity(MODEL, paths).image)
    rel = {r.id: r.rel_path for r in recs}
    rows = {r.rel_path: (r.status, r.reason, r.size, r.mtime_ns, r.content_hash, r.width, r.height, r.exif_date,
                         r.camera_make, r.camera_model, r.orientation) for r in recs}
    return rows, {rel[int(i)]: v for i, v in zip(ids, vecs, strict=True)}


def assert_same_catalog(a: Paths, b: Paths) -> None:
    rows_a, vec_a = catalog_state(a)
    rows_b, vec_b = catalog_state(b)
    assert rows_a == rows_b
    assert vec_a.keys() == vec_b.keys()
    for path, v in vec_a.items():
        np.testing.assert_allclose(vec_b[path], v, atol=1e-6, err_msg=path)
