"""Issue 16, items 8 and 11 (class "numeric options"): every numeric option of every verb and
script is validated at parse time by the one set of validators in engine/options.py, the
settings file and the GUI use the same ranges, and nothing is silently clamped or ignored.

The option tests walk the real parsers' actions, so an option added later cannot escape them:
a bare `type=int`/`type=float` (or any unknown type) fails the test."""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from engine import options
from engine.errors import ConfigError, LonglensError

ROOT = Path(__file__).resolve().parents[2]
TINY_MODEL = "tiny-blip"
pytestmark = pytest.mark.timeout(600)


# --------------------------------------------------------------------------- the parsers


def _script_modules() -> list[str]:
    """Every engine module that builds an argparse parser of its own (`python -m` scripts)."""
    mods = []
    for path in sorted((ROOT / "engine").rglob("*.py")):
        if "ArgumentParser(" in path.read_text(encoding="utf-8") and path.parent.name != "cli":
            mods.append(".".join(path.relative_to(ROOT).with_suffix("").parts))
    return mods


def _all_parsers() -> list[tuple[str, list[str], argparse.ArgumentParser]]:
    """(label, argv prefix that reaches the parser, parser) for every parser and subparser."""
    from engine.cli import build_parser

    roots: list[tuple[str, argparse.ArgumentParser]] = [("longlens", build_parser())]
    for mod in _script_modules():
        module = importlib.import_module(mod)
        if hasattr(module, "build_parser"):  # test_every_script_parser_is_reachable fails otherwise
            roots.append((f"python -m {mod}", module.build_parser()))
    found = []

    def walk(label: str, prefix: list[str], parser: argparse.ArgumentParser) -> None:
        found.append((label, prefix, parser))
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(f"{label} {name}", [*prefix, name], sub)

    for label, parser in roots:
        walk(label, [], parser)
    return found


NON_NUMERIC_TYPES = (None, str, Path)


def _number_of(action: argparse.Action) -> options.Number | None:
    t = action.type
    if isinstance(t, options.Number):
        return t
    if isinstance(t, options.NumberList):
        return t.number
    if isinstance(getattr(t, "number", None), options.Number):
        return t.number
    return None


def _numeric_actions() -> list[tuple[str, list[str], argparse.ArgumentParser, argparse.Action, options.Number]]:
    rows = []
    for label, prefix, parser in _all_parsers():
        for action in parser._actions:
            if isinstance(action, (argparse._SubParsersAction, argparse._HelpAction)) or action.nargs == 0:
                continue
            number = _number_of(action)
            if number is None and (action.type in NON_NUMERIC_TYPES or isinstance(action.type, options.Choice)):
                continue  # text, paths, and fixed choices (test_choice_options_refuse_other_values)
            rows.append((label, prefix, parser, action, number))
    return rows


def _choice_actions() -> list[tuple[str, list[str], argparse.ArgumentParser, argparse.Action]]:
    return [(label, prefix, parser, action) for label, prefix, parser in _all_parsers()
            for action in parser._actions if isinstance(action.type, options.Choice)]


NUMERIC = _numeric_actions()


def _filler(parser: argparse.ArgumentParser, skip: argparse.Action) -> list[str]:
    """Tokens for the parser's required arguments other than `skip`."""
    tokens: list[str] = []
    for action in parser._actions:
        if action is skip or isinstance(action, (argparse._SubParsersAction, argparse._HelpAction)):
            continue
        positional = not action.option_strings
        if not (positional and action.nargs not in ("?", "*")) and not action.required:
            continue
        number = _number_of(action)
        value = str(action.choices[0] if action.choices else (int(number.lo) + 1 if number else "x"))
        tokens += [value] if positional else [action.option_strings[-1], value]
    return tokens


def _in_range(number: options.Number, value: float) -> bool:
    if math.isnan(value) or math.isinf(value):
        return False
    if number.kind is int and not float(value).is_integer():
        return False
    low_ok = value > number.lo if number.lo_open else value >= number.lo
    return low_ok and value <= number.hi


