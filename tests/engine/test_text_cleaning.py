"""Text read as each model was trained (issue 27 point 13, checklist class 45): every backend
declares its text cleaning, and the CLIP family's embedders clean queries, token counts and
training texts as OpenAI's simple_tokenizer.py (open_clip, Long-CLIP) cleaned their captions:
ftfy.fix_text, HTML entities unescaped twice, whitespace collapsed, lower case.

Checked here against the transcription of OpenAI's tokenizer in tests/engine/clip_reference.py on
the 360 varied texts of tests/engine/text_variants.py; tests/engine/test_open_clip_tokenizer.py
(marker interop) checks the same against open_clip's own tokenizer module."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from engine.errors import QueryError  # noqa: E402
from engine.models import registry  # noqa: E402
from engine.models.tokenizers import (  # noqa: E402
    LM_TOKENIZER_NORMALISER,
    OPENAI_CLIP_CLEANING,
    WORDPIECE_NORMALISER,
    TextCleaning,
)
from engine.search.searcher import clean_query  # noqa: E402
from tests.engine.clip_reference import OpenAIBPE  # noqa: E402
from tests.engine.text_variants import VARIANTS, variant_texts  # noqa: E402

# The issue's example: a sentence typed with a full-width input method, and its ASCII twin.
FULL_WIDTH = "ａ　ｄｏｇ’ｓ　ｂａｌｌ　ｏｎ　ｔｈｅ　ｇｒａｓｓ，　ｎｅａｒ　ａ　ｗｏｏｄｅｎ　ｂｅｎｃｈ"
ASCII = "a dog's ball on the grass, near a wooden bench"


@pytest.fixture(scope="module")
def clip(clip_b16_tiny_checkpoint: Path):
    from engine.backends.clip.embedder import ClipEmbedder

    return ClipEmbedder(clip_b16_tiny_checkpoint, device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def longclip(longclip_b_tiny_checkpoint: Path):
    from engine.backends.clip.embedder import ClipEmbedder

    return ClipEmbedder(longclip_b_tiny_checkpoint, device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def reference_ids() -> list[list[int]]:
    """OpenAI's tokenizer's ids of every variant text, untruncated (the transcription is slow)."""
    reference = OpenAIBPE()
    return [reference.tokenize(t, 10_000) for _, t in variant_texts()]


def _truncated(ids: list[int], context: int) -> list[int]:
    """clip.tokenize(..., truncate=True) / longclip.tokenize's cut: the last kept id becomes <|endoftext|>."""
    return ids if len(ids) <= context else [*ids[: context - 1], ids[-1]]


def _ids(embedder, texts: list[str], max_tokens: int | None = None) -> list[list[int]]:
    enc = embedder.tokenize(texts, max_tokens)
    return [row[mask.bool()].tolist() for row, mask in zip(enc["input_ids"], enc["attention_mask"], strict=True)]


# ------------------------------------------------------------------ declarations


def test_every_backend_declares_its_cleaning_and_its_embedders_apply_that_one():
    from engine.backends.blip.embedder import BlipEmbedder
    from engine.backends.clip.embedder import ClipEmbedder
    from engine.backends.sceneworld_mini.embedder import SceneWorldMiniEmbedder

    declared = {name: registry.get_backend(name).text_cleaning for name in ("clip", "blip", "sceneworld-mini")}
    assert all(isinstance(c, TextCleaning) for c in declared.values())
    assert declared == {"clip": OPENAI_CLIP_CLEANING, "blip": WORDPIECE_NORMALISER,
                        "sceneworld-mini": WORDPIECE_NORMALISER}
    # The embedder's cleaning is its backend's object (nothing else picks one by a backend's name).
    for cls in (ClipEmbedder, BlipEmbedder, SceneWorldMiniEmbedder):
        assert cls.text_cleaning is registry.get_backend(cls.backend).text_cleaning


