"""Exporting review results to XMP sidecars, only when the user asks (`longlens xmp export`).

What is written, per picture of a reviewed caption file that has a verdict or a note: its
review (engine.metadata.xmp_write: `longlens:Reviews` in the Longlens namespace), the keywords
the user chose (every scheme the sidecar uses: lr:hierarchicalSubject, each level in dc:subject
as Lightroom writes them, digiKam:TagsList), and when asked (XmpTextOptions) the accepted
caption as dc:description and a title as dc:title, in the language entry asked for; a
different text already there is kept unless replacing is asked for. Where:

  lightroom  IMG_0001.xmp beside a proprietary RAW file (LIGHTROOM_SIDECAR_EXTENSIONS), marked
             with photoshop:SidecarForExtension when Longlens creates it, as Lightroom does. For
             JPEG, TIFF, PSD, PNG, HEIC and DNG Lightroom reads only the XMP inside the file, so
             none is created (lightroom_reads_no_sidecar says why and what to do); the stem
             sidecar of the pair's RAW file, and one that already holds the picture's metadata,
             are still merged into;
  darktable  IMG_0001.CR2.xmp (its whole name), as darktable and digiKam name theirs (a new one
             gets digiKam:TagsList too: digiKam reads that list first and stops there).

An existing sidecar (any case of the name) is merged into at the text level, keeping every other
byte. Three phases: (1) read and merge every sidecar; (2) copy every one that will change into
the home's data/xmp-backups/<run>/ (fsynced, with a manifest naming where each copy came from)
before the first change, so a full disk stops the run with nothing changed; (3) swap each under
its folder's lock (engine.fileutil.folder_write_lock, which every Longlens writer takes),
compare-and-swap: a sidecar another program changed since phase 1 is merged again from its new
content and backed up again (the backup is always what is replaced), then replaced by
engine.fileutil.replace_user_file, which checks its identity once more right before the rename
and keeps mode, owner, group, extended attributes and ACLs (or writes a hard-linked sidecar in
place). Why backups in the home and not beside the picture: a `.xmp.bak` in the photo folder is
one more file the user's other tools list or import.

Only pictures inside an indexed library get a sidecar; with the darktable convention a picture of
a RAW+JPEG pair indexed once, without a whole-name sidecar of its own, is merged into its
partner's (IMG_0001.CR2.xmp), which the reader uses for it, instead of getting a new one that
would hide it. A cancelled run says what it skipped (action "skipped", summary.cancelled).

Never written: the picture itself (only a name ending in .xmp that is not the picture), a sidecar
that is a link, a read-only sidecar, a Lightroom sidecar that belongs to another file of the
same stem (photoshop:SidecarForExtension), a new whole-name sidecar where the picture's stem
sidecar holds its metadata (the reader would then ignore that one), and anything at all when a picture's folder is
read-only (a read-only file system, no write permission bits, or not writable by this user):
the export is then refused before any file is touched, naming the folders. A dry run reads and
merges exactly as the export would and lists what would change, writing nothing.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from engine.catalog import Catalog
from engine.errors import JobCancelled, LonglensError
from engine.fileutil import (
    FileChangedError,
    FileIdentity,
    FileTooLargeError,
    FolderLockTimeout,
    NotARegularFileError,
    atomic_write_bytes,
    folder_write_lock,
    read_user_file,
    read_with_identity,
    remove_stale_temp_files,
    replace_user_file,
)
from engine.jobs import CancelToken, Progress
from engine.limits import MAX_CAPTION_CHARS
from engine.metadata.xmp import MAX_XMP_BYTES, XmpError, normalise_keyword, parse_xmp
from engine.metadata.xmp_write import OUTCOMES, CaptionReview, SentenceReview, language_problem, merge_sidecar
from engine.review import ReviewItem, open_session, session_items, split_sentences
from engine.text.captions import CSV_SUFFIXES, read_captions

CONVENTIONS: tuple[str, ...] = ("lightroom", "darktable")
BACKUP_FOLDER = "xmp-backups"

# The files Lightroom Classic and Camera Raw read a stem-named sidecar (IMG_0001.xmp) for: the
# proprietary RAW formats, which they never write into. For JPEG, TIFF, PSD, PNG, HEIC and DNG they
# keep XMP inside the file and read only that (Metadata > Read Metadata from Files), so a sidecar
# named for them there is read by no Adobe tool.
LIGHTROOM_SIDECAR_EXTENSIONS: frozenset[str] = frozenset({
    ".3fr", ".ari", ".arw", ".bay", ".cr2", ".cr3", ".crw", ".dcr", ".dcs", ".erf", ".fff", ".iiq", ".k25",
    ".kdc", ".mef", ".mos", ".mrw", ".nef", ".nrw", ".orf", ".pef", ".raf", ".raw", ".rw2", ".rwl", ".sr2",
    ".srf", ".srw", ".x3f",
})
# Measured with darktable-cli 4.2.1: darktable reads a title or description as one text (exiv2's
# whole LangAlt, 'lang="x-default" A, lang="de" B') and writes that back as its x-default entry.
DARKTABLE_LANGUAGE_NOTE = ("darktable (4.2) reads only one language: on its next write of this sidecar it folds every "
                           "language entry into its x-default text; digiKam and exiftool read each language")
# What a description or title asked for became when the caption's review does not accept it.
NOT_FAITHFUL = "not written: the caption is not marked faithful"
# How each convention names a sidecar, and who reads it (the CLI's help and the app's dialog).
CONVENTION_HELP = {
    "lightroom": "Only RAW files (CR2, CR3, NEF, ARW, RAF, ORF, RW2, PEF, SRW…) get IMG_0001.xmp, which Lightroom "
                 "Classic and Camera Raw read. For JPEG, TIFF, PSD, PNG, HEIC and DNG, Lightroom reads the XMP inside "
                 "the file (Metadata > Read Metadata from Files), not a sidecar, and Longlens never writes into "
                 "pictures: those are left out, unless a sidecar of that name already holds their metadata. Use the "
                 "darktable and digiKam names for them.",
    "darktable": "Every picture gets IMG_0001.CR2.xmp (its whole name, extension included), which darktable and "
                 "digiKam read.",
}


def lightroom_reads_no_sidecar(picture: Path) -> str:
    """Why the Lightroom convention writes no sidecar for `picture` (not a proprietary RAW file),
    and what to do instead: the same words in the CLI and the app."""
    ext = picture.suffix.lstrip(".").upper() or "extension-less"
    return (f"Lightroom reads no sidecar for a {ext} file: it reads the XMP embedded in JPEG, TIFF, PSD, PNG, "
            f"HEIC and DNG files (Metadata > Read Metadata from Files), and {picture.stem}.xmp only for a "
            f"proprietary RAW file. Not written; export with the darktable convention instead to write "
            f"{picture.name}.xmp, which darktable and digiKam read")


@dataclass(frozen=True)
class XmpTextOptions:
    """Whether the caption goes into dc:description and a title into dc:title, in which language
    entry, and whether a different text already there is replaced (by default it is kept)."""

    description: bool = False
    title: bool = False
    language: str = "x-default"
    replace_description: bool = False
    replace_title: bool = False

    def problems(self) -> list[tuple[str, str]]:
        """(setting, message) for each bad combination; the CLI and the app show the same words."""
        out = []
        problem = language_problem(self.language)
        if problem is not None:
            out.append(("language", problem))
        elif self.language.casefold() != "x-default" and not (self.description or self.title):
            out.append(("language", "a language is the entry the description or title is written to: "
                                    "write the description or the title too"))
        if self.replace_description and not self.description:
            out.append(("replace_description", "replacing descriptions needs the description written too"))
        if self.replace_title and not self.title:
            out.append(("replace_title", "replacing titles needs the title written too"))
        return out


def title_of(caption: str, given: str | None = None) -> str:
    """The title written into dc:title: the caption file's own "title" for the item when it has
    one, else the caption's first sentence without its closing full stop (a title reads as a
    name, not a sentence)."""
    if given and given.strip():
        return " ".join(given.split())
    spans = split_sentences(caption)
    first = caption[spans[0][0]:spans[0][1]] if spans else caption
    first = " ".join(first.split())
    return first[:-1] if first.endswith(".") and not first.endswith("..") else first


class XmpExportError(LonglensError):
    """The export cannot be done at all (nothing was written)."""


@dataclass(frozen=True)
class SidecarTarget:
    picture: Path
    sidecar: Path
    reviews: tuple[CaptionReview, ...]
    sidecar_for: str | None  # the extension a new Lightroom sidecar is marked for
    # darktable convention: the picture's stem sidecar (IMG_0001.xmp), which a new whole-name
    # sidecar would hide from the reader (engine.metadata.photo: the whole name wins)
    stem_sidecar: Path | None = None
    note: str = ""  # said with the changes (e.g. which file of a RAW+JPEG pair the sidecar is of)
    description: str | None = None  # the caption for dc:description (None: not asked, or not faithful)
    title: str | None = None  # the title for dc:title
    text_notes: tuple[str, ...] = ()  # why a description or title asked for is not written
    tags_list: bool = False  # a new sidecar gets digiKam:TagsList (whole-name sidecars: digiKam reads them)


@dataclass
class SidecarChange:
    """What the export did (or, in a dry run, would do) to one sidecar."""

    picture: str
    sidecar: str
    action: str  # "create" | "update" | "unchanged" | "refused" | "skipped" (not done: cancelled, disk full)
    changes: list[str] = field(default_factory=list)
    reason: str = ""
    backup: str | None = None
    # "dc:description" / "dc:title" -> what became of the text asked for (engine.metadata.xmp_write
    # OUTCOMES: written, kept: differs, unchanged, ...; or NOT_FAITHFUL)
    fields: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"picture": self.picture, "sidecar": self.sidecar, "action": self.action, "changes": self.changes,
                "reason": self.reason, "backup": self.backup, "fields": self.fields}


@dataclass
class XmpExportPlan:
    caption_file: str
    convention: str
    keywords: tuple[str, ...]
    texts: XmpTextOptions = field(default_factory=XmpTextOptions)
    targets: list[SidecarTarget] = field(default_factory=list)
    refused: list[SidecarChange] = field(default_factory=list)
    items_without_review: int = 0


@dataclass
class XmpExportSummary:
    dry_run: bool
    results: list[SidecarChange]
    backup_folder: str | None = None
    cancelled: bool = False  # stopped part-way: the "skipped" ones were not written

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.results:
            out[r.action] = out.get(r.action, 0) + 1
        return out

    def field_counts(self) -> dict[str, dict[str, int]]:
        """"dc:description" -> {"written": 2, "kept: differs": 1, ...} over the sidecars written or
        (in a dry run) to be written; refused and skipped ones count for nothing."""
        out: dict[str, dict[str, int]] = {}
        for r in self.results:
            if r.action in ("refused", "skipped"):
                continue
            for name, outcome in r.fields.items():
                per = out.setdefault(name, {})
                per[outcome] = per.get(outcome, 0) + 1
        return out

    def as_dict(self) -> dict:
        return {"dry_run": self.dry_run, "cancelled": self.cancelled, "counts": self.counts(),
                "fields": self.field_counts(), "backup_folder": self.backup_folder,
                "sidecars": [r.as_dict() for r in self.results]}


def field_summary(summary: XmpExportSummary) -> list[tuple[str, str]]:
    """(field, line) per text field asked for, the line as "dc:description: written 2, kept:
    differs 1" in the order of OUTCOMES (the CLI prints them, the app shows them)."""
    order = [*OUTCOMES, NOT_FAITHFUL]
    lines = []
    for name, per in sorted(summary.field_counts().items()):
        ranked = sorted(per, key=lambda o: (order.index(o) if o in order else len(order), o))
        lines.append((name, f"{name}: " + ", ".join(f"{o} {per[o]}" for o in ranked)))
    return lines


