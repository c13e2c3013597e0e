"""Issue 27 (classes 37, 38) against the real tools (make test-interop): Longlens' review entries
after Debian's exiv2 (what darktable writes with), exiftool and the python exiv2 binding re-serialised
the sidecar are still recognised, and an export of another caption keeps them and every field
inserted by hand byte for byte; POSIX ACLs set with setfacl survive an export. A missing binary
fails these tests (never skips them)."""

from __future__ import annotations

import difflib
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.reliability.sidecar_fixtures import (
    make_library,
    reviewed_captions,
    reviews_in,
    run_export,
    subjects_in,
)

pytestmark = pytest.mark.interop



def _tool(name: str) -> str:
    path = shutil.which(name)
    assert path, f"{name} is not installed (make test-interop installs it)"
    return path


def _exiv2(sidecar: Path) -> None:
    subprocess.run([_tool("exiv2"), "-M", "set Xmp.dc.subject XmpBag from-exiv2", "mo", str(sidecar)], check=True,
                   capture_output=True)


def _exiftool(sidecar: Path) -> None:
    subprocess.run([_tool("exiftool"), "-q", "-q", "-overwrite_original", "-XMP-dc:Subject+=from-exiftool",
                    str(sidecar)], check=True, capture_output=True)


def _python_exiv2(sidecar: Path) -> None:
    import exiv2

    image = exiv2.ImageFactory.open(str(sidecar))
    image.readMetadata()
    data = image.xmpData()
    data["Xmp.dc.subject"] = exiv2.XmpTextValue("from-python-exiv2")
    image.writeMetadata()


def _insert_unknown_field(sidecar: Path) -> tuple[str, str]:
    """An unknown field inside caption A's entry, in the form the tool left it in: an attribute
    beside exiv2's `longlens:Caption="..."`, or an element (and a comment) after the Caption element."""
    text = sidecar.read_text(encoding="utf-8")
    m = re.search(r"""longlens:Caption=("[^"]*"|'[^']*')""", text)
    if m:
        unknown = ' longlens:Mood="calm"'
        at = m.end()
    else:
        unknown = "<longlens:Mood>calm</longlens:Mood><!-- by hand -->"
        at = text.index("</longlens:Caption>") + len("</longlens:Caption>")
    text = text[:at] + unknown + text[at:]
    sidecar.write_text(text, encoding="utf-8")
    return text, unknown.strip()


@pytest.mark.parametrize("tool", [_exiv2, _exiftool, _python_exiv2], ids=["exiv2", "exiftool", "python-exiv2"])
def test_a_review_after_a_tool_re_serialised_the_sidecar_survives_the_next_export(tmp_path, tool):
    lib = make_library(tmp_path, 1)
    sidecar = lib.folder / (lib.pictures[0].name + ".xmp")
    a = reviewed_captions(lib, "A", "Caption {name}, first sentence. Second sentence.", note="from A", sentence=1)
    rc, out, err = run_export(lib, a)
    assert rc == 0, out + err
    tool(sidecar)
    word = {"_exiv2": "from-exiv2", "_exiftool": "from-exiftool", "_python_exiv2": "from-python-exiv2"}[tool.__name__]
    assert word in subjects_in(sidecar.read_bytes())
    a_caption = "Caption A, first sentence. Second sentence."
    assert reviews_in(sidecar.read_bytes())[a_caption] == ("faithful", "from A")
    if tool is not _exiftool:  # exiv2 writes an entry with a nested struct as <rdf:li><rdf:Description ...>
        assert re.search(r"<rdf:li>\s*<rdf:Description\s+longlens:Caption=", sidecar.read_text(encoding="utf-8"))
    by_hand, unknown = _insert_unknown_field(sidecar)

    # Exporting A again (unchanged) recognises its entry in the tool's form: nothing is written.
    rc, out, err = run_export(lib, a)
    assert rc == 0 and "unchanged" in out, out + err
    assert sidecar.read_text(encoding="utf-8") == by_hand

    b = reviewed_captions(lib, "B", "Caption {name}.", note="from B")
    rc, out, err = run_export(lib, b)
    assert rc == 0, out + err
    after = sidecar.read_text(encoding="utf-8")
    got = reviews_in(after.encode())
    assert got == {a_caption: ("faithful", "from A"), "Caption B.": ("faithful", "from B")}
    # Everything that was there (the tool's serialisation of A, the field inserted by hand) keeps
    # its bytes: B's entry is the only insertion.
    ops = difflib.SequenceMatcher(None, by_hand, after, autojunk=False).get_opcodes()
    assert [op for op in ops if op[0] not in ("equal", "insert")] == []
    inserted = "".join(after[j1:j2] for tag, _i1, _i2, j1, j2 in ops if tag == "insert")
    assert "Caption B." in inserted and a_caption not in inserted  # B's entry is all that was added
    assert unknown in after and word in subjects_in(after.encode())


def test_posix_acls_and_extended_attributes_survive_an_export(tmp_path):
    lib = make_library(tmp_path, 1)
    sidecar = lib.folder / (lib.pictures[0].name + ".xmp")
    subprocess.run([_tool("setfacl"), "-m", "u:nobody:rw,g:nogroup:r", str(sidecar)], check=True)
    subprocess.run([_tool("setfattr"), "-n", "user.photo-server.id", "-v", "42", str(sidecar)], check=True)
    # A folder default ACL that a new file would get: the replaced sidecar must not take it instead.
    subprocess.run([_tool("setfacl"), "-d", "-m", "u:daemon:rwx", str(lib.folder)], check=True)

    def facts() -> tuple[str, str]:
        acl = subprocess.run([_tool("getfacl"), "-c", "-p", str(sidecar)], check=True, capture_output=True, text=True)
        attr = subprocess.run([_tool("getfattr"), "-d", "--absolute-names", str(sidecar)], check=True,
                              capture_output=True, text=True)
        return acl.stdout, attr.stdout

    before = facts()
    assert "user:nobody:rw-" in before[0] and 'user.photo-server.id="42"' in before[1]
    ino = sidecar.stat().st_ino
    rc, out, err = run_export(lib, reviewed_captions(lib, "A", "Caption {name}."))
    assert rc == 0, out + err
    assert sidecar.stat().st_ino != ino and "Caption A." in reviews_in(sidecar.read_bytes())
    assert facts() == before

    # A new sidecar gets the folder's default ACL, as any program's new file does.
    (lib.folder / "IMG_9.jpg").write_bytes(lib.pictures[0].read_bytes())
    from engine.catalog import Catalog
    from engine.config import get_paths

    with Catalog(get_paths(str(lib.home)).catalog):
        pass
    lib.pictures.append(lib.folder / "IMG_9.jpg")
    rc, out, err = run_export(lib, reviewed_captions(lib, "C", "Caption {name}.", pictures=[lib.pictures[-1]]))
    assert rc == 0, out + err
    acl = subprocess.run([_tool("getfacl"), "-c", str(lib.folder / "IMG_9.jpg.xmp")], check=True,
                         capture_output=True, text=True).stdout
    assert "user:daemon:rwx" in acl
