"""Issue 20 items 3 and 4 in the app, in a real (offscreen) window: Review opens the captions already
in the catalogue (the pictures' XMP descriptions, else titles: the same captions and messages as
`longlens check --from-catalog`), and "Export to XMP sidecars…" writes the verdicts into the
sidecars only after a dry run listed them, as a job, keeping the tools' fields and backing the old
files up; the pictures stay byte- and mtime-identical."""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest
from PySide6.QtCore import Qt

from desktop_app.dialogs import messages
from engine.cli import main as cli_main
from engine.metadata.xmp_write import LONGLENS_NS
from tests.desktop_app.conftest import WAIT_MS, index_folder, settle
from tests.e2e.test_xmp_cli import make_library
from tests.e2e.test_xmp_export_cli import DESCRIPTIONS


@pytest.fixture
def errors(monkeypatch) -> list[tuple[str, str]]:
    shown: list[tuple[str, str]] = []
    monkeypatch.setattr(messages, "show_error", lambda _parent, title, text, *a, **k: shown.append((title, text)))
    return shown


def _pictures(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in folder.iterdir() if not p.name.endswith(".xmp")}


def _open_catalogue(qtbot, review) -> None:
    settle(qtbot, review.open_catalog_captions())
    qtbot.waitUntil(lambda: review.session is not None and review.item is not None, timeout=WAIT_MS)
    settle(qtbot, review.last_job)


def _items(review) -> dict[str, str]:
    return {Path(review.backend.review_item(review.session, i).image_path).name:
            review.backend.review_item(review.session, i).caption for i in range(len(review.session))}


def _drain(qtbot, review) -> None:
    settle(qtbot, review.last_job)
    qtbot.waitUntil(lambda: review.hub.serial.activeThreadCount() == 0, timeout=WAIT_MS)


def test_review_opens_the_captions_already_in_the_catalogue(qtbot, window, tmp_path, errors, capsys):
    review = window.review_view
    window.tabs.setCurrentWidget(review)
    # An empty catalogue: the CLI's message, in a box, and no empty review opens.
    label_before = review.file_label.text()
    settle(qtbot, review.open_catalog_captions())
    assert review.session is None and not review.export_button.isEnabled()
    assert review.file_label.text() == label_before
    assert errors and errors[-1][0] == "No captions in the catalogue"
    assert cli_main(["check", "--from-catalog", "--out", str(tmp_path / "report.jsonl")]) == 2
    cli_error = capsys.readouterr().err
    assert errors[-1][1] in cli_error and "no indexed picture has an XMP description or title yet" in errors[-1][1]

    photos = tmp_path / "library"
    make_library(photos)
    before = _pictures(photos)
    index_folder(qtbot, window, photos)
    errors.clear()
    window.review_catalog_captions()  # File > Review the captions already in the catalogue
    qtbot.waitUntil(lambda: review.session is not None and review.item is not None, timeout=WAIT_MS)
    settle(qtbot, review.last_job)
    assert window.tabs.currentWidget() is review and errors == []
    # The pictures' descriptions (else titles), as `longlens check --from-catalog` checks them.
    assert _items(review) == {name: text for name, (text, _field) in DESCRIPTIONS.items()}
    assert "The catalogue's captions" in review.file_label.text() and "4 items" in review.file_label.text()
    assert "new review" in review.file_label.text()
    made = Path(review.session.caption_file)
    assert made.is_relative_to(window.backend.paths.data) and not made.is_relative_to(photos)
    lines = [json.loads(line) for line in made.read_text(encoding="utf-8").splitlines()]
    assert {Path(r["image"]).name: (r["caption"], r["caption_source"]) for r in lines} == DESCRIPTIONS

    review.setFocus()
    qtbot.keyClick(review, Qt.Key.Key_1)
    _drain(qtbot, review)
    # Opened again (after another re-index, say): the same file, resumed, the verdict kept.
    _open_catalogue(qtbot, review)
    assert "resumed where you stopped" in review.file_label.text()
    assert review.backend.review_item(review.session, 0).verdict.verdict == "faithful"
    assert _pictures(photos) == before and errors == []


def _only_insertions(old: str, new: str) -> bool:
    ops = difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes()
    return all(op[0] in ("equal", "insert") for op in ops)


def _verdicts(sidecar: Path) -> list[tuple[str | None, str | None]]:
    """(verdict, note) of each caption review Longlens wrote into the sidecar."""
    ll = f"{{{LONGLENS_NS}}}"
    root = ET.fromstring(sidecar.read_bytes())
    return [(li.findtext(f"{ll}Verdict"), li.findtext(f"{ll}Note")) for li in root.iter()
            if li.find(f"{ll}Caption") is not None]


