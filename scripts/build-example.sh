#!/usr/bin/env bash
# Build example $1 in release (default features, plus $FEATURES if set) and print
# its executable's path, from cargo's own report (so CARGO_TARGET_DIR is
# honoured). Used by bench.sh and layer-cost.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
name="$1"
cargo build --release --example "$name" ${FEATURES:+--features "$FEATURES"} \
  --message-format=json-render-diagnostics |
  python3 scripts/exe-of.py "$name"
