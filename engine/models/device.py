"""Which torch device a model runs on: one rule and one set of messages for every backend.

torch is imported inside the functions, so importing this module stays cheap.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from engine.errors import ModelError


def _mps_available() -> bool:
    import torch

    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


def available_devices() -> tuple[str, ...]:
    """The device settings that work on this machine, in the order a chooser lists them:
    'auto', then 'cuda' and 'mps' only when torch can use them, then 'cpu'."""
    import torch

    found = ["auto"]
    if torch.cuda.is_available():
        found.append("cuda")
    if _mps_available():
        found.append("mps")
    found.append("cpu")
    return tuple(found)


def resolve_device(name: str = "auto") -> str:
    """'auto' -> cuda, else mps, else cpu. An explicit device that is not usable raises ModelError."""
    import torch

    requested = (name or "auto").strip().lower()
    if requested == "auto":
        if torch.cuda.is_available():
            return "cuda"
        if _mps_available():
            return "mps"
        return "cpu"
    if requested == "cpu":
        return "cpu"
    if requested == "cuda" or requested.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise ModelError(
                f"Device {name!r} was requested, but CUDA is not available "
                "(no NVIDIA GPU, or this PyTorch build has no CUDA support). Use 'auto' or 'cpu'."
            )
        if requested != "cuda":
            index_text = requested.split(":", 1)[1]
            count = torch.cuda.device_count()
            if not index_text.isdigit() or int(index_text) >= count:
                raise ModelError(f"Device {name!r} does not exist; this machine has {count} CUDA device(s).")
        return requested
    if requested == "mps":
        if not _mps_available():
            raise ModelError("Device 'mps' was requested, but Apple's Metal backend is not available here.")
        return "mps"
    raise ModelError(f"Unknown device {name!r}; use 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'.")


def training_autocast_dtype(device: str):
    """The dtype text-tower training runs its forward passes in: bf16 on a CUDA device that
    supports it, else None (float32). Weights and optimizer state stay float32 either way, and
    fp16 is never chosen: it would need gradient scaling."""
    import torch

    if str(device).startswith("cuda") and torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return None


def autocast(device: str, dtype):
    """torch.autocast on `device`'s type in `dtype`, or a no-op context when dtype is None."""
    import contextlib

    import torch

    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=str(device).split(":", 1)[0], dtype=dtype)


_threads_lock = threading.Lock()


@contextlib.contextmanager
def intra_op_threads(n: int | None) -> Iterator[None]:
    """Run the block with torch's intra-op pool at n threads (None: unchanged), then restore it.

    Why: one search query is a small workload (~128 tokens), and on a machine whose cores are
    busy, OpenMP's barriers stall whenever one of the threads is descheduled: a 128-token bf16
    encode measured 70 ms on one thread and 1,650 ms on two on a loaded 2-core machine
    (docs/benchmarks.md). The setting is process-wide, so concurrent users are serialised here;
    an indexing thread running meanwhile uses the reduced pool for those milliseconds.
    """
    if n is None:
        yield
        return
    import torch

    with _threads_lock:
        before = torch.get_num_threads()
        if before <= n:
            yield
            return
        torch.set_num_threads(n)
        try:
            yield
        finally:
            torch.set_num_threads(before)


def cpu_supports_bf16() -> bool:
    """True when oneDNN has native bf16 matmuls here (AVX512-BF16 or AMX); elsewhere bf16 on
    the CPU is emulated and slower than float32."""
    import torch

    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False
