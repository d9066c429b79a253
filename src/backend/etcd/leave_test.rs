//! A waiter dropped while its call was out: the lock must never stay with
//! its queue entry.
//!
//! Behavioural suite, etcd, under load (`dropped_waiter_does_not_keep_the_lock`,
//! 2 runs in 40 beside two fault-schedule runs): a request dropped while its
//! queueing attempt was in flight left the lock held for its whole TTL. Its
//! first leave ran before the attempt landed, the next only at the entry's
//! deadline; and that leave took a timer the dropped call had armed for a
//! grant it never made as a sign that this process knew it held the lock.
//! Both are called here at the seams, so the interleavings are exact.

use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::super::ops::Attempt;
use super::*;
use crate::backend::{Holder, LockBackend};
use crate::spec::{AcquireRequest, new_attempt_id};

use super::super::etcd_cluster;

const TTL: Duration = Duration::from_secs(30);

fn backend() -> EtcdBackend {
    EtcdBackend::from_endpoints(etcd_cluster::EtcdCluster::shared().endpoints())
        .unwrap()
        .prefix(format!("leave-{}/", new_attempt_id()))
}

/// Two instances of one app on a fresh prefix (`name-<id>/`), as two
/// processes have them: each its own leases, timers and waits.
pub(in crate::backend::etcd) fn two_instances(name: &str) -> (EtcdBackend, EtcdBackend) {
    let prefix = format!("{name}-{}/", new_attempt_id());
    let instance = || {
        EtcdBackend::from_endpoints(etcd_cluster::EtcdCluster::shared().endpoints())
            .unwrap()
            .prefix(prefix.clone())
    };
    (instance(), instance())
}

fn req(key: &LockKey, owner: &str, wait: Duration) -> AcquireRequest {
    AcquireRequest::new(key.clone(), owner, TTL, wait).unwrap()
}

/// Queue `waiter` under entry `id`, as its attempt would.
pub(in crate::backend::etcd) async fn queue(
    backend: &EtcdBackend,
    waiter: &AcquireRequest,
    id: u64,
    until: SystemTime,
) {
    let keys = backend.keys(waiter.key());
    let attempt = backend
        .attempt(waiter, &keys, Some(id), Some(until), backend.deadline())
        .await
        .unwrap();
    assert!(matches!(
        attempt,
        Attempt::Busy {
            queued: Some(_),
            ..
        }
    ));
}

/// A backend whose lock "k" is held by "holder", and a waiter for it with a
/// max wait of 20 s under a fresh entry id.
async fn held() -> (EtcdBackend, AcquireRequest, u64, SystemTime) {
    let backend = backend();
    let key = LockKey::global("k").unwrap();
    backend
        .acquire(&req(&key, "holder", Duration::ZERO))
        .await
        .unwrap();
    let waiter = req(&key, "waiter", Duration::from_secs(20));
    let until = SystemTime::now() + Duration::from_secs(20);
    (backend, waiter, new_attempt_id(), until)
}

/// Drop the guard of `waiter`'s call, entry `id` (`in_flight`: its
/// queueing attempt may still land).
fn drop_guard(
    backend: &EtcdBackend,
    waiter: &AcquireRequest,
    id: u64,
    in_flight: bool,
    until: SystemTime,
) {
    let keys = backend.keys(waiter.key());
    let mut guard = WaitGuard::new(backend, &keys, waiter, until);
    guard.entry = Some(keys.waiter(id));
    guard.in_flight = in_flight;
    drop(guard);
}

/// The holder lets go.
async fn release(backend: &EtcdBackend, key: &LockKey) {
    backend
        .release(key, Holder::owner_only("holder"))
        .await
        .unwrap();
}

