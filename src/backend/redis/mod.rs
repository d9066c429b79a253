//! [`RedisBackend`]: locks shared by every instance of a service through one
//! Redis server (or one cluster slot per lock).
//!
//! # Guarantees
//!
//! - **One round trip per operation**: acquire, release, extend, force
//!   release and status are each one Lua script, atomic on the server, called
//!   by hash (`EVALSHA`; sent with `EVAL` after `SCRIPT FLUSH` or a
//!   restart). A lock taken with metadata costs one more (the metadata is
//!   stored after the acquisition); the opt-in owner index adds a command to
//!   the same round trip of an acquisition or extension, and a round trip to
//!   a release (after the lock is free) and to a refused acquisition.
//! - **Expiry on the server's clock**: TTLs are `PX`/`PEXPIRE` on the
//!   server, and waiters' deadlines and hand-offs use the server's `TIME`.
//!   A lock taken on the fast path (free, nobody waiting) reports
//!   `acquired_at`/`expires_at` from the caller's clock read just before the
//!   request, so the reported expiry errs early, never late; the server's TTL
//!   starts when the script runs.
//! - **Fencing tokens** come from one counter per cluster hash slot (a key
//!   without TTL in the lock's own slot), so they strictly increase across
//!   release, expiry and every instance, and the number of counters stays
//!   bounded (at most 16,384) however many distinct keys are locked.
//! - **Fair, direct hand-off**: waiters queue in Redis (FIFO). A release hands
//!   the lock straight to the oldest live waiter and wakes only that waiter
//!   through pub/sub, which returns without another round trip. Newcomers
//!   never barge ahead of the queue, and the releasing task cannot re-take
//!   the lock while others wait.
//! - **No polling**: a waiter sleeps until it is handed the lock, or until
//!   the holder's TTL runs out (the holder may have crashed), or its own max
//!   wait ends. A jittered, capped re-check is only a last safety net.
//! - **Fails closed, never hangs**: every call is bounded by the op timeout
//!   (connecting and pool checkout included), and `acquire` by its max wait
//!   plus the op timeout. Anything that prevents an answer is
//!   [`LockError::BackendUnavailable`]. A waiter learns at once that Redis
//!   died (its pub/sub connection closes).
//!
//! # Storage layout
//!
//! With the default prefix `lock:` and `E` = [`LockKey::encoded`]:
//!
//! | key | type | content |
//! |---|---|---|
//! | `lock:{E}` | string, TTL = the lock's | `"<flag> <fence> <acquired ms> <grant> <attempt> <owner>"` |
//! | `lock:{fence:T}` | integer, no TTL | fencing counter of the hash slot of `{E}` (`T`: see [`RedisBackend::fence_counter_key`]) |
//! | `lock:{E}:fence` | integer, no TTL | the per-lock counter of earlier versions: migrated (then deleted) on first use; kept in step while [`keep_legacy_fence_counters`](RedisBackend::keep_legacy_fence_counters) is on |
//! | `lock:{E}:q` | list, TTL | tickets of the waiters, oldest first |
//! | `lock:{E}:w` | hash, TTL | ticket → `"<deadline ms> <ttl ms> <attempt> <owner>"` |
//! | `lock:{E}:wx` | sorted set, TTL ≥ a minute | tickets of waiters that left for good (dropped), scored by when the mark ends: an attempt of such a waiter still in flight takes nothing when it lands (named, not sent, by acquire and leave) |
//! | `lock:{E}:h` | hash, TTL ≥ its latest hold's | shared holds and permits ([`LockKind`](crate::LockKind)): `k` → the kind (`s`, or `p<n>`), `<fence>` → `"<expiry ms> <acquired ms> <attempt> <grant> <owner>"` per hold, `m<fence>` → that hold's metadata JSON, `a<attempt> <owner>` → that acquisition's fence |
//! | `lock:{E}:he` | sorted set, the TTL of `:h` | the fence of each hold of `:h`, scored by its expiry ms: expired holds, their number and the earliest expiry without reading every hold (named, not sent, by the exclusive acquire and the release: one key less on their fast paths) |
//! | `lock:{E}:forced` | string, 60 s TTL | the last force release's nonce and answer |
//! | `lock:{E}:m` | string, the lock's TTL | `"<fence> <metadata JSON>"`, only for a lock taken with metadata; shown only while `<fence>` is the lock's |
//! | `lock:o:{<owner>}` | hash, TTL | owner index (opt-in, [`index_owners`](RedisBackend::index_owners)): `E` → the owner's acquisitions of the lock granted or under way, for each lock the owner holds; a hint, checked on every lookup |
//! | `lock:{E}:r` | hash, TTL = kept for waiters | a single-flight's latest result (`E` = `f:<name>`): `seq`, `value` |
//! | `lock:{E}:rf` | string, TTL = the result TTL | that result's `seq` while it answers new callers |
//! | `lock:{E}:fw` | set, TTL | tickets of the callers waiting for the flight's result |
//!
//! A key is held either exclusively (`lock:{E}`) or by the holds of
//! `lock:{E}:h`, never both: each hold has its own expiry on the server's
//! clock, and every script that reads the hash skips (and, when it writes,
//! drops) the holds that ran out, found through `lock:{E}:he`, so that
//! taking and giving back a hold costs O(log n) in the number of holds (a
//! release without a fence, a waiter giving up and `status` read them all). The queue is one FIFO across kinds: a
//! waiter's entry ends with its kind (`s`/`p<n>`; none for exclusive), and a
//! hand-off grants the head and every following waiter that fits beside what
//! is held, waking each through its channel. The exclusive fast path reads
//! one more key (`EXISTS` of the lock, the queue, the legacy counter and the
//! holds); shared holds and permits go through a variant of the acquire
//! script without the fast path (`scripts.rs`).
//!
//! `flag` is `1` once someone queued behind the holder (so only then does a
//! release look at the queue). A waiter's ticket is `<waiter id>@<channel>`,
//! unique to one acquire call; `grant` is the ticket of the waiting call a
//! hold is that call's to give back should it be dropped before it reads
//! its grant (a waiter the lock was handed to, or whose own attempt took
//! it), else `-` (a call that does not wait, or a retry of the same request
//! that took the hold over). `attempt` is [`AcquireRequest::attempt`]: an
//! acquire is a retry of the holder's own only when owner, attempt and kind
//! match.
//! The queue keys expire one second after the last waiter's deadline. All
//! keys of one lock share the hash tag `{E}` (with `\`, `{`, `}` escaped in
//! `E`), so every script touches one cluster slot. Each backend (with its
//! clones) subscribes to one channel of its own, `tower-lock:wake:<uuid>`,
//! on a dedicated connection (pooled connections cannot subscribe); it is
//! opened the first time a waiter has to wait.
//!
//! # Limits
//!
//! - Replication is asynchronous: a lock (and its fence counter's increment)
//!   granted just before its primary dies may be missing on the promoted
//!   replica, which can then grant it again, even under the same fence.
//!   [`RedisBackend::min_replicas`] confirms each acquisition on replicas
//!   (`WAIT`) to narrow that window; the README's "Redis Cluster, replicas
//!   and failover" says what holds across a failover.
//! - Without persistence, a Redis restart forgets every lock (inherent in a
//!   single-Redis lock): a later release then reports
//!   [`LockError::NotFound`].
//! - A waiter whose process dies stays in the queue until its own deadline
//!   (its max wait); if the lock is handed to it before then, the lock stays
//!   unused until that hand-off's TTL ends.
//! - The fence counters are kept forever: at most one small key per hash
//!   slot (16,384), whatever the number of lock names used.
//! - Upgrading from per-lock counters: the first acquisition of a lock by
//!   this version draws a fence above both its old counter and its slot's,
//!   then deletes the old counter. An instance of an older version running
//!   beside this one would count that counter again from 1, handing out
//!   fences given already; while old instances may run, turn on
//!   [`RedisBackend::keep_legacy_fence_counters`], which keeps every lock's
//!   old counter in step instead (`legacy.rs` has the upgrade path).

