# Two entry points for a fresh machine: `make demo` and `make test`.
# Both create or refresh the virtual environment first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv demo test test-cluster test-interop lint stress bench demo-model reproduction caft sceneworld-report clean installer

$(STAMP): pyproject.toml requirements.lock
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements.lock
	$(BIN)/pip install --quiet --no-deps -e .
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/longlens demo

lint: $(STAMP)
	$(BIN)/ruff check engine desktop_app tests
	$(BIN)/lint-imports

# Two workers (pytest-xdist), one test file each at a time; tests marked serial (they measure the
# event loop) then run alone, so another worker's load cannot skew them.
TEST_WORKERS ?= 2
test: lint
	QT_QPA_PLATFORM=offscreen $(BIN)/python -m pytest -q -p no:cacheprovider --durations=15 \
		-n $(TEST_WORKERS) --dist loadfile -m 'not stress and not cluster and not serial and not interop' tests
	QT_QPA_PLATFORM=offscreen $(BIN)/python -m pytest -q -p no:cacheprovider \
		-m 'serial and not stress and not cluster and not interop' tests

# Long fault-injection runs (tests marked stress), e.g. the kill -9 harness: STRESS_ITERATIONS kills.
STRESS_ITERATIONS ?= 20
# Scale-out tests on a local Ray runtime: installs the `cluster` extra (requirements-cluster.lock)
# with requirements.lock as constraints, so torch and numpy stay the pinned ones.
test-cluster: $(STAMP)
	$(BIN)/pip install --quiet -r requirements-cluster.lock -c requirements.lock
	QT_QPA_PLATFORM=offscreen $(BIN)/python -m pytest -q -p no:cacheprovider -m cluster tests/cluster

# Tests against the real tools photographers' files come from (Debian's exiv2, exiftool and darktable-cli)
# and against upstream code (open_clip's tokenizer): installs them when missing (CI runs as root) and
# fails loudly when it cannot; a missing binary fails its tests, never skips them. darktable comes
# without its recommends (no desktop: darktable-cli runs headless with --core --configdir DIR).
INTEROP_PACKAGES := exiv2 libimage-exiftool-perl darktable acl attr
INTEROP_COMMANDS := exiv2 exiftool darktable-cli setfacl setfattr
# Real photographs (scikit-image's data) and a third-party DNG writer for the interop library
# (tests/interop/realfiles.py), installed with requirements.lock as constraints: numpy, scipy, pillow
# and torch stay the pinned ones (pip refuses rather than moves them; tests/interop/test_interop_installs.py
# checks every pin after the installs).
INTEROP_PYTHON := pidng==4.0.9 scikit-image==0.26.0
test-interop: $(STAMP)
	@missing=""; for c in $(INTEROP_COMMANDS); do command -v $$c >/dev/null || missing="$$missing $$c"; done; \
	if [ -n "$$missing" ]; then \
		echo "test-interop: missing$$missing; installing $(INTEROP_PACKAGES) (Debian)"; \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
			$(INTEROP_PACKAGES); } \
		|| { echo "test-interop: FAILED to install $(INTEROP_PACKAGES); these tests need them" >&2; exit 1; }; \
		for c in $(INTEROP_COMMANDS); do command -v $$c >/dev/null \
			|| { echo "test-interop: FAILED: $$c is still missing after installing" >&2; exit 1; }; done; \
	fi
	# open_clip's own tokenizer, the reference for the CLIP family's text cleaning: --no-deps, since its
	# torchvision and timm do not install beside the pinned CPU torch (its tokenizer needs neither).
	$(BIN)/pip install --quiet --no-deps open_clip_torch==3.3.0
	# python-exiv2 (its wheel carries libexiv2 0.28, the line newer darktable and digiKam build on),
	# beside Debian's exiv2 0.27 binary: two exiv2 generations rewrite the exported sidecars.
	$(BIN)/pip install --quiet exiv2==0.19.2
	$(BIN)/pip install --quiet -c requirements.lock $(INTEROP_PYTHON) \
		|| { echo "test-interop: FAILED to install $(INTEROP_PYTHON); these tests need them" >&2; exit 1; }
	# The fields x tools table in docs/xmp.md is rewritten by this run (tests/interop/conftest.py).
	QT_QPA_PLATFORM=offscreen $(BIN)/python -m pytest -q -p no:cacheprovider -m interop --ignore=tests/cluster tests

stress: $(STAMP)
	QT_QPA_PLATFORM=offscreen LONGLENS_STRESS_ITERATIONS=$(STRESS_ITERATIONS) \
		$(BIN)/python -m pytest -q -p no:cacheprovider -m stress tests

bench: $(STAMP)
	$(BIN)/longlens dev bench-ann --out docs/benchmarks.md
	$(BIN)/longlens dev bench-indexing --out docs/benchmarks.md
	$(BIN)/longlens bench --out docs/benchmarks.md --json-out docs/bench.json

# Retrain the bundled demo model and its matching head (about 70 min on 2 idle CPU cores), refit the
# grounding calibration and re-measure it.
demo-model: $(STAMP)
	$(BIN)/longlens dev train-sceneworld-mini --out resources/models/sceneworld-mini --seed 0
	$(BIN)/longlens dev train-matcher --model-dir resources/models/sceneworld-mini --rounds 4
	$(BIN)/longlens dev calibrate --model sceneworld-mini
	$(BIN)/longlens dev sceneworld-report --out docs/sceneworld.md

# The C1–C10 study on SceneWorld: trains 14 text towers and rewrites docs/reproduction.md.
reproduction: $(STAMP)
	$(BIN)/longlens dev reproduction --out docs/reproduction.md

# The CAFT-style variant against sceneworld-mini at 2k/6k/20k training scenes, the same steps at
# every size (issue 21): trains six models, measures them and the shipped one, and rewrites the
# measured section of docs/caft.md (times in docs/caft.md).
caft: $(STAMP)
	$(BIN)/longlens dev caft --out build/caft --doc docs/caft.md

sceneworld-report: $(STAMP)
	$(BIN)/longlens dev sceneworld-report --out docs/sceneworld.md

# The Linux bundle (PyInstaller one folder + tarball, AppImage when appimagetool is on PATH), built
# from a clean copy in its own venv (build/installer/venv, pins in installer/requirements.txt) and
# self-tested under Xvfb. Outputs in dist/installer/. Slow (about 10 min) and never part of `make test`.
installer:
	installer/build-linux.sh

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
