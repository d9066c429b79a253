#!/usr/bin/env bash
# Run every lockbench workload on every backend against a private Redis, a
# private PostgreSQL and a private 3-member etcd cluster, with the workloads
# and accounting BENCHMARKS.md defines, and check the targets it lists.
#
#   scripts/bench.sh                      # 5 s per run
#   SECONDS_PER_RUN=10 scripts/bench.sh
#   BACKENDS=memory scripts/bench.sh      # or BACKENDS="redis postgres etcd"
#   LOCKBENCH_BIN=path scripts/bench.sh   # a lockbench built already (before/after)
#
# Output: target/bench/results.jsonl (one JSON line per run), a markdown table
# and the target checks (PASS/MISS) on stdout; progress on stderr.
# Needs redis-server, PostgreSQL's server binaries, etcd (and protoc to build
# the etcd feature) and python3 (installs redis-server, postgresql,
# etcd-server and protobuf-compiler with apt-get if absent).
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_PER_RUN="${SECONDS_PER_RUN:-5}"
BACKENDS="${BACKENDS:-memory redis postgres etcd}"
OUT_DIR=target/bench
RESULTS="$OUT_DIR/results.jsonl"
mkdir -p "$OUT_DIR"

log() { echo "bench: $*" >&2; }

missing=()
[[ " $BACKENDS " == *" redis "* ]] && ! command -v redis-server >/dev/null 2>&1 && missing+=(redis-server)
[[ " $BACKENDS " == *" postgres "* ]] && ! [ -x "$(pg_config --bindir 2>/dev/null)/initdb" ] && missing+=(postgresql)
[[ " $BACKENDS " == *" etcd "* ]] && ! command -v etcd >/dev/null 2>&1 && missing+=(etcd-server)
[[ " $BACKENDS " == *" etcd "* ]] && ! command -v protoc >/dev/null 2>&1 && missing+=(protobuf-compiler)
if [ "${#missing[@]}" -gt 0 ]; then
  log "installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# Build once; find the binary from cargo's own report (honours CARGO_TARGET_DIR).
log "building (release)"
# Redis is a feature of its own (not a default one); postgres only when asked.
features="redis"
[[ " $BACKENDS " == *" postgres "* ]] && features="redis,postgres"
[[ " $BACKENDS " == *" etcd "* ]] && features="$features,etcd"
BIN=${LOCKBENCH_BIN:-$(FEATURES=$features scripts/build-example.sh lockbench)}
[ -x "$BIN" ] || { log "could not find the lockbench binary"; exit 1; }

# The private servers (scripts/servers.sh): Redis, PostgreSQL, a 3-member
# etcd cluster (on the real disk unless ETCD_DATA_PARENT says otherwise),
# stopped on exit.
. scripts/servers.sh
if [[ " $BACKENDS " == *" redis "* ]]; then start_redis; fi
if [[ " $BACKENDS " == *" postgres "* ]]; then start_postgres; fi
if [[ " $BACKENDS " == *" etcd "* ]]; then start_etcd; fi

: > "$RESULTS"
FAILED="$OUT_DIR/failed.txt"
: > "$FAILED"

run() { # backend-arg workload
  local backend=$1 workload=$2 line err="$OUT_DIR/stderr.txt"
  if [[ "$backend" == redis* ]]; then
    redis-cli -p "$PORT" FLUSHALL >/dev/null
  fi
  # (lockbench empties its own PostgreSQL tables and etcd prefixes before a run.)
  log "$backend $workload (${SECONDS_PER_RUN} s)"
  if line=$("$BIN" --backend "$backend" --workload "$workload" --seconds "$SECONDS_PER_RUN" 2>"$err"); then
    cat "$err" >&2
    echo "$line" >> "$RESULTS"
  else
    cat "$err" >&2
    log "FAILED: $backend $workload"
    echo "${backend%%://*} $workload failed" >> "$FAILED"
  fi
}

