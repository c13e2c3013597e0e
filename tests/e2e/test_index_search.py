"""The photographer's path on real files: index, re-index after changes, search, filters."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from engine.catalog import Catalog
from engine.catalog.dates import picture_date
from engine.models.registry import load_embedder
from tests.e2e.conftest import TINY_MODEL

QUERY = (
    "A wide sandy beach at low tide with a red umbrella near the water. Two children build a castle "
    "to the left of a blue bucket, while gulls circle above the waves under a cloudy afternoon sky."
)


def brute_force_ranking(paths, text: str, max_tokens: int | None = None,
                        text_tower_dir: Path | None = None) -> list[tuple[str, float]]:
    """Exact ranking over every stored vector, computed independently of the ANN index."""
    emb = load_embedder(TINY_MODEL, paths, text_tower_dir=text_tower_dir)
    q = emb.encode_texts([text], max_tokens=max_tokens)[0]
    with Catalog(paths.catalog) as cat:
        out = []
        for lib in cat.libraries():
            ids, vecs = cat.all_vectors(lib.id, emb.identity)
            recs = cat.images_by_id(ids.tolist())
            for i, v in zip(ids.tolist(), vecs, strict=True):
                out.append((float(v @ q), i, str(Path(lib.root) / recs[i].rel_path)))
    out.sort(key=lambda t: (-t[0], t[1]))
    return [(p, s) for s, _, p in out]


def test_index_then_search_equals_brute_force(home, paths, photos, cli):
    summary = cli.json("index", str(photos))
    n_files = len([p for p in photos.rglob("*") if p.is_file()])
    assert summary["scanned"] == n_files
    assert summary["new"] == n_files - len(summary["unreadable"])
    assert summary["embedded"] + summary["reused"] == summary["new"]
    res = cli.json("search", QUERY, "--top", "10")
    assert res["tokens_total"] > 20 and res["tokens_used"] == res["tokens_total"]
    assert res["truncated"] is False
    expected = brute_force_ranking(paths, QUERY)[:10]
    assert [r["path"] for r in res["results"]] == [p for p, _ in expected]
    np.testing.assert_allclose([r["score"] for r in res["results"]], [s for _, s in expected], atol=1e-5)
    assert [r["rank"] for r in res["results"]] == list(range(1, 11))
    # Scores differ between images: a random model that maps everything to one point would not.
    assert len({round(r["score"], 6) for r in res["results"]}) > 5


def test_reindex_unchanged_does_no_work(home, photos, cli):
    cli.json("index", str(photos))
    again = cli.json("index", str(photos))
    assert again["new"] == again["changed"] == again["moved"] == again["deleted"] == 0
    assert again["embedded"] == 0
    assert again["unchanged"] == again["scanned"]


def test_reindex_after_add_change_move_delete(home, paths, photos, sample_master, cli):
    cli.json("index", str(photos))
    with Catalog(paths.catalog) as cat:
        lib = cat.libraries()[0]
        before = {r.rel_path: r for r in cat.image_records(lib.id)}
    files = sorted(p for p in photos.rglob("*") if p.is_file() and before[p.relative_to(photos).as_posix()].status == "ok")
    moved_src, changed, deleted = files[0], files[1], files[2]
    # move (rename into another folder), change content, delete, add a new file
    (photos / "moved here").mkdir()
    moved_dst = photos / "moved here" / ("renamed" + moved_src.suffix)
    shutil.move(moved_src, moved_dst)
    donor = files[3].read_bytes()
    changed.write_bytes(donor if changed.suffix == files[3].suffix else changed.read_bytes()[:-1] + b"\0")
    os.utime(changed, ns=(1_000_000_000, 1_000_000_000))
    deleted.unlink()
    from engine.samples import make_sample_folder

    extra = make_sample_folder(photos / "new", n=2, seed=99)
    s = cli.json("index", str(photos))
    assert s["moved"] == 1
    assert s["deleted"] == 1
    assert s["new"] == len(extra)
    assert s["changed"] + len([u for u in s["unreadable"] if u["path"] == changed.relative_to(photos).as_posix()]) == 1
    with Catalog(paths.catalog) as cat:
        after = {r.rel_path: r for r in cat.image_records(lib.id)}
        rel_src = moved_src.relative_to(photos).as_posix()
        rel_dst = moved_dst.relative_to(photos).as_posix()
        # The moved file kept its row id (and so its vector): no re-inference.
        assert after[rel_dst].id == before[rel_src].id
        assert rel_src not in after
        assert after[deleted.relative_to(photos).as_posix()].status == "deleted"
        assert cat.duplicate_paths() == 0
        assert cat.integrity_check() == "ok"
    # The model saw only the changed file and the new ones.
    assert s["embedded"] + s["reused"] <= len(extra) + 1
    # Search still equals brute force after the changes, and never returns the deleted file.
    res = cli.json("search", QUERY, "--top", "100")
    expected = brute_force_ranking(paths, QUERY)
    assert [r["path"] for r in res["results"]] == [p for p, _ in expected]
    assert str(deleted) not in {r["path"] for r in res["results"]}


def test_missing_root_is_offline_and_deletes_nothing(home, paths, photos, cli, tmp_path):
    cli.json("index", str(photos))
    with Catalog(paths.catalog) as cat:
        n_ok = cat.status_counts(cat.libraries()[0].id).get("ok")
    hidden = tmp_path / "unmounted"
    photos.rename(hidden)
    rc, out, err = cli("index", str(photos), "--json")
    assert rc == 3
    with Catalog(paths.catalog) as cat:
        lib = cat.libraries()[0]
        assert lib.status == "offline"
        assert cat.status_counts(lib.id).get("ok") == n_ok
        assert cat.status_counts(lib.id).get("deleted") is None


def test_filters_and_image_query(home, paths, photos, cli):
    cli.json("index", str(photos))
    with Catalog(paths.catalog) as cat:
        recs = [r for r in cat.image_records(cat.libraries()[0].id) if r.status == "ok"]
    sub = sorted({r.rel_path.split("/")[0] for r in recs if "/" in r.rel_path})[0]
    in_sub = {str(photos / r.rel_path) for r in recs if r.rel_path.startswith(sub + "/")}
    res = cli.json("search", QUERY, "--top", "100", "--folder", str(photos / sub))
    assert {r["path"] for r in res["results"]} == in_sub
    dated = sorted(r.exif_date for r in recs if r.exif_date)
    cameras = [r for r in recs if r.camera_model]
    assert dated and cameras, "the sample folder must carry EXIF dates and cameras"
    cut = dated[len(dated) // 2][:10]
    # A picture without an EXIF date is dated by its file time (issue 20): never dropped for lacking one.
    day = {str(photos / r.rel_path): picture_date(r.exif_date, r.mtime_ns).date[:10] for r in recs}
    res = cli.json("search", QUERY, "--top", "100", "--after", cut)
    assert {r["path"] for r in res["results"]} == {p for p, d in day.items() if d >= cut}
    res = cli.json("search", QUERY, "--top", "100", "--before", cut)
    assert {r["path"] for r in res["results"]} == {p for p, d in day.items() if d < cut}
    model = cameras[0].camera_model
    res = cli.json("search", QUERY, "--top", "100", "--camera", model.lower())
    assert {r["path"] for r in res["results"]} == {
        str(photos / r.rel_path) for r in recs if model.lower() in f"{r.camera_make or ''} {r.camera_model or ''}".lower()
    }
    # Filtered top-k equals the brute-force ranking restricted to the filter.
    res = cli.json("search", QUERY, "--top", "3", "--folder", sub)
    ranked = [p for p, _ in brute_force_ranking(paths, QUERY) if p in in_sub][:3]
    assert [r["path"] for r in res["results"]] == ranked
    # Image as query: the image itself comes first with cosine ~1.
    target = photos / recs[5].rel_path
    res = cli.json("search", "--image", str(target), "--top", "3")
    assert res["results"][0]["path"] == str(target)
    assert res["results"][0]["score"] > 0.98


def test_truncation_is_reported(home, photos, cli):
    cli.json("index", str(photos))
    long_query = " ".join([QUERY] * 12)
    res = cli.json("search", long_query, "--top", "3")
    assert res["truncated"] is True
    assert res["tokens_used"] == 128 and res["tokens_total"] > 400
    rc, out, err = cli("search", long_query, "--top", "3")
    assert rc == 0 and "TRUNCATED" in out and f"128/{res['tokens_total']}" in out


@pytest.mark.parametrize("query", ["", "   \n\t ", "\x00\x01\x02"])
def test_empty_queries_get_a_clear_error(home, photos, cli, query):
    cli.json("index", str(photos))
    rc, out, err = cli("search", query)
    assert rc == 2
    assert "query is empty" in err


def test_corrupted_index_file_is_rebuilt(home, paths, photos, cli):
    cli.json("index", str(photos))
    files = list(paths.indexes.glob("*.llidx"))
    assert len(files) == 1
    data = bytearray(files[0].read_bytes())
    data[len(data) // 2] ^= 0xFF
    files[0].write_bytes(bytes(data))
    res = cli.json("search", QUERY, "--top", "5")
    assert [r["path"] for r in res["results"]] == [p for p, _ in brute_force_ranking(paths, QUERY)[:5]]
    # Truncated file too.
    files[0].write_bytes(files[0].read_bytes()[:40])
    res = cli.json("search", QUERY, "--top", "5")
    assert len(res["results"]) == 5


def test_unreadable_files_are_reported(home, photos, cli):
    (photos / "broken.jpg").write_bytes(b"this is a text file, not a JPEG")
    (photos / "empty.png").write_bytes(b"")
    s = cli.json("index", str(photos))
    reasons = {u["path"]: u["reason"] for u in s["unreadable"]}
    assert reasons["broken.jpg"] == "not an image"
    assert reasons["empty.png"] == "empty file"
    rc, out, err = cli("index", str(photos))
    assert rc == 0
    rc, out, _ = cli("libraries")
    assert "unreadable 2" in out


def test_a_query_in_german_is_warned_about(home, photos, cli):
    """The model reads English only: a German paragraph still gets results, with a warning."""
    cli.json("index", str(photos))
    german = ("Ein breiter Sandstrand bei Ebbe mit einem roten Sonnenschirm nahe am Wasser. Zwei Kinder "
              "bauen eine Burg links von einem blauen Eimer, und Möwen kreisen über den Wellen.")
    rc, out, err = cli("search", german, "--top", "3")
    assert rc == 0
    assert "warning: the query looks German" in err and f"'{TINY_MODEL}'" in err and "English" in err
    assert len([line for line in out.splitlines() if line.strip().startswith(("1 ", "2 ", "3 "))]) == 3
    res = cli.json("search", german, "--top", "3")
    assert len(res["warnings"]) == 1 and "German" in res["warnings"][0] and len(res["results"]) == 3
    rc, _out, err = cli("search", QUERY, "--top", "3")
    assert rc == 0 and "warning" not in err
    assert cli.json("search", QUERY, "--top", "3")["warnings"] == []
