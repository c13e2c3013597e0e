"""The one sentence splitter (engine.text.sentences): review, the chunker and datagen agree."""

from __future__ import annotations

import json

from engine import review
from engine.datagen import parsing
from engine.grounding.chunking import chunk
from engine.grounding.chunking import split_sentences as chunker_split
from engine.text.sentences import sentence_texts, split_sentences

# The text: review used to make 4 sentences of it (at "Dr." and "e.g."), the chunker 2,
# so the Review panel tinted row 2 with sentence 2's support and rows 3-4 with none.
TEXT = "Dr. Smith walks a red dog. The dog, e.g. a terrier, sits near a bench."
EXPECTED = ["Dr. Smith walks a red dog.", "The dog, e.g. a terrier, sits near a bench."]


def test_review_chunker_and_splitter_agree_on_abbreviations():
    spans = split_sentences(TEXT)
    assert [TEXT[s:e] for s, e in spans] == EXPECTED
    assert review.split_sentences(TEXT) == spans
    assert chunk(TEXT).sentences == spans
    assert chunker_split(TEXT) == spans
    assert parsing.split_sentences(TEXT) == EXPECTED
    assert sentence_texts(TEXT) == EXPECTED


def test_review_item_sentences_are_the_grounders(tmp_path):
    from PIL import Image

    img = tmp_path / "a.png"
    Image.new("RGB", (8, 8)).save(img)
    f = tmp_path / "c.jsonl"
    f.write_text(json.dumps({"image": "a.png", "caption": TEXT}) + "\n", encoding="utf-8")
    cf = review.load_caption_file(f)
    assert [it.caption for it in cf.items] == [TEXT]
    assert review.split_sentences(cf.items[0].caption) == chunk(TEXT).sentences


def test_chunk_uses_given_sentence_spans():
    given = [(0, 9), (10, 26), (27, len(TEXT))]
    c = chunk(TEXT, sentences=given)
    assert c.sentences == given
    assert all(given[si][0] <= p.start and p.end <= given[si][1]
               for p, si in zip(c.phrases, c.phrase_sentence, strict=True))


def test_run_on_sentences_are_cut_only_with_a_limit():
    text = ("a dog, " * 100).strip()
    assert len(split_sentences(text, max_chars=None)) == 1
    assert len(split_sentences(text)) > 1
    assert all(e - s <= 400 for s, e in split_sentences(text))
