#!/usr/bin/env bash
# The whole test suite, on a fresh Debian machine too: installs what the tests
# need, then runs every test of every feature over one target dir.
set -euo pipefail
cd "$(dirname "$0")/.."

# What the tests need: redis-server (the Redis tests start private servers
# from it), PostgreSQL's server binaries (the PostgreSQL tests initdb and start
# private servers, as the `postgres` user when root; Debian's `postgresql`
# package provides both), and for features `redis-tls`/`postgres-tls` OpenSSL to
# build native-tls and the openssl CLI that makes the TLS tests' certificates.
missing=()
# A C compiler and linker (rustc links with `cc`; the native-tls build uses
# it too). Rust itself (cargo) must be there already.
command -v cc >/dev/null 2>&1 || missing+=(build-essential)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
have_initdb() {
  [ -n "${TOWER_LOCK_PG_BINDIR:-}" ] && [ -x "$TOWER_LOCK_PG_BINDIR/initdb" ] && return 0
  command -v pg_config >/dev/null 2>&1 && [ -x "$(pg_config --bindir)/initdb" ] && return 0
  ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1
}
have_initdb || missing+=(postgresql)
# etcd for the etcd backend's tests (they start private 3-member clusters:
# Debian's `etcd-server` provides `etcd`), and protoc, which etcd-client's
# build runs on etcd's .proto files (Debian: `protobuf-compiler`).
command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
command -v protoc >/dev/null 2>&1 || missing+=(protobuf-compiler)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
pkg-config --exists openssl 2>/dev/null || missing+=(libssl-dev)
if [ "${#missing[@]}" -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  echo "installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# Examples are products with tests of their own (they are run as processes).
cargo build --all-features --examples
# The profiling example runs every mode (it checks each lock was released).
for mode in open locked none ident serial; do
  cargo run -q --all-features --example layer_cost -- "$mode" 200
done
cargo test --all-features "$@"
