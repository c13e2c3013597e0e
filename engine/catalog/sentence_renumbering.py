"""Schema 4: sentence verdicts renumbered from the review's old sentence split to the one splitter.

Up to schema 3, review numbered a caption's sentences with its own simple split (every . ! ? …
followed by a space ended a sentence); since schema 4 review, the grounder and datagen share
engine.text.sentences, which keeps "Dr. Smith", "e.g. a terrier" and "U.S." inside their
sentence. A verdict stored on sentence i of the old split is moved to the sentence(s) of the new
split that hold the same text, so no annotator's judgement is lost or lands on another sentence:

* old sentences merged into one new sentence: the new sentence gets the strictest of their
  verdicts (unfaithful > unsure > faithful: a sentence is faithful only if every part was) and
  all their notes;
* an old sentence cut into several new ones: each part keeps "faithful" or "unsure"; "unfaithful"
  becomes "unsure" on each part, with a note, since the old verdict does not say which part was
  wrong.

Captions whose two splits agree (the great majority) are not touched. A verdict whose caption is
no longer in any review item cannot be re-split and is kept as it is.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from sqlalchemy.engine import Connection

# The review's split as it was up to schema 3, frozen here: the migration must keep reading old
# numbering the same way whatever the splitter becomes later.
_V3_SENTENCE_END = re.compile(r"[.!?…]+[\"'”’)\]]*(?=\s)")
_RANK = {None: 0, "faithful": 1, "unsure": 2, "unfaithful": 3}
SPLIT_NOTE = "renumbered: was 'unfaithful' on a longer sentence that now splits here"


def v3_sentence_spans(text: str) -> list[tuple[int, int]]:
    """The sentence spans review used up to catalog schema 3 (whitespace trimmed)."""
    spans, start = [], 0
    for m in _V3_SENTENCE_END.finditer(text):
        spans.append((start, m.end()))
        start = m.end()
    spans.append((start, len(text)))
    out = []
    for s, e in spans:
        while s < e and text[s].isspace():
            s += 1
        while e > s and text[e - 1].isspace():
            e -= 1
        if e > s:
            out.append((s, e))
    return out


def _overlaps(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def renumber(old: Sequence[tuple[int, int]], new: Sequence[tuple[int, int]],
             stored: dict[int, tuple[str | None, str, float]]) -> dict[int, tuple[str | None, str, float]]:
    """Verdicts {old index: (verdict, note, updated_at)} moved onto the new spans' indexes."""
    out: dict[int, tuple[str | None, str, float]] = {}
    for j, span in enumerate(new):
        parts = [i for i in sorted(stored) if i < len(old) and _overlaps(old[i], span)]
        if not parts:
            continue
        verdict: str | None = None
        notes: list[str] = []
        updated = 0.0
        for i in parts:
            v, note, at = stored[i]
            pieces = sum(1 for s in new if _overlaps(old[i], s))
            if v == "unfaithful" and pieces > 1:
                v = "unsure"
                note = f"{note} ({SPLIT_NOTE})" if note else SPLIT_NOTE
            if _RANK[v] > _RANK[verdict]:
                verdict = v
            if note and note not in notes:
                notes.append(note)
            updated = max(updated, at)
        out[j] = (verdict, " / ".join(notes), updated)
    return out


def migrate_sentence_verdicts(conn: Connection) -> None:
    """The schema-4 step (runs inside the migration's transaction, after a backup was taken)."""
    from engine.text.sentences import split_sentences

    captions = dict(conn.exec_driver_sql(
        "SELECT caption_hash, caption FROM review_items GROUP BY caption_hash").all())
    rows = conn.exec_driver_sql(
        "SELECT id, image_key, caption_hash, sentence_index, verdict, note, updated_at FROM verdicts "
        "WHERE sentence_index IS NOT NULL ORDER BY image_key, caption_hash, sentence_index").all()
    groups: dict[tuple[str, str], list] = {}
    for row in rows:
        groups.setdefault((row[1], row[2]), []).append(row)
    for (image, cap_hash), group in groups.items():
        text = captions.get(cap_hash)
        if text is None:
            continue  # no caption to re-split: kept as stored
        old, new = v3_sentence_spans(text), split_sentences(text)
        if old == new:
            continue
        stored = {int(r[3]): (r[4], r[5], float(r[6])) for r in group}
        moved = renumber(old, new, stored)
        conn.exec_driver_sql(f"DELETE FROM verdicts WHERE id IN ({','.join('?' * len(group))})",
                             tuple(r[0] for r in group))
        for j, (verdict, note, updated) in sorted(moved.items()):
            conn.exec_driver_sql(
                "INSERT INTO verdicts (image_key, caption_hash, sentence_index, verdict, note, updated_at) "
                "VALUES (?, ?, ?, ?, ?, ?)", (image, cap_hash, j, verdict, note, updated))
