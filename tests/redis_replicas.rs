//! `RedisBackend::min_replicas` against a private primary and replica: an
//! acquisition is granted only once the replica has the lock, and is
//! released and refused (`503`) when it does not get there in time.
#![cfg(feature = "redis")]

mod common;

use std::time::Duration;
use tower_lock::backend::Holder;

use common::redis_server::RedisServer;
use tokio::time::Instant;
use tower_lock::backend::redis::RedisBackend;
use tower_lock::backend::{AcquireRequest, FlightStart};
use tower_lock::{LockBackend, LockError, LockKey};

const SEC: Duration = Duration::from_secs(1);

fn req(name: &str, owner: &str, wait: Duration) -> AcquireRequest {
    AcquireRequest::new(LockKey::global(name).unwrap(), owner, 30 * SEC, wait).unwrap()
}

/// A primary and one replica of it, in sync.
fn primary_and_replica() -> (RedisServer, RedisServer) {
    let primary = RedisServer::start();
    let port = primary.port().to_string();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]);
    let deadline = std::time::Instant::now() + 10 * SEC;
    while !replica
        .cmd(&["INFO", "replication"])
        .contains("master_link_status:up")
    {
        assert!(std::time::Instant::now() < deadline, "replica never synced");
        std::thread::sleep(Duration::from_millis(10));
    }
    (primary, replica)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquisitions_wait_for_the_replica_and_fail_closed_without_it() {
    let (primary, mut replica) = primary_and_replica();
    let backend = RedisBackend::from_url(&primary.url())
        .unwrap()
        .min_replicas(1, Duration::from_millis(300));
    let plain = RedisBackend::from_url(&primary.url()).unwrap();

    // Granted: the replica has the lock by the time acquire returns.
    let a = req("r1", "a", Duration::ZERO);
    let lease = backend.acquire(&a).await.unwrap();
    assert!(lease.fence > 0);
    assert!(
        replica.cmd(&["GET", "lock:{g:r1}"]).ends_with(" a"),
        "the replica does not have the lock"
    );

    // A lock handed over by another backend's release is confirmed too.
    let b = req("r1", "b", 5 * SEC);
    let waiter = {
        let backend = backend.clone();
        tokio::spawn(async move { backend.acquire(&b).await })
    };
    let deadline = Instant::now() + 5 * SEC;
    while primary.cmd(&["LLEN", "lock:{g:r1}:q"]) != "1" {
        assert!(Instant::now() < deadline, "the waiter never queued");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    plain
        .release(a.key(), Holder::owner_only("a"))
        .await
        .unwrap();
    waiter.await.unwrap().unwrap();
    assert!(replica.cmd(&["GET", "lock:{g:r1}"]).ends_with(" b"));
    backend
        .release(&LockKey::global("r1").unwrap(), Holder::owner_only("b"))
        .await
        .unwrap();

    // Without the replica: refused after the timeout, and not left held.
    replica.kill();
    let c = req("r2", "c", Duration::ZERO);
    let t0 = Instant::now();
    let err = backend.acquire(&c).await.unwrap_err();
    let took = t0.elapsed();
    assert!(matches!(err, LockError::BackendUnavailable(_)), "{err:?}");
    assert!(err.to_string().contains("0 of 1 replicas"), "{err}");
    assert!(took >= Duration::from_millis(250), "refused after {took:?}");
    assert!(took < 3 * SEC, "refused after {took:?}");
    assert_eq!(
        plain.status(c.key()).await.unwrap(),
        None,
        "the unconfirmed lock was not released"
    );
    // Off: the same primary grants at once.
    plain.acquire(&c).await.unwrap();
}

/// Wait until a client of `server` is blocked in `WAIT`.
async fn blocked_in_wait(server: &RedisServer) {
    let deadline = Instant::now() + 5 * SEC;
    while !server.cmd(&["CLIENT", "LIST"]).contains("cmd=wait") {
        assert!(
            Instant::now() < deadline,
            "nobody ever waited for the replica"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// `WAIT` blocks the connection it is sent on: every other call of the
/// backend must go on regardless. A lock with less time left than one
/// acquisition's `WAIT` is renewed (and stays held) while that `WAIT` is
/// still blocked for want of the replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_for_the_replica_holds_back_no_other_call() {
    let (primary, mut replica) = primary_and_replica();
    let backend = RedisBackend::from_url(&primary.url())
        .unwrap()
        .min_replicas(1, Duration::from_millis(1500));
    let short = AcquireRequest::new(
        LockKey::global("short").unwrap(),
        "o",
        Duration::from_millis(900),
        Duration::ZERO,
    )
    .unwrap();
    let lease = backend.acquire(&short).await.unwrap();

    replica.kill();
    let waiting = {
        let backend = backend.clone();
        tokio::spawn(async move { backend.acquire(&req("slow", "s", Duration::ZERO)).await })
    };
    blocked_in_wait(&primary).await;
    let renewed = backend
        .extend(
            short.key(),
            Holder::new("o", lease.fence),
            Duration::from_millis(900),
        )
        .await
        .expect("the renewal waited behind another acquisition's WAIT");
    assert_eq!(renewed.fence, lease.fence);
    let status = backend.status(short.key()).await.unwrap().expect("held");
    assert_eq!((status.owner.as_str(), status.fence), ("o", lease.fence));
    // The slow acquisition itself still fails closed.
    let err = waiting.await.unwrap().unwrap_err();
    assert!(matches!(err, LockError::BackendUnavailable(_)), "{err:?}");
}

/// A single-flight leader and a restored (claimed) lock are taken locks
/// too: without the replica neither is granted, and neither is left held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_way_of_taking_a_lock_waits_for_the_replica() {
    let (primary, mut replica) = primary_and_replica();
    let backend = RedisBackend::from_url(&primary.url())
        .unwrap()
        .min_replicas(1, Duration::from_millis(200));
    let claimable = req("claimed", "job", Duration::ZERO);
    let taken = backend.acquire(&claimable).await.unwrap();

    replica.kill();
    let flight =
        AcquireRequest::new(LockKey::global("flight").unwrap(), "lead", 30 * SEC, SEC).unwrap();
    match backend.flight_begin(&flight).await {
        Err(LockError::BackendUnavailable(_)) => {}
        Ok(FlightStart::Leader(_)) => panic!("a leader without the replica"),
        Ok(_) => panic!("not a leader"),
        Err(e) => panic!("{e:?}"),
    }
    assert_eq!(backend.status(flight.key()).await.unwrap(), None);

    let claimed = backend
        .claim(claimable.key(), Holder::new("job", taken.fence), 77)
        .await;
    assert!(
        matches!(claimed, Err(LockError::BackendUnavailable(_))),
        "{claimed:?}"
    );
    assert_eq!(backend.status(claimable.key()).await.unwrap(), None);
}

#[test]
fn zero_replicas_is_off() {
    let backend = RedisBackend::from_url("redis://127.0.0.1:1")
        .unwrap()
        .min_replicas(0, SEC);
    assert_eq!(backend.get_min_replicas(), None);
    let backend = backend.min_replicas(2, Duration::ZERO);
    assert_eq!(
        backend.get_min_replicas(),
        Some((2, Duration::from_millis(1)))
    );
}
