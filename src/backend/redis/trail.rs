//! Cleanup never overtakes the call it cleans up.
//!
//! An acquisition whose reply never came (the op timeout, a broken
//! connection, a cancelled call) is cleaned up: the layer releases with the
//! owner token made for that call, a waiter leaves the queue. On one
//! multiplexed connection commands run in the order they were sent, but a
//! timeout replaces the connection (it may be half-open), and a cleanup on
//! the new one could run before the acquisition still in flight on the old
//! one: the late acquisition would then take the lock (or queue) for
//! nobody, until its TTL (or max wait) ends.
//!
//! So the connection an acquisition of an owner went out on without a
//! reply is remembered (for [`TRAIL_LIFE`]), and a cleanup of that owner
//! (a release without fence, a leave) goes out on it, behind the
//! acquisition: both run, in order, or neither. Only if that connection is
//! broken (nothing on it can run any more) does the cleanup take the
//! current one.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use super::conn::Conn;

/// How long a call's connection is remembered: far longer than any op
/// timeout, so that a cleanup, and the retries of a waiter's leave, follow
/// the call.
pub(super) const TRAIL_LIFE: Duration = Duration::from_secs(60);
/// At most this many are remembered (the oldest go first).
const MAX_TRAILS: usize = 1024;

/// Per owner token, the connection its last unanswered acquisition went
/// out on.
#[derive(Default)]
pub(super) struct Trails {
    map: Mutex<HashMap<String, (Conn, Instant)>>,
}

impl Trails {
    fn map(&self) -> MutexGuard<'_, HashMap<String, (Conn, Instant)>> {
        // Entries are inserted and removed whole: a poisoned lock holds a
        // consistent map.
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn record(&self, owner: &str, conn: Conn) {
        let now = Instant::now();
        let mut map = self.map();
        if map.len() >= MAX_TRAILS {
            map.retain(|_, (_, at)| now.duration_since(*at) < TRAIL_LIFE);
            if map.len() >= MAX_TRAILS
                && let Some(oldest) = map
                    .iter()
                    .min_by_key(|(_, (_, at))| *at)
                    .map(|(k, _)| k.clone())
            {
                map.remove(&oldest);
            }
        }
        map.insert(owner.to_owned(), (conn, now));
    }

    /// Where a cleanup of `owner` must go, if an acquisition of it may
    /// still be in flight.
    pub(super) fn of(&self, owner: &str) -> Option<Conn> {
        let mut map = self.map();
        match map.get(owner) {
            Some((conn, at)) if at.elapsed() < TRAIL_LIFE => Some(conn.clone()),
            Some(_) => {
                map.remove(owner);
                None
            }
            None => None,
        }
    }
}

/// An acquisition call of `owner` in flight: `sent` is the connection it
/// went out on until its reply comes (see `Pinned::eval_traced`). Dropped
/// without one (failed, timed out, cancelled), it is remembered.
pub(super) struct Trail<'a> {
    trails: &'a Trails,
    owner: &'a str,
    pub(super) sent: Option<Conn>,
}

impl<'a> Trail<'a> {
    pub(super) fn new(trails: &'a Trails, owner: &'a str) -> Self {
        Trail {
            trails,
            owner,
            sent: None,
        }
    }
}

impl Drop for Trail<'_> {
    fn drop(&mut self) {
        if let Some(conn) = self.sent.take() {
            self.trails.record(self.owner, conn);
        }
    }
}
