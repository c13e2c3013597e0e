"""The CLIP bench function on the tiny architectures: it runs the registry's fast path, encodes a
query of exactly the model's token limit, and reports a row per architecture (no speed is asserted)."""

from __future__ import annotations

from engine.backends.clip.bench import cpu_speed, markdown, query_of


def test_bench_rows_for_clip_and_longclip(tmp_path):
    rows = [cpu_speed(name, "tiny", images=2, query_reps=1, work=tmp_path) for name in ("clip-b16", "longclip-b")]
    assert [r["text_tokens"] for r in rows] == [77, 248]
    for r in rows:
        assert r["images"] == 2 and r["images_per_s"] > 0 and r["query_ms_median"] > 0
        assert r["query_threads"] == 1 and r["compute_dtype"] in ("bfloat16", "float32")
    table = markdown(rows)
    assert table.count("\n") == 4 and "| longclip-b | tiny |" in table
    assert not list(tmp_path.iterdir())  # the random checkpoints are removed


def test_query_of_hits_the_limit_exactly(longclip_b_tiny_checkpoint):
    from engine.backends.clip.embedder import ClipEmbedder

    emb = ClipEmbedder(longclip_b_tiny_checkpoint, device="cpu")
    for n in (5, 77, 248):
        assert emb.token_count(query_of(emb, n)) == n
