#!/usr/bin/env bash
# Instructions per request (or per lock cycle) of the layer_cost example's
# modes, from `perf stat -e instructions:u`: (run of 300k - run of 100k) / 200k,
# so start-up cancels out. Deterministic to a few dozen instructions.
#
#   scripts/layer-cost.sh                    # open locked none ident serial
#   scripts/layer-cost.sh locked open
#
# Needs perf (Debian: apt-get install linux-perf).
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=$(scripts/build-example.sh layer_cost)
[ -x "$BIN" ] || { echo "could not find the layer_cost binary" >&2; exit 1; }

instructions() {
  perf stat -x, -e instructions:u "$BIN" "$1" "$2" 2>&1 >/dev/null | awk -F, '/instructions/ { print $1 }'
}

for mode in "${@:-open locked none ident serial}"; do
  for m in $mode; do
    a=$(instructions "$m" 100000)
    b=$(instructions "$m" 300000)
    echo "$m: $(((b - a) / 200000)) instructions per iteration"
  done
done