# --------------------------------------------------------------------------- planning


def _review_of(item: ReviewItem) -> CaptionReview | None:
    sentences = tuple(
        SentenceReview(i, item.sentence_text(i), v.verdict, v.note)
        for i, v in sorted(item.sentence_verdicts.items()) if v.verdict or v.note
    )
    whole = item.verdict
    if sentences == () and (whole is None or not (whole.verdict or whole.note)):
        return None
    times = [v.updated_at for v in (whole, *item.sentence_verdicts.values()) if v is not None]
    return CaptionReview(item.caption, whole.verdict if whole else None, whole.note if whole else "",
                         max(times) if times else None, sentences)


def _existing_name(folder: Path, name: str, listing: dict[Path, dict[str, str]]) -> str:
    """`name` as it is spelt in the folder (IMG_0001.XMP for img_0001.xmp), else `name`."""
    if folder not in listing:
        try:
            listing[folder] = {n.casefold(): n for n in sorted(os.listdir(folder), reverse=True)}
        except OSError:
            listing[folder] = {}
    return listing[folder].get(name.casefold(), name)


def read_only_reason(folder: Path) -> str | None:
    """Why nothing may be written in `folder`, or None. No write permission bits count even for
    a user who could override them (root): the owner made the library read-only."""
    try:
        st = folder.stat()
    except OSError as exc:
        return f"cannot be reached ({exc.strerror or exc})"
    try:
        if os.statvfs(folder).f_flag & os.ST_RDONLY:
            return "is on a read-only file system"
    except (OSError, AttributeError):
        pass  # no statvfs (Windows): the permission checks below still apply
    if not stat.S_IMODE(st.st_mode) & 0o222:
        return f"is read-only (permissions {stat.filemode(st.st_mode)})"
    if not os.access(folder, os.W_OK):
        return "is not writable by this user"
    return None