#[cfg(feature = "redis-cluster")]
mod cluster;
mod config;
mod conn;
mod dedicated;
mod error;
mod extras;
mod flight;
mod invoke;
mod keys;
mod legacy;
mod ops;
mod replicas;
mod scripts;
mod server;
mod trail;
mod wait;
mod wake;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use deadpool_redis::redis::{Client, IntoConnectionInfo};
use deadpool_redis::{Config, Pool, Runtime};

use self::conn::{Pinned, Source};
use self::dedicated::Dedicated;
use self::error::config_error;
use self::replicas::MinReplicas;
use self::trail::Trails;
use self::wake::{Transport, Wakeups};
use super::{
    BoxFuture, ExtendRequest, FlightPublish, FlightResult, FlightStart, HeldBy, Holder, Lease,
    LockBackend, LockStatus, join_all,
};
use crate::error::LockError;
use crate::key::LockKey;
use crate::spec::AcquireRequest;

/// Locks in Redis, through a [`deadpool_redis`] pool. Cheap to clone (clones
/// share connections and waiters).
///
/// See the [module documentation](self) for guarantees and the storage
/// layout.
///
/// ```no_run
/// use std::time::Duration;
/// use tower_lock::backend::redis::RedisBackend;
/// use tower_lock::LockKey;
/// use tower_lock::backend::{AcquireRequest, Holder, LockBackend};
///
/// # async fn demo() -> Result<(), tower_lock::LockError> {
/// let backend = RedisBackend::from_url("redis://:secret@127.0.0.1:6379")?
///     .prefix("myapp:lock:")
///     .op_timeout(Duration::from_secs(1));
///
/// let key = LockKey::global("nightly-report")?;
/// let req = AcquireRequest::new(key.clone(), "worker-1", Duration::from_secs(30), Duration::from_secs(5))?;
/// let lease = backend.acquire(&req).await?;
/// println!("fence {}", lease.fence);
/// backend.release(&key, Holder::new("worker-1", lease.fence)).await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RedisBackend {
    shared: Arc<Shared>,
    prefix: Arc<str>,
    op_timeout: Duration,
    min_replicas: Option<MinReplicas>,
    index_owners: bool,
    keep_legacy_fences: bool,
}

