//! [`MemoryBackend`]: locks in this process's memory.
//!
//! The embedded default, for examples, tests and single-instance apps. Locks
//! live in a sharded hash map, so acquire and release cost the same whatever
//! the number of held keys. Each shard inserts new locks into a small table
//! that stays in cache and moves them to a large one when it fills, so a
//! short-lived lock is taken and released in cache even beside a million
//! long-held ones.
//!
//! - **Fair, direct hand-off**: a release hands the lock straight to the
//!   longest-waiting acquirer (FIFO) and wakes it; the lock is never idle
//!   between holders, and the releasing task cannot barge back in.
//! - **Expiry without cleanup calls**: an expired lock is free for the next
//!   acquirer; waiters sleep until the holder's expiry (or their own max
//!   wait, whichever is first), not in a poll loop.
//! - **Bounded memory**: expired entries are swept from a shard once it has
//!   seen four times as many operations as it holds entries, so sweeping is
//!   O(1) amortised and expired entries cannot pile up. A shard knows its
//!   earliest expiry and skips the sweep while nothing can have expired, so
//!   long-held locks are not re-read for nothing.
//! - **Fencing tokens** come from one counter for the whole backend, so they
//!   increase per key across release and expiry without keeping per-key
//!   state forever.
//! - Uses tokio's clock, so tests can pause and advance time.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use hashbrown::HashTable;
use hashbrown::hash_table::OccupiedEntry;
use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;

use super::{BoxFuture, Lease, LockBackend, LockStatus};
use crate::error::LockError;
use crate::key::LockKey;
use crate::spec::AcquireRequest;

const SHARDS: usize = 64;
const MIN_SWEEP_INTERVAL: usize = 256;

/// Locks held in this process's memory. Cheap to clone (clones share state).
///
/// ```
/// use std::time::Duration;
/// use tower_lock::{AcquireRequest, LockBackend, LockKey, MemoryBackend};
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let backend = MemoryBackend::new();
/// let key = LockKey::global("report").unwrap();
/// let req = AcquireRequest::new(key.clone(), "me", Duration::from_secs(5), Duration::ZERO).unwrap();
/// let lease = backend.acquire(&req).await.unwrap();
/// assert!(lease.fence > 0);
/// backend.release(&key, "me").await.unwrap();
/// # });
/// ```
#[derive(Clone, Default)]
pub struct MemoryBackend {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for MemoryBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryBackend").finish_non_exhaustive()
    }
}

struct Inner {
    shards: Box<[Mutex<Shard>]>,
    fence: AtomicU64,
}

impl Default for Inner {
    fn default() -> Self {
        Inner {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            fence: AtomicU64::new(0),
        }
    }
}

/// Entries a shard keeps in its `young` table before moving them all to its
/// `old` one: 64 shards of this many stay in cache.
const YOUNG: usize = 32;

/// A shard's entries live in two tables. New locks go into the small `young`
/// table, which stays in cache; when it fills up, its entries move to `old`.
/// Most locks are released soon after they are taken, so they are inserted
/// and removed in cache even while a million long-held locks sit in `old`,
/// which then costs a probe of its control bytes, not a write into a cold
/// bucket: the cost of an operation does not grow with the number of held
/// locks.
#[derive(Default)]
struct Shard {
    // Entries carry their hash: a key is hashed once per operation, for the
    // shard and the slot alike.
    young: HashTable<Entry>,
    old: HashTable<Entry>,
    ops_since_sweep: usize,
    /// No entry expires before this (`None`: none can expire, e.g. empty).
    /// A sweep whose time has not come yet is skipped, so a shard of
    /// long-held locks is not re-read from memory for nothing.
    earliest: Option<Instant>,
}

impl Shard {
    fn len(&self) -> usize {
        self.young.len() + self.old.len()
    }

    fn find(&self, hash: u64, key: &LockKey) -> Option<&Entry> {
        let eq = |e: &Entry| e.key == *key;
        self.young
            .find(hash, eq)
            .or_else(|| self.old.find(hash, eq))
    }

    fn find_mut(&mut self, hash: u64, key: &LockKey) -> Option<&mut Entry> {
        self.find_entry(hash, key).map(OccupiedEntry::into_mut)
    }

