"""Token budget of a paragraph query: the counter and the truncation marker agree with the search."""

from __future__ import annotations

import pytest

from engine.query_budget import token_budget
from engine.search.searcher import clean_query


@pytest.fixture(scope="module")
def embedder(blip_tiny_checkpoint):
    from engine.backends.blip.embedder import BlipEmbedder

    return BlipEmbedder(blip_tiny_checkpoint, device="cpu")


def test_short_query_fits(embedder):
    b = token_budget(embedder, "A red ball on the grass.")
    assert not b.truncated and b.cut_at is None and b.used == b.total == embedder.token_count("A red ball on the grass.")
    assert token_budget(embedder, "   ").total == 0


def test_cut_marks_the_first_unread_word(embedder):
    text = "  A red ball\n lies on the grass beside a small wooden bench. " * 60
    b = token_budget(embedder, text, max_tokens=32)
    assert b.truncated and b.budget == 32 and b.total == embedder.token_count(clean_query(text))
    cut = b.cut_at
    assert not text[cut].isspace()
    assert embedder.token_count(clean_query(text[:cut])) <= 32
    next_end = cut + len(text[cut:].split()[0])
    assert embedder.token_count(clean_query(text[:next_end])) > 32


def test_budget_over_the_model_is_refused_not_clamped(embedder):
    # Issue 16 item 8: a budget the model cannot take used to be clamped silently to its maximum.
    from engine.options import OptionError

    b = token_budget(embedder, "word " * 2000, max_tokens=embedder.max_text_tokens)
    assert b.budget == embedder.max_text_tokens and b.truncated
    with pytest.raises(OptionError, match="token budget must be at most"):
        token_budget(embedder, "word " * 2000, max_tokens=10_000)
    with pytest.raises(OptionError, match="token budget must be at most"):
        token_budget(embedder, "word " * 2000, max_tokens=embedder.max_text_tokens + 1)
