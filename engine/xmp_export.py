"""Exporting review results to XMP sidecars, only when the user asks (`longlens xmp export`).

What is written, per picture of a reviewed caption file that has a verdict or a note: its
review (engine.metadata.xmp_write: `longlens:Reviews` in the Longlens namespace) and the keywords
the user chose (lr:hierarchicalSubject paths, and every level of each in dc:subject, as Lightroom
writes them). Where:

  lightroom  IMG_0001.xmp beside the picture (its stem), marked with
             photoshop:SidecarForExtension when Longlens creates it, as Lightroom does;
  darktable  IMG_0001.CR2.xmp (its whole name), as darktable and digiKam name theirs.

An existing sidecar (any case of the name) is merged into at the text level, keeping every other
byte; the previous file is copied into the home's data/xmp-backups/<run>/ first (with a
manifest naming where each copy came from), and the new one replaces it atomically (temp file in
the same folder, fsync, rename). Why backups in the home and not beside the picture: a
`.xmp.bak` in the photo folder is one more file the user's other tools list or import.

Never written: the picture itself (only a name ending in .xmp that is not the picture), a sidecar
that is a link, a read-only sidecar, a Lightroom sidecar that belongs to another file of the
same stem (photoshop:SidecarForExtension), a new whole-name sidecar where the picture's stem
sidecar holds its metadata (the reader would then ignore that one), and anything at all when a picture's folder is
read-only (a read-only file system, no write permission bits, or not writable by this user):
the export is then refused before any file is touched, naming the folders. A dry run reads and
merges exactly as the export would and lists what would change, writing nothing.
"""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from engine.catalog import Catalog
from engine.errors import LonglensError
from engine.fileutil import FileTooLargeError, NotARegularFileError, atomic_write_bytes, read_user_file
from engine.jobs import CancelToken, Progress
from engine.metadata.xmp import MAX_XMP_BYTES, XmpError, normalise_keyword, parse_xmp
from engine.metadata.xmp_write import CaptionReview, SentenceReview, merge_sidecar
from engine.review import ReviewItem, open_session, session_items

CONVENTIONS: tuple[str, ...] = ("lightroom", "darktable")
BACKUP_FOLDER = "xmp-backups"


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


@dataclass
class SidecarChange:
    """What the export did (or, in a dry run, would do) to one sidecar."""

    picture: str
    sidecar: str
    action: str  # "create" | "update" | "unchanged" | "refused"
    changes: list[str] = field(default_factory=list)
    reason: str = ""
    backup: str | None = None

    def as_dict(self) -> dict:
        return {"picture": self.picture, "sidecar": self.sidecar, "action": self.action, "changes": self.changes,
                "reason": self.reason, "backup": self.backup}


@dataclass
class XmpExportPlan:
    caption_file: str
    convention: str
    keywords: tuple[str, ...]
    targets: list[SidecarTarget] = field(default_factory=list)
    refused: list[SidecarChange] = field(default_factory=list)
    items_without_review: int = 0


@dataclass
class XmpExportSummary:
    dry_run: bool
    results: list[SidecarChange]
    backup_folder: str | None = None

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.results:
            out[r.action] = out.get(r.action, 0) + 1
        return out

    def as_dict(self) -> dict:
        return {"dry_run": self.dry_run, "counts": self.counts(), "backup_folder": self.backup_folder,
                "sidecars": [r.as_dict() for r in self.results]}


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
                    keywords: Sequence[str] = ()) -> XmpExportPlan:
    """Which sidecars an export of this caption file's review would write. Raises XmpExportError
    for an unknown convention, no reviewed item, or a read-only picture folder."""
    if convention not in CONVENTIONS:
        raise XmpExportError(f"unknown sidecar convention {convention!r}; use one of {', '.join(CONVENTIONS)}",
                             settings=("convention",))
    chosen = tuple(dict.fromkeys(k for k in (normalise_keyword(k) for k in keywords) if k))
    session = open_session(catalog, caption_file)
    plan = XmpExportPlan(session.caption_file, convention, chosen)
    by_picture: dict[str, list[CaptionReview]] = {}
    for item in session_items(catalog, session):
        review = _review_of(item)
        if review is None:
            plan.items_without_review += 1
            continue
        by_picture.setdefault(item.image_path, []).append(review)
    if not by_picture:
        raise XmpExportError(f"{Path(session.caption_file).name}: no item has a verdict or a note yet; "
                             "nothing to export")
    listing: dict[Path, dict[str, str]] = {}
    taken: dict[Path, str] = {}
    read_only: dict[Path, str] = {}
    for picture_s, reviews in by_picture.items():
        picture = Path(picture_s)
        folder = picture.parent
        base = picture.stem if convention == "lightroom" else picture.name
        sidecar = folder / _existing_name(folder, base + ".xmp", listing)
        refused = _refusal(picture, sidecar, taken)
        if refused is not None:
            plan.refused.append(SidecarChange(str(picture), str(sidecar), "refused", reason=refused))
            continue
        reason = read_only_reason(folder)
        if reason is not None:
            read_only[folder] = reason
            continue
        taken[sidecar] = picture.name
        stem = folder / _existing_name(folder, picture.stem + ".xmp", listing)
        plan.targets.append(SidecarTarget(
            picture, sidecar, tuple(reviews), picture.suffix.lstrip(".") if convention == "lightroom" else None,
            stem if convention == "darktable" and stem.exists() else None))
    if read_only:
        listed = "; ".join(f"{f} {why}" for f, why in sorted(read_only.items()))
        raise XmpExportError(f"refused: the library is read-only, so no sidecar is written ({listed}). "
                             "Nothing was changed; make the folder writable to export there.")
    return plan


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


