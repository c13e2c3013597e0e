"""The Inspector on a random-weight tiny Long-CLIP-B (offscreen), with the real CLIP grounder: the
query's phrases with their supports and value-path maps on the 4 x 4 patch grid, and the supports
said to be uncalibrated until a calibration is fitted in this home (the facade's calibration job,
the one the engine gives the CLI too); afterwards the same picture's grounding is calibrated."""

from __future__ import annotations

import pytest

from desktop_app.views.inspector_view import UNCALIBRATED
from tests.desktop_app.conftest import TINY_MODEL, index_folder, settle

QUERY = "A red ball and a small wooden bench. Two white clouds and the blue sky."


@pytest.fixture
def installed_tiny(paths, longclip_b_tiny_checkpoint) -> str:
    from engine.models.download import import_model

    import_model(longclip_b_tiny_checkpoint, TINY_MODEL, paths, backend="clip")
    return TINY_MODEL


def _open_first(qtbot, window):
    view = window.search_view
    view.grid.setCurrentIndex(view.model.index(0))
    view.open_current()
    insp = window.inspector_view
    settle(qtbot, insp.image_job)
    assert insp.ground_job is not None
    settle(qtbot, insp.ground_job)
    return insp


def test_inspector_shows_clip_maps_and_says_uncalibrated_until_fitted(qtbot, window, photos, hub):
    index_folder(qtbot, window, photos)
    settle(qtbot, window.search_view.run_text_query(QUERY))
    insp = _open_first(qtbot, window)
    g = insp.grounding
    assert g is not None and g.method == "value-path" and not g.calibrated
    # No relation level in this query ("the blue sky" is a setting: a background map).
    assert [pm.phrase.kind for pm in g.phrases] == ["noun_phrase"] * 3 + ["setting"]
    texts = [insp.phrases.item(i).text() for i in range(insp.phrases.count())]
    assert texts == [pm.phrase.text for pm in g.phrases] and "a small wooden bench" in texts
    assert all(pm.heatmap.shape == (4, 4) for pm in g.phrases)
    assert insp.canvas.has_overlay() and insp.phrases.isEnabled()
    note = insp.calibration_note
    assert not note.isHidden() and note.text() == "value-path · uncalibrated supports\n" + UNCALIBRATED
    assert "uncalibrated" in insp.phrases.item(0).toolTip()
    insp.set_mode("all")
    overlay = insp.canvas.overlay()
    assert (overlay.width(), overlay.height()) == (4, 4)

    results, errors = [], []
    job = hub.start_job(window.backend.calibration_job(scenes=3), "calibrate",
                        on_result=results.append, on_error=errors.append)
    settle(qtbot, job)
    assert errors == [] and results[-1].stage == "done"
    summary = results[-1].extra
    from engine.grounding.calibration import load_all, user_calibration_file

    assert summary["file"] == str(user_calibration_file(window.backend.paths))
    assert {"phrase", "sentence"} <= set(summary["fitted"])
    assert summary["key"] in load_all(user_calibration_file(window.backend.paths))["models"]

    insp = _open_first(qtbot, window)
    g = insp.grounding
    assert g.calibrated and insp.calibration_note.text() == "value-path · calibrated supports"
    assert "uncalibrated" not in insp.phrases.item(0).toolTip()
