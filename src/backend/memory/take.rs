//! Taking a lock: the attempt of an acquirer (free, a retry, room beside a
//! group's holds, or busy and queued), without waiting; the wait loop is in
//! `queue.rs`.

use std::sync::Arc;
use std::time::SystemTime;

use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;

use super::group::{Holding, settle};
use super::queue::Waiter;
use super::table::{Entry, Extra, Inner};
use crate::backend::Lease;
use crate::spec::{AcquireRequest, LockKind};

pub(super) enum Attempt {
    Acquired(Lease),
    /// Held under another family of kinds: refused, never queued.
    Mismatch,
    Busy {
        rx: Option<(oneshot::Receiver<Lease>, Arc<Notify>)>,
        holder_expires: Instant,
        now: Instant,
    },
}

impl Inner {
    pub(super) fn try_acquire(&self, req: &AcquireRequest, may_wait: bool) -> Attempt {
        let now = Instant::now();
        let (hash, mut shard) = self.shard(req.key(), now);
        let wall = SystemTime::now();
        if let Some(entry) = shard.find_mut(hash, req.key()) {
            let (attempt, expiry) = self.try_entry(entry, req, now, wall, may_wait);
            if let Some(at) = expiry {
                shard.expires_at(at);
            }
            return attempt;
        }
        shard.expires_at(now + req.ttl());
        if req.kind() != LockKind::Exclusive {
            let mut entry = Entry {
                key: req.key().clone(),
                owner: req.owner_arc().clone(),
                attempt: req.attempt(),
                fence: 0,
                acquired_at: wall,
                expires: now,
                extra: None,
            };
            let lease = self.new_hold(&mut entry, req, now, wall);
            shard.insert(entry);
            return Attempt::Acquired(lease);
        }
        let fence = self.next_fence();
        shard.insert(Entry {
            key: req.key().clone(),
            owner: req.owner_arc().clone(),
            attempt: req.attempt(),
            fence,
            acquired_at: wall,
            expires: now + req.ttl(),
            extra: Extra::with_metadata(req.metadata().cloned()),
        });
        Attempt::Acquired(Lease::new(fence, wall, wall, req.ttl()))
    }

    /// [`try_acquire`](Inner::try_acquire) of a key that has an entry; also
    /// the earliest expiry it set, for the shard's bound.
    fn try_entry(
        &self,
        entry: &mut Entry,
        req: &AcquireRequest,
        now: Instant,
        wall: SystemTime,
        may_wait: bool,
    ) -> (Attempt, Option<Instant>) {
        // Ran out while waiters are queued: they come first, as after a
        // release; a newcomer does not barge past them. Holds of a group
        // that ran out make room for the queue in the same way.
        let expired = entry.expires <= now;
        let handed = ((expired || entry.group().is_some()) && settle(&self.fence, entry, now))
            .then(|| entry.earliest_expiry());
        let mine = now + req.ttl();
        let either = Some(handed.map_or(mine, |at| at.min(mine)));
        if entry.expires > now {
            if let Some(lease) = entry.group_retry(req, now) {
                return (Attempt::Acquired(lease), either);
            }
            if entry.group().is_some() || !entry.held_by(req) {
                if !req.kind().same_family(entry.kind()) {
                    return (Attempt::Mismatch, handed);
                }
                if !entry.room_for(req.kind()) {
                    return (self.queue_up(entry, req, now, may_wait), handed);
                }
                let lease = self.new_hold(entry, req, now, wall);
                return (Attempt::Acquired(lease), either);
            }
        } else if req.kind() != LockKind::Exclusive {
            // Free: the first hold of a group.
            let lease = self.new_hold(entry, req, now, wall);
            return (Attempt::Acquired(lease), either);
        }
        // Free (expired, nobody queued), or already ours (a retry of this
        // very attempt): take it. Taken anew after expiry, it gets a new
        // fence.
        if entry.expires <= now || !entry.held_by(req) {
            entry.owner = req.owner_arc().clone();
            entry.attempt = req.attempt();
            entry.fence = self.next_fence();
            entry.acquired_at = wall;
            entry.set_metadata(req.metadata().cloned());
        } else {
            // Ours already: this call's now (see `Entry::retaken`).
            entry.extra.get_or_insert_default().retaken = entry.fence;
        }
        entry.expires = mine;
        let lease = Lease::new(entry.fence, entry.acquired_at, wall, req.ttl());
        (Attempt::Acquired(lease), either)
    }

    /// A hold of `req`'s shared or permit kind added to `entry`.
    fn new_hold(
        &self,
        entry: &mut Entry,
        req: &AcquireRequest,
        now: Instant,
        wall: SystemTime,
    ) -> Lease {
        let hold = Holding {
            owner: req.owner_arc().clone(),
            attempt: req.attempt(),
            fence: self.next_fence(),
            acquired_at: wall,
            expires: now + req.ttl(),
            metadata: req.metadata().cloned(),
            retaken: false,
        };
        entry.add_hold(req.kind(), hold, now)
    }

    /// `req` finds the lock held by others: join the queue if it may wait.
    fn queue_up(
        &self,
        entry: &mut Entry,
        req: &AcquireRequest,
        now: Instant,
        may_wait: bool,
    ) -> Attempt {
        let rx = may_wait.then(|| {
            let (tx, rx) = oneshot::channel();
            let nudge = Arc::new(Notify::new());
            let waiters = entry.queue();
            if waiters.len() >= 64 && waiters.len().is_power_of_two() {
                waiters.retain(|w| !w.tx.is_closed());
            }
            waiters.push_back(Waiter {
                kind: req.kind(),
                owner: req.owner_arc().clone(),
                attempt: req.attempt(),
                ttl: req.ttl(),
                metadata: req.metadata().cloned(),
                tx,
                nudge: nudge.clone(),
            });
            (rx, nudge)
        });
        Attempt::Busy {
            rx,
            holder_expires: entry.earliest_expiry(),
            now,
        }
    }
}
