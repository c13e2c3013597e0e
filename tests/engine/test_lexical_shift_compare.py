"""`longlens dev lexical-shift --compare`: earlier measurements side by side, same scenes only."""

from __future__ import annotations

import json

from engine.cli import main


def _measurement(path, r1_grammar: float, r1_shift: float, *, n: int = 1000):
    row = {"t2i_R@5": 1.0, "t2i_R@10": 1.0, "t2i_median_rank": 1.0, "i2t_R@1": 0.5}
    m = {"benchmark": "sceneworld-lexical-shift", "seed": 1000, "n": n, "rng_seed": 0,
         "results": {"grammar": {"t2i_R@1": r1_grammar, **row}, "shift": {"t2i_R@1": r1_shift, **row},
                     "shift:colour": {"t2i_R@1": 0.25, **row}}}
    path.write_text(json.dumps(m))
    return path


def test_compare_writes_one_row_per_condition_into_its_section(tmp_path, capsys):
    a = _measurement(tmp_path / "a.json", 0.876, 0.001)
    b = _measurement(tmp_path / "b.json", 0.85, 0.006)
    doc = tmp_path / "report.md"
    doc.write_text("# Report\n\nkept text\n")
    assert main(["dev", "lexical-shift", "--compare", f"base={a}", f"k=2={b}", "--out", str(doc)]) == 0
    text = doc.read_text()
    assert "kept text" in text and "<!-- lexical-shift-compare:begin -->" in text
    assert "| query wording | base | k=2 |" in text
    assert "| (a) grammar | 0.876 | 0.850 |" in text and "| (b) lexical shift | 0.001 | 0.006 |" in text
    assert "| shift: colour | 0.250 | 0.250 |" in text


def test_compare_refuses_other_scenes_and_files_that_are_no_measurement(tmp_path, capsys):
    a = _measurement(tmp_path / "a.json", 0.8, 0.0)
    other = _measurement(tmp_path / "o.json", 0.8, 0.0, n=300)
    assert main(["dev", "lexical-shift", "--compare", f"a={a}", f"o={other}"]) == 2
    assert "other scenes" in capsys.readouterr().err
    (tmp_path / "junk.json").write_text("[1, 2]")
    assert main(["dev", "lexical-shift", "--compare", f"a={a}", f"j={tmp_path / 'junk.json'}"]) == 2
    assert "not a lexical-shift measurement" in capsys.readouterr().err
