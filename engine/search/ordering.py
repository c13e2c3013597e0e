"""What is shown of a ranking, and in which order: the relevance cut-off, then the result order.

The cut-off is relative to the query, never a fixed score: a fixed similarity threshold does
not carry from one query (or model) to the next, which is why immich turned one down (PR
#21537: "the appropriate distance threshold varies significantly by query and model"). Here
the best result of *this* query sets the bar: a result is kept when its score is at least
`best - delta`, where score is the ANN cosine similarity each hit shows (after re-ranking too,
so the cut is made on the number the user sees in the score column). The top `top_k` results
are looked at; the cut-off only ever shows fewer.

The order then arranges the kept results: by relevance (the ranking as it is), or by the
picture's date (engine.catalog.dates: the EXIF date, else the XMP or IPTC date, else the file time), newest or oldest
first, ties in relevance order. Ranks stay the relevance ranks, so a date-ordered list still
says how well each picture matched.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from engine.catalog.dates import whole_date
from engine.options import RELEVANCE_CUTOFF, RESULT_ORDER
from engine.types import SearchHit, SearchResult


@dataclass(frozen=True)
class Cutoff:
    delta: float  # how far below the best score a result may be
    best: float  # the best result's score
    threshold: float  # best - delta: the lowest score kept
    kept: int  # results at or above the threshold
    below: int  # results looked at that fell below it (not shown)

    def text(self) -> str:
        """Where the results were cut, and why, in a person's words."""
        head = (f"{self.kept} result{'s' if self.kept != 1 else ''} above the cut-off: score at least "
                f"{self.threshold:.4f} (within {self.delta:g} of the best, {self.best:.4f})")
        if self.below:
            return f"{head}; {self.below} below it not shown"
        return f"{head}; none of the results looked at fell below it (ask for more results to look further)"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def apply_cutoff(hits: list[SearchHit], delta: float | None) -> tuple[list[SearchHit], Cutoff | None]:
    """The hits whose score is >= best score - delta (their order kept), and where it cut."""
    if delta is None:
        return hits, None
    delta = float(RELEVANCE_CUTOFF.check(delta))
    if not hits:
        return hits, Cutoff(delta, 0.0, 0.0, 0, 0)
    best = max(h.score for h in hits)
    threshold = best - delta
    kept = [h for h in hits if h.score >= threshold]
    return kept, Cutoff(delta, best, threshold, len(kept), len(hits) - len(kept))


def order_hits(hits: list[SearchHit], order: str) -> list[SearchHit]:
    """The hits in `order` (RESULT_ORDER); a hit without a date goes last either way."""
    RESULT_ORDER.check(order)
    if order == "relevance":
        return list(hits)
    newest = order == "date-new"
    dated = sorted((h for h in hits if h.date), key=lambda h: h.rank)
    # A partial date ("2023-06") sorts at the start of its period, as the date filter takes it.
    dated.sort(key=lambda h: whole_date(h.date or ""), reverse=newest)  # stable: equal dates stay in rank order
    return dated + [h for h in hits if not h.date]


def arrange(result: SearchResult, order: str = "relevance", cutoff: float | None = None) -> SearchResult:
    """Apply the cut-off, then the order, to `result` (in place; returned for convenience)."""
    kept, cut = apply_cutoff(result.hits, cutoff)
    result.hits = order_hits(kept, order)
    result.order = order
    result.cutoff = cut
    return result
