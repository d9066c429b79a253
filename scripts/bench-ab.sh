#!/usr/bin/env bash
# Two (or more) lockbench binaries side by side: each workload runs with each
# binary in turn on the same private servers (scripts/servers.sh), the order
# reversed every other round, so a change in the machine's load favours
# neither. For before/after comparisons of one change.
#
#   scripts/bench-ab.sh BACKENDS WORKLOADS ROUNDS BIN...
#   scripts/bench-ab.sh "redis postgres" "serial parallel32 contended16" 2 old/lockbench new/lockbench
#   SECONDS_PER_RUN=10 scripts/bench-ab.sh etcd contended16 3 a b
#
# Output: one line per run on stdout, "<binary> <backend> <workload> <JSON>"
# (the JSON line lockbench prints; {"failed":true} if it failed). Redis is
# emptied before every run. A build from before a PostgreSQL schema upgrade
# refuses the newer schema: run such a pair once per fresh server instead.
set -euo pipefail
cd "$(dirname "$0")/.."
log() { echo "bench-ab: $*" >&2; }
[ "$#" -ge 4 ] || { log "usage: BACKENDS WORKLOADS ROUNDS BIN..."; exit 2; }
BACKENDS=$1 WORKLOADS=$2 ROUNDS=$3
shift 3
. scripts/servers.sh
for b in $BACKENDS; do
  case $b in
    redis) start_redis ;;
    postgres) start_postgres ;;
    etcd) start_etcd ;;
    *) log "unknown backend $b"; exit 2 ;;
  esac
done
for r in $(seq 1 "$ROUNDS"); do
  bins=("$@")
  if [ $((r % 2)) -eq 0 ]; then
    mapfile -t bins < <(printf '%s\n' "$@" | tac)
  fi
  for b in $BACKENDS; do
    case $b in redis) url=$REDIS_URL ;; postgres) url=$PG_URL ;; etcd) url=$ETCD_URL ;; esac
    for w in $WORKLOADS; do
      for bin in "${bins[@]}"; do
        if [ "$b" = redis ]; then redis-cli -p "$PORT" flushall >/dev/null; fi
        line=$("$bin" --backend "$url" --workload "$w" --seconds "${SECONDS_PER_RUN:-5}" 2>/dev/null ||
          echo '{"failed":true}')
        echo "$bin $b $w $line"
      done
    done
  done
done
