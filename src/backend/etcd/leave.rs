//! Leaving a lock's queue: a waiter that gives up, or whose acquire call
//! was dropped (the guard below), deletes its entry and passes on a lock
//! handed to it meanwhile.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use etcd_client::{Txn, TxnOp};
use tokio::sync::mpsc;
use tokio::time::{Instant, sleep_until};

use super::EtcdBackend;
use super::handoff::{Giving, Passed};
use super::keys::LockKeys;
use super::near::Told;
use super::watch::Note;
use crate::backend::retry::Retry;
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
    /// Its holder key (what a hand-off to it writes).
    mine: Vec<u8>,
    pub(super) entry: Option<Vec<u8>>,
    /// A call that can make the entry is sent and its reply not read (it
    /// was cancelled, or failed): it may land after the leave.
    pub(super) in_flight: bool,
    /// The entry's deadline (the max wait's end).
    pub(super) until: SystemTime,
    /// The entry registered for a grant told in this process, and where
    /// that grant arrives (see `near`).
    near: Option<(Vec<u8>, mpsc::UnboundedReceiver<Told>)>,
    /// The call answered with the hold of its request's other call (see
    /// `wait.rs`): its entry only leaves the queue, nothing is given back.
    pub(super) answered: bool,
}

/// The holder keys this process's acquire calls are waiting for now, with
/// how many calls wait for each: a grant to one of them is that call's to
/// take (a retry of a request whose first call was dropped waits for the
/// same key), never a dropped call's leave's to pass on.
#[derive(Default)]
pub(super) struct LiveWaits(Mutex<HashMap<Vec<u8>, usize>>);

impl LiveWaits {
    fn enter(&self, mine: &[u8]) {
        let mut waits = self.0.lock().unwrap_or_else(|e| e.into_inner());
        *waits.entry(mine.to_vec()).or_default() += 1;
    }

    fn exit(&self, mine: &[u8]) {
        let mut waits = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = waits.get_mut(mine) {
            *n -= 1;
            if *n == 0 {
                waits.remove(mine);
            }
        }
    }

    fn has(&self, mine: &[u8]) -> bool {
        let waits = self.0.lock().unwrap_or_else(|e| e.into_inner());
        waits.contains_key(mine)
    }
}

impl<'a> WaitGuard<'a> {
    /// The guard of a call of `req` that waits until `until`, counted as
    /// waiting for its holder key until it drops.
    pub(super) fn new(
        backend: &'a EtcdBackend,
        keys: &'a LockKeys,
        req: &'a AcquireRequest,
        until: SystemTime,
    ) -> Self {
        let mine = keys.holder(req.kind(), req.owner(), req.attempt());
        backend.shared.waits.enter(&mine);
        WaitGuard {
            backend,
            key: req.key(),
            keys,
            req,
            mine,
            entry: None,
            in_flight: false,
            until,
            near: None,
            answered: false,
        }
    }

    /// Queue under `entry` from now on (before the call that makes it is
    /// sent): a grant to it made in this process is told to this call.
    pub(super) fn queue_as(&mut self, entry: Vec<u8>) {
        let near = &self.backend.shared.near;
        if let Some((old, _)) = self.near.take() {
            near.exit(&old);
        }
        self.near = Some((entry.clone(), near.enter(&entry)));
        self.entry = Some(entry);
    }

    /// What the current entry is told in this process (never, if nothing
    /// comes).
    pub(super) async fn told(&mut self) -> Told {
        match self.near.as_mut() {
            Some((_, rx)) => match rx.recv().await {
                Some(told) => told,
                None => std::future::pending().await,
            },
            None => std::future::pending().await,
        }
    }
}

impl Drop for WaitGuard<'_> {
    fn drop(&mut self) {
        self.backend.shared.waits.exit(&self.mine);
        if let Some((entry, _)) = self.near.take() {
            self.backend.shared.near.exit(&entry);
        }
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
        let mine = std::mem::take(&mut self.mine);
        let until = self.until;
        let in_flight = self.in_flight;
        let answered = self.answered;
        runtime.spawn(async move {
            let leave = Leave {
                backend: &backend,
                key: &key,
                keys: &keys,
                owner: &owner,
                entry: &entry,
                mine: &mine,
                answered,
            };
            leave.now().await;
            // The call that queues the entry may still land (its reply was
            // lost, or it was cancelled in flight) and queue it again after
            // that leave, and a release may hand the lock to it: until the
            // entry's deadline (from then on no hand-off goes to it), leave
            // again whenever it lands or the lock is handed to it. Only then
            // does the task outlive the leave.
            if in_flight {
                leave.late(until).await;
            }
        });
    }
}

/// How long after a dropped call's deadline its leave still watches for a
/// late entry and a grant to it. A releaser judges an entry's deadline,
/// stamped by the waiter's clock, by its own: one whose clock is behind the
/// waiter's hands the lock to an entry that landed after that deadline for
/// as long as its clock is behind, and the grant, on this process's lease,
/// would stay while this process lives. Covers clocks up to this far apart
/// (`a_late_entry_handed_the_lock_by_a_releaser_whose_clock_is_behind_is_left`).
const LATE_MARGIN: Duration = Duration::from_secs(5);

/// A dropped waiter's leave, with what it needs.
struct Leave<'a> {
    backend: &'a EtcdBackend,
    key: &'a LockKey,
    keys: &'a LockKeys,
    owner: &'a str,
    entry: &'a [u8],
    mine: &'a [u8],
    /// Only the entry goes (the call answered with the hold).
    answered: bool,
}