def plan_xmp_export(catalog: Catalog, caption_file: Path | str, *, convention: str,
                    keywords: Sequence[str] = (), texts: XmpTextOptions | None = None) -> XmpExportPlan:
    """Which sidecars an export of this caption file's review would write. Raises XmpExportError
    for an unknown convention, bad text options, no reviewed item, or a read-only picture folder."""
    if convention not in CONVENTIONS:
        raise XmpExportError(f"unknown sidecar convention {convention!r}; use one of {', '.join(CONVENTIONS)}",
                             settings=("convention",))
    texts = texts or XmpTextOptions()
    problems = texts.problems()
    if problems:
        raise XmpExportError("; ".join(m for _, m in problems), settings=tuple(k for k, _ in problems))
    chosen = tuple(dict.fromkeys(k for k in (normalise_keyword(k) for k in keywords) if k))
    session = open_session(catalog, caption_file)
    plan = XmpExportPlan(session.caption_file, convention, chosen, texts)
    given_titles = _given_titles(Path(session.caption_file)) if texts.title else {}
    by_picture: dict[str, list[CaptionReview]] = {}
    accepted: dict[str, list[ReviewItem]] = {}  # the faithful captions of each picture, in file order
    for item in session_items(catalog, session):
        review = _review_of(item)
        if review is None:
            plan.items_without_review += 1
            continue
        by_picture.setdefault(item.image_path, []).append(review)
        if item.verdict is not None and item.verdict.verdict == "faithful":
            accepted.setdefault(item.image_path, []).append(item)
    if not by_picture:
        raise XmpExportError(f"{Path(session.caption_file).name}: no item has a verdict or a note yet; "
                             "nothing to export")
    listing: dict[Path, dict[str, str]] = {}
    taken: dict[Path, str] = {}
    read_only: dict[Path, str] = {}
    roots = [os.path.realpath(lib.root) for lib in catalog.libraries()]
    for picture_s, reviews in by_picture.items():
        picture = Path(picture_s)
        folder = picture.parent
        base = picture.stem if convention == "lightroom" else picture.name
        sidecar = folder / _existing_name(folder, base + ".xmp", listing)
        outside = _outside_libraries(picture, roots)
        if outside is not None:
            plan.refused.append(SidecarChange(str(picture), str(sidecar), "refused", reason=outside))
            continue
        reason = read_only_reason(folder)
        if reason is not None:  # the whole export is refused: said before any picture's own reason
            read_only[folder] = reason
            continue
        note = ""
        sidecar_for = picture.suffix.lstrip(".") if convention == "lightroom" else None
        if convention == "darktable" and not os.path.lexists(sidecar):
            pair = _pair_sidecar(catalog, picture, listing)
            if pair is not None:
                sidecar, partner = pair
                note = (f"{sidecar.name} is the sidecar of the pair's {partner}, which Longlens reads for "
                        f"{picture.name}: merged into it (a new {picture.name}.xmp would hide it)")
        elif convention == "lightroom" and picture.suffix.casefold() not in LIGHTROOM_SIDECAR_EXTENSIONS:
            raw = _raw_partner(catalog, picture, listing)
            if raw is not None:
                sidecar_for = raw.suffix.lstrip(".")
                note = (f"{sidecar.name} is the sidecar of the pair's {raw.name}, which Lightroom reads for it and "
                        f"Longlens for {picture.name}")
            elif os.path.lexists(sidecar):
                note = (f"{sidecar.name} already holds this picture's metadata (written by another tool), so it is "
                        f"merged into; Lightroom itself reads the XMP inside a {picture.suffix.lstrip('.').upper()} "
                        "file, not this sidecar")
            else:
                plan.refused.append(SidecarChange(str(picture), str(sidecar), "refused",
                                                  reason=lightroom_reads_no_sidecar(picture)))
                continue
        refused = _refusal(picture, sidecar, taken)
        if refused is not None:
            plan.refused.append(SidecarChange(str(picture), str(sidecar), "refused", reason=refused))
            continue
        taken[sidecar] = picture.name
        stem = folder / _existing_name(folder, picture.stem + ".xmp", listing)
        description, title, text_notes = _texts(texts, accepted.get(picture_s, []), given_titles)
        plan.targets.append(SidecarTarget(
            picture, sidecar, tuple(reviews), sidecar_for,
            stem if convention == "darktable" and stem.exists() else None, note,
            description=description, title=title, text_notes=text_notes, tags_list=convention == "darktable"))
    if read_only:
        listed = "; ".join(f"{f} {why}" for f, why in sorted(read_only.items()))
        raise XmpExportError(f"refused: the library is read-only, so no sidecar is written ({listed}). "
                             "Nothing was changed; make the folder writable to export there.")
    return plan


