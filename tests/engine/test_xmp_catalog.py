"""Issue 20 items 2 and 4: XMP metadata in the catalog (schema 5, migrated from a real schema-4 file
with a backup), the rating / label / keyword filters on a real SQLite catalog, and re-scans that
pick up added, edited and removed sidecars without re-embedding any picture."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest
from PIL import Image

from engine.catalog import Catalog, ImageWrite, db
from engine.config import get_paths
from engine.models.download import import_model
from engine.search.filters import FilterError, build_filters
from engine.services import Services
from engine.types import STATUS_OK, PhotoMetadata
from tests.engine.catalog_versions import make_catalog_at
from tests.engine.test_xmp import DATA, EMBEDDED_PACKET

MODEL = "tiny"


# --------------------------------------------------------------------------- filters on a real catalog


def _write(lib_id: int, rel: str) -> ImageWrite:
    return ImageWrite(library_id=lib_id, rel_path=rel, size=10, mtime_ns=1, content_hash=f"h-{rel}", status=STATUS_OK)


@pytest.fixture
def filled(tmp_path):
    cat = Catalog(tmp_path / "c.sqlite3")
    lib = cat.add_library(tmp_path)
    ids = cat.write_batch("m", [_write(lib.id, r) for r in
                                ("oslo.jpg", "bergen.jpg", "flam.jpg", "plain.jpg", "rejected.jpg", "2021/norway.jpg")])
    oslo, bergen, flam, plain, rejected, flat = ids
    cat.write_metadata([
        (oslo, PhotoMetadata(rating=4, label="Green", subjects=("Norway", "Oslo", "Places"),
                             hierarchy=("Places|Norway|Oslo", "Transport|ferry"), state="s")),
        (bergen, PhotoMetadata(rating=3, label="Yellow", hierarchy=("Places|Norway|Bergen",), state="s")),
        (flam, PhotoMetadata(rating=5, label="rot", hierarchy=("Places|Norway|Flåm",), state="s")),
        (plain, PhotoMetadata(state="s")),
        (rejected, PhotoMetadata(rating=-1, subjects=("Norway",), state="s")),
        (flat, PhotoMetadata(subjects=("Norway",), hierarchy=("Places|Norwayish",), state="s")),
    ])
    yield cat, lib, dict(zip(("oslo", "bergen", "flam", "plain", "rejected", "flat"), ids, strict=True))
    cat.close()


def test_keyword_filters_match_a_path_and_everything_under_it(filled):
    cat, lib, i = filled

    def ids(*keywords):
        return cat.filtered_ids(lib.id, build_filters(keyword=list(keywords)))

    assert ids("Places|Norway") == {i["oslo"], i["bergen"], i["flam"]}  # not Places|Norwayish
    assert ids("places | norway | OSLO") == {i["oslo"]}  # levels trimmed, case ignored
    assert ids("PLACES|NORWAY|FLÅM") == {i["flam"]}  # beyond ASCII too
    assert ids("Places|Nor") == set()  # a level is matched whole
    assert ids("Places") == {i["oslo"], i["bergen"], i["flam"], i["flat"]}
    assert ids("Norway") == {i["oslo"], i["rejected"], i["flat"]}  # the flat keyword
    assert ids("Places|Norway", "Transport|ferry") == {i["oslo"]}  # every keyword must match
    assert ids("Places|Norway", "Transport|bus") == set()


def test_rating_and_label_filters(filled):
    cat, lib, i = filled
    every = set(i.values())
    assert cat.filtered_ids(lib.id, build_filters(rating=4)) == {i["oslo"], i["flam"]}
    assert cat.filtered_ids(lib.id, build_filters(rating="3")) == {i["oslo"], i["bergen"], i["flam"]}
    # 0: everything but the rejected picture; no rating written counts as unrated (0).
    assert cat.filtered_ids(lib.id, build_filters(rating=0)) == every - {i["rejected"]}
    assert cat.filtered_ids(lib.id, build_filters(label="green")) == {i["oslo"]}
    assert cat.filtered_ids(lib.id, build_filters(label="ROT")) == {i["flam"]}
    assert cat.filtered_ids(lib.id, build_filters(label="Green", rating=5)) == set()
    assert cat.filtered_ids(lib.id, build_filters(keyword="Places|Norway", rating=4, folder="")) == {i["oslo"], i["flam"]}
    assert cat.filtered_ids(lib.id, build_filters(keyword="Norway", folder="2021")) == {i["flat"]}
    assert build_filters(rating=None, label="  ", keyword=["", " "]).is_empty()


def test_the_xmp_filters_say_what_they_did_with_pictures_lacking_the_field(filled):
    """catalog.MISSING_FIELD_RULES: no rating counts as unrated (0); no label or keyword: left out."""
    from engine.search.searcher import gap_notes

    cat, lib, i = filled
    # No rating written: plain and flat (rejected has -1). Counted among what the rest keeps.
    assert cat.filter_gaps(lib.id, build_filters(rating=4)) == {"rating": 2}
    assert cat.filter_gaps(lib.id, build_filters(rating=0, folder="2021")) == {"rating": 1}
    assert cat.filter_gaps(lib.id, build_filters(label="green")) == {"label": 3}  # plain, rejected, flat
    assert cat.filter_gaps(lib.id, build_filters(keyword="Norway")) == {"keyword": 1}  # plain
    assert gap_notes({"rating": 2, "label": 1, "keyword": 0}) == [
        "rating filter: 2 pictures with no rating counted as unrated (0)",
        "label filter: 1 picture with no colour label left out"]


@pytest.mark.parametrize("kw,message", [
    ({"rating": 6}, "minimum rating must be at most 5, got 6"),
    ({"rating": "-1"}, "minimum rating must be at least 0, got -1"),
    ({"rating": "three"}, "minimum rating must be an integer from 0 to 5, got 'three'"),
    ({"rating": 2.5}, "minimum rating must be a whole number, got 2.5"),
    ({"keyword": " | | "}, "the 'keyword' filter '| |' has no keyword in it"),
    ({"keyword": 3}, "the 'keyword' filter must be text, got 3"),
    ({"label": ["Red"]}, "the 'label' filter must be text"),
])
def test_bad_filter_values_name_the_field(kw, message):
    with pytest.raises(FilterError) as err:
        build_filters(**kw)
    assert message in str(err.value) or str(err.value).startswith(message)
    assert err.value.settings in (("rating",), ("keyword",), ("label",))
    assert "--" not in str(err.value)


def test_metadata_is_replaced_whole_and_goes_with_its_picture(filled):
    cat, lib, i = filled
    cat.write_metadata([(i["oslo"], PhotoMetadata(title="New", hierarchy=("Places|Sweden",), state="t"))])
    m = cat.photo_metadata([i["oslo"]])[i["oslo"]]
    assert (m.title, m.hierarchy, m.subjects, m.rating, m.label) == ("New", ("Places|Sweden",), (), None, None)
    assert cat.filtered_ids(lib.id, build_filters(keyword="Places|Norway|Oslo")) == set()
    assert cat.write_metadata([(999_999, PhotoMetadata(state="t"))]) == 0  # no such picture: skipped
    cat.purge_deleted()
    cat.write_batch("m", [], deleted_ids=[i["bergen"]])
    cat.purge_deleted()
    with cat.read() as conn:
        left = conn.exec_driver_sql("SELECT count(*) FROM image_keywords WHERE image_id = ?", (i["bergen"],)).scalar()
        assert left == 0 and conn.exec_driver_sql("PRAGMA foreign_key_check").all() == []


# --------------------------------------------------------------------------- indexing


@pytest.fixture
def services(tmp_path, blip_tiny_checkpoint):
    paths = get_paths(tmp_path / "home").ensure()
    import_model(blip_tiny_checkpoint, MODEL, paths)
    svc = Services(paths)
    yield svc
    svc.close()


def _photos(folder: Path) -> list[Path]:
    folder.mkdir(parents=True)
    out = []
    for n, colour in enumerate(("teal", "orange", "navy", "olive")):
        p = folder / f"IMG_{2044 + n}.jpg"
        kw = {"xmp": EMBEDDED_PACKET} if n == 1 else {}
        Image.new("RGB", (64, 48), colour).save(p, "JPEG", quality=85, **kw)
        out.append(p)
    return out


class EmbeddingCounter:
    """Counts the pictures that go through the model (every path to it: encode_pixels)."""

    def __init__(self, embedder, monkeypatch) -> None:
        self.pictures = 0
        real = embedder.encode_pixels

        def counted(pixels):
            self.pictures += len(pixels)
            return real(pixels)

        monkeypatch.setattr(embedder, "encode_pixels", counted)


def _index(svc, emb, folder):
    return list(svc.indexer(emb, batch_size=2).run(folder))[-1].extra["summary"]


def _ids(svc, lib_id, **filters):
    return svc.catalog.filtered_ids(lib_id, build_filters(**filters))


def _vectors_written_at(svc) -> list[tuple[int, float]]:
    with svc.catalog.read() as conn:
        return conn.exec_driver_sql("SELECT image_id, created_at FROM embeddings ORDER BY image_id").all()


def _dump(path: Path) -> tuple[int, list[str]]:
    """(user_version, every statement that recreates the file's schema and rows)."""
    con = sqlite3.connect(path)
    try:
        return con.execute("PRAGMA user_version").fetchone()[0], list(con.iterdump())
    finally:
        con.close()


def test_sidecar_added_edited_and_removed_are_read_without_re_embedding(services, tmp_path, monkeypatch):
    photos = tmp_path / "photos"
    _photos(photos)
    emb = services.embedder(MODEL)
    counter = EmbeddingCounter(emb, monkeypatch)
    s = _index(services, emb, photos)
    assert (s.new, s.embedded, counter.pictures, s.xmp_read, s.xmp_reread) == (4, 4, 4, 4, 0)
    lib = services.catalog.libraries()[0]
    ids = {r.rel_path: r.id for r in services.catalog.image_records(lib.id)}
    assert _ids(services, lib.id, keyword="Places|Norway") == {ids["IMG_2045.jpg"]}  # its embedded packet
    vectors = _vectors_written_at(services)

    sidecar = photos / "IMG_2044.jpg.xmp"
    shutil.copy(DATA / "darktable.xmp", sidecar)  # added (darktable)
    s = _index(services, emb, photos)
    assert (s.embedded, s.changed, s.unchanged, s.xmp_reread, counter.pictures) == (0, 0, 4, 1, 4)
    assert _ids(services, lib.id, keyword="Places|Norway|Bergen") == {ids["IMG_2044.jpg"]}
    assert _ids(services, lib.id, label="yellow", rating=3) == {ids["IMG_2044.jpg"]}

    sidecar.write_text(sidecar.read_text(encoding="utf-8").replace("Places|Norway|Bergen", "Places|Norway|Stavanger"),
                       encoding="utf-8")  # edited (another size)
    s = _index(services, emb, photos)
    assert (s.embedded, s.xmp_reread, counter.pictures) == (0, 1, 4)
    assert _ids(services, lib.id, keyword="Places|Norway|Bergen") == set()
    assert _ids(services, lib.id, keyword="Places|Norway|Stavanger") == {ids["IMG_2044.jpg"]}

    stem = photos / "IMG_2046.xmp"  # a Lightroom-style stem sidecar naming no extension
    stem.write_text((DATA / "lightroom-classic.xmp").read_text(encoding="utf-8")
                    .replace('photoshop:SidecarForExtension="NEF"', ""), encoding="utf-8")
    sidecar.unlink()  # removed
    s = _index(services, emb, photos)
    assert (s.embedded, s.xmp_reread, counter.pictures) == (0, 2, 4)
    assert _ids(services, lib.id, keyword="Places|Norway|Stavanger") == set()
    assert _ids(services, lib.id, keyword="Places|Norway|Oslo") == {ids["IMG_2046.jpg"]}
    m = services.catalog.photo_metadata([ids["IMG_2046.jpg"]])[ids["IMG_2046.jpg"]]
    assert m.title == "Morning ferry, Oslofjord" and m.sources == ("IMG_2046.xmp",)

    s = _index(services, emb, photos)  # nothing changed: nothing read again
    assert (s.embedded, s.xmp_reread, s.xmp_read, counter.pictures) == (0, 0, 0, 4)
    assert _vectors_written_at(services) == vectors  # every vector is the one the first run wrote
    assert s.as_dict()["xmp_problems"] == []


def test_a_malformed_sidecar_is_reported_and_its_picture_keeps_the_rest(services, tmp_path, monkeypatch):
    photos = tmp_path / "photos"
    _photos(photos)
    (photos / "IMG_2045.jpg.xmp").write_bytes((DATA / "billion-laughs.xmp").read_bytes())
    (photos / "IMG_2046.jpg.xmp").write_bytes((DATA / "darktable.xmp").read_bytes()[:700])
    emb = services.embedder(MODEL)
    s = _index(services, emb, photos)
    assert s.new == 4 and not s.unreadable
    reasons = {p["path"]: p["reason"] for p in s.xmp_problems}
    assert reasons["IMG_2045.jpg"].startswith("IMG_2045.jpg.xmp: refused: it declares a DTD or entities")
    assert reasons["IMG_2046.jpg"].startswith("IMG_2046.jpg.xmp: not well-formed XML")
    lib = services.catalog.libraries()[0]
    ids = {r.rel_path: r.id for r in services.catalog.image_records(lib.id)}
    # The bomb's picture still has its embedded packet's fields; it is searchable and filterable.
    assert _ids(services, lib.id, keyword="Places|Norway|Lofoten") == {ids["IMG_2045.jpg"]}
    stored = services.catalog.photo_metadata([ids["IMG_2045.jpg"]])[ids["IMG_2045.jpg"]]
    assert stored.problems == (reasons["IMG_2045.jpg"],) and stored.title == "Embedded title"
    # Fixed: the next scan reads it (the sidecar changed), and no picture goes through the model again.
    counter = EmbeddingCounter(emb, monkeypatch)
    shutil.copy(DATA / "darktable.xmp", photos / "IMG_2046.jpg.xmp")
    s = _index(services, emb, photos)
    assert (s.xmp_reread, s.embedded, counter.pictures, s.xmp_problems) == (1, 0, 0, [])
    assert _ids(services, lib.id, keyword="Places|Norway|Bergen") == {ids["IMG_2046.jpg"]}


def test_a_new_reader_version_reads_every_picture_again_without_re_embedding(services, tmp_path, monkeypatch):
    import engine.metadata.photo as photo

    photos = tmp_path / "photos"
    _photos(photos)
    emb = services.embedder(MODEL)
    _index(services, emb, photos)
    counter = EmbeddingCounter(emb, monkeypatch)
    monkeypatch.setattr(photo, "READER_VERSION", photo.READER_VERSION + 1)
    s = _index(services, emb, photos)
    assert (s.xmp_reread, s.embedded, counter.pictures) == (4, 0, 0)


def test_a_schema_4_catalog_migrates_with_a_backup_and_its_pictures_get_their_xmp(services, tmp_path, monkeypatch):
    """A real schema-4 file (made by the frozen v1-v4 steps, holding a real indexed library) is upgraded
    on open with a backup first; the next scan reads every picture's XMP and embeds none again."""
    photos = tmp_path / "photos"
    _photos(photos)
    shutil.copy(DATA / "darktable.xmp", photos / "IMG_2044.jpg.xmp")
    emb = services.embedder(MODEL)
    _index(services, emb, photos)
    vectors = _vectors_written_at(services)
    services.close()

    catalog = get_paths(tmp_path / "home").catalog
    v4 = tmp_path / "v4.sqlite3"
    make_catalog_at(v4, 4)
    con = sqlite3.connect(v4)
    con.execute("ATTACH DATABASE ? AS cur", (str(catalog),))
    for table in ("meta", "libraries", "images", "embeddings", "review_sessions", "review_items", "verdicts"):
        con.execute(f"INSERT INTO main.{table} SELECT * FROM cur.{table}")
    con.execute("INSERT INTO verdicts (image_key, caption_hash, sentence_index, verdict, note, updated_at) "
                "VALUES ('sha256:aa', 'cc', NULL, 'faithful', 'kept', 1.0)")
    con.commit()
    con.execute("DETACH DATABASE cur")
    assert con.execute("PRAGMA user_version").fetchone()[0] == 4
    assert con.execute("SELECT count(*) FROM sqlite_master WHERE name = 'image_metadata'").fetchone()[0] == 0
    con.close()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{catalog}{suffix}").unlink(missing_ok=True)
    shutil.move(v4, catalog)
    v4_dump = _dump(catalog)

    svc = Services(get_paths(tmp_path / "home"))
    try:
        cat = svc.catalog
        assert cat.backup_path is not None and _dump(cat.backup_path) == v4_dump  # the v4 catalog, as it was
        assert _dump(cat.backup_path)[0] == 4
        with cat.read() as conn:
            assert db.user_version(conn) == db.SCHEMA_VERSION == 6
            assert conn.exec_driver_sql("SELECT note FROM verdicts").scalar() == "kept"
        assert cat.integrity_check() == "ok"
        assert _vectors_written_at(svc) == vectors
        lib = cat.libraries()[0]
        assert all(state is None for _, state in cat.metadata_states(lib.id).values())  # not read yet
        emb = svc.embedder(MODEL)
        counter = EmbeddingCounter(emb, monkeypatch)
        s = _index(svc, emb, photos)
        assert (s.unchanged, s.embedded, s.xmp_reread, counter.pictures) == (4, 0, 4, 0)
        ids = {r.rel_path: r.id for r in cat.image_records(lib.id)}
        assert _ids(svc, lib.id, keyword="Places|Norway|Bergen") == {ids["IMG_2044.jpg"]}
        assert _ids(svc, lib.id, keyword="Places|Norway|Lofoten") == {ids["IMG_2045.jpg"]}
        assert _vectors_written_at(svc) == vectors
    finally:
        svc.close()


def test_a_raw_jpeg_pair_indexed_as_the_jpeg_is_found_by_the_raws_sidecar(services, tmp_path, monkeypatch):
    from engine.samples import write_dng

    photos = tmp_path / "photos"
    photos.mkdir()
    shot = Image.new("RGB", (96, 64), "navy")
    write_dng(photos / "IMG_0001.DNG", shot)
    shot.save(photos / "IMG_0001.JPG", "JPEG", quality=85)
    shutil.copy(DATA / "darktable.xmp", photos / "IMG_0001.DNG.xmp")  # darktable edits the RAW
    emb = services.embedder(MODEL)
    s = _index(services, emb, photos)
    assert (s.new, s.pair_files_left_out) == (1, 1)
    lib = services.catalog.libraries()[0]
    (jpeg,) = services.catalog.image_records(lib.id)
    assert jpeg.rel_path == "IMG_0001.JPG"
    assert _ids(services, lib.id, keyword="Places|Norway|Bergen") == {jpeg.id}
    # The RAW's sidecar edited: read again for the JPEG, nothing re-embedded.
    counter = EmbeddingCounter(emb, monkeypatch)
    sidecar = photos / "IMG_0001.DNG.xmp"
    sidecar.write_text(sidecar.read_text(encoding="utf-8").replace('xmp:Rating="3"', 'xmp:Rating="5"'),
                       encoding="utf-8")
    s = _index(services, emb, photos)
    assert (s.xmp_reread, s.embedded, counter.pictures) == (1, 0, 0)
    assert _ids(services, lib.id, rating=5) == {jpeg.id}
    # Both files indexed: the DNG has darktable's sidecar, the JPEG nothing.
    s = list(services.indexer(emb, batch_size=2, raw_jpeg_pairs="both").run(photos))[-1].extra["summary"]
    ids = {r.rel_path: r.id for r in services.catalog.image_records(lib.id) if r.status == STATUS_OK}
    assert set(ids) == {"IMG_0001.JPG", "IMG_0001.DNG"}
    assert _ids(services, lib.id, keyword="Places|Norway|Bergen") == {ids["IMG_0001.DNG"]}

