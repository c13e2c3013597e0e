"""A small indexed library with reviewed caption files, and `longlens xmp export` run as a real
child process that can be paused at a named point (synchronised by pipes, never by sleeps): the
other side (the test, another writer, a signal) acts while it waits there.

Pause points (LL_PAUSE_AT in the child):
  merged   every sidecar has been read and merged, nothing written yet (before the backups)
  replace  right before each compare-and-swap's final check (the temporary file is on disk)
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from engine import review
from engine.catalog import Catalog
from engine.config import get_paths

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "xmp"
TEMP_PREFIX = ".longlens-tmp-"

CHILD = r"""
import os, sys
import engine.fileutil as fu
import engine.xmp_export as xe

ready, go = int(os.environ["LL_READY_FD"]), int(os.environ["LL_GO_FD"])
point = os.environ.get("LL_PAUSE_AT", "")

def pause():
    os.write(ready, b"r")
    if not os.read(go, 1):
        os._exit(99)  # the test went away

if point == "merged":
    write = xe._write
    def paused_write(*a, **k):
        pause()
        yield from write(*a, **k)
    xe._write = paused_write
elif point == "replace":
    check = fu.check_identity
    def paused_check(*a, **k):
        pause()
        return check(*a, **k)
    fu.check_identity = paused_check

from engine.cli import main
sys.exit(main(sys.argv[1:]))
"""


def child_env(home: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "LONGLENS_HOME": str(home),
            "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), **extra}


@dataclass
class Library:
    home: Path
    folder: Path
    pictures: list[Path]

    def sidecars(self) -> dict[str, bytes]:
        return {p.name: p.read_bytes() for p in sorted(self.folder.iterdir()) if p.name.endswith(".xmp") and not p.name.startswith(TEMP_PREFIX)}

    def strays(self) -> list[str]:
        return sorted(p.name for p in self.folder.iterdir() if p.name.startswith(TEMP_PREFIX))


def make_library(tmp_path: Path, n: int = 3, *, existing: bool = True) -> Library:
    """n JPEGs in an indexed library (a catalog that knows the folder); with `existing`, each has
    darktable's sample sidecar (IMG_k.jpg.xmp) already."""
    home = tmp_path / "home"
    folder = tmp_path / "library"
    folder.mkdir(parents=True)
    pictures = []
    for k in range(n):
        p = folder / f"IMG_{k:04d}.jpg"
        Image.new("RGB", (24, 16), (40 * k % 255, 90, 160)).save(p, "JPEG", quality=80)
        pictures.append(p)
        if existing:
            shutil.copy(DATA / "darktable.xmp", folder / f"{p.name}.xmp")
    with Catalog(get_paths(str(home)).catalog) as cat:
        cat.add_library(folder)
    return Library(home, folder, pictures)


def reviewed_captions(lib: Library, name: str, caption: str, note: str = "fine",
                      pictures: list[Path] | None = None, sentence: int | None = None) -> Path:
    """A caption file giving every picture `caption` (`{name}` and the picture's name filled in),
    each reviewed (verdict and note) in the library's catalog."""
    path = lib.home.parent / f"{name}.jsonl"
    pics = lib.pictures if pictures is None else pictures
    path.write_text("".join(json.dumps({"image": str(p), "caption": caption.format(name=name, pic=p.name)}) + "\n"
                            for p in pics), encoding="utf-8")
    set_review(lib, path, note, sentence=sentence)
    return path


def set_review(lib: Library, captions: Path, note: str, verdict: str = "faithful", sentence: int | None = None) -> None:
    """Every item reviewed: a verdict and note for the caption, and with `sentence` one for that
    sentence too (the entry then has a Sentences list, which exiv2 writes as a nested struct)."""
    with Catalog(get_paths(str(lib.home)).catalog) as cat:
        session = review.open_session(cat, captions)
        for item in review.session_items(cat, session):
            review.set_verdict(cat, item.id, None, verdict, note)
            if sentence is not None:
                review.set_verdict(cat, item.id, sentence, "unfaithful", "this sentence is off")


