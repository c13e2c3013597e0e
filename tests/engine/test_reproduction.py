"""The study report: Pareto front, the findings' verdicts and the written files (docs/reproduction.md).

Training itself is covered by the trainer smoke tests; here the results are built by hand so the
verdict logic can be checked in both directions.
"""

from __future__ import annotations

from PIL import Image

from engine.training.reproduction import BASELINE, BUDGETS, CONFIGS, findings, pareto_front, write_report


def _split(i2t: float, t2i: float) -> dict:
    return {"i2t": {"R@1": i2t, "R@5": min(1.0, i2t + 0.1), "R@10": min(1.0, i2t + 0.2)},
            "t2i": {"R@1": t2i, "R@5": min(1.0, t2i + 0.1), "R@10": min(1.0, t2i + 0.2)}}


def _run(config: str | None, short: float, long: float, curve: list[float], **extra) -> dict:
    return {"config": config, "short": _split(short, short - 0.05), "long": _split(long, long),
            "truncation": [{"max_tokens": b, **_split(v, v)} for b, v in zip(BUDGETS, curve, strict=True)],
            "train_seconds": 10.0, **extra}


RISING = [0.2, 0.4, 0.6, 0.7, 0.8, 0.9]
PLATEAU = [0.2, 0.5, 0.55, 0.5, 0.45, 0.4]


def _results(paragraph_wins: bool) -> dict:
    runs = {BASELINE: _run(None, 0.60, 0.60, PLATEAU)}
    for c in CONFIGS:
        paragraph = c in ("C4", "C5", "C6", "C9", "C10")
        good = paragraph == paragraph_wins
        runs[c] = _run(c, 0.58 if paragraph else 0.62, 0.80 if good else 0.50, RISING if paragraph else PLATEAU)
    runs["C7"] = _run("C7", 0.50, 0.40, PLATEAU)
    runs["C7 (1 hard neg.)"] = _run("C7", 0.58, 0.48, PLATEAU, hard_negatives=1)
    runs["C7 (3 hard neg.)"] = _run("C7", 0.55, 0.45, PLATEAU, hard_negatives=3)
    runs["C5 (25% data)"] = _run("C5", 0.58, 0.75, RISING, data_fraction=0.25)
    runs["C5 (50% data)"] = _run("C5", 0.58, 0.78, RISING, data_fraction=0.5)
    settings = {"n_train": 100, "epochs": 1, "lr": 1e-3, "batch_size": 8, "warmup_steps": 1,
                "eval_seed": 1000, "eval_n": 50, "seed": 0}
    return {"settings": settings, "base": "x", "runs": runs, "seconds": 60.0}


def test_pareto_front_keeps_only_undominated_points() -> None:
    pts = {"a": (1.0, 5.0), "b": (2.0, 4.0), "c": (1.5, 3.0), "d": (2.0, 4.0), "e": (0.5, 5.0)}
    assert sorted(pareto_front(pts)) == ["a", "b", "d"]  # c is dominated by b; e by a


def test_findings_follow_the_numbers() -> None:
    verdicts = {f["claim"]: f["reproduced"] for f in findings(_results(True))}
    assert all(verdicts.values()), verdicts
    flipped = {f["claim"]: f["reproduced"] for f in findings(_results(False))}
    assert not flipped["Paragraph supervision is the key factor for long descriptions."]
    assert not flipped["25% of the paragraph data captures about 75% of the gain."]


def test_report_files(tmp_path) -> None:
    out = tmp_path / "docs" / "reproduction.md"
    files = write_report(_results(True), out, "make reproduction")
    text = out.read_text(encoding="utf-8")
    assert "`make reproduction`" in text
    for c in CONFIGS:
        assert f"\n| {c} |" in text
    assert "](reproduction/truncation.png)" in text and "](reproduction/pareto.png)" in text
    for key in ("truncation", "pareto"):
        with Image.open(files[key]) as im:
            assert im.format == "PNG" and im.width > 500
    assert files["json"].is_file()
