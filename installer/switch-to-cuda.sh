#!/usr/bin/env bash
# Run Longlens on an NVIDIA GPU (Linux): set up a side environment with the CUDA build of torch.
#
#   ./switch-to-cuda.sh [--cuda cu128] [--env DIR]     set up (needs python3.11 and internet access)
#   ./switch-to-cuda.sh --undo [--env DIR]             remove it; the bundled CPU app is untouched
#
# Why a side environment: the installed app is a frozen PyInstaller bundle whose torch libraries
# were fixed at build time; swapping torch inside it is not supported and would break on the next
# update. So this script builds a normal Python environment next to it holding the CUDA build of
# the same torch version and the same Longlens version (the wheel shipped in python/), and adds a
# `longlens-cuda` launcher plus a "Longlens (CUDA)" menu entry. Both apps share one catalog,
# settings and models (the same data folders), and the CUDA one reads the demo model from this
# bundle. The bundled app keeps running on the CPU; `longlens-cuda --self-test` checks the GPU one.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CUDA="cu128"
ENV_DIR="${XDG_DATA_HOME:-$HOME/.local/share}/longlens-cuda-env"
UNDO=""
while [ $# -gt 0 ]; do
    case "$1" in
        --cuda) CUDA="$2"; shift 2 ;;
        --env) ENV_DIR="$2"; shift 2 ;;
        --undo) UNDO=1; shift ;;
        -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
        *) echo "switch-to-cuda.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
BIN_DIR="${BIN_DIR:-$HOME/.local/bin}"
APPS_DIR="${XDG_DATA_HOME:-$HOME/.local/share}/applications"

if [ -n "$UNDO" ]; then
    rm -rf "$ENV_DIR"
    rm -f "$BIN_DIR/longlens-cuda" "$APPS_DIR/longlens-cuda.desktop"
    echo "CUDA environment removed; the bundled (CPU) Longlens is unchanged."
    exit 0
fi

WHEEL="$(ls "$HERE"/python/longlens-*.whl 2>/dev/null | head -n1 || true)"
LOCK="$HERE/python/requirements.lock"
RESOURCES="$HERE/_internal/resources"
[ -n "$WHEEL" ] && [ -f "$LOCK" ] || { echo "switch-to-cuda.sh: run it from the installed Longlens folder (python/ is missing)" >&2; exit 1; }
[ -d "$RESOURCES" ] || { echo "switch-to-cuda.sh: $RESOURCES is missing; reinstall Longlens" >&2; exit 1; }
PY="$(command -v python3.11 || true)"
[ -n "$PY" ] || { echo "switch-to-cuda.sh: python3.11 is needed (e.g. apt-get install python3.11-venv)" >&2; exit 1; }
command -v nvidia-smi >/dev/null || echo "warning: nvidia-smi not found; is the NVIDIA driver installed?" >&2

TORCH_VERSION="$(sed -n 's/^torch==//p' "$LOCK")"
echo "Setting up $ENV_DIR with torch $TORCH_VERSION for $CUDA ..."
rm -rf "$ENV_DIR.new"
"$PY" -m venv "$ENV_DIR.new"
"$ENV_DIR.new/bin/pip" install --quiet --upgrade pip
# The CUDA builds of torch come from PyTorch's own package index, one index per CUDA version.
"$ENV_DIR.new/bin/pip" install "torch==$TORCH_VERSION" --index-url "https://download.pytorch.org/whl/$CUDA"
# Longlens and its other dependencies at the versions this bundle was built with (torch already
# satisfies the pin: 2.13.0+cu128 matches ==2.13.0).
"$ENV_DIR.new/bin/pip" install --constraint "$LOCK" "$WHEEL"
"$ENV_DIR.new/bin/python" - <<'PY'
import sys, torch
if torch.version.cuda is None:
    sys.exit("the installed torch is a CPU build; pick another --cuda index")
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, GPU available: {torch.cuda.is_available()}")
PY
rm -rf "$ENV_DIR"
mv "$ENV_DIR.new" "$ENV_DIR"   # a failed run above leaves any earlier environment as it was

mkdir -p "$BIN_DIR" "$APPS_DIR"
cat > "$BIN_DIR/longlens-cuda" <<LAUNCH
#!/bin/sh
# Longlens on the CUDA build of torch (made by switch-to-cuda.sh). Same data as the bundled app.
LONGLENS_RESOURCES="$RESOURCES" exec "$ENV_DIR/bin/python" -m desktop_app "\$@"
LAUNCH
chmod +x "$BIN_DIR/longlens-cuda"
sed -e "s|^Name=Longlens|Name=Longlens (CUDA)|" -e "s|^Exec=.*|Exec=$BIN_DIR/longlens-cuda|" \
    -e "s|^Icon=.*|Icon=$HERE/longlens.png|" "$HERE/longlens.desktop" > "$APPS_DIR/longlens-cuda.desktop"
echo "Checking it (the self-test picks the GPU when torch sees one) ..."
"$BIN_DIR/longlens-cuda" --self-test
echo "Done: start 'Longlens (CUDA)' from the menu or run longlens-cuda. In Settings, Device 'auto' or 'cuda' uses the GPU."
