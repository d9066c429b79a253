//! The waiting queue every backend keeps (the `LockBackend` contract): a
//! release hands the lock to the oldest live waiter at once, waiters are
//! served first come first served, a newcomer never barges past them (also
//! after the holder's lease ran out), a waiter that left does not hold the
//! queue up, and a waiter gets the lock when its holder's TTL ends.
//!
//! Asserted as state (who holds the lock right after an event), not as
//! timing.

use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower_lock::backend::Holder;

use tokio::task::JoinHandle;
use tower_lock::backend::{AcquireRequest, Lease};
use tower_lock::{LockError, SharedBackend};

use super::harness::Harness;
use super::support::*;

const LONG: Duration = Duration::from_secs(30);
const PATIENT: Duration = Duration::from_secs(10);

fn spawn_acquire(b: &SharedBackend, req: AcquireRequest) -> JoinHandle<Result<Lease, LockError>> {
    let b = b.clone();
    tokio::spawn(async move { b.acquire(&req).await })
}

/// Right after `release` returns, the lock already belongs to the oldest
/// waiter (it was handed over, never free), and the next one is still queued.
pub async fn release_hands_the_lock_to_the_oldest_waiter_at_once(h: Harness) {
    let key = gkey("k");
    h.backend
        .acquire(&areq(&key, "holder", LONG, Duration::ZERO))
        .await
        .unwrap();
    let first = spawn_acquire(&h.backend, areq(&key, "first", LONG, PATIENT));
    h.until_queued(&key, 1).await;
    let second = spawn_acquire(&h.backend, areq(&key, "second", LONG, PATIENT));
    h.until_queued(&key, 2).await;

    h.backend
        .release(&key, Holder::owner_only("holder"))
        .await
        .unwrap();
    let st = status_of(&h.backend, &key)
        .await
        .expect("handed over at once, never free");
    assert_eq!((st.owner.as_str(), st.waiters), ("first", 1));
    let lease = first.await.unwrap().expect("first was handed the lock");
    assert_eq!(lease.fence, st.fence);

    h.backend
        .release(&key, Holder::owner_only("first"))
        .await
        .unwrap();
    let st = status_of(&h.backend, &key)
        .await
        .expect("handed over again");
    assert_eq!((st.owner.as_str(), st.waiters), ("second", 0));
    assert_eq!(second.await.unwrap().unwrap().fence, st.fence);
    h.backend
        .release(&key, Holder::owner_only("second"))
        .await
        .unwrap();
    assert_eq!(status_of(&h.backend, &key).await, None);
}

/// Waiters get the lock in the order they queued.
pub async fn waiters_are_served_in_the_order_they_came(h: Harness) {
    let key = gkey("k");
    h.backend
        .acquire(&areq(&key, "holder", LONG, Duration::ZERO))
        .await
        .unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for (i, name) in ["a", "b", "c", "d"].into_iter().enumerate() {
        let (backend, order, k) = (h.backend.clone(), order.clone(), key.clone());
        waiters.push(tokio::spawn(async move {
            backend
                .acquire(&areq(&k, name, LONG, PATIENT))
                .await
                .unwrap();
            order.lock().unwrap().push(name);
            backend.release(&k, Holder::owner_only(name)).await.unwrap();
        }));
        h.until_queued(&key, i + 1).await;
    }
    h.backend
        .release(&key, Holder::owner_only("holder"))
        .await
        .unwrap();
    for w in waiters {
        w.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), ["a", "b", "c", "d"]);
}

