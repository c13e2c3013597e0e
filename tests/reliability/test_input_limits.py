"""Issue 16.5 and its class "inputs whose size a user controls": caption length, sentence count,
line length and line count are bounded by engine.limits in every reader of the caption path
(`check`, `ground`, review, training data, datagen lists). An input over a limit is reported for
its line with the reason; the rest of the file is processed; memory stays bounded (checked in
child processes under RLIMIT_AS)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine import review
from engine.datagen.inputs import InputError, read_image_list
from engine.grounding.items import read_items
from engine.models.registry import bundled_model_dir
from engine.training.data import read_training_jsonl

REPO = Path(__file__).resolve().parents[2]
needs_rlimit = pytest.mark.skipif(sys.platform == "win32", reason="uses the resource module")
HAS_MINI = (bundled_model_dir("sceneworld-mini") / "model.safetensors").is_file()


def _scene_pictures(folder: Path, n: int = 3) -> list[tuple[Path, str]]:
    from engine.sceneworld import generate_scenes, render_scene

    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for i, s in enumerate(generate_scenes(2000, 0, n)):
        p = folder / f"s{i}.png"
        render_scene(s, 256)[0].save(p)
        out.append((p, s.paragraph.text))
    return out


# --------------------------------------------------------------------------- the reproduction

# Warm the process up on a small file (model loaded, thread pools started), then cap its
# address space at what it uses now plus CAP_MB and check the file with the 720 KB caption.
_CHECK_UNDER_CAP = """
import json, resource, sys
from engine.cli import main

def vm_bytes():
    for line in open("/proc/self/status"):
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024

small, big, out0, out1, cap_mb = sys.argv[1:6]
model = ["--model", "sceneworld-mini", "--device", "cpu"]
assert main(["check", small, "--out", out0, *model]) == 0
limit = vm_bytes() + int(cap_mb) * 1024 * 1024
resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
try:
    rc = main(["check", big, "--out", out1, *model])
except MemoryError:
    rc = "MemoryError"
print(json.dumps({"rc": rc}))
"""

CAP_MB = 1024  # the unbounded code grew by about 2.2 GB (2.8 GB peak RSS) on the 720 KB caption


@needs_rlimit
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
@pytest.mark.skipif(not HAS_MINI, reason="sceneworld-mini weights are not in this checkout")
@pytest.mark.timeout(600)
def test_check_reports_a_720kb_caption_and_checks_the_rest_in_bounded_memory(tmp_path):
    pics = _scene_pictures(tmp_path / "imgs")
    big_caption = " ".join([pics[1][1]] * (720_000 // len(pics[1][1]) + 1))[:720_000]
    small = tmp_path / "small.jsonl"
    small.write_text(json.dumps({"image": "imgs/s0.png", "caption": pics[0][1]}) + "\n", encoding="utf-8")
    big = tmp_path / "big.jsonl"
    big.write_text("\n".join([
        json.dumps({"image": "imgs/s0.png", "caption": pics[0][1]}),
        json.dumps({"image": "imgs/s1.png", "caption": big_caption}),
        json.dumps({"image": "imgs/s2.png", "caption": pics[2][1]}),
    ]) + "\n", encoding="utf-8")
    out0, out1 = tmp_path / "r0.jsonl", tmp_path / "r1.jsonl"
    env = {"LONGLENS_HOME": str(tmp_path / "home"), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "HOME": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-c", _CHECK_UNDER_CAP, str(small), str(big), str(out0), str(out1), str(CAP_MB)],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=540,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["rc"] == 1, (result, proc.stderr[-3000:])  # 1: a line was refused, the others checked
    recs = {r["line"]: r for r in map(json.loads, out1.read_text(encoding="utf-8").splitlines())}
    assert sorted(recs) == [1, 2, 3]
    assert recs[2]["verdict"] == "error"
    assert recs[2]["error"] == "the caption is too long (720,000 characters; the limit is 20,000)"
    assert f"{big}:2: the caption is too long" in proc.stderr
    for line in (1, 3):
        assert recs[line]["verdict"] != "error" and recs[line]["sentences"], recs[line]


# --------------------------------------------------------------------------- a huge line

# Each reader of the caption path on a file whose first line is `size` zero bytes (a sparse file:
# nothing on disk), then one good line, with the address space capped at the start plus 256 MB.
_READ_UNDER_CAP = """
import json, resource, sys
from pathlib import Path
from engine import review
from engine.datagen.inputs import InputError, read_image_list
from engine.grounding.items import read_items
from engine.training.data import read_training_jsonl

