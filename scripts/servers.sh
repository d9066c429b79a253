# Private servers for the benchmark scripts, sourced (not run) by bench.sh and
# bench-kinds.sh: a Redis, a PostgreSQL and a 3-member etcd cluster, each on
# free loopback ports in a temp dir of its own, as the tests start theirs, and
# stopped (their dirs removed) on exit. Each start_* sets the URL it serves:
# REDIS_URL (and PORT), PG_URL, ETCD_URL. Needs log() from the script.

REDIS_PID="" REDIS_DIR="" PG_PID="" PG_DIR="" ETCD_DIR=""
ETCD_PIDS=()

stop_servers() {
  for pid in "${ETCD_PIDS[@]}"; do
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  if [ -n "$ETCD_DIR" ]; then rm -rf "$ETCD_DIR"; fi
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
trap stop_servers EXIT INT TERM

# $1 free loopback ports (default 1), space-separated.
free_ports() {
  python3 - "${1:-1}" <<'PY'
import socket, sys
ss = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in ss: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in ss))
for s in ss: s.close()
PY
}

# Redis without persistence.
start_redis() {
  PORT=$(free_ports)
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
}

# PostgreSQL: initdb into a temp dir (as the postgres user when root: initdb
# refuses root), a private socket directory, fsync off (as the peers were
# measured).
start_postgres() {
  PG_BIN=$(pg_config --bindir)
  PG_PORT=$(free_ports)
  PG_DIR=$(mktemp -d)
  local as_pg=()
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
}

# A 3-member etcd cluster, each member in a directory of its own, on the real
# disk (the tests use /dev/shm; ETCD_DATA_PARENT chooses), with etcd's default
# Raft timing (heartbeat 100 ms, election 1 s), compacting its history every
# second as the guide's etcd chapter advises for a lock cluster (every
# deleted holder key and queue entry stays in etcd's key index until a
# compaction, and each read of a lock's holders or queue walks them).
# ETCD_ARGS: the members' extra flags instead (ETCD_ARGS="": no compaction).
start_etcd() {
  local ep initial="" i client peer
  read -r -a ep <<< "$(free_ports 6)"
  # ETCD_DATA_PARENT=/dev/shm: on tmpfs instead (fsync then costs nothing).
  ETCD_DIR=$(mktemp -d ${ETCD_DATA_PARENT:+-p "$ETCD_DATA_PARENT"})
  for i in 0 1 2; do initial+="${initial:+,}m$i=http://127.0.0.1:${ep[$((3 + i))]}"; done
  for i in 0 1 2; do
    client="http://127.0.0.1:${ep[$i]}" peer="http://127.0.0.1:${ep[$((3 + i))]}"
    etcd --name "m$i" --data-dir "$ETCD_DIR/m$i" \
      --listen-client-urls "$client" --advertise-client-urls "$client" \
      --listen-peer-urls "$peer" --initial-advertise-peer-urls "$peer" \
      --initial-cluster "$initial" --initial-cluster-state new \
      --initial-cluster-token lockbench --log-level error ${ETCD_ARGS---auto-compaction-mode=periodic --auto-compaction-retention=1s} \
      > "$ETCD_DIR/m$i.log" 2>&1 &
    ETCD_PIDS+=($!)
  done
  local healthy=""
  for _ in $(seq 1 200); do
    if etcd_healthy "${ep[@]:0:3}"; then healthy=1; break; fi
    sleep 0.1
  done
  [ -n "$healthy" ] || { log "etcd did not start (logs in $ETCD_DIR)"; exit 1; }
  ETCD_URL="etcd://127.0.0.1:${ep[0]},127.0.0.1:${ep[1]},127.0.0.1:${ep[2]}"
  log "$(etcd --version | head -n 1), 3 members on $ETCD_URL (data in $ETCD_DIR)"
}

# Whether every member on the client ports given answers healthy.
etcd_healthy() {
  python3 - "$@" <<'PY'
import sys, urllib.request
for port in sys.argv[1:]:
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).read()
    except OSError:
        sys.exit(1)
    if b'"true"' not in body:
        sys.exit(1)
PY
}
