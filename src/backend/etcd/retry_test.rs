//! Work retried through an outage goes again as soon as etcd answers.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::{Instant, sleep, sleep_until};

use super::EtcdBackend;
use super::etcd_cluster::EtcdCluster;
use crate::backend::LockBackend;
use crate::key::LockKey;
use crate::spec::AcquireRequest;

/// A lock whose TTL runs out while every member is stopped: its expiry
/// fails, and then pauses for longer than the test runs. Once etcd answers
/// a call of the process again, the expiry goes at once and the lock is
/// free (with the pause slept out, it would stay held for two minutes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expiry_held_up_by_an_outage_goes_when_etcd_answers_again() {
    let cluster = EtcdCluster::start(3);
    let op_timeout = Duration::from_secs(1);
    let mut backend = EtcdBackend::from_endpoints(cluster.endpoints())
        .unwrap()
        .op_timeout(op_timeout);
    Arc::get_mut(&mut backend.shared)
        .expect("not shared yet")
        .conn
        .set_pauses(Duration::from_secs(120), Duration::from_secs(120));
    let key = LockKey::global("k").unwrap();
    let ttl = Duration::from_millis(5500);
    let req = AcquireRequest::new(key.clone(), "holder", ttl, Duration::ZERO).unwrap();
    // The expiry is armed for a moment between these two, TTL later.
    let asked = Instant::now();
    backend.acquire(&req).await.unwrap();
    let granted = Instant::now();
    // Every member stopped a second before the TTL ends. The lock's lease
    // (8 s, kept alive every 500 ms until then) outlives the outage and
    // the newcomer's wait below: only the expiry can free the lock.
    sleep_until(asked + ttl - Duration::from_secs(1)).await;
    for i in 0..cluster.len() {
        cluster.stop(i);
    }
    // The expiry's first try (at the TTL's end, bounded by the op
    // timeout) fails: the members stay stopped until after it...
    sleep_until(granted + ttl + op_timeout + Duration::from_millis(300)).await;
    // ...and it did not land before they were stopped.
    let (start, end) = backend.keys(&key).holders();
    assert!(
        backend
            .shared
            .expiries
            .known(&start, &end, None, |_| true)
            .is_some(),
        "the expiry is still to land"
    );
    for i in 0..cluster.len() {
        cluster.resume(i);
    }
    // Calls of this process get answers again (to these, or to a lease
    // keep-alive)...
    let back = Instant::now();
    while let Err(e) = backend.status(&key).await {
        assert!(
            back.elapsed() < Duration::from_secs(20),
            "etcd is not back after 20 s: {e}"
        );
        sleep(Duration::from_millis(50)).await;
    }
    // ...and the expiry, woken by them, frees the lock for a newcomer
    // (whose own max wait ends long before the expiry's pause, or the
    // lease, would).
    let newcomer =
        AcquireRequest::new(key.clone(), "newcomer", ttl, Duration::from_secs(2)).unwrap();
    let granted = backend.acquire(&newcomer).await;
    assert!(
        granted.is_ok(),
        "the expired lock still held 2 s after etcd answered again: {granted:?}"
    );
}
