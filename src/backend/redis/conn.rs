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

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use deadpool_redis::redis::aio::MultiplexedConnection;
use deadpool_redis::redis::{RedisError, ScriptInvocation, Value};
use deadpool_redis::{Pool, PoolError};
use tokio::time::{Instant, timeout_at};

use crate::error::LockError;

/// The redis-rs per-request timeout on our connection. Every call is bounded
/// by the backend's own op timeout instead, so this only has to be longer.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(3600);

pub(super) struct Pinned {
    pool: Pool,
    slot: Mutex<Option<Slot>>,
    /// Single flight for replacing the connection.
    connecting: tokio::sync::Mutex<()>,
    generation: AtomicU64,
}

struct Slot {
    generation: u64,
    conn: MultiplexedConnection,
}

impl Pinned {
    pub(super) fn new(pool: Pool) -> Self {
        Pinned {
            pool,
            slot: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
            generation: AtomicU64::new(0),
        }
    }

    pub(super) fn pool(&self) -> &Pool {
        &self.pool
    }

    fn slot(&self) -> MutexGuard<'_, Option<Slot>> {
        // The slot is only ever replaced whole, so a poisoned lock still holds
        // a consistent value.
        self.slot.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn current(&self) -> Option<(u64, MultiplexedConnection)> {
        self.slot().as_ref().map(|s| (s.generation, s.conn.clone()))
    }

    async fn get(&self, end: Instant) -> Result<(u64, MultiplexedConnection), LockError> {
        match self.current() {
            Some(current) => Ok(current),
            // Boxed: connecting is rare, and its (large) future would
            // otherwise be part of every operation's future.
            None => Box::pin(self.connect(end)).await,
        }
    }

    async fn connect(&self, end: Instant) -> Result<(u64, MultiplexedConnection), LockError> {
        let _single_flight = timeout_at(end, self.connecting.lock())
            .await
            .map_err(|_| timed_out("waiting for a Redis connection"))?;
        if let Some(current) = self.current() {
            return Ok(current);
        }
        let object = match timeout_at(end, self.pool.get()).await {
            Ok(Ok(object)) => object,
            Ok(Err(e)) => return Err(pool_error(e)),
            Err(_) => return Err(timed_out("connecting to Redis")),
        };
        let mut conn = deadpool_redis::Connection::take(object);
        conn.set_response_timeout(RESPONSE_TIMEOUT);
        let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
        *self.slot() = Some(Slot {
            generation,
            conn: conn.clone(),
        });
        Ok((generation, conn))
    }

    /// Forget the connection of `generation` (if it is still the current one).
    fn invalidate(&self, generation: u64) {
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
    /// - release and extend check the owner token, so a second run never
    ///   touches another holder's lock (a release repeated after a hand-off
    ///   answers "not yours"; the lock was released all the same);
    /// - leave checks the waiter's ticket; status only reads;
    /// - force release records a nonce with its answer, and a second run
    ///   with that nonce only repeats the answer (force_release.lua).
    ///
    /// A new script must keep this true, or not come through here.
    pub(super) async fn eval(
        &self,
        invocation: &ScriptInvocation<'_>,
        end: Instant,
    ) -> Result<Value, LockError> {
        let mut retried = false;
        loop {
            let (generation, mut conn) = self.get(end).await?;
            match timeout_at(end, invocation.invoke_async::<Value>(&mut conn)).await {
                Ok(Ok(value)) => return Ok(value),
                Ok(Err(e)) if is_connection_error(&e) => {
                    self.invalidate(generation);
                    if !retried && Instant::now() < end {
                        retried = true;
                        continue;
                    }
                    return Err(redis_error(&e));
                }
                Ok(Err(e)) => return Err(redis_error(&e)),
                Err(_) => {
                    // No answer in time: the socket may be half-open, so the
                    // next call starts on a fresh one.
                    self.invalidate(generation);
                    return Err(timed_out("waiting for Redis to answer"));
                }
            }
        }
    }
}

/// Errors after which the connection is useless and a new one may work.
pub(super) fn is_connection_error(e: &RedisError) -> bool {
    e.is_io_error() || e.is_connection_dropped() || e.is_unrecoverable_error()
}

pub(super) fn redis_error(e: &RedisError) -> LockError {
    LockError::BackendUnavailable(format!("Redis: {e}"))
}

pub(super) fn timed_out(what: &str) -> LockError {
    LockError::BackendUnavailable(format!("timed out {what}"))
}

fn pool_error(e: PoolError) -> LockError {
    match e {
        PoolError::Backend(e) => redis_error(&e),
        other => LockError::BackendUnavailable(format!("Redis pool: {other}")),
    }
}
