"""The CLIP family's queries tokenized as open_clip's own tokenizer tokenizes them (checklist class
45), on the 360 varied texts of tests/engine/text_variants.py, at CLIP's 77 and Long-CLIP's 248
tokens, through the path search takes (clean_query, then the embedder's tokenize and token_count).

open_clip_torch is installed without its dependencies (`pip install --no-deps
open_clip_torch==3.3.0`): `import open_clip` needs torchvision, which has no build beside the
pinned torch. Its tokenizer.py needs only ftfy, regex, numpy and torch, so it is loaded here on its
own, by file path, with the BPE file it ships. Marked interop: the package is not in
requirements.lock; a missing one fails the test (make test-interop installs it)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from engine.backends.clip.checkpoints import CLIP_EOS_ID  # noqa: E402
from engine.search.searcher import clean_query  # noqa: E402
from tests.engine.text_variants import variant_texts  # noqa: E402

pytestmark = pytest.mark.interop

OPEN_CLIP_INSTALL = "pip install --no-deps open_clip_torch==3.3.0"


@pytest.fixture(scope="module")
def open_clip_tokenizer() -> ModuleType:
    spec = importlib.util.find_spec("open_clip")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail(f"open_clip_torch is not installed; these tests compare against its tokenizer ({OPEN_CLIP_INSTALL})")
    path = Path(next(iter(spec.submodule_search_locations))) / "tokenizer.py"
    module_spec = importlib.util.spec_from_file_location("open_clip_tokenizer_under_test", path)
    assert module_spec is not None and module_spec.loader is not None, path
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)  # builds its SimpleTokenizer from the bundled BPE file
    return module


def _upstream(tokenizer: ModuleType, texts: list[str], context: int) -> list[list[int]]:
    """open_clip's tokenize (OpenAI's truncation: the last kept id becomes <|endoftext|>), unpadded."""
    rows = tokenizer.tokenize(texts, context_length=context)
    return [row[: row.tolist().index(CLIP_EOS_ID) + 1].tolist() for row in rows]


def _ours(embedder, texts: list[str]) -> list[list[int]]:
    enc = embedder.tokenize(texts)
    return [row[mask.bool()].tolist() for row, mask in zip(enc["input_ids"], enc["attention_mask"], strict=True)]


@pytest.mark.parametrize("checkpoint, context", [("clip_b16_tiny_checkpoint", 77), ("longclip_b_tiny_checkpoint", 248)])
def test_queries_tokenize_as_open_clip_tokenizes_them(open_clip_tokenizer, checkpoint, context, request):
    from engine.backends.clip.embedder import ClipEmbedder

    embedder = ClipEmbedder(request.getfixturevalue(checkpoint), device="cpu", dtype="float32")
    assert embedder.default_text_tokens == context
    named = variant_texts()
    texts = [t for _, t in named]
    expected = _upstream(open_clip_tokenizer, texts, context)
    queries = [clean_query(t) for t in texts]
    differ = [(name, t) for (name, t), ours, up in zip(named, _ours(embedder, queries), expected, strict=True)
              if ours != up]
    assert differ == [], f"{len(differ)} of {len(texts)} differ, e.g. {differ[:3]}"
    # The counter: open_clip's untruncated length, special tokens included.
    untruncated = _upstream(open_clip_tokenizer, texts, 10_000)
    assert [embedder.token_count(q) for q in queries] == [len(ids) for ids in untruncated]
    # Before the cleaning the bare Hugging Face tokenizer agreed on far fewer (182 of 360).
    bare = embedder.tokenizer(queries, truncation=True, max_length=context)["input_ids"]
    assert sum(b == up for b, up in zip(bare, expected, strict=True)) < 0.6 * len(texts)
