"""Frozen-vision embedding cache: embeddings equal the embedder's own, content-hash keys dedupe,
a cancelled job resumes where it stopped, bad files are reported, and a cache never mixes towers."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from engine.indexing.decode import decode_image
from engine.jobs import CancelToken, run_to_end
from engine.sceneworld.export import write_training_jsonl
from engine.training.cache import CacheError, EmbeddingCache, _WriterLock, build_cache, lookup


@pytest.fixture(scope="module")
def embedder(blip_tiny_checkpoint):
    from engine.backends.blip.embedder import BlipEmbedder

    return BlipEmbedder(blip_tiny_checkpoint, device="cpu")


@pytest.fixture(scope="module")
def image_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("cache-data")
    write_training_jsonl(root / "train.jsonl", root / "images", seed=5, n=10, size=48)
    return root / "images"


@pytest.fixture
def images(tmp_path, image_dir) -> list[Path]:
    dest = tmp_path / "images"
    shutil.copytree(image_dir, dest)
    return sorted(dest.glob("*.png"))


def _reference(embedder, paths) -> np.ndarray:
    return embedder.encode_images([decode_image(p, target_size=embedder.image_size)[0] for p in paths])


def test_cached_vectors_equal_the_embedders_own(tmp_path, embedder, images):
    last = run_to_end(build_cache(embedder, images, tmp_path / "cache", batch_size=4))
    assert last.stage == "done"
    assert (last.extra["added"], last.extra["reused"], last.extra["failed"]) == (10, 0, [])
    vectors, keep = lookup(tmp_path / "cache", images)
    assert keep.tolist() == list(range(10))
    np.testing.assert_allclose(vectors, _reference(embedder, images), rtol=1e-5, atol=1e-6)
    # On disk: a .npy memory map and an SQLite index.
    with EmbeddingCache(tmp_path / "cache") as cache:
        assert len(cache) == 10 and cache.vectors().shape == (10, embedder.dim)
        assert isinstance(np.load(tmp_path / "cache" / "embeddings.npy", mmap_mode="r"), np.memmap)


def test_same_content_under_two_names_is_embedded_once(tmp_path, embedder, images):
    twin = images[0].with_name("twin.png")
    shutil.copyfile(images[0], twin)
    last = run_to_end(build_cache(embedder, [*images, twin], tmp_path / "cache"))
    assert last.extra["added"] == 10 and last.extra["count"] == 10
    vectors, keep = lookup(tmp_path / "cache", [images[0], twin])
    assert keep.tolist() == [0, 1]
    np.testing.assert_array_equal(vectors[0], vectors[1])


def test_cancelled_job_resumes_and_matches_one_uninterrupted_run(tmp_path, embedder, images):
    token = CancelToken()
    job = build_cache(embedder, images, tmp_path / "cache", batch_size=3, cancel=token)
    for p in job:
        if p.stage == "embed":
            token.cancel()  # after the first batch
    assert p.stage == "done" and p.extra["cancelled"] is True and p.extra["added"] == 3
    with EmbeddingCache(tmp_path / "cache") as cache:
        assert len(cache) == 3
    last = run_to_end(build_cache(embedder, images, tmp_path / "cache", batch_size=3))
    assert (last.extra["added"], last.extra["reused"], last.extra["cancelled"]) == (7, 3, False)
    resumed, _ = lookup(tmp_path / "cache", images)
    run_to_end(build_cache(embedder, images, tmp_path / "fresh", batch_size=3))
    fresh, _ = lookup(tmp_path / "fresh", images)
    np.testing.assert_array_equal(resumed, fresh)
    # A third run has nothing to do.
    again = run_to_end(build_cache(embedder, images, tmp_path / "cache"))
    assert (again.extra["added"], again.extra["reused"]) == (0, 10)


def test_rows_written_after_the_last_commit_are_not_trusted(tmp_path, embedder, images):
    """A crash between writing rows and indexing them: the index never points at those rows."""
    run_to_end(build_cache(embedder, images[:4], tmp_path / "cache"))
    # What a crash mid-batch leaves: the file already holds rows beyond the indexed count.
    path = tmp_path / "cache" / "embeddings.npy"
    rows = np.load(path)
    assert rows.shape[0] == 4
    np.save(path, np.concatenate([rows, np.full((6, rows.shape[1]), 7.0, np.float32)]))
    run_to_end(build_cache(embedder, images, tmp_path / "cache"))
    vectors, _ = lookup(tmp_path / "cache", images)
    np.testing.assert_allclose(vectors, _reference(embedder, images), rtol=1e-5, atol=1e-6)


def test_bad_files_are_reported_and_the_rest_cached(tmp_path, embedder, images):
    bad = images[0].with_name("broken.png")
    bad.write_bytes(b"this is not a picture")
    gone = images[0].with_name("gone.png")
    last = run_to_end(build_cache(embedder, [*images, bad, gone], tmp_path / "cache"))
    failed = {Path(f["path"]).name: f["reason"] for f in last.extra["failed"]}
    assert failed == {"broken.png": "not an image", "gone.png": "cannot read the file"}
    assert last.extra["added"] == 10
    # Known failures are reported again from the index, without decoding again.
    again = run_to_end(build_cache(embedder, [bad], tmp_path / "cache"))
    assert [f["reason"] for f in again.extra["failed"]] == ["not an image"] and again.extra["added"] == 0
    _, keep = lookup(tmp_path / "cache", [images[1], bad, gone])
    assert keep.tolist() == [0]


def test_a_changed_file_is_hashed_and_embedded_again(tmp_path, embedder, images):
    run_to_end(build_cache(embedder, images, tmp_path / "cache"))
    shutil.copyfile(images[1], images[0])  # new content under the old name
    last = run_to_end(build_cache(embedder, images, tmp_path / "cache"))
    assert last.extra["added"] == 0  # images[1]'s content is cached already
    vectors, _ = lookup(tmp_path / "cache", images[:2])
    np.testing.assert_array_equal(vectors[0], vectors[1])


def test_a_cache_belongs_to_one_vision_tower(tmp_path, embedder, images):
    from engine.backends.blip.checkpoints import save_random_blip_checkpoint
    from engine.backends.blip.embedder import BlipEmbedder

    run_to_end(build_cache(embedder, images[:2], tmp_path / "cache"))
    other = BlipEmbedder(save_random_blip_checkpoint(tmp_path / "other", size="tiny", seed=1), device="cpu")
    with pytest.raises(CacheError, match="another vision tower"):
        run_to_end(build_cache(other, images[:2], tmp_path / "cache"))


def test_one_writer_at_a_time(tmp_path, embedder, images):
    run_to_end(build_cache(embedder, images[:1], tmp_path / "cache"))
    lock = _WriterLock(tmp_path / "cache")
    try:
        with pytest.raises(CacheError, match="another job is writing"):
            run_to_end(build_cache(embedder, images, tmp_path / "cache"))
    finally:
        lock.release()
    assert run_to_end(build_cache(embedder, images, tmp_path / "cache")).extra["added"] == 9
