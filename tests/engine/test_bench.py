"""`longlens bench --quick` end to end (real files, real SQLite catalog, a real subprocess for the
memory figure) and the GPU script's code path on the CPU. No timing is asserted: only that every
section is there, well-formed and positive, and that the Markdown block is written."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _positive(value: object) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str]:
    work = tmp_path_factory.mktemp("bench")
    out = work / "benchmarks.md"
    out.write_text("# Benchmarks\n\n<!-- other:begin -->\nkept\n<!-- other:end -->\n", encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, "-m", "engine.cli", "--home", str(work / "home"), "bench", "--quick", "--json",
         "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=600, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout), out.read_text(encoding="utf-8")


def test_quick_bench_json_has_every_section_with_positive_figures(quick_run):
    result, _ = quick_run
    assert result["quick"] is True
    assert result["machine"]["cores"] >= 1
    enc = result["encode"]
    for name in ("camera", "sceneworld"):
        s = enc[name]
        assert s["files"] >= 1
        assert _positive(s["naive"]["images_per_s"]) and _positive(s["fast_end_to_end"]["images_per_s"])
        assert _positive(s["speedup_end_to_end_vs_naive"])
        for stages in (s["naive"]["stage_ms_per_image"], s["fast_stages"]["stage_ms_per_image"]):
            assert set(stages) == {"decode", "preprocess", "model"}
            assert all(v >= 0 for v in stages.values()) and _positive(stages["model"])
        # Fast path (draft decode, reduced precision) agrees with the naive reference.
        assert s["cosine_fast_vs_naive"]["min"] >= 0.99
    assert enc["sceneworld"]["top10_overlap"]["text_cosine_min"] >= 0.99
    q = result["query"]
    assert set(q["text_encode"]) == {"20", "128", "512"}
    for n, row in q["text_encode"].items():
        assert row["tokens"] <= int(n)
        assert _positive(row["reference"]["p50_ms"]) and _positive(row["fast"]["p95_ms"])
        assert row["cosine"] >= 0.99
    sizes = [row["n"] for row in q["sizes"]]
    assert sizes == sorted(sizes) and len(sizes) >= 2
    kinds = {row["index_kind"] for row in q["sizes"]}
    assert kinds == {"exact", "hnsw"}  # one size each side of EXACT_THRESHOLD
    for row in q["sizes"]:
        assert 0.0 <= row["recall_at_10_vs_exact"] <= 1.0
        assert _positive(row["ann_p50_ms"]) and _positive(row["search_catalog_p50_ms"])
        assert row["bytes_per_vector_disk"] >= 4 * 256  # at least the float32 vector itself
    choice = q["ann_choice"]
    assert isinstance(choice["recall_ok"], bool) and isinstance(choice["size_ok"], bool)
    rss = result["rss"]
    assert rss["images"] == 60
    assert rss["peak_rss_mib"] >= rss["rss_after_model_load_mib"] > 0


def test_quick_bench_writes_its_markdown_block_and_keeps_the_others(quick_run):
    _, markdown = quick_run
    assert "<!-- other:begin -->\nkept\n<!-- other:end -->" in markdown
    assert markdown.count("<!-- bench-quick:begin -->") == 1
    assert "(a) Image encode throughput" in markdown and "(d) Peak memory while indexing" in markdown


def test_gpu_script_runs_its_code_path_on_the_cpu(tmp_path):
    from engine.bench import gpu

    result = gpu.run(work=tmp_path / "gpu", quick=True, n_files=6, batch=4, allow_cpu=True)
    assert result["device"] in ("cpu", "cuda")
    assert _positive(result["fast_images_per_s"]) and _positive(result["eager_fp16_images_per_s"])
    assert result["cosine_fast_vs_fp32_reference"]["min"] >= 0.999
    assert result["end_to_end"]["embedded"] == 6
    assert "GPU image encode" in gpu.render_markdown(result)
    pending = gpu.render_markdown({"available": False, "note": "pending"})
    assert "Pending" in pending
