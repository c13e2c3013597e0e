"""engine.sceneworld.lexical_shift and engine.evaluation.lexical_shift: the table shares no content
word with the grammar, rewrites are deterministic and stay true of the scene graph, reordered and
merged variants keep the sentences, and `longlens dev lexical-shift` writes its section."""

from __future__ import annotations

import json
import re
from collections import Counter
from functools import lru_cache

import numpy as np
import pytest

from engine.sceneworld import generate_scene, generate_scenes
from engine.sceneworld import language as lang
from engine.sceneworld import lexical_shift as ls
from engine.sceneworld.world import COLOURS, KINDS


@lru_cache(maxsize=1)
def _scenes():
    return generate_scenes(1000, 0, 150)


def _vocabulary_tokens() -> set[str]:
    """Words of the grammar's vocabulary classes (what a shifted paragraph must no longer say)."""
    strings: list[str] = [*COLOURS, *(s.noun for s in KINDS.values()), *(s.plural for s in KINDS.values()),
                          *lang.NUMBER_WORDS.values()]
    for table in (lang.SIZE_WORDS, lang.PATTERN_ADJ, lang.PATTERN_NOUN, lang.REL_WORDS, lang.REL_EXTRA_WORDS,
                  lang.POSITION_WORDS, lang.H_POSITION_WORDS, lang.ROW_WORDS, lang.SETTING_DEFINITE):
        strings += [w for words in table.values() for w in words]
    strings += list(lang.SCATTERED_WORDS)
    strings += [w for forms in lang.SETTING_FORMS.values() for pair in forms for w in pair]
    strings += [w for forms in lang.SETTING_DESCRIPTIONS.values() for pair in forms for w in pair]
    words = {t for s in strings for t in re.findall(r"[a-z0-9]+", s.lower())}
    # Frame words that also occur (the verbs;  in a vocabulary entry: "The scene is set in", "has been placed",
    # "One can spot", "The picture shows") (vs "a set of", "has plain walls", "scattered around the
    # scene", the number one, "spread across the picture").
    verbs = {t for v in (*lang.V_SG, *lang.V_PL, *lang.V_INV_SG, *lang.V_INV_PL) for t in v.split()}
    return words - ls.STOP_WORDS - verbs - {"set", "has", "scene", "one", "picture"}


def test_no_alternative_shares_a_content_word_with_the_grammar():
    conflicts = ls.table_conflicts(1000)
    assert set(conflicts) == set(ls.CLASSES)
    assert all(not bad for bad in conflicts.values()), {k: v for k, v in conflicts.items() if v}


@pytest.mark.slow
def test_no_alternative_shares_a_content_word_with_5000_scenes_of_text():
    assert all(not bad for bad in ls.table_conflicts(5000).values())


def test_grammar_words_cover_tables_and_generated_texts():
    words = ls.grammar_words(200)
    assert {"cat", "cats", "red", "striped", "chequered", "beside", "seaside", "altogether", "sits"} <= words
    assert "colour" not in words  # ATTRIBUTE_LEXICON's family tags are not produced text
    assert not {"kitten", "crimson", "plaid", "hamper", "seashore", "pair", "bike", "mug"} & words


def test_every_class_and_value_has_several_alternatives():
    assert set(ls.KIND_ALT) == set(KINDS)
    assert set(ls.COLOUR_ALT) == set(COLOURS)
    assert set(ls.SETTING_ALT) == set(lang.SETTING_FORMS) == set(ls.SCENERY_ALT)
    assert set(ls.RELATION_ALT) == set(lang.REL_WORDS)
    assert set(ls.POSITION_ALT) >= set(lang.POSITION_WORDS)
    for table in (ls.KIND_ALT, ls.COLOUR_ALT, ls.SIZE_ALT, ls.PATTERN_ALT, ls.RELATION_ALT, ls.POSITION_ALT,
                  ls.SETTING_ALT, ls.COUNT_ALT):
        assert all(len(alts) >= 2 for alts in table.values())
    sizes = ls.table_size()
    assert set(sizes) == set(ls.CLASSES) and all(v >= 8 for v in sizes.values())


def test_alternatives_name_one_value_only():
    seen: dict[str, tuple[str, str]] = {}
    for family, table in (("colour", ls.COLOUR_ALT), ("size", ls.SIZE_ALT), ("pattern", ls.PATTERN_ALT),
                          ("relation", ls.RELATION_ALT), ("position", ls.POSITION_ALT)):
        for value, alts in table.items():
            for a in alts:
                assert seen.setdefault(a, (family, str(value))) == (family, str(value)), a
    for kind, alts in ls.KIND_ALT.items():
        for pair in alts:
            for a in pair:
                assert seen.setdefault(a, ("kind", kind)) == ("kind", kind), a


