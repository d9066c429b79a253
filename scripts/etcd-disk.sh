#!/usr/bin/env bash
# What the disk costs etcd's contended16: one 3-member cluster of
# scripts/servers.sh (on the real disk unless ETCD_DATA_PARENT says otherwise),
# RUNS runs of contended16 (5 s each), and for each member the WAL fsyncs, their
# mean duration, and the Raft proposals committed during the run, read from
# etcd's own /metrics before and after it, and the backend's (bbolt) commits
# beside them (each its own fsyncs; every 100 ms by default). The counts
# include lockbench's 200 warm-up cycles (400 proposals, before the window);
# the proposals per hand-off are also given without them. ETCD_ARGS as in
# scripts/servers.sh passes the members other flags.
#
#   LOCKBENCH_BIN=target/release/examples/lockbench scripts/etcd-disk.sh
set -euo pipefail
cd "$(dirname "$0")/.."
log() { echo "etcd-disk: $*" >&2; }
BIN=${LOCKBENCH_BIN:-target/release/examples/lockbench}
[ -x "$BIN" ] || { log "no lockbench at $BIN (cargo build --release --all-features --example lockbench)"; exit 2; }
. scripts/servers.sh
start_etcd
ports=$(echo "$ETCD_URL" | sed 's/etcd:\/\///; s/127.0.0.1://g; s/,/ /g')
snap() {
  for p in $ports; do curl -s "http://127.0.0.1:$p/metrics" | sed "s/^/m$p /"; done |
    grep -E ' (etcd_disk_(wal_fsync|backend_commit)_duration_seconds_(sum|count)|etcd_server_proposals_committed_total) ' || true
}
dir=$(mktemp -d)
for _ in $(seq 1 "${RUNS:-2}"); do
  snap > "$dir/before"
  "$BIN" --backend "$ETCD_URL" --workload contended16 --seconds 5 > "$dir/run.json" 2>/dev/null
  snap > "$dir/after"
  python3 - "$dir" <<'PY'
import json, sys
d = sys.argv[1]
run = json.load(open(f"{d}/run.json"))
def read(name):
    out = {}
    for line in open(f"{d}/{name}"):
        p = line.split()
        if len(p) == 3:
            out[(p[0], p[1])] = float(p[2])
    return out
a, b = read("before"), read("after")
ops = max(run["ops"], 1)
print(f"contended16: {run['ops_per_s']} hand-offs/s, p99 {run.get('p99_us', 0) / 1000:.1f} ms, {run['ops']} hand-offs")
for m in sorted({m for m, _ in b}):
    dv = lambda k: b.get((m, k), 0) - a.get((m, k), 0)
    n, s = dv("etcd_disk_wal_fsync_duration_seconds_count"), dv("etcd_disk_wal_fsync_duration_seconds_sum")
    p = dv("etcd_server_proposals_committed_total")
    c, cs = dv("etcd_disk_backend_commit_duration_seconds_count"), dv("etcd_disk_backend_commit_duration_seconds_sum")
    # lockbench's 200 uncontended warm-up cycles (an acquire and a release:
    # two proposals each) run between the snapshots, before the window.
    net = p - 2 * 200
    print(f"  member {m[1:]}: {n:.0f} WAL fsyncs ({n / ops:.2f} per hand-off), mean {1000 * s / max(n, 1):.2f} ms, "
          f"fsyncing {s / 5:.0%} of the run; {p:.0f} proposals committed "
          f"({net / ops:.2f} per hand-off without the 400 of the warm-up); "
          f"{c:.0f} backend commits, mean {1000 * cs / max(c, 1):.2f} ms ({cs / 5:.0%} of the run)")
PY
done
rm -rf "$dir"
