//! The sharded table: where each lock lives, and every operation that needs
//! no waiting (take, release, extend, force release, status).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use hashbrown::HashTable;
use hashbrown::hash_table::OccupiedEntry;
use tokio::time::Instant;

use super::flight::Flights;
use super::group::{Group, settle};
use super::queue::{Waiter, nudge_head};
use crate::backend::{HeldBy, Holder, Lease, LockStatus};
use crate::error::LockError;
use crate::key::LockKey;
use crate::metadata::LockMetadata;
use crate::spec::owners_match;

/// Shards of the table: operations on different shards never contend.
pub(super) const SHARDS: usize = 64;

pub(super) struct Inner {
    pub(super) shards: Box<[Mutex<Shard>]>,
    pub(super) fence: AtomicU64,
    pub(super) flights: Flights,
}

impl Default for Inner {
    fn default() -> Self {
        Inner {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            fence: AtomicU64::new(0),
            flights: Flights::default(),
        }
    }
}

/// Entries a shard keeps in its `young` table before moving them all to its
/// `old` one: 64 shards of this many stay in cache.
pub(super) const YOUNG: usize = 32;

/// A shard's entries live in two tables. New locks go into the small `young`
/// table, which stays in cache; when it fills up, its entries move to `old`.
/// Most locks are released soon after they are taken, so they are inserted
/// and removed in cache even while a million long-held locks sit in `old`,
/// which then costs a probe of its control bytes, not a write into a cold
/// bucket: the cost of an operation does not grow with the number of held
/// locks.
#[derive(Default)]
pub(super) struct Shard {
    // An entry's key carries its hash: a key is hashed once per operation,
    // for the shard and the slot alike.
    pub(super) young: HashTable<Entry>,
    pub(super) old: HashTable<Entry>,
    pub(super) ops_since_sweep: usize,
    /// No entry expires before this (`None`: none can expire, e.g. empty).
    /// A sweep whose time has not come yet is skipped, so a shard of
    /// long-held locks is not re-read from memory for nothing.
    pub(super) earliest: Option<Instant>,
}

impl Shard {
    pub(super) fn len(&self) -> usize {
        self.young.len() + self.old.len()
    }

    pub(super) fn find(&self, hash: u64, key: &LockKey) -> Option<&Entry> {
        let eq = |e: &Entry| e.key == *key;
        self.young
            .find(hash, eq)
            .or_else(|| self.old.find(hash, eq))
    }

    pub(super) fn find_mut(&mut self, hash: u64, key: &LockKey) -> Option<&mut Entry> {
        self.find_entry(hash, key).map(OccupiedEntry::into_mut)
    }

    pub(super) fn find_entry(
        &mut self,
        hash: u64,
        key: &LockKey,
    ) -> Option<OccupiedEntry<'_, Entry>> {
        let eq = |e: &Entry| e.key == *key;
        match self.young.find_entry(hash, eq) {
            Ok(entry) => Some(entry),
            Err(_) => self.old.find_entry(hash, eq).ok(),
        }
    }

    pub(super) fn insert(&mut self, entry: Entry) {
        if self.young.len() >= YOUNG {
            for e in self.young.drain() {
                self.old
                    .insert_unique(e.key.hash_code(), e, |e| e.key.hash_code());
            }
        }
        self.young
            .insert_unique(entry.key.hash_code(), entry, |e| e.key.hash_code());
    }

    /// An entry now expires at `at`.
    pub(super) fn expires_at(&mut self, at: Instant) {
        self.earliest = Some(self.earliest.map_or(at, |e| e.min(at)));
    }
}

/// A lock. Kept at 128 bytes: moved (inserted, handed between tables) as a
/// few registers' worth of copies rather than a `memcpy` call.
pub(super) struct Entry {
    pub(super) key: LockKey,
    pub(super) owner: Arc<str>,
    // The holder's attempt (see `AcquireRequest::attempt`).
    pub(super) attempt: u64,
    pub(super) fence: u64,
    pub(super) acquired_at: SystemTime,
    pub(super) expires: Instant,
    // Boxed: 8 bytes in every entry, as most locks never see a waiter nor
    // carry metadata; small entries keep a table of a million held keys in
    // cache as far as it can be.
    pub(super) extra: Option<Box<Extra>>,
}

