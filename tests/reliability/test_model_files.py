"""Issue 16 items 4 and 14 (first half): a model folder's own numbers and a killed install.

* Item 4: a config its safetensors weights do not fit (vision intermediate_size 10^7 in a 5 MB
  folder) is refused at import and at load, before any model is built, with the tensor key and
  both shapes. Checked in a child process whose address space is capped (RLIMIT_AS), so an
  allocating build fails the test instead of swapping the machine.
* Item 14: `models import` killed with SIGKILL at each step leaves, after the next start, exactly
  one complete verified model and no staging folder; `--replace` keeps the old model installed
  until the new one is complete.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from engine.config import get_paths

ROOT = Path(__file__).resolve().parents[2]
HUGE = 10**7

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="uses resource limits and SIGKILL")


def child_env(home: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "LONGLENS_HOME": str(home),
            "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), **extra}


# The CLI in a child whose address space is capped 2 GB above what torch and transformers take
# once imported: the refused config asks for > 5 GB, so building it would die with MemoryError.
_CAPPED_CLI = textwrap.dedent("""
    import json, resource, sys
    import torch, transformers  # noqa: F401  (their own mappings count before the cap)
    from transformers import BlipForImageTextRetrieval  # noqa: F401
    from engine.cli import main
    with open("/proc/self/status") as f:
        vm = next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (vm + 2 * 1024**3, resource.RLIM_INFINITY))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    rc = main(sys.argv[1:])
    grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    print(json.dumps({"rc": rc, "grew_kb": grew}))
""")


def run_capped(home: Path, *args: str) -> tuple[dict, str]:
    proc = subprocess.run([sys.executable, "-c", _CAPPED_CLI, *args], cwd=ROOT, env=child_env(home),
                          capture_output=True, text=True, timeout=180)
    assert proc.stdout.strip(), proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


@pytest.fixture
def oversized(tmp_path, blip_tiny_checkpoint) -> Path:
    folder = tmp_path / "oversized"
    shutil.copytree(blip_tiny_checkpoint, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["vision_config"]["intermediate_size"] = HUGE
    (folder / "config.json").write_text(json.dumps(cfg))
    assert sum(p.stat().st_size for p in folder.iterdir()) < 10_000_000
    return folder


def test_oversized_config_is_refused_at_import_without_allocating(tmp_path, oversized):
    home = tmp_path / "home"
    out, err = run_capped(home, "models", "import", str(oversized), "--name", "big")
    assert out["rc"] == 2, err
    assert "vision_model.encoder.layers.0.mlp.fc1.weight" in err and f"({HUGE}, 32)" in err and "(64, 32)" in err
    assert "Traceback" not in err
    assert out["grew_kb"] < 300_000, out
    models = get_paths(home).models
    assert not (models / "big").exists()
    assert not [p for p in models.iterdir() if p.name.startswith(".")] if models.is_dir() else True


def test_oversized_config_planted_in_the_models_folder_is_refused_at_search(tmp_path, oversized):
    from engine.models.download import write_local_manifest

    home = tmp_path / "home"
    planted = get_paths(home).models / "big"
    shutil.copytree(oversized, planted)
    write_local_manifest(planted, "big", "blip")
    out, err = run_capped(home, "search", "a red square", "--model", "big")
    assert out["rc"] == 2, err
    assert "vision_model.encoder.layers.0.mlp.fc1.weight" in err and f"({HUGE}, 32)" in err
    assert "Traceback" not in err
    assert out["grew_kb"] < 300_000, out


def test_extra_and_missing_tensors_are_refused_by_name(tmp_path, blip_tiny_checkpoint):
    """No more and no fewer tensors than the config implies."""
    from safetensors.numpy import load_file, save_file

    from engine.errors import ModelIntegrityError
    from engine.models.download import import_model

    paths = get_paths(tmp_path / "home")
    base = load_file(str(blip_tiny_checkpoint / "model.safetensors"))
    for case in ("extra", "missing", "layers"):
        folder = tmp_path / case
        shutil.copytree(blip_tiny_checkpoint, folder)
        tensors = dict(base)
        if case == "extra":
            tensors["vision_model.encoder.layers.9.mlp.fc1.weight"] = tensors["vision_proj.weight"]
        elif case == "missing":
            del tensors["text_proj.weight"]
        else:
            cfg = json.loads((folder / "config.json").read_text())
            cfg["text_config"]["num_hidden_layers"] = HUGE
            (folder / "config.json").write_text(json.dumps(cfg))
        save_file(tensors, str(folder / "model.safetensors"))
        with pytest.raises(ModelIntegrityError) as exc:
            import_model(folder, case, paths)
        want = {"extra": "vision_model.encoder.layers.9.mlp.fc1.weight", "missing": "text_proj.weight",
                "layers": "text_config.num_hidden_layers"}[case]
        assert want in str(exc.value)
        assert not (paths.models / case).exists()
