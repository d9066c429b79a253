//! [`PostgresBackend`]: locks shared by every instance of a service through
//! the PostgreSQL database it already has (feature `postgres`).
//!
//! # Guarantees
//!
//! - **One round trip per operation**: acquire, release, extend, force
//!   release and status are each one prepared call of a server-side
//!   function (PL/pgSQL), atomic in its own implicit transaction; nothing is
//!   read by the app and written back.
//! - **Database time only**: acquisition and expiry times are the server's
//!   clock, never the app's. An expired lock is taken over by the next
//!   acquirer in the same call: no cleanup job is needed for correctness.
//! - **Fencing tokens** come from one sequence for the whole table, drawn
//!   only once the key's row is locked and the grant decided (a free key's
//!   row goes in first): they strictly increase in the order holders get
//!   the lock, for every key, across release, expiry, restarts and every
//!   instance, whatever stalls a statement; and nothing per key outlives
//!   its lock (a released lock's row is deleted).
//! - **Fair, direct hand-off**: waiters queue in a table, first come first
//!   served, one entry per acquire call. A release hands the lock straight
//!   to the oldest live waiter (new fence, the waiter's TTL from the moment
//!   of the grant) and wakes only that waiter through `NOTIFY` on its
//!   backend's channel; the notification carries the lease, so the waiter
//!   returns without another round trip. Newcomers never barge ahead of
//!   live queued waiters, also after a holder's expiry or beside a sweep.
//! - **Cleanup in order**: a caller (key and owner) whose call was dropped
//!   before its reply is pinned to that call's connection until it was
//!   answered, so the release after a cancelled acquire and the leave of a
//!   dropped waiter run after the call they clean up; a grant that still
//!   reaches a waiter that is gone goes on to the next one at once.
//! - **No polling**: a waiter sleeps until it is handed the lock, or until
//!   the holder's TTL runs out (a crashed holder never notifies), or its own
//!   max wait ends. A jittered, capped re-check is only a safety net.
//! - **Fails closed, never hangs**: every call is bounded by the op timeout
//!   on the client (connecting and preparing included) and by
//!   `statement_timeout` on the server; `acquire` by its max wait plus the
//!   op timeout. Anything that prevents an answer is
//!   [`LockError::BackendUnavailable`]. A waiter learns at once that the
//!   server died (its `LISTEN` connection closes).
//! - **Bounded storage**: released locks are deleted, expired ones are
//!   taken over by their next acquirer or removed by a bounded sweep (every
//!   1,024 operations of a backend, one step over 64 heap blocks of each
//!   table, as a TID range scan: its cost does not grow with the table), so
//!   the table holds about as many rows as there are live locks.
//!   [`PostgresBackend::prune`] runs a whole pass on demand.
//!
//! # Schema
//!
//! [`PostgresBackend::migrate`] creates (idempotently, in one transaction)
//! the schema `tower_lock` (see [`schema`](PostgresBuilder::schema))
//! with:
//!
//! | object | what |
//! |---|---|
//! | table `locks` | one row per held lock: `key` (primary key, [`LockKey::encoded`]), `owner`, `attempt`, `fence`, `acquired_at`, `expires_at` (`timestamptz`), `queued`, `granted_to`, `metadata` (`jsonb`: `{"fence", "data"}`, the metadata of acquisition `fence`) |
//! | table `locks_waiters` | one row per queued acquire call: `key`, `place`, `channel`, `ticket`, `owner`, `attempt`, `ttl_ms`, `deadline` |
//! | table `locks_flights` | a single-flight's latest result while kept: `key` (the flight's, `f:<name>`), `seq`, `value` (`bytea`), `fresh_until`, `keep_until` |
//! | table `locks_flight_watchers` | callers waiting for a flight's result: `key`, `channel`, `ticket`, `expires_at` |
//! | sequences `locks_fence`, `locks_queue` | fencing tokens; queue order |
//! | functions `locks_acquire`, `locks_release`, `locks_extend`, `locks_claim`, `locks_force_release`, `locks_leave`, `locks_pass_on`, `locks_hand_off`, `locks_sweep`, `locks_us`, `locks_flight_begin`, `locks_flight_publish` | the operations |
//!
//! (`locks` is the table name, see [`table`](PostgresBuilder::table).)
//! [`PostgresBackend::schema_sql`] returns the same SQL for teams that run
//! their own migrations.
//!
//! # Connections
//!
//! Operations run on a few connections taken out of the pool for good (two
//! by default, see [`connections`](PostgresBuilder::connections)): each
//! pipelines concurrent operations and has the statements prepared; an
//! operation goes to the least busy, unless its caller is pinned (above).
//! Each is set up for the SQL, whatever the database's or the pool's
//! defaults:
//!
//! | setting | value | why |
//! |---|---|---|
//! | `default_transaction_isolation` | `read committed` | a statement that waited for a row must see what committed meanwhile (under `repeatable read` it fails with a serialization error, and a release that fails leaves the lock for its TTL) |
//! | `synchronous_commit` | `on` (`remote_apply` is kept) | an acknowledged lock, and its fence, survive a crash |
//! | `lock_timeout` | `0` | waits for a row are bounded by `statement_timeout` alone |
//! | `statement_timeout` | the op timeout | a stuck statement ends on the server too |
//! | `plan_cache_mode` | `force_generic_plan` | the statements are planned once |
//!
//! A connection that breaks is replaced, and a call that failed on it is
//! sent once more on the new one when that is safe (every operation but
//! force release, which is sent only on a connection that just answered),
//! so after connections are killed (`pg_terminate_backend`, a server or
//! PgBouncer restart) at most the calls under way at that moment fail.
//!
//! Waiting needs one more connection per backend (and its clones) that
//! runs `LISTEN` on a channel of its own, `tower_lock_<uuid>`; it is opened
//! from the backend's own connection settings the first time a waiter has
//! to wait.
//!
//! # Limits
//!
//! - The locks are as safe as the primary they are written to. With
//!   asynchronous replication a failover can lose a lock (and fences) that
//!   was just taken: two holders can then overlap, as with Redis. With
//!   synchronous replication (`synchronous_commit = on` or `remote_apply`
//!   and a synchronous standby) an acknowledged acquire survives a
//!   failover. The sequence is WAL-logged: fences keep increasing across
//!   restarts and failovers that keep the data.
//! - A transaction-mode connection pooler (PgBouncer `pool_mode =
//!   transaction`) cannot carry `LISTEN`: point the waiting connection (the
//!   URL given to [`from_pool`](PostgresBackend::from_pool)) at the server
//!   or a session-mode pool. The operations themselves are single
//!   statements and work through it when it supports prepared statements
//!   (PgBouncer 1.21 and later with `max_prepared_statements`), but the
//!   settings above do not follow them from one server connection to the
//!   next: give the pooler's server connections those defaults (at least
//!   `read committed` and `synchronous_commit = on`, e.g. with `ALTER ROLE
//!   … SET`).
//! - A waiter whose process dies stays in the queue until its own max wait
//!   ends; if the lock is handed to it before then, the lock stays unused
//!   until that hand-off's TTL ends (as with Redis).
//! - A call is sent at most twice: when its connection breaks again on the
//!   second try, it is unavailable (the layer releases what the call may
//!   have taken, as after any lost reply). A release repeated after its
//!   first try did run answers "not held" (or "not yours", once the lock
//!   was handed on): it was released all the same.

