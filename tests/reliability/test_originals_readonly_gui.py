"""Checklist 7 / issue point 3, GUI half: the desktop app's flows, headless (offscreen Qt), on a
read-only photo tree: add and index a folder, search by text and by image, thumbnails, the
inspector (picture, grounding, overlay export), find similar, review (open a caption file kept in
the tree, verdicts, export), re-scan, show unreadable, remove. Afterwards the tree must be
byte-for-byte, mtime-for-mtime the same, with nothing created inside it."""

from __future__ import annotations

import pytest

pytest.importorskip("PySide6")

from PySide6.QtCore import Qt  # noqa: E402

from desktop_app.dialogs import messages  # noqa: E402
from desktop_app.views.results_model import ThumbnailStateRole  # noqa: E402
from tests.reliability.conftest import tree_snapshot  # noqa: E402
from tests.reliability.gui_fixtures import *  # noqa: E402, F403  (the GUI suite's fixtures)
from tests.reliability.gui_fixtures import index_folder, settle  # noqa: E402
from tests.reliability.test_originals_readonly import (  # noqa: E402
    QUERY,
    assert_unchanged,
    build_originals,
    set_read_only,
)


def test_gui_flows_leave_the_originals_untouched(qtbot, window, tmp_path, sample_master, blip_tiny_checkpoint,
                                                 monkeypatch):
    tree = tmp_path / "originals"
    f = build_originals(tree, sample_master, blip_tiny_checkpoint)
    set_read_only(tree)
    try:
        before = tree_snapshot(tree)
        errors: list[str] = []
        monkeypatch.setattr(messages, "show_error", lambda _parent, title, text, *a, **k: errors.append(title))
        monkeypatch.setattr(messages, "confirm", lambda *a, **k: True)

        index_folder(qtbot, window, f["photos"])
        assert_unchanged(tree, before, "adding and indexing a folder")

        view = window.search_view
        settle(qtbot, view.run_text_query(QUERY))
        assert view.model.rowCount() > 0
        qtbot.waitUntil(lambda: view.model.index(0).data(ThumbnailStateRole) == "ready", timeout=20000)
        settle(qtbot, view.search_image(str(f["image"])))
        # The symlink in the tree points at the same picture: either ranks first.
        assert view.model.hit(0).path in (str(f["image"]), str(f["photos"] / "link-to-first.jpg"))
        view.grid.setCurrentIndex(view.model.index(1))
        with qtbot.waitSignal(view.results_shown, timeout=20000):
            view.find_similar_current()
        view.keyword_edit.setText("Places|Norway|Bergen")  # read from the darktable sidecar in the tree
        settle(qtbot, view.run_text_query(QUERY))
        assert [view.model.hit(i).path for i in range(view.model.rowCount())] == [str(f["image"])]
        view.keyword_edit.setText("People|Family")  # from the sidecar of the RAW+JPEG pair's RAW: the JPEG
        settle(qtbot, view.run_text_query(QUERY))
        assert [view.model.hit(i).path.rsplit("/", 1)[-1] for i in range(view.model.rowCount())] == ["IMG_9001.JPG"]
        view.keyword_edit.clear()
        # The order and the cut-off run the search again by themselves (issue 20 item 5).
        with qtbot.waitSignal(view.results_shown, timeout=20000):
            view.sort_box.setCurrentIndex(view.sort_box.findData("date-old"))
        with qtbot.waitSignal(view.results_shown, timeout=20000):
            view.cutoff_spin.setValue(0.05)
        assert view.cutoff_label.isVisible()
        assert_unchanged(tree, before, "searching")

        dups = window.open_duplicates()
        dups.similar_check.setChecked(True)
        settle(qtbot, dups.start())
        qtbot.waitUntil(lambda: dups.report is not None, timeout=20000)
        settle(qtbot, dups.export_to(str(tmp_path / "exported" / "duplicates.json")))
        assert (tmp_path / "exported" / "duplicates.json").is_file()
        dups.close()
        assert_unchanged(tree, before, "the duplicates dialog")

        settle(qtbot, view.run_text_query(QUERY))
        view.grid.setCurrentIndex(view.model.index(0))
        view.open_current()
        insp = window.inspector_view
        settle(qtbot, insp.image_job)
        settle(qtbot, insp.metadata_job)
        if insp.ground_job is not None:
            settle(qtbot, insp.ground_job, timeout_ms=60000)
        assert not insp.canvas.image().isNull()
        if insp.export_button.isEnabled():
            assert insp.export_overlay(str(tmp_path / "exported" / "overlay"))
        assert_unchanged(tree, before, "the inspector")

        review = window.review_view
        window.tabs.setCurrentWidget(review)
        settle(qtbot, review.open_file(str(f["captions"])))
        qtbot.waitUntil(lambda: review.item is not None, timeout=10000)
        review.setFocus()
        qtbot.keyClick(review, Qt.Key.Key_1)
        settle(qtbot, review.last_job)
        qtbot.waitUntil(lambda: review.hub.serial.activeThreadCount() == 0, timeout=10000)
        settle(qtbot, review.export(str(tmp_path / "exported" / "verdicts.csv")))
        assert (tmp_path / "exported" / "verdicts.csv").is_file()
        assert_unchanged(tree, before, "review")

        lib = window.library_view
        settle(qtbot, lib.refresh())
        lib.list.setCurrentRow(0)
        with qtbot.waitSignal(window.queue.finished, timeout=30000):
            lib.rescan_selected()
        settle(qtbot, lib.refresh())
        lib.list.setCurrentRow(0)
        lib.remove_selected()
        qtbot.waitUntil(lambda: lib.infos == [], timeout=10000)
        assert errors == []
        assert_unchanged(tree, before, "re-scan and remove")
    finally:
        window.hub.wait_idle(10)
        set_read_only(tree, read_only=False)
