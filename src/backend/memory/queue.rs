//! The waiting queue: acquirers queued per lock, first come first served,
//! the direct hand-off (at release, force release, and when a holder's lease
//! ran out), and the wait loop.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, SystemTime};

use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;

use super::group::{Holding, settle};
use super::table::{Entry, Inner, next_fence};
use super::take::Attempt;
use crate::backend::Lease;
use crate::error::LockError;
use crate::key::LockKey;
use crate::metadata::LockMetadata;
use crate::spec::{AcquireRequest, LockKind};

pub(super) struct Waiter {
    pub(super) kind: LockKind,
    pub(super) owner: Arc<str>,
    pub(super) attempt: u64,
    pub(super) ttl: Duration,
    pub(super) metadata: Option<LockMetadata>,
    pub(super) tx: oneshot::Sender<Lease>,
    // Tells the waiter to look again when the lock's expiry moved earlier
    // than the one it sleeps until (a hand-off to a shorter TTL, an extend).
    pub(super) nudge: Arc<Notify>,
}

/// Give the lock in `entry` to its first live waiters, each with a fresh
/// fence: the head of the queue, and after it every waiter that fits beside
/// what is granted (consecutive shared waiters, permits while there is
/// room). The entry's state says what is free: a group's holds are live
/// (the caller pruned them); without a group, the exclusive holder is gone.
/// Whether the entry is held afterwards; `false`: nobody holds it and
/// nobody was waiting, the caller removes it. The waiter now at the head of
/// the queue is nudged to learn the new expiry, which may come before the
/// one it sleeps until.
pub(super) fn hand_off(fence: &AtomicU64, entry: &mut Entry) -> bool {
    let (mut held, mut holders) = match entry.group() {
        Some(g) => (Some(g.kind), g.holds.len()),
        None => (None, 0),
    };
    let mut granted = false;
    loop {
        let Some(w) = entry.extra.as_mut().and_then(|e| e.waiters.pop_front()) else {
            break;
        };
        if w.tx.is_closed() {
            continue;
        }
        if held.is_some_and(|k| !w.kind.fits_beside(k, holders)) {
            // Not its turn yet: it stays at the head.
            entry.queue().push_front(w);
            break;
        }
        let wall = SystemTime::now();
        let now = Instant::now();
        let fence = next_fence(fence);
        let lease = Lease::new(fence, wall, wall, w.ttl);
        if w.tx.send(lease).is_err() {
            continue;
        }
        granted = true;
        if w.kind == LockKind::Exclusive {
            entry.owner = w.owner;
            entry.attempt = w.attempt;
            entry.fence = fence;
            entry.acquired_at = wall;
            entry.expires = now + w.ttl;
            entry.set_metadata(w.metadata);
            held = Some(LockKind::Exclusive);
            break;
        }
        let hold = Holding {
            owner: w.owner,
            attempt: w.attempt,
            fence,
            acquired_at: wall,
            expires: now + w.ttl,
            metadata: w.metadata,
            retaken: false,
        };
        entry.add_hold(w.kind, hold, now);
        held = Some(w.kind);
        holders += 1;
    }
    if granted {
        nudge_head(entry);
    }
    held.is_some()
}

/// The lock of `entry` now expires earlier than its waiters may think: the
/// first live one looks again (and, when it is handed the lock, nudges the
/// next in turn), so the queue follows the new expiry in order.
pub(super) fn nudge_head(entry: &Entry) {
    let mut live = entry.waiters().into_iter().flatten();
    if let Some(w) = live.find(|w| !w.tx.is_closed()) {
        w.nudge.notify_one();
    }
}

pub(super) enum Recheck {
    /// Held (or just handed over) until then.
    HeldUntil(Instant),
    /// No entry any more.
    Gone,
}

impl Inner {
    /// Give the lock in `entry` to its first live waiter (see [`hand_off`]).
    pub(super) fn hand_off(&self, entry: &mut Entry) -> bool {
        hand_off(&self.fence, entry)
    }

    /// Nudge the first live waiter of `key` (see [`nudge_head`]).
    pub(super) fn nudge(&self, key: &LockKey) {
        let (hash, shard) = self.shard(key, Instant::now());
        if let Some(entry) = shard.find(hash, key) {
            nudge_head(entry);
        }
    }

