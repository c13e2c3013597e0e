"""Losses against values computed by hand on small tensors."""

from __future__ import annotations

import math

import pytest
import torch

from engine.training.losses import hard_negative_info_nce, info_nce, multi_positive_info_nce


def _unit(*rows):
    t = torch.tensor(rows, dtype=torch.float64)
    return t / t.norm(dim=1, keepdim=True)


def test_info_nce_by_hand():
    img = _unit([1, 0], [0, 1])
    txt = _unit([1, 0], [1, 1])
    s = 2.0
    # similarities: img0·txt = [1, .7071], img1·txt = [0, .7071]
    c = 1 / math.sqrt(2)
    i2t = -(math.log(math.exp(s) / (math.exp(s) + math.exp(s * c)))
            + math.log(math.exp(s * c) / (math.exp(0) + math.exp(s * c)))) / 2
    # columns: txt0 vs [img0, img1] = [1, 0]; txt1 vs [c, c]
    t2i = -(math.log(math.exp(s) / (math.exp(s) + 1)) + math.log(0.5)) / 2
    assert info_nce(img, txt, s).item() == pytest.approx((i2t + t2i) / 2, rel=1e-9)


def test_multi_positive_by_hand():
    img = _unit([1, 0], [0, 1])
    txt = _unit([1, 0], [1, 1], [0, 1])  # texts 0,1 belong to image 0; text 2 to image 1
    owner = torch.tensor([0, 0, 1])
    s = 1.0
    c = 1 / math.sqrt(2)
    row0 = [1.0, c, 0.0]
    row1 = [0.0, c, 1.0]

    def logsm(row, k):
        return row[k] * s - math.log(sum(math.exp(s * x) for x in row))

    i2t = (-(logsm(row0, 0) + logsm(row0, 1)) / 2 - logsm(row1, 2)) / 2
    cols = [[1.0, 0.0], [c, c], [0.0, 1.0]]
    t2i = -(logsm(cols[0], 0) + logsm(cols[1], 0) + logsm(cols[2], 1)) / 3
    got = multi_positive_info_nce(img, txt, owner, s).item()
    assert got == pytest.approx((i2t + t2i) / 2, rel=1e-9)


def test_multi_positive_with_one_positive_equals_info_nce():
    g = torch.Generator().manual_seed(0)
    img = torch.nn.functional.normalize(torch.randn(5, 8, generator=g, dtype=torch.float64), dim=1)
    txt = torch.nn.functional.normalize(torch.randn(5, 8, generator=g, dtype=torch.float64), dim=1)
    a = multi_positive_info_nce(img, txt, torch.arange(5), 3.0)
    assert a.item() == pytest.approx(info_nce(img, txt, 3.0).item(), rel=1e-12)


def test_hard_negatives_enter_only_the_image_to_text_denominator():
    img = _unit([1, 0], [0, 1])
    txt = _unit([1, 0], [0, 1])
    negs = torch.stack([_unit([1, 1]), _unit([-1, 1])])  # (B=2, M=1, D)
    s = 1.0
    c = 1 / math.sqrt(2)
    i2t = -((s - math.log(math.exp(s) + 1 + math.exp(c)))
            + (s - math.log(1 + math.exp(s) + math.exp(c)))) / 2
    t2i = -(2 * (s - math.log(math.exp(s) + 1))) / 2
    got = hard_negative_info_nce(img, txt, negs, s).item()
    assert got == pytest.approx((i2t + t2i) / 2, rel=1e-9)
    # A hard negative identical to the positive raises the loss; with no negatives it is plain InfoNCE.
    assert hard_negative_info_nce(img, txt, txt[:, None, :], s) > info_nce(img, txt, s)
    assert hard_negative_info_nce(img, txt, torch.zeros(2, 0, 2, dtype=torch.float64), s).item() == pytest.approx(
        info_nce(img, txt, s).item()
    )
