"""Tokenizers shared across threads (engine.models.tokenizers.ThreadSafeTokenizer).

The desktop app counts a query's tokens on the GUI thread while a background job grounds or
searches with the same embedder. A fast tokenizer sets padding/truncation as state and then
encodes with the GIL released: a second call in between used to strip the first one's padding
("Unable to create tensor ... padding=True", seen in CI). The Rust encoder's padded encode is held
here until the second call's own encode has begun, which makes the race happen every time.
"""

from __future__ import annotations

import copy
import pickle
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.models.registry import bundled_model_dir, load_folder_embedder
from engine.models.tokenizers import ThreadSafeTokenizer, build_bert_uncased_tokenizer, thread_safe

PADDED = ["a red car parked beside the desert with orange dunes and the sand", "a dog", "two people on a bench"]
COUNTED = "the desert with orange dunes, a red car and the sand under a pale sky"


#: How long the held encode waits for the other thread's call (it never comes through the lock).
WAIT_S = 1.0


class HeldEncoder:
    """The Rust tokenizer behind a transformers tokenizer. The first encode made with padding on
    (the call the race breaks) is held until another thread's encode has started (its padding and
    truncation already set), or WAIT_S when none can start; every encode is counted, so
    `most_inside` says how many ran at once. Events, not sleeps: the overlap happens however
    loaded the machine is."""

    def __init__(self, real: Any) -> None:
        object.__setattr__(self, "real", real)
        object.__setattr__(self, "holding", threading.Event())  # the padded encode is being held
        object.__setattr__(self, "arrived", threading.Event())  # another thread's encode began
        object.__setattr__(self, "holder", None)
        object.__setattr__(self, "inside", 0)
        object.__setattr__(self, "most_inside", 0)
        object.__setattr__(self, "count_lock", threading.Lock())

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.real, name, value)

    def _count(self, step: int) -> None:
        with self.count_lock:
            object.__setattr__(self, "inside", self.inside + step)
            object.__setattr__(self, "most_inside", max(self.most_inside, self.inside))

    def encode_batch(self, *args: Any, **kwargs: Any) -> Any:
        me = threading.get_ident()
        self._count(+1)
        try:
            if self.holder is None and self.real.padding is not None:
                object.__setattr__(self, "holder", me)
                self.holding.set()
                self.arrived.wait(WAIT_S)
            elif self.holder is not None and self.holder != me:
                self.arrived.set()
            return self.real.encode_batch(*args, **kwargs)
        finally:
            self._count(-1)


def _held(tokenizer: Any) -> HeldEncoder:
    """Put a HeldEncoder under `tokenizer` (a transformers fast tokenizer, bare or wrapped)."""
    held = HeldEncoder(tokenizer.backend_tokenizer)
    tokenizer._tokenizer = held  # transformers' attribute for the Rust tokenizer
    return held


def _at_once(first: Any, second: Any, held: HeldEncoder) -> list[Any]:
    """Run `first` on a thread and, once its padded encode is held, `second` on another; their
    results, or the exception each raised."""
    results: list[Any] = [None, None]

    def run(i: int, call: Any) -> None:
        try:
            results[i] = call()
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            results[i] = exc

    threads = [threading.Thread(target=run, args=(0, first)), threading.Thread(target=run, args=(1, second))]
    threads[0].start()
    assert held.holding.wait(10), "the first call never made a padded encode"
    threads[1].start()
    for t in threads:
        t.join()
    return results


def _padded_call(tok: Any) -> Any:
    return lambda: tok(PADDED, truncation=True, max_length=32, padding=True, return_tensors="pt")["input_ids"]


def _counting_call(tok: Any) -> Any:
    return lambda: len(tok(COUNTED, add_special_tokens=True, truncation=False, verbose=False)["input_ids"])


def test_a_bare_fast_tokenizer_loses_its_padding_to_a_concurrent_call():
    """The control: without the lock the held race fails the way CI did."""
    tok = build_bert_uncased_tokenizer()
    held = _held(tok)
    padded, _ = _at_once(_padded_call(tok), _counting_call(tok), held)
    assert isinstance(padded, ValueError) and "padding" in str(padded)


def test_the_wrapped_tokenizer_runs_one_call_at_a_time_and_gives_the_serial_results():
    bare = build_bert_uncased_tokenizer()
    expected_ids = _padded_call(bare)()
    expected_count = _counting_call(bare)()
    tok = thread_safe(build_bert_uncased_tokenizer())
    held = _held(tok)
    padded, count = _at_once(_padded_call(tok), _counting_call(tok), held)
    assert not isinstance(padded, Exception), padded
    assert padded.tolist() == expected_ids.tolist() and count == expected_count
    assert held.most_inside == 1


def test_the_wrapper_passes_attributes_through_and_survives_copy_and_pickle(tmp_path):
    tok = thread_safe(build_bert_uncased_tokenizer())
    assert thread_safe(tok) is tok
    assert len(tok) == 30522 and tok.is_fast and tok.pad_token_id == 0
    assert tok.convert_ids_to_tokens([101, 102]) == ["[CLS]", "[SEP]"]
    tok.model_max_length = 77  # set on the tokenizer itself
    assert tok.wrapped.model_max_length == 77
    for twin in (copy.deepcopy(tok), pickle.loads(pickle.dumps(tok))):
        assert isinstance(twin, ThreadSafeTokenizer) and twin.wrapped is not tok.wrapped
        assert twin("a red car")["input_ids"] == tok("a red car")["input_ids"]
    tok.save_pretrained(str(tmp_path / "saved"))
    assert (tmp_path / "saved" / "tokenizer.json").is_file()


def _embedders(blip_tiny_checkpoint, clip_b16_tiny_checkpoint):
    mini = bundled_model_dir("sceneworld-mini")
    yield "sceneworld-mini", load_folder_embedder(mini, "sceneworld-mini", device="cpu")
    yield "blip", load_folder_embedder(blip_tiny_checkpoint, "blip", device="cpu")
    yield "clip", load_folder_embedder(clip_b16_tiny_checkpoint, "clip", device="cpu")
    lm = load_folder_embedder(mini, "sceneworld-mini", device="cpu", text_tower_dir=Path("minilm-k6"))
    yield "minilm-k6", lm


@pytest.mark.usefixtures("one_thread")
def test_every_backends_embedder_encodes_while_another_thread_counts_tokens(blip_tiny_checkpoint,
                                                                            clip_b16_tiny_checkpoint):
    """The GUI's pattern on each backend's real embedder (and a bundled LM reader): the query box
    counts tokens while a job encodes a batch; both give what they give alone."""
    for name, emb in _embedders(blip_tiny_checkpoint, clip_b16_tiny_checkpoint):
        alone = emb.encode_texts(PADDED)
        count_alone = emb.token_count(COUNTED)
        tokenizer = getattr(emb, "tower", emb).tokenizer  # an LM reader keeps its tokenizer on its tower
        held = _held(tokenizer)
        encoded, count = _at_once(lambda e=emb: e.encode_texts(PADDED), lambda e=emb: e.token_count(COUNTED), held)
        assert not isinstance(encoded, Exception), f"{name}: {encoded!r}"
        np.testing.assert_allclose(encoded, alone, atol=1e-6, err_msg=name)
        assert count == count_alone, name
        assert held.most_inside == 1, name
