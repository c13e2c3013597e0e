"""Records each fields x tools case's outcome and, at the end of a run that had them all, rewrites
the tables in docs/xmp.md (tests/interop/interop_table.py)."""

from __future__ import annotations

import pytest

from tests.interop import interop_table


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    marker = item.get_closest_marker("interop_cell")
    if marker is None:
        return
    case_id = marker.args[0]
    table = interop_table.table_of(case_id)
    if table is None:
        return
    # setup failing (a tool missing, a file the tool refused to write) is a wrong cell, as a failed
    # assertion is; a pass needs the call itself to pass.
    if report.when == "setup" and not report.passed:
        table.outcomes[case_id] = False
    elif report.when == "call":
        table.outcomes[case_id] = report.passed


def pytest_configure(config):
    config.addinivalue_line("markers", "interop_cell(case_id): one case of a fields x tools table cell")


def pytest_sessionfinish(session, exitstatus):
    written = interop_table.write_tables()
    if written:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"docs/xmp.md: rewrote {', '.join(written)} from this run")