for b in $BACKENDS; do
  case $b in
    memory)
      for w in serial parallel32 contended16 http held flight64 ${KINDS_WORKLOADS-readers64 permits4 kinds-serial}; do run memory "$w"; done
      ;;
    redis)
      for w in raw-serial raw-parallel32 serial parallel32 contended16 http held flight64 ${KINDS_WORKLOADS-readers64 permits4 kinds-serial}; do
        run "$REDIS_URL" "$w"
      done
      ;;
    postgres)
      for w in raw-serial raw-parallel32 serial parallel32 contended16 http held flight64 ${KINDS_WORKLOADS-readers64 permits4 kinds-serial}; do
        run "$PG_URL" "$w"
      done
      ;;
    etcd)
      # ETCD_WORKLOADS: a subset (e.g. "contended16 flight64").
      for w in ${ETCD_WORKLOADS:-raw-serial raw-parallel32 serial parallel32 contended16 http held flight64 readers64 permits4 kinds-serial}; do
        run "$ETCD_URL" "$w"
      done
      ;;
    *) log "unknown backend $b"; exit 2 ;;
  esac
done

python3 - "$RESULTS" "$FAILED" <<'EOF'
import json, sys

rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
# Single-flight bursts have a table of their own.
flights = [r for r in rows if r["workload"] == "flight64"]
rows = [r for r in rows if r["workload"] != "flight64"]
failed = [l.split() for l in open(sys.argv[2]) if l.strip()]
by = {(r["backend"], r["workload"]): r for r in rows}

def num(x, digits=1):
    if x is None:
        return "–"
    if isinstance(x, float) and digits == 0:
        x = round(x)
    if isinstance(x, int) or digits == 0:
        return f"{int(x):,}"
    return f"{x:,.{digits}f}"

print("| backend | workload | ops/s | p50 µs | p99 µs | max holders | errors | extras |")
print("|---|---|---:|---:|---:|---:|---:|---|")
extra_keys = [
    ("hold_p50_us", "hold p50 µs", 1), ("hold_mean_us", "hold mean µs", 1),
    ("wait_max_us", "max wait µs", 0), ("utilisation", "utilisation", 3),
    ("same_worker_reacquire_pct", "same-worker %", 1),
    ("unlocked_ops_per_s", "unlocked ops/s", 0), ("unlocked_p50_us", "unlocked p50 µs", 1),
    ("p50_added_us", "p50 added µs", 1), ("one_conn_p50_added_us", "1-conn p50 added µs", 1),
    ("empty_ops_per_s", "empty ops/s", 0),
    ("empty_p50_us", "empty p50 µs", 2), ("held_keys", "held keys", 0),
    ("ratio", "ratio", 3), ("raw_ops_per_s", "raw ops/s (same run)", 0),
    ("raw_p50_us", "raw p50 µs", 1), ("ratio_to_raw", "ratio to raw", 3),
    ("rtt_p50_us", "PING p50 µs", 1), ("idle_rtt_p50_us", "PING after 1-ms idle p50 µs", 1),
    ("advisory_ops_per_s", "advisory locks ops/s (same run)", 0),
    ("advisory_p50_us", "advisory p50 µs", 1), ("live_rows_after", "live rows after", 0),
    ("keys_after", "keys left after", 0),
    ("release_check_keys_after", "keys left after 10^5 locked and released", 0),
    ("shared_ratio", "shared cycle / exclusive", 3), ("permits_ratio", "permit cycle / exclusive", 3),
]
for r in rows:
    extras = ", ".join(f"{label} {num(r[k], d)}" for k, label, d in extra_keys if k in r)
    small = r["backend"] == "memory" and r["workload"] in ("serial", "parallel32", "held")
    # kinds-serial reports ratios only (no rate, no waits of its own).
    holders = r.get("max_concurrent_holders")
    print(f"| {r['backend']} | {r['workload']} | {num(r.get('ops_per_s'), 0)} | "
          f"{num(r.get('p50_us'), 2 if small else 1)} | {num(r.get('p99_us'), 2 if small else 1)} | "
          f"{num(holders, 0) if holders is not None else '–'} | "
          f"{r['errors']} | {extras} |")
for b, w, status in failed:
    print(f"| {b} | {w} | {status} | | | | | |")

if flights:
    print()
    print("| backend | bursts of 64 | handler runs per burst (mean, max) | p50 ms | p99 ms | "
          "max ms | same burst without the layer: p50, p99 ms | errors |")
    print("|---|---:|---|---:|---:|---:|---|---:|")
    for r in flights:
        print(f"| {r['backend']} | {r['bursts']} | {r['runs_per_burst_mean']}, "
              f"{r['runs_per_burst_max']} | {r['p50_ms']} | {r['p99_ms']} | {r['max_ms']} | "
              f"{r['plain_p50_ms']}, {r['plain_p99_ms']} | {r['errors']} |")