def _probes(number: options.Number) -> list[str]:
    absurd = int(number.hi) + 1 if number.kind is int else number.hi * 10 + 1
    probes = ["0", "-1", str(absurd), "ten"]
    probes += ["1.5"] if number.kind is int else ["nan", "inf"]
    return probes


def test_every_script_parser_is_reachable() -> None:
    missing = [m for m in _script_modules() if not hasattr(importlib.import_module(m), "build_parser")]
    assert not missing, f"these build a parser outside build_parser(), so no test can walk it: {missing}"


def test_every_parser_has_numeric_options_to_check() -> None:
    flags = {a.option_strings[-1] for _, _, _, a, _ in NUMERIC if a.option_strings}
    # A sanity floor: the verbs named in the issue are among those walked.
    assert {"--batch-size", "--top", "--max-tokens", "--rerank-k", "--threshold", "--seed", "--n",
            "--workers", "--epochs", "--checkpoint-every", "--grad-accum"} <= flags
    assert len(NUMERIC) >= 60


@pytest.mark.parametrize("row", NUMERIC, ids=[f"{r[0]} {r[3].option_strings[-1]}" for r in NUMERIC])
def test_numeric_option_refuses_zero_negative_and_absurd_values(row, capsys) -> None:
    label, prefix, parser, action, number = row
    flag = action.option_strings[-1]
    assert number is not None, (f"{label} {flag}: type {action.type!r} is neither text, a path nor an "
                                "engine/options.py validator")
    base = [*prefix, *_filler(parser, action)]
    root = _root_parser("longlens" if label.startswith("longlens") else " ".join(label.split()[:3]))
    if action.default is not None and not isinstance(action.default, str):
        number.check(action.default)  # the default itself is inside the declared range
    for probe in _probes(number):
        argv = [*base, f"{flag}={probe}"]
        try:
            value = float(probe)
        except ValueError:
            value = math.nan
        capsys.readouterr()
        if _in_range(number, value):
            ns = root.parse_args(argv)
            got = getattr(ns, action.dest)
            got = got[0] if isinstance(got, list) else got
            assert got == number.kind(value), (label, flag, probe)
            continue
        with pytest.raises(SystemExit) as exc:
            root.parse_args(argv)
        err = capsys.readouterr().err
        assert exc.value.code == 2, (label, flag, probe)
        assert flag in err and number.field in err, err  # argparse names the flag, the engine the field
        assert "Traceback" not in err


@pytest.mark.parametrize("row", _choice_actions(), ids=[f"{r[0]} {r[3].option_strings[-1]}" for r in _choice_actions()])
def test_choice_options_refuse_other_values(row, capsys) -> None:
    label, prefix, parser, action = row
    choice: options.Choice = action.type
    flag = action.option_strings[-1]
    base = [*prefix, *_filler(parser, action)]
    root = _root_parser("longlens" if label.startswith("longlens") else " ".join(label.split()[:3]))
    for value in choice.choices:
        assert getattr(root.parse_args([*base, flag, value]), action.dest) == value
    for probe in ("", "JPEG", "jpg", "0"):
        capsys.readouterr()
        with pytest.raises(SystemExit) as exc:
            root.parse_args([*base, f"{flag}={probe}"])
        err = capsys.readouterr().err
        assert exc.value.code == 2 and flag in err and choice.field in err and "Traceback" not in err
        # The settings file's check says the same words (engine/options.py SETTINGS_CHOICES).
        with pytest.raises(options.OptionError) as same:
            choice.check(probe)
        assert str(same.value) in err


def test_the_settings_choices_are_the_flags_choices() -> None:
    flagged = {a.type for _, _, _, a in _choice_actions()}
    assert set(options.SETTINGS_CHOICES.values()) <= flagged
    for key, choice in options.SETTINGS_CHOICES.items():
        options.validate_settings({key: choice.choices[0]}, "settings.json")
        with pytest.raises(ConfigError, match=re.escape(f"setting {key!r}: {choice.field} must be one of")):
            options.validate_settings({key: "nope"}, "settings.json")


