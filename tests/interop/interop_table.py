"""The fields x tools tables of docs/xmp.md, generated from the interop run (make test-interop).

Every case of tests/interop/test_fields_by_tool.py and test_written_read_back.py is one cell's
proof (a cell may have several: one per file format). tests/interop/conftest.py records each case's
outcome; when the run has an outcome for every case, the tables are rewritten between their marker
comments in docs/xmp.md. A run of only some cases (-k, a single file) leaves docs/xmp.md as it is,
so the table always describes a whole run. The output depends only on the outcomes (rows and
columns in a fixed order, no times), so an unchanged result rewrites the same bytes."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "xmp.md"

READ_OK, WRONG, NOT_APPLICABLE = "read correctly", "**wrong**", "n.a."


@dataclass
class Table:
    key: str  # the marker: <!-- {key}:start --> ... <!-- {key}:end -->
    caption: str  # the header of the first column
    columns: tuple[str, ...]
    rows: list[str] = field(default_factory=list)
    case_ids: dict[str, tuple[str, str]] = field(default_factory=dict)  # case id -> (row, column)
    outcomes: dict[str, bool] = field(default_factory=dict)  # case id -> passed
    ok: str = READ_OK

    def declare(self, case_id: str, row: str, column: str) -> None:
        assert column in self.columns, column
        assert case_id not in self.case_ids, case_id
        if row not in self.rows:
            self.rows.append(row)
        self.case_ids[case_id] = (row, column)

    def complete(self) -> bool:
        return bool(self.case_ids) and set(self.outcomes) >= set(self.case_ids)

    def cell(self, row: str, column: str) -> str:
        ids = [i for i, rc in self.case_ids.items() if rc == (row, column)]
        if not ids:
            return NOT_APPLICABLE
        return self.ok if all(self.outcomes.get(i) for i in ids) else WRONG

    def markdown(self) -> str:
        lines = [f"| {self.caption} | " + " | ".join(self.columns) + " |",
                 "|" + "---|" * (len(self.columns) + 1)]
        # A '|' in a row's name (a keyword path) would end its cell, even inside `code`.
        lines += [f"| {row.replace('|', chr(92) + '|')} | " + " | ".join(self.cell(row, c) for c in self.columns) + " |"
                  for row in self.rows]
        return "\n".join(lines) + "\n"


FIELDS = Table("interop-fields-table", "Field (as the tool writes it)",
               ("exiftool", "exiv2", "darktable-cli", "pidng", "Photoshop CS5"))
WRITTEN = Table("interop-written-table", "Written by `longlens xmp export`",
                ("exiftool", "exiv2", "darktable-cli"), ok="read back")
TABLES = (FIELDS, WRITTEN)


def table_of(case_id: str) -> Table | None:
    for t in TABLES:
        if case_id in t.case_ids:
            return t
    return None


def replace_between_markers(text: str, key: str, body: str) -> str:
    start, end = f"<!-- {key}:start -->", f"<!-- {key}:end -->"
    assert start in text and end in text, f"docs/xmp.md has no {start} ... {end} markers"
    head, rest = text.split(start, 1)
    _old, tail = rest.split(end, 1)
    return f"{head}{start}\n{body}{end}{tail}"


def write_tables(doc: Path = DOC) -> list[str]:
    """Rewrites every complete table in `doc`; returns the keys written."""
    text = doc.read_text(encoding="utf-8")
    written = []
    for t in TABLES:
        if t.complete():
            text = replace_between_markers(text, t.key, t.markdown())
            written.append(t.key)
    if written:
        doc.write_text(text, encoding="utf-8")
    return written
