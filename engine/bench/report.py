"""Shared helpers for benchmark reports: a machine description and delimited Markdown sections."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def machine_description() -> dict[str, str | int]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info: dict[str, str | int] = {
        "cpu": cpu,
        "cores": os.cpu_count() or 0,
        "python": platform.python_version(),
        "os": f"{platform.system()} {platform.release()}",
    }
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return info


def update_section(path: Path, name: str, body: str) -> None:
    """Replace the `<!-- name:begin -->`…`<!-- name:end -->` block of a Markdown file, or append it.

    Other sections are left as they are, so each benchmark owns only its block.
    """
    begin_mark, end_mark = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    path = Path(path)
    block = f"{begin_mark}\n{body.rstrip()}\n{end_mark}"
    text = path.read_text(encoding="utf-8") if path.exists() else "# Benchmarks\n"
    begin, end = text.find(begin_mark), text.find(end_mark)
    if begin != -1 and end > begin:
        text = text[:begin] + block + text[end + len(end_mark) :]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    from engine.fileutil import atomic_write_text

    atomic_write_text(path, text)