def _prepare(target: SidecarTarget, keywords: tuple[str, ...]) -> tuple[SidecarChange, bytes | None, bytes | None]:
    """(what changes, the sidecar's current bytes or None, the new bytes or None when unchanged)."""
    change = SidecarChange(str(target.picture), str(target.sidecar), "create")
    old: bytes | None = None
    try:
        old = read_user_file(target.sidecar, max_bytes=MAX_XMP_BYTES, follow_symlinks=False)
        change.action = "update"
    except FileNotFoundError:
        pass
    except (FileTooLargeError, NotARegularFileError, OSError) as exc:
        change.action, change.reason = "refused", f"{target.sidecar.name}: cannot be read ({exc}); not changed"
        return change, None, None
    try:
        old_text = old.decode("utf-8") if old is not None else None
    except UnicodeDecodeError:
        change.action, change.reason = "refused", f"{target.sidecar.name}: not UTF-8; not changed"
        return change, None, None
    subjects = [level for k in keywords for level in k.split("|")]
    try:
        if old is not None and target.sidecar_for:
            marked = parse_xmp(old, target.sidecar.name).sidecar_for
            if marked and marked.strip().lstrip(".").casefold() != target.sidecar_for.casefold():
                change.action = "refused"
                change.reason = (f"{target.sidecar.name} belongs to the {marked} file of that name "
                                 "(photoshop:SidecarForExtension); not changed")
                return change, None, None
        if old is None and target.stem_sidecar is not None:
            stem = read_user_file(target.stem_sidecar, max_bytes=MAX_XMP_BYTES, follow_symlinks=False)
            marked = parse_xmp(stem, target.stem_sidecar.name).sidecar_for
            if not marked or marked.strip().lstrip(".").casefold() == target.picture.suffix.lstrip(".").casefold():
                change.action = "refused"
                change.reason = (f"{target.stem_sidecar.name} (Lightroom's convention) holds this picture's metadata; "
                                 f"a new {target.sidecar.name} would hide it from Longlens' reader. Export with the "
                                 "lightroom convention to merge into it")
                return change, None, None
        merged = merge_sidecar(old_text, target.sidecar.name, reviews=target.reviews, subjects=subjects,
                               paths=[k for k in keywords if "|" in k], sidecar_for=target.sidecar_for)
    except XmpError as exc:
        change.action, change.reason = "refused", str(exc)
        return change, None, None
    change.changes = merged.changes
    if old_text is not None and merged.text == old_text:
        change.action = "unchanged"
        return change, old, None
    return change, old, merged.text.encode("utf-8")


def export_xmp_job(plan: XmpExportPlan, *, backup_root: Path, dry_run: bool = False,
                   cancel: CancelToken | None = None) -> Iterator[Progress]:
    """Write (or, in a dry run, only work out) each planned sidecar. The last Progress carries
    the XmpExportSummary in extra["summary"]. Cancelling stops between sidecars; those written
    stay written (each is whole, and backed up)."""
    results: list[SidecarChange] = list(plan.refused)
    total = len(plan.targets)
    run_folder: Path | None = None
    manifest: dict[str, str] = {}
    yield Progress("sidecars", 0, total)
    for n, target in enumerate(plan.targets, 1):
        if cancel is not None and cancel.cancelled:
            break
        change, old, new = _prepare(target, plan.keywords)
        if new is not None and not dry_run:
            if old is not None:
                if run_folder is None:
                    run_folder = backup_root / BACKUP_FOLDER / time.strftime("%Y%m%dT%H%M%S")
                    suffix = 1
                    while run_folder.exists():
                        suffix += 1
                        run_folder = run_folder.with_name(f"{run_folder.name.split('-')[0]}-{suffix}")
                backup = run_folder / f"{len(manifest) + 1:05d}-{target.sidecar.name}"
                atomic_write_bytes(backup, old)
                manifest[backup.name] = str(target.sidecar)
                atomic_write_bytes(run_folder / "manifest.json",
                                   (json.dumps(manifest, indent=1, ensure_ascii=False) + "\n").encode("utf-8"))
                change.backup = str(backup)
            try:
                atomic_write_bytes(target.sidecar, new)
            except OSError as exc:
                change.action, change.reason = "refused", f"{target.sidecar}: cannot be written ({exc.strerror or exc})"
        results.append(change)
        yield Progress("sidecars", n, total, message=target.sidecar.name)
    summary = XmpExportSummary(dry_run, results, str(run_folder) if run_folder else None)
    yield Progress("done", total, total, extra={"summary": summary})
