"""Checklist 8: kill -9 at random moments during indexing, restart, check nothing committed is lost.

`make test` runs 3 iterations; `make stress` runs LONGLENS_STRESS_ITERATIONS (default 20)."""

from __future__ import annotations

import json

import pytest

from tests.reliability.crash_harness import run_crash_harness, run_mutator_harness


def _run(home, tmp_path, iterations: int, seed: int, restart: str):
    report = run_crash_harness(home, tmp_path / "photos-crash", iterations, seed=seed, restart=restart)
    (tmp_path / "crash-report.json").write_text(json.dumps(report.as_dict(), indent=2))
    return report


def _assert_clean(report, iterations: int) -> None:
    assert report.iterations == iterations
    assert report.problems == []
    assert report.clean
    assert (report.lost, report.duplicate_rows, report.index_mismatches, report.integrity_failures) == (0, 0, 0, 0)
    # Every planned kill landed while the job ran (early kills may rarely miss on a fast machine).
    assert report.killed_mid_job + report.finished_before_kill == iterations
    assert report.killed_mid_job >= iterations - 1
    assert report.committed_rows_checked > 0


def test_kill9_three_times_loses_nothing(home, tmp_path):
    report = _run(home, tmp_path, 3, seed=1, restart="inline")
    _assert_clean(report, 3)


@pytest.mark.stress
@pytest.mark.timeout(7200)  # 20+ kills and restarts, each starting a Python with torch
def test_kill9_stress(home, tmp_path, stress_iterations, capsys):
    report = _run(home, tmp_path, stress_iterations, seed=2, restart="process")
    with capsys.disabled():
        print("\ncrash harness:", json.dumps({k: v for k, v in report.as_dict().items() if k != "problems"}))
    _assert_clean(report, stress_iterations)


def _assert_mutator_clean(report, iterations: int) -> None:
    assert report.iterations == iterations
    assert report.problems == []
    assert report.clean
    assert (report.hangs, report.failed_runs, report.disagreements, report.duplicate_rows,
            report.index_mismatches, report.integrity_failures) == (0, 0, 0, 0, 0, 0)
    assert report.rows_checked > 0
    assert sum(report.mutations.values()) > 0


def test_concurrent_indexers_with_a_mutator_once(home, tmp_path):
    """One iteration of the mutator mode in `make test`: 2-3 indexers, one killed, a mutator."""
    report = run_mutator_harness(home, tmp_path / "photos-mutated", 1, seed=3)
    (tmp_path / "mutator-report.json").write_text(json.dumps(report.as_dict(), indent=2))
    _assert_mutator_clean(report, 1)


@pytest.mark.stress
@pytest.mark.timeout(7200)
def test_concurrent_indexers_with_a_mutator_stress(home, tmp_path, stress_iterations, capsys):
    report = run_mutator_harness(home, tmp_path / "photos-mutated", stress_iterations, seed=4)
    with capsys.disabled():
        print("\nmutator harness:", json.dumps({k: v for k, v in report.as_dict().items() if k != "problems"}))
    _assert_mutator_clean(report, stress_iterations)
    # Over 20 iterations every kind of change happened, and the kills landed.
    assert set(report.mutations) == {"add", "rename", "overwrite", "truncate", "delete", "fifo"}
    assert report.killed >= stress_iterations // 2
