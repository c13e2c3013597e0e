"""The desktop app on a random-weight tiny Long-CLIP-B (offscreen): indexing real files, the token
counter showing the model's own 248-token limit, a paragraph past CLIP's 77 tokens read whole, and
the unread part of a longer one marked where Long-CLIP stops reading."""

from __future__ import annotations

import pytest

from tests.desktop_app.conftest import TINY_MODEL, WAIT_MS, index_folder, settle

SENTENCE = "A red ball lies on the grass to the left of a small wooden bench under a tall green tree. "


@pytest.fixture
def installed_tiny(paths, longclip_b_tiny_checkpoint) -> str:
    """This module's model: the tiny Long-CLIP-B, under the name the GUI fixtures use."""
    from engine.models.download import import_model

    import_model(longclip_b_tiny_checkpoint, TINY_MODEL, paths, backend="clip")
    return TINY_MODEL


def test_counter_and_search_use_longclips_248_tokens(qtbot, window, photos):
    index_folder(qtbot, window, photos)
    view = window.search_view
    qtbot.keyClicks(view.editor, "A red door")
    qtbot.waitUntil(lambda: view.token_label.text().endswith("/ 248 tokens"), timeout=WAIT_MS)

    paragraph = SENTENCE * 8  # about 170 tokens: past CLIP's 77, within Long-CLIP's 248
    view.editor.setPlainText(paragraph)
    qtbot.waitUntil(lambda: int(view.token_label.text().split("/")[0]) > 77, timeout=WAIT_MS)
    used = int(view.token_label.text().split("/")[0])
    assert 77 < used < 248 and not view.trunc_label.isVisible()
    job = view.run_text_query(paragraph)
    settle(qtbot, job)
    result = view.last_result
    assert not result.truncated and result.tokens_used == result.tokens_total == used
    assert view.model.rowCount() > 0

    view.editor.setPlainText(SENTENCE * 20)
    qtbot.waitUntil(lambda: view.trunc_label.isVisible(), timeout=WAIT_MS)
    assert view.token_label.text() == "248 / 248 tokens"
    cut = view.editor.truncation_offset()
    assert cut is not None and 0 < cut < len(SENTENCE * 20)
    job = view.run_text_query(SENTENCE * 20)
    settle(qtbot, job)
    assert view.last_result.truncated and view.last_result.tokens_used == 248


def test_models_dialog_imports_a_clip_folder(qtbot, window, longclip_b_tiny_checkpoint):
    dlg = window.open_models()
    settle(qtbot, dlg.last_job)
    dlg.folder.setText(str(longclip_b_tiny_checkpoint))
    dlg.name.setText("long-from-dialog")
    settle(qtbot, dlg.import_model())
    settle(qtbot, dlg.last_job)
    row = dlg.row_of("long-from-dialog")
    assert row >= 0 and dlg.models[row].installed
    from engine.models.registry import read_manifest

    assert read_manifest(window.backend.paths.models / "long-from-dialog")["backend"] == "clip"
    # Long-CLIP's registered entries pull the official .pt (pinned), converted once at pull.
    dlg.select("longclip-b")
    assert dlg.pull_button.isEnabled()