checks = []
def check(name, ok, detail):
    checks.append((name, ok, detail))

def get(b, w):
    return by.get((b, w))

# Redis vs the raw client. The serial/parallel32 runs measure the raw loop
# themselves in alternating slices (ratio_to_raw, free of the drift between
# two runs); the separate raw-* run is shown beside it.
# Redis's 0.9 target is retired (a fenced, fair lock does about twice a bare
# lock's server work); its ratio is reported. PostgreSQL's target is 0.8;
# etcd's 0.8 (serial) and 0.7 (parallel32).
targets = {("redis", "serial"): None, ("redis", "parallel32"): None,
           ("postgres", "serial"): 0.8, ("postgres", "parallel32"): 0.8,
           ("etcd", "serial"): 0.8, ("etcd", "parallel32"): 0.7}
for (b, w), target in targets.items():
        r, raw = get(b, w), get(b, "raw-" + w)
        if r and "ratio_to_raw" in r:
            detail = (f"{r['ops_per_s']:,.0f} / {r['raw_ops_per_s']:,.0f} = {r['ratio_to_raw']:.3f} "
                      f"(alternating in one run)")
            if raw:
                detail += f"; vs the raw-{w} run: {r['ops_per_s'] / raw['ops_per_s']:.3f}"
            if target is None:
                check(f"{b} {w} / raw-{w} (reported)", True, detail)
            else:
                check(f"{b} {w} >= {target} x raw-{w}", r["ratio_to_raw"] >= target, detail)

for b in ("memory", "redis", "postgres", "etcd"):
    c = get(b, "contended16")
    if not c:
        continue
    if b == "redis":
        raw = get("redis", "raw-serial")
        if raw:
            hold = c["hold_mean_us"]
            bound = hold / (hold + raw["p50_us"])
            check("redis contended16 utilisation >= 0.95 x hold/(hold + raw-serial p50)",
                  c["utilisation"] >= 0.95 * bound,
                  f"{c['utilisation']:.3f} vs 0.95 x {bound:.3f} = {0.95 * bound:.3f} "
                  f"(hold {hold:,.0f} µs, raw-serial p50 {raw['p50_us']:,.0f} µs; "
                  f"idle time per handoff {1e6 / c['ops_per_s'] - hold:,.0f} µs, "
                  f"PING after a 1-ms idle p50 {c.get('idle_rtt_p50_us', 0):,.0f} µs)")
    elif b == "memory":
        check("memory contended16 utilisation >= 0.95", c["utilisation"] >= 0.95,
              f"{c['utilisation']:.3f}")
    else:
        redis_c = get("redis", "contended16")
        check(f"{b} contended16 utilisation (reported)", True,
              f"{c['utilisation']:.3f}" + (f" (Redis {redis_c['utilisation']:.3f})" if redis_c else ""))
    # etcd: 100 ms (a hand-off is a Raft commit, fsynced by a majority).
    wait_ms = 100 if b == "etcd" else 50
    check(f"{b} contended16 p99 acquire wait <= {wait_ms} ms", c["p99_us"] <= wait_ms * 1000,
          f"{c['p99_us']:,.0f} µs")
    check(f"{b} contended16 same-worker reacquire <= 20 %",
          c["same_worker_reacquire_pct"] <= 20, f"{c['same_worker_reacquire_pct']:.1f} %")
    check(f"{b} contended16 max concurrent holders == 1",
          c["max_concurrent_holders"] == 1, f"{c['max_concurrent_holders']}")