/// What few locks have: waiters queued, metadata.
#[derive(Default)]
pub(super) struct Extra {
    pub(super) waiters: VecDeque<Waiter>,
    pub(super) metadata: Option<LockMetadata>,
    // Held shared or under permits: the holds (see `group.rs`).
    pub(super) group: Option<Group>,
    // The fence of the exclusive hold a retry of its request took over (0:
    // none): see `Entry::retaken`.
    pub(super) retaken: u64,
}

impl Extra {
    /// Only metadata (made for a new entry that has some).
    pub(super) fn with_metadata(metadata: Option<LockMetadata>) -> Option<Box<Extra>> {
        metadata.map(|m| {
            Box::new(Extra {
                waiters: VecDeque::new(),
                metadata: Some(m),
                group: None,
                retaken: 0,
            })
        })
    }
}

impl Entry {
    /// What `status` answers for this entry, held at `now`.
    pub(super) fn status(&self, now: Instant) -> Option<LockStatus> {
        if self.group().is_some() {
            return self.group_status(now);
        }
        if self.expires <= now {
            return None;
        }
        let remaining = self.expires.saturating_duration_since(now);
        LockStatus::new(
            self.owner.to_string(),
            self.fence,
            self.acquired_at,
            SystemTime::now() + remaining,
            remaining,
        )
        .with_waiters(self.live_waiters())
        .with_metadata(self.metadata().cloned())
        .into()
    }

    /// Queued acquirers still waiting.
    pub(super) fn live_waiters(&self) -> usize {
        self.waiters()
            .map_or(0, |w| w.iter().filter(|w| !w.tx.is_closed()).count())
    }

    /// The queue, if anyone ever queued.
    pub(super) fn waiters(&self) -> Option<&VecDeque<Waiter>> {
        self.extra.as_ref().map(|e| &e.waiters)
    }

    /// The queue, made if needed.
    pub(super) fn queue(&mut self) -> &mut VecDeque<Waiter> {
        &mut self.extra.get_or_insert_default().waiters
    }

    /// The holder's metadata.
    pub(super) fn metadata(&self) -> Option<&LockMetadata> {
        self.extra.as_ref().and_then(|e| e.metadata.as_ref())
    }

    /// A new holder's metadata (no allocation when it has none).
    pub(super) fn set_metadata(&mut self, metadata: Option<LockMetadata>) {
        match (metadata, &mut self.extra) {
            (None, None) => {}
            (None, Some(extra)) => extra.metadata = None,
            (Some(m), extra) => extra.get_or_insert_default().metadata = Some(m),
        }
    }
}

/// A group hold not found: `true` if others hold the key.
fn mismatch_or_gone(held: bool) -> LockError {
    if held {
        LockError::OwnershipMismatch
    } else {
        LockError::NotFound
    }
}

pub(super) fn next_fence(fence: &AtomicU64) -> u64 {
    fence.fetch_add(1, Ordering::Relaxed) + 1
}

pub(super) fn lock(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    // A panic while holding a shard cannot leave an entry half-written (each
    // critical section writes whole fields), so poisoning is ignored.
    shard.lock().unwrap_or_else(|e| e.into_inner())
}

impl Inner {
    /// The key's hash and its shard, locked. Bits 32..38 pick the shard: the
    /// table itself uses the low bits (slot) and the top 7 (tag).
    pub(super) fn shard(&self, key: &LockKey, now: Instant) -> (u64, MutexGuard<'_, Shard>) {
        let hash = key.hash_code();
        let mut shard = lock(&self.shards[(hash >> 32) as usize % SHARDS]);
        shard.maybe_sweep(now, &self.fence);
        (hash, shard)
    }

    pub(super) fn next_fence(&self) -> u64 {
        next_fence(&self.fence)
    }

