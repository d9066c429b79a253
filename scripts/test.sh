#!/usr/bin/env bash
# The whole test suite, on a fresh Debian machine too: installs what the tests
# need (redis-server: the Redis tests start their own private servers from it),
# then runs every test of every feature over one target dir.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-server >/dev/null 2>&1; then
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  echo "installing redis-server (the Redis tests start private servers from it)"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq redis-server >/dev/null
fi

# Examples are products with tests of their own (they are run as processes).
cargo build --all-features --examples
cargo test --all-features "$@"