def test_rewrite_is_deterministic_and_depends_on_seed_and_variant():
    s = generate_scene(1000, 7)
    for v in ls.VARIANTS:
        assert ls.lexical_shift_paragraph(s, 0, v) == ls.lexical_shift_paragraph(generate_scene(1000, 7), 0, v)
    texts = {ls.lexical_shift_paragraph(sc, seed) for sc in _scenes()[:20] for seed in (0, 1)}
    assert len(texts) == 40
    assert ls.lexical_shift_paragraph(s, 0, "shift") != ls.lexical_shift_paragraph(s, 0, "shift+reordered")
    with pytest.raises(ValueError):
        ls.lexical_shift_paragraph(s, 0, "nope")


def _check_spans(p):
    for ph in p.phrases:
        assert p.text[ph.start : ph.end] == ph.text
    for sp in p.sentences:
        assert p.text[sp.start : sp.end].endswith(".")


def test_rewritten_paragraph_is_true_of_the_scene_graph():
    vocab = _vocabulary_tokens()
    for scene in _scenes():
        p = ls.rewrite_paragraph(scene, 0)
        _check_spans(p)
        assert len(p.sentences) == len(scene.paragraph.sentences)
        first_mentions: Counter[int] = Counter()
        named: set[int] = set()
        for ph in p.phrases:
            if ph.kind == "object":
                obj = scene.objects[ph.object_ids[0]]
                got = ls.parse_shifted_phrase(ph.text)
                assert got["kind"] == [obj.kind], (ph.text, obj)
                assert got["colour"] == [obj.colour], (ph.text, obj)
                assert got["size"] in ([], [obj.size]), (ph.text, obj)
                assert got["pattern"] in ([], [obj.pattern]), (ph.text, obj)
                assert got["number"] == [str(len(ph.object_ids))], (ph.text, ph.object_ids)
                named.update(ph.object_ids)
                if not got["definite"]:
                    first_mentions.update(ph.object_ids)
            elif ph.kind == "relation":
                allowed = ls.RELATION_ALT[ph.relation] + (ls.INSIDE_VERB_ALT if ph.relation == "inside" else ())
                assert ph.text.lower() in allowed, ph
            else:
                assert ph.text.lower() in {w for form in ls.SETTING_ALT[scene.setting] for w in form[1:]}, ph
        # Every object is named, and introduced exactly once (later mentions are definite).
        assert named == {o.id for o in scene.objects}
        assert set(first_mentions.values()) == {1} and set(first_mentions) == named, (p.text, first_mentions)
        # No word of a grammar vocabulary class is left.
        left = set(re.findall(r"[a-z0-9]+", p.text.lower())) & vocab
        assert not left, (left, scene.paragraph.text, p.text)


def test_one_class_at_a_time_changes_only_that_class():
    scene = _scenes()[3]
    only_colour = ls.rewrite_paragraph(scene, 0, classes=("colour",))
    for ph in only_colour.phrases:
        if ph.kind == "object":
            obj = scene.objects[ph.object_ids[0]]
            assert ls.parse_shifted_phrase(ph.text)["colour"] == [obj.colour]
            assert lang.parse_object_phrase(ph.text)["kind"] == obj.kind  # the grammar's noun
    with pytest.raises(ValueError):
        ls.rewrite_paragraph(scene, 0, classes=("smell",))


def _sentence_texts(p):
    return [p.text[s.start : s.end] for s in p.sentences]


def test_reordered_and_merged_keep_the_sentences():
    for scene in _scenes()[:60]:
        for shifted in (False, True):
            base = ls.rewrite_paragraph(scene, 0) if shifted else scene.paragraph
            r = ls.reorder_sentences(base, np.random.default_rng(5))
            _check_spans(r)
            assert sorted(_sentence_texts(r)) == sorted(_sentence_texts(base))
            if len(base.sentences) > 1:
                assert _sentence_texts(r) != _sentence_texts(base)
            m = ls.merge_sentences(base, np.random.default_rng(5))
            _check_spans(m)
            assert len(m.sentences) == (len(base.sentences) + 1) // 2
            words = Counter(re.findall(r"[a-z0-9]+", base.text.lower()))
            words_m = Counter(re.findall(r"[a-z0-9]+", m.text.lower()))
            del words["and"], words_m["and"]
            assert words == words_m
            assert sorted((ph.kind, ph.object_ids, ph.text.lower()) for ph in m.phrases) == sorted(
                (ph.kind, ph.object_ids, ph.text.lower()) for ph in base.phrases)
        v = ls.shifted_paragraph(scene, 0, "merged")
        assert len(v.sentences) == (len(scene.paragraph.sentences) + 1) // 2


