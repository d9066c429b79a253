//! Permit releases of one process taking turns per lock (see [`Passing`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::time::Instant;

use super::conn::timed_out;
use super::handoff::{HANDED_MAX, Snapshot};
use super::keys::{HeldKey, LockKeys};
use crate::backend::Holder;
use crate::error::LockError;
use crate::spec::LockKind;

/// Permits handed on in this process, one lock at a time. Several holders
/// of a lock's permits releasing at once into a queue each read the same
/// oldest waiter and raced to grant it: all but one failed their
/// transaction (a Raft commit each) and read again, and raced for the
/// next (etcd `permits4`: 2.4 failed hand-offs per grant). Once a lock's
/// queue is seen, its permit releases in this process take turns, each
/// from the state the last grant read (it shows the next waiter and the
/// holds), which also spares the release its read-first transaction. A
/// state gone stale (another process granted that waiter) only fails the
/// transaction's conditions, whose failure branch reads afresh. Other
/// processes race as before: no worse.
#[derive(Default)]
pub(super) struct Passing(Mutex<HashMap<Vec<u8>, Turns>>);

#[derive(Default)]
struct Turns {
    turn: Arc<tokio::sync::Mutex<()>>,
    /// The state the last grant read, while it showed a waiter.
    last: Option<Snapshot>,
}

/// One permit release's turn to hand on a lock.
pub(super) type Turn = tokio::sync::OwnedMutexGuard<()>;

impl Passing {
    /// Wait for this process's turn to hand on `keys`'s permits: when
    /// `queued` (the lock has a queue), or when its queue was seen lately.
    /// `None`: no turn to take.
    pub(super) async fn turn(
        &self,
        keys: &LockKeys,
        queued: bool,
        end: Instant,
    ) -> Result<Option<Turn>, LockError> {
        let turn = {
            let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
            let lock = keys.holders().0;
            if !queued && map.get(&lock).is_none_or(|t| t.last.is_none()) {
                return Ok(None);
            }
            if map.len() >= HANDED_MAX && !map.contains_key(&lock) {
                // (Turns in flight keep their mutex; a new one only races.)
                map.clear();
            }
            map.entry(lock).or_default().turn.clone()
        };
        match tokio::time::timeout_at(end, turn.lock_owned()).await {
            Ok(turn) => Ok(Some(turn)),
            Err(_) => Err(timed_out("waiting to hand an etcd lock over")),
        }
    }

    /// The state the last grant of `keys` read, if it is newer than
    /// `than` (a revision), shows `holder`'s hold and a waiter.
    pub(super) fn last(
        &self,
        keys: &LockKeys,
        holder: Holder<'_>,
        than: i64,
    ) -> Option<(Snapshot, HeldKey)> {
        let map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let last = map.get(&keys.holders().0)?.last.as_ref()?;
        let h = last.find(holder)?;
        (last.at > than && last.head.is_some()).then(|| (last.clone(), h.clone()))
    }

    /// Keep `snapshot` (a grant's state) for the next permit release of
    /// the lock, if it has a queue here (else forget it: the state of a
    /// lock with nobody waiting is no head start).
    pub(super) fn keep(&self, keys: &LockKeys, snapshot: &Snapshot) {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let Some(turns) = map.get_mut(&keys.holders().0) else {
            return;
        };
        let permits = snapshot
            .holders
            .iter()
            .all(|h| matches!(h.kind, LockKind::Permits(_)));
        turns.last = (permits && snapshot.head.is_some()).then(|| snapshot.clone());
    }

    /// The lock was given back to nobody: its queue is gone.
    pub(super) fn forget(&self, keys: &LockKeys) {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(turns) = map.get_mut(&keys.holders().0) {
            turns.last = None;
        }
    }
}
