"""Issue 20 item 5: a picture's date (EXIF, else the file time, marked), date filters that keep
undated pictures, what every optional-metadata filter does with pictures lacking its field, and
the result order and relevance cut-off."""

from __future__ import annotations

import datetime as dt
import time

import pytest
from sqlalchemy import select

from engine.catalog import Catalog, ImageFilter, ImageWrite
from engine.catalog.catalog import MISSING_FIELD_RULES
from engine.catalog.dates import (
    DATE_FROM_EXIF,
    DATE_FROM_FILE_TIME,
    DATE_FROM_XMP,
    describe_date,
    file_time_date,
    picture_date,
    picture_date_sql,
)
from engine.catalog.schema import images
from engine.cli import search as cli_search
from engine.options import RELEVANCE_CUTOFF, RESULT_ORDER, OptionError
from engine.search.ordering import apply_cutoff, arrange, order_hits
from engine.search.searcher import gap_notes
from engine.types import STATUS_OK, PhotoMetadata, SearchHit, SearchResult


def _ns(y, m, d, hh=12, mm=0, ss=0, frac_ns=0) -> int:
    return int(dt.datetime(y, m, d, hh, mm, ss).timestamp()) * 1_000_000_000 + frac_ns


def _write(lib_id: int, rel: str, **kw) -> ImageWrite:
    base = dict(library_id=lib_id, rel_path=rel, size=10, mtime_ns=_ns(2022, 6, 1), content_hash="h-" + rel,
                status=STATUS_OK)
    base.update(kw)
    return ImageWrite(**base)


def test_picture_date_is_exif_else_file_time_marked():
    exif = picture_date("2019-06-01T10:00:00", _ns(2022, 1, 1))
    assert (exif.date, exif.source) == ("2019-06-01T10:00:00", DATE_FROM_EXIF)
    got = picture_date(None, _ns(2022, 3, 4, 5, 6, 7, 999_999_999))
    assert got.date == "2022-03-04T05:06:07" and got.source == DATE_FROM_FILE_TIME
    assert describe_date(got.date, got.source) == "file time 2022-03-04 05:06:07 (no EXIF, XMP or IPTC date)"
    assert describe_date("2019-06-01T10:00:00", DATE_FROM_EXIF) == "taken 2019-06-01 10:00:00"
    assert cli_search.DATE_FROM_FILE_TIME == DATE_FROM_FILE_TIME


@pytest.mark.parametrize("mtime_ns", [_ns(2022, 3, 4, 5, 6, 7, 999_999_999), _ns(2024, 12, 31, 23, 59, 59, 1),
                                      1_699_999_999_999_999_999, 0, -1_500_000_000, _ns(1969, 7, 20, 20, 17, 40)])
def test_the_sql_date_and_the_python_date_agree_to_the_second(tmp_path, mtime_ns):
    with Catalog(tmp_path / "c.sqlite3") as cat:
        lib = cat.add_library(tmp_path)
        cat.write_batch("m", [_write(lib.id, "a.jpg", mtime_ns=mtime_ns)])
        with cat.read() as conn:
            sql = conn.execute(select(picture_date_sql()).select_from(images)).scalar()
    assert sql == file_time_date(mtime_ns)


@pytest.mark.parametrize(("taken_at", "whole"), [
    ("1994-08-12T16:05:09", "1994-08-12T16:05:09"), ("1994-08-12", "1994-08-12T00:00:00"),
    ("1994-08", "1994-08-01T00:00:00"), ("1994", "1994-01-01T00:00:00")])