def _given_titles(caption_file: Path) -> dict[int, str]:
    """line number -> the "title" the caption file gives for that item (JSONL key or CSV column)."""
    fmt = caption_file.suffix.casefold().lstrip(".")
    fmt = fmt if fmt in {s.lstrip(".") for s in CSV_SUFFIXES} else "jsonl"
    out: dict[int, str] = {}
    for row in read_captions(caption_file, fmt, check_image=False, error=XmpExportError):
        title = getattr(row, "extra", {}).get("title")
        # Over the reader's bound (the captions' own, 20,000 characters) the title would be dropped
        # on reading: the first sentence instead.
        if isinstance(title, str) and title.strip() and len(title) <= MAX_CAPTION_CHARS:
            out[row.line_no] = title
    return out


def _texts(texts: XmpTextOptions, accepted: list[ReviewItem], given_titles: dict[int, str]
           ) -> tuple[str | None, str | None, tuple[str, ...]]:
    """(description, title, notes) for one picture. Only a caption the review accepted (its
    verdict on the whole item is "faithful") becomes the picture's description and title: one
    judged wrong or unsure would otherwise be shown by every tool as the photographer's own.
    With several accepted captions, the first in the file is written."""
    if not (texts.description or texts.title):
        return None, None, ()
    if not accepted:
        notes = tuple(f"{name} [{texts.language}]: {NOT_FAITHFUL}" for name, asked in
                      (("dc:title", texts.title), ("dc:description", texts.description)) if asked)
        return None, None, notes
    item = accepted[0]
    notes = (f"{len(accepted)} accepted captions for this picture: the first (line {item.line_no}) is written",) \
        if len(accepted) > 1 else ()
    return (item.caption if texts.description else None,
            title_of(item.caption, given_titles.get(item.line_no)) if texts.title else None, notes)


