//! The connections every operation runs on.
//!
//! A deadpool checkout per operation would put the app's recycling method
//! (`Verified` or `Clean` send a query each time) into every lock operation.
//! A `tokio_postgres::Client` pipelines any number of concurrent queries
//! over its one socket, so the backend takes a few connections out of the
//! pool for good (`Object::take`: the pool opens others in their place),
//! prepares its statements on each once, sets `statement_timeout` to the op
//! timeout (the connection is never handed back, so the setting stays
//! ours), and gives each operation the one with the fewest operations under way. Several connections
//! let the server use more than one core for independent keys. The pool is
//! used again only to replace a connection that broke or timed out.
//!
//! Nothing is sent twice: an operation whose connection breaks after it was
//! sent fails as unavailable (the caller cleans up as after any lost
//! reply). A connection already known to be closed (server restarted) is
//! replaced *before* anything is sent on it, so the first operation after an
//! outage does not fail for a stale socket.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use deadpool_postgres::{ClientWrapper, Object, Pool};
use tokio::time::{Instant, timeout_at};
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use super::error::{pg_error, pool_error, timed_out};
use super::ops::{Statement, Statements};
use super::schema::Names;
use crate::error::LockError;

/// A connection of ours with its prepared statements.
pub(super) struct Live {
    client: ClientWrapper,
    statements: Statements,
}

struct Slot {
    current: Mutex<Option<(u64, Arc<Live>)>>,
    /// Operations under way on this slot.
    in_flight: AtomicUsize,
    /// Single flight for replacing the connection.
    connecting: tokio::sync::Mutex<()>,
}

pub(super) struct Conns {
    pool: Pool,
    names: Names,
    slots: Box<[Slot]>,
    generation: AtomicU64,
}

impl Conns {
    pub(super) fn new(pool: Pool, names: Names, connections: usize) -> Self {
        Conns {
            pool,
            names,
            slots: (0..connections.max(1))
                .map(|_| Slot {
                    current: Mutex::new(None),
                    in_flight: AtomicUsize::new(0),
                    connecting: tokio::sync::Mutex::new(()),
                })
                .collect(),
            generation: AtomicU64::new(0),
        }
    }

    pub(super) fn pool(&self) -> &Pool {
        &self.pool
    }

    pub(super) fn names(&self) -> &Names {
        &self.names
    }

    pub(super) fn connections(&self) -> usize {
        self.slots.len()
    }

    /// The slot with the fewest operations under way, the first on a tie:
    /// a lone caller stays on one connection (one warm server process),
    /// concurrent ones spread over all.
    fn pick(&self) -> &Slot {
        let mut best = &self.slots[0];
        let mut least = best.in_flight.load(Ordering::Relaxed);
        for slot in &self.slots[1..] {
            if least == 0 {
                break;
            }
            let n = slot.in_flight.load(Ordering::Relaxed);
            if n < least {
                best = slot;
                least = n;
            }
        }
        best
    }

    /// A live connection of `slot`, connecting it first if needed.
    async fn get(
        &self,
        slot: &Slot,
        end: Instant,
        op_timeout: Duration,
    ) -> Result<(u64, Arc<Live>), LockError> {
        if let Some(live) = current(slot)
            && !live.1.client.is_closed()
        {
            return Ok(live);
        }
        // Boxed: connecting is rare, and its (large) future would otherwise
        // be part of every operation's future.
        Box::pin(self.connect(slot, end, op_timeout)).await
    }

    async fn connect(
        &self,
        slot: &Slot,
        end: Instant,
        op_timeout: Duration,
    ) -> Result<(u64, Arc<Live>), LockError> {
        let _single_flight = timeout_at(end, slot.connecting.lock())
            .await
            .map_err(|_| timed_out("waiting for a PostgreSQL connection"))?;
        if let Some(live) = current(slot)
            && !live.1.client.is_closed()
        {
            return Ok(live);
        }
        let object = match timeout_at(end, self.pool.get()).await {
            Ok(Ok(object)) => object,
            Ok(Err(e)) => return Err(pool_error(e)),
            Err(_) => return Err(timed_out("connecting to PostgreSQL")),
        };
        let client = Object::take(object);
        let set_up = async {
            // Whole milliseconds, at least 1 (0 would mean "no limit").
            let ms = op_timeout.as_millis().clamp(1, i32::MAX as u128);
            // Generic plans: the statements are the same every time, and a
            // custom plan (PostgreSQL's choice while it finds the generic
            // one dearer) would re-plan every call.
            client
                .batch_execute(&format!(
                    "SET statement_timeout = {ms}; SET plan_cache_mode = force_generic_plan"
                ))
                .await?;
            Statements::prepare(&client, &self.names).await
        };
        let statements = match timeout_at(end, set_up).await {
            Ok(Ok(statements)) => statements,
            Ok(Err(e)) => return Err(pg_error(&e)),
            Err(_) => return Err(timed_out("preparing statements on PostgreSQL")),
        };
        let live = Arc::new(Live { client, statements });
        let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
        *lock(&slot.current) = Some((generation, live.clone()));
        Ok((generation, live))
    }

    /// Run one prepared statement, bounded by `end` (connecting included),
    /// and return its one row.
    pub(super) async fn query_one(
        &self,
        which: Statement,
        params: &[&(dyn ToSql + Sync)],
        end: Instant,
        op_timeout: Duration,
    ) -> Result<Row, LockError> {
        let slot = self.pick();
        slot.in_flight.fetch_add(1, Ordering::Relaxed);
        let _done = InFlight(slot);
        let (generation, live) = self.get(slot, end, op_timeout).await?;
        let statement = live.statements.get(which);
        match timeout_at(end, live.client.query_one(statement, params)).await {
            Ok(Ok(row)) => Ok(row),
            Ok(Err(e)) => {
                if live.client.is_closed() || e.as_db_error().is_none() {
                    invalidate(slot, generation);
                }
                Err(pg_error(&e))
            }
            Err(_) => {
                // No answer in time: the socket may be half-open, and a
                // statement still running would hold up every query
                // pipelined behind it. The next call starts afresh; the
                // server stops the statement at its statement_timeout.
                invalidate(slot, generation);
                Err(timed_out("waiting for PostgreSQL to answer"))
            }
        }
    }

    /// A connection checked out of the pool (not one of ours), by `end`:
    /// for `migrate` and other rare statements that must not hold up the
    /// pipelined lock operations.
    pub(super) async fn checkout(&self, end: Instant) -> Result<Object, LockError> {
        match timeout_at(end, self.pool.get()).await {
            Ok(Ok(object)) => Ok(object),
            Ok(Err(e)) => Err(pool_error(e)),
            Err(_) => Err(timed_out("connecting to PostgreSQL")),
        }
    }
}

/// Counts an operation on its slot until dropped (also when cancelled).
struct InFlight<'a>(&'a Slot);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Only ever replaced whole: a poisoned lock still holds a consistent value.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn current(slot: &Slot) -> Option<(u64, Arc<Live>)> {
    lock(&slot.current).clone()
}

/// Forget the connection of `generation` (if it is still the slot's).
fn invalidate(slot: &Slot, generation: u64) {
    let mut current = lock(&slot.current);
    if current.as_ref().is_some_and(|(g, _)| *g == generation) {
        *current = None;
    }
}