    fn find_entry(&mut self, hash: u64, key: &LockKey) -> Option<OccupiedEntry<'_, Entry>> {
        let eq = |e: &Entry| e.key == *key;
        match self.young.find_entry(hash, eq) {
            Ok(entry) => Some(entry),
            Err(_) => self.old.find_entry(hash, eq).ok(),
        }
    }

    fn insert(&mut self, entry: Entry) {
        if self.young.len() >= YOUNG {
            for e in self.young.drain() {
                self.old.insert_unique(e.hash, e, |e| e.hash);
            }
        }
        self.young.insert_unique(entry.hash, entry, |e| e.hash);
    }

    /// An entry now expires at `at`.
    fn expires_at(&mut self, at: Instant) {
        self.earliest = Some(self.earliest.map_or(at, |e| e.min(at)));
    }

    /// Remove expired entries, if any can have expired.
    fn sweep(&mut self, now: Instant, fence: &AtomicU64) {
        if self.earliest.is_none_or(|e| e > now) {
            return;
        }
        let mut earliest = None::<Instant>;
        let mut live = |e: &mut Entry| {
            // An expired lock with waiters queued goes to the first of them.
            let live = e.expires > now || hand_off(fence, e);
            if live {
                earliest = Some(earliest.map_or(e.expires, |t| t.min(e.expires)));
            }
            live
        };
        // A removed entry had no live waiters.
        self.young.retain(&mut live);
        self.old.retain(&mut live);
        self.earliest = earliest;
    }
}

struct Entry {
    hash: u64,
    key: LockKey,
    owner: Arc<str>,
    // The holder's attempt (see `AcquireRequest::attempt`).
    attempt: u64,
    fence: u64,
    acquired_at: SystemTime,
    expires: Instant,
    // Boxed: 8 bytes in every entry instead of 32, as most locks never see a
    // waiter; small entries keep a table of a million held keys in cache as
    // far as it can be.
    #[allow(clippy::box_collection)]
    waiters: Option<Box<VecDeque<Waiter>>>,
}

struct Waiter {
    owner: Arc<str>,
    attempt: u64,
    ttl: Duration,
    tx: oneshot::Sender<Lease>,
    // Tells the waiter to look again when the lock's expiry moved earlier
    // than the one it sleeps until (a hand-off to a shorter TTL, an extend).
    nudge: Arc<Notify>,
}

impl Entry {
    /// Whether `req` is the holder's own attempt (a retry): same owner
    /// token and same attempt. Another request naming the same owner is
    /// not the holder.
    fn held_by(&self, req: &AcquireRequest) -> bool {
        self.attempt == req.attempt() && *self.owner == *req.owner()
    }

    /// Queued acquirers still waiting.
    fn live_waiters(&self) -> usize {
        self.waiters
            .as_ref()
            .map_or(0, |w| w.iter().filter(|w| !w.tx.is_closed()).count())
    }
}

fn next_fence(fence: &AtomicU64) -> u64 {
    fence.fetch_add(1, Ordering::Relaxed) + 1
}

/// Give the lock in `entry` to its first live waiter, with a fresh fence.
/// `false` if there is none: the caller removes the entry. The waiter now
/// at the head of the queue is nudged to learn the new expiry, which may
/// come before the one it sleeps until.
fn hand_off(fence: &AtomicU64, entry: &mut Entry) -> bool {
    let Some(waiters) = entry.waiters.as_mut() else {
        return false;
    };
    while let Some(w) = waiters.pop_front() {
        let wall = SystemTime::now();
        let fence = next_fence(fence);
        let lease = Lease::new(fence, wall, wall, w.ttl);
        if w.tx.send(lease).is_ok() {
            entry.owner = w.owner;
            entry.attempt = w.attempt;
            entry.fence = fence;
            entry.acquired_at = wall;
            entry.expires = Instant::now() + w.ttl;
            nudge_head(entry);
            return true;
        }
    }
    false
}

/// The lock of `entry` now expires earlier than its waiters may think: the
/// first live one looks again (and, when it is handed the lock, nudges the
/// next in turn), so the queue follows the new expiry in order.
fn nudge_head(entry: &Entry) {
    let mut live = entry.waiters.iter().flat_map(|w| w.iter());
    if let Some(w) = live.find(|w| !w.tx.is_closed()) {
        w.nudge.notify_one();
    }
}