def vm_bytes():
    for line in open("/proc/self/status"):
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024

files = json.loads(sys.argv[1])
resource.setrlimit(resource.RLIMIT_AS, (vm_bytes() + 256 * 1024 * 1024, resource.getrlimit(resource.RLIMIT_AS)[1]))
out = {}


def run(name, fn):
    try:
        out[name] = fn()
    except MemoryError:
        out[name] = "MemoryError"


def review_file():
    cf = review.load_caption_file(files["review"])
    return [[str(p) for p in cf.problems], [i.line_no for i in cf.items]]


def check_file():
    return [[n, err] for n, _item, err in read_items(Path(files["check"]))]


def training_file():
    d = read_training_jsonl(files["training"], check_images=False)
    return [[[p.line, p.reason] for p in d.errors], [r.line for r in d.records]]


def datagen_file():
    try:
        read_image_list(files["datagen"])
    except InputError as exc:
        return str(exc)
    return "no error"


for name, fn in [("review", review_file), ("check", check_file), ("training", training_file),
                 ("datagen", datagen_file)]:
    run(name, fn)
print(json.dumps(out))
"""


def _sparse_line_then(path: Path, size: int, good: str) -> Path:
    with open(path, "wb") as f:
        f.truncate(size)  # `size` zero bytes without a newline: one line, no disk blocks
        f.seek(size)
        f.write(b"\n" + good.encode("utf-8") + b"\n")
    return path


@needs_rlimit
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
@pytest.mark.timeout(300)
def test_a_line_larger_than_memory_allows_is_reported_without_being_read_whole(tmp_path):
    pics = _scene_pictures(tmp_path / "imgs", 1)
    img = str(pics[0][0])
    caption = {"image": img, "caption": "A red ball."}
    training = {"image": img, "original_caption": "a ball", "positives": ["A red ball."] * 5,
                "negatives": ["A blue ball."] * 5, "paragraph": "A red ball lies there.", "paragraph_score": 8}
    big = 512 * 1024**2  # twice the cap: reading it whole cannot succeed
    files = {
        # Review refuses caption files over 256 MB as a whole; 200 MB in one line is still
        # more than the cap leaves.
        "review": _sparse_line_then(tmp_path / "r.jsonl", 200 * 1024**2, json.dumps(caption)),
        "check": _sparse_line_then(tmp_path / "c.jsonl", big, json.dumps(caption)),
        "training": _sparse_line_then(tmp_path / "t.jsonl", big, json.dumps(training)),
        "datagen": _sparse_line_then(tmp_path / "d.jsonl", big, json.dumps(caption)),
    }
    proc = subprocess.run(
        [sys.executable, "-c", _READ_UNDER_CAP, json.dumps({k: str(v) for k, v in files.items()})],
        capture_output=True, text=True, cwd=REPO, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["review"] == [["line 1: the line is too long (200.0 MiB; the limit is 4.0 MiB)"], [2]]
    assert out["check"][0] == [1, "the line is too long (512.0 MiB; the limit is 4.0 MiB)"]
    assert out["check"][1][0] == 2 and out["check"][1][1] is None
    assert out["training"] == [[[1, "the line is too long (512.0 MiB; the limit is 4.0 MiB)"]], [2]]
    assert f"{files['datagen']}:1: line: the line is too long (512.0 MiB" in out["datagen"]
    assert ":2:" not in out["datagen"]


# --------------------------------------------------------------------------- per-line limits


@pytest.fixture
def picture(tmp_path) -> Path:
    from PIL import Image

    p = tmp_path / "pic.png"
    Image.new("RGB", (8, 8), (200, 10, 10)).save(p)
    return p


TOO_LONG = ("A red ball. " * 1700).strip()  # 20,399 characters
TOO_MANY = ("A ball. " * 230).strip()  # 230 sentences in 1,839 characters
AT_LIMITS = ("A red ball. " * 166).strip()  # 1,991 characters, 166 sentences: fine


def test_caption_limits_are_checked_by_characters_then_sentences():
    from engine import limits

    assert limits.caption_problem(TOO_LONG) == (
        "the caption is too long (20,399 characters; the limit is 20,000)")
    assert limits.caption_problem(TOO_MANY) == (
        "the caption has too many sentences (230; the limit is 200)")
    assert limits.caption_problem(AT_LIMITS) is None
    assert limits.caption_problem("x" * limits.MAX_CAPTION_CHARS) is None
    # Run-on text, which the grounder cuts into pieces of at most 400 characters, is within them.
    assert limits.caption_problem(" ".join(["word"] * 3999)) is None  # 19,994 characters


def _caption_lines(picture: Path) -> list[str]:
    return [json.dumps({"image": str(picture), "caption": c}) for c in ("A good one.", TOO_LONG, TOO_MANY, AT_LIMITS)]


def test_review_check_training_and_datagen_refuse_the_same_captions(tmp_path, picture):
    f = tmp_path / "caps.jsonl"
    f.write_text("\n".join(_caption_lines(picture)) + "\n", encoding="utf-8")
    too_long = "the caption is too long (20,399 characters; the limit is 20,000)"
    too_many = "the caption has too many sentences (230; the limit is 200)"

    cf = review.load_caption_file(f)
    assert [i.line_no for i in cf.items] == [1, 4]
    assert [str(p) for p in cf.problems] == [f"line 2: {too_long}", f"line 3: {too_many}"]

    seen = {n: err for n, _item, err in read_items(f)}
    assert seen == {1: None, 2: too_long, 3: too_many, 4: None}

    with pytest.raises(InputError) as info:
        read_image_list(f)
    assert f"{f}:2: caption: {too_long}" in str(info.value) and f"{f}:3: caption: {too_many}" in str(info.value)

    t = tmp_path / "train.jsonl"
    rows = []
    for field, value in [("paragraph", "A fine paragraph."), ("paragraph", TOO_LONG), ("positives", [TOO_MANY]),
                         ("original_caption", TOO_LONG)]:
        row = {"image": str(picture), "original_caption": "a ball", "positives": ["A red ball."] * 5,
               "negatives": ["A blue ball."] * 5, "paragraph": "A ball.", "paragraph_score": 8}
        row[field] = value
        rows.append(json.dumps(row))
    t.write_text("\n".join(rows) + "\n", encoding="utf-8")
    data = read_training_jsonl(t)
    assert [r.line for r in data.records] == [1]
    assert [(p.line, p.field, p.reason) for p in data.errors] == [
        (2, "paragraph", too_long), (3, "positives", f"item 0: {too_many}"), (4, "original_caption", too_long)]


def test_review_of_an_over_long_csv_field_reports_its_line(tmp_path, picture):
    import csv

    f = tmp_path / "caps.csv"
    with open(f, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["image", "caption"])
        w.writerow([str(picture), "Fine.\rStill the same caption."])  # a bare CR inside a quoted field
        w.writerow([str(picture), TOO_LONG])
        w.writerow([str(picture), "Also fine."])
    cf = review.load_caption_file(f)
    assert [i.line_no for i in cf.items] == [2, 5]
    assert [str(p) for p in cf.problems] == [
        "line 4: the caption is too long (20,399 characters; the limit is 20,000)"]


def test_ground_refuses_an_over_long_text_from_the_command_line_and_stdin(cli, tmp_path, monkeypatch, picture):
    monkeypatch.setenv("LONGLENS_HOME", str(tmp_path / "home"))
    rc, _, err = cli("ground", str(picture), TOO_LONG, "--out", str(tmp_path / "g"))
    assert rc == 2 and "the text is too long (20,399 characters; the limit is 20,000)" in err
    rc, _, err = cli("ground", str(picture), TOO_MANY, "--out", str(tmp_path / "g"))
    assert rc == 2 and "the text has too many sentences (230; the limit is 200)" in err

    class Endless(io.TextIOBase):
        """A stdin that never ends: only a bounded read can return."""

        def read(self, n=-1):
            if n is None or n < 0:
                raise AssertionError("stdin read without a bound")
            return "a" * n

    monkeypatch.setattr(sys, "stdin", Endless())
    rc, _, err = cli("ground", str(picture), "-", "--out", str(tmp_path / "g"))
    assert rc == 2 and "the text is too long (20,001 characters" in err
    assert not (tmp_path / "g").exists()


def test_lines_past_the_line_limit_are_reported_not_read(tmp_path, picture, monkeypatch):
    from engine import limits

    monkeypatch.setattr(limits, "MAX_FILE_LINES", 3)
    f = tmp_path / "caps.jsonl"
    f.write_text("\n".join(json.dumps({"image": str(picture), "caption": f"Caption {i}."})
                           for i in range(6)) + "\n", encoding="utf-8")
    cf = review.load_caption_file(f)
    assert [i.line_no for i in cf.items] == [1, 2, 3]
    assert [str(p) for p in cf.problems] == ["line 4: the file has more than 3 lines; the lines after that were not read"]
    seen = {n: err for n, _item, err in read_items(f)}
    assert seen == {1: None, 2: None, 3: None, 4: "the file has more than 3 lines; the lines after that were not read"}


# --------------------------------------------------------------------------- the line reader


def _reference_lines(data: bytes, max_line_bytes: int, max_lines: int) -> list[tuple[int, bytes | None]]:
    """What iter_raw_lines must give: data split on b"\\n", over-long lines as None, numbering by
    line, at most max_lines non-blank lines and then one None for the rest."""
    parts = data.split(b"\n")
    if parts and parts[-1] == b"":
        parts.pop()  # nothing after the last newline
    out: list[tuple[int, bytes | None]] = []
    data_lines = 0
    for n, part in enumerate(parts, start=1):
        if part.strip() or len(part) > max_line_bytes:
            data_lines += 1
            if data_lines > max_lines:
                out.append((n, None))
                return out
        out.append((n, None if len(part) > max_line_bytes else part))
    return out


def test_the_line_reader_matches_a_plain_split_across_chunk_boundaries(tmp_path, monkeypatch):
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from engine import limits

    monkeypatch.setattr(limits, "_READ_CHUNK", 3)  # every line crosses chunk boundaries
    f = tmp_path / "lines.txt"

    @settings(max_examples=200, deadline=None)
    @given(data=st.lists(st.sampled_from([b"a", b"bc", b"\n", b"\r", b" ", b"\n\n"]), max_size=30).map(b"".join),
           max_line_bytes=st.integers(1, 6), max_lines=st.integers(1, 8))
    def check(data: bytes, max_line_bytes: int, max_lines: int) -> None:
        f.write_bytes(data)
        got = [(ln.line_no, ln.data) for ln in
               limits.iter_raw_lines(f, max_line_bytes=max_line_bytes, max_lines=max_lines)]
        assert got == _reference_lines(data, max_line_bytes, max_lines)

    check()
