"""Paragraph or image query -> encode -> ANN per library (over-fetch when filtering) -> catalog -> hits."""

from __future__ import annotations

import time
import unicodedata
from pathlib import Path

import numpy as np

from engine.catalog import Catalog, ImageFilter
from engine.catalog.camera import camera_display
from engine.catalog.catalog import COUNTED_AS_UNRATED, KEPT_BY_FILE_TIME, MISSING_FIELD_RULES
from engine.catalog.dates import picture_date
from engine.errors import DecodeError, QueryError
from engine.index.store import IndexStore
from engine.indexing.decode import decode_image
from engine.models.base import Embedder
from engine.options import RELEVANCE_CUTOFF, RERANK_K, RESULT_ORDER, TOP_K, token_budget_for
from engine.search.ordering import arrange
from engine.text.language import DEFAULT_MODEL_LANGUAGES, language_warning
from engine.types import SearchHit, SearchResult

DEFAULT_TOP_K = 20
DEFAULT_RERANK_K = 32  # candidates re-scored by the backend's re-ranker (engine.models.registry.rerank_scores)

# Format characters a query keeps: the zero-width joiner and non-joiner are part of what is written
# (emoji sequences such as 👨‍👩‍👧, Persian and Indic spellings) and each model's own cleaning decides
# about them (CLIP's BPE reads them, as in its training; BERT's normaliser drops them).
_KEPT_FORMAT_CHARACTERS = frozenset("\u200c\u200d")


def clean_query(text: str) -> str:
    """Drop control characters (keeping line breaks and tabs as spaces, and the zero-width
    joiners) and normalise Unicode. What a model's own code did to its texts before tokenizing
    (ftfy for the CLIP family) is its embedder's text_cleaning, applied after this.

    Raises QueryError for a query with nothing searchable left, so the user gets a
    message instead of the ranking of an empty string.
    """
    if not isinstance(text, str):
        raise QueryError("the query must be text")
    text = unicodedata.normalize("NFC", text)
    kept = []
    for ch in text:
        cat = unicodedata.category(ch)
        if ch in "\n\r\t":
            kept.append(" ")
        elif cat in ("Cc", "Cf", "Cs", "Co", "Cn") and ch not in _KEPT_FORMAT_CHARACTERS:
            continue
        else:
            kept.append(ch)
    cleaned = " ".join("".join(kept).split())
    if not cleaned.strip("".join(_KEPT_FORMAT_CHARACTERS) + " "):
        raise QueryError("the query is empty: type a description of the photos you are looking for")
    return cleaned


def _check_arrangement(order: str, cutoff: float | None) -> None:
    # Checked before the query is encoded: a bad value is refused before any work starts.
    RESULT_ORDER.check(order)
    if cutoff is not None:
        RELEVANCE_CUTOFF.check(cutoff)


_FIELD_WORDS = {"date": ("date filter", "no EXIF, XMP or IPTC date"), "camera": ("camera filter", "no camera recorded"),
                "rating": ("rating filter", "no rating"), "label": ("label filter", "no colour label"),
                "keyword": ("keyword filter", "no keywords"), "gps": ("place filter", "no GPS position")}


def gap_notes(gaps: dict[str, int]) -> list[str]:
    """What a filter did with the pictures that lack its field (catalog.MISSING_FIELD_RULES)."""
    notes = []
    for name, n in gaps.items():
        if not n:
            continue
        what, lacking = _FIELD_WORDS.get(name, (f"{name} filter", f"no {name}"))
        pictures = f"{n} picture{'s' if n != 1 else ''} with {lacking}"
        if MISSING_FIELD_RULES.get(name) == KEPT_BY_FILE_TIME:
            notes.append(f"{what}: {pictures} dated by the file's modification time instead")
        elif MISSING_FIELD_RULES.get(name) == COUNTED_AS_UNRATED:
            notes.append(f"{what}: {pictures} counted as unrated (0)")
        else:
            notes.append(f"{what}: {pictures} left out")
    return notes