/// The lock comes free well before the TTL and the waiter's deadline.
async fn comes_free(backend: &EtcdBackend, key: &LockKey) {
    let probe = req(key, "probe", Duration::from_secs(5));
    backend
        .acquire(&probe)
        .await
        .expect("the dropped waiter's lock passed on");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_that_lands_after_the_leave_is_left_again() {
    let (backend, waiter, id, until) = held().await;
    // Dropped while its queueing attempt is out: it leaves at once (there
    // is nothing to leave yet)...
    drop_guard(&backend, &waiter, id, true, until);
    // ...and the attempt lands after that leave. (The leave is a read and
    // a write away; if it came later, the test would prove nothing, not
    // fail: it was red before the fix.)
    tokio::time::sleep(Duration::from_millis(500)).await;
    queue(&backend, &waiter, id, until).await;
    release(&backend, waiter.key()).await;
    comes_free(&backend, waiter.key()).await;
}

/// A releaser judges a queue entry's deadline (stamped by the waiter's
/// clock) by its own clock: one a second behind the waiter's hands the lock
/// to an entry that landed after the dropped call's deadline. The dropped
/// call's leave must still be watching then: it takes the entry out as it
/// lands (or gives back a grant made first; which one comes first is the
/// watch's race with the release, either keeps the lock from the entry).
/// Ended at the deadline (10 ms after it, as it once did), it left the lock
/// with the entry's holder key, on this process's lease, for as long as the
/// process lives. The skew is staged by stamping the entry a second later
/// than the deadline the dropped call knows (what a releaser's deadline
/// check reads, `values.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_entry_handed_the_lock_by_a_releaser_whose_clock_is_behind_is_left() {
    let (backend, waiter, id, _) = held().await;
    let until = SystemTime::now() + Duration::from_millis(200);
    drop_guard(&backend, &waiter, id, true, until);
    // Past the dropped call's deadline, its queueing attempt lands, stamped
    // (as the releaser reads it) a second later.
    let past = until + Duration::from_millis(200);
    tokio::time::sleep(past.duration_since(SystemTime::now()).unwrap_or_default()).await;
    queue(&backend, &waiter, id, until + Duration::from_secs(1)).await;
    release(&backend, waiter.key()).await;
    comes_free(&backend, waiter.key()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timer_for_a_grant_never_made_does_not_keep_a_handed_lock() {
    let (backend, waiter, id, until) = held().await;
    queue(&backend, &waiter, id, until).await;
    // The dropped call had armed the expiry of a grant it might have made
    // (armed before sending, with that grant's value).
    let keys = backend.keys(waiter.key());
    let mine = keys.holder(waiter.kind(), waiter.owner(), waiter.attempt());
    backend.shared.expiries.arm(
        &backend,
        waiter.key(),
        mine,
        b"a grant never made".to_vec(),
        None,
        Instant::now() + TTL,
    );
    // The release hands the lock to the entry before its leave runs.
    release(&backend, waiter.key()).await;
    let status = backend.status(waiter.key()).await.unwrap().unwrap();
    assert_eq!(status.owner, "waiter");
    drop_guard(&backend, &waiter, id, false, until);
    comes_free(&backend, waiter.key()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_a_live_retry_waits_for_is_not_passed_on() {
    let (backend, waiter, id, until) = held().await;
    // The first call of the request was dropped (its leave is called at
    // the seam below).
    drop_guard(&backend, &waiter, id, false, until);
    // A retry of the same request (same owner and attempt) is waiting,
    // queued under an entry of its own.
    let keys = backend.keys(waiter.key());
    let retry = WaitGuard::new(&backend, &keys, &waiter, until);
    queue(&backend, &waiter, new_attempt_id(), until).await;
    // The hand-off writes that holder key: the retry's to take. The
    // dropped call's late leave would hear the write and read the lock; it
    // goes on from that read as here.
    release(&backend, waiter.key()).await;
    let mine = keys.holder(waiter.kind(), waiter.owner(), waiter.attempt());
    let read = backend.snapshot(&keys, backend.deadline()).await.unwrap();
    assert!(read.hold(&mine).is_some(), "handed to the retry's entry");
    backend
        .give_back_handed(&keys, read, &mine, backend.deadline())
        .await
        .unwrap();
    let status = backend.status(waiter.key()).await.unwrap().unwrap();
    assert_eq!(
        status.owner, "waiter",
        "the dropped call's leave passed it on"
    );
    drop(retry);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_a_retry_took_after_the_leave_read_it_is_not_passed_on() {
    let (backend, waiter, id, until) = held().await;
    let keys = backend.keys(waiter.key());
    let mine = keys.holder(waiter.kind(), waiter.owner(), waiter.attempt());
    queue(&backend, &waiter, id, until).await;
    // Handed to the entry of a call that is gone; its leave reads the
    // hold: nobody in this process holds or waits for it.
    release(&backend, waiter.key()).await;
    let read = backend.snapshot(&keys, backend.deadline()).await.unwrap();
    let fence = read.hold(&mine).expect("handed to the entry").fence;
    // Then a retry of the request takes it over (a refresh: same fence),
    // and another waiter queues.
    let retry = backend.acquire(&waiter).await.unwrap();
    assert_eq!(retry.fence, fence);
    let other = req(waiter.key(), "other", Duration::from_secs(20));
    queue(&backend, &other, new_attempt_id(), until).await;
    // The leave goes on from what it read: the hold is the retry's now.
    backend
        .give_back_handed(&keys, read, &mine, backend.deadline())
        .await
        .unwrap();
    let status = backend.status(waiter.key()).await.unwrap().unwrap();
    assert_eq!(
        (status.owner.as_str(), status.fence),
        ("waiter", fence),
        "the leave passed on the hold the retry took"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_rewritten_since_its_hand_off_is_not_passed_on() {
    let prefix = format!("leave-{}/", new_attempt_id());
    let process = |prefix: &str| {
        EtcdBackend::from_endpoints(etcd_cluster::EtcdCluster::shared().endpoints())
            .unwrap()
            .prefix(prefix.to_owned())
    };
    let (backend, elsewhere) = (process(&prefix), process(&prefix));
    let key = LockKey::global("k").unwrap();
    backend
        .acquire(&req(&key, "holder", Duration::ZERO))
        .await
        .unwrap();
    let waiter = req(&key, "waiter", Duration::from_secs(20));
    let until = SystemTime::now() + Duration::from_secs(20);
    let keys = backend.keys(&key);
    let mine = keys.holder(waiter.kind(), waiter.owner(), waiter.attempt());
    queue(&backend, &waiter, new_attempt_id(), until).await;
    // Handed to the entry of a call of this process that is gone...
    release(&backend, &key).await;
    // ...and taken over by a retry of its request in another process (a
    // refresh: same fence), before this process's leave reads it.
    let retry = elsewhere.acquire(&waiter).await.unwrap();
    let other = req(&key, "other", Duration::from_secs(20));
    queue(&backend, &other, new_attempt_id(), until).await;
    let read = backend.snapshot(&keys, backend.deadline()).await.unwrap();
    backend
        .give_back_handed(&keys, read, &mine, backend.deadline())
        .await
        .unwrap();
    let status = backend.status(&key).await.unwrap().unwrap();
    assert_eq!(
        (status.owner.as_str(), status.fence),
        ("waiter", retry.fence),
        "the leave passed on the hold a retry elsewhere took"
    );
}

/// A retry of a request (same owner and attempt, so the same holder key)
/// waiting in another process was handed the lock through its own entry,
/// while this process's leave of the request's dropped first call watched
/// that holder key. Nothing here waits for the key or tracks the hold, so
/// the leave took the grant for the dropped call's and passed it on: two
/// holders, the retry's caller and the next waiter. The hold is on the
/// other process's lease, as a hand-off writes it on the lease of the entry
/// it goes through; the leave now gives back only holds on its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_to_a_retrys_entry_in_another_process_is_not_passed_on() {
    let (here, there) = two_instances("leave");
    let key = LockKey::global("k").unwrap();
    here.acquire(&req(&key, "holder", Duration::ZERO))
        .await
        .unwrap();
    let until = SystemTime::now() + Duration::from_secs(20);
    // The retry queues there, and another request here behind it.
    let waiter = req(&key, "waiter", Duration::from_secs(20));
    queue(&there, &waiter, new_attempt_id(), until).await;
    let other = req(&key, "other", Duration::from_secs(20));
    queue(&here, &other, new_attempt_id(), until).await;
    // The release hands the lock to the retry's entry: the request's
    // holder key, which the dropped call's leave here reads.
    release(&here, &key).await;
    let keys = here.keys(&key);
    let mine = keys.holder(waiter.kind(), waiter.owner(), waiter.attempt());
    let read = here.snapshot(&keys, here.deadline()).await.unwrap();
    let fence = read.hold(&mine).expect("handed to the retry's entry").fence;
    here.give_back_handed(&keys, read, &mine, here.deadline())
        .await
        .unwrap();
    let status = here.status(&key).await.unwrap().unwrap();
    assert_eq!(
        (status.owner.as_str(), status.fence),
        ("waiter", fence),
        "the leave passed on the hold handed to the other process's entry"
    );
}
