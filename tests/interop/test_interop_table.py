"""The fields x tools table generator (tests/interop/interop_table.py), without the tools: a cell is
"read correctly" only when every case of it passed, "n.a." without a case; a table is written only
after a run that had every case; the same outcomes give the same bytes; a '|' in a row's name does
not split its cell. Runs in plain `make test`."""

from __future__ import annotations

from tests.interop import interop_table as it


def _table() -> it.Table:
    t = it.Table("t-table", "Field", ("exiftool", "exiv2"))
    t.declare("a-jpeg", "Keyword `A|B`", "exiftool")
    t.declare("a-tiff", "Keyword `A|B`", "exiftool")
    t.declare("b", "Rating", "exiv2")
    return t


def test_a_cell_is_read_correctly_only_when_every_case_of_it_passed():
    t = _table()
    t.outcomes.update({"a-jpeg": True, "a-tiff": False, "b": True})
    assert t.cell("Keyword `A|B`", "exiftool") == it.WRONG
    assert t.cell("Keyword `A|B`", "exiv2") == it.NOT_APPLICABLE
    assert t.cell("Rating", "exiv2") == it.READ_OK
    assert t.markdown() == ("| Field | exiftool | exiv2 |\n|---|---|---|\n"
                            "| Keyword `A\\|B` | **wrong** | n.a. |\n| Rating | n.a. | read correctly |\n")


def test_only_a_complete_run_rewrites_the_doc_between_its_markers(tmp_path, monkeypatch):
    doc = tmp_path / "xmp.md"
    doc.write_text("before\n<!-- t-table:start -->\nold\n<!-- t-table:end -->\nafter\n", encoding="utf-8")
    t = _table()
    monkeypatch.setattr(it, "TABLES", (t,))
    t.outcomes.update({"a-jpeg": True, "b": True})  # a-tiff did not run (-k, one file)
    assert it.write_tables(doc) == [] and "old" in doc.read_text(encoding="utf-8")
    t.outcomes["a-tiff"] = True
    assert it.write_tables(doc) == ["t-table"]
    first = doc.read_bytes()
    assert first.decode().startswith("before\n<!-- t-table:start -->\n| Field |")
    assert first.decode().endswith("| Rating | n.a. | read correctly |\n<!-- t-table:end -->\nafter\n")
    it.write_tables(doc)
    assert doc.read_bytes() == first  # deterministic: the same outcomes, the same bytes
