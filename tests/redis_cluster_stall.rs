//! One slow shard must not hold back the others: a Redis Cluster (3
//! primaries, started per test) with one primary stalled (`CLIENT PAUSE`:
//! it keeps its cluster bus, so nobody fails it over) or blocked in `WAIT`.
//!
//! - a script missing on the nodes (first use, `SCRIPT FLUSH`, a restart)
//!   is loaded on the slot's own node, not on every primary;
//! - the watchdog renews the locks of healthy shards while one shard
//!   stalls;
//! - `min_replicas`' `WAIT` holds back no other call on its node.
#![cfg(feature = "redis-cluster")]

mod common;

use std::time::Duration;

use common::redis_cluster::RedisCluster;
use tokio::time::Instant;
use tower_lock::backend::redis::RedisBackend;
use tower_lock::backend::{AcquireRequest, Holder};
use tower_lock::{JobSpec, LockBackend, LockError, LockKey, OwnedLock, SharedBackend};

const SEC: Duration = Duration::from_secs(1);

fn backend(cluster: &RedisCluster) -> RedisBackend {
    RedisBackend::from_cluster_urls(cluster.urls().iter().map(String::as_str)).unwrap()
}

fn req(name: &str, owner: &str, ttl: Duration) -> AcquireRequest {
    AcquireRequest::new(LockKey::global(name).unwrap(), owner, ttl, Duration::ZERO).unwrap()
}

/// `NOSCRIPT` on a healthy shard while another is stalled: the call loads
/// the script where it runs, and is granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_script_needs_only_the_slots_own_node() {
    let cluster = RedisCluster::start();
    // Generous (a loaded machine must not fail the healthy shard), and
    // shorter than the stall, which an all-primaries load would wait out.
    let backend = backend(&cluster).op_timeout(3 * SEC);
    let primaries = cluster.primaries();
    let (stalled, healthy) = (primaries[0], primaries[1]);
    let name = cluster.lock_name_on(healthy, "k");
    // Connected, with every script loaded everywhere; then forgotten.
    backend
        .status(&LockKey::global(&name).unwrap())
        .await
        .unwrap();
    for &p in &primaries {
        assert_eq!(cluster.cmd(p, &["SCRIPT", "FLUSH"]), "OK");
    }

    cluster.pause(stalled, 8_000);
    let r = req(&name, "o", 10 * SEC);
    let lease = backend
        .acquire(&r)
        .await
        .expect("a healthy shard refused while another one stalled");
    backend
        .release(r.key(), Holder::new("o", lease.fence))
        .await
        .unwrap();
}

/// Two watched locks, one on a shard that stalls for longer than the other
/// lock's TTL: the other is renewed all along. The stalled one's renewals
/// fall due with the other's (the watchdog renews a little early to share a
/// round), and wait up to the op timeout: neither may hold back the other
/// lock's, whose renewal is scheduled again as soon as it is answered (an
/// 800-ms lock, renewed from the round's end, ran out while the stalled
/// renewal waited).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_shard_holds_back_only_its_own_renewals() {
    let cluster = RedisCluster::start();
    let shared = SharedBackend::new(backend(&cluster));
    let primaries = cluster.primaries();
    let (stalled, healthy) = (primaries[0], primaries[1]);
    let job = |name: &str, ttl_ms| JobSpec::new(name, Duration::from_millis(ttl_ms));
    let mut slow = OwnedLock::acquire(
        shared.clone(),
        &job(&cluster.lock_name_on(stalled, "s"), 6_000),
    )
    .await
    .unwrap();
    let mut fast = OwnedLock::acquire(
        shared.clone(),
        &job(&cluster.lock_name_on(healthy, "f"), 800),
    )
    .await
    .unwrap();
    slow.start_watchdog();
    fast.start_watchdog();

    cluster.pause(stalled, 5_000);
    // Past the stalled lock's first renewals (from 1.5 s on) and their op
    // timeouts (2 s): the healthy shard's lock must never be lost meanwhile.
    tokio::select! {
        () = fast.lost() => panic!("the healthy shard's lock was lost while another shard stalled"),
        () = tokio::time::sleep(Duration::from_millis(4_500)) => {}
    }
    let status = fast.status().await.unwrap().expect("still held");
    assert_eq!(status.fence, fast.fence());
    fast.release().await.unwrap();
    let _ = slow.release().await;
}

/// With a replica gone, one acquisition blocks in `WAIT` on its primary;
/// another lock on that primary, with less time left than the `WAIT`, is
/// renewed at once and stays held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_for_replicas_holds_back_no_other_call_on_its_node() {
    let cluster = RedisCluster::start_with(1);
    let plain = backend(&cluster);
    let confirmed = plain.clone().min_replicas(1, Duration::from_millis(1500));
    let primary = cluster.primaries()[0];
    let primary_id = cluster
        .nodes()
        .into_iter()
        .find(|n| n.port == primary)
        .unwrap()
        .id;
    let replica = cluster
        .nodes()
        .into_iter()
        .find(|n| n.primary_id.as_deref() == Some(primary_id.as_str()))
        .expect("a replica of the primary")
        .port;
    let short = req(
        &cluster.lock_name_on(primary, "short"),
        "o",
        Duration::from_millis(900),
    );
    let slow = req(&cluster.lock_name_on(primary, "slow"), "s", 30 * SEC);
    let lease = confirmed.acquire(&short).await.unwrap();

    cluster.kill(replica);
    let waiting = {
        let confirmed = confirmed.clone();
        tokio::spawn(async move { confirmed.acquire(&slow).await })
    };
    let deadline = Instant::now() + 5 * SEC;
    while !cluster
        .cmd(primary, &["CLIENT", "LIST"])
        .contains("cmd=wait")
    {
        assert!(
            Instant::now() < deadline,
            "nobody ever waited for the replica"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let renewed = confirmed
        .extend(
            short.key(),
            Holder::new("o", lease.fence),
            Duration::from_millis(900),
        )
        .await
        .expect("the renewal waited behind another acquisition's WAIT");
    assert_eq!(renewed.fence, lease.fence);
    let err = waiting.await.unwrap().unwrap_err();
    assert!(matches!(err, LockError::BackendUnavailable(_)), "{err:?}");
}
