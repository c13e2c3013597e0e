"""The thread adapter: calls and jobs off the GUI thread, signals in it, cancel forwarded."""

from __future__ import annotations

import threading

from desktop_app.background import user_message
from engine.errors import QueryError
from engine.jobs import Progress
from tests.desktop_app.conftest import WAIT_MS, settle


def test_call_result_arrives_in_the_gui_thread(qtbot, hub):
    gui = threading.get_ident()
    seen = {}

    def work(a, b):
        seen["worker"] = threading.get_ident()
        return a + b

    job = hub.call(work, 2, 3, on_result=lambda r: seen.update(result=r, slot=threading.get_ident()))
    settle(qtbot, job)
    assert seen["result"] == 5 and seen["slot"] == gui and seen["worker"] != gui


def test_engine_errors_become_messages_and_bugs_say_so(qtbot, hub):
    def bad_query():
        raise QueryError("the query is empty: type a description")

    errors = []
    settle(qtbot, hub.call(bad_query, on_error=errors.append))
    settle(qtbot, hub.call(lambda: 1 / 0, on_error=errors.append))
    assert errors[0] == "the query is empty: type a description"
    assert errors[1].startswith("unexpected error (ZeroDivisionError") and "report" in errors[1]
    assert user_message(MemoryError()) == "out of memory"


def test_job_progress_and_cancel_reach_the_engine_generator(qtbot, hub):
    started = threading.Event()

    def make(token):
        def gen():
            for i in range(10_000):
                started.set()
                token.raise_if_cancelled()
                yield Progress("index", i, 10_000, f"{i}")
                threading.Event().wait(0.002)
        return gen()

    stages, cancelled = [], []
    job = hub.start_job(make, name="counting", on_progress=lambda p: stages.append(p.done),
                        on_cancelled=lambda: cancelled.append(True))
    assert started.wait(5)
    qtbot.waitUntil(lambda: bool(stages), timeout=WAIT_MS)
    job.cancel()
    settle(qtbot, job)
    assert cancelled == [True] and job.was_cancelled
    assert len(stages) < 2000  # progress is throttled, not one signal per step


def test_shutdown_cancels_and_joins(qtbot, hub):
    release = threading.Event()

    def make(token):
        def gen():
            while not token.cancelled:
                release.wait(0.01)
                yield Progress("index", 0, None)
        return gen()

    jobs = [hub.start_job(make) for _ in range(5)]  # more than the pool's threads: some queued
    assert hub.shutdown(5)
    assert all(not j.running for j in jobs)
    late = hub.call(lambda: 1)
    assert not late.running and late.was_cancelled  # a closed hub takes no new work


def test_a_job_faster_than_the_gui_still_reports(qtbot, hub):
    """Callbacks are connected before the job starts: nothing is lost when it ends at once."""
    got = []
    for _ in range(20):
        settle(qtbot, hub.start_job(lambda token: iter(()), on_result=got.append,
                                    on_finished=lambda: got.append("end")))
        settle(qtbot, hub.call(lambda: 1 / 0, on_error=got.append))
    assert got.count("end") == 20 and got.count(None) == 20 and len(got) == 60