/// The holder's lease runs out with a live waiter queued that has not yet
/// acted (it is frozen, as a stopped process): a newcomer is refused, and
/// the lock goes to the waiter.
pub async fn an_expired_lock_goes_to_the_queue_not_to_a_newcomer(h: Harness) {
    let key = gkey("k");
    h.backend
        .acquire(&areq(&key, "holder", LONG, Duration::ZERO))
        .await
        .unwrap();
    let waiter = h
        .frozen_waiter(areq(&key, "waiter", h.units(10), h.units(30)))
        .await;
    // Only now does the holder's lease get short: however slow the waiter
    // was to queue, it queued before the expiry.
    h.backend
        .extend(&key, Holder::owner_only("holder"), h.units(1))
        .await
        .unwrap();
    h.advance(h.units(2)).await;

    let newcomer = h
        .backend
        .acquire(&areq(&key, "newcomer", h.units(10), Duration::ZERO))
        .await;
    assert!(
        matches!(newcomer, Err(LockError::AcquisitionFailed { .. })),
        "a newcomer barged past the queue: {newcomer:?}"
    );
    let st = status_of(&h.backend, &key)
        .await
        .expect("handed to the waiter");
    assert_eq!(st.owner, "waiter");
    let lease = waiter.thaw().await.expect("the waiter holds it");
    assert_eq!(lease.fence, st.fence);
    h.backend
        .release(&key, Holder::owner_only("waiter"))
        .await
        .unwrap();
}

/// A waiter that gave up (its task was cancelled) does not hold the queue
/// up: the next waiter gets the lock when the holder releases.
pub async fn a_cancelled_waiter_does_not_hold_the_queue_up(h: Harness) {
    let key = gkey("k");
    h.backend
        .acquire(&areq(&key, "holder", LONG, Duration::ZERO))
        .await
        .unwrap();
    let gone = spawn_acquire(&h.backend, areq(&key, "gone", LONG, PATIENT));
    h.until_queued(&key, 1).await;
    let next = spawn_acquire(&h.backend, areq(&key, "next", LONG, PATIENT));
    h.until_queued(&key, 2).await;
    gone.abort();
    assert!(gone.await.unwrap_err().is_cancelled());

    h.backend
        .release(&key, Holder::owner_only("holder"))
        .await
        .unwrap();
    let lease = tokio::time::timeout(Duration::from_secs(5), next)
        .await
        .expect("the next waiter got the lock")
        .unwrap()
        .unwrap();
    let st = status_of(&h.backend, &key).await.unwrap();
    assert_eq!((st.owner.as_str(), st.fence), ("next", lease.fence));
    h.backend
        .release(&key, Holder::owner_only("next"))
        .await
        .unwrap();
}

/// A holder that never releases (it crashed): the waiter gets the lock when
/// the holder's TTL ends, with no release and no polling; on a paused clock,
/// exactly then.
pub async fn a_waiter_gets_the_lock_when_the_holders_ttl_ends(h: Harness) {
    let key = gkey("k");
    let held = h
        .backend
        .acquire(&areq(&key, "crashed", h.units(2), Duration::ZERO))
        .await
        .unwrap();
    let start = tokio::time::Instant::now();
    let lease = h
        .backend
        .acquire(&areq(&key, "next", h.units(10), h.units(20)))
        .await
        .expect("free once the holder's TTL ended");
    if h.is_paused() {
        assert_eq!(start.elapsed(), h.units(2));
    }
    assert!(lease.fence > held.fence);
    assert_eq!(status_of(&h.backend, &key).await.unwrap().owner, "next");
}

/// A waiter of the holder's own owner (a custom owner shared by two
/// requests) is handed the lock and walks away with it: that grant still
/// ends at its TTL, and the next waiter gets the lock then. (etcd, the
/// fault-schedule checker's seed 1172: a release that handed the lock on
/// then forgot the expiry of every holder key of its owner, the new
/// holder's too, and the lock lived as long as its process.)
pub async fn a_lock_handed_to_its_holders_owner_still_ends_at_its_ttl(h: Harness) {
    let key = gkey("k");
    let held = h
        .backend
        .acquire(&areq(&key, "shared-owner", LONG, Duration::ZERO))
        .await
        .unwrap();
    let first = spawn_acquire(&h.backend, areq(&key, "shared-owner", h.units(2), PATIENT));
    h.until_queued(&key, 1).await;
    let next = spawn_acquire(&h.backend, areq(&key, "next", h.units(10), PATIENT));
    h.until_queued(&key, 2).await;
    h.backend
        .release(&key, Holder::new("shared-owner", held.fence))
        .await
        .unwrap();
    let first = first.await.unwrap().expect("handed the lock");
    assert!(first.fence > held.fence);
    // The first walks away: its TTL frees the lock for the next.
    let lease = next
        .await
        .unwrap()
        .expect("free once the handed lock's TTL ended");
    assert!(lease.fence > first.fence);
    assert_eq!(status_of(&h.backend, &key).await.unwrap().owner, "next");
}

