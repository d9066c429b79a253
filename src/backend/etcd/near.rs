//! Grants to waiters in this process, told in this process.
//!
//! A hand-off is one transaction; once etcd has committed it, the lock is
//! the waiter's. A waiter in another process hears of it on its watch; one
//! in the process that made the hand-off used to hear of it the same way:
//! etcd applying the commit, then its watch machinery sending the event
//! down the stream. Under contention within one process (16 waiters in
//! `contended16`) that delivery lay on every hand-off's path. The process
//! that made the hand-off now tells such a waiter itself, right after the
//! commit, with the holder key the transaction read back; the watch stays
//! for every other case.
//!
//! The same transaction reads the queue's new head back. A waiter in this
//! process that has become the head is told that too, with the revision:
//! it then watches the holders at once instead of first hearing that its
//! predecessor's entry went and reading the queue to learn where it stands
//! (a read on every hand-off).
//!
//! Told by queue entry: each of a waiter's entries is registered under its
//! own key while it is the waiter's current one, so a grant to an entry
//! since lost (force-released before the waiter heard of it, seed 2012)
//! reaches nobody, as on the watch (see `handed_over`).

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::sync::mpsc;

use super::keys::HeldKey;

/// What a waiter is told.
pub(super) enum Told {
    /// Granted: the hold, and the lease it was written on.
    Granted(HeldKey, i64),
    /// The oldest entry of the queue as read at this revision (it stays
    /// the oldest until it is granted or leaves: entries made later are
    /// younger).
    Head(i64),
}

type Tx = mpsc::UnboundedSender<Told>;

/// The queue entries of this process's waiters, each with where to tell
/// it.
#[derive(Default)]
pub(super) struct NearWaiters(Mutex<HashMap<Vec<u8>, Tx>>);

impl NearWaiters {
    /// Register `entry` (before the call that makes it is sent): what it is
    /// told arrives on the receiver.
    pub(super) fn enter(&self, entry: &[u8]) -> mpsc::UnboundedReceiver<Told> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.map().insert(entry.to_vec(), tx);
        rx
    }

    /// Forget `entry` (left, lost, or its waiter answered).
    pub(super) fn exit(&self, entry: &[u8]) {
        self.map().remove(entry);
    }

    /// Entry `entry` was granted `hold` (committed): tell its waiter if it
    /// is in this process.
    pub(super) fn grant(&self, entry: &[u8], hold: HeldKey, lease: i64) {
        if let Some(tx) = self.map().remove(entry) {
            // (A waiter that stopped listening answers from etcd instead.)
            let _ = tx.send(Told::Granted(hold, lease));
        }
    }

    /// Entry `entry` is the oldest in its queue as read at revision `at`:
    /// tell its waiter if it is in this process.
    pub(super) fn head(&self, entry: &[u8], at: i64) {
        if let Some(tx) = self.map().get(entry) {
            let _ = tx.send(Told::Head(at));
        }
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<Vec<u8>, Tx>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
#[path = "near_test.rs"]
mod near_test;
