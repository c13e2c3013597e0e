"""Issue 28 point 3 against the real tools (make test-interop): what `longlens xmp export` writes
(description, title, a language entry, keywords in every scheme, its own entries in the new
namespace, an old sidecar migrated) is valid for exiftool and read by exiftool, exiv2 and
darktable-cli, and an export after darktable re-serialised the sidecar finds everything already
there. A missing binary fails these tests (never skips them)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from PIL import Image

from engine import review
from engine.catalog import Catalog
from engine.metadata.xmp_write import LONGLENS_NS, LONGLENS_OLD_NS
from engine.xmp_export import XmpTextOptions, export_xmp_job, plan_xmp_export
from tests.reliability.sidecar_fixtures import reviews_in

pytestmark = pytest.mark.interop

DATA = Path(__file__).resolve().parents[1] / "data" / "xmp"
CAPTION = "A white ferry & two gulls cross the fjord. Ünïcode “quotes” stay."


def _tool(name: str) -> str:
    path = shutil.which(name)
    assert path, f"{name} is not installed (make test-interop installs it)"
    return path


def _exiftool_json(path: Path, *tags: str) -> dict:
    out = subprocess.run([_tool("exiftool"), "-j", "-a", "-G1", *tags, str(path)], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)[0]


def _validate(path: Path) -> str:
    return subprocess.run([_tool("exiftool"), "-validate", "-warning", "-a", "-s", str(path)], check=True,
                          capture_output=True, text=True).stdout


def _exiv2(path: Path) -> dict[str, str]:
    out = subprocess.run([_tool("exiv2"), "-px", str(path)], capture_output=True, text=True).stdout
    rows = {}
    for line in out.splitlines():
        parts = line.split(None, 3)
        if len(parts) == 4:
            rows[parts[0]] = parts[3]
    return rows


def _darktable(picture: Path, workdir: Path) -> str:
    """darktable-cli reads picture.xmp (its own convention), renders, and writes the sidecar back
    in its own serialisation; returns its log."""
    run = subprocess.run([_tool("darktable-cli"), str(picture), str(workdir / "out.jpg"), "--core", "--configdir",
                          str(workdir / "dtconf"), "--library", ":memory:", "--conf", "write_sidecar_files=on import"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    (workdir / "out.jpg").unlink(missing_ok=True)
    return run.stdout + run.stderr


def _export(tmp_path: Path, texts: XmpTextOptions, keywords=("Longlens|checked", "ferry"), existing: Path | None = None):
    folder = tmp_path / "lib"
    folder.mkdir(exist_ok=True)
    picture = folder / "fjord.jpg"
    if not picture.exists():
        Image.new("RGB", (96, 64), "steelblue").save(picture, "JPEG", quality=90)
    if existing is not None and not (folder / "fjord.jpg.xmp").exists():
        shutil.copy(existing, folder / "fjord.jpg.xmp")
    captions = tmp_path / "captions.jsonl"
    captions.write_text(json.dumps({"image": str(picture), "caption": CAPTION, "title": "Morning ferry"}) + "\n",
                        encoding="utf-8")
    with Catalog(tmp_path / "home" / "catalog.sqlite3") as cat:
        cat.add_library(folder)
        session = review.open_session(cat, captions)
        for item in review.session_items(cat, session):
            if item.verdict is None:  # reviewed once: an export again finds the same review
                review.set_verdict(cat, item.id, None, "faithful", "checked")
        plan = plan_xmp_export(cat, captions, convention="darktable", keywords=keywords, texts=texts)
        *_, last = export_xmp_job(plan, backup_root=tmp_path / "home")
    return picture, folder / "fjord.jpg.xmp", last.extra["summary"]


def test_a_new_sidecar_is_valid_and_every_tool_reads_description_title_and_keywords(tmp_path):
    picture, sidecar, summary = _export(tmp_path, XmpTextOptions(description=True, title=True))
    assert [r.action for r in summary.results] == ["create"]
    assert "Warning" not in _validate(sidecar) and "Validate: OK" in _validate(sidecar).replace("  ", "")
    got = _exiftool_json(sidecar, "-XMP-dc:all", "-XMP-lr:all", "-XMP-digiKam:all")
    assert got["XMP-dc:Description"] == CAPTION and got["XMP-dc:Title"] == "Morning ferry"
    assert got["XMP-dc:Subject"] == ["Longlens", "checked", "ferry"]
    assert got["XMP-lr:HierarchicalSubject"] == ["Longlens|checked", "ferry"]
    assert got["XMP-digiKam:TagsList"] == ["Longlens/checked", "ferry"]  # what digiKam reads first
    rows = _exiv2(sidecar)
    assert rows["Xmp.dc.description"] == f'lang="x-default" {CAPTION}'
    assert rows["Xmp.digiKam.TagsList"] == "Longlens/checked, ferry"
    assert rows["Xmp.longlens.Reviews[1]/longlens:Caption"] == CAPTION

    # darktable reads it (imports the tags), and writes it back keeping all of it.
    log = _darktable(picture, tmp_path)
    assert "creating tag: Longlens|checked" in log
    assert "darktable:xmp_version=" in sidecar.read_text(encoding="utf-8")  # darktable's serialisation now
    after = _exiftool_json(sidecar, "-XMP-dc:all", "-XMP-digiKam:all")
    assert after["XMP-dc:Description"] == CAPTION and after["XMP-dc:Title"] == "Morning ferry"
    assert after["XMP-digiKam:TagsList"] == ["Longlens/checked", "ferry"]
    assert reviews_in(sidecar.read_bytes()) == {CAPTION: ("faithful", "checked")}
    # Exported again over darktable's serialisation: everything is recognised, nothing written.
    before = sidecar.read_bytes()
    _, _, again = _export(tmp_path, XmpTextOptions(description=True, title=True))
    assert [r.action for r in again.results] == ["unchanged"], again.results[0].changes
    assert again.results[0].fields == {"dc:title": "unchanged", "dc:description": "unchanged"}
    assert sidecar.read_bytes() == before


def test_written_into_the_tools_own_sidecars_each_reads_it(tmp_path):
    for sample in ("darktable.xmp", "digikam.xmp", "lightroom-classic.xmp"):
        work = tmp_path / sample
        work.mkdir()
        _, sidecar, summary = _export(work, XmpTextOptions(description=True, title=True, replace_description=True),
                                      existing=DATA / sample)
        assert [r.action for r in summary.results] == ["update"], sample
        warnings = {line for line in _validate(sidecar).splitlines() if "Warning" in line}
        assert warnings <= {line for line in _validate(DATA / sample).splitlines() if "Warning" in line}, sample
        got = _exiftool_json(sidecar, "-XMP-dc:Description", "-XMP-lr:HierarchicalSubject", "-XMP-digiKam:TagsList")
        assert got["XMP-dc:Description"] == CAPTION, sample
        assert "Longlens|checked" in got["XMP-lr:HierarchicalSubject"], sample
        if sample == "digikam.xmp":  # the scheme digiKam reads first has it
            assert got["XMP-digiKam:TagsList"][-2:] == ["Longlens/checked", "ferry"]
        assert _exiv2(sidecar)["Xmp.dc.description"] == f'lang="x-default" {CAPTION}', sample


def test_a_language_entry_is_read_by_exiftool_and_exiv2_and_folded_by_darktable(tmp_path):
    """docs/xmp.md says darktable 4.2 folds the language entries into its x-default on its next
    write (measured); this pins it, so the sentence goes when darktable changes."""
    picture, sidecar, summary = _export(tmp_path, XmpTextOptions(description=True, language="nb-NO"))
    assert any(c.startswith("darktable (4.2) reads only one language") for c in summary.results[0].changes)
    got = _exiftool_json(sidecar, "-XMP-dc:Description-nb-NO", "-XMP-dc:Description")
    assert got["XMP-dc:Description-nb-NO"] == CAPTION and got["XMP-dc:Description"] == CAPTION
    assert _exiv2(sidecar)["Xmp.dc.description"] == f'lang="x-default" {CAPTION}, lang="nb-NO" {CAPTION}'
    _darktable(picture, tmp_path)
    folded = _exiftool_json(sidecar, "-XMP-dc:Description")["XMP-dc:Description"]
    assert folded == f'{CAPTION}, lang="nb-NO" {CAPTION}'


def test_an_old_sidecar_re_serialised_by_exiv2_is_migrated_and_still_read(tmp_path):
    old = DATA / "longlens-after-exiv2.xmp"
    assert LONGLENS_OLD_NS in old.read_text(encoding="utf-8")
    _, sidecar, summary = _export(tmp_path, XmpTextOptions(), keywords=(), existing=old)
    assert summary.results[0].changes[0].startswith("Longlens namespace: migrated")
    text = sidecar.read_text(encoding="utf-8")
    assert LONGLENS_OLD_NS not in text and f'xmlns:longlens="{LONGLENS_NS}"' in text
    rows = _exiv2(sidecar)
    assert rows["Xmp.longlens.Reviews[1]/longlens:Caption"] == "Caption A & <b>."
    assert rows["Xmp.longlens.Reviews[2]/longlens:Caption"] == CAPTION
    assert {line for line in _validate(sidecar).splitlines() if "Warning" in line} <= \
           {line for line in _validate(old).splitlines() if "Warning" in line}


@pytest.mark.parametrize("name", ["mwg-keywords-exiftool.xmp", "mwg-keywords-exiv2.xmp"])
def test_an_mwg_keyword_tree_grown_by_the_export_is_valid_and_read(tmp_path, name):
    _, sidecar, summary = _export(tmp_path, XmpTextOptions(), keywords=("Places|Norway|Bergen", "People|Family"),
                                  existing=DATA / name)
    assert "mwg-kw:Keywords: add 'Places|Norway|Bergen', 'People|Family'" in summary.results[0].changes
    assert "Warning" not in _validate(sidecar)
    got = _exiftool_json(sidecar, "-XMP-mwg-kw:HierarchicalKeywords1", "-XMP-mwg-kw:HierarchicalKeywords2",
                         "-XMP-mwg-kw:HierarchicalKeywords3")
    assert set(got["XMP-mwg-kw:HierarchicalKeywords2"]) == {"Norway", "Family"}
    assert set(got["XMP-mwg-kw:HierarchicalKeywords3"]) == {"Oslo", "Bergen"}
    keywords = {v for k, v in _exiv2(sidecar).items() if k.endswith("/mwg-kw:Keyword")}
    assert keywords == {"Places", "Norway", "Oslo", "Bergen", "People", "Family"}
