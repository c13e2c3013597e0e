"""Issue 28, point 4 (write side): what `longlens xmp export --description --title --keyword` writes
is read back by the real tools. exiftool and Debian's exiv2 read dc:description, dc:title and the
keyword in every scheme (dc:subject, lr:hierarchicalSubject, digiKam:TagsList) and the review
entries; `exiftool -validate -warning -a` finds nothing new to warn about; darktable-cli imports
the picture with the exported sidecar and still applies its history (a pixel-identical render),
and its re-serialisation keeps everything the export wrote. Then a darktable re-serialisation
between two exports loses nothing: the first export's review entries and keywords survive
darktable rewriting the sidecar, and the second export merges into darktable's serialisation.

Each check is one case of the "written" table in docs/xmp.md (tests/interop/interop_table.py)."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.interop import realfiles as rf
from tests.interop.interop_table import WRITTEN
from tests.reliability.sidecar_fixtures import Library, reviewed_captions, reviews_in, run_export

pytestmark = pytest.mark.interop

KEYWORD = "Longlens|checked"
CAPTION = "A cup of coffee on a saucer. A spoon lies beside it."
TITLE = "A cup of coffee on a saucer"  # the caption's first sentence (no title in the file)
DIGIKAM_TAG = "Things/Coffee"  # what digiKam wrote before the export: the sidecar uses TagsList


def make_library(root: Path, *, flipped: bool = True) -> tuple[Library, Path]:
    """coffee (landscape) as a JPEG in an indexed library, with darktable's sidecar (written by
    darktable-cli; its flip module set to rotate 90 degrees, a user's edit darktable applies when it
    renders) to which exiftool added digiKam:TagsList, as digiKam does for the same sidecar."""
    from engine.catalog import Catalog
    from engine.config import get_paths

    home, folder = root / "home", root / "library"
    picture = rf.write_jpeg(folder / "IMG_0001.jpg", "coffee.png")
    sidecar = rf.darktable(picture, root / "darktable-import")
    if flipped:
        text = sidecar.read_text(encoding="utf-8")
        at = text.index('darktable:operation="flip"')
        end = text.index("/>", at)
        assert 'darktable:params="ffffffff"' in text[at:end], text[at:end]
        text = text[:at] + text[at:end].replace('darktable:params="ffffffff"', 'darktable:params="06000000"') \
            + text[end:]
        sidecar.write_text(text, encoding="utf-8")
    rf.exiftool(sidecar, f"-XMP-digiKam:TagsList={DIGIKAM_TAG}")
    with Catalog(get_paths(str(home)).catalog) as cat:
        cat.add_library(folder)
    return Library(home, folder, [picture]), sidecar


def render(picture: Path, sidecar_bytes: bytes, scratch: Path) -> np.ndarray:
    """darktable-cli's render of `picture` with those sidecar bytes, made from copies in `scratch`
    (darktable rewrites the sidecar it imports; the library's stays as the export left it)."""
    scratch.mkdir(parents=True, exist_ok=True)
    copy = scratch / picture.name
    shutil.copyfile(picture, copy)
    copy.with_name(copy.name + ".xmp").write_bytes(sidecar_bytes)
    out = scratch / "render.png"
    rf.darktable(copy, scratch / "config", out)
    with Image.open(out) as im:
        return np.asarray(im.convert("RGB")).copy()


def export(lib: Library, name: str, *args: str) -> str:
    captions = reviewed_captions(lib, name, CAPTION if name == "A" else f"Caption {name}.", note=f"from {name}")
    rc, out, err = run_export(lib, captions, "--description", "--title", *args)
    assert rc == 0, f"longlens xmp export failed ({rc}):\n{out}\n{err}"
    return out


@dataclass
class Exported:
    lib: Library
    sidecar: Path
    before: bytes  # the sidecar before the export (darktable's, with digiKam's TagsList)
    after: bytes  # as the export left it
    render_before: np.ndarray
    scratch: Path
    reserialised: bytes | None = None  # darktable's serialisation of `after`


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Exported:
    root = tmp_path_factory.mktemp("written")
    lib, sidecar = make_library(root)
    before = sidecar.read_bytes()
    render_before = render(lib.pictures[0], before, root / "render-before")
    # The picture is landscape; the history's flip turns it: darktable applied the history.
    assert render_before.shape[0] > render_before.shape[1], f"darktable did not turn it: {render_before.shape}"
    export(lib, "A", "--keyword", KEYWORD)
    return Exported(lib, sidecar, before, sidecar.read_bytes(), render_before, root)


def darktable_serialisation(e: Exported) -> bytes:
    if e.reserialised is None:
        scratch = e.scratch / "reserialise"
        scratch.mkdir()
        copy = scratch / e.lib.pictures[0].name
        shutil.copyfile(e.lib.pictures[0], copy)
        xmp = copy.with_name(copy.name + ".xmp")
        xmp.write_bytes(e.after)
        rf.darktable(copy, scratch / "config")
        e.reserialised = xmp.read_bytes()
        assert e.reserialised != e.after, "darktable did not rewrite the sidecar"
    return e.reserialised


def keep(e: Exported, data: bytes, name: str) -> Path:
    path = e.scratch / "copies" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


# --- what each tool reads back -----------------------------------------------------------------

def exiftool_reads(e: Exported, data: bytes | None = None) -> dict:
    return rf.exiftool_read(keep(e, data if data is not None else e.after, "exiftool.xmp"))


def as_list(value) -> list:
    return value if isinstance(value, list) else [] if value is None else [value]


def exiv2_reads(e: Exported) -> dict[str, str]:
    got = rf.exiv2_read(keep(e, e.after, "exiv2.xmp"))
    assert got, "exiv2 read nothing from the sidecar"
    return got


def darktable_reads(e: Exported) -> dict:
    """What darktable kept of the export when it re-serialised the sidecar, as exiftool reads it."""
    return exiftool_reads(e, darktable_serialisation(e))


def check_description(read: Callable[[Exported], dict], key: str):
    def check(e: Exported):
        got = read(e)
        assert CAPTION in str(got.get(key)), got.get(key)
    return check


CASES: list[tuple[str, str, str, Callable[[Exported], None], str]] = []


def case(row: str, column: str, id: str, check: Callable[[Exported], None], fixture: str = "exported") -> None:
    """`fixture`: the export the check reads (`exported`, or `exported_in_german`)."""
    CASES.append((id, row, column, check, fixture))
    WRITTEN.declare(id, row, column)


def _exiftool_value(key: str, want: str, listed: bool = False):
    def check(e: Exported, reader=exiftool_reads):
        got = reader(e).get(key)
        assert (want in as_list(got)) if listed else (got == want or want in str(got)), (key, got)
    return check


def _darktable_value(key: str, want: str, listed: bool = False):
    def check(e: Exported):
        _exiftool_value(key, want, listed)(e, reader=darktable_reads)
    return check


def _exiv2_value(key: str, want: str):
    def check(e: Exported):
        got = exiv2_reads(e).get(key, "")
        assert want in got, (key, got)
    return check


R = "`dc:description` (the accepted caption, x-default)"
case(R, "exiftool", "exiftool-reads-description", _exiftool_value("XMP-dc:Description", CAPTION))
case(R, "exiv2", "exiv2-reads-description", _exiv2_value("Xmp.dc.description", CAPTION))
case(R, "darktable-cli", "darktable-keeps-description", _darktable_value("XMP-dc:Description", CAPTION))

R = "`dc:title` (the caption's first sentence)"
case(R, "exiftool", "exiftool-reads-title", _exiftool_value("XMP-dc:Title", TITLE))
case(R, "exiv2", "exiv2-reads-title", _exiv2_value("Xmp.dc.title", TITLE))
case(R, "darktable-cli", "darktable-keeps-title", _darktable_value("XMP-dc:Title", TITLE))

R = "Keyword in `dc:subject` (`Longlens`, `checked`)"
case(R, "exiftool", "exiftool-reads-dc-subject", _exiftool_value("XMP-dc:Subject", "checked", listed=True))
case(R, "exiv2", "exiv2-reads-dc-subject", _exiv2_value("Xmp.dc.subject", "checked"))
case(R, "darktable-cli", "darktable-keeps-dc-subject", _darktable_value("XMP-dc:Subject", "checked", listed=True))

R = "Keyword in `lr:hierarchicalSubject` (`Longlens|checked`)"
case(R, "exiftool", "exiftool-reads-lr", _exiftool_value("XMP-lr:HierarchicalSubject", KEYWORD, listed=True))
case(R, "exiv2", "exiv2-reads-lr", _exiv2_value("Xmp.lr.hierarchicalSubject", KEYWORD))
case(R, "darktable-cli", "darktable-keeps-lr", _darktable_value("XMP-lr:HierarchicalSubject", KEYWORD, listed=True))

R = "Keyword in `digiKam:TagsList` (`Longlens/checked`), which digiKam reads first"


def _tagslist(reader):
    def check(e: Exported):
        got = as_list(reader(e).get("XMP-digiKam:TagsList"))
        assert "Longlens/checked" in got and DIGIKAM_TAG in got, got
    return check


case(R, "exiftool", "exiftool-reads-tagslist", _tagslist(exiftool_reads))
case(R, "exiv2", "exiv2-reads-tagslist", _exiv2_value("Xmp.digiKam.TagsList", "Longlens/checked"))


def _reviews_exiftool(e: Exported):
    got = exiftool_reads(e)
    entries = [v for k, v in got.items() if k.endswith(":Reviews")]
    assert entries and CAPTION in str(entries), sorted(got)


def _reviews_exiv2(e: Exported):
    got = exiv2_reads(e)
    assert any(k.startswith("Xmp.longlens.Reviews") and v == CAPTION for k, v in got.items()), \
        {k: v for k, v in got.items() if "longlens" in k.casefold()}


def _reviews_darktable(e: Exported):
    assert reviews_in(darktable_serialisation(e)) == {CAPTION: ("faithful", "from A")}


R = "Review entries (`longlens:Reviews`)"
case(R, "exiftool", "exiftool-reads-reviews", _reviews_exiftool)
case(R, "exiv2", "exiv2-reads-reviews", _reviews_exiv2)
case(R, "darktable-cli", "darktable-keeps-reviews", _reviews_darktable)


def _validate(e: Exported):
    """exiftool's own validation finds nothing the export added (darktable's sidecar already has a
    minor warning of its own: its empty masks_history Seq)."""
    def warnings(data: bytes, name: str) -> set[str]:
        import subprocess

        done = subprocess.run([rf.tool("exiftool"), "-validate", "-warning", "-a", "-s", "-s", "-s",
                               str(keep(e, data, name))], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return {line for line in done.stdout.splitlines() if line and not line[0].isdigit()}

    assert warnings(e.after, "validate-after.xmp") <= warnings(e.before, "validate-before.xmp")


def _exiv2_parses(e: Exported):
    import subprocess

    done = subprocess.run([rf.tool("exiv2"), "-px", keep(e, e.after, "exiv2-parse.xmp")], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and "Error" not in done.stderr, done.stderr


def _history_applied(e: Exported):
    after = render(e.lib.pictures[0], e.after, e.scratch / "render-after")
    assert after.shape == e.render_before.shape and np.array_equal(after, e.render_before), \
        "darktable renders the picture differently with the exported sidecar"


R = "`dc:description` and `dc:title` in the language asked for (`--language de`)"


def _german_exiftool(e: Exported):
    got = exiftool_reads(e)
    assert got.get("XMP-dc:Description-de") == CAPTION and got.get("XMP-dc:Title-de") == TITLE, got


def _german_exiv2(e: Exported):
    got = exiv2_reads(e)
    for key, text in (("Xmp.dc.description", CAPTION), ("Xmp.dc.title", TITLE)):
        assert f'lang="de" {text}' in got.get(key, ""), (key, got.get(key))


# darktable reads one language only (it folds the others into the x-default text): n.a.
case(R, "exiftool", "exiftool-reads-german", _german_exiftool, fixture="exported_in_german")
case(R, "exiv2", "exiv2-reads-german", _german_exiv2, fixture="exported_in_german")

R = "The sidecar as a whole (valid; darktable's history still applied)"
case(R, "exiftool", "exiftool-validate", _validate)
case(R, "exiv2", "exiv2-parses", _exiv2_parses)
case(R, "darktable-cli", "darktable-render-pixel-identical", _history_applied)


@pytest.fixture(scope="module")
def exported_in_german(tmp_path_factory) -> Exported:
    """The same export with `--language de`, into a sidecar darktable wrote."""
    root = tmp_path_factory.mktemp("written-de")
    lib, sidecar = make_library(root, flipped=False)
    before = sidecar.read_bytes()
    export(lib, "A", "--language", "de", "--keyword", KEYWORD)
    return Exported(lib, sidecar, before, sidecar.read_bytes(), np.zeros((0, 0, 3)), root)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("check, fixture", [pytest.param(c[3], c[4], id=c[0], marks=pytest.mark.interop_cell(c[0]))
                                            for c in CASES])
def test_what_the_export_wrote_is_read_by_the_tool(request, check, fixture):
    check(request.getfixturevalue(fixture))


@pytest.mark.timeout(600)
def test_a_new_sidecar_the_export_creates_passes_exiftool_validate(tmp_path):
    """No sidecar before: the whole file is Longlens's, and exiftool validates it without a warning."""
    from engine.catalog import Catalog
    from engine.config import get_paths

    folder = tmp_path / "library"
    picture = rf.write_jpeg(folder / "IMG_0002.jpg", "chelsea.png")
    with Catalog(get_paths(str(tmp_path / "home")).catalog) as cat:
        cat.add_library(folder)
    lib = Library(tmp_path / "home", folder, [picture])
    export(lib, "A", "--keyword", KEYWORD)
    sidecar = picture.with_name(picture.name + ".xmp")
    import subprocess

    done = subprocess.run([rf.tool("exiftool"), "-validate", "-warning", "-a", str(sidecar)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.split(":", 1)[1].strip() == "OK", done.stdout
    got = rf.exiftool_read(sidecar)
    assert CAPTION in str(got.get("XMP-dc:Description")) and "checked" in as_list(got.get("XMP-dc:Subject"))
    assert "Longlens/checked" in as_list(got.get("XMP-digiKam:TagsList")), got  # a new darktable-named sidecar


@pytest.mark.timeout(600)
def test_a_darktable_re_serialisation_between_two_exports_loses_nothing(tmp_path):
    lib, sidecar = make_library(tmp_path, flipped=False)
    export(lib, "A", "--keyword", KEYWORD)
    first = sidecar.read_bytes()
    assert reviews_in(first) == {CAPTION: ("faithful", "from A")}

    # darktable imports the picture and writes the sidecar again, in its own serialisation.
    rf.darktable(lib.pictures[0], tmp_path / "darktable")
    rewritten = sidecar.read_bytes()
    assert rewritten != first and b"darktable:history" in rewritten
    assert reviews_in(rewritten) == {CAPTION: ("faithful", "from A")}
    got = rf.exiftool_read(sidecar)
    assert KEYWORD in as_list(got.get("XMP-lr:HierarchicalSubject")), got
    assert CAPTION in str(got.get("XMP-dc:Description")), got

    # The second export (another caption, another keyword) merges into darktable's serialisation.
    out = export(lib, "B", "--keyword", "Longlens|second")
    merged = sidecar.read_bytes()
    assert reviews_in(merged) == {CAPTION: ("faithful", "from A"), "Caption B.": ("faithful", "from B")}, out
    got = rf.exiftool_read(sidecar)
    assert {KEYWORD, "Longlens|second"} <= set(as_list(got.get("XMP-lr:HierarchicalSubject"))), got
    assert {"checked", "second"} <= set(as_list(got.get("XMP-dc:Subject"))), got
    # A different description was there (A's caption): kept, and the summary says so.
    assert CAPTION in str(got.get("XMP-dc:Description")), got
    # darktable still reads it: its history and everything the exports wrote survive one more import.
    rf.darktable(lib.pictures[0], tmp_path / "darktable-again")
    again = sidecar.read_bytes()
    assert reviews_in(again) == reviews_in(merged)
    got = rf.exiftool_read(sidecar)
    assert {KEYWORD, "Longlens|second"} <= set(as_list(got.get("XMP-lr:HierarchicalSubject"))), got
