//! The guide: how to use tower-lock, chapter by chapter.
//!
//! Every code block here is compiled (and, where it needs no server, run)
//! as a doctest: `cargo test --doc --all-features`. The reliability claims
//! and the figures behind them stay in the repository's `RELIABILITY.md`
//! and `BENCHMARKS.md`.
//!
//! 1. [Locking routes](locking_routes): the layer, the hook, the
//!    extractors, several layers on one route, keeping a lock after the
//!    response.
//! 2. [Waiting, and 429 with Retry-After](waiting): max wait, what
//!    `Retry-After` says, every error code.
//! 3. [Keys, scopes, TTLs and owners](keys_scopes_ttls): what a lock is
//!    made of; metadata, lookups, client-directed locks.
//!    [Shared holds and permits](kinds): readers and writers, at most N at
//!    once per key.
//! 4. [Redis](redis), Redis Cluster, replicas and failover.
//! 5. [PostgreSQL](postgres): locks in the database you already have;
//!    [etcd] (feature `etcd`): locks decided by consensus.
//! 6. [Jobs and hand-off](jobs): `OwnedLock`, tokens, the job layer,
//!    `with_lock`.
//!    [Jobs on apalis](self::apalis) (feature `apalis`).
//! 7. [Single-flight](single_flight): identical work runs once.
//! 8. [Fenced writes and lost locks](fenced_writes): fencing tokens, the
//!    watchdog, losing nothing when a lease runs out.
//! 9. [Operating](operating): the admin API, metrics, tracing, the bank
//!    example.
//! 10. [Coming from another lock library](coming_from): Laravel, Forrst,
//!     SyncGuard, Redisson, DistributedLock.
//! 11. [Testing and performance](testing).
//! 12. [Design notes](design).
//!
//! The chapters are compiled with every feature on (they show every
//! backend), as on docs.rs.

#[doc = include_str!("locking_routes.md")]
pub mod locking_routes {}
#[doc = include_str!("waiting.md")]
pub mod waiting {}
#[doc = include_str!("keys_scopes_ttls.md")]
pub mod keys_scopes_ttls {}
#[doc = include_str!("kinds.md")]
pub mod kinds {}
#[doc = include_str!("redis.md")]
pub mod redis {}
#[doc = include_str!("postgres.md")]
pub mod postgres {}
#[doc = include_str!("etcd.md")]
pub mod etcd {}
#[doc = include_str!("jobs.md")]
pub mod jobs {}
#[doc = include_str!("apalis.md")]
pub mod apalis {}
#[doc = include_str!("single_flight.md")]
pub mod single_flight {}
#[doc = include_str!("fenced_writes.md")]
pub mod fenced_writes {}
#[doc = include_str!("operating.md")]
pub mod operating {}
#[doc = include_str!("coming_from.md")]
pub mod coming_from {}
#[doc = include_str!("testing.md")]
pub mod testing {}
#[doc = include_str!("design.md")]
pub mod design {}
