#!/usr/bin/env bash
# Install the unpacked Longlens bundle for the current user (no root needed):
#   ./install.sh            copy to ~/.local/opt/longlens, add `longlens` to ~/.local/bin and a menu entry
#   ./install.sh --uninstall
# PREFIX=/opt/longlens BIN_DIR=/usr/local/bin APPS_DIR=/usr/share/applications ./install.sh (as root)
# installs for every user instead.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PREFIX="${PREFIX:-$HOME/.local/opt/longlens}"
BIN_DIR="${BIN_DIR:-$HOME/.local/bin}"
APPS_DIR="${APPS_DIR:-${XDG_DATA_HOME:-$HOME/.local/share}/applications}"
ICONS_DIR="${ICONS_DIR:-${XDG_DATA_HOME:-$HOME/.local/share}/icons/hicolor/512x512/apps}"

if [ "${1:-}" = "--uninstall" ]; then
    rm -f "$BIN_DIR/longlens" "$APPS_DIR/longlens.desktop" "$ICONS_DIR/longlens.png"
    rm -rf "$PREFIX"
    echo "Longlens removed (your catalog and models stay where \`longlens paths\` showed them)."
    exit 0
fi
[ -x "$HERE/longlens" ] || { echo "install.sh: run it from the unpacked Longlens folder" >&2; exit 1; }
if [ "$HERE" != "$PREFIX" ]; then
    mkdir -p "$(dirname "$PREFIX")"
    rm -rf "$PREFIX.new"
    cp -a "$HERE" "$PREFIX.new"
    rm -rf "$PREFIX"
    mv "$PREFIX.new" "$PREFIX"   # the old install stays whole until the new one is complete
fi
mkdir -p "$BIN_DIR" "$APPS_DIR" "$ICONS_DIR"
ln -sfn "$PREFIX/longlens" "$BIN_DIR/longlens"
install -m 644 "$PREFIX/longlens.png" "$ICONS_DIR/longlens.png"
sed "s|^Exec=longlens|Exec=$PREFIX/longlens|" "$PREFIX/longlens.desktop" > "$APPS_DIR/longlens.desktop"
command -v update-desktop-database >/dev/null && update-desktop-database "$APPS_DIR" 2>/dev/null || true
echo "Longlens installed in $PREFIX; start it from the menu or with: longlens"
echo "Check the installation with: longlens --self-test"
