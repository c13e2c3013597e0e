#!/usr/bin/env bash
# Build the Linux bundle (PyInstaller one-folder), package it as a tarball with a .desktop file and
# icon (and an AppImage when appimagetool is on PATH), then run the packaged app's --self-test
# under Xvfb. `make installer` runs this; so can a release machine. See docs/installing.md.
#
#   installer/build-linux.sh            # everything, outputs in dist/installer/
#   SKIP_SELFTEST=1 installer/build-linux.sh
#
# Reproducible by construction: a clean copy of the source tree (no venv, caches or build
# outputs), a separate build venv from pinned files (requirements.lock + installer/requirements.txt),
# PYTHONHASHSEED=0 for PyInstaller and SOURCE_DATE_EPOCH-stamped,
# owner-normalised tar members.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
WORK="${WORK:-$ROOT/build/installer}"
OUT="${OUT:-$ROOT/dist/installer}"
SRC="$WORK/src"
VENV="$WORK/venv"
NAME="Longlens"

log() { printf '\n== %s\n' "$*" >&2; }
die() { printf 'build-linux: error: %s\n' "$*" >&2; exit 1; }

[ "$(uname -s)" = Linux ] || die "this script builds the Linux bundle; see installer/windows and installer/macos"
command -v "$PYTHON" >/dev/null || die "$PYTHON not found (set PYTHON=/path/to/python3.11)"
"$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] < (3, 11))' || die "Python 3.11 or newer is needed"

log "clean copy of the source tree into $SRC"
rm -rf "$SRC"
mkdir -p "$SRC" "$OUT"
# What a fresh clone has: no virtual environments, caches, build outputs or local data.
tar -C "$ROOT" \
    --exclude=./.git --exclude=./.venv --exclude=./build --exclude=./dist --exclude=./out \
    --exclude='*.egg-info' --exclude=__pycache__ --exclude='*.pyc' --exclude=.pytest_cache \
    --exclude=.ruff_cache --exclude=.hypothesis --exclude=.longlens-dev --exclude=.import_linter_cache \
    -cf - . | tar -C "$SRC" -xf -
chmod -R u+rwX,go+rX-w "$SRC"   # a checkout's private modes must not leak into the bundle
VERSION="$("$PYTHON" - "$SRC/pyproject.toml" <<'PY'
import sys, tomllib
print(tomllib.load(open(sys.argv[1], "rb"))["project"]["version"])
PY
)"

STAMP_WANT="$(cat "$SRC/requirements.lock" "$SRC/installer/requirements.txt" | sha256sum | cut -c1-16)"
if [ "$(cat "$VENV/.stamp" 2>/dev/null)" != "$STAMP_WANT" ]; then
    log "build venv $VENV (pinned: requirements.lock + installer/requirements.txt)"
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --upgrade pip
    # Published wheels wherever they exist; hnswlib ships only a source distribution, which pip
    # compiles once and then takes from its wheel cache.
    "$VENV/bin/pip" install --quiet --prefer-binary -r "$SRC/requirements.lock" -r "$SRC/installer/requirements.txt"
    echo "$STAMP_WANT" > "$VENV/.stamp"
fi
# The app itself: a regular (non-editable) install of the clean copy, so the bundle sees what a
# wheel user gets.
"$VENV/bin/pip" install --quiet --no-deps --no-build-isolation --force-reinstall "$SRC"
"$VENV/bin/python" - <<'PY' || die "the build venv must hold the CPU build of torch (see installer/switch-to-cuda.sh for CUDA)"
import sys, torch
sys.exit(0 if torch.version.cuda is None else 1)
PY

log "PyInstaller"
rm -rf "$WORK/pyi" "$WORK/dist"
(cd "$SRC" && PYTHONHASHSEED=0 "$VENV/bin/pyinstaller" --noconfirm --clean --log-level WARN \
    --distpath "$WORK/dist" --workpath "$WORK/pyi" installer/longlens.spec)
BUNDLE="$WORK/dist/$NAME"
[ -x "$BUNDLE/longlens" ] || die "PyInstaller produced no $BUNDLE/longlens"

