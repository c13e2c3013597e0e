"""Issue 16, items 7 and 8 (class "output paths"): no verb writes over one of its own inputs, a
photo, or anything inside an indexed library, and an output that exists with the wrong kind
(`ground --out EXISTING_FILE`) is a clear message, not a traceback. Every refusal leaves the
files byte-identical. Real `python -m engine` processes, real files, a real catalog."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from engine.outputs import OutputPathError, check_output, nearest_output_folder

ROOT = Path(__file__).resolve().parents[2]
TINY_MODEL = "tiny-blip"
pytestmark = pytest.mark.timeout(600)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _tree(root: Path) -> dict[str, str]:
    return {os.fsdecode(p.relative_to(root)): (_sha(p) if p.is_file() else "dir") for p in sorted(root.rglob("*"))}


def _longlens(home: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "LONGLENS_HOME": str(home), "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "engine", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture
def library(home, photos, cli) -> Path:
    """`photos` indexed into the catalog of `home`: an indexed library."""
    rc, _, err = cli("index", str(photos), "--model", TINY_MODEL, "--device", "cpu", "--quiet")
    assert rc == 0, err
    return photos


@pytest.fixture
def outside(tmp_path, library) -> dict[str, Path]:
    """Inputs outside the library: a photo, a caption file naming it, a training file, a list."""
    work = tmp_path / "work"
    work.mkdir()
    photo = work / "mine.jpg"
    shutil.copy(library / "sample_000.jpg", photo)
    captions = work / "captions.jsonl"
    captions.write_text(json.dumps({"image": "mine.jpg", "caption": "A photo of a thing."}) + "\n", encoding="utf-8")
    victim = tmp_path / "elsewhere" / "victim.jpg"  # a photo that is no input of the run
    victim.parent.mkdir()
    shutil.copy(library / "sample_003.jpg", victim)
    return {"work": work, "photo": photo, "captions": captions, "victim": victim}


MODEL = ["--model", TINY_MODEL, "--device", "cpu"]


def _cases(lib: Path, f: dict[str, Path]) -> list[tuple[str, list[str], Path]]:
    """(case, argv, the path the refusal must name)."""
    photo, captions, victim, work = f["photo"], f["captions"], f["victim"], f["work"]
    in_lib = lib / "2024" / "report"
    return [
        ("check --out its own photo", ["check", str(captions), "--out", str(photo), *MODEL], photo),
        ("check --out its caption file", ["check", str(captions), "--out", str(captions), *MODEL], captions),
        ("check --out another photo", ["check", str(captions), "--out", str(victim), *MODEL], victim),
        ("check --out inside a library", ["check", str(captions), "--out", str(in_lib / "r.jsonl"), *MODEL],
         in_lib / "r.jsonl"),
        ("check --html over the photo", ["check", str(captions), "--out", str(work / "r.jsonl"), "--html",
                                         str(photo), *MODEL], photo),
        ("check --html inside a library", ["check", str(captions), "--out", str(work / "r.jsonl"), "--html",
                                           str(lib / "r.html"), *MODEL], lib / "r.html"),
        ("ground --out the folder holding its image", ["ground", str(photo), "a thing", "--out", str(work), *MODEL],
         work),
        ("ground --out inside a library", ["ground", str(photo), "a thing", "--out", str(in_lib), *MODEL], in_lib),
        ("ground --out an existing file", ["ground", str(photo), "a thing", "--out", str(captions), *MODEL],
         captions),
        ("ground --out a folder of other files", ["ground", str(photo), "a thing", "--out", str(victim.parent),
                                                  *MODEL], victim.parent),
        ("eval --out inside a library", ["eval", "sceneworld", "--n", "4", "--out", str(in_lib), "--truncation"],
         in_lib),
        ("train --out inside a library", ["train", "--config", "C5", "--data", str(captions), "--base", TINY_MODEL,
                                          "--out", str(in_lib), "--device", "cpu"], in_lib),
        ("train --out its data file", ["train", "--config", "C5", "--data", str(captions), "--base", TINY_MODEL,
                                       "--out", str(captions), "--device", "cpu"], captions),
        ("train cache --out inside a library", ["train", "cache", "--data", str(captions), "--base", TINY_MODEL,
                                                "--out", str(in_lib), "--device", "cpu"], in_lib),
        ("datagen --out its list", ["datagen", "--list", str(captions), "--endpoint", "http://127.0.0.1:9/v1",
                                    "--generator", "g", "--scorer", "s", "--out", str(captions)], captions),
        ("datagen --out inside a library", ["datagen", "--sceneworld", "--n", "2", "--out",
                                            str(lib / "train.jsonl")], lib / "train.jsonl"),
        ("datagen --out a photo", ["datagen", "--sceneworld", "--n", "2", "--out", str(victim)], victim),
        ("bench --out a photo", ["bench", "--quick", "--out", str(victim)], victim),
        ("bench --json-out inside a library", ["bench", "--quick", "--json-out", str(lib / "b.json")],
         lib / "b.json"),
        ("index --cluster --out inside the library", ["index", str(lib), "--cluster", "local", "--out",
                                                      str(lib / "shards"), *MODEL], lib / "shards"),
    ]


CASE_IDS = [c[0] for c in _cases(Path("/lib"), {k: Path("/x") for k in ("photo", "captions", "victim", "work")})]


# make test: the reproductions and one case of each rule (an input, a photo, inside a library,
# an existing file or foreign folder); make stress: every verb with every rule, each a child with torch.
IN_MAKE_TEST = {"check --out its own photo", "check --out its caption file", "check --html inside a library",
                "ground --out an existing file", "ground --out a folder of other files", "train --out its data file",
                "datagen --out a photo", "index --cluster --out inside the library"}


@pytest.mark.parametrize("case", [c if c in IN_MAKE_TEST else pytest.param(c, marks=pytest.mark.stress)
                                  for c in CASE_IDS])
def test_verb_refuses_an_output_over_an_input_a_photo_or_a_library(home, library, outside, tmp_path, case) -> None:
    _, argv, named = next(c for c in _cases(library, outside) if c[0] == case)
    before_lib, before_work = _tree(library), _tree(tmp_path / "work")
    before_victim = _sha(outside["victim"])
    r = _longlens(home, *argv)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    assert str(named) in r.stderr, r.stderr  # the refusal names the path
    assert _tree(library) == before_lib and _tree(tmp_path / "work") == before_work
    assert _sha(outside["victim"]) == before_victim
    assert not (library / "2024" / "report").exists()


# --------------------------------------------------------------------------- the guard itself


def test_guard_compares_resolved_paths_and_links(tmp_path) -> None:
    photo = tmp_path / "a.jpg"
    photo.write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    (tmp_path / "link.jpg").symlink_to(photo)
    os.link(photo, tmp_path / "hard.jpg")
    (tmp_path / "sub").mkdir()
    for alias in (tmp_path / "link.jpg", tmp_path / "hard.jpg", tmp_path / "sub" / ".." / "a.jpg"):
        with pytest.raises(OutputPathError, match="input"):
            check_output(alias, what="report", kind="r", inputs=[photo])
    with pytest.raises(OutputPathError, match="holds the input"):
        check_output(tmp_path, what="report", kind="r", folder=True, inputs=[photo])
    with pytest.raises(OutputPathError, match="holds the indexed library"):
        check_output(tmp_path, what="report", kind="r", folder=True, library_roots=[tmp_path / "sub"])
    assert check_output(tmp_path / "new" / "r.jsonl", what="report", kind="r", inputs=[photo],
                        library_roots=[tmp_path / "sub"]) == tmp_path / "new" / "r.jsonl"


def test_gui_exports_use_the_same_guard(home, library, outside, tmp_path) -> None:
    pytest.importorskip("PySide6")
    from desktop_app.facade import Backend
    from engine.config import get_paths

    backend = Backend(get_paths(home))
    try:
        session = backend.open_review(str(outside["captions"])) if hasattr(backend, "open_review") else None
        for dest in (outside["victim"], library / "verdicts.jsonl", outside["captions"]):
            with pytest.raises(OutputPathError) as exc:
                backend.check_export_path(str(dest), [str(outside["captions"]), str(outside["photo"])])
            assert str(dest) in str(exc.value)
        if session is not None:
            with pytest.raises(OutputPathError):
                backend.export_review(session, str(library / "verdicts.jsonl"))
        assert not (library / "verdicts.jsonl").exists()
        ok = tmp_path / "exports" / "verdicts.jsonl"
        assert backend.check_export_path(str(ok), [str(outside["captions"])]) == str(ok)
    finally:
        backend.close()


def test_nearest_output_folder_is_next_to_the_photo_folder(tmp_path) -> None:
    """What a save dialog proposes for a file about a picture is a folder the guard accepts."""
    outer = tmp_path / "Pictures" / "2024"
    inner = outer / "summer"
    inner.mkdir(parents=True)
    photo = inner / "beach.jpg"
    photo.write_bytes(b"\xff\xd8\xff\xe0")
    loose = tmp_path / "Desktop" / "scan.png"
    loose.parent.mkdir()
    loose.write_bytes(b"\x89PNG")
    assert nearest_output_folder(loose, [outer]) == loose.parent.resolve()
    assert nearest_output_folder(photo, [inner]) == outer.resolve()
    # Nested libraries: above the outermost one.
    assert nearest_output_folder(photo, [inner, outer]) == (tmp_path / "Pictures").resolve()
    for roots in ([inner], [inner, outer]):
        folder = nearest_output_folder(photo, roots)
        assert check_output(folder / "beach-overlay.png", what="export", kind="export", inputs=[photo],
                            library_roots=roots)