def _raw_partner(catalog: Catalog, picture: Path, listing: dict[Path, dict[str, str]]) -> Path | None:
    """The proprietary RAW file of a RAW+JPEG pair indexed once (IMG_0001.CR2 beside IMG_0001.JPG,
    the CR2 not indexed itself): its stem sidecar is the one Lightroom reads for the RAW and
    Longlens for the pair's picture. None when there is none."""
    folder = picture.parent
    _existing_name(folder, picture.name, listing)
    stem = picture.stem.casefold()
    for key, name in sorted(listing.get(folder, {}).items()):
        base, ext = os.path.splitext(key)
        if base == stem and ext in LIGHTROOM_SIDECAR_EXTENSIONS and catalog.image_at(folder / name) is None:
            return folder / name
    return None


def _outside_libraries(picture: Path, roots: Sequence[str]) -> str | None:
    """Why no sidecar may be written beside `picture`, or None: sidecars are written only inside an
    indexed library (a caption file may name any path, `../` included)."""
    folder = os.path.realpath(picture.parent)  # links and `..` resolved: where the file would land
    for root in roots:
        if folder == root or folder.startswith(root.rstrip(os.sep) + os.sep):
            return None
    return (f"{picture} is outside every indexed library; Longlens writes sidecars only beside pictures "
            "of a library it indexes. Not written")


def _pair_sidecar(catalog: Catalog, picture: Path, listing: dict[Path, dict[str, str]]) -> tuple[Path, str] | None:
    """The whole-name sidecar of the other file of a RAW+JPEG pair indexed once (IMG_0001.CR2.xmp
    for IMG_0001.JPG): Longlens' reader uses it for this picture when the picture has no
    whole-name sidecar of its own (engine.metadata.photo), so a new IMG_0001.JPG.xmp would hide
    it, keywords and rating included. None when there is no such file, or when the other file is
    indexed itself (pairs indexed both ways: each has its own sidecar)."""
    folder = picture.parent
    _existing_name(folder, picture.name, listing)  # fills the folder's listing
    names = listing.get(folder, {})
    stem = picture.stem.casefold()
    for key, name in sorted(names.items()):
        if key == picture.name.casefold() or key.endswith(".xmp") or os.path.splitext(key)[0] != stem:
            continue
        sidecar = names.get(f"{key}.xmp")
        if sidecar is not None and catalog.image_at(folder / name) is None:
            return folder / sidecar, name
    return None


