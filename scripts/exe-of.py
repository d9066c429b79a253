#!/usr/bin/env python3
"""Print the executable cargo reports building for target argv[1], read from
cargo's JSON messages on stdin (`--message-format=json-render-diagnostics`),
so that CARGO_TARGET_DIR is honoured. Empty when none was built."""

import json
import sys

name, exe = sys.argv[1], None
for line in sys.stdin:
    try:
        msg = json.loads(line)
    except ValueError:
        continue
    if (msg.get("reason") == "compiler-artifact"
            and msg.get("target", {}).get("name") == name and msg.get("executable")):
        exe = msg["executable"]
print(exe or "")
