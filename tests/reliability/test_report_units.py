"""Issue 16, item 6 (class "multi-file outputs"): a report with assets is one unit. A real
`check --html` child process is killed -9 at several moments while it writes its overlays; after
each kill, the page and every asset it shows must come from the same run.

Two variants of the same check alternate (same lines, captions and file names; other pictures,
another threshold), so an asset overwritten in place by the next run has other bytes than the
one the page was written with: the page says which variant it is (its threshold), and each
asset's SHA-256 is compared with a complete reference run of that variant."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY_MODEL = "tiny-blip"
LINES = 8
CAPTION = "A red ball on the grass. A small dog next to a blue car. Two trees behind a white house."
VARIANTS = {"a": ("0.5", ["sample_000.jpg", "sample_003.jpg"]), "b": ("0.25", ["sample_012.jpg", "sample_015.jpg"])}
KILL_AFTER_FILES = (0, 2, 5, 9, 14)  # new asset files seen before the kill, one per iteration
CHILD_TIMEOUT_S = 240
pytestmark = pytest.mark.timeout(900)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _env(home: Path) -> dict[str, str]:
    return {**os.environ, "LONGLENS_HOME": str(home), "PYTHONPATH": str(ROOT)}


def _check_argv(variant_file: Path, threshold: str, out: Path) -> list[str]:
    return [sys.executable, "-m", "engine", "check", str(variant_file), "--out", str(out / "r.jsonl"),
            "--html", str(out / "r.html"), "--threshold", threshold, "--model", TINY_MODEL, "--device", "cpu"]


@pytest.fixture
def variants(home, photos, tmp_path) -> dict[str, Path]:
    files = {}
    for name, (_, sources) in VARIANTS.items():
        folder = tmp_path / f"pictures-{name}"
        folder.mkdir()
        lines = []
        for i in range(LINES):
            shutil.copy(photos / sources[i % len(sources)], folder / f"img{i}.jpg")
            lines.append(json.dumps({"image": f"img{i}.jpg", "caption": CAPTION}))
        files[name] = folder / "captions.jsonl"
        files[name].write_text("\n".join(lines) + "\n", encoding="utf-8")
    return files


def _page_assets(page: Path) -> list[str]:
    return re.findall(r"<img src='([^']+)'>", page.read_text(encoding="utf-8"))


def _complete_run(home: Path, variants: dict[str, Path], name: str, out: Path) -> dict[str, str]:
    """Run variant `name` to the end into `out`; its assets: file name (no folder) -> SHA-256."""
    r = subprocess.run(_check_argv(variants[name], VARIANTS[name][0], out), cwd=ROOT, env=_env(home),
                       capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    assert r.returncode == 0, r.stderr
    assets = {Path(src).name: _sha(out / src) for src in _page_assets(out / "r.html")}
    assert len(assets) >= LINES  # at least one overlay per line
    return assets


def _assert_one_run(out: Path, ref: dict[str, dict[str, str]]) -> None:
    page = out / "r.html"
    text = page.read_text(encoding="utf-8")
    variant = next(name for name, (threshold, _) in VARIANTS.items() if f"threshold {threshold}." in text)
    srcs = _page_assets(page)
    assert {Path(s).name for s in srcs} == set(ref[variant]), "the page lists another run's overlays"
    for src in srcs:
        asset = out / src  # relative to the page's folder
        assert asset.is_file(), f"{src}: named by the page, missing"
        assert _sha(asset) == ref[variant][Path(src).name], f"{src}: overwritten by another run"
    run = re.search(r"<meta name='longlens-run' content='([^']+)'>", text)
    assert run is not None, "the page does not say which run wrote it"
    assert {Path(s).parent for s in srcs} == {Path("r_files", f"run-{run.group(1)}")}  # one asset folder: this run's
    marker = json.loads((out / "r_files" / f"run-{run.group(1)}" / ".longlens-output.json").read_text())
    assert marker["run"] == run.group(1)
    # The JSONL report (written between the assets and the page) names only existing assets.
    for line in (out / "r.jsonl").read_text(encoding="utf-8").splitlines():
        for name in json.loads(line).get("files", {}).get("overlays", []):
            assert (out / "r_files" / name).is_file(), name


def _new_files(folder: Path, since: float) -> int:
    """Files under `folder` modified since `since`; folders renamed or removed meanwhile are skipped
    (os.walk ignores them), as the child renames its staging folder while we look."""
    n = 0
    for dirpath, _, filenames in os.walk(folder):
        for name in filenames:
            try:
                if os.stat(os.path.join(dirpath, name)).st_mtime >= since:
                    n += 1
            except FileNotFoundError:
                continue
    return n


@pytest.mark.slow
@pytest.mark.parametrize("kills", [
    pytest.param(KILL_AFTER_FILES[1:3], id="2-kills"),
    pytest.param(KILL_AFTER_FILES, id="5-kills", marks=pytest.mark.stress),
])
def test_killed_check_html_leaves_one_complete_run(home, variants, tmp_path, kills) -> None:
    out = tmp_path / "report"
    ref = {"b": _complete_run(home, variants, "b", out)}
    ref["a"] = _complete_run(home, variants, "a", out)  # over b's report
    assert set(ref["a"]) == set(ref["b"])  # same names ...
    assert all(ref["a"][k] != ref["b"][k] for k in ref["a"])  # ... other bytes
    _assert_one_run(out, ref)
    # A complete run leaves exactly its own assets: no staging folder, no earlier run's.
    entries = sorted(p.name for p in (out / "r_files").iterdir())
    assert len(entries) == 2 and entries[0] == ".longlens-output.json" and entries[1].startswith("run-"), entries
    killed = 0
    for i, after in enumerate(kills):
        name = "b" if i % 2 == 0 else "a"
        since = time.time() - 0.01
        child = subprocess.Popen(_check_argv(variants[name], VARIANTS[name][0], out), cwd=ROOT, env=_env(home),
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + CHILD_TIMEOUT_S  # a hang fails the test, it does not time it
        try:
            # Progress is watched, not timed: the kill lands after `after` new files exist under
            # r_files/ (the run's staging folder), or the child has already finished.
            while child.poll() is None and _new_files(out / "r_files", since) < max(after, 1):
                assert time.monotonic() < deadline, "check --html did not progress"
                time.sleep(0.005)
            if child.poll() is None:
                child.send_signal(signal.SIGKILL)
                killed += 1
            child.wait(timeout=CHILD_TIMEOUT_S)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        _assert_one_run(out, ref)
    assert killed >= len(kills) - 2 and killed >= 1, "the child finished before most kills: nothing was tested"


def test_staged_folder_keeps_the_old_folder_until_the_new_one_is_complete(tmp_path) -> None:
    from engine.outputs import staged_folder

    target = tmp_path / "g"
    with staged_folder(target, "ground") as stage:
        (stage / "grounding.json").write_text("old", encoding="utf-8")
    with pytest.raises(RuntimeError), staged_folder(target, "ground") as stage:
        (stage / "grounding.json").write_text("new", encoding="utf-8")
        raise RuntimeError("killed half way")
    assert (target / "grounding.json").read_text(encoding="utf-8") == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["g"]  # the failed run's staging folder is gone
    with staged_folder(target, "ground") as stage:
        (stage / "grounding.json").write_text("new", encoding="utf-8")
    assert (target / "grounding.json").read_text(encoding="utf-8") == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g"]


# make stress: test_staged_folder_* above check the same swap in make test.
@pytest.mark.stress
def test_killed_ground_leaves_the_old_output_folder(home, photos, tmp_path) -> None:
    out = tmp_path / "g"
    argv = [sys.executable, "-m", "engine", "ground", str(photos / "sample_000.jpg"), CAPTION, "--out", str(out),
            "--model", TINY_MODEL, "--device", "cpu"]
    r = subprocess.run(argv, cwd=ROOT, env=_env(home), capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    assert r.returncode == 0, r.stderr
    before = {p.name: _sha(p) for p in out.iterdir()}
    # Killed as soon as the second run has written any file (into its staging folder or the
    # output folder itself), the old output must be intact.
    since = time.time() - 0.01
    second = photos / "sample_012.jpg"
    child = subprocess.Popen([*argv[:4], str(second), *argv[5:]], cwd=ROOT, env=_env(home),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + CHILD_TIMEOUT_S
    try:
        while child.poll() is None and not any(_new_files(p, since) for p in tmp_path.iterdir()
                                               if p.name.startswith(("g", ".g.")) and p.is_dir()):
            assert time.monotonic() < deadline, "ground did not progress"
            time.sleep(0.005)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=CHILD_TIMEOUT_S)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    report = json.loads((out / "grounding.json").read_text(encoding="utf-8"))
    if child.returncode == -signal.SIGKILL:
        assert {p.name: _sha(p) for p in out.iterdir()} == before, "a killed run changed the old output"
    else:  # it finished between the last look and the kill: then the output is the new one, whole
        assert report["image"] == str(second)
    listed = [*report["files"]["overlays"], report["files"]["arrays"], "grounding.json"]
    assert all((out / name).is_file() for name in listed)
    # The next run cleans the killed run's staging folder and replaces the output whole.
    from engine.outputs import staged_folder

    with staged_folder(out, "ground") as stage:
        (stage / "grounding.json").write_text("{}", encoding="utf-8")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".g.")] == []
    assert sorted(p.name for p in out.iterdir()) == [".longlens-output.json", "grounding.json"]


def test_swap_without_an_atomic_exchange_recovers_from_a_kill_between_renames(tmp_path, monkeypatch) -> None:
    """Where the OS has no RENAME_EXCHANGE the swap is two renames; a kill between them leaves the
    old folder moved aside, and the next run puts it back before doing anything else."""
    from engine import outputs

    monkeypatch.setattr(outputs, "_exchange", lambda a, b: False)
    target = tmp_path / "g"
    with outputs.staged_folder(target, "ground") as stage:
        (stage / "grounding.json").write_text("old", encoding="utf-8")
    dead_pid = 2**22 + 12345  # above the default pid_max: no such process
    moved = tmp_path / f".g{outputs.OLD}{dead_pid}-abcdef"
    os.replace(target, moved)  # the state a kill between the two renames leaves
    stale = tmp_path / f".g{outputs.STAGING}{dead_pid}-xyz"
    stale.mkdir()
    (stale / "grounding.json").write_text("half", encoding="utf-8")
    outputs.recover_folder(target)
    assert (target / "grounding.json").read_text(encoding="utf-8") == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g"]
    with outputs.staged_folder(target, "ground") as stage:  # and the two-rename swap itself works
        (stage / "grounding.json").write_text("new", encoding="utf-8")
    assert (target / "grounding.json").read_text(encoding="utf-8") == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g"]