def _refusal(picture: Path, sidecar: Path, taken: dict[Path, str]) -> str | None:
    if sidecar.suffix.casefold() != ".xmp" or sidecar == picture:
        return "the sidecar would be the picture itself; not written"
    if sidecar in taken:
        return (f"{sidecar.name} already takes {taken[sidecar]}'s review in this export (same stem); "
                "use the darktable convention (whole-name sidecars) for such pairs")
    try:
        st = sidecar.lstat()
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"{sidecar.name} cannot be reached ({exc.strerror or exc})"
    if stat.S_ISLNK(st.st_mode):
        return f"{sidecar.name} is a link; Longlens does not write through it"
    if not stat.S_ISREG(st.st_mode):
        return f"{sidecar.name} is not a regular file"
    if not stat.S_IMODE(st.st_mode) & 0o222:
        return f"{sidecar.name} is read-only; not changed"
    return None


# --------------------------------------------------------------------------- the job

MERGE_ATTEMPTS = 3  # merges again from what another program wrote meanwhile, then refuses the file
_DISK_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


@dataclass
class _Prepared:
    """One sidecar read and merged (phase 1): what it was and what it becomes."""

    target: SidecarTarget
    change: SidecarChange
    old: bytes | None = None  # the bytes read (None: no sidecar yet)
    identity: FileIdentity | None = None  # what they were, compared before the swap
    new: bytes | None = None  # None: nothing to write (unchanged or refused)
    backup: Path | None = None
    recheck: bool = False  # refused for its content: read again under the lock before giving up


def _read(target: SidecarTarget, change: SidecarChange) -> tuple[bytes | None, FileIdentity | None] | None:
    """The sidecar's bytes and identity ((None, None): there is none); None when refused."""
    try:
        return read_with_identity(target.sidecar, max_bytes=MAX_XMP_BYTES)
    except FileNotFoundError:
        return None, None
    except (FileTooLargeError, NotARegularFileError, OSError) as exc:
        change.action, change.reason = "refused", f"{target.sidecar.name}: cannot be read ({exc}); not changed"
        return None


def _merge(target: SidecarTarget, keywords: tuple[str, ...], texts: XmpTextOptions, old: bytes | None,
           change: SidecarChange) -> bytes | None:
    """The new bytes for this sidecar (None: unchanged, or refused with change.reason set)."""
    change.action = "update" if old is not None else "create"
    change.reason = ""
    try:
        old_text = old.decode("utf-8") if old is not None else None
    except UnicodeDecodeError:
        change.action, change.reason = "refused", f"{target.sidecar.name}: not UTF-8; not changed"
        return None
    # Every level of each keyword in dc:subject (as Lightroom writes parents); each keyword whole in
    # lr:hierarchicalSubject (flat ones too, as darktable writes them: digiKam, which reads that list
    # before dc:subject when there is no TagsList, would otherwise miss them) and digiKam:TagsList.
    subjects = [level for k in keywords for level in k.split("|")]
    try:
        if old is not None and target.sidecar_for:
            marked = parse_xmp(old, target.sidecar.name).sidecar_for
            if marked and marked.strip().lstrip(".").casefold() != target.sidecar_for.casefold():
                change.action = "refused"
                change.reason = (f"{target.sidecar.name} belongs to the {marked} file of that name "
                                 "(photoshop:SidecarForExtension); not changed")
                return None
        if old is None and target.stem_sidecar is not None:
            stem = read_user_file(target.stem_sidecar, max_bytes=MAX_XMP_BYTES, follow_symlinks=False)
            marked = parse_xmp(stem, target.stem_sidecar.name).sidecar_for
            if not marked or marked.strip().lstrip(".").casefold() == target.picture.suffix.lstrip(".").casefold():
                change.action = "refused"
                change.reason = (f"{target.stem_sidecar.name} (Lightroom's convention) holds this picture's metadata; "
                                 f"a new {target.sidecar.name} would hide it from Longlens' reader. Export with the "
                                 "lightroom convention to merge into it")
                return None
        merged = merge_sidecar(old_text, target.sidecar.name, reviews=target.reviews, subjects=subjects,
                               paths=list(keywords), tags=list(keywords), tags_list=target.tags_list and old is None,
                               description=target.description, title=target.title, language=texts.language,
                               replace_description=texts.replace_description, replace_title=texts.replace_title,
                               sidecar_for=target.sidecar_for)
    except XmpError as exc:
        change.action, change.reason = "refused", str(exc)
        return None
    except (FileNotFoundError, FileTooLargeError, NotARegularFileError, OSError) as exc:
        change.action, change.reason = "refused", f"{target.stem_sidecar}: cannot be read ({exc}); not changed"
        return None
    change.changes = merged.changes + list(target.text_notes) + ([target.note] if target.note else [])
    if target.tags_list and texts.language.casefold() != "x-default" and (target.description or target.title):
        change.changes.append(DARKTABLE_LANGUAGE_NOTE)
    change.fields = dict(merged.outcomes)
    for name, asked in (("dc:title", texts.title), ("dc:description", texts.description)):
        if asked and name not in change.fields:
            change.fields[name] = NOT_FAITHFUL
    if old_text is not None and merged.text == old_text:
        change.action = "unchanged"
        return None
    return merged.text.encode("utf-8")