mod build;
mod conn;
mod error;
mod flight;
mod kinds;
mod listen;
mod lookup;
mod notify;
mod ops;
mod pins;
mod schema;
mod statements;
mod wait;

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use deadpool_postgres::Pool;

pub use self::build::PostgresBuilder;
use self::conn::Conns;
use self::listen::Listener;
use self::schema::Names;
use super::{
    BoxFuture, ExtendRequest, FlightPublish, FlightResult, FlightStart, HeldBy, Holder, Lease,
    LockBackend, LockStatus, join_all,
};
use crate::error::LockError;
use crate::key::LockKey;
use crate::spec::AcquireRequest;

/// The longest stored key, in bytes: longer encodings are hashed (a B-tree
/// entry must stay well under PostgreSQL's 2,704-byte limit).
const MAX_STORED_KEY: usize = 512;
/// Operations of one backend between two background sweep steps.
const SWEEP_EVERY: u64 = 1024;
/// Heap blocks of each table one sweep step looks at.
const SWEEP_BLOCKS: i64 = 64;

/// How the backend's own connections (its pool from a URL, and the `LISTEN`
/// connection) speak TLS.
#[derive(Clone)]
pub(super) enum Tls {
    /// Plain TCP or a Unix socket.
    None,
    /// TLS through the system's OpenSSL (feature `postgres-tls`).
    #[cfg(feature = "postgres-tls")]
    Native(postgres_native_tls::MakeTlsConnector),
}