/// `holder` takes `key`, then `first` and each of `behind` queue in turn,/// `holder` takes `key`, then `first` and each of `behind` queue in turn,
/// and the holder's release hands the lock to `first`: its lease, and the
/// acquisitions still waiting behind it.
async fn handed_to_first<const N: usize>(
    h: &Harness,
    key: &tower_lock::LockKey,
    behind: [&str; N],
) -> (Lease, [JoinHandle<Result<Lease, LockError>>; N]) {
    h.backend
        .acquire(&areq(key, "holder", LONG, Duration::ZERO))
        .await
        .unwrap();
    let first = spawn_acquire(&h.backend, areq(key, "first", LONG, PATIENT));
    h.until_queued(key, 1).await;
    let mut waiting = Vec::new();
    for (i, owner) in behind.into_iter().enumerate() {
        waiting.push(spawn_acquire(&h.backend, areq(key, owner, LONG, PATIENT)));
        h.until_queued(key, i + 2).await;
    }
    h.backend
        .release(key, Holder::owner_only("holder"))
        .await
        .unwrap();
    let first = first.await.unwrap().expect("first was handed the lock");
    let Ok(waiting) = waiting.try_into() else {
        unreachable!("one acquisition per owner")
    };
    (first, waiting)
}

/// A lock handed over with waiters behind, then the next waiter leaves:
/// the new holder's release goes to the live waiter behind it (whatever a
/// backend remembered of the queue at the hand-off is checked again, never
/// trusted).
pub async fn a_release_after_the_queue_changed_reaches_the_live_waiter(h: Harness) {
    let key = gkey("k");
    let (first, [gone, next]) = handed_to_first(&h, &key, ["gone", "next"]).await;

    gone.abort();
    assert!(gone.await.unwrap_err().is_cancelled());
    h.until_queue_is(&key, 1).await;
    h.backend
        .release(&key, Holder::new("first", first.fence))
        .await
        .unwrap();
    let st = status_of(&h.backend, &key)
        .await
        .expect("handed to the live waiter");
    assert_eq!((st.owner.as_str(), st.waiters), ("next", 0));
    let lease = next.await.unwrap().expect("next was handed the lock");
    assert_eq!(lease.fence, st.fence);
    assert!(lease.fence > first.fence);
    h.backend
        .release(&key, Holder::owner_only("next"))
        .await
        .unwrap();
}

/// A holder handed the lock with a waiter behind loses it (force release:
/// the lock goes on to that waiter). Its release is refused as someone
/// else's lock, and the waiter keeps it.
pub async fn a_release_after_a_force_release_is_refused(h: Harness) {
    let key = gkey("k");
    let (first, [second]) = handed_to_first(&h, &key, ["second"]).await;

    assert!(h.backend.force_release(&key).await.unwrap());
    let second = second.await.unwrap().expect("second was handed the lock");
    assert_eq!(
        h.backend
            .release(&key, Holder::new("first", first.fence))
            .await,
        Err(LockError::OwnershipMismatch)
    );
    let st = status_of(&h.backend, &key).await.expect("second keeps it");
    assert_eq!((st.owner.as_str(), st.fence), ("second", second.fence));
    h.backend
        .release(&key, Holder::new("second", second.fence))
        .await
        .unwrap();
}