    /// For a queued waiter of `req` whose holder's expiry has passed: hand
    /// an expired lock to the head of the queue (every waiter keeps its
    /// place), or learn the holder's new expiry (extended, or handed to
    /// another). `Gone` also when the lock is held for `req` itself: handed
    /// to another call of the same request (its retry, queued apart), which
    /// this call then answers with as a retry, at once rather than at its
    /// max wait.
    pub(super) fn recheck(&self, req: &AcquireRequest) -> Recheck {
        let now = Instant::now();
        let key = req.key();
        let (hash, mut shard) = self.shard(key, now);
        let Some(mut occupied) = shard.find_entry(hash, key) else {
            return Recheck::Gone;
        };
        if occupied.get().holds_for(req, now) {
            return Recheck::Gone;
        }
        if settle(&self.fence, occupied.get_mut(), now) {
            let at = occupied.get().earliest_expiry();
            shard.expires_at(at);
            Recheck::HeldUntil(at)
        } else {
            occupied.remove();
            Recheck::Gone
        }
    }
}

/// A place in a key's queue. If the waiting future is dropped after the lock
/// was handed to it, the lock is passed on at once instead of idling until
/// its TTL ends.
struct WaitSlot<'a> {
    inner: &'a Inner,
    key: &'a LockKey,
    owner: &'a str,
    rx: oneshot::Receiver<Lease>,
    // The lease was taken: nothing to give back or pass on.
    done: bool,
}

impl WaitSlot<'_> {
    /// Leave the queue; returns the lease if it was handed over meanwhile
    /// (then it is ours to keep).
    fn leave(&mut self) -> Option<Lease> {
        self.rx.close();
        let lease = self.rx.try_recv().ok();
        self.done |= lease.is_some();
        lease
    }
}

impl Drop for WaitSlot<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        match self.leave() {
            // Handed over, but nobody waits for it any more: pass it on.
            Some(lease) => self.inner.release_sync(self.key, self.owner, lease.fence),
            // Out of the queue: the next waiter may be its head now, and
            // must learn the expiry we were watching for it.
            None => self.inner.nudge(self.key),
        }
    }
}

impl Inner {
    /// One attempt without joining the queue: `None` if the lock is busy and
    /// `req` would wait.
    pub(super) fn acquire_now(&self, req: &AcquireRequest) -> Option<Result<Lease, LockError>> {
        match self.try_acquire(req, false) {
            Attempt::Acquired(lease) => Some(Ok(lease)),
            Attempt::Mismatch => Some(Err(LockError::KindMismatch)),
            Attempt::Busy {
                holder_expires,
                now,
                ..
            } if req.max_wait().is_zero() => Some(Err(LockError::AcquisitionFailed {
                retry_after: Some(holder_expires.saturating_duration_since(now)),
            })),
            Attempt::Busy { .. } => None,
        }
    }
}

