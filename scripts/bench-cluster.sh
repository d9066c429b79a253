#!/usr/bin/env bash
# Redis Cluster and replica figures (BENCHMARKS.md, "Redis Cluster"):
#
# 1. lockbench serial, parallel32, contended16 on a private 3-primary cluster,
#    each with the same workload on a private single server in the same run
#    (--single-node), the spread of the scripts over the shards and the
#    servers' CPU time per lock cycle;
# 2. the cost of min_replicas: serial and contended16 on a private primary
#    with one replica, without and with --min-replicas 1;
# 3. the wake-up latency across processes: a deposit holding an account for
#    30 ms in one bank process, a deposit waiting for it in another; from the
#    holder's response to the waiter's, on the cluster and on one server,
#    beside an uncontended deposit on the same bank.
#
#   scripts/bench-cluster.sh                  # 5 s per run, 200 wake-ups
#   SECONDS_PER_RUN=10 WAKES=500 scripts/bench-cluster.sh
#
# Output: target/bench/cluster.jsonl (lockbench's lines, then one line per
# wake-up measurement); progress on stderr. Needs redis-server, redis-cli and
# python3.
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_PER_RUN="${SECONDS_PER_RUN:-5}"
WAKES="${WAKES:-200}"
OUT_DIR=target/bench
RESULTS="$OUT_DIR/cluster.jsonl"
mkdir -p "$OUT_DIR"
log() { echo "bench-cluster: $*" >&2; }

log "building (release)"
BIN=$(FEATURES=redis-cluster scripts/build-example.sh lockbench)
BANK=$(FEATURES=redis-cluster scripts/build-example.sh bank)
[ -x "$BIN" ] && [ -x "$BANK" ] || { log "could not find the example binaries"; exit 1; }

PIDS=()
DIRS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  for dir in "${DIRS[@]}"; do rm -rf "$dir"; done
}
trap cleanup EXIT INT TERM

free_port() { # a port whose cluster bus port (+10000) is free too
  python3 -c '
import socket
while True:
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]
    if p > 55000: s.close(); continue
    t = socket.socket()
    try:
        t.bind(("127.0.0.1", p + 10000)); t.close(); s.close(); print(p); break
    except OSError:
        s.close(); t.close()'
}

start_redis() { # port extra-args...; no persistence, as bench.sh
  local port=$1 dir
  shift
  dir=$(mktemp -d)
  DIRS+=("$dir")
  redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
    --dir "$dir" --logfile "$dir/redis.log" --daemonize no "$@" &
  PIDS+=($!)
  for _ in $(seq 1 100); do
    redis-cli -p "$port" PING >/dev/null 2>&1 && return 0
    sleep 0.05
  done
  log "redis-server on $port did not start"; exit 1
}

# The cluster: 3 primaries.
CLUSTER_PORTS=()
for _ in 1 2 3; do
  p=$(free_port)
  start_redis "$p" --cluster-enabled yes --cluster-config-file nodes.conf
  CLUSTER_PORTS+=("$p")
done
redis-cli --cluster create $(printf '127.0.0.1:%s ' "${CLUSTER_PORTS[@]}") \
  --cluster-replicas 0 --cluster-yes >/dev/null
for _ in $(seq 1 200); do
  ok=0
  for p in "${CLUSTER_PORTS[@]}"; do
    redis-cli -p "$p" CLUSTER INFO | grep -q 'cluster_state:ok' && ok=$((ok + 1))
  done
  [ "$ok" -eq 3 ] && break
  sleep 0.05
done
CLUSTER="redis-cluster://$(printf '127.0.0.1:%s,' "${CLUSTER_PORTS[@]}")"
CLUSTER="${CLUSTER%,}"
CLUSTER_ARG="$(printf 'redis://127.0.0.1:%s,' "${CLUSTER_PORTS[@]}")"
CLUSTER_ARG="${CLUSTER_ARG%,}"

# One server, and a primary with one replica.
SINGLE_PORT=$(free_port); start_redis "$SINGLE_PORT"
SINGLE="redis://127.0.0.1:$SINGLE_PORT"
PRIMARY_PORT=$(free_port); start_redis "$PRIMARY_PORT"
REPLICA_PORT=$(free_port); start_redis "$REPLICA_PORT" --replicaof 127.0.0.1 "$PRIMARY_PORT"
for _ in $(seq 1 200); do
  redis-cli -p "$REPLICA_PORT" INFO replication | grep -q 'master_link_status:up' && break
  sleep 0.05
