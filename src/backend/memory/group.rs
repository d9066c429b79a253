//! Locks held by several at once: shared holds and permits.
//!
//! An exclusive lock keeps its one holder in the entry itself (the common
//! case stays 128 bytes, no list). A key held shared or under permits keeps
//! its holds in a [`Group`] in the entry's extras instead; the entry's own
//! `expires` is then the latest of their expiries, so everything that asks
//! "is this entry held?" (the sweep, a newcomer) keeps working, and each
//! operation first drops the holds that ran out ([`Entry::prune`]).
//! Invariant: a group has at least one hold; when its last one goes, the
//! group goes and the entry is an expired exclusive entry, handed to the
//! queue or removed as any other.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::queue::{hand_off, nudge_head};
use super::table::Entry;
use crate::backend::{Hold, Holder, Lease, LockStatus};
use crate::metadata::LockMetadata;
use crate::spec::{AcquireRequest, LockKind, owners_match};

/// The holds of a key held shared or under permits.
pub(super) struct Group {
    pub(super) kind: LockKind,
    /// In grant order.
    pub(super) holds: Vec<Holding>,
}

/// One hold of a group.
pub(super) struct Holding {
    pub(super) owner: Arc<str>,
    pub(super) attempt: u64,
    pub(super) fence: u64,
    pub(super) acquired_at: SystemTime,
    pub(super) expires: Instant,
    pub(super) metadata: Option<LockMetadata>,
    /// A retry of its request took it over (see `Entry::retaken`).
    pub(super) retaken: bool,
}

impl Holding {
    fn hold(&self, now: Instant) -> Hold {
        let left = self.expires.saturating_duration_since(now);
        Hold::new(
            self.owner.to_string(),
            self.fence,
            self.acquired_at,
            SystemTime::now() + left,
            left,
        )
        .with_metadata(self.metadata.clone())
    }
}

impl Entry {
    /// The group, if the key is held shared or under permits.
    pub(super) fn group(&self) -> Option<&Group> {
        self.extra.as_ref()?.group.as_ref()
    }

    fn group_mut(&mut self) -> Option<&mut Group> {
        self.extra.as_mut()?.group.as_mut()
    }

    /// How the key is held (exclusive when not held at all).
    pub(super) fn kind(&self) -> LockKind {
        self.group().map_or(LockKind::Exclusive, |g| g.kind)
    }

    /// Drop the holds of a group that ran out by `now`. The last one gone,
    /// the entry is an expired exclusive entry.
    pub(super) fn prune(&mut self, now: Instant) {
        let Some(group) = self.group_mut() else {
            return;
        };
        group.holds.retain(|h| h.expires > now);
        self.regroup(now);
    }

    /// Restore the invariants after holds were removed or changed: the
    /// entry expires with its last hold; no group without holds.
    fn regroup(&mut self, now: Instant) {
        let Some(extra) = self.extra.as_mut() else {
            return;
        };
        let Some(group) = extra.group.as_ref() else {
            return;
        };
        match group.holds.iter().map(|h| h.expires).max() {
            Some(last) => self.expires = last,
            None => {
                extra.group = None;
                self.expires = self.expires.min(now);
            }
        }
    }

    /// When the first hold that blocks others may end: the earliest expiry
    /// of a group's holds, or the exclusive holder's.
    pub(super) fn earliest_expiry(&self) -> Instant {
        self.group()
            .and_then(|g| g.holds.iter().map(|h| h.expires).min())
            .unwrap_or(self.expires)
    }

    /// A group hold that is `req`'s own attempt, refreshed (a retry). Of
    /// its kind only: a request of another kind under the same owner and
    /// attempt (a clone given another kind) is another acquisition, which
    /// taken for this one would believe it held exclusive beside readers.
    pub(super) fn group_retry(&mut self, req: &AcquireRequest, now: Instant) -> Option<Lease> {
        let group = self.group_mut().filter(|g| g.kind == req.kind())?;
        let hold = group
            .holds
            .iter_mut()
            .find(|h| h.attempt == req.attempt() && owners_match(&h.owner, req.owner()))?;
        hold.expires = now + req.ttl();
        hold.retaken = true;
        let lease = Lease::new(hold.fence, hold.acquired_at, SystemTime::now(), req.ttl());
        self.regroup(now);
        Some(lease)
    }

    /// Whether a newcomer of `kind` may join the holds now: there is room
    /// beside them and nobody is queued before it.
    pub(super) fn room_for(&self, kind: LockKind) -> bool {
        self.group()
            .is_some_and(|g| kind.fits_beside(g.kind, g.holds.len()))
            && self.live_waiters() == 0
    }

