"""Which devices a chooser offers: the ones torch can use on this machine (engine.models.device)."""

from __future__ import annotations

import pytest

from engine.errors import ModelError
from engine.models import device


@pytest.mark.parametrize("cuda,mps,expected", [
    (False, False, ("auto", "cpu")),
    (True, False, ("auto", "cuda", "cpu")),
    (False, True, ("auto", "mps", "cpu")),
    (True, True, ("auto", "cuda", "mps", "cpu")),
])
def test_available_devices_follow_what_torch_can_use(monkeypatch, cuda, mps, expected):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(device, "_mps_available", lambda: mps)
    assert device.available_devices() == expected
    # Every device offered resolves; one not offered is refused with a message.
    for name in expected:
        device.resolve_device(name)
    for name in {"cuda", "mps"} - set(expected):
        with pytest.raises(ModelError, match="not available"):
            device.resolve_device(name)
