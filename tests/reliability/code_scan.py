"""Walking the product's source for calls of one kind, with the function each sits in: the code
scans of tests/reliability (file reads outside the safe open, JSON parses outside the bounded
reader) share this walker and differ only in which calls they collect."""

from __future__ import annotations

import ast


class ScopedCalls(ast.NodeVisitor):
    """Visits every call of a module, knowing the dotted name of its enclosing functions and
    classes (`scope_name`); subclasses decide in `visit_call` what to record in `found`."""

    def __init__(self, module: str) -> None:
        self.module = module
        self.scope: list[str] = []
        self.found: list[tuple] = []

    @property
    def scope_name(self) -> str:
        return ".".join(self.scope) or "<module>"

    def visit_FunctionDef(self, node) -> None:
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    visit_AsyncFunctionDef = visit_FunctionDef
    visit_ClassDef = visit_FunctionDef

    def visit_Call(self, node: ast.Call) -> None:
        self.visit_call(node)
        self.generic_visit(node)

    def visit_call(self, node: ast.Call) -> None:
        raise NotImplementedError
