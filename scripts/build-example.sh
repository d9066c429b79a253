#!/usr/bin/env bash
# Build example $1 in release (default features, plus $FEATURES if set) and print
# its executable's path, from cargo's own report (so CARGO_TARGET_DIR is
# honoured). Used by bench.sh and layer-cost.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
name="$1"
cargo build --release --example "$name" ${FEATURES:+--features "$FEATURES"} \
  --message-format=json-render-diagnostics |
  python3 -c '
import json, sys
name, exe = sys.argv[1], None
for line in sys.stdin:
    try:
        msg = json.loads(line)
    except ValueError:
        continue
    if msg.get("reason") == "compiler-artifact" and msg.get("target", {}).get("name") == name and msg.get("executable"):
        exe = msg["executable"]
print(exe or "")
' "$name"
