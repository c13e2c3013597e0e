"""Issue 20 items 2 and 4 in a real (offscreen) window: the keyword, rating and label filters of the
search view, with the engine's messages; the inspector shows what a picture's XMP says."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from tests.desktop_app.conftest import WAIT_MS, index_folder, settle
from tests.e2e.test_xmp_cli import QUERY, make_library


@pytest.fixture
def indexed(qtbot, window, tmp_path):
    library = tmp_path / "library"
    make_library(library)
    index_folder(qtbot, window, library)
    return window


def search_names(qtbot, view):
    settle(qtbot, view.run_text_query(QUERY))
    return {h.path.rsplit("/", 1)[-1] for h in view.last_result.hits}


def test_keyword_rating_and_label_filters_narrow_the_results(qtbot, indexed):
    view = indexed.search_view
    assert len(search_names(qtbot, view)) == 5
    qtbot.keyClicks(view.keyword_edit, "Places|Norway")
    assert search_names(qtbot, view) == {"DSC_4127.jpg", "IMG_2044.jpg", "P1030412.JPG", "lofoten.jpg"}
    view.rating_box.setCurrentIndex(view.rating_box.findData(4))
    assert view.rating_box.currentText() == "★★★★ or more"
    assert search_names(qtbot, view) == {"DSC_4127.jpg", "P1030412.JPG"}
    view.rating_box.setCurrentIndex(0)
    view.label_box.setCurrentText("yellow")  # typed in any case, like the CLI's --label
    assert search_names(qtbot, view) == {"IMG_2044.jpg"}
    view.label_box.setCurrentIndex(0)
    view.keyword_edit.clear()
    qtbot.keyClicks(view.keyword_edit, "Places|Norway|Oslo")
    with qtbot.waitSignal(view.results_shown, timeout=WAIT_MS):
        qtbot.keyClick(view.keyword_edit, Qt.Key.Key_Return)  # Enter in the field searches
    assert {h.path.rsplit("/", 1)[-1] for h in view.last_result.hits} == {"DSC_4127.jpg"}


def test_a_bad_keyword_gets_the_engines_message(qtbot, indexed):
    view = indexed.search_view
    view.keyword_edit.setText(" | ")
    job = view.run_text_query(QUERY)
    settle(qtbot, job)
    # Worded as the CLI words it, without the flag: the engine's FilterError.
    assert view.status.text().startswith("the 'keyword' filter '|' has no keyword in it")


def test_the_inspector_shows_the_pictures_keywords_rating_and_title(qtbot, indexed):
    view = indexed.search_view
    qtbot.keyClicks(view.keyword_edit, "Transport|ferry")
    search_names(qtbot, view)
    view.grid.setCurrentIndex(view.model.index(0))
    view.open_current()
    insp = indexed.inspector_view
    settle(qtbot, insp.metadata_job)
    assert indexed.tabs.currentWidget() is insp
    assert insp.metadata_box.isVisible()
    assert insp.keywords_label.text() == "Keywords: Places › Norway › Oslo, Transport › ferry"
    assert insp.metadata_label.text() == "<b>Morning ferry, Oslofjord</b> · ★★★★☆ · Green label"
    lines = insp.metadata_details.text().split("\n")
    assert [line for line in lines if not line.startswith("Camera: ")] == [
        "A white ferry crosses the fjord in front of the Opera house under a pale morning sky.",
        "dated 2023-06-14 10:22:31 (XMP date)", "GPS: 59.906890, 10.752013"]
    # The camera and lens, once the reader reads them from the sidecar (tiff:Make/Model, aux:Lens).
    assert all(line == "Camera: NIKON Z 6_2 · Lens: NIKKOR Z 35mm f/1.8 S" for line in lines
               if line.startswith("Camera: "))
    assert not insp.metadata_problems.isVisible()
    assert insp.metadata_box.toolTip() == "From the photo's metadata (XMP, IPTC, EXIF), read from: DSC_4127.xmp"
    # A picture without any XMP: the section is hidden, not left showing the previous picture's.
    view.keyword_edit.clear()
    hits = {h.path.rsplit("/", 1)[-1]: h for h in (search_names(qtbot, view) and view.last_result.hits)}
    insp.show_hit(hits["plain.jpg"], {"text": QUERY, "image": None})
    settle(qtbot, insp.metadata_job)
    assert not insp.metadata_box.isVisible()
    # By path (the inspector opened from elsewhere than a search result): the same catalog row.
    by_path = indexed.backend.photo_metadata(hits["IMG_2044.jpg"].path)
    assert by_path["keyword_text"] == ["Places › Norway › Bergen", "harbour"] and by_path["label"] == "Yellow"
    assert indexed.backend.photo_metadata("/nowhere/IMG_2044.jpg") is None
    for job in (insp.image_job, insp.ground_job):
        if job is not None:
            settle(qtbot, job)