    /// Free the lock of `key` if `check` accepts its entry (given whether it
    /// has expired), or the part of a group's holds that `check` removed:
    /// hand it to waiters or remove the entry. `None` if no entry.
    pub(super) fn free_if<T>(
        &self,
        key: &LockKey,
        check: impl FnOnce(&mut Entry, bool, Instant) -> Result<T, T>,
    ) -> Option<T> {
        let now = Instant::now();
        let (hash, mut shard) = self.shard(key, now);
        let mut occupied = shard.find_entry(hash, key)?;
        let entry = occupied.get_mut();
        let expired = entry.expires <= now;
        let group = entry.group().is_some();
        match check(entry, expired, now) {
            Ok(out) => {
                // An exclusive holder is gone; a group keeps its other holds.
                let held = if group {
                    settle(&self.fence, entry, now)
                } else {
                    self.hand_off(entry)
                };
                if held {
                    let at = occupied.get().earliest_expiry();
                    shard.expires_at(at);
                } else {
                    occupied.remove();
                }
                Some(out)
            }
            Err(out) => Some(out),
        }
    }

    /// Release on behalf of a waiter that was handed the lock but is gone,
    /// unless a retry of its request (same owner and attempt) took that
    /// hold over meanwhile: it is the retry's then, to keep.
    pub(super) fn release_sync(&self, key: &LockKey, owner: &str, fence: u64) {
        let _ = self.release_if(key, Holder::new(owner, fence), |e| !e.retaken(fence));
    }

    pub(super) fn release(&self, key: &LockKey, holder: Holder<'_>) -> Result<(), LockError> {
        self.release_if(key, holder, |_| true)
    }

    /// Release `holder`'s hold if `ours` says the entry is still its to give.
    fn release_if(
        &self,
        key: &LockKey,
        holder: Holder<'_>,
        ours: impl FnOnce(&Entry) -> bool,
    ) -> Result<(), LockError> {
        let result = self.free_if(key, |e, expired, now| {
            if !ours(e) {
                return Err(Err(LockError::OwnershipMismatch));
            }
            if e.group().is_some() {
                return match e.remove_hold(holder, now) {
                    Ok(()) => Ok(Ok(())),
                    Err(true) => Err(Err(LockError::OwnershipMismatch)),
                    // Every hold ran out: free it for waiters right away.
                    Err(false) => Ok(Err(LockError::NotFound)),
                };
            }
            if expired {
                // Not held by anyone: free it for waiters right away.
                Ok(Err(LockError::NotFound))
            } else if !holder.matches(&e.owner, e.fence) {
                Err(Err(LockError::OwnershipMismatch))
            } else {
                Ok(Ok(()))
            }
        });
        result.unwrap_or(Err(LockError::NotFound))
    }

    pub(super) fn extend(
        &self,
        key: &LockKey,
        holder: Holder<'_>,
        ttl: Duration,
    ) -> Result<Lease, LockError> {
        crate::spec::validate_ttl(ttl)?;
        let now = Instant::now();
        let (hash, mut shard) = self.shard(key, now);
        let entry = shard.find_mut(hash, key).ok_or(LockError::NotFound)?;
        if entry.group().is_some() {
            let lease = entry
                .extend_hold(holder, ttl, now)
                .map_err(mismatch_or_gone)?;
            shard.expires_at(now + ttl);
            return Ok(lease);
        }
        if entry.expires <= now {
            return Err(LockError::NotFound);
        }
        if !holder.matches(&entry.owner, entry.fence) {
            return Err(LockError::OwnershipMismatch);
        }
        let before = entry.expires;
        entry.expires = now + ttl;
        if entry.expires < before {
            nudge_head(entry);
        }
        let lease = Lease::new(entry.fence, entry.acquired_at, SystemTime::now(), ttl);
        shard.expires_at(now + ttl);
        Ok(lease)
    }

