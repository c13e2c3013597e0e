"""engine.sceneworld.train_paraphrase: the training-time paraphrase table shares no content word
with the lexical-shift test table (either way, inflections included) nor with the grammar, and
rewriting with it is deterministic and keeps the default (test-table) rewrite unchanged."""

from __future__ import annotations

import pytest

from engine.sceneworld import generate_scenes
from engine.sceneworld import lexical_shift as ls
from engine.sceneworld.train_paraphrase import TRAIN_TABLE


def test_train_and_test_tables_share_no_content_word():
    assert ls.table_overlap(TRAIN_TABLE, ls.TEST_TABLE) == []
    assert ls.table_overlap(ls.TEST_TABLE, TRAIN_TABLE) == []
    # the check itself catches a shared word and an inflection
    assert ls.table_overlap(ls.TEST_TABLE, ls.TEST_TABLE)
    leaky = ls.ParaphraseTable(kind={}, colour={"red": ("crimsons",)}, size={}, pattern={}, pattern_noun={},
                               count={}, definite_count={}, relation={}, inside_verb=(), position={}, setting={},
                               scenery={}, summary=())
    assert ls.table_overlap(leaky, ls.TEST_TABLE) == [("crimsons", "crimson")]


def test_train_table_shares_no_content_word_with_the_grammar():
    assert all(not v for v in ls.table_conflicts(table=TRAIN_TABLE).values())


def test_train_table_covers_the_main_classes_with_every_value():
    assert set(TRAIN_TABLE.covered()) == {"kind", "colour", "size", "pattern", "count", "setting"}
    t, ref = TRAIN_TABLE, ls.TEST_TABLE
    for mine, theirs in ((t.kind, ref.kind), (t.colour, ref.colour), (t.size, ref.size), (t.pattern, ref.pattern),
                         (t.pattern_noun, ref.pattern_noun), (t.count, ref.count),
                         (t.definite_count, ref.definite_count), (t.setting, ref.setting),
                         (t.scenery, ref.scenery)):
        assert set(mine) == set(theirs) and all(mine.values())
    assert all("{s}" in s for alts in t.scenery.values() for s in alts)
    assert all("{n}" in s for s in t.summary)


def test_rewrite_with_train_table_uses_only_its_words():
    test_words = {w for alts in ls.alternatives(ls.TEST_TABLE).values() for alt in alts
                  for w in ls.content_words(alt.replace("{s}", "").replace("{n}", ""))}
    for scene in generate_scenes(0, 0, 40):
        a = ls.rewrite_paragraph(scene, 3, table=TRAIN_TABLE)
        assert a.text == ls.rewrite_paragraph(scene, 3, table=TRAIN_TABLE).text
        assert a.text != scene.paragraph.text
        assert not (ls.content_words(a.text) & test_words), a.text
        for p in a.phrases:
            assert a.text[p.start : p.end] == p.text
        # the default is still the test table
        assert ls.rewrite_paragraph(scene, 3).text == ls.rewrite_paragraph(scene, 3, table=ls.TEST_TABLE).text


def test_rewrite_with_an_uncovered_class_is_refused():
    scene = generate_scenes(0, 0, 1)[0]
    with pytest.raises(ValueError, match="does not cover"):
        ls.rewrite_paragraph(scene, 0, classes=["relation"], table=TRAIN_TABLE)


def test_paraphrased_paragraphs_and_the_option():
    from engine.training.lm_tower_sceneworld import build_parser, paraphrased_paragraphs

    scenes = generate_scenes(0, 0, 5)
    rw = paraphrased_paragraphs(scenes, 2, 0)
    assert len(rw) == 2 and all(len(c) == 5 for c in rw)
    assert rw == paraphrased_paragraphs(scenes, 2, 0)
    assert rw[0] != rw[1]
    assert build_parser().parse_args(["--out", "x"]).paraphrase_train == 0
    assert build_parser().parse_args(["--out", "x", "--paraphrase-train", "2"]).paraphrase_train == 2
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--out", "x", "--paraphrase-train", "-1"])