def test_the_openai_cleaning_step_by_step():
    clean = OPENAI_CLIP_CLEANING
    assert clean("A Dog’s “Ball”") == "a dog's \"ball\""  # ftfy uncurls quotes
    assert clean("fish &amp;amp; chips &lt;3") == "fish & chips <3"  # HTML unescaped twice
    # ftfy unescapes entities only in text without "<"; then the two html.unescape calls, no more:
    # cleaning is not idempotent, so it must run once.
    assert clean("x &amp;amp;amp; <y>") == "x &amp; <y>" and clean(clean("x &amp;amp;amp; <y>")) == "x & <y>"
    assert clean(FULL_WIDTH) == ASCII  # full-width forms to ASCII, U+3000 to a space
    assert clean("cafÃ© au lait") == "café au lait"  # mojibake (UTF-8 read as Windows-1252)
    assert clean("  the \ufb01nal\t\n\u00a0 \ufb02ight  ") == "the final flight"  # ligatures, whitespace
    assert clean("ΟΔΟΣ") == "οδος"  # Python's lower case: a word-final sigma is ς
    for cleaning in (WORDPIECE_NORMALISER, LM_TOKENIZER_NORMALISER):
        assert cleaning("A Dog’s &amp;  ＢＡＬＬ") == "A Dog’s &amp;  ＢＡＬＬ"  # their tokenizer normalises


# ------------------------------------------------------------------ CLIP against OpenAI's tokenizer


@pytest.mark.parametrize("which, context", [("clip", 77), ("longclip", 248)])
def test_clip_family_tokenizes_every_variant_as_openais_tokenizer(which, context, request, reference_ids):
    embedder = request.getfixturevalue(which)
    texts = [t for _, t in variant_texts()]
    assert len(texts) == len(VARIANTS) * 30 == 360
    ours = _ids(embedder, texts)
    expected = [_truncated(ids, context) for ids in reference_ids]
    differ = [(name, t) for (name, t), a, b in zip(variant_texts(), ours, expected, strict=True) if a != b]
    assert differ == []
    # The query path: clean_query first (control characters), then the embedder's cleaning.
    assert _ids(embedder, [clean_query(t) for t in texts]) == expected
    # The GUI's counter counts what search reads.
    assert [embedder.token_count(t) for t in texts] == [len(ids) for ids in reference_ids]


def test_without_the_cleaning_the_variants_would_tokenize_differently(clip, reference_ids):
    """The corpus exercises the cleaning: the bare CLIPTokenizer (what Longlens did before) differs
    from OpenAI's tokenizer on about half of it, in the families the issue names."""
    bare = clip.tokenizer([t for _, t in variant_texts()], truncation=True, max_length=77)["input_ids"]
    differ = {name for (name, _), ids, ref in zip(variant_texts(), bare, reference_ids, strict=True)
              if ids != _truncated(ref, 77)}
    assert {"curly", "html", "full_width", "mojibake", "typography", "scripts"} <= differ


def test_the_issue_examples(clip):
    # 112 tokens before the cleaning (every full-width character is three byte tokens), 14 after.
    assert len(clip.tokenizer(FULL_WIDTH, verbose=False)["input_ids"]) == 112
    assert clip.token_count(FULL_WIDTH) == clip.token_count(ASCII) == 14
    assert _ids(clip, ["a dog’s ball"]) == _ids(clip, ["a dog's ball"])
    assert _ids(clip, ["salt &amp; pepper"]) == _ids(clip, ["salt & pepper"])
    # Cleaned once, as upstream: ftfy leaves entities in text with markup, the two unescapes take
    # two levels off. tokenize, token_count and encode_texts (which sorts batches by length on
    # the cleaned texts) must not clean a second time.
    once = clip.tokenizer(["a &amp; <b>"])["input_ids"]
    assert _ids(clip, ["a &amp;amp;amp; <b>"]) == once != _ids(clip, ["a &amp; <b>"])
    assert clip.token_count("a &amp;amp;amp; <b>") == len(once[0])
    deep, shallow = clip.encode_texts(["a &amp;amp;amp; <b>", "a &amp; <b>"])
    assert not np.allclose(deep, shallow)
    ids = torch.tensor(once)
    with torch.inference_mode():
        expected = torch.nn.functional.normalize(clip.text_features(ids, torch.ones_like(ids)).float(), dim=-1)
    np.testing.assert_allclose(deep, expected[0].numpy(), rtol=0, atol=1e-6)


def test_curly_and_straight_queries_embed_identically(clip):
    vecs = clip.encode_texts(["A dog’s “ball”", "a dog's \"ball\"", FULL_WIDTH, ASCII])
    np.testing.assert_array_equal(vecs[0], vecs[1])
    np.testing.assert_array_equal(vecs[2], vecs[3])