class Export:
    """`python -m engine xmp export ...` as a child process, pausable at LL_PAUSE_AT."""

    def __init__(self, lib: Library, captions: Path, *args: str, pause_at: str = "", convention: str = "darktable",
                 preexec_fn=None) -> None:
        self.ready_r, ready_w = os.pipe()
        go_r, self.go_w = os.pipe()
        env = child_env(lib.home, LL_READY_FD=str(ready_w), LL_GO_FD=str(go_r), LL_PAUSE_AT=pause_at)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, "xmp", "export", str(captions), "--convention", convention, *args],
            env=env, pass_fds=(ready_w, go_r), stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT,
            preexec_fn=preexec_fn)
        os.close(ready_w)
        os.close(go_r)

    def wait_paused(self, timeout: float = 60.0) -> bool:
        """Block until the child is waiting at its pause point; False when it ended instead."""
        r, _, _ = select.select([self.ready_r], [], [], timeout)
        assert r, "the child neither paused nor ended in time"
        return os.read(self.ready_r, 1) == b"r"

    def resume(self) -> None:
        os.write(self.go_w, b"g")

    def wait_stderr(self, text: str, timeout: float = 60.0) -> str:
        """Read the child's stderr until `text` appears (e.g. the message the first Ctrl+C prints)."""
        seen = b""
        fd = self.proc.stderr.fileno()
        while text.encode() not in seen:
            r, _, _ = select.select([fd], [], [], timeout)
            assert r, f"no {text!r} on stderr in time; got {seen!r}"
            chunk = os.read(fd, 4096)
            assert chunk, f"stderr ended without {text!r}: {seen!r}"
            seen += chunk
        return seen.decode(errors="replace")

    def finish(self, timeout: float = 120.0) -> tuple[int, str, str]:
        try:
            os.close(self.go_w)
        except OSError:
            pass
        out, err = self.proc.communicate(timeout=timeout)
        os.close(self.ready_r)
        return self.proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")


def run_export(lib: Library, captions: Path, *args: str, convention: str = "darktable") -> tuple[int, str, str]:
    return Export(lib, captions, *args, convention=convention).finish()


def reviews_in(data: bytes) -> dict[str, tuple[str | None, str | None]]:
    """caption -> (verdict, note) of every longlens:Reviews entry, in any serialisation, in the
    Longlens namespace or the old placeholder one (sidecars written before issue 28)."""
    from xml.etree import ElementTree as ET

    from engine.metadata.xmp import RDF
    from engine.metadata.xmp_write import LONGLENS_NS, LONGLENS_OLD_NS

    root = ET.fromstring(data)
    out = {}
    for ns in (LONGLENS_NS, LONGLENS_OLD_NS):
        ll = f"{{{ns}}}"
        for prop in root.iter(f"{ll}Reviews"):
            for li in prop.find(f"{{{RDF}}}Bag").findall(f"{{{RDF}}}li"):
                holders = [li, *li.findall(f"{{{RDF}}}Description")]

                def field(name, holders=holders, ll=ll):
                    for h in holders:
                        if h.get(ll + name) is not None:
                            return h.get(ll + name)
                        if h.find(ll + name) is not None:
                            return h.find(ll + name).text
                    return None
                out[field("Caption")] = (field("Verdict"), field("Note"))
    return out


def subjects_in(data: bytes) -> list[str]:
    from engine.metadata.xmp import parse_xmp

    return list(parse_xmp(data, "x").values.get("keywords", ((), ()))[0])


def foreign_edit(path: Path, word: str, *, in_place: bool = False) -> bytes:
    """What another tool (darktable, digiKam, a sync client) does to a sidecar: add the keyword
    `word` to dc:subject, written through a temporary file and a rename (or in place). Returns the
    bytes written."""
    import re

    text = path.read_text(encoding="utf-8")
    m = re.search(r"<dc:subject>\s*<rdf:Bag>", text)
    assert m, path
    text = text[:m.end()] + f"\n     <rdf:li>{word}</rdf:li>" + text[m.end():]
    data = text.encode("utf-8")
    if in_place:
        path.write_bytes(data)
    else:
        tmp = path.with_name(path.name + ".other-tool")
        tmp.write_bytes(data)
        os.replace(tmp, path)
    return data
