"""Settings and search filters mean the same in the CLI and the GUI (engine.settings,
engine.search.filters): one file, one validation, one message."""

from __future__ import annotations

import json
import types

import pytest

from desktop_app.facade import Backend, LonglensError
from engine import cli as engine_cli
from engine import settings as engine_settings
from engine.services import Services


class _Stop(LonglensError):
    pass


def _write_settings(paths, **values) -> None:
    paths.config.mkdir(parents=True, exist_ok=True)
    (paths.config / "settings.json").write_text(json.dumps(values), encoding="utf-8")


@pytest.fixture
def recorded(monkeypatch):
    """Services.embedder / indexer / searcher record what they are given and stop the command."""
    seen: dict = {}

    def embedder(self, name=None, device="auto", text_tower=None):
        seen["embedder"] = {"device": device, "text_tower": text_tower}
        return types.SimpleNamespace(model_id="recorded")  # no backend: grounding is refused

    def indexer(self, embedder, **kwargs):
        seen["indexer"] = kwargs
        raise _Stop("stopped by the test")

    class Searcher:
        def search_text(self, text, **kwargs):
            seen["search"] = kwargs
            raise _Stop("stopped by the test")

    monkeypatch.setattr(Services, "embedder", embedder)
    monkeypatch.setattr(Services, "indexer", indexer)
    monkeypatch.setattr(Services, "searcher", lambda self, embedder: Searcher())
    return seen


def test_cli_and_gui_read_the_same_settings(paths, tmp_path, recorded, capsys):
    tower = tmp_path / "tower"
    _write_settings(paths, device="cpu", text_tower=str(tower), max_tokens=48, batch_size=4, decode_workers=3,
                    raw_jpeg_pairs="both")
    backend = Backend(paths)
    try:
        s = backend.settings()
        assert (s.device, s.text_tower, s.max_tokens, s.batch_size, s.decode_workers) == ("cpu", tower, 48, 4, 3)
        assert s.raw_jpeg_pairs == "both"
        assert s == engine_settings.load_settings(paths.config)
    finally:
        backend.close()
    # The CLI, with no flags for them, uses the same values...
    assert engine_cli.main(["search", "a dog"]) == 2
    assert recorded["embedder"] == {"device": "cpu", "text_tower": tower}
    assert recorded["search"]["max_tokens"] == 48
    photos = tmp_path / "photos"
    photos.mkdir()
    assert engine_cli.main(["index", str(photos)]) == 2
    assert recorded["embedder"] == {"device": "cpu", "text_tower": tower}
    assert recorded["indexer"] == {"batch_size": 4, "decode_workers": 3, "raw_jpeg_pairs": "both"}
    # ... and explicit flags win.
    assert engine_cli.main(["search", "a dog", "--device", "cuda", "--max-tokens", "32",
                            "--text-tower", str(tmp_path / "other")]) == 2
    assert recorded["embedder"] == {"device": "cuda", "text_tower": tmp_path / "other"}
    assert recorded["search"]["max_tokens"] == 32
    assert engine_cli.main(["index", str(photos), "--batch-size", "8", "--device", "cuda",
                            "--raw-jpeg-pairs", "raw"]) == 2
    assert recorded["indexer"] == {"batch_size": 8, "decode_workers": 3, "raw_jpeg_pairs": "raw"}
    assert recorded["embedder"]["device"] == "cuda"
    # ground (and check, which shares its model options) load the model the Inspector and the
    # Review panel use: the settings' device and text tower.
    from PIL import Image

    picture = tmp_path / "picture.png"
    Image.new("RGB", (32, 24), (200, 30, 30)).save(picture)
    recorded.clear()
    assert engine_cli.main(["ground", str(picture), "A red picture.", "--out", str(tmp_path / "g")]) == 2
    assert recorded["embedder"] == {"device": "cpu", "text_tower": tower}
    capsys.readouterr()


def test_a_bad_value_is_refused_by_cli_and_gui_naming_the_file_and_key(paths, capsys):
    _write_settings(paths, batch_size=0)
    with pytest.raises(LonglensError) as info:
        Backend(paths)
    assert "settings.json" in str(info.value) and "'batch_size'" in str(info.value)
    assert engine_cli.main(["search", "a dog"]) == 2
    assert str(info.value) in capsys.readouterr().err


def test_the_gui_reads_the_settings_file_once_per_change(paths, monkeypatch):
    _write_settings(paths, top_k=50)
    opens: list[str] = []
    real = engine_settings.read_json_file  # the one read of the file (engine.jsonfile, bounded)

    def counting(path, *a, **kw):
        opens.append(str(path))
        return real(path, *a, **kw)

    monkeypatch.setattr(engine_settings, "read_json_file", counting)
    backend = Backend(paths)
    try:
        assert len(opens) == 1  # the start-up check, cached
        for _ in range(5):  # what a few searches ask for (top_k, max_tokens, device, model, ...)
            assert backend.settings().top_k == 50
            backend.settings().get("max_tokens")
            try:
                backend.embedder()
            except LonglensError:
                pass  # no model installed: only the settings reads matter here
        assert len(opens) == 1
        backend.save_settings({"top_k": 60})  # one read, to merge with what the file holds
        assert len(opens) == 2
        assert [backend.settings().top_k for _ in range(3)] == [60, 60, 60]
        assert len(opens) == 2
        assert json.loads((paths.config / "settings.json").read_text())["top_k"] == 60
    finally:
        backend.close()


def test_the_same_bad_date_is_refused_by_gui_and_cli_with_the_same_message(paths, capsys):
    backend = Backend(paths)
    try:
        with pytest.raises(LonglensError) as info:
            backend.search_text("a dog", 10, {"after": "2024-13-01"})
    finally:
        backend.close()
    message = str(info.value)
    assert message == "the 'after' date must be a date like 2024-05-31, got '2024-13-01'"
    assert engine_cli.main(["search", "a dog", "--after", "2024-13-01"]) == 2
    assert message in capsys.readouterr().err
