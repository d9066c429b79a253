//! The connections every operation runs on.
//!
//! A deadpool checkout per operation would put the app's recycling method
//! (`Verified` or `Clean` send a query each time) into every lock operation.
//! A `tokio_postgres::Client` pipelines any number of concurrent queries
//! over its one socket, so the backend takes a few connections out of the
//! pool for good (`Object::take`: the pool opens others in their place),
//! sets each up once (below) and prepares its statements there. Several
//! connections let the server use more than one core for independent keys.
//! The pool is used again only to replace a connection that broke or timed
//! out.
//!
//! **Cleanup in order.** Operations go to the connection with the fewest
//! under way (a lone caller stays on one warm server process), except that
//! a caller whose call was dropped before its reply came is pinned to that
//! call's connection until it was answered (`pins.rs`): the cleanup after a
//! dropped call (the release of what a cancelled acquire may have taken,
//! the leave of a waiter that went away) never overtakes the call it cleans
//! up. A connection given up on after a timeout drains first: its pinned
//! callers wait until it answered what was sent behind the timed-out call
//! (at most the op timeout), then have an op timeout of their own.
//!
//! **Settings.** The SQL relies on `READ COMMITTED` (a statement that waited
//! for a row sees what committed meanwhile; under `REPEATABLE READ` it fails
//! with a serialization error instead) and on waiting for rows as long as
//! the op timeout allows, and a lock must outlive a crash once granted. So
//! each connection, the app's pool's included, is set to
//! `default_transaction_isolation = 'read committed'`, `lock_timeout = 0`,
//! `synchronous_commit = on` (`remote_apply`, stronger, is kept),
//! `statement_timeout` = the op timeout, and generic plans; the connection
//! is never handed back, so the settings stay ours.
//!
//! **Broken connections.** One that is known to be closed is replaced
//! before anything is sent on it. One that broke unnoticed (terminated by
//! the server, cut by a pooler or the network) is found when a call fails
//! on it: it is replaced, and the call sent once more on the fresh one if
//! it is safe to run twice (see [`Statement::repeatable`]); a call that is
//! not (force release) is sent only after the connection answered an empty
//! query. Connections the pool hands over to replace it may be dead too
//! (cut while idle, unknown to the pool): setting one up is its test, and a
//! dead one is dropped for the next. So after the server or a pooler drops
//! every connection, at most the calls under way at that moment fail.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use deadpool_postgres::{ClientWrapper, Object, Pool};
use tokio::time::{Instant, timeout_at};
use tokio_postgres::Row;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;

use super::error::{pg_error, pool_error, timed_out};
use super::pins::{self, Pins};
use super::schema::Names;
use super::statements::{Statement, Statements};
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
    /// Shared with the drains of connections given up on.
    pins: Arc<Pins>,
}

