//! A Redis Cluster primary killed under holders and waiters: 3 primaries
//! and 3 replicas started here (`cluster-node-timeout` 1 s), one primary
//! SIGKILLed while a lock on it is held and four waiters queue behind it.
//!
//! What must hold (the README's "Redis Cluster" guarantees):
//! - the waiters fail closed with `503` well inside their max wait (their
//!   shard's pub/sub connection drops; the re-check cannot reach a primary);
//! - every failure during the failover is `503` (never a grant, never a
//!   `429` made up from a stale view);
//! - service comes back by itself once the replica is promoted (the backend
//!   follows the new slot map; nobody restarts it);
//! - a lock confirmed on a replica (`min_replicas`) survives: the promoted
//!   replica still has its holder, owner and fence, refuses a newcomer, and
//!   the next fence is larger.
#![cfg(feature = "redis-cluster")]

mod common;

use std::time::Duration;
use tower_lock::backend::Holder;

use common::redis_cluster::RedisCluster;
use tokio::time::Instant;
use tower_lock::backend::AcquireRequest;
use tower_lock::backend::redis::RedisBackend;
use tower_lock::{LockBackend, LockError, LockKey};

const SEC: Duration = Duration::from_secs(1);
const OP_TIMEOUT: Duration = Duration::from_millis(500);
const MAX_WAIT: Duration = Duration::from_secs(20);

fn req(name: &str, owner: &str, ttl: Duration, wait: Duration) -> AcquireRequest {
    AcquireRequest::new(LockKey::global(name).unwrap(), owner, ttl, wait).unwrap()
}

/// A lock name (global scope, default prefix) whose slot primary `port` owns.
fn name_on(cluster: &RedisCluster, port: u16, stem: &str) -> String {
    (0..)
        .map(|i| format!("{stem}{i}"))
        .find(|name| {
            let slot: u16 = cluster
                .cmd(
                    cluster.live_port(),
                    &["CLUSTER", "KEYSLOT", &format!("lock:{{g:{name}}}")],
                )
                .parse()
                .unwrap();
            cluster.owner_of(slot) == port
        })
        .unwrap()
}

