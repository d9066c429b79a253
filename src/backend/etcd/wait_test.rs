//! A hand-off heard only after the entry it went to was lost.
//!
//! Fault-schedule checker, etcd, seed 2012: a waiter's process stood still
//! (SIGSTOP) while the lock was handed to its entry and then force-released.
//! On waking, its safety-net re-read came first: entry and grant gone, so it
//! queued again. Then its watch, kept across the re-join (same target),
//! delivered the old hand-off, and the waiter returned it: a lease already
//! over, and a new entry left queued that the next release handed to
//! nobody (an owner-only extend of the owner's later found that hold, with
//! another fence). The steps are taken here at the seams, in that order.

use std::time::{Duration, SystemTime};

use super::super::ops::Attempt;
use super::*;
use crate::backend::{Holder, LockBackend};
use crate::key::LockKey;
use crate::spec::new_attempt_id;

use super::super::etcd_cluster;
use super::super::leave::leave_test::two_instances;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_off_to_an_entry_since_lost_is_not_a_grant() {
    let backend = EtcdBackend::from_endpoints(etcd_cluster::EtcdCluster::shared().endpoints())
        .unwrap()
        .prefix(format!("stale-{}/", new_attempt_id()));
    let key = LockKey::global("k").unwrap();
    let ttl = Duration::from_secs(30);
    let holder = AcquireRequest::new(key.clone(), "holder", ttl, Duration::ZERO).unwrap();
    backend.acquire(&holder).await.unwrap();
    let wait = Duration::from_secs(20);
    let waiter = AcquireRequest::new(key.clone(), "waiter", ttl, wait).unwrap();
    let keys = backend.keys(&key);
    let until = Some(SystemTime::now() + wait);
    let queue = async |id| match backend
        .attempt(&waiter, &keys, Some(id), until, backend.deadline())
        .await
        .unwrap()
    {
        Attempt::Busy {
            queued: Some(q), ..
        } => Place::from(q),
        _ => panic!("the lock is busy: the waiter queues"),
    };
    let first = queue(new_attempt_id()).await;
    // The waiter watches the holders (it is the oldest).
    let (start, stop) = keys.holders();
    let mut watch = backend
        .shared
        .watches
        .watch(&backend.shared, start, Some(stop), None, backend.deadline())
        .await
        .unwrap();
    assert!(matches!(watch.next().await, Note::Created(_)));
    // The lock is handed to its entry (the waiter's process stands still)...
    backend
        .release(&key, Holder::owner_only("holder"))
        .await
        .unwrap();
    let handed = loop {
        match watch.next().await {
            Note::Events(events) if events.iter().any(|(put, _)| *put) => break events,
            Note::Events(_) => {}
            _ => panic!("the watch hears the hand-off"),
        }
    };
    let mine = keys.holder(waiter.kind(), waiter.owner(), waiter.attempt());
    assert!(
        handed_over(&handed, &mine, &first).is_some(),
        "to the entry it was made for, the hand-off is a grant"
    );
    // ...and force-released.
    assert!(backend.force_release(&key).await.unwrap());
    // Waking, it reads first: entry and grant gone, it queues again (the
    // lock is busy once more, so the new entry waits)...
    let seen = backend
        .look(&waiter, &keys, &first, None, backend.deadline())
        .await
        .unwrap();
    assert!(matches!(seen, Seen::Lost));
    backend.acquire(&holder).await.unwrap();
    let again = queue(new_attempt_id()).await;
    // ...and only then hears the old hand-off: not a grant to the new entry.
    assert!(
        handed_over(&handed, &mine, &again).is_none(),
        "a hand-off to an entry since lost answered the waiter"
    );
}