def _prepare(target: SidecarTarget, keywords: tuple[str, ...], texts: XmpTextOptions) -> _Prepared:
    change = SidecarChange(str(target.picture), str(target.sidecar), "create")
    p = _Prepared(target, change)
    got = _read(target, change)
    if got is None:
        return p
    p.old, p.identity = got
    p.new = _merge(target, keywords, texts, p.old, change)
    # A sidecar refused for what it held may have been read while another writer was half-way
    # through it (in place, not atomically): the swap reads it again under the lock.
    p.recheck = p.new is None and change.action == "refused" and p.identity is not None
    return p


def _new_run_folder(backup_root: Path) -> Path:
    """A backup folder of this run's own: made exclusively, so two exports started in the same
    second never write into one folder (each would overwrite the other's copies and manifest)."""
    parent = backup_root / BACKUP_FOLDER
    parent.mkdir(parents=True, exist_ok=True)
    base = time.strftime("%Y%m%dT%H%M%S")
    for n in range(1, 10_000):
        folder = parent / (base if n == 1 else f"{base}-{n}")
        try:
            folder.mkdir()
            return folder
        except FileExistsError:
            continue
    raise XmpExportError(f"cannot make a backup folder in {parent}")


class _Backups:
    """The run's backup folder: every copy is written and fsynced (atomic_write_bytes) before the
    sidecar it copies is changed, and the manifest names where each came from."""

    def __init__(self, backup_root: Path) -> None:
        self.backup_root = backup_root
        self.folder: Path | None = None
        self.manifest: dict[str, str] = {}

    def write(self, p: _Prepared, data: bytes) -> None:
        if self.folder is None:
            self.folder = _new_run_folder(self.backup_root)
        if p.backup is None:
            p.backup = self.folder / f"{len(self.manifest) + 1:05d}-{p.target.sidecar.name}"
        atomic_write_bytes(p.backup, data)  # again when the sidecar changed: the copy is what is replaced
        self.manifest[p.backup.name] = str(p.target.sidecar)
        atomic_write_bytes(self.folder / "manifest.json",
                           # ASCII escapes: a sidecar name that is not UTF-8 is kept exactly
                           (json.dumps(self.manifest, indent=1) + "\n").encode("utf-8"))
        p.change.backup = str(p.backup)


def _skip(p: _Prepared, why: str) -> None:
    if p.change.action in ("create", "update"):
        p.change.action, p.change.reason, p.change.backup = "skipped", why, None


def _swap(p: _Prepared, keywords: tuple[str, ...], texts: XmpTextOptions, backups: _Backups) -> None:
    """Phase 3 for one sidecar, holding its folder's lock: compare-and-swap. The sidecar is read
    again; if it is not what phase 1 read, the merge is done again from what is there now (and
    that is backed up); replace_user_file checks it once more right before the replace."""
    target, change = p.target, p.change
    for _attempt in range(MERGE_ATTEMPTS):
        got = _read(target, change)
        if got is None:
            return
        old, identity = got
        if identity != p.identity:
            # Another program wrote it since it was read: its edit is merged, never overwritten.
            p.old, p.identity = old, identity
            p.new = _merge(target, keywords, texts, old, change)
            change.changes.append("merged again: the sidecar changed while Longlens was working")
            if p.new is None:
                return
            if old is not None:
                backups.write(p, old)  # the backup is what is replaced: taken again, under the lock
        elif p.new is None:
            return  # refused for what it holds, and it still holds that
        try:
            how = replace_user_file(target.sidecar, p.new, expected=p.identity, max_bytes=MAX_XMP_BYTES)
        except FileChangedError:
            continue
        if how == "written in place":
            change.changes.append("written in place (a hard-linked sidecar, or one whose owner this user "
                                  "cannot keep): every name and attribute stays")
        return
    change.action = "refused"
    change.reason = (f"{target.sidecar.name} changed {MERGE_ATTEMPTS} times while Longlens was writing it "
                     "(another program keeps writing it); not changed")
    change.backup = None


