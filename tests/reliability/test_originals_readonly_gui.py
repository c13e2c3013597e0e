"""Checklist 7 / issue point 3, GUI half: the desktop app's flows, headless (offscreen Qt), on a
read-only photo tree: add and index a folder, search by text and by image, thumbnails, the
inspector (picture, grounding, overlay export), find similar, review (open a caption file kept in
the tree, verdicts, export; the captions already in the catalogue; an XMP export, refused), re-scan,
show unreadable, remove. Afterwards the tree must be
byte-for-byte, mtime-for-mtime the same, with nothing created inside it."""

from __future__ import annotations

import pytest

pytest.importorskip("PySide6")


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
        # Not a key press: the window is not the active one after the dialogs above, so a key
        # would reach no widget (the review keys are tested in tests/desktop_app).
        review.set_verdict("faithful")
        settle(qtbot, review.last_job)
        assert window.backend.review_progress(review.session)[0] == 1
        settle(qtbot, review.export(str(tmp_path / "exported" / "verdicts.csv")))
        assert (tmp_path / "exported" / "verdicts.csv").is_file()
        assert_unchanged(tree, before, "review")

        # Review the captions already in the catalogue (the sidecars' descriptions), then try to
        # export the verdicts to XMP sidecars: refused on this read-only library, nothing written.
        first = review.session
        settle(qtbot, review.open_catalog_captions())
        qtbot.waitUntil(lambda: review.session is not first, timeout=10000)
        settle(qtbot, review.last_job)  # the first item of the catalogue's captions, shown
        assert review.item.caption != QUERY
        assert "The catalogue's captions" in review.file_label.text()
        assert len(review.session) >= 2
        for i in range(len(review.session)):  # (the keys are tested in tests/desktop_app; here the window is not active)
            settle(qtbot, review.go_to(i))
            review.set_verdict("faithful")
            settle(qtbot, review.last_job)
        assert window.backend.review_progress(review.session)[0] == len(review.session)
        settle(qtbot, review.xmp_export_dialog())
        xmp = review.xmp_dialog
        for convention in ("darktable", "lightroom"):
            xmp.set_convention(convention)
            settle(qtbot, xmp.preview())
            assert xmp.status.text().startswith("refused: the library is read-only, so no sidecar is written")
            assert str(f["photos"]) in xmp.status.text() and not xmp.write_button.isEnabled()
            assert xmp.write() is None
        xmp.close()
        assert_unchanged(tree, before, "reviewing the catalogue's captions and a refused XMP export")

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