# Shared holds and permits (issue 23): never over the kind's bound; permits
# kept busy and fair; a shared or permit cycle within 1.3 x an exclusive one.
for b in ("memory", "redis", "postgres", "etcd"):
    rd = get(b, "readers64")
    if rd:
        check(f"{b} readers64 max concurrent holders <= 64", rd["max_concurrent_holders"] <= 64,
              f"{rd['max_concurrent_holders']} (utilisation {rd['utilisation']:.1f}, "
              f"p99 wait {rd['p99_us']:,.0f} µs)")
    p4 = get(b, "permits4")
    if p4:
        check(f"{b} permits4 max concurrent holders <= 4", p4["max_concurrent_holders"] <= 4,
              f"{p4['max_concurrent_holders']}")
        check(f"{b} permits4 utilisation >= 0.9 x 4", p4["utilisation"] >= 3.6,
              f"{p4['utilisation']:.2f} (p99 wait {p4['p99_us']:,.0f} µs)")
        check(f"{b} permits4 same-worker <= 20 %", p4["same_worker_reacquire_pct"] <= 20,
              f"{p4['same_worker_reacquire_pct']:.1f} %")
    ks = get(b, "kinds-serial")
    if ks:
        for kind in ("shared", "permits"):
            check(f"{b} {kind} cycle <= 1.3 x exclusive", ks[f"{kind}_ratio"] <= 1.3,
                  f"{ks[f'{kind}_ratio']:.3f} ({ks[f'{kind}_cycle_us']:,.1f} µs vs "
                  f"{ks['exclusive_cycle_us']:,.1f} µs)")

s = get("memory", "serial")
if s:
    check("memory serial >= 1,000,000 cycles/s", s["ops_per_s"] >= 1_000_000,
          f"{s['ops_per_s']:,.0f}/s (p50 {s['p50_us']} µs)")

h = get("memory", "http")
if h:
    check("memory http >= 0.9 x route without the layer", h["ratio"] >= 0.9,
          f"{h['ops_per_s']:,.0f} / {h['unlocked_ops_per_s']:,.0f} = {h['ratio']:.3f}")
h = get("redis", "http")
if h and "rtt_p50_us" in h:
    limit = 2 * h["rtt_p50_us"] + 50
    check("redis http p50 added <= 2 RTT + 50 µs (32 connections)", h["p50_added_us"] <= limit,
          f"{h['p50_added_us']:,.1f} µs vs 2 x {h['rtt_p50_us']:.1f} + 50 = {limit:,.1f} µs")
    if "one_conn_p50_added_us" in h:
        check("redis http p50 added <= 2 RTT + 50 µs (one connection, unloaded)",
              h["one_conn_p50_added_us"] <= limit,
              f"{h['one_conn_p50_added_us']:,.1f} µs vs {limit:,.1f} µs")

for b in ("memory", "redis", "postgres", "etcd"):
    x = get(b, "held")
    if x:
        check(f"{b} held >= 0.9 x serial on an empty backend", x["ratio"] >= 0.9,
              f"{x['ops_per_s']:,.0f} / {x['empty_ops_per_s']:,.0f} = {x['ratio']:.3f} "
              f"({x['held_keys']:,} keys held)")

for r in rows:
    for k, what in (("keys_after", "keys left under the prefix"),
                    ("release_check_keys_after", "keys left after 10^5 locked and released")):
        if k in r:
            check(f"{r['backend']} {r['workload']}: no {what}", r[k] == 0, f"{r[k]:,}")

for r in flights:
    b = r["backend"]
    check(f"{b} flight64 one handler run per burst", r["runs_per_burst_max"] == 1,
          f"mean {r['runs_per_burst_mean']}, max {r['runs_per_burst_max']} over {r['bursts']} bursts")
    over = r["p99_ms"] - r["handler_ms"]
    if b == "memory":
        check("memory flight64 p99 <= handler + 5 ms", over <= 5,
              f"{r['p99_ms']} ms = handler + {over:.2f} ms (the same burst without the layer: "
              f"p99 {r['plain_p99_ms']} ms)")
    elif "rtt_p50_us" in r:
        limit = 2 * r["rtt_p50_us"] / 1000
        check(f"{b} flight64 p99 <= handler + 2 RTT", over <= limit,
              f"{r['p99_ms']} ms = handler + {over:.2f} ms vs 2 x {r['rtt_p50_us']:.1f} µs "
              f"(the same burst without the layer: p99 {r['plain_p99_ms']} ms)")

for r in rows + flights:
    if r["errors"]:
        check(f"{r['backend']} {r['workload']} without errors", False, f"{r['errors']} errors")
for b, w, _ in failed:
    check(f"{b} {w} ran", False, "the run failed (see stderr)")

print()
print("| target | result | measured |")
print("|---|---|---|")
for name, ok, detail in checks:
    print(f"| {name} | {'PASS' if ok else 'MISS'} | {detail} |")
EOF
log "results: $RESULTS"