@functools.cache
def _root_parser(label: str) -> argparse.ArgumentParser:
    from engine.cli import build_parser

    if label.startswith("longlens"):
        return build_parser()
    mod = label.split()[2]  # "python -m MODULE ..."
    return importlib.import_module(mod).build_parser()


def test_validator_messages_name_the_field_never_a_flag() -> None:
    for number in {r[4] for r in NUMERIC if r[4] is not None} | {n for n, _ in options.SETTINGS_NUMBERS.values()}:
        for bad in (number.lo - 1, number.hi + 1, math.nan):
            with pytest.raises(options.OptionError) as exc:
                number.check(bad)
            assert number.field in str(exc.value) and "--" not in str(exc.value)
    with pytest.raises(options.OptionError):
        options.BATCH_SIZE.check(True)  # a JSON true is not 1


# --------------------------------------------------------------------------- real processes


def _longlens(home: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "LONGLENS_HOME": str(home), "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "engine", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.parametrize("size", ["0", "-1"])
def test_index_batch_size_zero_is_a_usage_error_and_marks_nothing_scanned(home, photos, size) -> None:
    r = _longlens(home, "index", str(photos), "--model", TINY_MODEL, "--device", "cpu", f"--batch-size={size}")
    assert r.returncode == 2, r.stderr
    assert "batch size must be at least 1" in r.stderr and "Traceback" not in r.stderr
    libs = _longlens(home, "libraries", "--json")
    assert libs.returncode == 0, libs.stderr
    assert json.loads(libs.stdout) == []  # the library was not added, let alone marked scanned


@pytest.fixture
def indexed(home, photos, cli) -> Path:
    rc, _, err = cli("index", str(photos), "--model", TINY_MODEL, "--device", "cpu", "--quiet")
    assert rc == 0, err
    return home


@pytest.mark.parametrize("budget, message", [
    ("1", "token budget must be at least 2"),
    ("0", "token budget must be at least 2"),  # was: silently "the model's default"
    ("100000", "token budget must be at most 4096"),  # was: silently clamped to 512
    ("600", f"token budget must be at most 512 for model {TINY_MODEL}"),  # in range, over the model's
])
def test_search_token_budget_is_refused_not_clamped(indexed, cli, budget, message) -> None:
    # The real CLI in-process (an exception would fail the test itself; a child costs a torch import).
    rc, _, err = cli("search", "a red bicycle by a wall", "--model", TINY_MODEL, "--device", "cpu",
                     f"--max-tokens={budget}")
    assert rc == 2, (rc, err)
    assert message in err, err


def test_search_token_budget_in_range_is_used_as_given(indexed, cli) -> None:
    out = cli.json("search", "a red bicycle by a wall", "--model", TINY_MODEL, "--device", "cpu", "--max-tokens=3")
    assert out["tokens_used"] == 3 and out["truncated"] is True


def test_engine_functions_validate_with_engine_messages(indexed, paths) -> None:
    from engine.query_budget import token_budget
    from engine.services import Services

    with Services(paths) as svc:
        embedder = svc.embedder(TINY_MODEL, device="cpu")
        searcher = svc.searcher(embedder)
        cases = [
            lambda: searcher.search_text("a red bicycle", top_k=0),
            lambda: searcher.search_text("a red bicycle", max_tokens=0),
            lambda: searcher.search_text("a red bicycle", max_tokens=100_000),
            lambda: searcher.search_text("a red bicycle", rerank=True, rerank_k=0),
            lambda: token_budget(embedder, "a red bicycle", max_tokens=1),
            lambda: svc.indexer(embedder, batch_size=0),
            lambda: svc.indexer(embedder, batch_size=-1),
        ]
        for case in cases:
            with pytest.raises(LonglensError) as exc:
                case()
            assert not re.search(r"--[a-z]", str(exc.value)), str(exc.value)


# --------------------------------------------------------------------------- settings file and GUI


@pytest.mark.parametrize("key, value", [("batch_size", 0), ("batch_size", -1), ("top_k", 0), ("max_tokens", 1),
                                        ("max_tokens", 100_000), ("decode_workers", 10**9),
                                        ("thumbnail_cache_mb", "lots"), ("batch_size", True)])
def test_settings_file_bad_value_names_the_file_and_key(home, photos, key, value) -> None:
    from engine.config import get_paths
    from engine.services import Services

    paths = get_paths(home).ensure()
    settings = paths.config / "settings.json"
    settings.write_text(json.dumps({key: value, "default_model": TINY_MODEL}), encoding="utf-8")
    with pytest.raises(ConfigError) as exc, Services(paths) as svc:
        svc.settings()
    assert str(settings) in str(exc.value) and repr(key) in str(exc.value)
    if (key, value) != ("batch_size", 0):
        return  # one real process is enough for the CLI's side of the same check
    # The CLI reads the same file (for the default model) and says the same, exit 2.
    r = _longlens(home, "index", str(photos), "--device", "cpu")
    assert r.returncode == 2, r.stderr
    assert str(settings) in r.stderr and key in r.stderr and "Traceback" not in r.stderr
    assert json.loads(_longlens(home, "libraries", "--json").stdout) == []


def test_saving_a_bad_setting_writes_nothing(home) -> None:
    from engine.config import get_paths
    from engine.services import Services

    paths = get_paths(home).ensure()
    with Services(paths) as svc:
        svc.save_settings({"batch_size": 8})
        before = (paths.config / "settings.json").read_bytes()
        with pytest.raises(ConfigError, match="batch_size"):
            svc.save_settings({"batch_size": 0})
        assert (paths.config / "settings.json").read_bytes() == before


def test_gui_settings_use_the_engine_ranges(home) -> None:
    pytest.importorskip("PySide6")
    from desktop_app.facade import DEFAULT_SETTINGS, Backend
    from engine.config import get_paths

    options.validate_settings(DEFAULT_SETTINGS, "defaults")  # the GUI's defaults are valid values
    paths = get_paths(home).ensure()
    backend = Backend(paths)
    try:
        for key, (number, _) in options.SETTINGS_NUMBERS.items():
            assert backend.setting_range(key) == (number.lo, number.hi)
        with pytest.raises(LonglensError, match="top_k"):
            backend.save_settings({"top_k": 0})
    finally:
        backend.close()
    (paths.config / "settings.json").write_text(json.dumps({"batch_size": 0}), encoding="utf-8")
    with pytest.raises(ConfigError, match="batch_size"):
        Backend(paths)  # the app refuses at start-up with the file and key (shown in a dialog)


def test_settings_dialog_spin_boxes_offer_exactly_the_engine_ranges(home, qtbot) -> None:
    pytest.importorskip("PySide6")
    from desktop_app.background import WorkerHub
    from desktop_app.dialogs.settings_dialog import SettingsDialog
    from desktop_app.facade import Backend
    from engine.config import get_paths

    backend, hub = Backend(get_paths(home)), WorkerHub()
    try:
        dlg = SettingsDialog(backend, hub)
        qtbot.addWidget(dlg)
        spins = {"batch_size": dlg.batch, "decode_workers": dlg.workers, "thumbnail_cache_mb": dlg.cache_mb,
                 "top_k": dlg.top_k}
        for key, spin in spins.items():
            number = options.SETTINGS_NUMBERS[key][0]
            assert (spin.minimum(), spin.maximum()) == (number.lo, number.hi), key
        budget = options.SETTINGS_NUMBERS["max_tokens"][0]
        # One extra entry below the range: "model default", saved as None (never 0 or 1).
        assert (dlg.max_tokens.minimum(), dlg.max_tokens.maximum()) == (budget.lo - 1, budget.hi)
        assert dlg.values()["max_tokens"] is None
        dlg.max_tokens.setValue(int(budget.lo))
        assert dlg.values()["max_tokens"] == budget.lo
        options.validate_settings(dlg.values(), "the dialog")
    finally:
        assert hub.shutdown()
        backend.close()
