"""Phrase chunking: sentences and phrases with character spans, measured against SceneWorld's
generator annotations and checked for robustness on odd input."""

from __future__ import annotations

import time

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.grounding.chunking import MAX_SENTENCE_CHARS, chunk, split_sentences
from engine.sceneworld import generate_scenes


def _spans_ok(text: str) -> None:
    c = chunk(text)
    prev_end = 0
    for s, e in c.sentences:
        assert prev_end <= s < e <= len(text)
        assert text[s:e] == text[s:e].strip()
        assert e - s <= MAX_SENTENCE_CHARS
        prev_end = e
    assert len(c.phrase_sentence) == len(c.phrases)
    for p, si in zip(c.phrases, c.phrase_sentence, strict=True):
        assert text[p.start:p.end] == p.text and p.text
        s, e = c.sentences[si]
        assert s <= p.start < p.end <= e
        assert p.kind in ("noun_phrase", "setting", "relation")
        if p.kind == "relation":
            assert len(p.args) == 2
            subj, obj = (c.phrases[a] for a in p.args)
            assert subj.kind == obj.kind == "noun_phrase"
            assert p.claim.endswith(obj.text)


def test_recovers_sceneworld_phrases_and_sentences():
    """Against the generator's own spans on 100 evaluation scenes (paragraphs and captions)."""
    hit = {"object": [0, 0], "relation": [0, 0]}
    sentences_exact = 0
    scenes = generate_scenes(1000, 0, 100)
    for s in scenes:
        for t in [s.paragraph, *s.positives]:
            got = {(p.start, p.end): p for p in chunk(t.text).phrases}
            for p in t.phrases:
                if p.kind in hit:
                    hit[p.kind][1] += 1
                    q = got.get((p.start, p.end))
                    hit[p.kind][0] += q is not None and q.kind == ("relation" if p.kind == "relation" else "noun_phrase")
        sentences_exact += split_sentences(s.paragraph.text) == [(x.start, x.end) for x in s.paragraph.sentences]
    assert hit["object"][0] / hit["object"][1] >= 0.97
    assert hit["relation"][0] / hit["relation"][1] >= 0.95
    assert sentences_exact == len(scenes)


def test_phrases_with_modifiers_and_relations():
    text = ("A small green umbrella with polka dots sits in the upper right, right of the big black basket. "
            "Down on the left, we see an orange flower that is small and plain. "
            "On the right of the small white box rests the red heart.")
    c = chunk(text)
    nouns = [p.text for p in c.phrases if p.kind == "noun_phrase"]
    assert nouns == ["A small green umbrella with polka dots", "the big black basket",
                     "an orange flower that is small and plain", "the small white box", "the red heart"]
    rels = [p for p in c.phrases if p.kind == "relation"]
    assert [r.text for r in rels] == ["right of", "On the right of"]
    # The fronted relation's subject is the phrase after its object.
    assert rels[1].claim == "the red heart on the right of the small white box"
    assert rels[0].claim == "A small green umbrella with polka dots right of the big black basket"
    # Positions ("the upper right", "the left") are not things to find: no phrase for them.
    assert not any("upper right" in p.text or p.text == "the left" for p in c.phrases)


def test_everyday_english():
    c = chunk("A red ball lies on the grass, next to a wooden bench. Behind the bench stands a tall tree "
              "and two white clouds drift across the sky.")
    nouns = [p.text for p in c.phrases if p.kind == "noun_phrase"]
    assert nouns == ["A red ball", "a wooden bench", "the bench", "a tall tree", "two white clouds"]
    assert [p.text for p in c.phrases if p.kind == "setting"] == ["the grass", "the sky"]
    c = chunk("A man with a hat is sitting on a red and white striped chair near the window.")
    assert "a red and white striped chair" in [p.text for p in c.phrases]


def test_sentence_splitting_edge_cases():
    text = ("Dr. Smith holds a cup, e.g. a latte. The U.S. flag is 3.5 m wide! Is it a dog? No. "
            "- a red car\n- a blue bike\n\nLast one")
    got = [text[s:e] for s, e in split_sentences(text)]
    assert got == ["Dr. Smith holds a cup, e.g. a latte.", "The U.S. flag is 3.5 m wide!", "Is it a dog?",
                   "No.", "- a red car", "- a blue bike", "Last one"]


def test_empty_and_symbol_only_input():
    for text in ["", "   ", "...!!!", "\n\n", "😀😀"]:
        c = chunk(text)
        assert c.sentences == [] and c.phrases == []


def test_long_input_is_bounded_and_fast():
    long_run_on = "a red ball next to a blue cup and " * 2000  # 68k characters, no full stop
    t0 = time.perf_counter()
    c = chunk(long_run_on)
    assert time.perf_counter() - t0 < 10
    assert all(e - s <= MAX_SENTENCE_CHARS for s, e in c.sentences)
    assert len(c.sentences) > 100
    _spans_ok(long_run_on)
    _spans_ok("x" * 5000)


def test_deterministic():
    text = generate_scenes(1000, 7, 1)[0].paragraph.text
    assert chunk(text) == chunk(text)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=300))
def test_any_text_gives_valid_spans(text):
    _spans_ok(text)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from(["a", "the", "red", "ball", "cup", "is", "on", "left", "of", "that",
                                 "small", "and", "with", "stripes", ",", ".", "two", "next", "to", "\n"]),
                max_size=60))
def test_word_salad_gives_valid_spans(words):
    _spans_ok(" ".join(words))


FUNCTION_WORDS = frozenset("in on at with of by to from into onto under over above below behind near "
                           "next the a an and or is are it there this that".split())


def test_function_words_are_no_phrases():
    """What a person is shown for a phrase (its claim) is never a bare function word: a relation's
    span ("In", "with", "on") is shown as the claim it makes, with both of its sides."""
    texts = ["In the desert with orange dunes, a camel stands on the sand.",
             "A dog with a red ball sits on a beach.",
             "On the table, a cup stands with a spoon in it. In front of the cup lies a key.",
             "In the picture there is a cat on a mat with a hat.",
             "With a smile, on and on, in it, at that."]
    for text in texts:
        c = chunk(text)
        for p in c.phrases:
            words = p.claim.lower().replace(",", " ").split()
            assert any(w not in FUNCTION_WORDS for w in words), (text, p)
            if p.kind == "relation":
                subj, obj = (c.phrases[a] for a in p.args)
                assert p.claim.startswith(subj.text) and p.claim.endswith(obj.text)
                assert len(words) > len(p.text.split())  # more than the relation's own words


def test_settings_have_their_own_kind_and_no_relation():
    c = chunk("In the desert with orange dunes, a camel stands next to a palm tree. "
              "A dog with a red ball sits on a beach under the night sky.")
    kinds = {p.text: p.kind for p in c.phrases}
    assert kinds["the desert with orange dunes"] == "setting"
    assert kinds["a beach"] == kinds["the night sky"] == "setting"
    assert kinds["a camel"] == kinds["a palm tree"] == kinds["A dog"] == kinds["a red ball"] == "noun_phrase"
    claims = [p.claim for p in c.phrases if p.kind == "relation"]
    # "a camel in the desert", "a red ball on a beach": nothing a map can check beyond both being there.
    assert claims == ["a camel next to a palm tree", "A dog with a red ball"]
    # The subject of a relation after a fronted setting is the thing, not the setting.
    c = chunk("On a sandy beach next to a blue bucket lies a red spade.")
    assert [p.claim for p in c.phrases if p.kind == "relation"] == ["a red spade next to a blue bucket"]
