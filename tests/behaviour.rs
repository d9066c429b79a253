//! Behavioural test suite of tower-lock.
//!
//! Every behaviour is written once, generic over the backend, in
//! `tests/behaviour/` and instantiated per backend by `for_each_backend!` (see
//! `tests/behaviour/mod.rs`): `memory::*` runs against [`MemoryBackend`]
//! (virtual time where TTLs matter), `redis::*` against a private Redis server, `postgres::*` against a
//! private PostgreSQL server.
//!
//! [`MemoryBackend`]: tower_lock::MemoryBackend

// Shared test support; `common::redis_server::RedisServer` and
// `common::pg_server::PgServer` start the private servers of
// `suite::harness::{redis_backend, postgres_backend}`.
mod common;

#[path = "behaviour/mod.rs"]
mod suite;