def test_an_xmp_date_comes_after_exif_and_before_the_file_time_in_sql_and_python(tmp_path, taken_at, whole):
    file_time = _ns(2024, 2, 2)
    with Catalog(tmp_path / "c.sqlite3") as cat:
        lib = cat.add_library(tmp_path)
        scan, camera, plain = cat.write_batch("m", [
            _write(lib.id, "scan.jpg", mtime_ns=file_time),
            _write(lib.id, "camera.jpg", exif_date="2020-07-15T09:30:00", mtime_ns=file_time),
            _write(lib.id, "plain.jpg", mtime_ns=file_time)])
        cat.write_metadata([(scan, PhotoMetadata(taken_at=taken_at, state="s")),
                            (camera, PhotoMetadata(taken_at="2011-01-01T00:00:00", state="s")),
                            (plain, PhotoMetadata(title="no date", state="s"))])
        with cat.read() as conn:
            sql = dict(conn.execute(select(images.c.id, picture_date_sql()).select_from(images)).all())
        xmp = cat.xmp_dates([scan, camera, plain])
        assert xmp == {scan: taken_at, camera: "2011-01-01T00:00:00"}
        # EXIF, then XMP, then the file time, the same in the filter's SQL and in every display.
        got = {i: picture_date(r.exif_date, r.mtime_ns, xmp.get(i)) for i, r in cat.images_by_id(sql).items()}
        assert (got[scan].date, got[scan].source) == (whole, DATE_FROM_XMP) and sql[scan] == whole
        assert (got[camera].date, got[camera].source) == ("2020-07-15T09:30:00", DATE_FROM_EXIF)
        assert sql[camera] == got[camera].date
        assert got[plain].source == DATE_FROM_FILE_TIME and sql[plain] == file_time_date(file_time)
        # The scan is filtered by its XMP date (its file time, 2024, would put it elsewhere), and the
        # date filter's note counts only the picture dated by its file time.
        assert cat.filtered_ids(lib.id, ImageFilter(after="1994-01-01", before="1995-01-01")) == {scan}
        assert cat.filter_gaps(lib.id, ImageFilter(after="1994-01-01", before="1995-01-01")) == {"date": 0}
        assert cat.filter_gaps(lib.id, ImageFilter(after="2024-01-01")) == {"date": 1}
    assert describe_date(whole, DATE_FROM_XMP) == f"taken {whole.replace('T', ' ')} (XMP date)"


def test_date_filters_keep_undated_pictures_by_their_file_time_and_say_so(tmp_path):
    with Catalog(tmp_path / "c.sqlite3") as cat:
        lib = cat.add_library(tmp_path)
        a, b, c, d = cat.write_batch("m", [
            _write(lib.id, "a.jpg", exif_date="2019-06-01T10:00:00", camera_make="Canon", camera_model="EOS R5",
                   mtime_ns=_ns(2023, 1, 1)),  # EXIF wins over the file time
            _write(lib.id, "b.jpg", mtime_ns=_ns(2021, 5, 5)),  # scanned, no EXIF: file time 2021
            _write(lib.id, "c.jpg", mtime_ns=_ns(2019, 3, 3), camera_make="FUJIFILM"),
            _write(lib.id, "d.jpg", exif_date="2021-12-31T23:00:00", camera_model="X-T4"),
        ])
        assert cat.filtered_ids(lib.id, ImageFilter(after="2020-01-01")) == {b, d}
        assert cat.filtered_ids(lib.id, ImageFilter(before="2020-01-01")) == {a, c}
        assert cat.filtered_ids(lib.id, ImageFilter(after="2021-05-05", before="2021-05-06")) == {b}
        # The date filter keeps b and says it was dated by its file time; c lies outside the range.
        assert cat.filter_gaps(lib.id, ImageFilter(after="2020-01-01")) == {"date": 1}
        # The camera filter leaves out b (no camera recorded), and counts it among the pictures the
        # rest of the filter keeps (the folder, the dates).
        assert cat.filtered_ids(lib.id, ImageFilter(camera="x")) == {d}  # "X-T4"; nothing else has an x
        assert cat.filter_gaps(lib.id, ImageFilter(camera="x")) == {"camera": 1}
        # c (FUJIFILM) has no EXIF date: its file time (2019) is before 2020, and the note says so.
        assert cat.filtered_ids(lib.id, ImageFilter(camera="fuji", before="2020-01-01")) == {c}
        assert cat.filter_gaps(lib.id, ImageFilter(camera="fuji", before="2020-01-01")) == {"camera": 0, "date": 1}
        assert cat.filter_gaps(lib.id, ImageFilter(folder="/elsewhere", camera="x")) == {}
        assert cat.filter_gaps(lib.id, ImageFilter(folder=str(tmp_path))) == {}
    assert set(MISSING_FIELD_RULES) == {"date", "camera", "rating", "label", "keyword", "gps"}
    assert gap_notes({"date": 1, "camera": 3}) == [
        "date filter: 1 picture with no EXIF, XMP or IPTC date dated by the file's modification time instead",
        "camera filter: 3 pictures with no camera recorded left out",
    ]
    assert gap_notes({"camera": 0}) == []


