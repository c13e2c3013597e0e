"""Issue 20 item 6 in a real (offscreen) window: the Duplicates dialog runs the engine's job in
a worker, lists the groups with thumbnails, sizes, dates and paths, exports the list, and never
changes a picture."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from PySide6.QtWidgets import QMessageBox

from desktop_app.dialogs import messages
from tests.dated_pictures import file_state
from tests.desktop_app.conftest import WAIT_MS, index_folder, settle
from tests.duplicate_pictures import EXACT, NEAR_A, NEAR_B, make_duplicates_folder


def _group_paths(top, root: Path) -> set[str]:
    return {Path(top.child(i).text(3)).relative_to(root).as_posix() for i in range(top.childCount())}


def test_duplicates_dialog_lists_groups_with_thumbnails_and_exports(qtbot, window, tmp_path):
    root = tmp_path / "photos"
    files = make_duplicates_folder(root)
    before = file_state(files)
    index_folder(qtbot, window, root)
    root = root.resolve()
    dlg = window.open_duplicates()
    qtbot.waitUntil(dlg.isVisible, timeout=WAIT_MS)
    assert (dlg.near_spin.minimum(), dlg.near_spin.maximum()) == (0, 32) and dlg.near_spin.value() == 6

    job = dlg.start()
    assert job is not None and not dlg.find_button.isEnabled()  # running in a worker
    settle(qtbot, job)
    qtbot.waitUntil(lambda: dlg.tree.topLevelItemCount() == 3, timeout=WAIT_MS)
    tops = [dlg.tree.topLevelItem(i) for i in range(3)]
    assert tops[0].text(0) == "1. Exact copies · 2 files" and _group_paths(tops[0], root) == EXACT
    assert {frozenset(_group_paths(t, root)) for t in tops[1:]} == {frozenset(NEAR_A), frozenset(NEAR_B)}
    assert all(t.text(0).split(". ", 1)[1].startswith("Near-duplicates") for t in tops[1:])
    child = tops[0].child(0)
    assert child.text(1).endswith("kB") and child.text(2) == "2019-05-01 10:00:00"
    b = next(t for t in tops if "b.jpg" in _group_paths(t, root))
    assert all(b.child(i).text(2).endswith("(file time)") for i in range(b.childCount()))
    assert "Exact copies: 1 · Near-duplicates: 2 · Visually similar: 0" in dlg.summary.text()
    assert "Nothing was deleted" in dlg.summary.text()
    # Thumbnails arrive from the loader's threads for the open groups.
    qtbot.waitUntil(lambda: all(not t.child(i).icon(0).isNull() for t in tops for i in range(t.childCount())),
                    timeout=WAIT_MS)

    assert dlg.export_button.isEnabled()
    settle(qtbot, dlg.export_to(str(tmp_path / "list.csv")))
    rows = list(csv.DictReader((tmp_path / "list.csv").open(encoding="utf-8")))
    assert len(rows) == 8 and "Saved the list to" in dlg.summary.text()
    settle(qtbot, dlg.export_to(str(tmp_path / "list.json")))
    assert json.loads((tmp_path / "list.json").read_text(encoding="utf-8"))["counts"]["near"] == 2
    # The CLI's guard: never into a library.
    settle(qtbot, dlg.export_to(str(root / "list.csv")))
    qtbot.waitUntil(lambda: bool(dlg.findChildren(QMessageBox, messages.ERROR_OBJECT_NAME)), timeout=WAIT_MS)
    assert "inside the indexed library" in dlg.findChildren(QMessageBox, messages.ERROR_OBJECT_NAME)[0].text()
    assert not (root / "list.csv").exists()
    dlg.close()
    assert file_state(files) == before


def test_similar_pictures_use_the_model_in_use(qtbot, window, tmp_path):
    root = tmp_path / "photos"
    make_duplicates_folder(root)
    index_folder(qtbot, window, root)
    dlg = window.open_duplicates()
    dlg.similar_check.setChecked(True)
    assert dlg.similar_spin.isEnabled() and dlg.similar_spin.maximum() == 1.0
    dlg.similar_spin.setValue(0.5)
    job = dlg.start()
    settle(qtbot, job)
    qtbot.waitUntil(lambda: dlg.report is not None, timeout=WAIT_MS)
    assert dlg.report.similar == 0.5 and dlg.report.model == "tiny"
    dlg.close()