done
PRIMARY="redis://127.0.0.1:$PRIMARY_PORT"
log "cluster $CLUSTER, single $SINGLE, primary $PRIMARY (replica on $REPLICA_PORT)"

: > "$RESULTS"
flush() {
  for p in "${CLUSTER_PORTS[@]}" "$SINGLE_PORT" "$PRIMARY_PORT"; do
    redis-cli -p "$p" FLUSHALL >/dev/null
  done
}
run() {
  flush
  log "$*"
  "$BIN" "$@" --seconds "$SECONDS_PER_RUN" | tee -a "$RESULTS"
}

for w in serial parallel32 contended16; do
  run --backend "$CLUSTER" --workload "$w" --single-node "$SINGLE"
done
for w in serial contended16; do
  run --backend "$PRIMARY" --workload "$w"
  run --backend "$PRIMARY" --workload "$w" --min-replicas 1
done

# Wake-ups across bank processes.
start_bank() { # extra args...; prints the address
  local out
  out=$(mktemp)
  DIRS+=("$out")
  "$BANK" --listen 127.0.0.1:0 --admin-token bench "$@" >"$out" 2>/dev/null &
  PIDS+=($!)
  for _ in $(seq 1 200); do
    grep -q '^listening on ' "$out" && { sed -n 's/^listening on //p' "$out"; return 0; }
    sleep 0.05
  done
  log "bank did not start"; exit 1
}
flush
C1=$(start_bank --redis-cluster "$CLUSTER_ARG")
C2=$(start_bank --redis-cluster "$CLUSTER_ARG")
S1=$(start_bank --redis "$SINGLE")
S2=$(start_bank --redis "$SINGLE")
log "wake-ups: $WAKES per setting"
python3 - "$WAKES" "$C1" "$C2" "${CLUSTER_PORTS[0]}" cluster "$S1" "$S2" "$SINGLE_PORT" single <<'PY' | tee -a "$RESULTS"
import json, subprocess, sys, threading, time, urllib.request

n = int(sys.argv[1])
settings = [sys.argv[2:6], sys.argv[6:10]]

def post(addr, path):
    req = urllib.request.Request(f"http://{addr}{path}", method="POST", data=b"")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as e:
        return e.code

def redis(port, *args):
    # -c follows the cluster's redirections (harmless on one server).
    return subprocess.run(["redis-cli", "-c", "-p", port, *args],
                          capture_output=True, text=True).stdout.strip()

def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))] if xs else None

for holder_bank, waiter_bank, port, name in settings:
    wakes, skipped = [], 0
    for i in range(n):
        acct = f"wake-{name}-{i}"
        lock = "lock:{g:account:%s}" % acct
        done = {}
        def hold():
            s = post(holder_bank, f"/accounts/{acct}/deposit?amount=1&hold_ms=30")
            done["h"] = (time.perf_counter(), s)
        def wait():
            s = post(waiter_bank, f"/accounts/{acct}/deposit?amount=1&wait_ms=5000")
            done["w"] = (time.perf_counter(), s)
        h = threading.Thread(target=hold); h.start()
        while redis(port, "EXISTS", lock) != "1":
            pass
        w = threading.Thread(target=wait); w.start()
        while redis(port, "LLEN", lock + ":q") != "1" and "h" not in done:
            pass
        queued_in_time = "h" not in done
        h.join(); w.join()
        if not queued_in_time or done["h"][1] != 200 or done["w"][1] != 200:
            skipped += 1
            continue
        wakes.append((done["w"][0] - done["h"][0]) * 1e6)
    alone = []
    for i in range(n):
        t0 = time.perf_counter()
        post(waiter_bank, f"/accounts/alone-{name}-{i}/deposit?amount=1&wait_ms=5000")
        alone.append((time.perf_counter() - t0) * 1e6)
    print(json.dumps({
        "measure": "wake-up across bank processes", "backend": name, "samples": len(wakes),
        "skipped": skipped,
        "holder_response_to_waiter_response_p50_us": round(pct(wakes, 50), 1),
        "holder_response_to_waiter_response_p90_us": round(pct(wakes, 90), 1),
        "uncontended_deposit_p50_us": round(pct(alone, 50), 1),
    }))
PY
log "results in $RESULTS"