/// Two calls of one request (same owner and attempt: a retry sent while the
/// first still waits) queue two entries, another waiter's between them. The
/// release hands the lock to the first; the second sees its holder key on
/// its next read (the safety net: what it watches, the entry before it, has
/// not changed) and answers with the same hold. Its entry used to stay
/// queued, to be handed the lock once it came to the head, for no call:
/// held on this process's lease, with no timer, as long as the process lived.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_answered_by_its_twins_grant_leaves_the_queue() {
    let backend = EtcdBackend::from_endpoints(etcd_cluster::EtcdCluster::shared().endpoints())
        .unwrap()
        .prefix(format!("twins-{}/", new_attempt_id()));
    let key = LockKey::global("k").unwrap();
    let ttl = Duration::from_secs(30);
    let wait = Duration::from_secs(20);
    let holder = AcquireRequest::new(key.clone(), "holder", ttl, Duration::ZERO).unwrap();
    backend.acquire(&holder).await.unwrap();
    let waiter = AcquireRequest::new(key.clone(), "waiter", ttl, wait).unwrap();
    let other = AcquireRequest::new(key.clone(), "other", ttl, wait).unwrap();
    let waiting = async |n: usize| {
        let end = tokio::time::Instant::now() + Duration::from_secs(10);
        while backend.status(&key).await.unwrap().map(|s| s.waiters) != Some(n) {
            assert!(
                tokio::time::Instant::now() < end,
                "never {n} entries queued"
            );
            tokio::task::yield_now().await;
        }
    };
    let call = |req: &AcquireRequest| {
        let (backend, req) = (backend.clone(), req.clone());
        tokio::spawn(async move { backend.acquire(&req).await })
    };
    let first = call(&waiter);
    waiting(1).await;
    let between = call(&other);
    waiting(2).await;
    let second = call(&waiter);
    waiting(3).await;
    backend
        .release(&key, Holder::owner_only("holder"))
        .await
        .unwrap();
    let (a, b) = (
        first.await.unwrap().unwrap(),
        second.await.unwrap().unwrap(),
    );
    assert_eq!(a.fence, b.fence, "one hold answers both calls");
    // The second call's entry leaves the queue (in the background, as a
    // dropped waiter's does): the other waiter's is the only one left...
    waiting(1).await;
    backend
        .release(&key, Holder::owner_only("waiter"))
        .await
        .unwrap();
    between.await.unwrap().unwrap();
    // ...so that its release frees the lock, rather than handing it to an
    // entry no call waits on.
    backend
        .release(&key, Holder::owner_only("other"))
        .await
        .unwrap();
    assert!(
        backend.status(&key).await.unwrap().is_none(),
        "the lock is free"
    );
}

/// A put of our holder key that rewrites it (the extension of a hold that
/// this request's other call was handed) is no hand-off to our entry: taken
/// as one, the call answered and left its entry queued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rewrite_of_our_holder_key_is_not_a_hand_off() {
    let backend = EtcdBackend::from_endpoints(etcd_cluster::EtcdCluster::shared().endpoints())
        .unwrap()
        .prefix(format!("rewrite-{}/", new_attempt_id()));
    let key = LockKey::global("k").unwrap();
    let ttl = Duration::from_secs(30);
    let waiter = AcquireRequest::new(key.clone(), "waiter", ttl, Duration::ZERO).unwrap();
    let lease = backend.acquire(&waiter).await.unwrap();
    let keys = backend.keys(&key);
    let (start, stop) = keys.holders();
    let mut watch = backend
        .shared
        .watches
        .watch(&backend.shared, start, Some(stop), None, backend.deadline())
        .await
        .unwrap();
    let Note::Created(at) = watch.next().await else {
        panic!("the watch is set up");
    };
    // A waiter that read the lock before the extension.
    let place = Place {
        entry: keys.waiter(new_attempt_id()),
        revision: at,
        before: None,
        read_at: at,
    };
    backend
        .extend(&key, Holder::new("waiter", lease.fence), ttl)
        .await
        .unwrap();
    let events = loop {
        match watch.next().await {
            Note::Events(events) if events.iter().any(|(put, _)| *put) => break events,
            Note::Events(_) => {}
            _ => panic!("the watch hears the extension"),
        }
    };
    let mine = keys.holder(waiter.kind(), waiter.owner(), waiter.attempt());
    assert!(
        handed_over(&events, &mine, &place).is_none(),
        "an extension taken for a hand-off"
    );
}

/// Two calls of one request (same owner and attempt: a retry) in two
/// processes: the first, `here`, was dropped with its entry queued; the
/// retry, `there`, queued behind it, and another request behind both. The
/// release hands the lock to the first call's entry, on this process's
/// lease (and drops the retry's entry, an acquisition that holds already).
/// Returns both instances, the request and the retry's place.
async fn twins_handed_through_the_first() -> (EtcdBackend, EtcdBackend, AcquireRequest, Place) {
    let (here, there) = two_instances("twins");
    let key = LockKey::global("k").unwrap();
    let ttl = Duration::from_secs(30);
    let wait = Duration::from_secs(20);
    let holder = AcquireRequest::new(key.clone(), "holder", ttl, Duration::ZERO).unwrap();
    here.acquire(&holder).await.unwrap();
    let waiter = AcquireRequest::new(key.clone(), "waiter", ttl, wait).unwrap();
    let other = AcquireRequest::new(key.clone(), "other", ttl, wait).unwrap();
    let keys = here.keys(&key);
    let until = Some(SystemTime::now() + wait);
    let queue = async |backend: &EtcdBackend, req: &AcquireRequest| match backend
        .attempt(
            req,
            &keys,
            Some(new_attempt_id()),
            until,
            backend.deadline(),
        )
        .await
        .unwrap()
    {
        Attempt::Busy {
            queued: Some(q), ..
        } => Place::from(q),
        _ => panic!("the lock is busy: the call queues"),
    };
    queue(&here, &waiter).await;
    let retry = queue(&there, &waiter).await;
    queue(&here, &other).await;
    here.release(&key, Holder::owner_only("holder"))
        .await
        .unwrap();
    (here, there, waiter, retry)
}

