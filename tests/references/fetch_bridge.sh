#!/usr/bin/env bash
# Fetch Megatron-Bridge 0.6.2 (the PyPI wheel, code only) into a reference cache.
#
#   tests/references/fetch_bridge.sh [CACHE_DIR]      (default: <repo>/.cache/references)
#   PYTHON=/path/to/python tests/references/fetch_bridge.sh   (default: <repo>/.venv/bin/python)
#
# Result: CACHE_DIR/megatron_bridge-0.6.2/megatron/bridge/... (tests/references/bridge.py imports
# single modules from there; nothing is installed anywhere). A stamp file written last marks a
# complete fetch; without it the folder is fetched again from scratch.
set -euo pipefail

VERSION=0.6.2
WHEEL="megatron_bridge-${VERSION}-py3-none-any.whl"
WHEEL_SHA256=bcb7274ab9327167c345aa24b96b95790ce5090df1945d883bdc41065d5649e2
CHECK_FILE=megatron/bridge/models/nemotron_vl/nemotron_vl_utils.py

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CACHE="${1:-$REPO/.cache/references}"
PYTHON="${PYTHON:-$REPO/.venv/bin/python}"
DEST="$CACHE/megatron_bridge-$VERSION"
STAMP="$DEST/.fetched"

if [[ -f "$STAMP" && -f "$DEST/$CHECK_FILE" ]]; then
    echo "megatron-bridge $VERSION already in $DEST"
    exit 0
fi
if [[ ! -x "$PYTHON" ]] && ! command -v "$PYTHON" >/dev/null 2>&1; then
    echo "fetch_bridge.sh: no python at '$PYTHON' (set PYTHON=...)" >&2
    exit 1
fi

mkdir -p "$CACHE"
WORK="$(mktemp -d "$CACHE/.fetch-bridge.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

echo "fetching megatron-bridge $VERSION into $DEST"
"$PYTHON" -m pip download --quiet --disable-pip-version-check --no-deps \
    --python-version 3.12 --only-binary=:all: "megatron-bridge==$VERSION" -d "$WORK/wheel"

if [[ ! -f "$WORK/wheel/$WHEEL" ]]; then
    echo "fetch_bridge.sh: pip did not produce $WHEEL (got: $(ls "$WORK/wheel"))" >&2
    exit 1
fi
"$PYTHON" - "$WORK/wheel/$WHEEL" "$WHEEL_SHA256" <<'EOF'
import hashlib, sys
path, expected = sys.argv[1], sys.argv[2]
with open(path, "rb") as f:
    got = hashlib.sha256(f.read()).hexdigest()
if got != expected:
    sys.exit(f"fetch_bridge.sh: {path} has sha256 {got}, expected {expected}")
EOF

"$PYTHON" -m zipfile -e "$WORK/wheel/$WHEEL" "$WORK/unpacked"
if [[ ! -f "$WORK/unpacked/$CHECK_FILE" ]]; then
    echo "fetch_bridge.sh: $WHEEL has no $CHECK_FILE" >&2
    exit 1
fi

rm -rf "$DEST"
mv "$WORK/unpacked" "$DEST"
printf 'megatron-bridge==%s\n%s  %s\n' "$VERSION" "$WHEEL_SHA256" "$WHEEL" > "$STAMP.tmp"
mv "$STAMP.tmp" "$STAMP"
echo "megatron-bridge $VERSION unpacked in $DEST"
