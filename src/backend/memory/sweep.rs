//! Sweeping expired entries, amortised over the operations on a shard, so
//! they cannot pile up and no cleanup job is needed.

use std::sync::atomic::AtomicU64;

use tokio::time::Instant;

use super::group::settle;
use super::table::{Entry, Shard};

/// A shard sweeps at most once per this many operations (and at least once
/// per four times as many operations as it holds entries).
pub(super) const MIN_SWEEP_INTERVAL: usize = 256;

impl Shard {
    /// Count an operation; sweep once enough have gone by.
    pub(super) fn maybe_sweep(&mut self, now: Instant, fence: &AtomicU64) {
        self.ops_since_sweep += 1;
        if self.ops_since_sweep >= (4 * self.len()).max(MIN_SWEEP_INTERVAL) {
            self.ops_since_sweep = 0;
            self.sweep(now, fence);
        }
    }

    /// Remove expired entries, if any can have expired.
    pub(super) fn sweep(&mut self, now: Instant, fence: &AtomicU64) {
        if self.earliest.is_none_or(|e| e > now) {
            return;
        }
        let mut earliest = None::<Instant>;
        let mut live = |e: &mut Entry| {
            // An expired lock with waiters queued goes to the first of them.
            let live = settle(fence, e, now);
            if live {
                let at = e.earliest_expiry();
                earliest = Some(earliest.map_or(at, |t| t.min(at)));
            }
            live
        };
        // A removed entry had no live waiters.
        self.young.retain(&mut live);
        self.old.retain(&mut live);
        self.earliest = earliest;
    }
}

#[cfg(test)]
mod tests {
    use crate::backend::Holder;
    use std::time::Duration;

    use tokio::time::Instant;

    use super::super::MemoryBackend;
    use super::super::table::{SHARDS, lock};
    use super::super::testing::{churn, futures_poll, req};
    use crate::backend::{LockBackend, LockKey};

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
            Holder::owner_only("o"),
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
        b.release(&LockKey::global("k1").unwrap(), Holder::owner_only("o"))
            .await
            .unwrap();
        waiter.await.unwrap().unwrap();

        tokio::time::advance(Duration::from_millis(20)).await;
        churn(&b, "x").await;
        assert_eq!(b.len(), 98, "k0 and k1 expired and were swept");
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
}
