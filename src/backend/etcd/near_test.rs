//! A hand-off tells a waiter of its own process at once: the grant, and
//! the next waiter that it is now the oldest.

use std::time::{Duration, SystemTime};

use super::super::EtcdBackend;
use super::super::leave::leave_test::queue;
use super::*;
use crate::backend::{Holder, LockBackend};
use crate::key::LockKey;
use crate::spec::{AcquireRequest, LockKind, new_attempt_id};

use super::super::etcd_cluster;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_off_tells_the_waiter_and_the_next_one_in_this_process() {
    let backend = EtcdBackend::from_endpoints(etcd_cluster::EtcdCluster::shared().endpoints())
        .unwrap()
        .prefix(format!("near-{}/", new_attempt_id()));
    let key = LockKey::global("k").unwrap();
    let ttl = Duration::from_secs(30);
    let wait = Duration::from_secs(20);
    let holder = AcquireRequest::new(key.clone(), "holder", ttl, Duration::ZERO).unwrap();
    let first = backend.acquire(&holder).await.unwrap();
    let keys = backend.keys(&key);
    let until = SystemTime::now() + wait;
    // Three waiters queue (as `join` does: registered before the attempt).
    let mut queued = Vec::new();
    for owner in ["w1", "w2", "w3"] {
        let req = AcquireRequest::new(key.clone(), owner, ttl, wait).unwrap();
        let id = new_attempt_id();
        let told = backend.shared.near.enter(&keys.waiter(id));
        queue(&backend, &req, id, until).await;
        queued.push((req, told));
    }
    let [(w1, mut told1), (_, mut told2), (_, mut told3)] = queued.try_into().ok().unwrap();
    backend
        .release(&key, Holder::owner_only("holder"))
        .await
        .unwrap();
    // Right after the release: the oldest waiter holds the lock and has
    // been told so, with its hold (no watch, no read of its own)...
    match told1.try_recv() {
        Ok(Told::Granted(h, _)) => {
            assert_eq!(h.key, keys.holder(w1.kind(), w1.owner(), w1.attempt()));
            assert!(h.fence > first.fence, "a new fence");
        }
        _ => panic!("the oldest waiter is told its grant by the hand-off"),
    }
    // ...the next is told it is now the oldest, at the hand-off's revision...
    match told2.try_recv() {
        Ok(Told::Head(at)) => assert!(at > i64::try_from(first.fence).unwrap()),
        _ => panic!("the next waiter is told it is the oldest"),
    }
    // ...and the one behind it nothing.
    assert!(told3.try_recv().is_err());
}

/// A hand-off to shared waiters grants each one that fits in turn; only
/// the first that must wait (a writer) is told it is the oldest. A reader
/// that fits is never told to wait on the holders: should its grant not
/// come (an error part-way), it would wait there for a change that need not
/// come, up to its safety-net re-check (2 s), beside a lock it could share.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_waiter_that_must_wait_is_told_it_is_the_oldest() {
    let backend = EtcdBackend::from_endpoints(etcd_cluster::EtcdCluster::shared().endpoints())
        .unwrap()
        .prefix(format!("near-{}/", new_attempt_id()));
    let key = LockKey::global("k").unwrap();
    let ttl = Duration::from_secs(30);
    let wait = Duration::from_secs(20);
    let holder = AcquireRequest::new(key.clone(), "holder", ttl, Duration::ZERO).unwrap();
    backend.acquire(&holder).await.unwrap();
    let keys = backend.keys(&key);
    let until = SystemTime::now() + wait;
    let mut queued = Vec::new();
    for (owner, kind) in [
        ("r1", LockKind::Shared),
        ("r2", LockKind::Shared),
        ("w", LockKind::Exclusive),
    ] {
        let req = AcquireRequest::new(key.clone(), owner, ttl, wait)
            .unwrap()
            .with_kind(kind)
            .unwrap();
        let id = new_attempt_id();
        let told = backend.shared.near.enter(&keys.waiter(id));
        queue(&backend, &req, id, until).await;
        queued.push(told);
    }
    let [mut r1, mut r2, mut w] = queued.try_into().ok().unwrap();
    backend
        .release(&key, Holder::owner_only("holder"))
        .await
        .unwrap();
    assert!(matches!(r1.try_recv(), Ok(Told::Granted(..))), "r1 granted");
    assert!(
        matches!(r2.try_recv(), Ok(Told::Granted(..))),
        "r2, which fits beside r1, is granted, never first told to wait on the holders"
    );
    assert!(
        matches!(w.try_recv(), Ok(Told::Head(_))),
        "the writer waits"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_left_behind_is_told_nothing() {
    let near = NearWaiters::default();
    let mut old = near.enter(b"e1");
    let mut new = near.enter(b"e2");
    near.exit(b"e1");
    near.head(b"e1", 7);
    near.head(b"e2", 8);
    assert!(old.try_recv().is_err(), "an entry since left hears nothing");
    assert!(matches!(new.try_recv(), Ok(Told::Head(8))));
}
