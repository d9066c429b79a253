#!/usr/bin/env bash
# The reliability soak (tests/soak.rs): four `bank --fenced` processes on one
# server, random deposits, random SIGSTOP/SIGCONT of banks, two server
# restarts; minutes per server, so not part of CI. Prints its figures
# (RELIABILITY.md records them).
#
# usage: scripts/soak.sh [redis|postgres]      (default: both, one after the other)
# env:   SOAK_SECS (180), SOAK_DEPOSITS (10000), SOAK_CLIENTS (32), SOAK_SEED
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  "") filter=() ;;
  redis | postgres) filter=("soak_$1") ;;
  *)
    echo "usage: scripts/soak.sh [redis|postgres]" >&2
    exit 2
    ;;
esac
# The same install-then-test path as CI, for the ignored soak tests only.
bash scripts/test.sh --test soak "${filter[@]}" -- --ignored --nocapture --test-threads 1
