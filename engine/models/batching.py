"""Batches of texts of similar length: less compute spent on padding. One rule for every encoder
(the backends' encode_texts, the LM-tower feature caches, the lexical-shift evaluation)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence


def length_order(lengths: Sequence[int]) -> list[int]:
    """Indices sorted by length (stable: equal lengths keep their input order)."""
    return sorted(range(len(lengths)), key=lambda i: lengths[i])


def length_sorted_batches(lengths: Sequence[int], batch: int) -> Iterator[list[int]]:
    """Index batches of at most `batch`, shortest first; the caller writes each batch's results at
    its indices, which restores the input order."""
    order = length_order(lengths)
    for start in range(0, len(order), batch):
        yield order[start : start + batch]
