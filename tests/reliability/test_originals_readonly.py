"""Checklist 7 / issue point 3: originals are read-only to Longlens.

The photo tree (photos, caption files, a training file with its images, a DOCCI-layout dataset
and a model folder to import) is made read-only; its bytes, mtimes and modes are recorded; every
CLI verb that reads such a tree runs against it; then nothing may have changed and nothing may
have been written (or created and removed: folder mtimes would move) inside the tree. The GUI's
flows are checked the same way in test_originals_readonly_gui.py.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import stat
from pathlib import Path

import pytest

from tests.e2e.conftest import TINY_MODEL
from tests.reliability.conftest import tree_snapshot

QUERY = ("A red ball lies on the grass to the left of a small wooden bench, and behind it a tall green tree "
         "casts a long shadow across the lawn.")


def set_read_only(root: Path, read_only: bool = True) -> None:
    for dirpath, dirnames, filenames in os.walk(root, topdown=False):
        for name in filenames:
            p = Path(dirpath) / name
            if not p.is_symlink():
                p.chmod(0o444 if read_only else 0o644)
        for name in dirnames:
            p = Path(dirpath) / name
            if not p.is_symlink():
                p.chmod(0o555 if read_only else 0o755)
    root.chmod(0o555 if read_only else 0o755)


def build_originals(tree: Path, sample_master: Path, blip_tiny_checkpoint: Path) -> dict[str, Path]:
    from engine.samples import marker_picture, stored_for_orientation, write_dng, write_image
    from engine.sceneworld.export import write_docci_layout, write_training_jsonl

    photos = tree / "photos"
    shutil.copytree(sample_master, photos)
    imgs = sorted(photos.rglob("*.jpg"))[:3]
    # RAW files (issue 20): a RAW+JPEG pair from the camera, and a portrait RAW without a preview.
    stored = stored_for_orientation(marker_picture((128, 96)), 6)
    write_dng(photos / "raw" / "IMG_9001.DNG", stored, orientation=6, preview=stored)
    write_image(photos / "raw" / "IMG_9001.JPG", stored, "JPEG", orientation=6)
    raw = write_dng(photos / "raw" / "IMG_9002.dng", stored, orientation=6)
    (photos / "link-to-first.jpg").symlink_to(imgs[0])  # links inside a tree stay as they are
    # XMP sidecars as darktable (whole name) and Lightroom (stem) write them, and a hostile one:
    # indexing reads them, nothing may write them (issue 20: sidecars are written only by an export).
    xmp = Path(__file__).resolve().parents[1] / "data" / "xmp"
    shutil.copy(xmp / "darktable.xmp", imgs[0].with_name(imgs[0].name + ".xmp"))
    lightroom = (xmp / "lightroom-classic.xmp").read_text(encoding="utf-8")
    imgs[1].with_suffix(".xmp").write_text(lightroom.replace('photoshop:SidecarForExtension="NEF"', ""),
                                           encoding="utf-8")
    shutil.copy(xmp / "billion-laughs.xmp", imgs[2].with_name(imgs[2].name + ".xmp"))
    shutil.copy(xmp / "digikam.xmp", photos / "raw" / "IMG_9001.DNG.xmp")  # the pair's RAW's sidecar
    captions = tree / "captions.jsonl"
    captions.write_text("\n".join([
        json.dumps({"image": str(imgs[0].relative_to(tree)), "caption": QUERY}),
        "{not json",
        json.dumps({"image": "photos/missing.jpg", "caption": "Nothing here."}),
        json.dumps({"image": str(imgs[1].relative_to(tree)), "caption": "Two white clouds. A tall tree."}),
    ]) + "\n", encoding="utf-8")
    captions_csv = tree / "captions.csv"
    with open(captions_csv, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["image", "caption"])
        w.writerow([str(imgs[2].relative_to(tree)), "A yellow kite rests against a stone wall."])
        w.writerow(["only one column"])
    train = write_training_jsonl(tree / "train" / "train.jsonl", tree / "train" / "images", seed=7, n=8, size=64)
    docci = write_docci_layout(tree / "docci", seed=3, n=6, size=64).parent
    model = tree / "model-folder"
    shutil.copytree(blip_tiny_checkpoint, model)
    return {"photos": photos, "image": imgs[0], "raw": raw, "captions": captions, "captions_csv": captions_csv,
            "train": train, "docci": docci, "model": model}


@pytest.fixture
def originals(tmp_path, sample_master, blip_tiny_checkpoint):
    tree = tmp_path / "originals"
    files = build_originals(tree, sample_master, blip_tiny_checkpoint)
    set_read_only(tree)
    yield tree, files
    set_read_only(tree, read_only=False)


def assert_unchanged(tree: Path, before: dict, what: str) -> None:
    after = tree_snapshot(tree)
    created = sorted(set(after) - set(before))
    removed = sorted(set(before) - set(after))
    changed = sorted(k for k in set(before) & set(after) if before[k] != after[k])
    assert (created, removed, changed) == ([], [], []), f"{what} touched the originals"


def test_every_cli_verb_leaves_the_originals_untouched(home, cli, tmp_path, originals):
    tree, f = originals
    assert not os.access(f["image"], os.W_OK) or os.geteuid() == 0  # read-only (root may still write)
    assert stat.S_IMODE(f["image"].stat().st_mode) == 0o444
    out = tmp_path / "out"
    before = tree_snapshot(tree)
    assert len(before) > 40
    model = ["--model", TINY_MODEL]
    runs: list[tuple[tuple[str, ...], tuple[int, ...]]] = [
        (("index", str(f["photos"]), *model, "--quiet"), (0,)),
        (("index", str(f["photos"]), str(f["docci"]), *model, "--json"), (0,)),  # re-index + a second root
        (("index", str(f["photos"]), *model, "--raw-jpeg-pairs", "both", "--quiet"), (0,)),  # the pair's RAW too
        (("search", QUERY, *model, "--json"), (0,)),
        (("search", QUERY, *model, "--folder", str(f["photos"]), "--rerank", "--json"), (0,)),
        (("search", QUERY, *model, "--keyword", "Places|Norway", "--rating", "3", "--label", "yellow", "--json"),
         (0,)),
        (("search", "--image", str(f["image"]), *model), (0,)),
        (("search", "--image", str(f["raw"]), *model), (0,)),
        (("search", QUERY, *model, "--sort", "date-new", "--cutoff", "0.05", "--after", "2000-01-01"), (0,)),
        (("search", QUERY, *model, "--near", "59.91,10.75", "--km", "500", "--camera", "nikon d750"), (0,)),
        (("show", str(f["image"])), (0,)),
        (("show", str(f["image"]), "--json"), (0,)),
        (("duplicates", "--similar", "0.9", *model, "--out", str(out / "duplicates.csv")), (0,)),
        (("duplicates", "--library", str(f["photos"]), "--json", "--out", str(out / "duplicates.json")), (0,)),
        (("libraries", "--json"), (0,)),
        (("ground", str(f["image"]), QUERY, "--out", str(out / "ground"), *model), (0,)),
        (("ground", str(f["raw"]), QUERY, "--out", str(out / "ground-raw"), *model), (0,)),
        (("check", str(f["captions"]), "--out", str(out / "check.jsonl"), "--html", str(out / "check.html"),
          *model), (0, 1)),
        (("check", str(f["captions_csv"]), "--out", str(out / "check-csv.jsonl"), *model), (0, 1)),
        (("train", "validate", str(f["train"])), (0, 1)),
        (("train", "cache", "--data", str(f["train"]), "--base", TINY_MODEL, "--out", str(out / "cache"),
          "--quiet"), (0,)),
        (("train", "--config", "C5", "--data", str(f["train"]), "--base", TINY_MODEL, "--out", str(out / "run"),
          "--cache", str(out / "cache"), "--epochs", "1", "--batch-size", "4", "--quiet"), (0,)),
        (("eval", "docci", "--root", str(f["docci"]), *model, "--out", str(out / "eval")), (0,)),
        (("models", "import", str(f["model"]), "--name", "from-tree"), (0,)),
        (("models", "verify", "from-tree"), (0,)),
    ]
    for args, ok_codes in runs:
        rc, stdout, err = cli(*args)
        assert rc in ok_codes, f"longlens {' '.join(args[:2])} exited {rc}: {err[-2000:]}"
        assert "Traceback" not in err
        assert_unchanged(tree, before, f"longlens {' '.join(args[:2])}")
    # The verbs did real work (outside the tree): results exist, the sidecars were read.
    rc, stdout, _err = cli("search", QUERY, *model, "--keyword", "Places|Norway|Bergen", "--json")
    assert rc == 0 and [Path(r["path"]).name for r in json.loads(stdout)["results"]] == [f["image"].name]
    # The last index took both files of the RAW+JPEG pair: the RAW's sidecar is the RAW's alone.
    rc, stdout, _err = cli("search", QUERY, *model, "--keyword", "People|Family", "--json")
    assert rc == 0 and [Path(r["path"]).name for r in json.loads(stdout)["results"]] == ["IMG_9001.DNG"]
    assert (out / "ground").is_dir() and (out / "check.jsonl").is_file() and (out / "eval").is_dir()
    assert (out / "duplicates.csv").is_file() and (out / "duplicates.json").is_file()
    assert (home / "data" / "catalog.sqlite3").is_file()
