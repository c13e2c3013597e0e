"""No module of engine/ or desktop_app/ uses another module's underscore-private names (issue 17):
`from engine.x import _name` and `x._name` on an imported engine or desktop_app module are refused.
What one module needs from another is public there, under a name that says what it is."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("engine", "desktop_app")


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_uses(source: str, filename: str) -> list[str]:
    """`file:line what` for each use of another module's private name in `source`."""
    tree = ast.parse(source, filename)
    modules: set[str] = set()
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules.update(a.asname for a in node.names if a.asname and a.name.startswith(PACKAGES))
        elif isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith(PACKAGES)):
            for a in node.names:
                if _private(a.name):
                    found.append(f"{filename}:{node.lineno} from {node.module} import {a.name}")
                modules.add(a.asname or a.name)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and _private(node.attr) and isinstance(node.value, ast.Name)
                and node.value.id in modules and node.value.id[:1].islower()):
            found.append(f"{filename}:{node.lineno} {node.value.id}.{node.attr}")
    return found


def test_no_module_uses_another_modules_private_names():
    found = []
    for package in PACKAGES:
        for f in sorted((ROOT / package).rglob("*.py")):
            found += private_uses(f.read_text(encoding="utf-8"), str(f.relative_to(ROOT)))
    assert found == [], "make these public where they are defined:\n" + "\n".join(found)


def test_the_scan_sees_both_forms():
    src = ("from engine.indexing.decode import _ensure_heif\n"
           "from engine.bench import ann\n"
           "x = ann._percentiles([1])\n"
           "from engine.jobs import CancelToken\n"
           "y = CancelToken()._flag\n")  # an object's private member: the backend scan's business
    assert private_uses(src, "m.py") == ["m.py:1 from engine.indexing.decode import _ensure_heif",
                                         "m.py:3 ann._percentiles"]