def export_xmp_job(plan: XmpExportPlan, *, backup_root: Path, dry_run: bool = False,
                   cancel: CancelToken | None = None) -> Iterator[Progress]:
    """Write (or, in a dry run, only work out) each planned sidecar, in three phases: read and
    merge every sidecar; back up (fsynced) every one that will change; then swap each under its
    folder's lock, compare-and-swap (another program's edit since phase 1 is merged again, never
    lost). A full disk while backing up stops the run before any sidecar changed (XmpExportError).
    Cancelling stops between sidecars: those written stay written (each whole, and backed up), the
    rest are "skipped" and the summary says the run was cancelled. The last Progress carries the
    XmpExportSummary in extra["summary"]."""
    total = len(plan.targets)
    prepared: list[_Prepared] = []
    cancelled = False
    yield Progress("reading", 0, total)
    for n, target in enumerate(plan.targets, 1):
        if cancel is not None and cancel.cancelled:
            cancelled = True
            break
        prepared.append(_prepare(target, plan.keywords, plan.texts))
        yield Progress("reading", n, total, message=target.sidecar.name)
    for target in plan.targets[len(prepared):]:
        p = _Prepared(target, SidecarChange(str(target.picture), str(target.sidecar), "create"))
        _skip(p, "not read: the export was cancelled")
        prepared.append(p)
    backups = _Backups(backup_root)
    if not dry_run and not cancelled:
        yield from _write(prepared, plan.keywords, plan.texts, backups, cancel)
        cancelled = any(p.change.action == "skipped" and "cancelled" in p.change.reason for p in prepared)
    elif not dry_run:
        for p in prepared:
            _skip(p, "not written: the export was cancelled")
    results = list(plan.refused) + [p.change for p in prepared]
    summary = XmpExportSummary(dry_run, results, str(backups.folder) if backups.folder else None, cancelled=cancelled)
    yield Progress("done", total, total, extra={"summary": summary})


def _write(prepared: list[_Prepared], keywords: tuple[str, ...], texts: XmpTextOptions, backups: _Backups,
           cancel: CancelToken | None) -> Iterator[Progress]:
    changing = [p for p in prepared if p.new is not None or p.recheck]
    # Phase 2: every backup on disk before the first change.
    for p in changing:
        if p.old is None or p.new is None:
            continue
        try:
            backups.write(p, p.old)
        except OSError as exc:
            _backup_failed(backups, p, exc)
    yield from _swap_all(prepared, changing, keywords, texts, backups, cancel)


def _backup_failed(backups: _Backups, p: _Prepared, exc: OSError) -> None:
    if backups.folder is not None:
        shutil.rmtree(backups.folder, ignore_errors=True)  # copies of files left untouched
    raise XmpExportError(
        f"the backup of {p.target.sidecar} could not be written in {backups.backup_root / BACKUP_FOLDER} "
        f"({exc.strerror or exc}); no sidecar was changed. Free some space there and export again."
    ) from None


def _swap_all(prepared: list[_Prepared], changing: list[_Prepared], keywords: tuple[str, ...],
              texts: XmpTextOptions, backups: _Backups, cancel: CancelToken | None) -> Iterator[Progress]:
    # Phase 3: swap each, holding its folder's lock for that one sidecar only (another Longlens
    # writer in the same folder waits milliseconds, not the length of this export). Stale
    # temporary files a killed export left in a folder go the first time its lock is held.
    cleaned: set[Path] = set()
    done = 0
    stop = ""
    for p in changing:
        folder = p.target.sidecar.parent
        if not stop and cancel is not None and cancel.cancelled:
            stop = "not written: the export was cancelled"
        if stop:
            _skip(p, stop)
            continue
        try:
            with folder_write_lock(folder, cancel=cancel):
                if folder not in cleaned:
                    remove_stale_temp_files(folder)
                    cleaned.add(folder)
                _swap(p, keywords, texts, backups)
        except FolderLockTimeout as exc:
            p.change.action, p.change.reason, p.change.backup = "refused", f"{exc}; not changed", None
        except JobCancelled:
            stop = "not written: the export was cancelled"
            _skip(p, stop)
            continue
        except OSError as exc:
            p.change.action, p.change.backup = "refused", None
            p.change.reason = f"{p.target.sidecar}: cannot be written ({exc.strerror or exc}); not changed"
            if exc.errno in _DISK_FULL:
                stop = "not written: the disk is full (an earlier sidecar could not be written)"
        done += 1
        yield Progress("sidecars", done, len(changing), message=p.target.sidecar.name)
    # Folders where nothing changes still lose a killed export's leftovers.
    for folder in dict.fromkeys(p.target.sidecar.parent for p in prepared):
        if folder in cleaned or stop:
            continue
        try:
            with folder_write_lock(folder, cancel=cancel):
                remove_stale_temp_files(folder)
        except (OSError, JobCancelled):
            pass  # nothing was to be written there; the next export tries again
