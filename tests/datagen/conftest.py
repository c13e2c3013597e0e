"""Fixtures for the caption pipeline: real image files and a real OpenAI-compatible HTTP server on
loopback (engine.datagen.fake_server) whose answers each test scripts."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.datagen.fake_server import FakeVLMServer, ScriptedResponder


@pytest.fixture(scope="session")
def photo_master(tmp_path_factory) -> Path:
    from engine.samples import make_sample_folder

    folder = tmp_path_factory.mktemp("datagen") / "photos"
    make_sample_folder(folder, n=8, seed=3)
    return folder


@pytest.fixture
def photos(tmp_path, photo_master) -> Path:
    import shutil

    dest = tmp_path / "photos"
    shutil.copytree(photo_master, dest)
    return dest


@pytest.fixture
def serve():
    """serve(script=None, **kw) starts a FakeVLMServer on 127.0.0.1 (stopped after the test)."""
    started: list[FakeVLMServer] = []

    def start(script=None, responder=None, **kw) -> FakeVLMServer:
        srv = FakeVLMServer(responder or ScriptedResponder(script), **kw).start()
        started.append(srv)
        return srv

    yield start
    for srv in started:
        srv.stop()