enum Recheck {
    /// Held (or just handed over) until then.
    HeldUntil(Instant),
    /// No entry any more.
    Gone,
}

enum Attempt {
    Acquired(Lease),
    Busy {
        rx: Option<(oneshot::Receiver<Lease>, Arc<Notify>)>,
        holder_expires: Instant,
        now: Instant,
    },
}

impl MemoryBackend {
    /// An empty backend.
    pub fn new() -> Self {
        Self::default()
    }

    /// The number of entries currently stored (held locks plus expired ones
    /// not yet swept). For tests and metrics.
    pub fn len(&self) -> usize {
        self.inner.shards.iter().map(|s| lock(s).len()).sum()
    }

    /// Whether no entry is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn lock(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    // A panic while holding a shard cannot leave an entry half-written (each
    // critical section writes whole fields), so poisoning is ignored.
    shard.lock().unwrap_or_else(|e| e.into_inner())
}

impl Inner {
    /// The key's hash and its shard, locked. Bits 32..38 pick the shard: the
    /// table itself uses the low bits (slot) and the top 7 (tag).
    fn shard(&self, key: &LockKey, now: Instant) -> (u64, MutexGuard<'_, Shard>) {
        let hash = key.hash_code();
        let mut shard = lock(&self.shards[(hash >> 32) as usize % SHARDS]);
        shard.ops_since_sweep += 1;
        if shard.ops_since_sweep >= (4 * shard.len()).max(MIN_SWEEP_INTERVAL) {
            shard.ops_since_sweep = 0;
            shard.sweep(now, &self.fence);
        }
        (hash, shard)
    }

    fn next_fence(&self) -> u64 {
        next_fence(&self.fence)
    }

    fn try_acquire(&self, req: &AcquireRequest, may_wait: bool) -> Attempt {
        let now = Instant::now();
        let (hash, mut shard) = self.shard(req.key(), now);
        let wall = SystemTime::now();
        if let Some(entry) = shard.find_mut(hash, req.key()) {
            // Expired while waiters are queued: they come first, as after a
            // release; a newcomer does not barge past them.
            let expired = entry.expires <= now;
            let handed = (expired && self.hand_off(entry)).then_some(entry.expires);
            if entry.expires > now && !entry.held_by(req) {
                let rx = may_wait.then(|| {
                    let (tx, rx) = oneshot::channel();
                    let nudge = Arc::new(Notify::new());
                    let waiters = entry.waiters.get_or_insert_default();
                    if waiters.len() >= 64 && waiters.len().is_power_of_two() {
                        waiters.retain(|w| !w.tx.is_closed());
                    }
                    waiters.push_back(Waiter {
                        owner: req.owner_arc().clone(),
                        attempt: req.attempt(),
                        ttl: req.ttl(),
                        tx,
                        nudge: nudge.clone(),
                    });
                    (rx, nudge)
                });
                let busy = Attempt::Busy {
                    rx,
                    holder_expires: entry.expires,
                    now,
                };
                if let Some(at) = handed {
                    shard.expires_at(at);
                }
                return busy;
            }
            // Free (expired, nobody queued), or already ours (a retry of
            // this very attempt): take it. Taken anew after expiry, it gets a
            // new fence.
            if expired || !entry.held_by(req) {
                entry.owner = req.owner_arc().clone();
                entry.attempt = req.attempt();
                entry.fence = self.next_fence();
                entry.acquired_at = wall;
            }
            entry.expires = now + req.ttl();
            let lease = Lease::new(entry.fence, entry.acquired_at, wall, req.ttl());
            shard.expires_at(now + req.ttl());
            return Attempt::Acquired(lease);
        }
        let fence = self.next_fence();
        shard.expires_at(now + req.ttl());
        shard.insert(Entry {
            hash,
            key: req.key().clone(),
            owner: req.owner_arc().clone(),
            attempt: req.attempt(),
            fence,
            acquired_at: wall,
            expires: now + req.ttl(),
            waiters: None,
        });
        Attempt::Acquired(Lease::new(fence, wall, wall, req.ttl()))
    }

    /// Give the lock in `entry` to its first live waiter (see [`hand_off`]).
    fn hand_off(&self, entry: &mut Entry) -> bool {
        hand_off(&self.fence, entry)
    }

