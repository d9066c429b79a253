//! The connection every operation runs on.
//!
//! A deadpool checkout recycles the connection first (`UNWATCH` + `PING`, one
//! extra round trip), which would double the cost of every lock operation.
//! deadpool-redis connections are `MultiplexedConnection`s, which already
//! pipeline any number of concurrent requests over one socket, so the
//! backend takes ONE connection out of the pool for good (`Connection::take`,
//! which lets the pool open another in its place) and clones it per
//! operation (a few reference counts). The pool is used again only to
//! replace that connection when it breaks.
//!
//! On a cluster the one connection is a redis-rs `ClusterConnection`: a
//! multiplexed connection per node behind one handle, which routes each
//! script by its first key's hash slot and follows `MOVED`/`ASK`
//! redirections and `TRYAGAIN` (a slot being migrated) itself; those
//! retries stop when the caller's op timeout drops the request.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use deadpool_redis::Pool;
use deadpool_redis::redis::aio::{ConnectionLike, MultiplexedConnection};
use deadpool_redis::redis::{Cmd, Pipeline, RedisError, RedisFuture, Value};
use tokio::time::{Instant, timeout_at};

use super::error::{pool_error, redis_error, timed_out};
use super::invoke::Invocation;
use super::server::{MIN_REDIS_MAJOR, check_version, warn_about_policy};
use crate::backend::retry::Answers;
use crate::error::LockError;

/// The redis-rs per-request timeout on our connection. Every call is bounded
/// by the backend's own op timeout instead, so this only has to be longer.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(3600);

pub(super) struct Pinned {
    source: Source,
    slot: Arc<Mutex<Option<Slot>>>,
    /// Single flight for replacing the connection.
    connecting: tokio::sync::Mutex<()>,
    generation: Arc<AtomicU64>,
    /// A cluster connection is being replaced in the background.
    #[cfg(feature = "redis-cluster")]
    replacing: Arc<AtomicBool>,
    // The eviction policy was looked at (once per backend).
    policy_checked: AtomicBool,
    /// Whether Redis answers the scripts, for the pauses of work retried
    /// (a dropped waiter's leave, `wait.rs`).
    answers: Answers,
}

/// Where connections come from.
pub(super) enum Source {
    /// One server: the pool.
    Single(Pool),
    /// A cluster: its nodes (see `cluster.rs`).
    #[cfg(feature = "redis-cluster")]
    Cluster(super::cluster::Nodes),
}

struct Slot {
    generation: u64,
    conn: Conn,
}

