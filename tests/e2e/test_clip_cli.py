"""A random-weight tiny Long-CLIP-B through the CLI on real image files: `models import` (the folder
is recognised as CLIP), `index`, `search` with a paragraph of up to 248 tokens read whole and the
limit reported, and the official-checkpoint path: `models convert` of an OpenAI-layout .pt whose
pinned SHA-256 matches (a stand-in pin for a tiny file), refused when it does not."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.catalog import Catalog
from engine.models.registry import load_embedder
from tests.engine.clip_reference import random_openai_state_dict

MODEL = "tiny-longclip"
SENTENCES = [
    "A wide sandy beach at low tide with a red umbrella near the water.",
    "Two children build a castle to the left of a blue bucket, while gulls circle above the waves.",
    "Further along, an old man walks a small brown dog past a row of striped beach huts.",
    "The sky is cloudy and grey, with a thin band of evening light above the horizon.",
    "A sailing boat with a white sail drifts slowly towards the harbour wall on the right.",
]


@pytest.fixture
def clip_home(tmp_path, monkeypatch, longclip_b_tiny_checkpoint, cli) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("LONGLENS_HOME", str(home))
    rc, out, err = cli("models", "import", str(longclip_b_tiny_checkpoint), "--name", MODEL)
    assert rc == 0, err
    assert "(clip)" in out
    return home


def paragraph_of(emb, lo: int, hi: int) -> str:
    """Sentences appended until the paragraph has between lo and hi tokens."""
    text, i = "", 0
    while emb.token_count(text) < lo:
        text = f"{text} {SENTENCES[i % len(SENTENCES)]}".strip()
        i += 1
    assert emb.token_count(text) <= hi, "sentences too long for the window"
    return text


def brute_force(paths, model: str, text: str) -> list[str]:
    emb = load_embedder(model, paths)
    q = emb.encode_texts([text])[0]
    scored = []
    with Catalog(paths.catalog) as cat:
        for lib in cat.libraries():
            ids, vecs = cat.all_vectors(lib.id, emb.identity)
            recs = cat.images_by_id(ids.tolist())
            scored += [(-float(v @ q), i, str(Path(lib.root) / recs[i].rel_path))
                       for i, v in zip(ids.tolist(), vecs, strict=True)]
    return [p for _, _, p in sorted(scored)]


def test_index_and_search_with_a_248_token_paragraph(clip_home, photos, cli) -> None:
    from engine.config import get_paths

    paths = get_paths(clip_home)
    summary = cli.json("index", str(photos), "--model", MODEL)
    assert summary["embedded"] > 10
    emb = load_embedder(MODEL, paths)
    assert (emb.backend, emb.max_text_tokens, emb.default_text_tokens) == ("clip", 248, 248)

    long_query = paragraph_of(emb, 200, 248)  # far past CLIP's 77, within Long-CLIP's 248
    res = cli.json("search", long_query, "--model", MODEL, "--top", "8")
    assert 200 <= res["tokens_total"] <= 248
    assert res["tokens_used"] == res["tokens_total"] and res["truncated"] is False
    assert [r["path"] for r in res["results"]] == brute_force(paths, MODEL, long_query)[:8]
    assert len({round(r["score"], 6) for r in res["results"]}) > 4

    too_long = paragraph_of(emb, 300, 400)
    res = cli.json("search", too_long, "--model", MODEL, "--top", "3")
    assert res["tokens_used"] == 248 and res["tokens_total"] > 300 and res["truncated"] is True
    rc, out, _ = cli("search", too_long, "--model", MODEL, "--top", "3")
    assert rc == 0 and f"248/{res['tokens_total']} tokens used (TRUNCATED)" in out

    rc, _, err = cli("search", long_query, "--model", MODEL, "--max-tokens", "300")
    assert rc == 2 and "at most 248" in err


def test_models_convert_installs_a_pinned_openai_layout_checkpoint(tmp_path, monkeypatch, photos, cli) -> None:
    from engine.backends.clip import convert

    monkeypatch.setenv("LONGLENS_HOME", str(tmp_path / "home"))
    pt = tmp_path / "longclip-B.pt"
    torch.save(random_openai_state_dict(context=248, longclip=True, seed=3), pt)
    digest = hashlib.sha256(pt.read_bytes()).hexdigest()

    # A file that does not match the real pin is refused, and nothing is installed.
    rc, _, err = cli("models", "convert", str(pt), "--name", "longclip-b")
    assert rc != 0 and "bytes" in err
    assert not (tmp_path / "home" / "models" / "longclip-b").exists()

    stand_in = convert.PinnedCheckpoint("test/longclip-b", "0" * 40, pt.name, digest, pt.stat().st_size)
    monkeypatch.setitem(convert.PINNED, "longclip-b", stand_in)
    rc, out, err = cli("models", "convert", str(pt), "--name", "longclip-b")
    assert rc == 0, err
    assert "installed longclip-b" in out
    rc, out, _ = cli("models", "verify", "longclip-b")
    assert rc == 0 and "verified" in out
    assert not list((tmp_path / "home").rglob("*.pt"))  # the pickle is not kept in the install

    cli.json("index", str(photos), "--model", "longclip-b")
    res = cli.json("search", " ".join(SENTENCES * 2), "--model", "longclip-b", "--top", "5")
    assert res["tokens_used"] == res["tokens_total"] > 77 and not res["truncated"]
    assert len(res["results"]) == 5
    scores = [r["score"] for r in res["results"]]
    assert scores == sorted(scores, reverse=True) and np.ptp(scores) > 0

    rc, _, err = cli("models", "convert", str(pt), "--name", "clip-vit-base-patch16")
    assert rc != 0 and "no pinned OpenAI-layout checkpoint" in err