    /// Nudge the first live waiter of `key` (see [`nudge_head`]).
    fn nudge(&self, key: &LockKey) {
        let (hash, shard) = self.shard(key, Instant::now());
        if let Some(entry) = shard.find(hash, key) {
            nudge_head(entry);
        }
    }

    /// For a queued waiter whose holder's expiry has passed: hand an expired
    /// lock to the head of the queue (every waiter keeps its place), or
    /// learn the holder's new expiry (extended, or handed to another).
    fn recheck(&self, key: &LockKey) -> Recheck {
        let now = Instant::now();
        let (hash, mut shard) = self.shard(key, now);
        let Some(mut occupied) = shard.find_entry(hash, key) else {
            return Recheck::Gone;
        };
        if occupied.get().expires > now {
            return Recheck::HeldUntil(occupied.get().expires);
        }
        if self.hand_off(occupied.get_mut()) {
            let at = occupied.get().expires;
            shard.expires_at(at);
            Recheck::HeldUntil(at)
        } else {
            occupied.remove();
            Recheck::Gone
        }
    }

    /// Free the lock of `key` if `check` accepts its entry (given whether it
    /// has expired): hand it to a waiter or remove it. `None` if no entry.
    fn free_if<T>(
        &self,
        key: &LockKey,
        check: impl FnOnce(&Entry, bool) -> Result<T, T>,
    ) -> Option<T> {
        let now = Instant::now();
        let (hash, mut shard) = self.shard(key, now);
        let mut occupied = shard.find_entry(hash, key)?;
        let expired = occupied.get().expires <= now;
        match check(occupied.get(), expired) {
            Ok(out) => {
                if self.hand_off(occupied.get_mut()) {
                    let at = occupied.get().expires;
                    shard.expires_at(at);
                } else {
                    occupied.remove();
                }
                Some(out)
            }
            Err(out) => Some(out),
        }
    }

    /// Release on behalf of a waiter that was handed the lock but is gone.
    fn release_sync(&self, key: &LockKey, owner: &str, fence: u64) {
        self.free_if(key, |e, _| {
            if *e.owner == *owner && e.fence == fence {
                Ok(())
            } else {
                Err(())
            }
        });
    }

    fn release(&self, key: &LockKey, owner: &str) -> Result<(), LockError> {
        let result = self.free_if(key, |e, expired| {
            if expired {
                // Not held by anyone: free it for waiters right away.
                Ok(Err(LockError::NotFound))
            } else if *e.owner != *owner {
                Err(Err(LockError::OwnershipMismatch))
            } else {
                Ok(Ok(()))
            }
        });
        result.unwrap_or(Err(LockError::NotFound))
    }

