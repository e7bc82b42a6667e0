#!/usr/bin/env bash
# Fetch one pinned PyPI wheel (code only) into the reference cache and unpack it.
#
#   tests/references/fetch_wheel.sh CACHE_DIR DIST VERSION WHEEL SHA256 CHECK_FILE
#   PYTHON=/path/to/python ...   (default: <repo>/.venv/bin/python)
#
# e.g. megatron-bridge 0.6.2 and megatron-core 0.19.2 (see the Makefile's `references`). Both need
# Python 3.12, so pip downloads the 3.12 wheel (--python-version 3.12 --only-binary=:all:
# --no-deps); nothing is installed anywhere. Result: CACHE_DIR/<dist with _>-VERSION/<wheel files>
# (tests/references/bridge.py and bridge_runtime.py import from there). A stamp file written last
# marks a complete fetch; without it the folder is fetched again from scratch.
set -euo pipefail

if [[ $# -ne 6 ]]; then
    echo "usage: fetch_wheel.sh CACHE_DIR DIST VERSION WHEEL SHA256 CHECK_FILE" >&2
    exit 2
fi
CACHE="$1"; DIST="$2"; VERSION="$3"; WHEEL="$4"; WHEEL_SHA256="$5"; CHECK_FILE="$6"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PYTHON="${PYTHON:-$REPO/.venv/bin/python}"
DEST="$CACHE/${DIST//-/_}-$VERSION"
STAMP="$DEST/.fetched"

if [[ -f "$STAMP" && -f "$DEST/$CHECK_FILE" ]]; then
    echo "$DIST $VERSION already in $DEST"
    exit 0
fi
if [[ ! -x "$PYTHON" ]] && ! command -v "$PYTHON" >/dev/null 2>&1; then
    echo "fetch_wheel.sh: no python at '$PYTHON' (set PYTHON=...)" >&2
    exit 1
fi

mkdir -p "$CACHE"
WORK="$(mktemp -d "$CACHE/.fetch-$DIST.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

echo "fetching $DIST $VERSION into $DEST"
"$PYTHON" -m pip download --quiet --disable-pip-version-check --no-deps \
    --python-version 3.12 --only-binary=:all: "$DIST==$VERSION" -d "$WORK/wheel"

if [[ ! -f "$WORK/wheel/$WHEEL" ]]; then
    echo "fetch_wheel.sh: pip did not produce $WHEEL (got: $(ls "$WORK/wheel"))" >&2
    exit 1
fi
"$PYTHON" - "$WORK/wheel/$WHEEL" "$WHEEL_SHA256" <<'PY'
import hashlib, sys
path, expected = sys.argv[1], sys.argv[2]
with open(path, "rb") as f:
    got = hashlib.sha256(f.read()).hexdigest()
if got != expected:
    sys.exit(f"fetch_wheel.sh: {path} has sha256 {got}, expected {expected}")
PY

"$PYTHON" -m zipfile -e "$WORK/wheel/$WHEEL" "$WORK/unpacked"
if [[ ! -f "$WORK/unpacked/$CHECK_FILE" ]]; then
    echo "fetch_wheel.sh: $WHEEL has no $CHECK_FILE" >&2
    exit 1
fi

rm -rf "$DEST"
mv "$WORK/unpacked" "$DEST"
printf '%s==%s\n%s  %s\n' "$DIST" "$VERSION" "$WHEEL_SHA256" "$WHEEL" > "$STAMP.tmp"
mv "$STAMP.tmp" "$STAMP"
echo "$DIST $VERSION unpacked in $DEST"
