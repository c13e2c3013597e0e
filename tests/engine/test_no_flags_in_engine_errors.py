"""Engine errors never name command-line flags (docs/architecture.md, engine/errors.py).

The GUI shows the same messages, where `--resume` or `--model` mean nothing: an engine module
speaks of the setting ("choose the model to use") and may name it in `settings=(...)`; the CLI
(engine/cli/) adds its flags. A whole command suggested in backquotes (`longlens models import
DIR --name NAME`) is something to run, not a flag of the current call, and is allowed.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ENGINE = Path(__file__).resolve().parents[2] / "engine"
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
COMMAND = re.compile(r"`[^`]*`")


def _text(node: ast.AST) -> str | None:
    """A message literal as written: f-string fields become {}; None for anything else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    return None


def _message_literals(exc: ast.AST):
    for node in ast.walk(exc):
        if isinstance(node, ast.BinOp):  # "..." + "..." : checked as its parts
            continue
        text = _text(node)
        if text is not None:
            yield node, text


def flags_in_raised_messages(source: str) -> list[tuple[int, str]]:
    """(line, flag) for each `--flag` in a string literal of a `raise` statement."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Raise) and node.exc is not None:
            seen: set[int] = set()
            for lit, text in _message_literals(node.exc):
                if isinstance(lit, ast.Constant) and id(lit) in seen:
                    continue
                if isinstance(lit, ast.JoinedStr):
                    seen.update(id(v) for v in lit.values)
                found += [(lit.lineno, m) for m in FLAG.findall(COMMAND.sub("", text))]
    return found


def _engine_modules() -> list[Path]:
    cli = ENGINE / "cli"
    return [p for p in sorted(ENGINE.rglob("*.py")) if cli not in p.parents]


def test_no_engine_module_outside_the_cli_raises_an_error_naming_a_flag():
    problems = [f"{path.relative_to(ENGINE.parent)}:{line}: {flag}"
                for path in _engine_modules()
                for line, flag in flags_in_raised_messages(path.read_text(encoding="utf-8"))]
    assert not problems, "engine errors name settings, not flags (engine/cli/ maps them):\n" + "\n".join(problems)


def test_the_check_sees_flags_in_plain_f_and_joined_strings():
    src = '''
def f(x):
    raise ValueError("--top must be at least 1")
def g(x):
    raise ValueError(f"{x} holds a run; pass " "--resume to continue")
def h(x):
    raise ValueError(f"import it with `longlens models import DIR --name {x}`")
def i(x):
    raise ValueError(x, "pick one with --model")
'''
    assert [flag for _, flag in flags_in_raised_messages(src)] == ["--top", "--resume", "--model"]


def test_the_cli_adds_its_flags_to_an_engine_error_naming_settings():
    from engine.cli.common import flag_hint
    from engine.errors import ConfigError

    exc = ConfigError("the folder already holds a training run", settings=("resume", "out_dir"))
    assert flag_hint(exc, {"resume": "--resume", "out_dir": "--out"}).endswith("(--resume, --out)")
    assert flag_hint(exc, None) == "the folder already holds a training run"