impl Leave<'_> {
    /// Leave, tried again (backing off, at once when etcd is back: see
    /// `backend/retry.rs`) until etcd answers.
    async fn now(&self) {
        let mut retry = Retry::new(self.backend.shared.conn.answers());
        // (Answered with the hold: nothing of it to give back.)
        let give_back = (!self.answered).then_some(self.mine);
        while let Err(LockError::BackendUnavailable(e)) = self
            .backend
            .leave(self.keys, self.owner, self.entry, give_back)
            .await
        {
            tracing::debug!(key = %self.key.digest(), error = %e, "leaving the lock queue failed; retrying");
            retry.pause().await;
        }
    }

    /// Until `until` (the entry's deadline) and [`LATE_MARGIN`] after it:
    /// watch the entry and our holder key, and leave again when either is
    /// written; then leave once more.
    async fn late(&self, until: SystemTime) {
        let deadline = Instant::now()
            + until.duration_since(SystemTime::now()).unwrap_or_default()
            + LATE_MARGIN;
        let shared = &self.backend.shared;
        let mut retry = Retry::new(shared.conn.answers());
        while Instant::now() < deadline {
            let end = (Instant::now() + self.backend.op_timeout).min(deadline);
            let watched = async {
                let entry = shared
                    .watches
                    .watch(shared, self.entry.to_vec(), None, None, end);
                let mine = shared
                    .watches
                    .watch(shared, self.mine.to_vec(), None, None, end);
                Ok::<_, LockError>((entry.await?, mine.await?))
            };
            let Ok((mut entry, mut mine)) = watched.await else {
                // No watch now: look again after a pause.
                tokio::select! {
                    () = retry.pause() => {}
                    () = sleep_until(deadline) => {}
                }
                self.now().await;
                continue;
            };
            retry.reset();
            // Both set up (or gone): what landed before is seen by this
            // leave, what lands after by the watches.
            let mut set_up = 0;
            loop {
                let note = tokio::select! {
                    note = entry.next() => note,
                    note = mine.next() => note,
                    () = sleep_until(deadline) => break,
                };
                match note {
                    Note::Created(_) => {
                        set_up += 1;
                        if set_up == 2 {
                            self.now().await;
                        }
                    }
                    Note::Events(events) if events.iter().any(|(put, _)| *put) => {
                        self.now().await;
                    }
                    Note::Events(_) => {}
                    Note::Gone => {
                        self.now().await;
                        break;
                    }
                }
            }
        }
        self.now().await;
    }
}

impl EtcdBackend {
    /// Leave the queue for good: delete the entry, and pass the lock on if
    /// it was handed to us (holder key `mine`, when given).
    async fn leave(
        &self,
        keys: &LockKeys,
        owner: &str,
        entry: &[u8],
        mine: Option<&[u8]>,
    ) -> Result<(), LockError> {
        let end = self.deadline();
        let txn = self.leaving(keys, owner, entry.to_vec());
        self.shared.conn.txn("leaving the queue", txn, end).await?;
        let Some(mine) = mine else {
            return Ok(());
        };
        let snapshot = self.snapshot(keys, end).await?;
        self.give_back_handed(keys, snapshot, mine, end).await
    }

    /// Pass on hold `mine` as `snapshot` read it, handed to a call that is
    /// gone: unless it is not ours; or an acquisition of the same owner and
    /// attempt this process knows it holds (a retry of the same request): it
    /// wrote that very value and keeps its expiry (a timer armed for another
    /// value, such as that of a grant the dropped call sent, says nothing of
    /// a hand-off to the entry); or one that a live call of this process
    /// (such a retry) is waiting for, and will take; or one written again
    /// since the hand-off made it (a call has it: a retry's refresh, in
    /// this process or another, an extension; a retry that answers with a
    /// grant it finds through another call's entry takes it over so, see
    /// `wait.rs`); or one on a lease that is not this backend's: a hand-off
    /// writes the hold on the lease of the entry it went through, and our
    /// entries are on ours, so that hold went to an entry of another process
    /// (a retry of the same request, same holder key, queued there), whose
    /// call takes it and which this process's `waits` cannot see; a take or
    /// a claim there writes on that process's lease too. Given back only
    /// while it stores the value read: a retry that took it over after the
    /// read (its refresh rewrote it, keeping its fence) keeps it, and its
    /// timer.
    pub(super) async fn give_back_handed(
        &self,
        keys: &LockKeys,
        snapshot: super::handoff::Snapshot,
        mine: &[u8],
        end: Instant,
    ) -> Result<(), LockError> {
        let Some(h) = snapshot.hold(mine).cloned() else {
            return Ok(());
        };
        if h.rewritten
            || self.shared.leases.known_until(h.lease).is_none()
            || self.shared.expiries.tracks(&h.key, &h.raw_value)
            || self.shared.waits.has(mine)
        {
            return Ok(());
        }
        let passed = self
            .pass_on(
                keys,
                snapshot,
                Giving::Value(&h.key, &h.raw_value),
                &[],
                end,
            )
            .await?;
        if passed != Passed::NotHeld {
            self.shared.expiries.disarm_value(&h.key, &h.raw_value);
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

#[cfg(test)]
#[path = "leave_test.rs"]
pub(super) mod leave_test;