def test_export_to_xmp_sidecars_lists_the_dry_run_then_writes_as_a_job(qtbot, window, tmp_path, errors):
    photos = tmp_path / "library"
    make_library(photos)
    pictures_before = _pictures(photos)
    sidecars_before = {p.name: p.read_bytes() for p in photos.glob("*.xmp")}
    index_folder(qtbot, window, photos)
    review = window.review_view
    window.tabs.setCurrentWidget(review)
    _open_catalogue(qtbot, review)
    names = [Path(review.backend.review_item(review.session, i).image_path).name for i in range(len(review.session))]
    review.setFocus()
    for i, name in enumerate(names):
        qtbot.waitUntil(lambda i=i: review.item is not None and review.item.index == i, timeout=WAIT_MS)
        qtbot.keyClick(review, Qt.Key.Key_2 if name == "lofoten.jpg" else Qt.Key.Key_1)
        if name == "lofoten.jpg":
            qtbot.keyClick(review, Qt.Key.Key_N)
            qtbot.keyClicks(review.rows[0].note, "the title is no caption")
            qtbot.keyClick(review.rows[0].note, Qt.Key.Key_Return)
        qtbot.keyClick(review, Qt.Key.Key_Space)
    _drain(qtbot, review)

    assert review.export_xmp_action.isEnabled()
    settle(qtbot, review.xmp_export_dialog())
    dlg = review.xmp_dialog
    assert dlg is not None and dlg.isVisible() and not dlg.write_button.isEnabled()
    assert dlg.write() is None  # nothing is written before a preview
    dlg.set_convention("darktable")
    dlg.keywords_edit.setText("Longlens|checked")
    settle(qtbot, dlg.preview())
    listed = dlg.list.toPlainText()
    assert "would update  " + str(photos / "IMG_2044.jpg.xmp") + "  (for IMG_2044.jpg)" in listed
    assert "would update  " + str(photos / "P1030412.JPG.xmp") in listed
    assert "would create  " + str(photos / "lofoten.jpg.xmp") in listed
    # DSC_4127.jpg's metadata is in Lightroom's DSC_4127.xmp: the engine refuses to hide it, as in the CLI.
    assert "REFUSED  " + str(photos / "DSC_4127.jpg.xmp") in listed and "would hide it" in listed
    assert "dc:subject: add 'Longlens', 'checked'" in listed
    assert dlg.status.text().startswith("Dry run, nothing written yet: would create 1, would update 2, REFUSED 1")
    assert {p.name: p.read_bytes() for p in photos.glob("*.xmp")} == sidecars_before
    assert not (window.backend.paths.data / "xmp-backups").exists()
    assert dlg.write_button.isEnabled()

    # Changing a setting after the preview: preview again before anything can be written.
    dlg.set_convention("lightroom")
    assert not dlg.write_button.isEnabled() and dlg.write() is None
    dlg.set_convention("darktable")
    settle(qtbot, dlg.preview())
    job = dlg.write()
    settle(qtbot, job)
    assert not job.was_cancelled and job.error is None
    assert dlg.status.text().startswith("Done: created 1, updated 2, REFUSED 1.")
    assert "Previous sidecars backed up in" in dlg.status.text()
    assert not dlg.write_button.isEnabled()  # written: a second write needs a new preview

    assert _verdicts(photos / "IMG_2044.jpg.xmp") == [("faithful", None)]
    assert _verdicts(photos / "P1030412.JPG.xmp") == [("faithful", None)]
    assert _verdicts(photos / "lofoten.jpg.xmp") == [("unfaithful", "the title is no caption")]
    assert not (photos / "DSC_4127.jpg.xmp").exists()
    assert (photos / "DSC_4127.xmp").read_bytes() == sidecars_before["DSC_4127.xmp"]
    for name in ("IMG_2044.jpg.xmp", "P1030412.JPG.xmp"):  # darktable's and digiKam's fields all kept
        new = (photos / name).read_text(encoding="utf-8")
        assert _only_insertions(sidecars_before[name].decode("utf-8"), new)
        assert "<rdf:li>Longlens|checked</rdf:li>" in new
        backup = next(r.backup for r in dlg.summary.results if Path(r.sidecar).name == name)
        assert Path(backup).read_bytes() == sidecars_before[name]
        assert Path(backup).is_relative_to(window.backend.paths.data)
    assert _pictures(photos) == pictures_before  # no picture touched, bytes or mtime

    # Issue 28: who reads which convention, said under the choice in the engine's words.
    help_text = window.backend.xmp_convention_help()
    assert dlg.convention_help.text() == help_text["darktable"]
    dlg.set_convention("lightroom")
    assert "For JPEG, TIFF, PSD, PNG, HEIC and DNG, Lightroom reads the XMP inside the file" in dlg.convention_help.text()
    dlg.set_convention("darktable")
    # The description and title settings are the CLI's; Replace only once the text is written.
    assert not dlg.replace_description_box.isEnabled() and not dlg.replace_title_box.isEnabled()
    dlg.description_box.setChecked(True)
    assert dlg.replace_description_box.isEnabled() and not dlg.replace_title_box.isEnabled()
    dlg.language_edit.setText("en_GB")
    settle(qtbot, dlg.preview())
    assert "'en_GB' is not a language tag" in dlg.status.text() and not dlg.write_button.isEnabled()
    dlg.language_edit.setText("x-default")
    settle(qtbot, dlg.preview())
    listed = dlg.list.toPlainText()
    # The review's captions are the catalogue's own descriptions: already there; lofoten's was judged unfaithful.
    assert "dc:description [x-default]: unchanged" in listed
    assert "dc:description [x-default]: not written: the caption is not marked faithful" in listed
    assert "dc:description: unchanged 2, not written: the caption is not marked faithful 1" in dlg.status.text()
    assert dlg.texts() == {"description": True, "title": False, "language": "x-default",
                           "replace_description": False, "replace_title": False}
    assert errors == []
    dlg.close()