log "packaging"
# Timestamps inside the tarball and wheel: the last commit's time, so two builds of one commit
# give the same archive members.
EPOCH="${SOURCE_DATE_EPOCH:-$(git -C "$ROOT" log -1 --format=%ct 2>/dev/null || stat -c %Y "$SRC/pyproject.toml")}"
install -m 644 "$SRC/installer/linux/longlens.desktop" "$BUNDLE/longlens.desktop"
install -m 644 "$SRC/installer/icons/longlens.png" "$BUNDLE/longlens.png"
install -m 755 "$SRC/installer/linux/install.sh" "$BUNDLE/install.sh"
install -m 755 "$SRC/installer/switch-to-cuda.sh" "$BUNDLE/switch-to-cuda.sh"
install -m 644 "$SRC/docs/installing.md" "$BUNDLE/INSTALLING.md"
# What switch-to-cuda.sh installs into its side environment: this exact Longlens as a wheel and
# the pins it was built with.
mkdir -p "$BUNDLE/python"
SOURCE_DATE_EPOCH="$EPOCH" "$VENV/bin/pip" wheel --quiet --no-deps --no-build-isolation -w "$BUNDLE/python" "$SRC"
install -m 644 "$SRC/requirements.lock" "$BUNDLE/python/requirements.lock"
TARBALL="$OUT/$NAME-$VERSION-linux-$(uname -m).tar.gz"
tar -C "$WORK/dist" --sort=name --mtime="@$EPOCH" --owner=0 --group=0 --numeric-owner \
    -cf - "$NAME" | gzip -n -6 > "$TARBALL"

APPIMAGE=""
if command -v appimagetool >/dev/null; then
    # An AppDir is the bundle plus AppRun, the .desktop file and the icon at its top.
    APPDIR="$WORK/$NAME.AppDir"
    rm -rf "$APPDIR"
    mkdir -p "$APPDIR/usr/lib"
    cp -a "$BUNDLE" "$APPDIR/usr/lib/longlens"
    install -m 755 "$SRC/installer/linux/AppRun" "$APPDIR/AppRun"
    install -m 644 "$SRC/installer/linux/longlens.desktop" "$APPDIR/longlens.desktop"
    install -m 644 "$SRC/installer/icons/longlens.png" "$APPDIR/longlens.png"
    APPIMAGE="$OUT/$NAME-$VERSION-$(uname -m).AppImage"
    ARCH="$(uname -m)" appimagetool --no-appstream "$APPDIR" "$APPIMAGE"
else
    echo "appimagetool is not on PATH: the tarball is the Linux package (AppImage skipped)" >&2
fi

BUNDLE_BYTES="$(du -sb "$BUNDLE" | cut -f1)"
TARBALL_BYTES="$(stat -c %s "$TARBALL")"
REPORT="$OUT/build-report.txt"
{
    echo "bundle      $BUNDLE"
    echo "bundle_size $BUNDLE_BYTES bytes ($(du -sh "$BUNDLE" | cut -f1))"
    echo "tarball     $TARBALL"
    echo "tarball_size $TARBALL_BYTES bytes ($(du -h "$TARBALL" | cut -f1))"
    [ -n "$APPIMAGE" ] && echo "appimage    $APPIMAGE ($(du -h "$APPIMAGE" | cut -f1))"
    echo "torch       $("$VENV/bin/python" -c 'import torch; print(torch.__version__)')"
} > "$REPORT"

if [ -z "${SKIP_SELFTEST:-}" ]; then
    log "self-test of the packaged app (unpacked tarball, under Xvfb)"
    TRY="$(mktemp -d)"
    trap 'rm -rf "$TRY"' EXIT
    tar -C "$TRY" -xzf "$TARBALL"
    # Only what a user's machine has: no build venv, no source tree on the import path.
    RUN=(env -i HOME="$TRY/home" PATH=/usr/bin:/bin LANG=C.UTF-8)
    if command -v xvfb-run >/dev/null; then
        RUN+=(xvfb-run -a -s "-screen 0 1280x800x24" "$TRY/$NAME/longlens" --self-test)
    else
        RUN+=("$TRY/$NAME/longlens" --self-test)
        echo "xvfb-run not found (apt-get install xvfb): the self-test uses Qt's offscreen platform" >&2
    fi
    mkdir -p "$TRY/home"
    if "${RUN[@]}" 2>&1 | tee "$OUT/self-test.log"; then
        echo "self_test   passed" >> "$REPORT"
    else
        echo "self_test   FAILED (see $OUT/self-test.log)" >> "$REPORT"
        cat "$REPORT" >&2
        die "the packaged app's self-test failed"
    fi
    # The same executable is the command line: it must build its parser (every command module
    # bundled) and list the bundled demo model.
    CLI_OUT="$(env -i HOME="$TRY/home" PATH=/usr/bin:/bin LANG=C.UTF-8 "$TRY/$NAME/longlens" \
        --home "$TRY/cli-home" models list 2>&1)" || true
    printf '%s\n' "$CLI_OUT" | tee -a "$OUT/self-test.log"
    if grep -qE "^sceneworld-mini +sceneworld-mini +installed" <<<"$CLI_OUT"; then
        echo "cli_check   passed (longlens models list)" >> "$REPORT"
    else
        echo "cli_check   FAILED (see $OUT/self-test.log)" >> "$REPORT"
        cat "$REPORT" >&2
        die "the packaged app's command line failed"
    fi
fi
log "done"
cat "$REPORT"
