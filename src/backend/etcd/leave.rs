//! Leaving a lock's queue: a waiter that gives up, or whose acquire call
//! was dropped (the guard below), deletes its entry and passes on a lock
//! handed to it meanwhile.

use std::time::{Duration, SystemTime};

use etcd_client::{Txn, TxnOp};
use tokio::time::sleep;

use super::EtcdBackend;
use super::handoff::{Giving, Passed};
use super::keys::LockKeys;
use crate::error::LockError;
use crate::key::LockKey;
use crate::spec::AcquireRequest;

/// A waiter's queue entry. Dropped while it is set (the acquire future was
/// cancelled, or it failed), it leaves the queue in the background, and
/// releases the lock if it was handed over meanwhile: nobody would ever
/// release it otherwise, and our lease would keep it while this process
/// lives. Tried again, backing off, until etcd answers.
pub(super) struct WaitGuard<'a> {
    pub(super) backend: &'a EtcdBackend,
    pub(super) key: &'a LockKey,
    pub(super) keys: &'a LockKeys,
    pub(super) req: &'a AcquireRequest,
    pub(super) entry: Option<Vec<u8>>,
    /// A call that can make the entry is sent and its reply not read (it
    /// was cancelled, or failed): it may land after the leave.
    pub(super) in_flight: bool,
    /// The entry's deadline (the max wait's end).
    pub(super) until: SystemTime,
}

/// First and largest pause between attempts to leave the queue.
const LEAVE_RETRY_FIRST: Duration = Duration::from_millis(50);
const LEAVE_RETRY_MAX: Duration = Duration::from_secs(1);

impl Drop for WaitGuard<'_> {
    fn drop(&mut self) {
        let Some(entry) = self.entry.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // Nowhere to run it: the entry goes with our lease.
            return;
        };
        let backend = self.backend.clone();
        let key = self.key.clone();
        let keys = self.keys.clone();
        let owner = self.req.owner().to_owned();
        let mine = keys.holder(self.req.kind(), &owner, self.req.attempt());
        let until = self.until;
        // Now, and, when the call that queues the entry may still land (its
        // reply was lost, or it was cancelled in flight) and queue it again
        // after the first leave, once more when the entry's deadline has
        // passed: from then on, no hand-off goes to it. Only then does the
        // task outlive the leave (a cancelled waiter with a long max wait
        // otherwise left a task asleep for all of it).
        let rounds = if self.in_flight { 2 } else { 1 };
        runtime.spawn(async move {
            for round in 0..rounds {
                if round == 1 {
                    let left = until.duration_since(SystemTime::now()).unwrap_or_default();
                    sleep(left + Duration::from_millis(10)).await;
                }
                let mut pause = LEAVE_RETRY_FIRST;
                while let Err(LockError::BackendUnavailable(e)) =
                    backend.leave(&keys, &owner, &entry, &mine).await
                {
                    tracing::debug!(key = %key.digest(), error = %e, "leaving the lock queue failed; retrying");
                    sleep(pause).await;
                    pause = (pause * 2).min(LEAVE_RETRY_MAX);
                }
            }
        });
    }
}

impl EtcdBackend {
    /// Leave the queue for good: delete the entry, and pass the lock on if
    /// it was handed to us (holder key `mine`).
    async fn leave(
        &self,
        keys: &LockKeys,
        owner: &str,
        entry: &[u8],
        mine: &[u8],
    ) -> Result<(), LockError> {
        let end = self.deadline();
        let txn = self.leaving(keys, owner, entry.to_vec());
        self.shared.conn.txn("leaving the queue", txn, end).await?;
        let snapshot = self.snapshot(keys, end).await?;
        // Not ours, or an acquisition of the same owner and attempt this
        // process knows it holds (a retry of the same request).
        let Some(h) = snapshot.hold(mine).cloned() else {
            return Ok(());
        };
        if self.shared.expiries.tracks(&h.key) {
            return Ok(());
        }
        let (start, stop) = (h.key.clone(), super::ops::after(&h.key));
        let passed = self
            .pass_on(keys, snapshot, Giving::Fence(&h.key, h.fence), &[], end)
            .await?;
        if passed != Passed::NotHeld {
            self.shared.expiries.disarm_range(&start, &stop);
        }
        Ok(())
    }
}

impl EtcdBackend {
    /// Delete a waiter's `entry` (and its owner index entry, unless the
    /// owner holds the lock), then read the holder.
    pub(super) fn leaving(&self, keys: &LockKeys, owner: &str, entry: Vec<u8>) -> Txn {
        let mut ops = vec![TxnOp::delete(entry, None)];
        let mut unindexed = ops.clone();
        unindexed.push(TxnOp::delete(keys.index(owner), None));
        ops.push(keys.get_holders());
        unindexed.push(keys.get_holders());
        if !self.index_owners {
            return Txn::new().and_then(ops);
        }
        Txn::new()
            .when([keys.owner_free(owner)])
            .and_then(unindexed)
            .or_else(ops)
    }
}