/// Who makes a call: its stored key and owner token (see `pins.rs`).
#[derive(Clone, Copy)]
pub(super) struct Caller<'a> {
    pub(super) key: &'a str,
    pub(super) owner: &'a str,
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
            pins: Arc::default(),
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
    fn pick(&self) -> usize {
        let mut best = 0;
        let mut least = self.slots[0].in_flight.load(Ordering::Relaxed);
        for (i, slot) in self.slots.iter().enumerate().skip(1) {
            if least == 0 {
                break;
            }
            let n = slot.in_flight.load(Ordering::Relaxed);
            if n < least {
                best = i;
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
        // Every connection the pool may hold, plus a new one: enough to get
        // past all of them dead.
        let tries = self.pool.status().max_size + 1;
        let mut dead = None;
        for _ in 0..tries {
            let object = match timeout_at(end, self.pool.get()).await {
                Ok(Ok(object)) => object,
                Ok(Err(e)) => return Err(pool_error(e)),
                Err(_) => return Err(timed_out("connecting to PostgreSQL")),
            };
            let client = Object::take(object);
            let statements = match timeout_at(end, set_up(&client, &self.names, op_timeout)).await {
                Ok(Ok(statements)) => statements,
                // Dead before we used it (cut while idle in the pool): the
                // next one.
                Ok(Err(e)) if broken(&e, &client) => {
                    dead = Some(e);
                    continue;
                }
                Ok(Err(e)) => return Err(pg_error(e)),
                Err(_) => return Err(timed_out("preparing statements on PostgreSQL")),
            };
            let live = Arc::new(Live { client, statements });
            let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
            *lock(&slot.current) = Some((generation, live.clone()));
            return Ok((generation, live));
        }
        Err(dead.map_or_else(|| timed_out("connecting to PostgreSQL"), pg_error))
    }

    /// Run one prepared statement, bounded by `end` (connecting included),
    /// and return its one row. `caller` (when the call has one) is pinned
    /// to the call's connection should the call be dropped before its reply
    /// (see `pins.rs`).
    pub(super) async fn query_one(
        &self,
        which: Statement,
        params: &[&(dyn ToSql + Sync)],
        caller: Option<Caller<'_>>,
        end: Instant,
        op_timeout: Duration,
    ) -> Result<Row, LockError> {
        let caller = caller.map(|c| pins::caller(c.key, c.owner));
        let mut end = end;
        let index = match caller {
            Some(c) if self.pins.get(c).is_some() => {
                // Behind a call given up on that may still run: wait for its
                // connection to drain (at most the op timeout), then this
                // call has its own op timeout. (Bounded by the drain, not by
                // `end`: the cleanup that waits must not fail for it, or a
                // half-open connection would leave the lock to its TTL.)
                let drained_by = Instant::now() + 2 * op_timeout;
                match self.pins.settled(c, drained_by).await {
                    Ok((pin, waited)) => {
                        if waited {
                            end = end.max(Instant::now() + op_timeout);
                        }
                        pin.map_or_else(|| self.pick(), |pin| pin.slot)
                    }
                    Err(()) => {
                        return Err(timed_out("waiting for an earlier call of this lock to end"));
                    }
                }
            }
            _ => self.pick(),
        };
        let slot = &self.slots[index];
        slot.in_flight.fetch_add(1, Ordering::Relaxed);
        let _done = InFlight(slot);
        let mut retried = false;
        loop {
            let (generation, live) = self.get(slot, end, op_timeout).await?;
            let statement = live.statements.get(which);
            let mut sending = Sending {
                pins: &self.pins,
                caller,
                slot: index,
                generation,
                sent: self.pins.now(),
                answered: false,
            };
            // (Whether a failure came before the statement was sent.)
            let mut probing = false;
            let sent = async {
                if !which.repeatable() {
                    // Sent only on a connection that just answered: a call
                    // that must not run twice is never sent twice.
                    probing = true;
                    live.client.simple_query("").await?;
                    probing = false;
                }
                live.client.query_one(statement, params).await
            };
            let outcome = timeout_at(end, sent).await;
            if outcome.is_ok() {
                // Answered (or its connection is gone): nothing of this
                // call waits in the pipeline any more.
                sending.answered();
            }
            match outcome {
                Ok(Ok(row)) => return Ok(row),
                Ok(Err(e)) => {
                    if !broken(&e, &live.client) {
                        return Err(pg_error(e));
                    }
                    invalidate(slot, generation);
                    // Once more, on a fresh connection: only a call under
                    // way when its connection dies may fail.
                    if !retried && (which.repeatable() || probing) && Instant::now() < end {
                        retried = true;
                        continue;
                    }
                    return Err(pg_error(e));
                }
                Err(_) => {
                    // No answer in time: the socket may be half-open, and a
                    // statement still running would hold up every query
                    // pipelined behind it. The next call starts afresh; the
                    // server stops the statement at its statement_timeout.
                    // It drains meanwhile: what it carries may still run,
                    // and its caller's cleanup must come after that.
                    invalidate(slot, generation);
                    // Pinned here, with the drain (not by the drop).
                    let caller = sending.caller.take();
                    self.drain(caller, index, generation, live.clone(), op_timeout);
                    return Err(timed_out("waiting for PostgreSQL to answer"));
                }
            }
        }
    }

    /// Connection `generation` of `slot`, given up on while `caller`'s call
    /// was under way, drains (see `pins.rs`): an empty query goes behind
    /// what it carries, and the pins made on it hold until that is
    /// answered or `bound` has passed (a half-open connection: nothing on
    /// it runs any more).
    fn drain(
        &self,
        caller: Option<u64>,
        slot: usize,
        generation: u64,
        live: Arc<Live>,
        bound: Duration,
    ) {
        // Over at `bound` at the latest, also when nothing ends it (its
        // task dropped with its runtime).
        let since = self.pins.draining(caller, slot, generation, bound);
        let pins = self.pins.clone();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(bound, live.client.simple_query("")).await;
            pins.drained(slot, generation, since);
        });
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

/// Set a connection up for our statements (see the module docs) and
/// prepare them: two round trips, once per connection.
async fn set_up(
    client: &ClientWrapper,
    names: &Names,
    op_timeout: Duration,
) -> Result<Statements, tokio_postgres::Error> {
    // Whole milliseconds, at least 1 (0 would mean "no limit").
    let ms = op_timeout.as_millis().clamp(1, i32::MAX as u128);
    // Generic plans: the statements are the same every time, and a custom
    // plan (PostgreSQL's choice while it finds the generic one dearer)
    // would re-plan every call.
    client
        .batch_execute(&format!(
            "SET statement_timeout = {ms}; SET plan_cache_mode = force_generic_plan; \
             SET default_transaction_isolation = 'read committed'; SET lock_timeout = 0; \
             SELECT set_config('synchronous_commit', \
               CASE current_setting('synchronous_commit') \
                 WHEN 'remote_apply' THEN 'remote_apply' ELSE 'on' END, false)"
        ))
        .await?;
    Statements::prepare(client, names).await
}

/// Whether `e` says the connection is gone (closed, reset, garbled, or the
/// server ended the session), rather than a statement's own error.
fn broken(e: &tokio_postgres::Error, client: &tokio_postgres::Client) -> bool {
    let Some(db) = e.as_db_error() else {
        return true;
    };
    let code = db.code();
    client.is_closed()
        || code.code().starts_with("08")
        || *code == SqlState::ADMIN_SHUTDOWN
        || *code == SqlState::CRASH_SHUTDOWN
        || *code == SqlState::CANNOT_CONNECT_NOW
}

/// A call on its way: unless [answered](Sending::answered), its caller is
/// pinned to its connection when it is dropped (cancelled, or timed out).
struct Sending<'a> {
    pins: &'a Pins,
    caller: Option<u64>,
    slot: usize,
    generation: u64,
    /// `Pins::now` before it was sent.
    sent: u64,
    answered: bool,
}

impl Sending<'_> {
    fn answered(&mut self) {
        self.answered = true;
        self.pins.answered(self.slot, self.generation, self.sent);
    }
}

impl Drop for Sending<'_> {
    fn drop(&mut self) {
        if let (false, Some(caller)) = (self.answered, self.caller) {
            self.pins.pin(caller, self.slot, self.generation);
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
