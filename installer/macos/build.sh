#!/usr/bin/env bash
# Build Longlens.app and Longlens-VERSION-macos-ARCH.dmg on a Mac (Python 3.11, Xcode command
# line tools). Signing and notarisation run only when their credentials are set:
#   LONGLENS_CODESIGN_IDENTITY  "Developer ID Application: NAME (TEAMID)" in the login keychain
#   notarisation, one of:
#     LONGLENS_NOTARY_PROFILE                 a `xcrun notarytool store-credentials` profile
#     LONGLENS_APPLE_ID, LONGLENS_TEAM_ID, LONGLENS_APP_PASSWORD   (an app-specific password)
# Without them the app and dmg are built unsigned (fine for testing on the build Mac; other Macs'
# Gatekeeper will refuse to open them).
# Not run on the Linux build machine: written from the PyInstaller, codesign and notarytool docs.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PYTHON="${PYTHON:-python3.11}"
WORK="$ROOT/build/installer-macos"
VENV="$WORK/venv"
DIST="$ROOT/dist"
APP="$DIST/Longlens.app"
ENTITLEMENTS="$ROOT/installer/macos/entitlements.plist"

die() { printf 'macos/build.sh: error: %s\n' "$*" >&2; exit 1; }
[ "$(uname -s)" = Darwin ] || die "this script runs on macOS"

if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --upgrade pip
    # On macOS PyPI's torch wheels are CPU/MPS builds (no CUDA exists for macOS).
    "$VENV/bin/pip" install --quiet --prefer-binary -r "$ROOT/requirements.lock" -r "$ROOT/installer/requirements.txt"
fi
"$VENV/bin/pip" install --quiet --no-deps --no-build-isolation --force-reinstall "$ROOT"
VERSION="$("$VENV/bin/python" -c 'import tomllib,sys;print(tomllib.load(open(sys.argv[1],"rb"))["project"]["version"])' "$ROOT/pyproject.toml")"

# PyInstaller signs every collected binary itself when LONGLENS_CODESIGN_IDENTITY is set (the
# spec passes it as codesign_identity, with the entitlements file).
(cd "$ROOT" && PYTHONHASHSEED=0 "$VENV/bin/pyinstaller" --noconfirm --clean \
    --distpath "$DIST" --workpath "$WORK/pyi" installer/longlens.spec)
[ -d "$APP" ] || die "PyInstaller produced no $APP"

"$APP/Contents/MacOS/longlens" --self-test || die "the app's self-test failed"

if [ -n "${LONGLENS_CODESIGN_IDENTITY:-}" ]; then
    # The bundle itself last (inside-out), with the hardened runtime notarisation requires.
    codesign --force --timestamp --options runtime --entitlements "$ENTITLEMENTS" \
        --sign "$LONGLENS_CODESIGN_IDENTITY" "$APP"
    codesign --verify --deep --strict --verbose=2 "$APP"
fi

DMG="$DIST/Longlens-$VERSION-macos-$(uname -m).dmg"
STAGE="$WORK/dmg"
rm -rf "$STAGE" "$DMG"
mkdir -p "$STAGE"
cp -R "$APP" "$STAGE/"
ln -s /Applications "$STAGE/Applications"   # drag-to-install
hdiutil create -volname "Longlens" -srcfolder "$STAGE" -fs HFS+ -format UDZO -ov "$DMG"

if [ -n "${LONGLENS_CODESIGN_IDENTITY:-}" ]; then
    codesign --force --timestamp --sign "$LONGLENS_CODESIGN_IDENTITY" "$DMG"
    if [ -n "${LONGLENS_NOTARY_PROFILE:-}" ]; then
        xcrun notarytool submit "$DMG" --keychain-profile "$LONGLENS_NOTARY_PROFILE" --wait
    elif [ -n "${LONGLENS_APPLE_ID:-}" ] && [ -n "${LONGLENS_TEAM_ID:-}" ] && [ -n "${LONGLENS_APP_PASSWORD:-}" ]; then
        xcrun notarytool submit "$DMG" --apple-id "$LONGLENS_APPLE_ID" --team-id "$LONGLENS_TEAM_ID" \
            --password "$LONGLENS_APP_PASSWORD" --wait
    else
        echo "no notarisation credentials: the dmg is signed but not notarised" >&2
        exit 0
    fi
    xcrun stapler staple "$DMG"        # the ticket travels with the dmg: Gatekeeper checks offline
    xcrun stapler validate "$DMG"
    spctl --assess --type open --context context:primary-signature --verbose=2 "$DMG"
else
    echo "LONGLENS_CODESIGN_IDENTITY not set: the app and dmg are unsigned and not notarised" >&2
fi
ls -l "$DMG"
