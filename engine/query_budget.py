"""How much of a paragraph query the text tower will read: tokens used, budget, and where it cuts.

The search view shows a live counter and marks the part of the text past the budget. Counts
are taken on the query exactly as the searcher cleans it (`clean_query`), so the counter and
the search agree; the cut is reported as a character offset into the text as typed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from engine.errors import QueryError
from engine.models.base import Embedder
from engine.options import token_budget_for
from engine.search.searcher import clean_query

_WORD_END = re.compile(r"\S+")


@dataclass(frozen=True)
class TokenBudget:
    total: int  # tokens of the whole (cleaned) query, special tokens included
    budget: int  # tokens the model reads
    cut_at: int | None  # offset in the typed text where the unread part starts; None if it all fits

    @property
    def used(self) -> int:
        return min(self.total, self.budget)

    @property
    def truncated(self) -> bool:
        return self.total > self.budget


def _count(embedder: Embedder, text: str) -> int:
    try:
        return embedder.token_count(clean_query(text))
    except QueryError:
        return 0  # nothing searchable yet


def token_budget(embedder: Embedder, text: str, max_tokens: int | None = None) -> TokenBudget:
    """Count the tokens of `text` against the budget and find where truncation starts.

    The cut is found by bisection over word ends (O(log words) tokenizer calls), so it stays
    cheap for a 5,000-word paste.
    """
    budget = token_budget_for(max_tokens, embedder.default_text_tokens, embedder.max_text_tokens, embedder.model_id)
    total = _count(embedder, text)
    if total <= budget:
        return TokenBudget(total, budget, None)
    ends = [m.end() for m in _WORD_END.finditer(text)]
    lo, hi = 0, len(ends) - 1  # find the last word end whose prefix fits
    best = -1
    while lo <= hi:
        mid = (lo + hi) // 2
        if _count(embedder, text[: ends[mid]]) <= budget:
            best = mid
            lo = mid + 1
        else:
            hi = mid - 1
    if best < 0:
        cut = 0
    else:
        cut = ends[best]
    # Start the marker at the next word, not at the space before it.
    while cut < len(text) and text[cut].isspace():
        cut += 1
    return TokenBudget(total, budget, cut)
