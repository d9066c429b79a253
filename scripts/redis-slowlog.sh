#!/usr/bin/env bash
# Server time per Lua script, from Redis' SLOWLOG: runs a lockbench workload
# against a private redis-server that logs every command (threshold 0), then
# prints, per script (SHA prefix) and lockbench key prefix (x:, r:, n:, y: in
# kinds-serial), the number of calls and the mean and median µs. The slowlog
# inflates absolute values; compare scripts with each other.
#
#   scripts/redis-slowlog.sh target/release/examples/lockbench [WORKLOAD] [SECONDS]
set -euo pipefail
BIN=${1:?usage: redis-slowlog.sh LOCKBENCH [WORKLOAD] [SECONDS]}
WORKLOAD=${2:-kinds-serial}
SECS=${3:-1}
DIR=$(mktemp -d)
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$DIR" \
  --daemonize yes --pidfile "$DIR/pid" \
  --slowlog-log-slower-than 0 --slowlog-max-len 1000000 >/dev/null
trap 'redis-cli -p "$PORT" shutdown nosave >/dev/null 2>&1 || true; rm -rf "$DIR"' EXIT
for _ in $(seq 50); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
"$BIN" --backend "redis://127.0.0.1:$PORT" --workload "$WORKLOAD" --seconds "$SECS"
redis-cli -p "$PORT" slowlog get 1000000 > "$DIR/slow.txt"
python3 - "$DIR/slow.txt" <<'PY'
import collections, statistics, sys
lines = open(sys.argv[1]).read().split("\n")
times = collections.defaultdict(list)
for i, line in enumerate(lines):
    # An entry reads: id, timestamp, µs, then the command and its arguments.
    if line == "EVALSHA" and i >= 1 and lines[i - 1].isdigit():
        key = lines[i + 3]
        parts = key.split(":")
        prefix = parts[2] if len(parts) > 2 else "?"
        times[(lines[i + 1][:8], prefix)].append(int(lines[i - 1]))
print("script   prefix  calls  mean_us  p50_us")
for (sha, prefix), t in sorted(times.items()):
    print(f"{sha} {prefix:>7} {len(t):6} {statistics.mean(t):8.1f} {statistics.median(t):7.1f}")
PY