/// An operation's connection: cheap to clone, multiplexed.
#[derive(Clone)]
pub(super) enum Conn {
    Single(MultiplexedConnection),
    #[cfg(feature = "redis-cluster")]
    Cluster(deadpool_redis::redis::cluster_async::ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            #[cfg(feature = "redis-cluster")]
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(cmd, offset, count),
            #[cfg(feature = "redis-cluster")]
            Conn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            #[cfg(feature = "redis-cluster")]
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

impl Pinned {
    pub(super) fn new(source: Source) -> Self {
        Pinned {
            source,
            slot: Arc::default(),
            connecting: tokio::sync::Mutex::new(()),
            generation: Arc::default(),
            #[cfg(feature = "redis-cluster")]
            replacing: Arc::default(),
            policy_checked: AtomicBool::new(false),
            answers: Answers::default(),
        }
    }

    /// Whether Redis answers: what retried work pauses on.
    pub(super) fn answers(&self) -> &Answers {
        &self.answers
    }

    /// Other pauses (a test's pause longer than the test).
    #[cfg(test)]
    pub(super) fn set_pauses(&mut self, first: Duration, max: Duration) {
        self.answers.set_pauses(first, max);
    }

    /// The pool of a single-server backend.
    pub(super) fn pool(&self) -> Option<&Pool> {
        match &self.source {
            Source::Single(pool) => Some(pool),
            #[cfg(feature = "redis-cluster")]
            Source::Cluster(_) => None,
        }
    }

    /// Whether this is a cluster's connection.
    pub(super) fn is_cluster(&self) -> bool {
        !matches!(self.source, Source::Single(_))
    }

    fn slot(&self) -> MutexGuard<'_, Option<Slot>> {
        lock_slot(&self.slot)
    }

    fn current(&self) -> Option<(u64, Conn)> {
        self.slot().as_ref().map(|s| (s.generation, s.conn.clone()))
    }

    pub(super) async fn get(&self, end: Instant) -> Result<(u64, Conn), LockError> {
        match self.current() {
            Some(current) => Ok(current),
            // Boxed: connecting is rare, and its (large) future would
            // otherwise be part of every operation's future.
            None => Box::pin(self.connect(end)).await,
        }
    }

    async fn connect(&self, end: Instant) -> Result<(u64, Conn), LockError> {
        let _single_flight = timeout_at(end, self.connecting.lock())
            .await
            .map_err(|_| timed_out("waiting for a Redis connection"))?;
        if let Some(current) = self.current() {
            return Ok(current);
        }
        let conn = match &self.source {
            Source::Single(pool) => {
                let object = match timeout_at(end, pool.get()).await {
                    Ok(Ok(object)) => object,
                    Ok(Err(e)) => return Err(pool_error(e)),
                    Err(_) => return Err(timed_out("connecting to Redis")),
                };
                let mut conn = deadpool_redis::Connection::take(object);
                conn.set_response_timeout(RESPONSE_TIMEOUT);
                self.check_server(&mut conn, end).await?;
                Conn::Single(conn)
            }
            #[cfg(feature = "redis-cluster")]
            Source::Cluster(nodes) => {
                let conn = nodes.connect(end).await?;
                if !self.policy_checked.swap(true, Ordering::Relaxed) {
                    nodes.check_policy(&conn, end).await;
                }
                Conn::Cluster(conn)
            }
        };
        let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
        *self.slot() = Some(Slot {
            generation,
            conn: conn.clone(),
        });
        Ok((generation, conn))
    }

    /// A new connection from the source, for one caller alone (see
    /// `dedicated.rs`); the operations' connection is left as it is.
    pub(super) async fn open(&self, end: Instant) -> Result<Conn, LockError> {
        match &self.source {
            Source::Single(pool) => {
                let object = match timeout_at(end, pool.get()).await {
                    Ok(Ok(object)) => object,
                    Ok(Err(e)) => return Err(pool_error(e)),
                    Err(_) => return Err(timed_out("connecting to Redis")),
                };
                let mut conn = deadpool_redis::Connection::take(object);
                conn.set_response_timeout(RESPONSE_TIMEOUT);
                Ok(Conn::Single(conn))
            }
            #[cfg(feature = "redis-cluster")]
            Source::Cluster(nodes) => Ok(Conn::Cluster(nodes.connect(end).await?)),
        }
    }

    /// On a new connection to one server: refuse a server too old for the scripts, and
    /// (once per backend) warn about an eviction policy that can drop locks.
    async fn check_server(
        &self,
        conn: &mut MultiplexedConnection,
        end: Instant,
    ) -> Result<(), LockError> {
        let mut info = deadpool_redis::redis::cmd("INFO");
        info.arg("server");
        match timeout_at(end, info.query_async::<String>(conn)).await {
            Ok(Ok(info)) => check_version(&info, MIN_REDIS_MAJOR)?,
            Ok(Err(e)) if is_connection_error(&e) => return Err(redis_error(&e)),
            // INFO not allowed (ACL): nothing to judge by.
            Ok(Err(_)) => {}
            Err(_) => return Err(timed_out("waiting for Redis to answer")),
        }
        if self.policy_checked.swap(true, Ordering::Relaxed) {
            return Ok(());
        }
        let mut get = deadpool_redis::redis::cmd("CONFIG");
        get.arg("GET").arg("maxmemory-policy");
        match timeout_at(end, get.query_async::<Vec<String>>(conn)).await {
            Ok(reply) => warn_about_policy(reply),
            Err(_) => return Err(timed_out("waiting for Redis to answer")),
        }
        Ok(())
    }

    /// A call on the connection of `generation` got no answer in time. One
    /// server: forget it (the next call opens another). A cluster: one
    /// slow shard must not stall the others, and a new cluster connection
    /// would have to reach every node first, the slow one included; so the
    /// current one stays in use while another is made in the background,
    /// and replaces it if that succeeds (a half-open socket to one node is
    /// then gone).
    fn timed_out(&self, generation: u64) {
        self.answers.failed();
        match &self.source {
            Source::Single(_) => self.invalidate(generation),
            #[cfg(feature = "redis-cluster")]
            Source::Cluster(nodes) => {
                if self.replacing.swap(true, Ordering::AcqRel) {
                    return;
                }
                let Ok(runtime) = tokio::runtime::Handle::try_current() else {
                    self.replacing.store(false, Ordering::Release);
                    return self.invalidate(generation);
                };
                let (nodes, slot) = (nodes.clone(), Arc::clone(&self.slot));
                let (counter, replacing) =
                    (Arc::clone(&self.generation), Arc::clone(&self.replacing));
                runtime.spawn(async move {
                    let end = Instant::now() + CLUSTER_REPLACE_BOUND;
                    if let Ok(conn) = nodes.connect(end).await {
                        let mut slot = lock_slot(&slot);
                        if slot.as_ref().is_some_and(|s| s.generation == generation) {
                            *slot = Some(Slot {
                                generation: counter.fetch_add(1, Ordering::Relaxed) + 1,
                                conn: Conn::Cluster(conn),
                            });
                        }
                    }
                    replacing.store(false, Ordering::Release);
                });
            }
        }
    }

    /// Forget the connection of `generation` (if it is still the current one).
    fn invalidate(&self, generation: u64) {
        self.answers.failed();
        let mut slot = self.slot();
        if slot.as_ref().is_some_and(|s| s.generation == generation) {
            *slot = None;
        }
    }

    /// Run a script, bounded by `end` (connecting included). A connection
    /// that turns out to be broken (killed, server restarted) is replaced and
    /// the call retried once on the fresh one, so the first call after an
    /// outage does not fail for a stale socket.
    ///
    /// The broken connection may have delivered the script and lost only the
    /// reply, so every script must be safe to run twice:
    /// - acquire: a second run of the same attempt finds the lock its own
    ///   (same fence, TTL refreshed) or its queue entry in place;
    /// - release and extend check the acquisition (owner token and fence),
    ///   so a second run never touches another holder's lock (a release
    ///   repeated after a hand-off answers "not yours"; the lock was
    ///   released all the same);
    /// - claim records the caller's new attempt with the lock, and a second
    ///   run with that attempt answers the lease again (claim.lua);
    /// - leave checks the waiter's ticket; status only reads;
    /// - force release records a nonce with its answer, and a second run
    ///   with that nonce only repeats the answer (force_release.lua);
    /// - a flight's publish that finds the lock gone but its own result
    ///   stored (under the leader's fence) answers success again
    ///   (flight_publish.lua).
    ///
    /// - the owner index's add counts one more acquisition (an entry too
    ///   many, which a lookup checks and cleans up); its drop goes through
    ///   [`Pinned::eval_once`] instead.
    ///
    /// A new script must keep this true, or not come through here.
    pub(super) async fn eval(
        &self,
        invocation: &Invocation<'_>,
        end: Instant,
    ) -> Result<Value, LockError> {
        Ok(self.eval_traced(invocation, end, &mut None).await?.0)
    }

    /// [`Pinned::eval`], keeping in `sent` the connection the script went
    /// out on until its reply comes back: after a timeout, a connection
    /// error or a cancellation, `sent` names where the call may still be
    /// in flight (see `trail.rs`). With the reply, whether the script was
    /// sent twice (the first run's reply lost: the reply is the second
    /// run's, which may find what the first one did).
    pub(super) async fn eval_traced(
        &self,
        invocation: &Invocation<'_>,
        end: Instant,
        sent: &mut Option<Conn>,
    ) -> Result<(Value, bool), LockError> {
        self.eval_sent(invocation, end, sent, true).await
    }

    /// Run a script that must not run twice (it is not safe to, and it is
    /// better lost than doubled), bounded by `end`: a broken connection is
    /// replaced, but the call fails rather than going out again.
    pub(super) async fn eval_once(
        &self,
        invocation: &Invocation<'_>,
        end: Instant,
    ) -> Result<Value, LockError> {
        Ok(self.eval_sent(invocation, end, &mut None, false).await?.0)
    }

    async fn eval_sent(
        &self,
        invocation: &Invocation<'_>,
        end: Instant,
        sent: &mut Option<Conn>,
        resend: bool,
    ) -> Result<(Value, bool), LockError> {
        let mut retried = false;
        loop {
            let (generation, mut conn) =
                self.get(end).await.inspect_err(|_| self.answers.failed())?;
            *sent = Some(conn.clone());
            match timeout_at(end, invocation.invoke(&mut conn)).await {
                Ok(Ok(value)) => {
                    *sent = None;
                    self.answers.answered();
                    return Ok((value, retried));
                }
                Ok(Err(e)) if is_connection_error(&e) => {
                    self.invalidate(generation);
                    if resend && !retried && Instant::now() < end {
                        retried = true;
                        continue;
                    }
                    return Err(redis_error(&e));
                }
                Ok(Err(e)) => {
                    *sent = None;
                    // An error reply is no sign Redis is back: LOADING,
                    // READONLY, MASTERDOWN, CLUSTERDOWN and BUSY come from a
                    // server that refuses work (a restart, a failover).
                    self.answers.failed();
                    return Err(redis_error(&e));
                }
                Err(_) => {
                    // No answer in time: the socket may be half-open, so the
                    // next call starts on a fresh one.
                    self.timed_out(generation);
                    return Err(timed_out("waiting for Redis to answer"));
                }
            }
        }
    }

    /// Run a script on `conn`, behind whatever was sent on it before (a
    /// cleanup behind the call it cleans up, see `trail.rs`); on the
    /// current connection if `conn` turns out broken (what was sent on it
    /// can no longer run). No answer in time is a timeout: the script stays
    /// queued behind the earlier call, and goes nowhere else.
    pub(super) async fn eval_behind(
        &self,
        invocation: &Invocation<'_>,
        mut conn: Conn,
        end: Instant,
    ) -> Result<Value, LockError> {
        match timeout_at(end, invocation.invoke(&mut conn)).await {
            Ok(Ok(value)) => {
                self.answers.answered();
                Ok(value)
            }
            Ok(Err(e)) if is_connection_error(&e) => self.eval(invocation, end).await,
            Ok(Err(e)) => {
                self.answers.failed();
                Err(redis_error(&e))
            }
            Err(_) => {
                self.answers.failed();
                Err(timed_out("waiting for Redis to answer"))
            }
        }
    }
}

/// How long a cluster connection made in the background may take.
#[cfg(feature = "redis-cluster")]
const CLUSTER_REPLACE_BOUND: Duration = Duration::from_secs(10);

fn lock_slot(slot: &Mutex<Option<Slot>>) -> MutexGuard<'_, Option<Slot>> {
    // The slot is only ever replaced whole, so a poisoned lock still holds a
    // consistent value.
    slot.lock().unwrap_or_else(|e| e.into_inner())
}

/// Errors after which the connection is useless and a new one may work.
pub(super) fn is_connection_error(e: &RedisError) -> bool {
    e.is_io_error() || e.is_connection_dropped() || e.is_unrecoverable_error()
}