    fn extend(&self, key: &LockKey, owner: &str, ttl: Duration) -> Result<Lease, LockError> {
        crate::spec::validate_ttl(ttl)?;
        let now = Instant::now();
        let (hash, mut shard) = self.shard(key, now);
        let entry = shard.find_mut(hash, key).ok_or(LockError::NotFound)?;
        if entry.expires <= now {
            return Err(LockError::NotFound);
        }
        if *entry.owner != *owner {
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

    fn force_release(&self, key: &LockKey) -> bool {
        self.free_if(key, |_, expired| Ok(!expired))
            .unwrap_or(false)
    }

    fn status(&self, key: &LockKey) -> Option<LockStatus> {
        let now = Instant::now();
        let (hash, shard) = self.shard(key, now);
        let entry = shard.find(hash, key).filter(|e| e.expires > now)?;
        let remaining = entry.expires - now;
        Some(
            LockStatus::new(
                entry.owner.to_string(),
                entry.fence,
                entry.acquired_at,
                SystemTime::now() + remaining,
                remaining,
            )
            .with_waiters(entry.live_waiters()),
        )
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
    fn acquire_now(&self, req: &AcquireRequest) -> Option<Result<Lease, LockError>> {
        match self.try_acquire(req, false) {
            Attempt::Acquired(lease) => Some(Ok(lease)),
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

async fn acquire(inner: &Inner, req: &AcquireRequest) -> Result<Lease, LockError> {
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
                    match inner.recheck(req.key()) {
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
                        match inner.recheck(req.key()) {
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

impl LockBackend for MemoryBackend {
    fn acquire<'a>(&'a self, req: &'a AcquireRequest) -> BoxFuture<'a, Result<Lease, LockError>> {
        Box::pin(acquire(&self.inner, req))
    }

    fn release<'a>(
        &'a self,
        key: &'a LockKey,
        owner: &'a str,
    ) -> BoxFuture<'a, Result<(), LockError>> {
        Box::pin(std::future::ready(self.inner.release(key, owner)))
    }

    fn extend<'a>(
        &'a self,
        key: &'a LockKey,
        owner: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Lease, LockError>> {
        Box::pin(std::future::ready(self.inner.extend(key, owner, ttl)))
    }

    fn force_release<'a>(&'a self, key: &'a LockKey) -> BoxFuture<'a, Result<bool, LockError>> {
        Box::pin(std::future::ready(Ok(self.inner.force_release(key))))
    }

    /// Always an answer, unless the lock is busy and `req` waits.
    fn try_acquire_now(&self, req: &AcquireRequest) -> Option<Result<Lease, LockError>> {
        self.inner.acquire_now(req)
    }

    /// Always an answer.
    fn try_release_now(&self, key: &LockKey, owner: &str) -> Option<Result<(), LockError>> {
        Some(self.inner.release(key, owner))
    }

    fn status<'a>(
        &'a self,
        key: &'a LockKey,
    ) -> BoxFuture<'a, Result<Option<LockStatus>, LockError>> {
        Box::pin(std::future::ready(Ok(self.inner.status(key))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(key: &str, owner: &str, ttl_ms: u64, wait_ms: u64) -> AcquireRequest {
        AcquireRequest::new(
            LockKey::global(key).unwrap(),
            owner,
            Duration::from_millis(ttl_ms),
            Duration::from_millis(wait_ms),
        )
        .unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn expired_entries_are_swept() {
        let b = MemoryBackend::new();
        for i in 0..2000 {
            b.acquire(&req(&format!("k{i}"), "o", 10, 0)).await.unwrap();
        }
        assert_eq!(b.len(), 2000);
        tokio::time::advance(Duration::from_millis(20)).await;
        churn(&b, "x").await;
        assert_eq!(b.len(), 0, "expired entries must not accumulate");
    }

    /// Drive enough operations through every shard to trigger its sweep.
    async fn churn(b: &MemoryBackend, tag: &str) {
        for i in 0..(MIN_SWEEP_INTERVAL * SHARDS * 4) {
            let r = req(&format!("{tag}{i}"), "o", 10_000, 0);
            b.acquire(&r).await.unwrap();
            b.release(r.key(), "o").await.unwrap();
        }
    }

    /// Sweeps are skipped while nothing can have expired, so every place
    /// that shortens an expiry must lower the shard's bound: a shortened
    /// lock (extend, hand-off to a short-TTL waiter) is still swept.
    #[tokio::test(start_paused = true)]
    async fn shortened_expiries_are_still_swept() {
        let b = MemoryBackend::new();
        for i in 0..100 {
            b.acquire(&req(&format!("k{i}"), "o", 60_000, 0))
                .await
                .unwrap();
        }
        // Nothing can expire for a minute: no shard would sweep now.
        let now = Instant::now();
        assert!(
            b.inner
                .shards
                .iter()
                .all(|s| lock(s).earliest.is_none_or(|e| e > now))
        );

        // Extend shortens k0 to 10 ms.
        b.extend(
            &LockKey::global("k0").unwrap(),
            "o",
            Duration::from_millis(10),
        )
        .await
        .unwrap();
        // k1 is handed to a waiter whose TTL is 10 ms.
        let waiter = tokio::spawn({
            let b = b.clone();
            async move { b.acquire(&req("k1", "w", 10, 5_000)).await }
        });
        tokio::task::yield_now().await;
        b.release(&LockKey::global("k1").unwrap(), "o")
            .await
            .unwrap();
        waiter.await.unwrap().unwrap();

        tokio::time::advance(Duration::from_millis(20)).await;
        churn(&b, "x").await;
        assert_eq!(b.len(), 98, "k0 and k1 expired and were swept");
    }

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
            b.extend(&key(i), "b", Duration::from_secs(5))
                .await
                .unwrap();
            assert_eq!(
                b.release(&key(i), "a").await,
                Err(LockError::OwnershipMismatch)
            );
            b.release(&key(i), "b").await.unwrap();
        }
        assert_eq!(b.len(), 0);
    }

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
        b.release(first.key(), "a").await.unwrap();
        // b was handed the lock but its future is dropped before it looks.
        drop(w2);
        let lease = w3.await.unwrap().unwrap();
        assert!(lease.fence > 1);
        assert_eq!(b.status(third.key()).await.unwrap().unwrap().owner, "c");
    }

    /// Waiters queued on `key` (live or not).
    fn queued(b: &MemoryBackend, key: &LockKey) -> usize {
        let now = Instant::now();
        let (hash, shard) = b.inner.shard(key, now);
        shard
            .find(hash, key)
            .and_then(|e| e.waiters.as_ref())
            .map_or(0, |w| w.len())
    }

    async fn until_queued(b: &MemoryBackend, key: &LockKey, n: usize) {
        while queued(b, key) < n {
            tokio::task::yield_now().await;
        }
    }

    /// A backend where "a" holds "k" for 60 s.
    async fn held_for_a_minute() -> (MemoryBackend, AcquireRequest) {
        let b = MemoryBackend::new();
        let a = req("k", "a", 60_000, 0);
        b.acquire(&a).await.unwrap();
        (b, a)
    }

    /// Acquire `r` in a task; it answers when it got the lock.
    fn spawn_acquire(
        b: &MemoryBackend,
        r: AcquireRequest,
    ) -> tokio::task::JoinHandle<Result<Instant, LockError>> {
        let b = b.clone();
        tokio::spawn(async move { b.acquire(&r).await.map(|_| Instant::now()) })
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
        b.release(a.key(), "a").await.unwrap();
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
        b.extend(a.key(), "a", Duration::from_secs(20))
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

    /// A sweep that meets an expired lock with waiters queued hands it to
    /// the first of them instead of dropping the queue.
    #[tokio::test(start_paused = true)]
    async fn a_sweep_hands_expired_locks_to_their_queue() {
        let b = MemoryBackend::new();
        let a = req("k", "a", 1_000, 0);
        b.acquire(&a).await.unwrap();
        // Queued, then not polled again: its own timer cannot act first.
        let w = req("k", "w", 5_000, 60_000);
        let mut waiter = Box::pin(b.acquire(&w));
        assert!(futures_poll(&mut waiter).is_none());
        tokio::time::advance(Duration::from_millis(1_500)).await;
        {
            let shard = &b.inner.shards[(a.key().hash_code() >> 32) as usize % SHARDS];
            lock(shard).sweep(Instant::now(), &b.inner.fence);
        }
        assert_eq!(b.status(a.key()).await.unwrap().unwrap().owner, "w");
        assert!(futures_poll(&mut waiter).unwrap().is_ok());
    }

    /// A holder whose lock expired while waiters are queued: the first of
    /// them gets it, not a newcomer, and the others keep their places.
    #[tokio::test(start_paused = true)]
    async fn expired_holder_passes_to_the_queue_in_order() {
        let b = MemoryBackend::new();
        let a = req("k", "a", 2_000, 0);
        b.acquire(&a).await.unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        let spawn = |owner: &'static str| {
            let b = b.clone();
            let order = order.clone();
            tokio::spawn(async move {
                let r = req("k", owner, 1_000, 30_000);
                let lease = b.acquire(&r).await.unwrap();
                order.lock().unwrap().push(owner);
                b.release(r.key(), owner).await.unwrap();
                lease
            })
        };
        // Queued in this order (a current-thread runtime runs them so).
        let waiters = [spawn("b"), spawn("c"), spawn("d")];
        until_queued(&b, a.key(), 3).await;
        // a expires at 2 s without releasing; a newcomer comes right then.
        tokio::time::sleep_until(Instant::now() + Duration::from_secs(2)).await;
        let newcomer = b.acquire(&req("k", "z", 1_000, 0)).await;
        assert!(
            newcomer.is_err(),
            "a newcomer must not barge past the queue"
        );
        for w in waiters {
            w.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), ["b", "c", "d"]);
    }

    fn futures_poll<F: std::future::Future + Unpin>(f: &mut F) -> Option<F::Output> {
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        match std::pin::Pin::new(f).poll(&mut cx) {
            std::task::Poll::Ready(v) => Some(v),
            std::task::Poll::Pending => None,
        }
    }
}
