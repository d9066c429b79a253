#!/usr/bin/env bash
# The fault-schedule checker's long run (tests/chaos): every backend under
# random fault schedules, every history checked for two holders, falling
# fences, lost wake-ups, lost updates, handles that said "held" after their
# lease, and locks that never come free. The short pass (two schedules per
# backend) runs in CI with the rest of the suite; this runs many more.
#
#   scripts/check.sh                        # 200 schedules on each backend
#   BACKENDS="redis postgres" CHAOS_SCHEDULES=50 scripts/check.sh
#   CHAOS_BACKEND=redis CHAOS_SEED=1234 cargo test --all-features --test chaos \
#       long_run -- --ignored --nocapture   # replay one schedule
#   scripts/check.sh --mutants              # prove it: each breakage found?
#                                           # (8-s schedules; CHAOS_RUN_MS overrides)
#
# Backends: memory redis redis-cluster redis-cluster-failover postgres etcd.
# Knobs: CHAOS_SCHEDULES (200), CHAOS_SEED_BASE (1000), CHAOS_RUN_MS (2500),
# CHAOS_PROCESSES (2), CHAOS_TASKS (3), CHAOS_FAULTS (3), CHAOS_KINDS_TASKS (2 per
# process on the shared/permits keys; 0: none; skipped with a note where the
# backend answers Unsupported), CHAOS_WAKE_BOUND_MS (250), CHAOS_FAULT_KINDS
# (only these faults of the menu, e.g. StopSessions,Pause), CHAOS_WALK_AWAY
# (percent of exclusive holds that walk away besides the usual 5),
# CHAOS_RELAY_TASKS (3 per process taking turns on the relay key; 0: none),
# TOWER_LOCK_ETCD_ARGS (more flags for the etcd members, e.g.
# "--auto-compaction-mode=periodic --auto-compaction-retention=1s"). Each backend prints one line per schedule and a
# `CHAOS-SUMMARY {json}` line; the logs go to target/chaos/, with the timeline
# of each failing schedule in target/chaos/<backend>.dump.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--mutants" ]; then
  shift
  exec python3 scripts/chaos_mutants.py "$@"
fi

BACKENDS="${BACKENDS:-memory redis redis-cluster redis-cluster-failover postgres etcd}"
export CHAOS_SCHEDULES="${CHAOS_SCHEDULES:-200}"
mkdir -p target/chaos
# Run a copy of the test binary: its client processes are the binary itself,
# and a build meanwhile (another cargo command in this tree) replaces it.
built=$(cargo test --all-features --test chaos --no-run 2>&1 |
  sed -n 's/.*Executable tests\/chaos\/main.rs (\(.*\))$/\1/p')
[ -n "$built" ] || { echo "no chaos test binary"; exit 1; }
bin="target/chaos/chaos-$$"
cp "$built" "$bin"
trap 'rm -f "$bin"' EXIT
status=0
for backend in $BACKENDS; do
  log="target/chaos/$backend.log"
  rm -f "target/chaos/$backend.dump"
  echo "== $backend: $CHAOS_SCHEDULES schedules (log: $log)"
  # A failing schedule's timeline (and its history's JSON beside it).
  if ! CHAOS_DUMP="${CHAOS_DUMP:-$PWD/target/chaos/$backend.dump}" \
      CHAOS_BACKEND="$backend" "$bin" long_run --exact --ignored --nocapture >"$log" 2>&1; then
    status=1
    grep -E "VIOLATION|panicked" "$log" | head -20 || true
  fi
  grep "CHAOS-SUMMARY" "$log" || { echo "no summary for $backend"; status=1; }
done
exit $status
