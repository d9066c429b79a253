//! Work retried through an outage goes again as soon as etcd answers.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::{Instant, sleep, sleep_until};

use super::super::EtcdBackend;
use super::super::etcd_cluster::EtcdCluster;
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

/// A connection that never connects (nothing listens on port 1): only its
/// failure and answer signals are used.
fn conn(first: Duration, max: Duration) -> super::super::conn::Conn {
    let mut conn = super::super::conn::Conn::new(
        vec!["http://127.0.0.1:1".into()],
        etcd_client::ConnectOptions::new(),
    );
    conn.set_pauses(first, max);
    conn
}

/// An answer after a failure ends a pause once 50 ms of it have passed;
/// the pause after one cut short runs out whatever answers come (etcd
/// answering other calls but not these must not turn the back-off into a
/// try every 50 ms); one not cut short may be cut again.
#[tokio::test(start_paused = true)]
async fn answers_cut_pauses_short_but_never_two_in_a_row() {
    let conn = conn(Duration::from_secs(10), Duration::from_secs(10));
    let mut retry = super::Retry::new(&conn);
    let timed = async |retry: &mut super::Retry| {
        let t0 = Instant::now();
        let answer = async {
            sleep(Duration::from_millis(10)).await;
            conn.failed(0);
            conn.answered();
            std::future::pending::<()>().await
        };
        tokio::select! {
            () = retry.pause() => {}
            () = answer => {}
        }
        t0.elapsed()
    };
    assert_eq!(
        timed(&mut retry).await,
        Duration::from_millis(50),
        "cut short"
    );
    assert_eq!(timed(&mut retry).await, Duration::from_secs(10), "runs out");
    assert_eq!(
        timed(&mut retry).await,
        Duration::from_millis(50),
        "cut short again"
    );
    // No answer: a pause runs out.
    let mut retry = super::Retry::new(&conn);
    let t0 = Instant::now();
    retry.pause().await;
    assert_eq!(t0.elapsed(), Duration::from_secs(10));
}
