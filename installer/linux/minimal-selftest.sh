#!/usr/bin/env bash
# Self-test an unpacked Linux bundle on a bare Debian/Ubuntu or Fedora system that has nothing but
# the Qt xcb libraries docs/installing.md lists (qt-xcb-debian.txt, qt-xcb-fedora.txt beside this
# script) and an X server: it proves that list is enough for the real window. Runs as root in a
# fresh container; .github/workflows/installers.yml runs it in debian:12-slim, ubuntu:24.04 and
# fedora:latest:
#
#   docker run --rm -v "$PWD:/src:ro" -v "$BUNDLE:/opt/Longlens:ro" debian:12-slim \
#       /src/installer/linux/minimal-selftest.sh /opt/Longlens
set -euo pipefail

BUNDLE="${1:?usage: minimal-selftest.sh BUNDLE_DIR (the unpacked Longlens/ folder)}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DISPLAY_NUM=99
# shellcheck source=/dev/null
SYSTEM="$(. /etc/os-release && echo "$PRETTY_NAME")"

log() { printf '\n== %s\n' "$*" >&2; }
die() { printf 'minimal-selftest: error: %s\n' "$*" >&2; exit 1; }
listed() { grep -v -e '^#' -e '^[[:space:]]*$' "$1"; }

[ -x "$BUNDLE/longlens" ] || die "$BUNDLE/longlens is not an executable bundle"

if command -v apt-get >/dev/null; then
    mapfile -t packages < <(listed "$HERE/qt-xcb-debian.txt")
    log "apt-get install: ${#packages[@]} listed packages + xvfb"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # No recommended packages: only the list, what it depends on, and the X server.
    apt-get install -y -qq --no-install-recommends "${packages[@]}" xvfb >/dev/null
elif command -v dnf >/dev/null; then
    mapfile -t packages < <(listed "$HERE/qt-xcb-fedora.txt")
    log "dnf install: ${#packages[@]} listed packages + Xvfb"
    dnf install -y -q --setopt=install_weak_deps=False "${packages[@]}" xorg-x11-server-Xvfb
else
    die "neither apt-get nor dnf: not a Debian, Ubuntu or Fedora system"
fi

# A missing library named before Qt's own, vaguer "could not load the Qt platform plugin".
plugin="$BUNDLE/_internal/PySide6/Qt/plugins/platforms/libqxcb.so"
[ -f "$plugin" ] || die "no xcb platform plugin at $plugin"
if command -v ldd >/dev/null; then
    missing="$(ldd "$plugin" | grep 'not found' || true)"
    [ -z "$missing" ] || die "the listed packages leave libraries of $plugin unresolved:
$missing"
fi

log "Xvfb :$DISPLAY_NUM"
Xvfb ":$DISPLAY_NUM" -screen 0 1280x800x24 -nolisten tcp &
xvfb_pid=$!
trap 'kill "$xvfb_pid" 2>/dev/null || true' EXIT
for _ in $(seq 100); do
    [ -S "/tmp/.X11-unix/X$DISPLAY_NUM" ] && break
    sleep 0.1
done
[ -S "/tmp/.X11-unix/X$DISPLAY_NUM" ] || die "Xvfb did not start"

log "self-test on Qt's xcb platform, empty environment"
home="$(mktemp -d)"
out="$home/self-test.log"
# Only what a user's session has: HOME, PATH, a locale and the display; no build tree, no venv.
if ! env -i HOME="$home" PATH=/usr/bin:/bin LANG=C.UTF-8 DISPLAY=":$DISPLAY_NUM" QT_QPA_PLATFORM=xcb \
        "$BUNDLE/longlens" --self-test 2>&1 | tee "$out"; then
    die "the bundle's self-test failed on $SYSTEM"
fi
grep -q "Qt platform xcb" "$out" || die "the self-test did not open its window on the xcb platform"
log "passed on $SYSTEM"