def test_training_reads_texts_cleaned_too(clip_b16_tiny_checkpoint):
    from engine.backends.clip.training import ClipAdapter

    adapter = ClipAdapter.from_checkpoint(clip_b16_tiny_checkpoint, device="cpu", amp=False)
    with torch.no_grad():
        curly, straight = adapter.encode_texts(["A dog’s ball, a cat’s toy", "a dog's ball, a cat's toy"], 77)
        torch.testing.assert_close(curly, straight, rtol=0, atol=0)
        # Phrase pooling reads the offsets of the cleaned text, so the phrases are found in it.
        glob, phrases, valid = adapter.encode_text_phrases(["ＡＮ　ＯＬＤ　ＢＩＫＥ，　ＡＮ　ＩＶＹ　ＷＡＬＬ",
                                                             "an old bike, an ivy wall"], 77)
    torch.testing.assert_close(glob[0], glob[1], rtol=0, atol=0)
    assert bool(valid[0].any()) and torch.equal(valid[0], valid[1])
    torch.testing.assert_close(phrases[0][valid[0]], phrases[1][valid[1]], rtol=0, atol=0)


# ------------------------------------------------------------------ the other towers


def test_blip_reads_texts_through_its_wordpiece_normaliser_only(blip_tiny_checkpoint):
    from engine.backends.blip.embedder import BlipEmbedder

    blip = BlipEmbedder(blip_tiny_checkpoint, device="cpu", dtype="float32")
    assert blip.clean_texts(["A Dog’s &amp;"]) == ["A Dog’s &amp;"]
    # Its normaliser lower-cases and strips accents itself, and drops the zero-width joiner that
    # clean_query now keeps for the CLIP family.
    assert _ids(blip, ["CAFÉ Zürich"]) == _ids(blip, ["cafe zurich"])
    assert _ids(blip, ["family 👨\u200d👩\u200d👧"]) == _ids(blip, ["family 👨👩👧"])


def test_an_lm_text_tower_reads_texts_with_its_own_tokenizer_not_the_clip_cleaning(clip, tmp_path):
    from engine.models import lm_tower as L
    from engine.models.lm_text_side import LMTowerTextSide

    folder = L.save_tower(L.tiny_tower("bert", embed_dim=clip.dim), tmp_path / "tower")
    side = LMTowerTextSide(clip, folder)
    assert side.text_cleaning is LM_TOKENIZER_NORMALISER is L.LMTextTower.text_cleaning
    text = "salt &amp;amp; pepper"
    assert side.token_count(text) == len(side.tower.tokenizer(text)["input_ids"])
    assert side.token_count(text) != side.token_count("salt & pepper")


# ------------------------------------------------------------------ search


def test_clean_query_keeps_zero_width_joiners_but_not_only_them():
    assert clean_query("family 👨\u200d👩\u200d👧\u200b") == "family 👨\u200d👩\u200d👧"
    for text in ("\u200d", " \u200c \u200d ", "\u200b\u200d"):
        with pytest.raises(QueryError, match="empty"):
            clean_query(text)


@pytest.fixture(scope="module")
def clip_search(tmp_path_factory, clip_b16_tiny_checkpoint):
    from engine.config import get_paths
    from engine.models.download import import_model
    from engine.samples import make_sample_folder
    from engine.services import Services
    from tests.reliability.conftest import last_progress

    base = tmp_path_factory.mktemp("cleaning")
    paths = get_paths(str(base / "home")).ensure()
    import_model(clip_b16_tiny_checkpoint, "tinyclip", paths, backend="clip")
    make_sample_folder(base / "photos", n=8, seed=3, size=(64, 48))
    svc = Services(paths)
    embedder = svc.embedder("tinyclip", device="cpu")
    last_progress(svc.indexer(embedder, batch_size=8).run(base / "photos"))
    yield svc.searcher(embedder), embedder
    svc.close()


def test_search_and_its_counter_read_a_curly_query_as_a_straight_one(clip_search):
    from engine.query_budget import token_budget

    searcher, embedder = clip_search
    typed, plain = "ＴＨＥ　ＤＯＧ’Ｓ　ＢＡＬＬ &amp; ＴＨＥ　ＣＡＴ’Ｓ　ＴＯＹ", "the dog's ball & the cat's toy"
    a, b = searcher.search_text(typed, top_k=8), searcher.search_text(plain, top_k=8)
    assert [(h.path, h.score) for h in a.hits] == [(h.path, h.score) for h in b.hits]
    assert a.tokens_total == b.tokens_total == token_budget(embedder, typed).total == embedder.token_count(plain)


def test_a_query_the_models_cleaning_empties_is_refused_as_empty(clip_search):
    searcher, _ = clip_search
    with pytest.raises(QueryError, match="empty"):
        searcher.search_text("&nbsp; &amp;nbsp;", top_k=3)
