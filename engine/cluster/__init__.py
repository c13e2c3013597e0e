"""Scale-out indexing: a Ray job writes Parquet shards, `import-shards` merges them into the catalog.

Ray and pyarrow are an optional extra (`pip install longlens[cluster]`): nothing outside this
package imports them, and this package imports them only inside the functions that need them,
so the default install and the desktop app never load them. See docs/scale-out.md.
"""

from __future__ import annotations

from types import ModuleType

from engine.errors import LonglensError

INSTALL_HINT = "pip install longlens[cluster]"


class ClusterError(LonglensError):
    """A cluster job or a shard import cannot go on; the message says what to do."""


def require_pyarrow() -> ModuleType:
    try:
        import pyarrow
        import pyarrow.parquet  # noqa: F401  (the submodule is what callers use)
    except ImportError as exc:
        raise ClusterError(f"shards need pyarrow, which is not installed: {INSTALL_HINT}") from exc
    return pyarrow


def require_ray() -> ModuleType:
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError as exc:
        raise ClusterError(f"indexing on a cluster needs Ray, which is not installed: {INSTALL_HINT}",
                           settings=("cluster",)) from exc
    return ray