    /// Take over `holder`'s acquisition under a fresh fence (see
    /// [`LockBackend::claim`](crate::backend::LockBackend::claim)).
    pub(super) fn claim(
        &self,
        key: &LockKey,
        holder: Holder<'_>,
        attempt: u64,
    ) -> Result<Lease, LockError> {
        let now = Instant::now();
        let (hash, mut shard) = self.shard(key, now);
        let entry = shard.find_mut(hash, key).ok_or(LockError::NotFound)?;
        if entry.group().is_some() {
            return entry
                .claim_hold(holder, attempt, || self.next_fence(), now)
                .map_err(mismatch_or_gone);
        }
        if entry.expires <= now {
            return Err(LockError::NotFound);
        }
        let again = entry.attempt == attempt && owners_match(&entry.owner, holder.owner());
        if !again {
            if holder.fence().is_none() || !holder.matches(&entry.owner, entry.fence) {
                return Err(LockError::OwnershipMismatch);
            }
            entry.fence = self.next_fence();
            entry.attempt = attempt;
        }
        let left = entry.expires - now;
        let wall = SystemTime::now();
        Ok(Lease {
            fence: entry.fence,
            acquired_at: entry.acquired_at,
            expires_at: wall + left,
            ttl: left,
        })
    }

    pub(super) fn force_release(&self, key: &LockKey) -> bool {
        self.free_if(key, |e, expired, now| {
            Ok(if e.group().is_some() {
                e.clear_holds(now)
            } else {
                !expired
            })
        })
        .unwrap_or(false)
    }

    pub(super) fn status(&self, key: &LockKey) -> Option<LockStatus> {
        let now = Instant::now();
        let (hash, shard) = self.shard(key, now);
        shard.find(hash, key)?.status(now)
    }

    /// The locks `owner` holds, at most `limit`, sorted by key: a walk over
    /// every shard (no index, so acquire and release pay nothing for this),
    /// one shard locked at a time.
    pub(super) fn held_by(&self, owner: &str, limit: usize) -> Vec<HeldBy> {
        let mut found = Vec::new();
        for shard in self.shards.iter() {
            let now = Instant::now();
            let shard = lock(shard);
            for entry in shard.young.iter().chain(shard.old.iter()) {
                if entry.group().is_some() {
                    let holds = entry.group_held_by(owner, now).into_iter();
                    found.extend(holds.map(|s| HeldBy::new(entry.key.clone(), s)));
                } else if entry.expires > now
                    && owners_match(&entry.owner, owner)
                    && let Some(status) = entry.status(now)
                {
                    found.push(HeldBy::new(entry.key.clone(), status));
                }
            }
        }
        found.sort_by(|a, b| a.key.cmp(&b.key));
        found.truncate(limit);
        found
    }
}

#[cfg(test)]
mod tests {
    use crate::backend::Holder;
    use std::time::Duration;

    use super::super::MemoryBackend;
    use super::super::testing::req;
    use super::{SHARDS, YOUNG, lock};
    use crate::backend::{LockBackend, LockError, LockKey};

    /// Enough locks that every shard moves its young entries to its old
    /// table several times: every operation finds them in either table, and
    /// a key is never stored twice.
    #[tokio::test(start_paused = true)]
    async fn locks_moved_to_the_old_table_work_as_any() {
        let b = MemoryBackend::new();
        let n = YOUNG * SHARDS * 3;
        let key = |i: usize| LockKey::global(format!("k{i}")).unwrap();
        for i in 0..n {
            b.acquire(&req(&format!("k{i}"), "a", 1_000, 0))
                .await
                .unwrap();
        }
        assert_eq!(b.len(), n);
        assert!(b.inner.shards.iter().all(|s| !lock(s).old.is_empty()));
        for i in 0..n {
            assert_eq!(b.status(&key(i)).await.unwrap().unwrap().owner, "a");
            let busy = b.acquire(&req(&format!("k{i}"), "b", 1_000, 0)).await;
            assert!(matches!(busy, Err(LockError::AcquisitionFailed { .. })));
        }
        // Expired: another owner re-takes each in place, whichever table.
        tokio::time::advance(Duration::from_millis(1_001)).await;
        for i in 0..n {
            b.acquire(&req(&format!("k{i}"), "b", 60_000, 0))
                .await
                .unwrap();
        }
        assert_eq!(b.len(), n, "no key stored twice");
        for i in 0..n {
            b.extend(&key(i), Holder::owner_only("b"), Duration::from_secs(5))
                .await
                .unwrap();
            assert_eq!(
                b.release(&key(i), Holder::owner_only("a")).await,
                Err(LockError::OwnershipMismatch)
            );
            b.release(&key(i), Holder::owner_only("b")).await.unwrap();
        }
        assert_eq!(b.len(), 0);
    }
}
