"""Issue 18 item 3 through the real CLI: sceneworld-mini lists the query reader it includes, a
search reads its query with it (`--text-tower minilm-k6`) and finds the picture a paragraph
describes, and a misspelt name is refused with the names there are."""

from __future__ import annotations

import json
from pathlib import Path

from engine.sceneworld.export import write_training_jsonl


def test_search_with_the_included_query_reader(home, cli, tmp_path):
    jsonl = write_training_jsonl(tmp_path / "c" / "scenes.jsonl", tmp_path / "c" / "pictures", seed=1000, n=8,
                                 size=64)
    rows = [json.loads(line) for line in Path(jsonl).read_text().splitlines()]
    rc, out, _ = cli("models", "list")
    assert rc == 0 and "query readers included (--text-tower NAME): minilm-k6" in out
    rc, _, err = cli("index", str(tmp_path / "c" / "pictures"), "--model", "sceneworld-mini")
    assert rc == 0, err
    hits = 0
    for row in rows:
        result = cli.json("search", row["paragraph"], "--model", "sceneworld-mini", "--text-tower", "minilm-k6",
                          "--top", "1")
        found = result["results"] if isinstance(result, dict) else result
        hits += Path(found[0]["path"]).name == Path(row["image"]).name
    assert hits >= 6, hits  # 8 pictures, chance 1 in 8: the reader reads in the model's image space
    rc, _, err = cli("search", rows[0]["paragraph"], "--text-tower", "minilm-k66")
    assert rc != 0 and "'minilm-k66': sceneworld-mini bundles no tower of that name (bundled: minilm-k6)" in err