/// After the retry answered with fence `fence`: the first call's leave,
/// `here`, goes on from its read of the lock, and must leave the hold with
/// the retry (on the retry's lease).
async fn the_first_calls_leave_leaves_it(
    here: &EtcdBackend,
    there: &EtcdBackend,
    waiter: &AcquireRequest,
    fence: u64,
) {
    let keys = here.keys(waiter.key());
    let mine = keys.holder(waiter.kind(), waiter.owner(), waiter.attempt());
    let read = here.snapshot(&keys, here.deadline()).await.unwrap();
    let held = read.hold(&mine).expect("held by the request").clone();
    assert!(
        there.shared.leases.known_until(held.lease).is_some(),
        "the hold lives on the retry's lease"
    );
    here.give_back_handed(&keys, read, &mine, here.deadline())
        .await
        .unwrap();
    let status = here.status(waiter.key()).await.unwrap().unwrap();
    assert_eq!(
        (status.owner.as_str(), status.fence),
        ("waiter", fence),
        "the first call's leave passed on the hold the retry answered with"
    );
}

/// The retry reads its holder key held and answers with it. The first
/// call's leave then found the hold as its hand-off wrote it, on its own
/// lease, and passed it on: two holders. (And the retry's hold lived on the
/// other process's lease: freed before its TTL if that process stopped.)
/// The retry now takes such a hold over (rewritten, on its own lease)
/// before it answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_handed_its_twins_grant_in_another_process_takes_it_over() {
    let (here, there, waiter, retry) = twins_handed_through_the_first().await;
    let keys = there.keys(waiter.key());
    let Seen::Granted(lease, _) = there
        .look(&waiter, &keys, &retry, None, there.deadline())
        .await
        .unwrap()
    else {
        panic!("the retry answers with the hold");
    };
    the_first_calls_leave_leaves_it(&here, &there, &waiter, lease.fence).await;
}

/// The same, found by the retry as its max wait ends: its give-up finds the
/// request holding, and answers with that hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_giving_up_on_its_twins_grant_in_another_process_takes_it_over() {
    let (here, there, waiter, retry) = twins_handed_through_the_first().await;
    let keys = there.keys(waiter.key());
    let until = SystemTime::now();
    let mut guard = WaitGuard::new(&there, &keys, &waiter, until);
    guard.entry = Some(retry.entry.clone());
    let lease = there
        .give_up(&mut guard, tokio::time::Instant::now(), there.deadline())
        .await
        .expect("the retry answers with the hold");
    drop(guard);
    the_first_calls_leave_leaves_it(&here, &there, &waiter, lease.fence).await;
}

/// The first call answered with the hold after all (it was not dropped)
/// and extended it past the retry's TTL. The retry's answer leaves that
/// hold as it is: taken over, it was rewritten with the retry's shorter
/// TTL, and its timer ended it before the extension the first call's
/// caller was told of (two holders once the next waiter had it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_leaves_a_hold_its_twin_extended_as_it_is() {
    let (here, there, waiter, retry) = twins_handed_through_the_first().await;
    let keys = here.keys(waiter.key());
    let mine = keys.holder(waiter.kind(), waiter.owner(), waiter.attempt());
    let read = here.snapshot(&keys, here.deadline()).await.unwrap();
    let fence = read.hold(&mine).expect("handed to the first call").fence;
    here.extend(
        waiter.key(),
        Holder::new("waiter", fence),
        Duration::from_secs(600),
    )
    .await
    .unwrap();
    let extended = here.status(waiter.key()).await.unwrap().unwrap();
    let Seen::Granted(lease, _) = there
        .look(&waiter, &keys, &retry, None, there.deadline())
        .await
        .unwrap()
    else {
        panic!("the retry answers with the hold");
    };
    assert_eq!(lease.fence, fence);
    let after = here.status(waiter.key()).await.unwrap().unwrap();
    assert_eq!(
        after.expires_at, extended.expires_at,
        "the retry shortened the hold its twin extended"
    );
}