/// Locks in PostgreSQL, through a [`deadpool_postgres`] pool. Cheap to clone
/// (clones share connections and waiters).
///
/// See the [module documentation](self) for guarantees, schema and limits.
///
/// ```no_run
/// use std::time::Duration;
/// use tower_lock::backend::postgres::PostgresBackend;
/// use tower_lock::LockKey;
/// use tower_lock::backend::{AcquireRequest, Holder, LockBackend};
///
/// # async fn demo() -> Result<(), tower_lock::LockError> {
/// let backend = PostgresBackend::builder()
///     .op_timeout(Duration::from_secs(1))
///     .build("postgres://app:secret@127.0.0.1/app")?;
/// backend.migrate().await?; // idempotent: creates tower_lock.locks & co.
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
pub struct PostgresBackend {
    shared: Arc<Shared>,
    op_timeout: Duration,
}

struct Shared {
    conns: Conns,
    listener: Listener,
    /// The backend's op timeout (for calls made on its own: passing on).
    op_timeout: Duration,
    ops: AtomicU64,
    next_block: AtomicI64,
    sweeping: AtomicBool,
}

impl Shared {
    fn new(
        pool: Pool,
        listen_config: tokio_postgres::Config,
        tls: Tls,
        names: Names,
        connections: usize,
        op_timeout: Duration,
    ) -> Arc<Self> {
        Arc::new_cyclic(|shared: &Weak<Shared>| {
            let shared = shared.clone();
            let on_orphan = Box::new(move |orphan| pass_on_later(&shared, orphan));
            Shared {
                conns: Conns::new(pool, names, connections),
                listener: Listener::new(listen_config, tls, on_orphan),
                op_timeout,
                ops: AtomicU64::new(0),
                next_block: AtomicI64::new(0),
                sweeping: AtomicBool::new(false),
            }
        })
    }
}

/// Pass `orphan` on in the background (from the listener's task: see
/// `listen.rs`). A backend already dropped has nobody to pass it on: the
/// waiter's own leave or the lock's TTL does.
fn pass_on_later(shared: &Weak<Shared>, orphan: listen::Orphan) {
    let Some(shared) = shared.upgrade() else {
        return;
    };
    let backend = PostgresBackend {
        op_timeout: shared.op_timeout,
        shared,
    };
    tokio::spawn(async move {
        if let Err(e) = backend.pass_on(&orphan).await {
            tracing::debug!(error = %e, "passing on a grant to a waiter that is gone failed");
        }
    });
}

impl fmt::Debug for PostgresBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // No connection settings: they may hold a password.
        let names = self.shared.conns.names();
        f.debug_struct("PostgresBackend")
            .field("schema", &names.schema)
            .field("table", &names.table)
            .field("connections", &self.shared.conns.connections())
            .field("op_timeout", &self.op_timeout)
            .finish_non_exhaustive()
    }
}

impl PostgresBackend {
    /// Create or update the schema, table, sequences and functions (see
    /// the [module documentation](self)): idempotent, in one transaction,
    /// safe to run from several instances at once. Run it once at start-up,
    /// or apply [`schema_sql`](PostgresBackend::schema_sql) with your own
    /// migrations instead.
    ///
    /// # Errors
    ///
    /// [`LockError::BackendUnavailable`] if the database cannot be reached
    /// within 10 s (or the op timeout, if longer) or refuses the SQL (e.g.
    /// the role may not create a schema).
    pub async fn migrate(&self) -> Result<(), LockError> {
        let end = tokio::time::Instant::now() + self.op_timeout.max(Duration::from_secs(10));
        let client = self.shared.conns.checkout(end).await?;
        match tokio::time::timeout_at(end, schema::migrate(&client, self.shared.conns.names()))
            .await
        {
            Ok(result) => result,
            Err(_) => {
                // Not returned to the pool: it may still be in the transaction.
                drop(deadpool_postgres::Object::take(client));
                Err(error::timed_out("migrating the PostgreSQL schema"))
            }
        }
    }

    /// The SQL [`migrate`](PostgresBackend::migrate) runs, with this
    /// backend's schema and table names: for teams that run their own
    /// migrations. Idempotent.
    pub fn schema_sql(&self) -> String {
        self.shared.conns.names().script()
    }

    /// Remove every expired lock nobody waits for (handing expired locks
    /// with live waiters to the first of them) and every waiter entry whose
    /// max wait ended over a minute ago (one another session holds is left
    /// to the next sweep), in bounded steps over the tables. Returns the rows removed.
    ///
    /// Never needed for correctness (an expired lock is taken over by its
    /// next acquirer) nor, usually, for size (the backend sweeps a little
    /// every 1,024 operations); for maintenance jobs and tests.
    ///
    /// # Errors
    ///
    /// [`LockError::BackendUnavailable`] if a step fails.
    pub async fn prune(&self) -> Result<u64, LockError> {
        let mut block = 0;
        let mut removed = 0u64;
        loop {
            let (next, n) = self.sweep_step(block, SWEEP_BLOCKS * 16).await?;
            removed += u64::try_from(n).unwrap_or(0);
            if next == 0 {
                return Ok(removed);
            }
            block = next;
        }
    }