struct Shared {
    conn: Pinned,
    /// For calls that block their connection (`min_replicas`' `WAIT`).
    dedicated: Dedicated,
    /// Where acquisitions without a reply went (cleanups follow them).
    trails: Trails,
    wake: Wakeups,
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // No connection info: it may hold a password.
        f.debug_struct("RedisBackend")
            .field("prefix", &self.prefix)
            .field("op_timeout", &self.op_timeout)
            .field("min_replicas", &self.min_replicas)
            .field("index_owners", &self.index_owners)
            .field("keep_legacy_fences", &self.keep_legacy_fences)
            .finish_non_exhaustive()
    }
}

impl RedisBackend {
    /// The default key prefix, `lock:`.
    pub const DEFAULT_PREFIX: &'static str = "lock:";
    /// The default bound on one backend call, 2 s.
    pub const DEFAULT_OP_TIMEOUT: Duration = Duration::from_secs(2);

    /// A backend with its own pool, from a URL: `redis://[user:password@]host[:port][/db]`,
    /// `rediss://…` (TLS: needs this crate's feature `redis-tls`; append
    /// `#insecure` to skip certificate checks, for tests only) or
    /// `unix:///path`.
    ///
    /// Nothing is connected yet: connection errors show up as
    /// [`LockError::BackendUnavailable`] from the first calls.
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidConfig`] if the URL is invalid.
    pub fn from_url(url: &str) -> Result<Self, LockError> {
        Self::from_config(&Config::from_url(url))
    }

    /// A backend with its own pool, from a [`deadpool_redis::Config`] (URL or
    /// connection info, pool size and timeouts).
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidConfig`] if the configuration is invalid.
    pub fn from_config(config: &Config) -> Result<Self, LockError> {
        let pool = config
            .create_pool(Some(Runtime::Tokio1))
            .map_err(|e| config_error(&e))?;
        let info = match (&config.url, &config.connection) {
            (Some(url), _) => url.as_str().into_connection_info(),
            (None, Some(connection)) => connection.clone().into_connection_info(),
            (None, None) => deadpool_redis::ConnectionInfo::default().into_connection_info(),
        }
        .map_err(|e| config_error(&e))?;
        Self::from_pool(pool, info)
    }

    /// A backend on the application's existing pool.
    ///
    /// Operations run on one multiplexed connection taken from `pool` (the
    /// pool opens another in its place when needed); `pool` also replaces it
    /// when it breaks. Waiting needs a pub/sub connection, which pooled
    /// connections cannot be, so `connection_info` (the pool's URL or
    /// [`ConnectionInfo`](deadpool_redis::redis::ConnectionInfo)) says where
    /// to open that one.
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidConfig`] if `connection_info` is invalid.
    pub fn from_pool(
        pool: Pool,
        connection_info: impl IntoConnectionInfo,
    ) -> Result<Self, LockError> {
        let client = Client::open(connection_info).map_err(|e| config_error(&e))?;
        Ok(Self::with(
            Source::Single(pool),
            Transport::Single(Box::new(client)),
        ))
    }

    /// A backend on a Redis Cluster (Redis 7 or newer), from the URLs (or
    /// [`ConnectionInfo`](deadpool_redis::redis::ConnectionInfo)s) of some
    /// of its nodes: any reachable one is enough to learn the rest, and
    /// naming several (say every primary) lets the backend start while one
    /// is down. `rediss://` needs the feature `redis-tls`; credentials in the
    /// first URL apply to every node.
    ///
    /// Every operation is one script on the shard owning the lock's hash
    /// slot (all keys of a lock share it); waiters are woken through
    /// sharded pub/sub on that shard. See the README's "Redis Cluster"
    /// section for what holds across a failover.
    ///
    /// Nothing is connected yet: connection errors show up as
    /// [`LockError::BackendUnavailable`] from the first calls.
    ///
    /// ```no_run
    /// use tower_lock::backend::redis::RedisBackend;
    ///
    /// # fn demo() -> Result<(), tower_lock::LockError> {
    /// let backend = RedisBackend::from_cluster_urls([
    ///     "redis://10.0.0.1:7000",
    ///     "redis://10.0.0.2:7000",
    ///     "redis://10.0.0.3:7000",
    /// ])?;
    /// # let _ = backend;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidConfig`] if no node is given or a URL is
    /// invalid.
    #[cfg(feature = "redis-cluster")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis-cluster")))]
    pub fn from_cluster_urls<I>(nodes: I) -> Result<Self, LockError>
    where
        I: IntoIterator,
        I::Item: IntoConnectionInfo,
    {
        let nodes = nodes
            .into_iter()
            .map(|n| n.into_connection_info())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| config_error(&e))?;
        let nodes = cluster::Nodes::new(nodes)?;
        Ok(Self::with(
            Source::Cluster(nodes.clone()),
            Transport::Cluster(nodes),
        ))
    }

    fn with(source: Source, transport: Transport) -> Self {
        RedisBackend {
            shared: Arc::new(Shared {
                conn: Pinned::new(source),
                dedicated: Dedicated::new(),
                trails: Trails::default(),
                wake: Wakeups::new(transport),
            }),
            prefix: Arc::from(Self::DEFAULT_PREFIX),
            op_timeout: Self::DEFAULT_OP_TIMEOUT,
            min_replicas: None,
            index_owners: false,
            keep_legacy_fences: false,
        }
    }
}

