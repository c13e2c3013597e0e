"""Export a review to XMP sidecars (the engine's export, as `longlens xmp export` runs it).

The only place the app writes into photo folders, so it is never a side effect: the user picks
the sidecar convention (and any keywords to add; whether the accepted caption becomes the
description and a title the title, in which language, and whether a different text already there
is replaced: the same settings as the CLI's flags, checked and worded by the engine), sees the
dry run's list of every sidecar that
would be created, updated or refused, and only then writes, as a job with progress and Cancel.
Each sidecar is merged into (another tool's fields kept), written atomically, and the previous
one backed up in Longlens' data folder; the pictures themselves are never opened for writing.
A read-only library is refused by the engine before anything is written, in its own words.
"""

from __future__ import annotations

import os
from typing import Any

from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from desktop_app import theme
from desktop_app.background import Job, WorkerHub
from desktop_app.facade import Backend, display_text

# How each convention names a picture's sidecar, in the words of the tools that use it (the
# engine's CONVENTION_HELP says in full who reads which, shown under the choice).
CONVENTION_LABELS = {
    "lightroom": "IMG_0001.xmp: Lightroom, Camera Raw (RAW files only)",
    "darktable": "IMG_0001.CR2.xmp: darktable, digiKam (any picture)",
}
# The settings a preview was made with: convention, keywords, and the text options (as the
# engine's XmpTextOptions fields).
Settings = tuple[str, tuple[str, ...], tuple[tuple[str, Any], ...]]
# What the list says for each engine action, before (dry run) and after writing.
ACTION_WORDS = {
    True: {"create": "would create", "update": "would update", "unchanged": "unchanged", "refused": "REFUSED",
           "skipped": "SKIPPED"},
    False: {"create": "created", "update": "updated", "unchanged": "unchanged", "refused": "REFUSED",
            "skipped": "SKIPPED, not written"},
}


def split_keywords(text: str) -> list[str]:
    """The keywords field: comma-separated, each a keyword or a path ('Places|Norway')."""
    return [k.strip() for k in text.split(",") if k.strip()]


