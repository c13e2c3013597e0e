"""Issue 20 item 5 through the real CLI: pictures without an EXIF date are dated by their file
time (and marked so), the date filter keeps them, results sort by relevance or date, and the
relevance cut-off says where it cut. Originals stay byte- and mtime-identical."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.dated_pictures import NEWEST_FIRST, file_state, make_dated_folder
from tests.e2e.conftest import TINY_MODEL

QUERY = "A red ball on the grass next to a wooden bench under a tall tree."
MODEL = ("--model", TINY_MODEL)


@pytest.fixture
def dated(tmp_path) -> dict[str, Path]:
    return make_dated_folder(tmp_path / "dated")


def test_undated_pictures_are_dated_by_file_time_filtered_sorted_and_cut(home, dated, cli):
    before = file_state(dated)
    root = next(iter(dated.values())).parent
    assert cli("index", str(root), *MODEL, "--quiet")[0] == 0
    by_path = {str(p.resolve()): k for k, p in dated.items()}

    res = cli.json("search", QUERY, *MODEL)
    got = {by_path[h["path"]]: (h["date"], h["date_source"]) for h in res["results"]}
    assert got["exif2020"] == ("2020-07-15T09:30:00", "exif")
    assert got["shot2021"] == ("2021-06-06T12:00:00", "file time")
    assert res["order"] == "relevance" and res["cutoff"] is None

    # The date filter keeps the picture without an EXIF date, by its file time, and says so.
    rc, out, err = cli("search", QUERY, *MODEL, "--after", "2021-01-01", "--before", "2022-12-31", "--json")
    assert rc == 0, err
    inside = {by_path[h["path"]] for h in json.loads(out)["results"]}
    assert inside == {"shot2021", "exif2022"}
    assert "note: date filter: 1 picture with no EXIF, XMP or IPTC date dated by the file's modification time instead" in err
    # The camera filter leaves out the three that record no camera, and says so.
    rc, out, err = cli("search", QUERY, *MODEL, "--camera", "canon", "--json")
    assert {by_path[h["path"]] for h in json.loads(out)["results"]} == {"exif2019", "exif2020", "exif2022"}
    assert "note: camera filter: 3 pictures with no camera recorded left out" in err

    # Sorting arranges the same results by date; the rank stays the relevance rank.
    new = cli.json("search", QUERY, *MODEL, "--sort", "date-new")
    old = cli.json("search", QUERY, *MODEL, "--sort", "date-old")
    assert tuple(by_path[h["path"]] for h in new["results"]) == NEWEST_FIRST
    assert [h["path"] for h in old["results"]] == [h["path"] for h in reversed(new["results"])]
    assert sorted(h["rank"] for h in new["results"]) == [1, 2, 3, 4, 5, 6] and new["order"] == "date-new"
    rc, out, _ = cli("search", QUERY, *MODEL, "--sort", "date-old")
    lines = [ln for ln in out.splitlines() if ln.strip()[:1].isdigit()]
    assert "2018-03-03 12:00*" in lines[0] and "scan2018.jpg" in lines[0]
    assert "2019-05-01 10:00 " in lines[1] and "ordered by date, oldest first" in out
    assert "* no EXIF, XMP or IPTC date: the date shown is the file's modification time" in out

    # The cut-off: the results within DELTA of this query's best score, and where it cut.
    scores = sorted((h["score"] for h in res["results"]), reverse=True)
    gaps = [a - b for a, b in zip(scores, scores[1:], strict=False)]
    delta = (scores[0] - scores[2]) + min(gaps[2] / 2, 1e-4) if gaps[2] > 0 else None
    assert delta is not None, f"the tiny model scored two pictures alike: {scores}"
    cut = cli.json("search", QUERY, *MODEL, "--cutoff", f"{delta:.9f}")
    assert len(cut["results"]) == 3 and cut["cutoff"]["kept"] == 3 and cut["cutoff"]["below"] == 3
    assert cut["cutoff"]["best"] == pytest.approx(scores[0])
    assert all(h["score"] >= cut["cutoff"]["threshold"] for h in cut["results"])
    rc, out, _ = cli("search", QUERY, *MODEL, "--cutoff", f"{delta:.9f}")
    assert "cut-off: 3 results above the cut-off: score at least" in out and "3 below it not shown" in out
    # The cut-off and the order together: the kept three, by date.
    both = cli.json("search", QUERY, *MODEL, "--cutoff", f"{delta:.9f}", "--sort", "date-new")
    assert {h["path"] for h in both["results"]} == {h["path"] for h in cut["results"]}
    assert [h["date"] for h in both["results"]] == sorted((h["date"] for h in both["results"]), reverse=True)

    assert file_state(dated) == before  # nothing was written to the originals


@pytest.mark.parametrize(("flags", "message"), [
    (("--sort", "newest"), "result order must be one of relevance, date-new, date-old, got 'newest'"),
    (("--cutoff", "0"), "relevance cut-off must be greater than 0, got 0"),
    (("--cutoff", "3"), "relevance cut-off must be at most 2, got 3"),
    (("--cutoff", "lots"), "relevance cut-off must be a number greater than 0 and at most 2, got 'lots'"),
])
def test_bad_sort_or_cutoff_is_a_usage_error_naming_the_field(home, cli, flags, message):
    rc, _, err = cli("search", QUERY, *MODEL, *flags)
    assert rc == 2 and message in err and flags[0] in err
