"""Issue 28, "show it right", in a real (offscreen) window: the search view's place filter (near a
position, within km) keeps the pictures the CLI's --near/--km keep and shows the engine's message
for a bad value; the inspector lists the pick label, camera and lens, every language's title and
description, the date as known, and every field read with where it came from."""

from __future__ import annotations

from PySide6.QtCore import Qt

from engine.types import MetadataField, PhotoMetadata
from tests.desktop_app import test_xmp_gui
from tests.desktop_app.conftest import settle
from tests.desktop_app.test_xmp_gui import search_names
from tests.e2e.test_xmp_cli import QUERY

indexed = test_xmp_gui.indexed  # the same fixture: the e2e library indexed in the window


def test_the_place_filter_keeps_the_pictures_near_a_position(qtbot, indexed):
    view = indexed.search_view
    view.near_edit.setText("59.9075, 10.7531")  # the Oslo Opera house; DSC_4127's sidecar is 91 m away
    view.km_edit.setText("1")
    assert search_names(qtbot, view) == {"DSC_4127.jpg"}
    assert "place filter: 4 pictures with no GPS position left out" in " ".join(view.last_result.notes)
    view.km_edit.setText("0.05")
    assert search_names(qtbot, view) == set()
    view.km_edit.setText("0")
    settle(qtbot, view.run_text_query(QUERY))
    # The engine's words, as the CLI prints them (without the flag).
    assert view.status.text().startswith("the 'km' radius must be greater than 0, got 0")
    view.km_edit.clear()
    settle(qtbot, view.run_text_query(QUERY))
    assert view.status.text().startswith("the 'near' position needs a radius: give 'km'")
    view.near_edit.clear()
    assert len(search_names(qtbot, view)) == 5


def test_the_inspector_lists_every_field_and_where_it_came_from(qtbot, indexed):
    view = indexed.search_view
    search_names(qtbot, view)
    hits = {h.path.rsplit("/", 1)[-1]: h for h in view.last_result.hits}
    plain = hits["plain.jpg"]
    indexed.backend.services.catalog.write_metadata([(plain.image_id, PhotoMetadata(
        title="Ferja", description="A ferry", titles=(("x-default", "Ferja"), ("de-DE", "Fähre")),
        descriptions=(("x-default", "A ferry"), ("nb-NO", "Ei ferje")), taken_at="2023-06", taken_from="iptc",
        camera_make="NIKON CORPORATION", camera_model="NIKON D750", lens="AF-S NIKKOR 24-70mm f/2.8G ED",
        pick="rejected", label="Purple", hierarchy=("Places|Norway", "Places|Norway|Oslo"),
        subjects=("Norway", "Oslo", "ferry"),
        fields=(MetadataField("Iptc.Application2.DateCreated", "2023-06", "plain.jpg (IPTC)"),
                MetadataField("Xmp.exif.DateTimeOriginal", "2026-01-02T03:04:05", "plain.jpg.xmp", used=False,
                              note="darktable's copy of the file time")),
        sources=("plain.jpg.xmp",), state="s"))])
    insp = indexed.inspector_view
    insp.show_hit(plain, {"text": QUERY, "image": None})
    settle(qtbot, insp.metadata_job)
    assert insp.metadata_label.text() == "<b>Ferja</b> · Purple label · Rejected (pick label)"
    assert insp.keywords_label.text() == "Keywords: Places › Norway › Oslo, ferry"  # each once
    assert insp.metadata_details.text() == ("A ferry\nTitle (de-DE): Fähre\nDescription (nb-NO): Ei ferje\n"
                                            "dated 2023-06 (IPTC date)\n"
                                            "Camera: NIKON D750 · Lens: AF-S NIKKOR 24-70mm f/2.8G ED")
    assert insp.metadata_fields.text() == (
        "Fields read (name = value — where):\n"
        "Iptc.Application2.DateCreated = 2023-06 — plain.jpg (IPTC)\n"
        "Xmp.exif.DateTimeOriginal = 2026-01-02T03:04:05 — plain.jpg.xmp (not used: darktable's copy of the file time)")
    assert not insp.metadata_fields.isHidden()
    # The camera known only from the metadata: the hit names it as the inspector does, and the
    # camera filter finds it.
    view.camera_edit.setText("nikon d750")
    assert search_names(qtbot, view) == {"plain.jpg"}
    assert view.last_result.hits[0].camera == "NIKON D750"
    assert "NIKON D750" in view.model.data(view.model.index(0), Qt.ItemDataRole.ToolTipRole)
    assert "taken 2023-06 (IPTC date)" in view.model.data(view.model.index(0), Qt.ItemDataRole.ToolTipRole)
    for job in (insp.image_job, insp.ground_job):
        if job is not None:
            settle(qtbot, job)