fn unavailable(e: &LockError) -> bool {
    matches!(e, LockError::BackendUnavailable(_))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_killed_under_holders_and_waiters() {
    tokio::time::timeout(Duration::from_secs(90), failover())
        .await
        .expect("the failover test hung");
}

async fn failover() {
    let cluster = RedisCluster::start_with(1);
    let backend = RedisBackend::from_cluster_urls(cluster.urls().iter().map(String::as_str))
        .unwrap()
        .op_timeout(OP_TIMEOUT);
    let confirmed = backend.clone().min_replicas(1, SEC);
    let primaries = cluster.primaries();
    let (victim, survivor) = (primaries[0], primaries[1]);
    let held = name_on(&cluster, victim, "held");
    let fresh = name_on(&cluster, victim, "fresh");
    let other = name_on(&cluster, survivor, "other");

    // A holder confirmed on the victim's replica, and four waiters.
    let holder = req(&held, "holder", 60 * SEC, Duration::ZERO);
    let lease = confirmed.acquire(&holder).await.unwrap();
    let mut waiters = Vec::new();
    for i in 0..4 {
        let backend = backend.clone();
        let r = req(&held, &format!("waiter{i}"), 5 * SEC, MAX_WAIT);
        waiters.push(tokio::spawn(async move {
            let out = backend.acquire(&r).await;
            (out, Instant::now())
        }));
    }
    let queue = format!("lock:{{g:{held}}}:q");
    let deadline = Instant::now() + 10 * SEC;
    while cluster.cmd(victim, &["LLEN", &queue]) != "4" {
        assert!(Instant::now() < deadline, "the waiters never queued");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    // Another shard's lock, taken and released in a loop until service is
    // back on the victim's slots: what a failover costs the other shards.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let bystander = {
        let (backend, stop) = (backend.clone(), stop.clone());
        tokio::spawn(async move {
            let (mut ok, mut failed) = (0u32, 0u32);
            let r = req(&other, "bystander", 10 * SEC, Duration::ZERO);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                match backend.acquire(&r).await {
                    Ok(_) => {
                        ok += 1;
                        let _ = backend
                            .release(r.key(), Holder::owner_only(r.owner()))
                            .await;
                    }
                    Err(e) => {
                        assert!(unavailable(&e), "the other shard answered {e:?}");
                        failed += 1;
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            }
            (ok, failed)
        })
    };

    let killed = Instant::now();
    cluster.kill(victim);

    // The waiters: 503, bounded (nowhere near their max wait).
    for w in waiters {
        let (out, at) = w.await.unwrap();
        let err = out.expect_err("a waiter was granted the lock while its primary was down");
        assert!(unavailable(&err), "a waiter got {err:?}");
        let took = at - killed;
        eprintln!("waiter: 503 {took:?} after the kill");
        assert!(took < 5 * SEC, "a waiter took {took:?} to fail");
    }

    // Service again, by itself: a fresh lock on the victim's slots is
    // granted once the replica is promoted; until then only 503s.
    let r = req(&fresh, "fresh", 10 * SEC, Duration::ZERO);
    let mut refused = 0u32;
    let back = loop {
        match backend.acquire(&r).await {
            Ok(l) => break l,
            Err(e) => {
                assert!(unavailable(&e), "during the failover: {e:?}");
                refused += 1;
                assert!(
                    killed.elapsed() < 30 * SEC,
                    "no service 30 s after the kill"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    let downtime = killed.elapsed();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (ok, failed) = bystander.await.unwrap();
    eprintln!(
        "service back {downtime:?} after the kill ({refused} acquisitions refused with 503); \
         the other shard meanwhile: {ok} granted, {failed} refused"
    );
    backend
        .release(r.key(), Holder::owner_only(r.owner()))
        .await
        .unwrap();
    assert!(back.fence > 0);
    let new_primary = cluster.owner_of(
        cluster
            .cmd(cluster.live_port(), &["CLUSTER", "KEYSLOT", &queue])
            .parse()
            .unwrap(),
    );
    assert_ne!(new_primary, victim);

    // The failed waiters' queue entries are gone long before their max
    // wait (their requests left in the background once the shard was back):
    // a release must not hand the lock to a request that already got 503.
    let deadline = killed + MAX_WAIT / 2;
    loop {
        let len = cluster.cmd_for_key(&queue, &["LLEN", &queue]);
        if len == "0" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{len} failed waiters still queued {:?} after the kill",
            killed.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    eprintln!(
        "failed waiters left the queue {:?} after the kill",
        killed.elapsed()
    );

    // The confirmed lock survived the failover, with its owner and fence.
    let status = backend
        .status(holder.key())
        .await
        .unwrap()
        .expect("the confirmed lock was lost in the failover");
    assert_eq!(status.fence, lease.fence);
    let newcomer = req(&held, "newcomer", 5 * SEC, Duration::ZERO);
    match backend.acquire(&newcomer).await {
        Err(LockError::AcquisitionFailed { .. }) => {}
        other => panic!("a newcomer got {other:?} while the lock is held"),
    }
    backend
        .release(holder.key(), Holder::owner_only("holder"))
        .await
        .unwrap();
    // Fences keep increasing on the promoted replica.
    let after = req(&held, "after", 5 * SEC, 3 * SEC);
    let t0 = Instant::now();
    let next = backend.acquire(&after).await.unwrap();
    eprintln!("after the holder's release: granted in {:?}", t0.elapsed());
    assert!(
        next.fence > lease.fence,
        "{} <= {}",
        next.fence,
        lease.fence
    );
    backend
        .release(after.key(), Holder::owner_only("after"))
        .await
        .unwrap();
}
