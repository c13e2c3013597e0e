"""Recall@K rules on hand-made similarity patterns."""

from __future__ import annotations

import numpy as np
import pytest

from engine.evaluation.retrieval import recall_at_k


def test_perfect_and_reversed():
    eye = np.eye(4, dtype=np.float32)
    r = recall_at_k(eye, eye, [0, 1, 2, 3], ks=(1, 2))
    assert r["i2t"] == {"R@1": 1.0, "R@2": 1.0} and r["t2i"]["R@1"] == 1.0
    # Each text matches the NEXT image best: nothing at R@1.
    shifted = np.roll(eye, 1, axis=0)
    r = recall_at_k(eye, shifted, [0, 1, 2, 3], ks=(1, 4))
    assert r["i2t"]["R@1"] == 0.0 and r["t2i"]["R@1"] == 0.0
    assert r["i2t"]["R@4"] == 1.0 and r["t2i"]["R@4"] == 1.0


def test_any_caption_counts_for_image_to_text():
    img = np.array([[1, 0], [0, 1]], np.float32)
    # image 0 owns texts 0 and 1; text 0 points at image 1, text 1 at image 0.
    txt = np.array([[0, 1], [1, 0], [0.6, 0.8]], np.float32)
    r = recall_at_k(img, txt, [0, 0, 1], ks=(1,))
    # image 0: its text 1 scores 1.0, best overall -> hit; image 1: text 0 (1.0) beats its own text 2 (0.8)
    assert r["i2t"]["R@1"] == pytest.approx(0.5)
    # text-side: text0 -> image1 (miss), text1 -> image0 (hit), text2 -> image1 (hit)
    assert r["t2i"]["R@1"] == pytest.approx(2 / 3)


def test_ties_are_not_free_hits():
    same = np.ones((5, 3), np.float32) / np.sqrt(3)
    r = recall_at_k(same, same, list(range(5)), ks=(1,))
    assert r["i2t"]["R@1"] == 0.0 and r["t2i"]["R@1"] == 0.0