class XmpExportDialog(QDialog):
    """Pick the convention, preview (dry run), then write. `preview()` and `write()` return the job."""

    def __init__(self, backend: Backend, hub: WorkerHub, caption_file: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("xmp-export-dialog")
        self.setWindowTitle("Export to XMP sidecars")
        self.backend = backend
        self.hub = hub
        self.caption_file = caption_file
        self.job: Job | None = None
        self.summary: Any = None  # the last run's engine summary (dry run or export)
        self.previewed: Settings | None = None  # the settings the shown dry run used

        intro = QLabel(
            f"Write the verdicts and notes of <b>{display_text(os.path.basename(caption_file))}</b>, the "
            "keywords below and, if you tick them, the captions you marked faithful as descriptions and titles, "
            "into the pictures' XMP sidecars. An existing sidecar is merged into: every field "
            "another tool wrote is kept, and the previous file is backed up in Longlens' data folder first. "
            "The pictures themselves are never changed.")
        intro.setWordWrap(True)
        self.convention_box = QComboBox()
        self.convention_box.setObjectName("xmp-convention")
        for name in backend.xmp_conventions():
            self.convention_box.addItem(CONVENTION_LABELS.get(name, name), name)
        self.convention_box.setToolTip("How your photo tool names sidecars: pick the one it reads")
        self.convention_help = QLabel()
        self.convention_help.setObjectName("xmp-convention-help")
        self.convention_help.setWordWrap(True)
        self._help = backend.xmp_convention_help()
        self.keywords_edit = QLineEdit()
        self.keywords_edit.setObjectName("xmp-keywords")
        self.keywords_edit.setPlaceholderText("optional, e.g. Reviewed, Places|Norway")
        self.keywords_edit.setToolTip("Keywords to add to every exported picture, separated by commas; "
                                      "a path like Places|Norway is written as a hierarchy (lr:hierarchicalSubject)")
        self.description_box = QCheckBox("Write the caption (dc:description)")
        self.description_box.setObjectName("xmp-description")
        self.description_box.setToolTip("Only captions you marked faithful are written; every photo tool shows "
                                        "the description")
        self.replace_description_box = QCheckBox("Replace a different one already there")
        self.replace_description_box.setObjectName("xmp-replace-description")
        self.replace_description_box.setToolTip("Unticked, a description another tool or you wrote is kept")
        self.title_box = QCheckBox("Write a title (dc:title)")
        self.title_box.setToolTip("The caption file's own title for the picture, else the caption's first sentence")
        self.title_box.setObjectName("xmp-title")
        self.replace_title_box = QCheckBox("Replace a different one already there")
        self.replace_title_box.setObjectName("xmp-replace-title")
        self.language_edit = QLineEdit("x-default")
        self.language_edit.setObjectName("xmp-language")
        self.language_edit.setToolTip("The language entry the description and title go into: x-default (the one "
                                      "every tool shows), or a tag such as en, de, nb-NO")
        for box in (self.description_box, self.replace_description_box, self.title_box, self.replace_title_box):
            box.toggled.connect(self._settings_changed)
        self.convention_box.currentIndexChanged.connect(self._settings_changed)
        self.keywords_edit.textChanged.connect(self._settings_changed)
        self.language_edit.textChanged.connect(self._settings_changed)
        form = QFormLayout()
        form.addRow("Sidecar names", self.convention_box)
        form.addRow("", self.convention_help)
        form.addRow("Add keywords", self.keywords_edit)
        for label, write, replace in (("Description", self.description_box, self.replace_description_box),
                                      ("Title", self.title_box, self.replace_title_box)):
            row = QHBoxLayout()
            row.addWidget(write)
            row.addWidget(replace)
            row.addStretch(1)
            form.addRow(label, row)
        self.language_edit.setMaximumWidth(140)
        language_row = QHBoxLayout()
        language_row.addWidget(self.language_edit)
        language_row.addWidget(QLabel("x-default is the entry every tool shows; or en, de, nb-NO…"))
        language_row.addStretch(1)
        form.addRow("Language", language_row)
        self._enable_texts()

        self.status = QLabel("Preview first: nothing is written until you have seen the list.")
        self.status.setObjectName("xmp-status")
        self.status.setWordWrap(True)
        self.list = QPlainTextEdit()
        self.list.setObjectName("xmp-changes")
        self.list.setReadOnly(True)
        self.list.setPlaceholderText("The sidecars that would change are listed here.")
        self.progress = QProgressBar()
        self.progress.setVisible(False)

        self.preview_button = QPushButton("Preview changes")
        self.preview_button.setDefault(True)
        self.preview_button.clicked.connect(self.preview)
        self.write_button = QPushButton("Write sidecars")
        self.write_button.setEnabled(False)
        self.write_button.clicked.connect(self.write)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setEnabled(False)
        self.cancel_button.clicked.connect(self.cancel)
        close = QPushButton("Close")
        close.clicked.connect(self.close)
        buttons = QHBoxLayout()
        buttons.addWidget(self.preview_button)
        buttons.addWidget(self.write_button)
        buttons.addWidget(self.cancel_button)
        buttons.addWidget(self.progress, 1)
        buttons.addWidget(close)

        lay = QVBoxLayout(self)
        lay.addWidget(intro)
        lay.addLayout(form)
        lay.addWidget(self.status)
        lay.addWidget(self.list, 1)
        lay.addLayout(buttons)
        self.resize(820, 600)

    # -- the settings -----------------------------------------------------------------------------
    def texts(self) -> dict[str, Any]:
        """The description and title settings, as engine.xmp_export.XmpTextOptions takes them."""
        return {"description": self.description_box.isChecked(), "title": self.title_box.isChecked(),
                "language": self.language_edit.text().strip() or "x-default",
                "replace_description": self.description_box.isChecked() and self.replace_description_box.isChecked(),
                "replace_title": self.title_box.isChecked() and self.replace_title_box.isChecked()}

    def settings(self) -> Settings:
        return (str(self.convention_box.currentData()), tuple(split_keywords(self.keywords_edit.text())),
                tuple(sorted(self.texts().items())))

    def set_convention(self, name: str) -> None:
        self.convention_box.setCurrentIndex(self.convention_box.findData(name))

    def _enable_texts(self, enabled: bool = True) -> None:
        self.convention_help.setText(self._help.get(str(self.convention_box.currentData()), ""))
        for w in (self.description_box, self.title_box, self.language_edit):
            w.setEnabled(enabled)
        self.replace_description_box.setEnabled(enabled and self.description_box.isChecked())
        self.replace_title_box.setEnabled(enabled and self.title_box.isChecked())

    def _settings_changed(self, *_args: Any) -> None:
        self._enable_texts(self.preview_button.isEnabled() if hasattr(self, "preview_button") else True)
        # The list shown no longer says what a write would do: preview again first.
        if self.previewed is not None and self.previewed != self.settings():
            self.previewed = None
            self.write_button.setEnabled(False)
            self.status.setText("The settings changed: preview again before writing.")
            self.status.setStyleSheet("")

    # -- the jobs ---------------------------------------------------------------------------------
    def preview(self) -> Job:
        """The dry run: what would be written, nothing written."""
        return self._start(dry_run=True)

    def write(self) -> Job | None:
        """Write the sidecars the preview listed (the engine plans again: the folders are read anew)."""
        if self.previewed is None or self.previewed != self.settings():
            return None
        return self._start(dry_run=False)

    def _start(self, *, dry_run: bool) -> Job:
        settings = self.settings()
        convention, keywords, _texts = settings
        make = self.backend.xmp_export_job(self.caption_file, convention, list(keywords), dry_run=dry_run,
                                           texts=self.texts())
        for w in (self.preview_button, self.write_button, self.convention_box, self.keywords_edit):
            w.setEnabled(False)
        self._enable_texts(False)
        self.cancel_button.setEnabled(True)
        self.progress.setRange(0, 0)
        self.progress.setVisible(True)
        self.status.setStyleSheet("")
        self.status.setText("Working out what would change…" if dry_run else "Writing the sidecars…")
        self.job = self.hub.start_job(
            make, "xmp-export",
            on_progress=self._progress,
            on_result=lambda last, d=dry_run, s=settings: self._done(last, d, s),
            on_error=self._failed,
            on_cancelled=lambda: self.status.setText("Cancelled before it started; nothing was written."),
            on_finished=self._finished)
        return self.job

    def cancel(self) -> None:
        if self.job is not None and self.job.running:
            self.job.cancel()

    def _progress(self, p: Any) -> None:
        if p.total:
            self.progress.setRange(0, int(p.total))
            self.progress.setValue(int(p.done))

    def _finished(self) -> None:
        self.progress.setVisible(False)
        self.cancel_button.setEnabled(False)
        self.preview_button.setEnabled(True)
        self.convention_box.setEnabled(True)
        self.keywords_edit.setEnabled(True)
        self._enable_texts(True)
        self.write_button.setEnabled(self.previewed is not None and self._writable(self.summary))

    def _failed(self, message: str) -> None:
        # The engine's refusal (a read-only library, nothing reviewed yet), shown where the list was.
        self.summary = None
        self.previewed = None
        self.list.setPlainText("")
        self.status.setText(message)
        self.status.setStyleSheet(f"color: {theme.warning_colour()};")

    @staticmethod
    def _writable(summary: Any) -> bool:
        return summary is not None and summary.dry_run and any(r.action in ("create", "update")
                                                               for r in summary.results)

    def _done(self, last: Any, dry_run: bool, settings: Settings) -> None:
        summary = last.extra.get("summary") if last is not None else None
        if summary is None:
            return
        self.summary = summary
        plan = last.extra.get("plan")
        self.list.setPlainText(self.listing(summary))
        counts = summary.counts()
        words = ACTION_WORDS[dry_run]
        counted = ", ".join(f"{words[a]} {counts[a]}" for a in ("create", "update", "unchanged", "refused", "skipped")
                            if counts.get(a))
        skipped = getattr(plan, "items_without_review", 0)
        tail = f"; {skipped} item(s) without a verdict or note are left out" if skipped else ""
        for name, line in self.backend.xmp_field_summary(summary):
            hint = {"dc:description": " (tick Replace to write over a kept description)",
                    "dc:title": " (tick Replace to write over a kept title)"}
            tail += f"; {line}" + (hint.get(name, "") if "kept: differs" in line else "")
        if dry_run:
            self.previewed = settings
            if self._writable(summary):
                text = f"Dry run, nothing written yet: {counted}{tail}. Write sidecars to do it."
            else:
                text = f"Dry run: nothing to write ({counted}){tail}."
        else:
            self.previewed = None
            cancelled = summary.cancelled or (self.job is not None and self.job.token.cancelled)
            text = (("Cancelled; the sidecars written so far are whole and backed up: " if cancelled else "Done: ")
                    + counted + tail + ".")
            if summary.backup_folder:
                text += f" Previous sidecars backed up in {display_text(summary.backup_folder)}."
        self.status.setText(text)
        refused = counts.get("refused") or counts.get("skipped")
        self.status.setStyleSheet(f"color: {theme.warning_colour()};" if refused else "")

    @staticmethod
    def listing(summary: Any) -> str:
        """One line per sidecar (what happens to it, for which picture), its changes and reasons,
        worded as `longlens xmp export` prints them."""
        words = ACTION_WORDS[summary.dry_run]
        lines = []
        for r in summary.results:
            lines.append(f"{words[r.action]}  {display_text(r.sidecar)}  (for {display_text(os.path.basename(r.picture))})")
            lines += [f"    {c}" for c in r.changes]
            if r.reason:
                lines.append(f"    {r.reason}")
            if r.backup:
                lines.append(f"    previous sidecar backed up to {display_text(r.backup)}")
        return "\n".join(lines)

    # -- closing ------------------------------------------------------------------------------------
    def done(self, result: int) -> None:  # closing stops a running job between sidecars
        self.cancel()
        super().done(result)

    def closeEvent(self, event) -> None:
        self.cancel()
        super().closeEvent(event)