    /// The stored form of `key` (hashed when long).
    fn stored_key(&self, key: &LockKey) -> String {
        key.encoded(MAX_STORED_KEY)
    }

    /// Count an operation; every [`SWEEP_EVERY`] run one bounded sweep step
    /// in the background (one at a time per backend).
    fn after_op(&self) {
        let n = self.shared.ops.fetch_add(1, Ordering::Relaxed) + 1;
        if !n.is_multiple_of(SWEEP_EVERY) || self.shared.sweeping.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.shared.sweeping.store(false, Ordering::Release);
            return;
        };
        let backend = self.clone();
        runtime.spawn(async move {
            let from = backend.shared.next_block.load(Ordering::Relaxed);
            match backend.sweep_step(from, SWEEP_BLOCKS).await {
                Ok((next, removed)) => {
                    backend.shared.next_block.store(next, Ordering::Relaxed);
                    if removed > 0 {
                        tracing::debug!(removed, "swept expired PostgreSQL locks");
                    }
                }
                Err(e) => tracing::debug!(error = %e, "sweeping PostgreSQL locks failed"),
            }
            backend.shared.sweeping.store(false, Ordering::Release);
        });
    }
}

impl LockBackend for PostgresBackend {
    fn name(&self) -> &'static str {
        "postgres"
    }

    /// Every kind (a shared/permit key's holds are rows of `<table>_holds`).
    fn supports(&self, _kind: crate::spec::LockKind) -> bool {
        true
    }

    /// A lock with metadata costs one more statement, after the acquisition.
    fn acquire<'a>(&'a self, req: &'a AcquireRequest) -> BoxFuture<'a, Result<Lease, LockError>> {
        Box::pin(async move {
            let lease = self.acquire_inner(req).await?;
            if let Some(metadata) = req.metadata()
                && let Err(e) = self.store_metadata(req, lease.fence, metadata).await
            {
                // Never a lock without the metadata it was asked with.
                let holder = Holder::new(req.owner(), lease.fence);
                let _ = self.release_inner(req.key(), holder).await;
                return Err(e);
            }
            Ok(lease)
        })
    }

    fn release<'a>(
        &'a self,
        key: &'a LockKey,
        holder: Holder<'a>,
    ) -> BoxFuture<'a, Result<(), LockError>> {
        Box::pin(self.release_inner(key, holder))
    }

    fn extend<'a>(
        &'a self,
        key: &'a LockKey,
        holder: Holder<'a>,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Lease, LockError>> {
        Box::pin(self.extend_inner(key, holder, ttl))
    }

    fn claim<'a>(
        &'a self,
        key: &'a LockKey,
        holder: Holder<'a>,
        attempt: u64,
    ) -> BoxFuture<'a, Result<Lease, LockError>> {
        Box::pin(self.claim_inner(key, holder, attempt))
    }

    /// All extensions go out together, pipelined on the backend's
    /// connections, so a watchdog tick costs about one round trip however
    /// many locks it renews.
    fn extend_many<'a>(
        &'a self,
        batch: &'a [ExtendRequest],
    ) -> BoxFuture<'a, Vec<Result<Lease, LockError>>> {
        Box::pin(join_all(
            batch
                .iter()
                .map(|r| self.extend_inner(&r.key, r.holder(), r.ttl))
                .collect(),
        ))
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

    /// One statement, scanning the lock table (no index on `owner`: one
    /// would be written on every acquisition; see the README).
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
        Box::pin(self.flight_begin_inner(req))
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
mod tests {
    use super::*;

    fn assert_traits<T: Clone + Send + Sync + 'static + LockBackend>() {}

    #[test]
    fn is_clone_send_sync_backend() {
        assert_traits::<PostgresBackend>();
    }

    /// Every call's future is boxed and moved once; connecting (large and
    /// rare) is boxed separately so it does not bloat them.
    #[test]
    fn operation_futures_stay_small() {
        let backend = PostgresBackend::from_url("postgres://127.0.0.1:1/db").unwrap();
        let key = LockKey::global("k").unwrap();
        let req =
            AcquireRequest::new(key.clone(), "o", Duration::from_secs(1), Duration::ZERO).unwrap();
        let acquire = std::mem::size_of_val(&backend.acquire_inner(&req));
        let release = std::mem::size_of_val(&backend.release_inner(&key, Holder::new("o", 1)));
        assert!(
            acquire < 4096 && release < 3072,
            "{acquire} / {release} bytes"
        );
    }
}
