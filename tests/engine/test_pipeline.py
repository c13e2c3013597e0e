"""The indexing generator through the Python API: cancel, copies, HNSW mode, progress reports."""

from __future__ import annotations

import shutil
import threading

import numpy as np
import pytest

from engine.config import get_paths
from engine.index.store import IndexStore
from engine.jobs import CancelToken
from engine.models.download import import_model
from engine.samples import make_sample_folder
from engine.services import Services

MODEL = "tiny"


@pytest.fixture
def services(tmp_path, blip_tiny_checkpoint):
    paths = get_paths(tmp_path / "home").ensure()
    import_model(blip_tiny_checkpoint, MODEL, paths)
    svc = Services(paths)
    yield svc
    svc.close()


def _summary(job):
    reports = list(job)
    assert reports[-1].stage == "done"
    return reports, reports[-1].extra["summary"]


def test_progress_reports_count_rate_and_eta(services, tmp_path):
    photos = tmp_path / "p"
    make_sample_folder(photos, n=20, seed=3, size=(64, 48))
    emb = services.embedder(MODEL)
    reports, s = _summary(services.indexer(emb, batch_size=4).run(photos))
    index_reports = [r for r in reports if r.stage == "index"]
    assert [r.done for r in index_reports] == [4, 8, 12, 16, 20]
    assert all(r.total == 20 for r in index_reports)
    assert all(r.rate and r.rate > 0 for r in index_reports)
    assert index_reports[-1].eta_s == 0
    assert s.new == 20 and s.embedded == 20


def test_cancel_keeps_committed_batches_and_resumes(services, tmp_path):
    photos = tmp_path / "p"
    make_sample_folder(photos, n=24, seed=4, size=(64, 48))
    emb = services.embedder(MODEL)
    token = CancelToken()
    job = services.indexer(emb, batch_size=4).run(photos, cancel=token)
    done_before_cancel = 0
    for report in job:
        if report.stage == "index":
            done_before_cancel = report.done
            if report.done == 8:
                token.cancel()
        if report.stage == "done":
            s = report.extra["summary"]
    assert s.cancelled and done_before_cancel == 8
    lib = services.catalog.libraries()[0]
    assert len(services.catalog.embedded_ids(lib.id, emb.identity)) == 8
    assert s.deleted == 0  # no sweep after an incomplete pass
    _, s2 = _summary(services.indexer(emb, batch_size=4).run(photos))
    assert s2.new == 16 and s2.unchanged == 8 and not s2.cancelled
    assert len(services.catalog.embedded_ids(lib.id, emb.identity)) == 24


def test_copies_reuse_vectors_without_inference(services, tmp_path):
    photos = tmp_path / "p"
    files = make_sample_folder(photos, n=6, seed=5, size=(64, 48))
    emb = services.embedder(MODEL)
    _summary(services.indexer(emb).run(photos))
    (photos / "copies").mkdir()
    for f in files[:3]:
        shutil.copy2(f, photos / "copies" / f.name)
    _, s = _summary(services.indexer(emb).run(photos))
    assert s.new == 3 and s.reused == 3 and s.embedded == 0
    lib = services.catalog.libraries()[0]
    recs = {r.rel_path: r for r in services.catalog.image_records(lib.id)}
    for f in files[:3]:
        a, b = recs[f.relative_to(photos).as_posix()], recs[f"copies/{f.name}"]
        np.testing.assert_array_equal(*services.catalog.vectors_for([a.id, b.id], emb.identity))
        assert (a.width, a.height, a.exif_date) == (b.width, b.height, b.exif_date)


def test_hnsw_mode_search_matches_exact(services, tmp_path):
    """With the exact-search threshold forced to 0 the HNSW path serves the same top hits."""
    photos = tmp_path / "p"
    make_sample_folder(photos, n=40, seed=6, size=(64, 48))
    emb = services.embedder(MODEL)
    _summary(services.indexer(emb).run(photos))
    exact = services.searcher(emb).search_text("a red square above a blue circle", top_k=10)
    hnsw_store = IndexStore(services.paths.indexes / "hnsw", services.catalog, exact_threshold=0)
    idx = hnsw_store.get(services.catalog.libraries()[0].id, emb.identity, emb.dim)
    assert idx.mode == "hnsw"
    from engine.search.searcher import Searcher

    approx = Searcher(services.catalog, hnsw_store, emb).search_text("a red square above a blue circle", top_k=10)
    assert [h.path for h in approx.hits] == [h.path for h in exact.hits]
    np.testing.assert_allclose([h.score for h in approx.hits], [h.score for h in exact.hits], atol=1e-5)


class _BlockedEmbedder:
    """The real model, held inside encode_pixels until the test releases it: a batch whose model
    work never ends on its own, so only a cancel that does not wait for the model can return."""

    def __init__(self, inner):
        self._inner = inner
        self.started = threading.Event()
        self.release = threading.Event()
        self.returned = threading.Event()

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def encode_pixels(self, pixels):
        self.started.set()
        self.release.wait(60)
        try:
            return self._inner.encode_pixels(pixels)
        finally:
            self.returned.set()


def test_cancel_takes_effect_mid_batch_without_waiting_for_the_model(services, tmp_path):
    """Ordered by events, not timed: the job ends while its batch is still inside the model."""
    photos = tmp_path / "p"
    make_sample_folder(photos, n=40, seed=8, size=(64, 48))
    emb = _BlockedEmbedder(services.embedder(MODEL))
    token = CancelToken()
    job = services.indexer(emb, batch_size=32).run(photos, cancel=token)

    def cancel_once_the_model_runs():
        emb.started.wait(60)
        token.cancel()

    t = threading.Thread(target=cancel_once_the_model_runs)
    t.start()
    try:
        reports = list(job)
        model_still_running = not emb.returned.is_set()
    finally:
        emb.release.set()
        t.join()
    s = reports[-1].extra["summary"]
    assert s.cancelled
    assert model_still_running, "the cancelled job waited for its batch to leave the model"
    # The interrupted batch was dropped whole: nothing half-committed.
    lib = services.catalog.libraries()[0]
    assert len(services.catalog.embedded_ids(lib.id, emb.identity)) in (0, 32)
