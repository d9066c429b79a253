#!/usr/bin/env bash
# Instructions per request (or per lock cycle) of the layer_cost example's
# modes: (run of 300k - run of 100k) / 200k, so start-up cancels out, from
# `perf stat -e instructions:u`. Where the machine has no instruction counter
# (some VMs), from valgrind's callgrind instead, with (60k - 20k) / 40k
# iterations (slower, and exact). Deterministic to a few dozen instructions.
#
#   scripts/layer-cost.sh                    # open locked none ident serial
#   scripts/layer-cost.sh locked open
#
# Needs perf (Debian: linux-perf) or valgrind.
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=$(scripts/build-example.sh layer_cost)
[ -x "$BIN" ] || { echo "could not find the layer_cost binary" >&2; exit 1; }

perf_works() {
  perf stat -x, -e instructions:u true 2>&1 | grep -q '^[0-9]'
}

instructions() {
  if [ "$COUNTER" = perf ]; then
    perf stat -x, -e instructions:u "$BIN" "$1" "$2" 2>&1 >/dev/null | awk -F, '/instructions/ { print $1 }'
  else
    valgrind --tool=callgrind --callgrind-out-file=/dev/null "$BIN" "$1" "$2" 2>&1 >/dev/null |
      awk '/Collected :/ { print $NF }'
  fi
}

if perf_works; then
  COUNTER=perf; LOW=100000; HIGH=300000
else
  COUNTER=callgrind; LOW=20000; HIGH=60000
fi

for mode in "${@:-open locked none ident serial}"; do
  for m in $mode; do
    a=$(instructions "$m" "$LOW")
    b=$(instructions "$m" "$HIGH")
    echo "$m: $(((b - a) / (HIGH - LOW))) instructions per iteration ($COUNTER)"
  done
done
