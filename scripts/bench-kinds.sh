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

# Print the executable cargo reports building for target $1 (stdin: cargo's
# JSON messages), so CARGO_TARGET_DIR is honoured.
exe_of() {
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
' "$1"
}

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
    --message-format=json-render-diagnostics | exe_of distributed-lock-peer-bench)
  [ -x "$PEER_BIN" ] || { log "could not build the peer"; exit 1; }
fi

REDIS_PID="" REDIS_DIR="" PG_PID="" PG_DIR=""
cleanup() {
  if [ -n "$REDIS_PID" ]; then
    kill "$REDIS_PID" 2>/dev/null || true
    wait "$REDIS_PID" 2>/dev/null || true
  fi
  if [ -n "$REDIS_DIR" ]; then rm -rf "$REDIS_DIR"; fi
  if [ -n "$PG_PID" ]; then
    # $PG_PID is runuser, which does not pass signals on: stop the
    # postmaster itself (immediate shutdown), then wait for both.
    if [ -f "$PG_DIR/data/postmaster.pid" ]; then
      kill -QUIT "$(head -n 1 "$PG_DIR/data/postmaster.pid")" 2>/dev/null || true
    fi
    kill -QUIT "$PG_PID" 2>/dev/null || true
    wait "$PG_PID" 2>/dev/null || true
  fi
  if [ -n "$PG_DIR" ]; then rm -rf "$PG_DIR"; fi
}
trap cleanup EXIT INT TERM

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

# A private Redis on a free port, as scripts/bench.sh starts it.
if [[ " $BACKENDS " == *" redis "* ]]; then
  PORT=$(free_port)
  REDIS_DIR=$(mktemp -d)
  redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no \
    --dir "$REDIS_DIR" --logfile "$REDIS_DIR/redis.log" --daemonize no &
  REDIS_PID=$!
  for _ in $(seq 1 100); do
    redis-cli -p "$PORT" PING >/dev/null 2>&1 && break
    sleep 0.05
  done
  redis-cli -p "$PORT" PING >/dev/null || { log "redis-server did not start"; exit 1; }
  REDIS_URL="redis://127.0.0.1:$PORT"
  log "redis-server $(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p') on $REDIS_URL"
fi

# A private PostgreSQL on a free port, as scripts/bench.sh and the tests
# start theirs: initdb into a temp dir (as the postgres user when root), a
# private socket directory, fsync off.
if [[ " $BACKENDS " == *" postgres "* ]]; then
  PG_BIN=$(pg_config --bindir)
  PG_PORT=$(free_port)
  PG_DIR=$(mktemp -d)
  as_pg=()
  if [ "$(id -u)" -eq 0 ]; then
    chown postgres "$PG_DIR"
    as_pg=(runuser -u postgres --)
  fi
  "${as_pg[@]}" "$PG_BIN/initdb" -D "$PG_DIR/data" -U postgres -A trust --no-sync >/dev/null
  "${as_pg[@]}" "$PG_BIN/postgres" -D "$PG_DIR/data" -p "$PG_PORT" -k "$PG_DIR" \
    -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200 \
    > "$PG_DIR/server.log" 2>&1 &
  PG_PID=$!
  for _ in $(seq 1 200); do
    "$PG_BIN/pg_isready" -h 127.0.0.1 -p "$PG_PORT" >/dev/null 2>&1 && break
    sleep 0.05
  done
  "$PG_BIN/pg_isready" -h 127.0.0.1 -p "$PG_PORT" >/dev/null || { log "postgres did not start"; exit 1; }
  PG_URL="postgres://postgres@127.0.0.1:$PG_PORT/postgres"
  log "$("$PG_BIN/postgres" --version) on $PG_URL"
fi

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