    /// Add `hold` of `kind` (to a group, made if the entry is free); its
    /// lease.
    pub(super) fn add_hold(&mut self, kind: LockKind, hold: Holding, now: Instant) -> Lease {
        let ttl = hold.expires.saturating_duration_since(now);
        let lease = Lease::new(hold.fence, hold.acquired_at, hold.acquired_at, ttl);
        let extra = self.extra.get_or_insert_default();
        if extra.group.is_none() {
            // The exclusive holder's metadata, if any, left with it.
            extra.metadata = None;
        }
        let group = extra.group.get_or_insert_with(|| Group {
            kind,
            holds: Vec::new(),
        });
        group.holds.push(hold);
        self.regroup(now);
        lease
    }

    /// The index of the live group hold `holder` names. `Err(true)`: the
    /// key is held, by others; `Err(false)`: not held by a group.
    fn find_hold(&self, holder: Holder<'_>, now: Instant) -> Result<usize, bool> {
        let group = self.group().ok_or(false)?;
        let mut live = false;
        for (i, h) in group.holds.iter().enumerate() {
            if h.expires > now {
                live = true;
                if holder.matches(&h.owner, h.fence) {
                    return Ok(i);
                }
            }
        }
        Err(live)
    }

    /// Remove the group hold `holder` names (see [`Entry::find_hold`]).
    pub(super) fn remove_hold(&mut self, holder: Holder<'_>, now: Instant) -> Result<(), bool> {
        let i = self.find_hold(holder, now)?;
        if let Some(group) = self.group_mut() {
            group.holds.remove(i);
        }
        self.regroup(now);
        Ok(())
    }

    /// Set the expiry of the group hold `holder` names; its lease.
    pub(super) fn extend_hold(
        &mut self,
        holder: Holder<'_>,
        ttl: Duration,
        now: Instant,
    ) -> Result<Lease, bool> {
        let i = self.find_hold(holder, now)?;
        let Some(group) = self.group_mut() else {
            return Err(false);
        };
        let hold = &mut group.holds[i];
        let before = hold.expires;
        hold.expires = now + ttl;
        let lease = Lease::new(hold.fence, hold.acquired_at, SystemTime::now(), ttl);
        self.regroup(now);
        if now + ttl < before {
            nudge_head(self);
        }
        Ok(lease)
    }

    /// Take over the group hold `holder` names under `fence` and `attempt`
    /// (a restore), or find it already taken over by this attempt.
    pub(super) fn claim_hold(
        &mut self,
        holder: Holder<'_>,
        attempt: u64,
        next_fence: impl FnOnce() -> u64,
        now: Instant,
    ) -> Result<Lease, bool> {
        let group = self.group().ok_or(false)?;
        let again = group.holds.iter().position(|h| {
            h.expires > now && h.attempt == attempt && owners_match(&h.owner, holder.owner())
        });
        let i = match again {
            Some(i) => i,
            None => {
                if holder.fence().is_none() {
                    return Err(true);
                }
                self.find_hold(holder, now)?
            }
        };
        let Some(group) = self.group_mut() else {
            return Err(false);
        };
        let hold = &mut group.holds[i];
        if again.is_none() {
            hold.fence = next_fence();
            hold.attempt = attempt;
        }
        let left = hold.expires - now;
        Ok(Lease {
            fence: hold.fence,
            acquired_at: hold.acquired_at,
            expires_at: SystemTime::now() + left,
            ttl: left,
        })
    }

    /// Drop every hold (a force release). Whether any was live.
    pub(super) fn clear_holds(&mut self, now: Instant) -> bool {
        let Some(group) = self.group_mut() else {
            return false;
        };
        let live = group.holds.iter().any(|h| h.expires > now);
        group.holds.clear();
        self.regroup(now);
        live
    }

    /// The status of a group entry at `now` (`None`: no live hold).
    pub(super) fn group_status(&self, now: Instant) -> Option<LockStatus> {
        let group = self.group()?;
        let holds = group
            .holds
            .iter()
            .filter(|h| h.expires > now)
            .map(|h| h.hold(now))
            .collect();
        Some(LockStatus::of_holders(group.kind, holds)?.with_waiters(self.live_waiters()))
    }

    /// The live holds of `owner` in a group, as statuses of their own.
    pub(super) fn group_held_by(&self, owner: &str, now: Instant) -> Vec<LockStatus> {
        let Some(group) = self.group() else {
            return Vec::new();
        };
        group
            .holds
            .iter()
            .filter(|h| h.expires > now && owners_match(&h.owner, owner))
            .filter_map(|h| LockStatus::of_holders(group.kind, vec![h.hold(now)]))
            .collect()
    }
}

/// Bring `entry` up to date at `now` and give waiters what is theirs: drop
/// ran-out holds, then grant the head of the queue whatever fits (a free
/// key, room beside shared holds or among permits). Whether the entry is
/// still held; `false`: nobody holds it and nobody took it (remove it).
pub(super) fn settle(fence: &AtomicU64, entry: &mut Entry, now: Instant) -> bool {
    entry.prune(now);
    if entry.group().is_some() {
        hand_off(fence, entry);
        return true;
    }
    entry.expires > now || hand_off(fence, entry)
}