def test_lexical_shift_set():
    items = ls.lexical_shift_set(1000, 4)
    scene, texts = items[2]
    assert scene.index == 2 and set(texts) == {"grammar", *ls.VARIANTS}
    assert texts["grammar"] == scene.paragraph.text and texts["shift"] != texts["grammar"]
    with pytest.raises(ValueError):
        ls.lexical_shift_set(0, 2)  # a training seed


def test_measure_with_any_text_encoder():
    from engine.evaluation.lexical_shift import measure

    scenes = _scenes()[:10]
    images = np.eye(10, 16, dtype=np.float32)
    seen = []

    def encode(texts):  # a perfect "text tower": text i -> image i
        seen.append(len(texts))
        return np.eye(len(texts), 16, dtype=np.float32)

    res = measure(images, scenes, encode, per_class=False)
    assert set(res) == {"grammar", *ls.VARIANTS} and seen == [10] * len(res)
    assert all(r["t2i_R@1"] == 1.0 and r["t2i_median_rank"] == 1.0 for r in res.values())
    with pytest.raises(ValueError):
        measure(images[:3], scenes, encode)


def test_dev_command_writes_its_section(tmp_path):
    from engine.cli import main

    out = tmp_path / "language-towers.md"
    out.write_text("# Language towers\n\nprose\n")
    js = tmp_path / "ls.json"
    assert main(["dev", "lexical-shift", "--n", "20", "--no-per-class", "--out", str(out),
                 "--json-out", str(js)]) == 0
    text = out.read_text()
    assert text.startswith("# Language towers\n\nprose\n")
    assert "<!-- lexical-shift:begin -->" in text and "(b) lexical shift" in text
    m = json.loads(js.read_text())
    assert m["n"] == 20 and set(m["results"]) == {"grammar", *ls.VARIANTS}
    assert main(["dev", "lexical-shift", "--n", "2", "--seed", "5"]) == 2  # a training seed is refused


def test_dev_command_measures_an_lm_tower_folder_in_its_own_section(tmp_path):
    """An LM text-tower folder (lm_tower.json) encodes the texts; images still come from
    sceneworld-mini's vision tower; the report goes to a section of its own."""
    pytest.importorskip("transformers")
    from engine.backends.sceneworld_mini.network import load_model
    from engine.cli import main
    from engine.evaluation.lexical_shift import length_sorted
    from engine.models.lm_tower import save_tower, tiny_tower
    from engine.models.registry import bundled_model_dir

    dim = load_model(bundled_model_dir("sceneworld-mini"), "cpu").cfg.embed_dim
    folder = save_tower(tiny_tower("bert", embed_dim=dim, train_layers=0), tmp_path / "tiny-lm")
    out = tmp_path / "language-towers.md"
    out.write_text("# Language towers\n\n<!-- lexical-shift:begin -->\nbaseline\n<!-- lexical-shift:end -->\n")
    js = tmp_path / "ls.json"
    assert main(["dev", "lexical-shift", "--n", "5", "--no-per-class", "--text-tower", str(folder),
                 "--out", str(out), "--json-out", str(js)]) == 0
    text = out.read_text()
    assert "<!-- lexical-shift:begin -->\nbaseline\n<!-- lexical-shift:end -->" in text  # the baseline stays
    assert "<!-- lexical-shift-tiny-lm:begin -->" in text and "LM tower tiny-bert" in text
    m = json.loads(js.read_text())
    assert m["n"] == 5 and m["text_tower_kind"] == "lm" and set(m["results"]) == {"grammar", *ls.VARIANTS}
    # wrong width: refused
    bad = save_tower(tiny_tower("bert", embed_dim=dim + 1, train_layers=0), tmp_path / "bad-lm")
    with pytest.raises(ValueError, match="projects to"):
        main(["dev", "lexical-shift", "--n", "5", "--no-per-class", "--text-tower", str(bad)])
    # length sorting keeps the input order
    enc = length_sorted(lambda texts: np.array([[len(t)] for t in texts], np.float32))
    assert enc(["ccc", "a", "bb"]).ravel().tolist() == [3.0, 1.0, 2.0]