def _hit(rank: int, score: float, date: str | None, source: str = DATE_FROM_EXIF) -> SearchHit:
    return SearchHit(rank=rank, image_id=rank, path=f"/p/{rank}.jpg", score=score, library_id=1,
                     rel_path=f"{rank}.jpg", date=date, date_source=source if date else None)


HITS = [_hit(1, 0.40, "2020-01-01T00:00:00"), _hit(2, 0.39, "2024-01-01T00:00:00", DATE_FROM_FILE_TIME),
        _hit(3, 0.37, "2020-01-01T00:00:00"), _hit(4, 0.30, None), _hit(5, 0.10, "2030-01-01T00:00:00")]


def test_the_cutoff_keeps_results_within_delta_of_this_querys_best_score():
    kept, cut = apply_cutoff(HITS, 0.05)
    assert [h.rank for h in kept] == [1, 2, 3]
    assert cut.best == pytest.approx(0.40) and cut.threshold == pytest.approx(0.35)
    assert (cut.kept, cut.below) == (3, 2)
    assert cut.text() == ("3 results above the cut-off: score at least 0.3500 (within 0.05 of the best, 0.4000); "
                          "2 below it not shown")
    # Relative to the query: the same delta on a query whose scores are all lower keeps as many.
    lower = [_hit(h.rank, h.score - 0.2, h.date) for h in HITS]
    assert [h.rank for h in apply_cutoff(lower, 0.05)[0]] == [1, 2, 3]
    kept, cut = apply_cutoff(HITS, 2.0)
    assert len(kept) == 5 and cut.below == 0 and "none of the results looked at fell below it" in cut.text()
    assert apply_cutoff(HITS, None) == (HITS, None)
    assert apply_cutoff([], 0.1)[1].kept == 0


def test_date_orders_arrange_the_same_results_ties_in_rank_order_undated_last():
    assert [h.rank for h in order_hits(HITS, "date-new")] == [5, 2, 1, 3, 4]
    assert [h.rank for h in order_hits(HITS, "date-old")] == [1, 3, 2, 5, 4]
    assert [h.rank for h in order_hits(HITS, "relevance")] == [1, 2, 3, 4, 5]
    res = arrange(SearchResult(hits=list(HITS)), "date-old", 0.05)
    assert [h.rank for h in res.hits] == [1, 3, 2] and res.order == "date-old" and res.cutoff.below == 2


@pytest.mark.parametrize(("call", "message"), [
    (lambda: RESULT_ORDER.check("newest"), "result order must be one of relevance, date-new, date-old, got 'newest'"),
    (lambda: RELEVANCE_CUTOFF.check(0.0), "relevance cut-off must be greater than 0, got 0"),
    (lambda: RELEVANCE_CUTOFF.check(2.5), "relevance cut-off must be at most 2, got 2.5"),
    (lambda: apply_cutoff(HITS, -1.0), "relevance cut-off must be greater than 0, got -1"),
    (lambda: order_hits(HITS, "date"), "result order must be one of"),
])
def test_bad_order_or_cutoff_is_refused_with_the_fields_name(call, message):
    with pytest.raises(OptionError, match=message.replace("(", r"\(").replace(")", r"\)")):
        call()


def test_file_time_is_local_time_like_exif():
    now = time.time_ns()
    assert file_time_date(now) == dt.datetime.fromtimestamp(now // 1_000_000_000).strftime("%Y-%m-%dT%H:%M:%S")