pub(super) async fn acquire(inner: &Inner, req: &AcquireRequest) -> Result<Lease, LockError> {
    // Without a wait there is always an answer at once.
    if req.max_wait().is_zero()
        && let Some(result) = inner.acquire_now(req)
    {
        return result;
    }
    let start = Instant::now();
    // As in every backend, a wait longer than a year is as good as forever.
    let deadline = start.checked_add(req.max_wait().min(crate::spec::MAX_TTL));
    loop {
        let may_wait = deadline.is_some_and(|d| d > Instant::now());
        let (rx, holder_expires, now) = match inner.try_acquire(req, may_wait) {
            Attempt::Acquired(lease) => return Ok(lease),
            Attempt::Mismatch => return Err(LockError::KindMismatch),
            Attempt::Busy {
                rx,
                holder_expires,
                now,
            } => (rx, holder_expires, now),
        };
        let retry_after = Some(holder_expires.saturating_duration_since(now));
        let Some((rx, nudge)) = rx else {
            return Err(LockError::Timeout {
                waited: now.saturating_duration_since(start),
                retry_after,
            });
        };
        // Queued (a new entry, at the back): the same event as the other
        // backends' when their queue entry is written.
        tracing::debug!(key = %req.key().digest(), "lock busy: waiting");
        let mut slot = WaitSlot {
            inner,
            key: req.key(),
            owner: req.owner(),
            rx,
            done: false,
        };
        let mut holder_expires = holder_expires;
        loop {
            let wake_at = match deadline {
                Some(d) => d.min(holder_expires),
                None => holder_expires,
            };
            tokio::select! {
                biased;
                handed = &mut slot.rx => {
                    if let Ok(lease) = handed {
                        // Consumed: nothing for the slot's Drop to give back.
                        slot.done = true;
                        return Ok(lease);
                    }
                    // The entry was swept or force-released: try again at once.
                    break;
                }
                () = nudge.notified() => {
                    // The expiry moved earlier: sleep until the new one.
                    match inner.recheck(req) {
                        Recheck::HeldUntil(at) => holder_expires = at,
                        Recheck::Gone => {
                            if let Some(lease) = slot.leave() {
                                return Ok(lease);
                            }
                            break;
                        }
                    }
                }
                _ = tokio::time::sleep_until(wake_at) => {
                    if deadline.is_none_or(|d| Instant::now() < d) {
                        // The holder's expiry as we knew it: hand the lock
                        // on if it did expire (to the head of the queue,
                        // maybe us), else wait for its new expiry. Nobody
                        // leaves the queue for it.
                        match inner.recheck(req) {
                            Recheck::HeldUntil(at) => {
                                holder_expires = at;
                                continue;
                            }
                            Recheck::Gone => {}
                        }
                    }
                    if let Some(lease) = slot.leave() {
                        return Ok(lease);
                    }
                    // Our wait is over (the retry fails with a timeout
                    // unless the lock just came free), or the entry is gone.
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::backend::Holder;
    use std::time::Duration;

    use tokio::time::Instant;

    use super::super::MemoryBackend;
    use super::super::testing::{
        futures_poll, held_for_a_minute, req, spawn_acquire, until_queued,
    };
    use crate::backend::{AcquireRequest, LockBackend, LockError};

    #[tokio::test(start_paused = true)]
    async fn dropped_waiter_passes_the_lock_on() {
        let b = MemoryBackend::new();
        let first = req("k", "a", 10_000, 0);
        b.acquire(&first).await.unwrap();
        let second = req("k", "b", 10_000, 5_000);
        let third = req("k", "c", 10_000, 5_000);
        let mut w2 = Box::pin(b.acquire(&second));
        assert!(futures_poll(&mut w2).is_none());
        let w3 = tokio::spawn({
            let b = b.clone();
            let third = third.clone();
            async move { b.acquire(&third).await }
        });
        tokio::task::yield_now().await;
        b.release(first.key(), Holder::owner_only("a"))
            .await
            .unwrap();
        // b was handed the lock but its future is dropped before it looks.
        drop(w2);
        let lease = w3.await.unwrap().unwrap();
        assert!(lease.fence > 1);
        assert_eq!(b.status(third.key()).await.unwrap().unwrap().owner, "c");
    }

    /// A lock handed to a waiter with a shorter TTL that never releases it
    /// goes to the next waiter when that TTL ends, not when the first
    /// holder's would have, nor at the next waiter's max wait.
    #[tokio::test(start_paused = true)]
    async fn next_waiter_follows_a_shorter_handed_over_expiry() {
        let (b, a) = held_for_a_minute().await;
        let start = Instant::now();
        let spawn = |r: AcquireRequest| spawn_acquire(&b, r);
        let second = spawn(req("k", "b", 5_000, 60_000));
        until_queued(&b, a.key(), 1).await;
        let third = spawn(req("k", "c", 5_000, 30_000));
        until_queued(&b, a.key(), 2).await;
        let fourth = spawn(req("k", "d", 60_000, 50_000));
        until_queued(&b, a.key(), 3).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        b.release(a.key(), Holder::owner_only("a")).await.unwrap();
        // b holds it for 5 s and never releases; c gets it when that ends,
        // keeps it 5 s without releasing, and d gets it then.
        let at = |t: Instant| t - start;
        assert_eq!(at(second.await.unwrap().unwrap()), Duration::from_secs(1));
        assert_eq!(at(third.await.unwrap().unwrap()), Duration::from_secs(6));
        assert_eq!(at(fourth.await.unwrap().unwrap()), Duration::from_secs(11));
        assert_eq!(b.status(a.key()).await.unwrap().unwrap().owner, "d");
    }

    /// The head of the queue leaves (its max wait ends) after learning that
    /// the holder's lock now expires earlier: the next waiter learns it
    /// too, and gets the lock when it expires.
    #[tokio::test(start_paused = true)]
    async fn a_leaving_head_passes_on_what_it_learnt() {
        let (b, a) = held_for_a_minute().await;
        let start = Instant::now();
        let spawn = |r: AcquireRequest| spawn_acquire(&b, r);
        let second = spawn(req("k", "b", 5_000, 10_000));
        until_queued(&b, a.key(), 1).await;
        let third = spawn(req("k", "c", 5_000, 100_000));
        until_queued(&b, a.key(), 2).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        b.extend(a.key(), Holder::owner_only("a"), Duration::from_secs(20))
            .await
            .unwrap();
        // b's max wait ends at 10 s; a's lock at 21 s, unreleased.
        let timed_out = second.await.unwrap();
        assert!(
            matches!(timed_out, Err(LockError::Timeout { .. })),
            "{timed_out:?}"
        );
        assert_eq!(
            third.await.unwrap().unwrap() - start,
            Duration::from_secs(21)
        );
    }
}
