"""Issue point 4: property-based tests (hypothesis, bounded examples, no deadline since this
machine's timings are noisy) for what a real collection throws at Longlens:

* image files with mutated bytes, through the whole indexing pipeline and the thumbnailer;
* caption files (review mode, `longlens check`, `longlens train validate`) built from good
  lines mixed with every kind of bad line: each line is either processed or reported with its
  own line number and a reason, never both, never a crash;
* query text: empty, huge, control characters, non-Latin scripts, lone surrogates;
* path names: any Unicode, spaces, non-UTF-8 bytes, long names, through scan, catalog, display.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from engine.errors import DecodeError, QueryError
from tests.engine.test_decode import _mutate  # one byte-level mutator for both property suites
from tests.reliability.conftest import last_progress

PROPERTY_SETTINGS = settings(max_examples=40, deadline=None, derandomize=True,
                             suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def engine_home(tmp_path_factory, blip_tiny_checkpoint):
    """Services over a fresh home with the tiny BLIP installed and a 12-picture folder indexed."""
    from engine.config import get_paths
    from engine.models.download import import_model
    from engine.samples import make_sample_folder
    from engine.services import Services

    base = tmp_path_factory.mktemp("props")
    paths = get_paths(str(base / "home")).ensure()
    import_model(blip_tiny_checkpoint, "tiny", paths)
    photos = base / "photos"
    make_sample_folder(photos, n=12, seed=9, size=(96, 72))
    svc = Services(paths)
    embedder = svc.embedder("tiny", device="cpu")
    last_progress(svc.indexer(embedder, batch_size=8).run(photos))
    yield svc, embedder, photos
    svc.close()


# ------------------------------------------------------------------ mutated image files

def _base_files() -> dict[str, bytes]:
    from engine.samples import exif_bytes, procedural_picture

    rng = np.random.default_rng(4)
    pic = procedural_picture(rng, (64, 48))
    out = {}
    for fmt, ext in (("JPEG", ".jpg"), ("PNG", ".png"), ("GIF", ".gif"), ("WEBP", ".webp"), ("TIFF", ".tif")):
        buf = io.BytesIO()
        kwargs = {"exif": exif_bytes(date="2021:02:03 04:05:06", make="Fuji", model="X", orientation=6)} \
            if fmt in ("JPEG", "PNG", "WEBP") else {}
        (pic.convert("P") if fmt == "GIF" else pic).save(buf, fmt, **kwargs)
        out[ext] = buf.getvalue()
    return out


_BASE_FILES = _base_files()
_mutations = st.lists(st.one_of(
    st.tuples(st.just("truncate"), st.floats(0, 1)),
    st.tuples(st.just("flip"), st.floats(0, 1), st.integers(1, 255)),
    st.tuples(st.just("insert"), st.floats(0, 1), st.binary(min_size=1, max_size=32)),
    st.tuples(st.just("overwrite"), st.floats(0, 1), st.binary(min_size=1, max_size=16)),
), min_size=1, max_size=4)


@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::PIL.Image.DecompressionBombWarning")
@PROPERTY_SETTINGS
@given(ext=st.sampled_from(sorted(_BASE_FILES)), mutations=_mutations)
def test_mutated_image_never_stops_indexing_and_is_ok_or_unreadable_with_a_reason(engine_home, ext, mutations):
    from engine.thumbnails import render_thumbnail

    svc, embedder, _ = engine_home
    with tempfile.TemporaryDirectory() as d:
        folder = Path(d)
        (folder / f"mutated{ext}").write_bytes(_mutate(_BASE_FILES[ext], mutations))
        (folder / "good.png").write_bytes(_BASE_FILES[".png"])
        s = last_progress(svc.indexer(embedder, batch_size=4).run(folder)).extra["summary"]
        lib = svc.catalog.library_by_root(folder)
        records = {r.rel_path: r for r in svc.catalog.image_records(lib.id)}
        assert records["good.png"].status == "ok"
        bad = records[f"mutated{ext}"]
        assert bad.status in ("ok", "unreadable")
        if bad.status == "unreadable":
            assert bad.reason and {"path": f"mutated{ext}", "reason": bad.reason} in s.unreadable
        else:
            assert bad.id in svc.catalog.embedded_ids(lib.id, embedder.identity)
        try:
            thumb = render_thumbnail(str(folder / f"mutated{ext}"), 32)
            assert thumb.width > 0 and thumb.height > 0
        except DecodeError as exc:
            assert exc.reason
        svc.catalog.remove_library(lib.id)
        svc.store.drop(lib.id)


# ------------------------------------------------------------------ caption files

_caption_text = st.one_of(
    st.text(st.characters(codec="utf-8"), min_size=1, max_size=40).filter(lambda t: t.strip()),
    # Characters that some line splitters (str.splitlines) treat as line breaks, though JSON and
    # CSV allow them inside a value; pasted web text carries them.
    st.sampled_from(["a\u2028b", "x\x85y", "p\u2029q", "form\x0cfeed", "v\x0bt", "tab\tsep", "東京 駅"]),
)
# Kinds of line: a good one, or one broken in a way seen in real files.
_line_kind = st.sampled_from(["good", "good", "good", "bad json", "missing image", "no caption field",
                              "wrong type", "not an object", "empty caption", "blank"])


def _jsonl_line(kind: str, image: str, caption: str) -> str:
    return {
        "good": json.dumps({"image": image, "caption": caption}, ensure_ascii=False),
        "bad json": '{"image": "' + image + '", "caption": ',
        "missing image": json.dumps({"image": "no/such/file.jpg", "caption": caption}),
        "no caption field": json.dumps({"image": image}),
        "wrong type": json.dumps({"image": image, "caption": 42}),
        "not an object": json.dumps([image, caption]),
        "empty caption": json.dumps({"image": image, "caption": "   "}),
        "blank": "   ",
    }[kind]


def _check_report(kinds, items, problems, what: str) -> None:
    """items: line numbers processed; problems: {line number: reason}."""
    good = [i for i, k in enumerate(kinds, start=1) if k == "good"]
    bad = [i for i, k in enumerate(kinds, start=1) if k not in ("good", "blank")]
    assert sorted(items) == good, what
    assert sorted(problems) == bad, what
    assert all(reason for reason in problems.values()), what


@PROPERTY_SETTINGS
@given(rows=st.lists(st.tuples(_line_kind, _caption_text), min_size=1, max_size=12),
       crlf=st.booleans())
def test_jsonl_caption_files_report_every_bad_line_by_number(engine_home, rows, crlf):
    from engine.grounding.items import read_items
    from engine.review import load_caption_file

    _, _, photos = engine_home
    image = str(sorted(photos.rglob("*.jpg"))[0])
    kinds = [k for k, _ in rows]
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "captions.jsonl"
        f.write_bytes(("\r\n" if crlf else "\n").join(_jsonl_line(k, image, c) for k, c in rows).encode())
        # Review mode: missing image, empty caption and wrong type are problems too.
        cf = load_caption_file(f)
        _check_report(kinds, [i.line_no for i in cf.items], {p.line_no: p.reason for p in cf.problems}, "review")
        for item, (_k, caption) in zip(cf.items, [r for r in rows if r[0] == "good"], strict=True):
            assert item.caption == caption.strip()
        # `longlens check`: the image and caption fields are taken as found (a missing image
        # and an empty caption are reported when each line is checked), so only the rest counts.
        seen = {n: err for n, _item, err in read_items(f)}
        checked_bad = {n for n, k in enumerate(kinds, start=1)
                       if k in ("bad json", "no caption field", "wrong type", "not an object")}
        assert {n for n, e in seen.items() if e} == checked_bad
        assert set(seen) == {n for n, k in enumerate(kinds, start=1) if k != "blank"}


@PROPERTY_SETTINGS
@given(rows=st.lists(st.tuples(st.sampled_from(["good", "good", "short row", "missing image", "blank"]),
                               _caption_text), min_size=1, max_size=10))
def test_csv_caption_files_report_every_bad_line_by_number(engine_home, rows):
    from engine.grounding.items import read_items
    from engine.review import load_caption_file

    _, _, photos = engine_home
    image = str(sorted(photos.rglob("*.jpg"))[0])
    buf = io.StringIO()
    w = csv.writer(buf)  # RFC 4180: CRLF rows, fields holding CR or LF are quoted
    w.writerow(["image", "caption"])
    line_of: list[tuple[int, str]] = []
    for kind, caption in rows:
        # A record starts on the line after those written so far (quoted captions may span lines).
        line = len(io.StringIO(buf.getvalue(), newline=None).readlines()) + 1
        if kind == "blank":
            buf.write("\r\n")
        elif kind == "short row":
            w.writerow([image])
        else:
            w.writerow(["no/such.jpg" if kind == "missing image" else image, caption])
        line_of.append((line, kind))
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "captions.csv"
        f.write_bytes(buf.getvalue().encode("utf-8"))
        cf = load_caption_file(f)
        good = sorted(n for n, k in line_of if k == "good")
        bad = sorted(n for n, k in line_of if k in ("short row", "missing image"))
        assert sorted(i.line_no for i in cf.items) == good
        assert sorted(p.line_no for p in cf.problems) == bad
        seen = {n: err for n, _item, err in read_items(f)}
        assert sorted(seen) == sorted(good + bad)  # the same line numbers as the file has
        assert sorted(n for n, e in seen.items() if e) == sorted(n for n, k in line_of if k == "short row")


@PROPERTY_SETTINGS
@given(rows=st.lists(st.tuples(_line_kind, _caption_text), min_size=1, max_size=12))
def test_training_jsonl_reports_every_bad_line_by_number(engine_home, rows):
    from engine.training.data import read_training_jsonl

    _, _, photos = engine_home
    image = str(sorted(photos.rglob("*.jpg"))[0])
    kinds = [k for k, _ in rows]
    assume(any(k != "blank" for k in kinds))

    def line(kind: str, caption: str) -> str:
        if kind == "good":
            return json.dumps({"image": image, "original_caption": caption, "paragraph": caption})
        return _jsonl_line(kind, image, caption).replace('"caption"', '"original_caption"')

    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "train.jsonl"
        f.write_text("\n".join(line(k, c) for k, c in rows) + "\n", encoding="utf-8")
        data = read_training_jsonl(f)
        errors = {p.line: p.reason for p in data.problems if p.severity == "error"}
        _check_report(kinds, [r.line for r in data.records], errors, "training")


# ------------------------------------------------------------------ query text

_hostile_text = st.one_of(
    st.text(st.characters(), max_size=200),                                  # any code point but surrogates
    st.text(st.characters(min_codepoint=0, max_codepoint=0x1F), max_size=50),  # control characters only
    st.text(st.sampled_from(list("!?.,;:'\"()[]{}-–—…*&^%$#@~`|/\\")), max_size=80),
    st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1, max_size=5),  # lone surrogates
    st.lists(st.sampled_from(["東京の", "кошка", "قطة", "बिल्ली", "😀", "the", "ball", "\u200b", "\u2028",
                              "\ufeff", "\U000e0001", "a\u0301"]), max_size=60).map(" ".join),
    st.builds(lambda w, n: " ".join([w] * n), st.sampled_from(["bench", "東京", "x"]), st.integers(500, 5000)),
)


@PROPERTY_SETTINGS
@given(text=_hostile_text)
def test_any_query_text_gets_results_or_a_clear_error(engine_home, text):
    from engine.query_budget import token_budget

    svc, embedder, _ = engine_home
    searcher = svc.searcher(embedder)
    try:
        result = searcher.search_text(text, top_k=5)
    except QueryError as exc:
        assert "empty" in str(exc)
    else:
        assert 0 < len(result.hits) <= 5
        assert result.tokens_used <= result.tokens_total
        assert result.truncated == (result.tokens_total > result.tokens_used)
        assert all(np.isfinite(h.score) for h in result.hits)
    # The GUI's live token counter gets the raw editor text, before any cleaning.
    budget = token_budget(embedder, text)
    assert budget.used <= budget.budget
    assert budget.truncated == (budget.cut_at is not None)
    if budget.cut_at is not None:
        assert 0 <= budget.cut_at <= len(text)


# ------------------------------------------------------------------ path names

_name_char = st.characters(blacklist_characters="/\x00", blacklist_categories=("Cs",))
_file_stem = st.one_of(
    st.text(_name_char, min_size=1, max_size=60),
    st.binary(min_size=1, max_size=40).filter(lambda b: b"/" not in b and b"\x00" not in b).map(os.fsdecode),
    st.builds(lambda c, n: c * n, st.sampled_from(["a", "é", "東", " "]), st.integers(100, 200)),
)


def _fits(name: str) -> bool:
    return len(os.fsencode(name)) <= 255 and not name.startswith(".") and name.strip() not in ("", ".", "..")


@PROPERTY_SETTINGS
@given(folder=_file_stem, stem=_file_stem)
def test_any_path_name_is_scanned_stored_and_displayed(engine_home, folder, stem):
    from engine.catalog.paths import for_display
    from engine.indexing.scanner import FileEntry, scan_folder

    svc, embedder, _ = engine_home
    name = stem + ".png"
    assume(_fits(folder) and _fits(name))
    with tempfile.TemporaryDirectory() as d:
        root = Path(d) / "library with spaces"
        (root / folder).mkdir(parents=True)
        target = root / folder / name
        target.write_bytes(_BASE_FILES[".png"])
        found = [e for e in scan_folder(root, frozenset({".png"}))]
        assert [e.rel_path for e in found if isinstance(e, FileEntry)] == [f"{folder}/{name}"]
        summary = last_progress(svc.indexer(embedder, batch_size=4).run(root)).extra["summary"]
        assert summary.new == 1 and not summary.unreadable
        lib = svc.catalog.library_by_root(root)
        (rec,) = svc.catalog.image_records(lib.id)
        assert rec.rel_path == f"{folder}/{name}" and (Path(lib.root) / rec.rel_path).is_file()
        shown = for_display(rec.rel_path)
        shown.encode("utf-8")  # displayable: no lone surrogates left
        hits = svc.searcher(embedder).search_image(target, top_k=20).hits
        assert any(h.path == str(target) for h in hits)
        svc.catalog.remove_library(lib.id)
        svc.store.drop(lib.id)
        shutil.rmtree(root)
