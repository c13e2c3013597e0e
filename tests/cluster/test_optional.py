"""Ray is optional: the CLI, the engine services and the desktop app never import it, and the
cluster commands say how to install it when it is missing. Runs in `make test` (no Ray needed)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from engine.cli import main


def test_default_code_paths_do_not_import_ray_or_pyarrow():
    code = (
        "import sys\n"
        "import engine.cli, engine.services, engine.indexing.pipeline, engine.search.searcher\n"
        "engine.cli.build_parser()\n"
        "import desktop_app.main_window\n"
        "bad = sorted(m for m in ('ray', 'pyarrow') if m in sys.modules)\n"
        "assert not bad, bad\n"
    )
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr


@pytest.fixture
def without_cluster_extra(monkeypatch):
    # A None entry in sys.modules makes `import ray` raise ImportError, as on a default install.
    for name in ("ray", "ray.data", "pyarrow", "pyarrow.parquet"):
        monkeypatch.setitem(sys.modules, name, None)


def test_cluster_index_without_ray_says_how_to_install(without_cluster_extra, tmp_path, capsys):
    from engine.cluster.job import run_cluster_index

    (tmp_path / "p").mkdir()
    with pytest.raises(Exception, match=r"indexing on a cluster needs Ray, which is not installed: pip install longlens\[cluster\]"):
        next(run_cluster_index(tmp_path / "p", tmp_path / "out", "any", None))  # type: ignore[arg-type]


def test_import_shards_without_pyarrow_says_how_to_install(without_cluster_extra, tmp_path, capsys):
    (tmp_path / "shards").mkdir()
    (tmp_path / "shards" / "part-x.parquet").write_bytes(b"x")
    code = main(["--home", str(tmp_path / "home"), "import-shards", str(tmp_path / "shards"),
                 "--library", str(tmp_path / "lib")])
    assert code != 0
    assert "shards need pyarrow, which is not installed: pip install longlens[cluster]" in capsys.readouterr().err


def test_cluster_address_forms():
    from engine.cluster import ClusterError
    from engine.cluster.job import parse_address

    assert parse_address("local:3") == (None, 3)
    assert parse_address("local")[0] is None and 1 <= parse_address("local")[1] <= 4
    assert parse_address("ray://head:10001") == ("ray://head:10001", None)
    with pytest.raises(ClusterError, match="expected 'local' or 'local:N'"):
        parse_address("local:zero")


def test_gpu_actors_reserve_the_cpus_per_gpu_of_the_smallest_gpu_node():
    from engine.cluster.job import _cpus_per_gpu

    class FakeRay:
        def __init__(self, nodes):
            self._nodes = nodes

        def nodes(self):
            return self._nodes

    nodes = [
        {"Alive": True, "Resources": {"CPU": 64.0}},  # CPU-only node: not where GPU actors run
        {"Alive": True, "Resources": {"CPU": 32.0, "GPU": 4.0}},
        {"Alive": True, "Resources": {"CPU": 12.0, "GPU": 2.0}},
        {"Alive": False, "Resources": {"CPU": 2.0, "GPU": 2.0}},
    ]
    assert _cpus_per_gpu(FakeRay(nodes)) == 6
    assert _cpus_per_gpu(FakeRay(nodes[:1])) == 1
