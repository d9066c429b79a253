#!/usr/bin/env bash
# Shared holds and permits beside the peer (issue 23): lockbench's readers64
# and permits4 against distributed-lock 0.2's reader-writer lock and
# semaphore (benches/peers/distributed-lock), on one private Redis and one
# private PostgreSQL, in the same run, the two programs alternating.
#
#   scripts/bench-kinds.sh                   # 5 s per run, one round
#   SECONDS_PER_RUN=10 ROUNDS=2 scripts/bench-kinds.sh
#   BACKENDS=redis WORKLOADS=permits4 scripts/bench-kinds.sh
#   TOOLS=peer scripts/bench-kinds.sh        # the peer only (or TOOLS=lockbench)
#   LOCKBENCH_BIN=path PEER_BIN=path ...     # use binaries built already
#
# Each backend x workload runs lockbench then the peer (round 1), the peer
# then lockbench (round 2), and so on: a change in the shared machine's load
# does not favour one side. Redis is emptied (FLUSHALL) before every run.
#
# Output: one JSON line per run on stdout (a run that fails prints a line
# with "failed" and the program's last stderr line instead, and the script
# goes on), then a table; the lines also go to target/bench/kinds.jsonl.
# Progress on stderr. Needs redis-server, PostgreSQL's server binaries and
# python3 (see scripts/bench.sh for installing them).
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_PER_RUN="${SECONDS_PER_RUN:-5}"
ROUNDS="${ROUNDS:-1}"
BACKENDS="${BACKENDS:-redis postgres}"
WORKLOADS="${WORKLOADS:-readers64 permits4}"
TOOLS="${TOOLS:-lockbench peer}"
OUT_DIR=target/bench
RESULTS="$OUT_DIR/kinds.jsonl"
mkdir -p "$OUT_DIR"

log() { echo "bench-kinds: $*" >&2; }

if [[ " $TOOLS " == *" lockbench "* ]] && [ -z "${LOCKBENCH_BIN:-}" ]; then
  log "building lockbench (release, features ${LOCKBENCH_FEATURES:-redis,postgres})"
  LOCKBENCH_BIN=$(FEATURES="${LOCKBENCH_FEATURES:-redis,postgres}" scripts/build-example.sh lockbench)
  [ -x "$LOCKBENCH_BIN" ] || { log "could not build lockbench"; exit 1; }
fi
# The peer is a project of its own (not in the crate's workspace).
PEER_DIR=benches/peers/distributed-lock
if [[ " $TOOLS " == *" peer "* ]] && [ -z "${PEER_BIN:-}" ]; then
  log "building the distributed-lock peer (release)"
  PEER_BIN=$(cargo build --release --manifest-path "$PEER_DIR/Cargo.toml" \
    --message-format=json-render-diagnostics | python3 scripts/exe-of.py distributed-lock-peer-bench)
  [ -x "$PEER_BIN" ] || { log "could not build the peer"; exit 1; }
fi

# The private servers, as scripts/bench.sh starts them (scripts/servers.sh).
. scripts/servers.sh
if [[ " $BACKENDS " == *" redis "* ]]; then start_redis; fi
if [[ " $BACKENDS " == *" postgres "* ]]; then start_postgres; fi

peer_version=$(sed -n '/^name = "distributed-lock-core"$/{n;s/^version = "\(.*\)"$/\1/p}' "$PEER_DIR/Cargo.lock" 2>/dev/null || true)
echo "# run $(date -u +%Y-%m-%dT%H:%M:%SZ), ${SECONDS_PER_RUN} s per run, $ROUNDS round(s);" \
  "redis-server $(redis-server --version 2>/dev/null | sed -n 's/.*v=\([^ ]*\).*/\1/p')," \
  "$("$(pg_config --bindir)/postgres" --version 2>/dev/null);" \
  "distributed-lock ${peer_version:-?}; tower-lock $(git rev-parse --short HEAD)"

: > "$RESULTS"

run() { # tool backend-name backend-url workload
  local tool=$1 name=$2 url=$3 workload=$4 bin line err="$OUT_DIR/kinds-stderr.txt"
  case $tool in
    lockbench) bin=$LOCKBENCH_BIN ;;
    peer) bin=$PEER_BIN ;;
  esac
  if [ "$name" = redis ]; then
    redis-cli -p "$PORT" FLUSHALL >/dev/null
  fi
  log "$tool $name $workload (${SECONDS_PER_RUN} s)"
  if line=$("$bin" --backend "$url" --workload "$workload" --seconds "$SECONDS_PER_RUN" 2>"$err"); then
    cat "$err" >&2
  else
    local rc=$?  # (the failed command's status: read before anything else)
    cat "$err" >&2
    log "FAILED (exit $rc): $tool $name $workload"
    # A line of its own, so the comparison shows what could not run and why.
    line=$(python3 -c '
import json, sys
tool, backend, workload, rc, err = sys.argv[1:]
peer = "tower-lock" if tool == "lockbench" else "distributed-lock 0.2"
last = [l for l in err.splitlines() if l.strip()]
print(json.dumps({"peer": peer, "backend": backend, "workload": workload,
                  "failed": f"exit {rc}: " + (last[-1] if last else "no message")}))
' "$tool" "$name" "$workload" "$rc" "$(cat "$err")")
  fi
  echo "$line" | tee -a "$RESULTS"
}

read -r -a tools <<< "$TOOLS"
for round in $(seq 1 "$ROUNDS"); do
  order=("${tools[@]}")
  if [ $((round % 2)) -eq 0 ] && [ "${#tools[@]}" -eq 2 ]; then
    order=("${tools[1]}" "${tools[0]}")
  fi
  for b in $BACKENDS; do
    case $b in
      redis) url=$REDIS_URL ;;
      postgres) url=$PG_URL ;;
      *) log "unknown backend $b"; exit 2 ;;
    esac
    for w in $WORKLOADS; do
      for t in "${order[@]}"; do run "$t" "$b" "$url" "$w"; done
    done
  done
done

python3 - "$RESULTS" <<'EOF'
import json, sys

rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print()
print("| backend | workload | library | ops/s | p50 wait µs | p99 wait µs | max holders | "
      "utilisation | same-worker % | errors |")
print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
for r in sorted(rows, key=lambda r: (r["backend"], r["workload"], r["peer"])):
    if "failed" in r:
        print(f"| {r['backend']} | {r['workload']} | {r['peer']} | did not run: {r['failed']} "
              "| | | | | | |")
        continue
    print(f"| {r['backend']} | {r['workload']} | {r['peer']} | {r['ops_per_s']:,.0f} | "
          f"{r['p50_us']:,.1f} | {r['p99_us']:,.1f} | {r['max_concurrent_holders']} | "
          f"{r['utilisation']:.2f} | {r['same_worker_reacquire_pct']:.1f} | {r['errors']:,} |")
EOF
log "results: $RESULTS"
