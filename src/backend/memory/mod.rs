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

mod flight;
mod group;
mod queue;
mod retry;
mod sweep;
mod table;
mod take;

use std::sync::Arc;
use std::time::Duration;

use self::queue::acquire;
use self::table::{Inner, lock};
use super::{
    BoxFuture, FlightPublish, FlightResult, FlightStart, HeldBy, Holder, Lease, LockBackend,
    LockStatus,
};
use crate::error::LockError;
use crate::key::LockKey;
use crate::spec::AcquireRequest;

/// Locks held in this process's memory. Cheap to clone (clones share state).
///
/// ```
/// use std::time::Duration;
/// use tower_lock::MemoryBackend;
/// use tower_lock::LockKey;
/// use tower_lock::backend::{AcquireRequest, Holder, LockBackend};
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let backend = MemoryBackend::new();
/// let key = LockKey::global("report").unwrap();
/// let req = AcquireRequest::new(key.clone(), "me", Duration::from_secs(5), Duration::ZERO).unwrap();
/// let lease = backend.acquire(&req).await.unwrap();
/// assert!(lease.fence > 0);
/// // Release names the acquisition: owner token and fence.
/// backend.release(&key, Holder::new("me", lease.fence)).await.unwrap();
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

impl LockBackend for MemoryBackend {
    fn name(&self) -> &'static str {
        "memory"
    }

    /// Every kind.
    fn supports(&self, _kind: crate::spec::LockKind) -> bool {
        true
    }

    fn acquire<'a>(&'a self, req: &'a AcquireRequest) -> BoxFuture<'a, Result<Lease, LockError>> {
        Box::pin(acquire(&self.inner, req))
    }

    fn release<'a>(
        &'a self,
        key: &'a LockKey,
        holder: Holder<'a>,
    ) -> BoxFuture<'a, Result<(), LockError>> {
        Box::pin(std::future::ready(self.inner.release(key, holder)))
    }

    fn extend<'a>(
        &'a self,
        key: &'a LockKey,
        holder: Holder<'a>,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Lease, LockError>> {
        Box::pin(std::future::ready(self.inner.extend(key, holder, ttl)))
    }

    fn claim<'a>(
        &'a self,
        key: &'a LockKey,
        holder: Holder<'a>,
        attempt: u64,
    ) -> BoxFuture<'a, Result<Lease, LockError>> {
        Box::pin(std::future::ready(self.inner.claim(key, holder, attempt)))
    }

    fn force_release<'a>(&'a self, key: &'a LockKey) -> BoxFuture<'a, Result<bool, LockError>> {
        Box::pin(std::future::ready(Ok(self.inner.force_release(key))))
    }

    /// Always an answer, unless the lock is busy and `req` waits.
    fn try_acquire_now(&self, req: &AcquireRequest) -> Option<Result<Lease, LockError>> {
        self.inner.acquire_now(req)
    }

    /// Always an answer.
    fn try_release_now(&self, key: &LockKey, holder: Holder<'_>) -> Option<Result<(), LockError>> {
        Some(self.inner.release(key, holder))
    }

    fn status<'a>(
        &'a self,
        key: &'a LockKey,
    ) -> BoxFuture<'a, Result<Option<LockStatus>, LockError>> {
        Box::pin(std::future::ready(Ok(self.inner.status(key))))
    }

    /// A walk over every held lock (no index: acquire and release pay
    /// nothing for lookups by owner), in O(locks held).
    fn held_by<'a>(
        &'a self,
        owner: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<HeldBy>, LockError>> {
        Box::pin(std::future::ready(Ok(self.inner.held_by(owner, limit))))
    }

    fn flight_begin<'a>(
        &'a self,
        req: &'a AcquireRequest,
    ) -> BoxFuture<'a, Result<FlightStart, LockError>> {
        Box::pin(std::future::ready(self.inner.flight_begin(req)))
    }

    fn flight_result<'a>(
        &'a self,
        key: &'a LockKey,
    ) -> BoxFuture<'a, Result<Option<FlightResult>, LockError>> {
        Box::pin(std::future::ready(Ok(self.inner.flight_result(key))))
    }

    fn flight_publish<'a>(
        &'a self,
        key: &'a LockKey,
        owner: &'a str,
        publish: &'a FlightPublish,
    ) -> BoxFuture<'a, Result<(), LockError>> {
        Box::pin(std::future::ready(
            self.inner.flight_publish(key, owner, publish),
        ))
    }
}

/// Helpers for the unit tests of this backend's parts.
#[cfg(test)]
pub(super) mod testing {
    use crate::backend::Holder;
    use std::time::Duration;

    use tokio::time::Instant;

    use super::MemoryBackend;
    use super::sweep::MIN_SWEEP_INTERVAL;
    use super::table::SHARDS;
    use crate::backend::{AcquireRequest, LockBackend, LockError, LockKey};

    pub(super) fn req(key: &str, owner: &str, ttl_ms: u64, wait_ms: u64) -> AcquireRequest {
        AcquireRequest::new(
            LockKey::global(key).unwrap(),
            owner,
            Duration::from_millis(ttl_ms),
            Duration::from_millis(wait_ms),
        )
        .unwrap()
    }

    /// Drive enough operations through every shard to trigger its sweep.
    pub(super) async fn churn(b: &MemoryBackend, tag: &str) {
        for i in 0..(MIN_SWEEP_INTERVAL * SHARDS * 4) {
            let r = req(&format!("{tag}{i}"), "o", 10_000, 0);
            b.acquire(&r).await.unwrap();
            b.release(r.key(), Holder::owner_only("o")).await.unwrap();
        }
    }

    /// Waiters queued on `key` (live or not).
    pub(super) fn queued(b: &MemoryBackend, key: &LockKey) -> usize {
        let now = Instant::now();
        let (hash, shard) = b.inner.shard(key, now);
        shard
            .find(hash, key)
            .and_then(|e| e.waiters())
            .map_or(0, |w| w.len())
    }

    pub(super) async fn until_queued(b: &MemoryBackend, key: &LockKey, n: usize) {
        while queued(b, key) < n {
            tokio::task::yield_now().await;
        }
    }

    /// A backend where "a" holds "k" for 60 s.
    pub(super) async fn held_for_a_minute() -> (MemoryBackend, AcquireRequest) {
        let b = MemoryBackend::new();
        let a = req("k", "a", 60_000, 0);
        b.acquire(&a).await.unwrap();
        (b, a)
    }

    /// Acquire `r` in a task; it answers when it got the lock.
    pub(super) fn spawn_acquire(
        b: &MemoryBackend,
        r: AcquireRequest,
    ) -> tokio::task::JoinHandle<Result<Instant, LockError>> {
        let b = b.clone();
        tokio::spawn(async move { b.acquire(&r).await.map(|_| Instant::now()) })
    }

    pub(super) fn futures_poll<F: std::future::Future + Unpin>(f: &mut F) -> Option<F::Output> {
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        match std::pin::Pin::new(f).poll(&mut cx) {
            std::task::Poll::Ready(v) => Some(v),
            std::task::Poll::Pending => None,
        }
    }
}