impl LockBackend for RedisBackend {
    fn name(&self) -> &'static str {
        "redis"
    }

    /// Every kind (holds live in a hash beside the lock, in its slot).
    fn supports(&self, _kind: crate::spec::LockKind) -> bool {
        true
    }

    fn acquire<'a>(&'a self, req: &'a AcquireRequest) -> BoxFuture<'a, Result<Lease, LockError>> {
        match self.min_replicas {
            None => Box::pin(self.acquire_full(req)),
            Some(min) => Box::pin(self.acquire_replicated(req, min)),
        }
    }

    fn release<'a>(
        &'a self,
        key: &'a LockKey,
        holder: Holder<'a>,
    ) -> BoxFuture<'a, Result<(), LockError>> {
        Box::pin(self.release_full(key, holder))
    }

    fn extend<'a>(
        &'a self,
        key: &'a LockKey,
        holder: Holder<'a>,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Lease, LockError>> {
        Box::pin(self.extend_full(key, holder, ttl))
    }

    fn claim<'a>(
        &'a self,
        key: &'a LockKey,
        holder: Holder<'a>,
        attempt: u64,
    ) -> BoxFuture<'a, Result<Lease, LockError>> {
        match self.min_replicas {
            None => Box::pin(self.claim_inner(key, holder, attempt)),
            Some(min) => Box::pin(async move {
                let claimed = self.claim_inner(key, holder, attempt).await?;
                let holder = Holder::new(holder.owner(), claimed.fence);
                self.confirmed(key, holder, claimed.ttl, min).await
            }),
        }
    }

    /// All extensions go out together on the one multiplexed connection, so
    /// a watchdog tick costs one pipelined round trip however many locks it
    /// renews.
    fn extend_many<'a>(
        &'a self,
        batch: &'a [ExtendRequest],
    ) -> BoxFuture<'a, Vec<Result<Lease, LockError>>> {
        Box::pin(join_all(
            batch
                .iter()
                .map(|r| self.extend_full(&r.key, r.holder(), r.ttl))
                .collect(),
        ))
    }

    /// The same extensions, each its own future: on a cluster each goes to
    /// its shard's connection (one pipelined round trip per shard, as
    /// [`extend_many`](LockBackend::extend_many)), and a stalled shard holds
    /// back only its own locks' renewals.
    fn extend_each<'a>(
        &'a self,
        batch: &'a [ExtendRequest],
    ) -> Option<Vec<BoxFuture<'a, Result<Lease, LockError>>>> {
        Some(
            batch
                .iter()
                .map(|r| -> BoxFuture<'a, _> {
                    Box::pin(self.extend_full(&r.key, r.holder(), r.ttl))
                })
                .collect(),
        )
    }

    fn force_release<'a>(&'a self, key: &'a LockKey) -> BoxFuture<'a, Result<bool, LockError>> {
        Box::pin(self.force_release_inner(key))
    }

    fn status<'a>(
        &'a self,
        key: &'a LockKey,
    ) -> BoxFuture<'a, Result<Option<LockStatus>, LockError>> {
        Box::pin(self.status_inner(key))
    }

    /// Through the owner index ([`index_owners`](RedisBackend::index_owners));
    /// [`LockError::Unsupported`] without it.
    fn held_by<'a>(
        &'a self,
        owner: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<HeldBy>, LockError>> {
        Box::pin(self.held_by_inner(owner, limit))
    }

    fn flight_begin<'a>(
        &'a self,
        req: &'a AcquireRequest,
    ) -> BoxFuture<'a, Result<FlightStart, LockError>> {
        match self.min_replicas {
            None => Box::pin(self.flight_begin_inner(req)),
            // A leader holds the flight's lock as any holder does.
            Some(min) => Box::pin(async move {
                match self.flight_begin_inner(req).await? {
                    FlightStart::Leader(lease) => {
                        let holder = Holder::new(req.owner(), lease.fence);
                        let lease = self.confirmed(req.key(), holder, req.ttl(), min).await?;
                        Ok(FlightStart::Leader(lease))
                    }
                    other => Ok(other),
                }
            }),
        }
    }

    fn flight_result<'a>(
        &'a self,
        key: &'a LockKey,
    ) -> BoxFuture<'a, Result<Option<FlightResult>, LockError>> {
        Box::pin(self.flight_result_inner(key))
    }

    fn flight_publish<'a>(
        &'a self,
        key: &'a LockKey,
        owner: &'a str,
        publish: &'a FlightPublish,
    ) -> BoxFuture<'a, Result<(), LockError>> {
        Box::pin(self.flight_publish_inner(key, owner, publish))
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod leave_test;

// The integration tests' server helper, for the tests at the seams (its
// own `unsafe` is for kill(2)).
#[cfg(test)]
#[allow(unreachable_pub, missing_docs)]
#[path = "../../../tests/common/redis_server.rs"]
mod redis_server;
