//! Connections of their own, for calls that block the connection they run
//! on (`WAIT`, see `replicas.rs`).
//!
//! Redis reads no further command from a client blocked in `WAIT`, so on
//! the backend's one multiplexed connection every other call of the
//! process, renewals included, would queue behind each `WAIT` (up to its
//! timeout when a replica is gone: long enough for other locks to expire).
//! A blocking call therefore takes a connection out of this set for its
//! whole duration, alone. On a cluster that is a cluster connection of its
//! own, whose connection to the slot's primary carries both the write that
//! `WAIT` must cover and the `WAIT`.
//!
//! A connection goes back to the set only after every reply on it came
//! back; one given up on (a timeout) may still have a `WAIT` pending and is
//! dropped. At most [`MAX_DEDICATED`] exist at once: more callers wait for
//! one, within their own deadline.

use std::sync::{Mutex, MutexGuard};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, timeout_at};

use super::conn::{Conn, Pinned};
use super::error::timed_out;
use crate::error::LockError;

/// Dedicated connections open at once, in use or idle.
pub(super) const MAX_DEDICATED: usize = 64;
/// Idle ones kept for reuse.
const MAX_IDLE: usize = 8;

pub(super) struct Dedicated {
    permits: std::sync::Arc<Semaphore>,
    idle: Mutex<Vec<(Conn, OwnedSemaphorePermit)>>,
}

/// A connection out of the set, for one caller; dropped, it closes (see
/// [`Lent::give_back`]).
pub(super) struct Lent<'a> {
    pub(super) conn: Conn,
    permit: OwnedSemaphorePermit,
    set: &'a Dedicated,
}

impl Dedicated {
    pub(super) fn new() -> Self {
        Dedicated {
            permits: std::sync::Arc::new(Semaphore::new(MAX_DEDICATED)),
            idle: Mutex::new(Vec::new()),
        }
    }

    fn idle(&self) -> MutexGuard<'_, Vec<(Conn, OwnedSemaphorePermit)>> {
        // Only pushed and popped whole: a poisoned lock holds a consistent
        // value.
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// An idle connection, or a new one from `source`, by `end`.
    pub(super) async fn lend<'a>(
        &'a self,
        source: &Pinned,
        end: Instant,
    ) -> Result<Lent<'a>, LockError> {
        if let Some((conn, permit)) = self.idle().pop() {
            return Ok(Lent {
                conn,
                permit,
                set: self,
            });
        }
        let permit = timeout_at(end, self.permits.clone().acquire_owned())
            .await
            .map_err(|_| timed_out("waiting for a dedicated Redis connection"))?
            .map_err(|_| timed_out("waiting for a dedicated Redis connection"))?;
        let conn = source.open(end).await?;
        Ok(Lent {
            conn,
            permit,
            set: self,
        })
    }
}

impl Lent<'_> {
    /// Every reply on it came back: it can serve the next caller.
    pub(super) fn give_back(self) {
        let mut idle = self.set.idle();
        if idle.len() < MAX_IDLE {
            idle.push((self.conn, self.permit));
        }
    }
}
