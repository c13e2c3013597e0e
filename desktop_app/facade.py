"""The engine facade: the one module of the views' world that imports engine.

`Backend` forwards to engine objects (catalog, searcher, indexer, review, models, ...). It
holds no logic of its own beyond choosing which engine function to call with which settings;
views, widgets and dialogs never import `engine` (an import-linter contract in pyproject.toml
checks it) — what they need (errors, constants, display helpers) is re-exported here.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PySide6.QtGui import QImage

from desktop_app.thumbnails import pil_to_qimage
from engine.errors import LonglensError
from engine.jobs import CancelToken, Progress
from engine.settings import DEFAULTS as SETTINGS_DEFAULTS
from engine.settings import DEVICES, Settings

__all__ = ["DEVICES", "LonglensError", "Settings"]

# --------------------------------------------------------------------------- the engine facade


def human_size(n: int | None) -> str:
    """Bytes as the engine writes them in its messages (and the hub shows them): 895.1 MB."""
    from engine.models.download import human_size as engine_human_size

    return engine_human_size(n)


DEFAULT_SETTINGS = SETTINGS_DEFAULTS  # engine.settings: the CLI's defaults too
THUMBNAIL_PX = 256
# The words the results view shows for each engine.options.RESULT_ORDER value.
RESULT_ORDER_LABELS = {"relevance": "Relevance", "date-new": "Newest first", "date-old": "Oldest first"}


@dataclass
class LibraryInfo:
    id: int
    root: str
    status: str  # "online" | "offline" | "partial" (the last run did not complete)
    indexed: int
    unreadable: int
    deleted: int
    scanned: bool  # a full scan has completed at least once (else: pending)
    pending: int | None = None  # partial: files the interrupted run left to index (None: unknown)
    state: str = ""  # the engine's words for the state, as `longlens libraries` prints them

    @property
    def partial(self) -> bool:
        return self.status == "partial"

    @property
    def offline(self) -> bool:
        return self.status == "offline"


@dataclass
class ModelInfo:
    name: str
    backend: str
    installed: bool
    registered: bool
    bundled: bool
    description: str
    size_bytes: int | None
    problem: str | None
    notice: str | None  # e.g. "random, untrained weights"
    pullable: bool
    # Files a pull installs only when the user accepts them (the registry knows no pin for them);
    # empty for a fully pinned model, which downloads without any question.
    unpinned: tuple[str, ...] = ()
    # The query readers it includes (text-towers/NAME), chosen by name in the settings.
    text_towers: tuple[str, ...] = ()


@dataclass
class ModelState:
    name: str | None
    notice: str | None  # shown plainly next to the model name (untrained demo model)
    problem: str | None  # why there is no usable model


class Backend:
    """Engine services for the GUI, safe to call from worker threads."""

    def __init__(self, paths: Any = None, *, model: str | None = None) -> None:
        from engine.config import get_paths
        from engine.services import Services

        self.paths = (paths or get_paths()).ensure()
        self.services = Services(self.paths)
        self._lock = threading.RLock()
        # Its own lock: the GUI thread asks for settings while a worker holds _lock loading a model.
        self._settings_lock = threading.Lock()
        self._settings: Settings | None = None
        try:
            self.settings()  # a bad value stops here with the file and key, not mid-run
        except Exception:
            self.services.close()
            raise
        self.session_model = model  # --model for this run only
        self._thumbs = None
        from engine.grounding import get_grounder

        # Replaceable (tests plug in a fake grounder to exercise the overlay UI). The home's own
        # calibrations (fitted with calibrate_grounding) come before the shipped ones.
        self.grounder_factory: Callable[[Any], Any] = lambda embedder: get_grounder(embedder, paths=self.paths)

    def close(self) -> None:
        self.services.close()

    # -- settings -----------------------------------------------------------
    def settings(self) -> Settings:
        """The settings in effect (engine.settings, as the CLI reads them): the file is read once
        and cached until save_settings changes it."""
        with self._settings_lock:
            if self._settings is None:
                self._settings = self.services.settings()
            return self._settings

    @staticmethod
    def setting_range(key: str) -> tuple[int, int]:
        """The valid range of a numeric setting, from the engine's validators (spin boxes use it)."""
        from engine.options import SETTINGS_NUMBERS

        number = SETTINGS_NUMBERS[key][0]
        return int(number.lo), int(number.hi)

    @staticmethod
    def setting_choices(key: str) -> tuple[str, ...]:
        """The values a choice setting accepts, from the engine's validators (combo boxes use it)."""
        from engine.options import SETTINGS_CHOICES

        return SETTINGS_CHOICES[key].choices

    @staticmethod
    def available_devices() -> tuple[str, ...]:
        """The devices this machine can run a model on (engine.models.device decides; imports
        torch, so the GUI asks from a worker)."""
        from engine.models.device import available_devices

        return available_devices()

    def save_settings(self, values: dict[str, Any]) -> None:
        """Raises a LonglensError naming the setting when a value is out of range; nothing is written."""
        with self._settings_lock:
            self._settings = None  # re-read next time, even if the write fails half-way
            self._settings = self.services.save_settings(values)
        with self._lock:
            self._thumbs = None  # the cache size may have changed

    # -- models -------------------------------------------------------------
    def model_state(self) -> ModelState:
        from engine.errors import ModelError

        try:
            name = self._model_name()
        except ModelError as exc:
            return ModelState(None, None, str(exc))
        return ModelState(name, self.model_notice(name), None)

    def _model_name(self) -> str:
        from engine.errors import ModelNotInstalledError
        from engine.models.registry import installed_model_dir

        name = self.services.default_model_name(self.session_model, self.settings())
        if installed_model_dir(name, self.paths) is None:
            from engine.models.registry import how_to_get

            raise ModelNotInstalledError(f"the model {name!r} is not installed. {how_to_get(name)}")
        return name

    @staticmethod
    def model_notice(name: str | None) -> str | None:
        from engine.sample_collection import model_notice

        return model_notice(name)

    def embedder(self):
        s = self.settings()
        name = self._model_name()
        with self._lock:
            return self.services.embedder(name, device=s.device, text_tower=s.text_tower)

    def list_models(self) -> list[ModelInfo]:
        from engine.models.registry import get_spec, list_models

        out = []
        for m in list_models(self.paths):
            try:
                spec = get_spec(m.name) if m.registered else None
            except LonglensError:
                spec = None
            out.append(ModelInfo(
                name=m.name, backend=m.backend, installed=m.installed, registered=m.registered,
                bundled=m.bundled, description=m.description, size_bytes=m.size_bytes, problem=m.problem,
                notice=self.model_notice(m.name),
                pullable=bool(spec is not None and spec.repo_id and not spec.bundled),
                unpinned=m.unpinned, text_towers=m.text_towers,
            ))
        return out

    def import_model(self, folder: str, name: str) -> str:
        from engine.models.download import import_model
        from engine.models.registry import import_backend

        backend = import_backend(Path(folder).expanduser(), name)
        return str(import_model(Path(folder), name, self.paths, backend=backend))

    def pull_job(self, name: str, trust_unpinned: bool = False) -> Callable[[CancelToken], Iterator[Progress]]:
        """The pull of a registered model as a job. `trust_unpinned` matters only for a model listing
        files without a pin (ModelInfo.unpinned); a fully pinned one installs without it."""
        from engine.models.download import pull_model

        return lambda token: pull_model(name, self.paths, cancel=token, trust_unpinned=trust_unpinned)

    # -- libraries ------------------------------------------------------------
    def libraries(self) -> list[LibraryInfo]:
        cat = self.services.catalog
        out = []
        for lib in cat.libraries():
            counts = cat.status_counts(lib.id)
            # The folder is looked at now (engine Catalog.library_state, as `longlens libraries`):
            # missing or unmounted is offline, nothing deleted; back again is no longer offline.
            state = cat.library_state(lib.id)
            out.append(LibraryInfo(lib.id, lib.root, state.status, counts.get("ok", 0), counts.get("unreadable", 0),
                                   counts.get("deleted", 0), lib.last_scan_at is not None,
                                   pending=state.pending, state=state.label))
        return out

    @staticmethod
    def reachable_roots(roots: list[str]) -> list[str]:
        """Those of `roots` whose folder is there now (engine.catalog.root_reachable, the test
        indexing uses): an offline library whose drive is back is among them."""
        from engine.catalog import root_reachable

        return [r for r in roots if root_reachable(r)]

    def unreadable(self, library_id: int) -> list[tuple[str, str]]:
        from engine.catalog.paths import for_display

        return [(for_display(r.rel_path), r.reason or "unreadable")
                for r in self.services.catalog.unreadable(library_id)]

    def remove_library(self, library_id: int) -> None:
        """Forget a folder: its catalog rows and derived indexes. The photos are not touched."""
        self.services.catalog.remove_library(library_id)
        self.services.store.drop(library_id)

    def check_folder(self, path: str) -> str | None:
        """A message when `path` cannot be added as a library folder, else None: the engine's own
        refusal too (a folder inside a library, or one of Longlens's own), before any job starts."""
        p = Path(path).expanduser()
        if not str(path).strip():
            return "no folder given"
        if not p.exists():
            return f"{p} does not exist"
        if not p.is_dir():
            return f"{p} is a file, not a folder: add the folder that holds your photos"
        try:
            next(iter(p.iterdir()), None)
        except PermissionError:
            return f"{p} cannot be read (permission denied)"
        except OSError as exc:
            return f"{p} cannot be read ({exc.strerror or exc})"
        return self.services.library_root_problem(p)

    def index_job(self, root: str) -> Callable[[CancelToken], Iterator[Progress]]:
        def job(token: CancelToken) -> Iterator[Progress]:
            yield Progress("load", message="loading the model")
            embedder = self.embedder()
            token.raise_if_cancelled()
            s = self.settings()
            indexer = self.services.indexer(embedder, batch_size=s.batch_size, decode_workers=s.decode_workers,
                                            raw_jpeg_pairs=s.raw_jpeg_pairs)
            yield from indexer.run(root, cancel=token)

        return job

    # -- search ---------------------------------------------------------------
    @staticmethod
    def image_suffixes() -> frozenset[str]:
        from engine.indexing.decode import SUPPORTED_EXTENSIONS

        return SUPPORTED_EXTENSIONS

    @staticmethod
    def _filter(filters: dict[str, Any] | None):
        from engine.search.filters import build_filters

        f = filters or {}
        return build_filters(f.get("folder"), f.get("after"), f.get("before"), f.get("camera"),
                             rating=f.get("rating"), label=f.get("label"), keyword=f.get("keyword"),
                             near=f.get("near"), km=f.get("km"))

    @staticmethod
    def result_orders() -> list[tuple[str, str]]:
        """(value, label) of each result order the engine accepts (engine.options.RESULT_ORDER)."""
        from engine.options import RESULT_ORDER

        return [(v, RESULT_ORDER_LABELS.get(v, v)) for v in RESULT_ORDER.choices]

    @staticmethod
    def cutoff_range() -> tuple[float, float]:
        """The relevance cut-off's range (engine.options.RELEVANCE_CUTOFF); its lower end is
        excluded, so a spin box at that value means "no cut-off"."""
        from engine.options import RELEVANCE_CUTOFF

        return float(RELEVANCE_CUTOFF.lo), float(RELEVANCE_CUTOFF.hi)

    def search_text(self, text: str, top_k: int, filters: dict[str, Any] | None = None,
                    max_tokens: int | None = None, order: str = "relevance", cutoff: float | None = None):
        flt = self._filter(filters)  # cheap checks first: a bad date should not wait for a model to load
        self._check_arrangement(order, cutoff)
        embedder = self.embedder()
        return self.services.searcher(embedder).search_text(text, top_k=top_k, flt=flt, max_tokens=max_tokens,
                                                            order=order, cutoff=cutoff)

    def search_image(self, path: str, top_k: int, filters: dict[str, Any] | None = None, order: str = "relevance",
                     cutoff: float | None = None):
        flt = self._filter(filters)
        self._check_arrangement(order, cutoff)
        embedder = self.embedder()
        return self.services.searcher(embedder).search_image(path, top_k=top_k, flt=flt, order=order,
                                                             cutoff=cutoff)

    @staticmethod
    def _check_arrangement(order: str, cutoff: float | None) -> None:
        # The engine's own checks, before a model loads: the CLI's flags use the same validators.
        from engine.options import RELEVANCE_CUTOFF, RESULT_ORDER

        RESULT_ORDER.check(order)
        if cutoff is not None:
            RELEVANCE_CUTOFF.check(cutoff)

    def token_budget(self, text: str, max_tokens: int | None = None):
        from engine.query_budget import token_budget

        return token_budget(self.embedder(), text, max_tokens)

    # -- duplicates ---------------------------------------------------------------
    @staticmethod
    def duplicate_settings() -> dict[str, Any]:
        """Ranges and defaults of the duplicates options (engine.options, as the CLI's flags)."""
        from engine.duplicates import DEFAULT_NEAR_DISTANCE
        from engine.options import PHASH_DISTANCE, SIMILARITY_THRESHOLD

        return {"near_range": (int(PHASH_DISTANCE.lo), int(PHASH_DISTANCE.hi)), "near_default": DEFAULT_NEAR_DISTANCE,
                "similar_range": (float(SIMILARITY_THRESHOLD.lo), float(SIMILARITY_THRESHOLD.hi))}

    def duplicates_job(self, near_distance: int | None, similar: float | None
                       ) -> Callable[[CancelToken], Iterator[Progress]]:
        """The duplicates search as a job (the CLI's `longlens duplicates`); its last Progress
        carries the report in extra["report"]. Nothing is deleted."""
        from engine.duplicates import PhashCache, find_duplicates
        from engine.options import PHASH_DISTANCE, SIMILARITY_THRESHOLD

        if near_distance is not None:
            PHASH_DISTANCE.check(near_distance)
        if similar is not None:
            SIMILARITY_THRESHOLD.check(similar)

        def job(token: CancelToken) -> Iterator[Progress]:
            identity = name = None
            if similar is not None:
                from engine.models.registry import installed_identity

                name = self._model_name()
                identity = installed_identity(name, self.paths).image
            cache = PhashCache(self.paths.cache / "phash.sqlite3")
            try:
                yield from find_duplicates(self.services.catalog, self.services.store, near_distance=near_distance,
                                           similar=similar, model_identity=identity, model_name=name,
                                           phash_cache=cache, cancel=token)
            finally:
                cache.close()

        return job

    def export_duplicates(self, report: Any, dest: str) -> str:
        """Write the list (CSV or JSON by the suffix) atomically; the CLI's --out guard applies."""
        from engine.duplicates import export_report

        roots = [lib.root for lib in self.services.catalog.libraries()]
        return str(export_report(report, dest, roots))

    # -- images -----------------------------------------------------------------
    def thumbnail(self, path: str, size: int):
        from engine.thumbnails import ThumbnailCache, make_thumbnail

        with self._lock:
            if self._thumbs is None:
                mb = self.settings().thumbnail_cache_mb
                self._thumbs = ThumbnailCache(self.paths.thumbnails, max_bytes=mb * 1024 * 1024)
            cache = self._thumbs
        return make_thumbnail(path, size, cache)

    def clear_thumbnail_cache(self) -> None:
        from engine.thumbnails import ThumbnailCache

        ThumbnailCache(self.paths.thumbnails).clear()

    @staticmethod
    def display_image(path: str, max_side: int = 4096) -> QImage:
        """The picture upright, at most max_side pixels on its longer side, as a QImage."""
        from engine.thumbnails import render_thumbnail

        return pil_to_qimage(render_thumbnail(path, max_side))

    def photo_metadata(self, path: str, image_id: int | None = None) -> dict[str, Any] | None:
        """What the picture's metadata says (as the last scan read it), ready to show: the view
        `longlens search --json` gives too (engine.metadata.showing.metadata_view: title and
        description per language, keywords once each, rating, label, pick, camera, lens, the date
        as known with its source, GPS, every field with its source), plus `keyword_text` (paths
        as "Places › Norway"), `gps_text` and `field_lines`; None when the picture is not in the
        catalog or its metadata was not read yet."""
        from engine.metadata.showing import field_lines, gps_text, picture_view

        view = picture_view(self.services.catalog, path=path, image_id=image_id)
        if view is None or not view["metadata_read"]:
            return None
        view["keyword_text"] = [" › ".join(k.split("|")) for k in view["keywords"]]
        view["gps_text"] = gps_text(view)
        view["field_lines"] = field_lines(view)
        return view

    # -- grounding --------------------------------------------------------------
    def grounder(self):
        try:
            embedder = self.embedder()
        except LonglensError:
            return None
        return self.grounder_factory(embedder)

    def ground(self, image_path: str, text: str, sentences: list[tuple[int, int]] | None = None):
        """The grounding of `text` in the image, or None when the model has no grounder.

        `sentences`: the caller's sentence spans (the Review panel's rows), so that
        sentence_supports[i] belongs to the caller's sentence i."""
        grounder = self.grounder()
        if grounder is None:
            return None
        from engine.indexing.decode import decode_image

        image, _ = decode_image(Path(image_path))
        if sentences is None:
            return grounder.ground(image, text)
        return grounder.ground(image, text, sentences=list(sentences))

    def calibration_job(self, *, data: str | None = None,
                        scenes: int | None = None) -> Callable[[CancelToken], Iterator[Progress]]:
        """The fit of the current model's support calibration as a job, on a labelled caption file
        or on that many SceneWorld validation scenes; it is stored in this home and every grounding
        made afterwards (Inspector, Review) uses it. The last Progress carries the summary."""
        from engine.evaluation.grounding_calibration import CalibrationRequest, calibrate_job
        from engine.grounding.calibration import user_calibration_file

        req = CalibrationRequest(data=Path(data).expanduser() if data else None, scenes=scenes)

        def job(token: CancelToken) -> Iterator[Progress]:
            yield Progress("load", message="loading the model")
            embedder = self.embedder()
            token.raise_if_cancelled()
            yield from calibrate_job(embedder, req, user_calibration_file(self.paths), token)

        return job

    # -- review -----------------------------------------------------------------
    def open_review(self, path: str):
        from engine import review

        return review.open_session(self.services.catalog, path)

    def review_item(self, session, index: int):
        from engine import review

        return review.get_item(self.services.catalog, session, index)

    def set_verdict(self, item_id: int, sentence_index: int | None, verdict: str | None, note: str = "") -> None:
        from engine import review

        review.set_verdict(self.services.catalog, item_id, sentence_index, verdict, note)

    def set_review_position(self, session, position: int) -> None:
        from engine import review

        review.set_position(self.services.catalog, session, position)

    def review_progress(self, session) -> tuple[int, int]:
        from engine import review

        return review.progress(self.services.catalog, session)

    def check_export_path(self, dest: str, inputs: list[str] = ()) -> str:
        """The export path when it may be written (not an input, a photo or inside a library),
        else the engine's OutputPathError naming it: the same guard as the CLI's outputs."""
        from engine.outputs import check_output

        roots = [lib.root for lib in self.services.catalog.libraries()]
        return str(check_output(dest, what="export", kind="export", inputs=inputs, library_roots=roots))

    def export_folder_for(self, picture: str) -> str:
        """Where a save dialog for a file about `picture` opens: next to it, or next to its photo
        folder when it lies in a library (an export is never written into one)."""
        from engine.outputs import nearest_output_folder

        return str(nearest_output_folder(picture, [lib.root for lib in self.services.catalog.libraries()]))

    def export_review(self, session, dest: str) -> int:
        from engine import review

        self.check_export_path(dest, [session.caption_file])
        return review.export_session(self.services.catalog, session, dest)

    def catalog_caption_file(self) -> str:
        """The captions already in the catalogue (each picture's XMP description, else its title)
        as a caption file in this home, for Review to open: the same captions and checks as
        `longlens check --from-catalog` (a NoCatalogCaptionsError when there is none)."""
        from engine.metadata.captions import catalog_caption_file

        return str(catalog_caption_file(self.services.catalog, self.paths.data))

    @staticmethod
    def xmp_conventions() -> tuple[str, ...]:
        """The sidecar naming conventions an XMP export accepts (engine.xmp_export.CONVENTIONS)."""
        from engine.xmp_export import CONVENTIONS

        return CONVENTIONS

    @staticmethod
    def xmp_convention_help() -> dict[str, str]:
        """Each convention's sidecar name and the tools that read it, in the CLI's words."""
        from engine.xmp_export import CONVENTION_HELP

        return dict(CONVENTION_HELP)

    @staticmethod
    def xmp_field_summary(summary: Any) -> list[tuple[str, str]]:
        """(field, line) per description/title asked for: "dc:description: written 2, kept: differs 1"."""
        from engine.xmp_export import field_summary

        return field_summary(summary)

    def xmp_export_job(self, caption_file: str, convention: str, keywords: list[str], *,
                       dry_run: bool, texts: dict[str, Any] | None = None) -> Callable[[CancelToken], Iterator[Progress]]:
        """The export of a reviewed caption file's verdicts, notes and these keywords into the
        pictures' XMP sidecars as a job, as `longlens xmp export` runs it: planned first (refused
        with the engine's XmpExportError on a read-only library or bad text options, before
        anything is written), previous sidecars backed up in this home. `texts`: the fields of
        engine.xmp_export.XmpTextOptions (description, title, language, replace_description,
        replace_title). Its last Progress carries the summary in extra["summary"] and the plan in
        extra["plan"]."""
        from engine.xmp_export import XmpTextOptions, export_xmp_job, plan_xmp_export

        def job(token: CancelToken) -> Iterator[Progress]:
            yield Progress("plan", message="reading the review and the sidecars")
            plan = plan_xmp_export(self.services.catalog, caption_file, convention=convention, keywords=keywords,
                                   texts=XmpTextOptions(**(texts or {})))
            for p in export_xmp_job(plan, backup_root=self.paths.data, dry_run=dry_run, cancel=token):
                if "summary" in p.extra:
                    p.extra["plan"] = plan
                yield p

        return job

    @staticmethod
    def verdict_names() -> tuple[str, ...]:
        from engine.review import VERDICTS

        return VERDICTS

    # -- demo -----------------------------------------------------------------
    def demo_setup(self) -> str:
        """Install the demo model and photos; make the demo model the default if none works."""
        from engine.sample_collection import demo_setup

        model, photos, self._demo_query = demo_setup(self.paths)
        if self.model_state().name is None:
            self.save_settings({"default_model": model})
        return str(photos)

    def demo_query(self) -> str:
        from engine.sample_collection import DEMO_QUERY

        return getattr(self, "_demo_query", DEMO_QUERY)


def resolve_paths(home: str | None = None):
    """The engine's data locations ($LONGLENS_HOME or the platform's folders)."""
    from engine.config import get_paths

    return get_paths(home).ensure()


def date_text(hit: Any) -> str | None:
    """A result's date in words, saying whether it is the EXIF date or the file time."""
    from engine.catalog.dates import describe_date

    date = getattr(hit, "date", None) or getattr(hit, "exif_date", None)
    if not date:
        return None
    return describe_date(date, getattr(hit, "date_source", None) or "exif")


def display_text(path: str) -> str:
    """A path as text Qt can show: undecodable bytes of a file name become U+FFFD."""
    from engine.catalog.paths import for_display

    return for_display(path)


def installation_self_test(home: str, cancel: CancelToken | None = None) -> Iterator[Progress]:
    """The engine's installation self-test (engine.selftest) for `--self-test`, all data under `home`.

    The last Progress carries the report in extra["report"]; a failure raises a LonglensError
    whose message says which step failed.
    """
    from engine.selftest import self_test_job

    return self_test_job(Path(home), cancel=cancel)