class Searcher:
    def __init__(self, catalog: Catalog, store: IndexStore, embedder: Embedder) -> None:
        self.catalog = catalog
        self.store = store
        self.embedder = embedder

    def search_text(
        self,
        text: str,
        top_k: int = DEFAULT_TOP_K,
        flt: ImageFilter | None = None,
        max_tokens: int | None = None,
        rerank: bool | None = False,
        rerank_k: int = DEFAULT_RERANK_K,
        order: str = "relevance",
        cutoff: float | None = None,
    ) -> SearchResult:
        """ANN search, then optionally re-ranking of the top `rerank_k` candidates.

        rerank: False (default for library callers such as the GUI, whose order and scores stay
        the ANN ones), None ("auto": wherever the model supports it: BLIP's ITM head, or
        sceneworld-mini's matching head with alignment) or True (requested; when unsupported, `result.notes` says why). Each
        re-ranked hit keeps its ANN cosine in `score` and gets `rerank_score` and `ann_rank`
        in extra. Then engine.search.ordering: `cutoff` keeps the hits within that much of the
        best score, `order` arranges them (relevance, date-new, date-old)."""
        from engine.models.registry import rerank_support

        _check_arrangement(order, cutoff)
        t0 = time.perf_counter()
        query = clean_query(text)
        cleaning = getattr(self.embedder, "text_cleaning", None)
        if cleaning is not None and not cleaning(query).strip():
            # "&nbsp;" for a CLIP model: nothing is left once the model's own cleaning has run.
            raise QueryError("the query is empty: type a description of the photos you are looking for")
        budget = token_budget_for(max_tokens, self.embedder.default_text_tokens, self.embedder.max_text_tokens,
                                  self.embedder.model_id)
        if rerank is not False:
            RERANK_K.check(rerank_k)
        total = self.embedder.token_count(query)
        vec = self.embedder.encode_texts([query], max_tokens=budget)[0]
        t1 = time.perf_counter()
        available, reason = rerank_support(self.embedder) if rerank is not False else (False, "")
        do_rerank = available and rerank is not False
        result = self.search_vector(vec, max(top_k, rerank_k) if do_rerank else top_k, flt)
        result.tokens_total = total
        result.tokens_used = min(total, budget)
        result.truncated = total > budget
        result.timings_ms["encode"] = (t1 - t0) * 1000
        if do_rerank:
            self._rerank(result, query, budget, rerank_k)
        elif rerank:
            result.notes.append(reason)
        result.hits = result.hits[:top_k]
        warning = language_warning(query, self.embedder.model_id,
                                   tuple(getattr(self.embedder, "query_languages", DEFAULT_MODEL_LANGUAGES)))
        if warning:
            result.warnings.append(warning)
        return arrange(result, order, cutoff)

    def _rerank(self, result: SearchResult, query: str, budget: int, k: int) -> None:
        from engine.models.registry import rerank_scores

        t0 = time.perf_counter()
        head, tail = result.hits[:k], result.hits[k:]
        images, ok = [], []
        for h in head:
            try:
                images.append(decode_image(Path(h.path), target_size=self.embedder.image_size)[0])
                ok.append(h)
            except DecodeError:
                tail.insert(0, h)  # unreadable now (moved, deleted): keeps its ANN place after the rest
        scores = rerank_scores(self.embedder, images, query, [h.score for h in ok], max_tokens=budget) if images else []
        for h, s in zip(ok, scores, strict=True):
            h.extra["ann_rank"] = h.rank
            h.extra["rerank_score"] = float(s)
        ok.sort(key=lambda h: (-h.extra["rerank_score"], h.rank))
        result.hits = ok + tail
        for i, h in enumerate(result.hits, start=1):
            h.rank = i
        result.reranked = len(ok)
        result.timings_ms["rerank"] = (time.perf_counter() - t0) * 1000

    def search_image(self, path: Path | str, top_k: int = DEFAULT_TOP_K, flt: ImageFilter | None = None,
                     order: str = "relevance", cutoff: float | None = None) -> SearchResult:
        _check_arrangement(order, cutoff)
        t0 = time.perf_counter()
        path = Path(path)
        try:
            image, _ = decode_image(path, target_size=self.embedder.image_size)
        except DecodeError as exc:
            raise QueryError(f"cannot use {path} as a query image: {exc}") from exc
        vec = self.embedder.encode_images([image])[0]
        t1 = time.perf_counter()
        result = self.search_vector(vec, top_k, flt)
        result.timings_ms["encode"] = (t1 - t0) * 1000
        return arrange(result, order, cutoff)

    def search_vector(self, vec: np.ndarray, top_k: int, flt: ImageFilter | None = None) -> SearchResult:
        TOP_K.check(top_k)
        # Only vectors of this exact model identity are searched: vectors of a replaced model with
        # the same name live under another key and are never served.
        identity = self.embedder.identity
        t0 = time.perf_counter()
        candidates: list[tuple[float, int, int]] = []  # (score, image id, library id)
        stale_libraries: list[str] = []  # indexed only by another version of this model
        gaps: dict[str, int] = {}  # pictures lacking a filtered field (catalog.MISSING_FIELD_RULES)
        from engine.models.registry import identity_name
        for lib in self.catalog.libraries():
            allowed = None
            if flt is not None and not flt.is_empty():
                for name, n in self.catalog.filter_gaps(lib.id, flt).items():
                    gaps[name] = gaps.get(name, 0) + n
                ids = self.catalog.filtered_ids(lib.id, flt)
                if not ids:
                    continue
                allowed = ids.__contains__
            index = self.store.get(lib.id, identity, self.embedder.dim)
            if len(index) == 0:
                if any(k != identity and identity_name(k) == identity_name(identity)
                       for k in self.catalog.vector_keys(lib.id)):
                    stale_libraries.append(lib.root)
                continue
            ids, scores = index.query(vec[None, :].astype(np.float32), top_k, allowed=allowed)[0]
            candidates.extend((float(s), int(i), lib.id) for i, s in zip(ids, scores, strict=True))
        t1 = time.perf_counter()
        # Global order across libraries: score, then id, the same tie-break as exact search.
        candidates.sort(key=lambda c: (-c[0], c[1]))
        candidates = candidates[:top_k]
        records = self.catalog.images_by_id([c[1] for c in candidates])
        xmp_dates = self.catalog.metadata_dates(i for i, rec in records.items() if not rec.exif_date)
        # The camera EXIF gives when the picture was decoded, else what its metadata says (a RAW's
        # Lightroom sidecar: tiff:Make/Model), one name as every display shows it.
        cameras = self.catalog.metadata_cameras(i for i, rec in records.items()
                                                if not (rec.camera_make or rec.camera_model))
        roots = {lib.id: lib.root for lib in self.catalog.libraries()}
        hits = []
        for score, image_id, _ in candidates:
            rec = records.get(image_id)
            if rec is None:
                continue  # deleted between the ANN query and now
            # The row's own library, read now: an index run may have merged the library the ANN
            # answered for into its parent meanwhile (its rows re-rooted, the old library gone).
            lib_id = rec.library_id
            if lib_id not in roots:
                continue  # its library was removed between the ANN query and now
            camera = camera_display(*cameras.get(image_id, (rec.camera_make, rec.camera_model)))
            when = picture_date(rec.exif_date, rec.mtime_ns, *xmp_dates.get(image_id, (None, None)))
            hits.append(
                SearchHit(
                    rank=len(hits) + 1,
                    image_id=image_id,
                    path=str(Path(roots[lib_id]) / rec.rel_path),
                    score=score,
                    library_id=lib_id,
                    rel_path=rec.rel_path,
                    exif_date=rec.exif_date,
                    camera=camera,
                    date=when.shown,  # a partial date stays partial (ordering sorts by its start)
                    date_source=when.source,
                )
            )
        t2 = time.perf_counter()
        # What opening the indexes found (rebuilt, reconciled, not savable, catalog damaged) is news.
        notes, self.store.notes[:] = list(self.store.notes), []
        result = SearchResult(hits=hits, model_id=self.embedder.model_id, notes=notes,
                              timings_ms={"ann": (t1 - t0) * 1000, "catalog": (t2 - t1) * 1000})
        result.notes.extend(gap_notes(gaps))
        if stale_libraries:
            result.notes.append(
                f"not searched: {', '.join(stale_libraries)} (indexed with an earlier version of model "
                f"{self.embedder.model_id!r}, whose files have changed since); index them again to search them"
            )
        return result
