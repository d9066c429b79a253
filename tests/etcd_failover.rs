//! etcd members lost under a holder and four queued waiters, each test on a
//! 3-member cluster of its own (heartbeat 50 ms, election timeout 500 ms):
//! the leader SIGKILLed (and restarted), the leader SIGSTOPped (a member cut
//! off: a partitioned minority, and the one the client talks to), every
//! client connection reset through a proxy.
//!
//! What must hold in each (the README's etcd guarantees):
//! - never two holders: the waiters take turns, checked by a counter each
//!   raises while it holds;
//! - fences strictly increase, from the confirmed holder's on;
//! - the grant confirmed before the fault survives it: the holder, owner and
//!   fence are still there after it, and a newcomer is refused;
//! - every failure during the fault is `LOCK_BACKEND_UNAVAILABLE` (fail
//!   closed), and service comes back by itself (nobody restarts the
//!   backend) within [`BACK_WITHIN`] of the first failure. Each test prints
//!   its figures (`FAULT …`), which RELIABILITY.md's etcd table reports.
//!
//! Plus: an acquisition whose reply is lost still expires at its TTL (its
//! lease would otherwise keep it as long as the process lives).
#![cfg(feature = "etcd")]

mod common;
#[allow(dead_code)]
#[path = "chaos/proxy.rs"]
mod proxy;

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::etcd_cluster::EtcdCluster;
use tokio::time::{Instant, sleep};
use tower_lock::backend::etcd::EtcdBackend;
use tower_lock::backend::{AcquireRequest, Holder};
use tower_lock::{LockBackend, LockError, LockKey};

const OP_TIMEOUT: Duration = Duration::from_millis(500);
/// The bound on the time from the first failure to service back.
const BACK_WITHIN: Duration = Duration::from_secs(5);
const LONG: Duration = Duration::from_secs(60);

fn req(name: &str, owner: &str, ttl: Duration, wait: Duration) -> AcquireRequest {
    AcquireRequest::new(LockKey::global(name).unwrap(), owner, ttl, wait).unwrap()
}

fn unavailable(e: &LockError) -> bool {
    matches!(e, LockError::BackendUnavailable(_))
}

#[derive(Clone, Copy, Debug)]
enum Fault {
    KillLeader,
    StopLeader,
    ResetConnections,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_killed_under_a_holder_and_waiters() {
    under(Fault::KillLeader).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_stopped_under_a_holder_and_waiters() {
    under(Fault::StopLeader).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_connection_reset_under_a_holder_and_waiters() {
    under(Fault::ResetConnections).await;
}

async fn under(fault: Fault) {
    tokio::time::timeout(Duration::from_secs(120), scenario(fault))
        .await
        .expect("the fault test hung");
}

/// What the waiters saw.
#[derive(Default)]
struct Turns {
    inside: AtomicUsize,
    fences: Mutex<Vec<u64>>,
}

async fn scenario(fault: Fault) {
    let cluster = EtcdCluster::start(3);
    let mut proxies = Vec::new();
    let endpoints = match fault {
        Fault::ResetConnections => {
            for &port in cluster.client_ports() {
                proxies.push(proxy::Proxy::start(port).await);
            }
            proxies
                .iter()
                .map(|p| format!("http://127.0.0.1:{}", p.port))
                .collect()
        }
        _ => cluster.endpoints(),
    };
    let backend = EtcdBackend::from_endpoints(&endpoints)
        .unwrap()
        .op_timeout(OP_TIMEOUT);
    let held = LockKey::global("held").unwrap();

    // The confirmed holder, and four waiters in another process's backend.
    let lease = backend
        .acquire(&req("held", "holder", LONG, Duration::ZERO))
        .await
        .unwrap();
    let turns = Arc::new(Turns::default());
    let mut waiters = Vec::new();
    for i in 0..4 {
        let waiting = EtcdBackend::from_endpoints(&endpoints)
            .unwrap()
            .op_timeout(OP_TIMEOUT);
        waiters.push(tokio::spawn(wait_turn(
            waiting,
            format!("w{i}"),
            turns.clone(),
        )));
        until_queued(&backend, &held, i + 1).await;
    }

    let start = Instant::now();
    let leader = cluster.leader().expect("a leader");
    match fault {
        Fault::KillLeader => cluster.kill(leader),
        Fault::StopLeader => cluster.stop(leader),
        Fault::ResetConnections => {}
    }
    // Probe with fresh locks every 25 ms until service is back (and for a
    // second at least, resetting connections meanwhile).
    let mut first_failure: Option<Duration> = None;
    let mut back: Option<Duration> = None;
    let mut n = 0;
    while back.is_none() || start.elapsed() < Duration::from_secs(1) {
        if let Fault::ResetConnections = fault
            && start.elapsed() < Duration::from_secs(1)
        {
            proxies.iter().for_each(proxy::Proxy::reset_all);
        }
        n += 1;
        let probe = req(&format!("probe{n}"), &format!("p{n}"), LONG, Duration::ZERO);
        match backend.acquire(&probe).await {
            Ok(l) => {
                // Back after the last failure (a probe may get through
                // before the fault bites, and fail after).
                if back.is_none() {
                    back = Some(if first_failure.is_some() {
                        start.elapsed()
                    } else {
                        Duration::ZERO
                    });
                }
                let _ = backend
                    .release(probe.key(), Holder::new(probe.owner(), l.fence))
                    .await;
            }
            Err(e) => {
                assert!(unavailable(&e), "{fault:?}: a probe failed with {e:?}");
                first_failure.get_or_insert(start.elapsed());
                back = None;
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{fault:?}: service never came back"
        );
        sleep(Duration::from_millis(25)).await;
    }
    let back = back.unwrap();
    if let Some(first) = first_failure {
        assert!(
            back - first <= BACK_WITHIN,
            "{fault:?}: back {back:?} after failing at {first:?}"
        );
    }
    eprintln!(
        "FAULT {fault:?}: first 503 at {:?}, service back at {back:?} after the fault",
        first_failure
    );

    // The confirmed grant survived: same holder and fence, a newcomer is
    // refused.
    let status = retry(|| backend.status(&held)).await.expect("still held");
    assert_eq!(
        (status.owner.as_str(), status.fence),
        ("holder", lease.fence)
    );
    let newcomer = backend
        .acquire(&req("held", "newcomer", LONG, Duration::ZERO))
        .await;
    assert!(
        matches!(newcomer, Err(LockError::AcquisitionFailed { .. })),
        "{fault:?}: {newcomer:?}"
    );

    match fault {
        Fault::KillLeader => cluster.restart(leader),
        Fault::StopLeader => cluster.resume(leader),
        Fault::ResetConnections => {}
    }
    retry(|| backend.release(&held, Holder::new("holder", lease.fence))).await;
    for w in waiters {
        w.await.unwrap();
    }
    let fences = turns.fences.lock().unwrap().clone();
    assert_eq!(fences.len(), 4, "{fault:?}: every waiter had its turn");
    let mut all = vec![lease.fence];
    all.extend(&fences);
    assert!(
        all.windows(2).all(|w| w[0] < w[1]),
        "{fault:?}: fences {all:?}"
    );
    eprintln!(
        "FAULT {fault:?}: grant kept (holder fence {}, a newcomer refused), fences after it {fences:?}",
        lease.fence
    );
    cluster.wait_ready(Duration::from_secs(20)).unwrap();
}

/// A waiter: waits for the lock (trying again after a `503`, as a client
/// would), holds it alone for a moment, gives it back.
async fn wait_turn(backend: EtcdBackend, owner: String, turns: Arc<Turns>) {
    let end = Instant::now() + Duration::from_secs(60);
    let lease = loop {
        match backend
            .acquire(&req("held", &owner, LONG, Duration::from_secs(40)))
            .await
        {
            Ok(lease) => break lease,
            Err(e) if unavailable(&e) && Instant::now() < end => {
                sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("{owner}: {e:?}"),
        }
    };
    assert_eq!(
        turns.inside.fetch_add(1, Ordering::SeqCst),
        0,
        "two holders"
    );
    turns.fences.lock().unwrap().push(lease.fence);
    sleep(Duration::from_millis(20)).await;
    turns.inside.fetch_sub(1, Ordering::SeqCst);
    let key = LockKey::global("held").unwrap();
    retry(|| backend.release(&key, Holder::new(&owner, lease.fence))).await;
}

/// `op` until it answers something else than `503` (within 30 s).
async fn retry<T, F, Fut>(mut op: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, LockError>>,
{
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        match op().await {
            Ok(v) => return v,
            Err(e) if unavailable(&e) && Instant::now() < end => {
                sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("{e:?}"),
        }
    }
}

async fn until_queued(backend: &EtcdBackend, key: &LockKey, n: usize) {
    for _ in 0..2000 {
        if let Ok(Some(s)) = backend.status(key).await
            && s.waiters >= n
        {
            return;
        }
        sleep(Duration::from_millis(5)).await;
    }
    panic!("{n} waiters never queued");
}

/// An acquisition whose reply is lost (the connection reset as etcd
/// answered): the caller gets `503`, the lock landed; it is freed at its
/// TTL, not kept by the process's lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_whose_reply_was_lost_expires_at_its_ttl() {
    let cluster = EtcdCluster::start(1);
    let proxy = proxy::Proxy::start(cluster.client_ports()[0]).await;
    let backend = EtcdBackend::from_endpoints([format!("http://127.0.0.1:{}", proxy.port)])
        .unwrap()
        .op_timeout(OP_TIMEOUT);
    let direct = EtcdBackend::from_endpoints(cluster.endpoints()).unwrap();
    // Warm up (connection, lease of the same TTL bucket), then lose a
    // reply: the first data etcd sends after the flag is set. That is the
    // acquisition's reply, unless other data came first: a lease
    // keep-alive's reply (then the acquisition succeeds, and is tried
    // again) or a frame etcd sent before running the call, whose reset
    // cancelled it (then a 503 and nothing landed: tried again, on a key of
    // its own, so that a late landing cannot be taken for this one's).
    // Long enough to outlive the failed call's op timeout and the status
    // read after it on a loaded machine (the holder's process frees the
    // lock at its TTL), short enough for the waiter's max wait below.
    let ttl = Duration::from_secs(3);
    let warm = req("warm", "w", ttl, Duration::ZERO);
    let l = backend.acquire(&warm).await.unwrap();
    backend
        .release(warm.key(), Holder::new("w", l.fence))
        .await
        .unwrap();
    let mut lost = None;
    for i in 0..10 {
        let attempt = req(&format!("lost-reply-{i}"), "ghost", ttl, Duration::ZERO);
        let key = attempt.key().clone();
        proxy.drop_next_reply();
        match backend.acquire(&attempt).await {
            Ok(l) => backend
                .release(&key, Holder::new("ghost", l.fence))
                .await
                .unwrap(),
            Err(e) => {
                assert!(unavailable(&e), "{e:?}");
                // Landed, with its reply lost?
                let landed = retry(|| direct.status(&key)).await;
                if landed.is_some_and(|s| s.owner == "ghost") {
                    lost = Some(key);
                    break;
                }
            }
        }
    }
    let key = lost.expect("no acquisition landed with its reply lost in 10 tries");
    // A waiter gets it when its TTL ends: the lease it is on is kept alive
    // as long as this process lives, and would keep it as long.
    let wait = AcquireRequest::new(key.clone(), "next", LONG, Duration::from_secs(10)).unwrap();
    let next = direct.acquire(&wait).await.unwrap();
    assert_eq!(
        direct.status(&key).await.unwrap().unwrap().fence,
        next.fence
    );
}

/// A waiter's queue entry that lands after its waiter left (its call's
/// reply was lost, or the call was cancelled in flight and etcd applied it
/// anyway) is never handed the lock: past its deadline (the waiter's max
/// wait), a release skips it, deletes it, and hands the lock to the live
/// waiter behind it at once. Without the deadline, the lock would go to
/// nobody for the entry's whole TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_entry_landing_after_its_waiter_left_is_skipped() {
    let cluster = EtcdCluster::start(1);
    let backend = EtcdBackend::from_endpoints(cluster.endpoints()).unwrap();
    let key = LockKey::global("late-entry").unwrap();
    let held = backend
        .acquire(&req("late-entry", "holder", LONG, Duration::ZERO))
        .await
        .unwrap();
    // The entry as a waiter's call writes it (module docs' key layout:
    // `<ttl ms> <attempt> <deadline ms> <owner>`), its deadline passed.
    let client = etcd_client::Client::connect(cluster.endpoints(), None)
        .await
        .unwrap();
    let lease = client.lease_client().grant(60, None).await.unwrap().id();
    let e = key.encoded(512);
    let entry = format!("tower-lock/{}:{e}/q/{:016x}", e.len(), 1u64);
    let past = std::time::SystemTime::now() - Duration::from_secs(1);
    let past_ms = past
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    client
        .kv_client()
        .put(
            entry,
            format!("60000 1 {past_ms} ghost"),
            Some(etcd_client::PutOptions::new().with_lease(lease)),
        )
        .await
        .unwrap();
    let waiter = tokio::spawn({
        let backend = backend.clone();
        async move {
            backend
                .acquire(&req("late-entry", "live", LONG, Duration::from_secs(10)))
                .await
        }
    });
    until_queued(&backend, &key, 2).await;
    backend
        .release(&key, Holder::new("holder", held.fence))
        .await
        .unwrap();
    let lease = waiter
        .await
        .unwrap()
        .expect("the live waiter gets the lock");
    assert!(lease.fence > held.fence);
    let status = backend.status(&key).await.unwrap().unwrap();
    assert_eq!(status.owner, "live");
    assert_eq!(status.waiters, 0, "the late entry was deleted");
}

/// A holder whose lease ran out (its process died or stopped) with a
/// waiter queued: the lock belongs to the waiter, not to a newcomer that
/// finds it free first. The newcomer is refused and hands the lock to the
/// oldest entry on its way (the waiter here is an entry only, as if its
/// process were busy elsewhere: nothing else would take the lock for it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newcomer_never_barges_past_the_queue_when_a_holders_lease_ran_out() {
    let cluster = EtcdCluster::start(1);
    let holder = EtcdBackend::from_endpoints(cluster.endpoints()).unwrap();
    let newcomer = EtcdBackend::from_endpoints(cluster.endpoints()).unwrap();
    let key = LockKey::global("orphan").unwrap();
    holder
        .acquire(&req("orphan", "holder", LONG, Duration::ZERO))
        .await
        .unwrap();
    let client = etcd_client::Client::connect(cluster.endpoints(), None)
        .await
        .unwrap();
    let e = key.encoded(512);
    let base = format!("tower-lock/{}:{e}/", e.len());
    // A waiter's entry (module docs' key layout), its max wait far ahead.
    let lease = client.lease_client().grant(60, None).await.unwrap().id();
    let until = std::time::SystemTime::now() + LONG;
    let until_ms = until
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    client
        .kv_client()
        .put(
            format!("{base}q/{:016x}", 1u64),
            format!("60000 1 {until_ms} queued"),
            Some(etcd_client::PutOptions::new().with_lease(lease)),
        )
        .await
        .unwrap();
    // The holder's process is gone: its lease runs out.
    let held = client
        .kv_client()
        .get(
            format!("{base}h/"),
            Some(etcd_client::GetOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    let holder_lease = held.kvs().first().expect("the holder key").lease();
    client.lease_client().revoke(holder_lease).await.unwrap();

    let barged = newcomer
        .acquire(&req("orphan", "newcomer", LONG, Duration::ZERO))
        .await;
    assert!(
        matches!(barged, Err(LockError::AcquisitionFailed { .. })),
        "a newcomer took a lock with a waiter queued: {barged:?}"
    );
    let status = newcomer.status(&key).await.unwrap().expect("handed over");
    assert_eq!(status.owner, "queued");
}

/// Waiters cancelled while queued (a client gone) leave the queue, and leave
/// no task behind: with nothing of theirs in flight, the leave is all there
/// is to do, whatever their max wait (an hour here). Counted as tasks alive
/// in the runtime: back to what it was before they came.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_waiters_leave_no_task_behind() {
    const WAITERS: usize = 16;
    let cluster = EtcdCluster::shared();
    let backend = EtcdBackend::from_endpoints(cluster.endpoints())
        .unwrap()
        .prefix(format!("cancelled-{}/", std::process::id()));
    let key = LockKey::global("k").unwrap();
    let long = Duration::from_secs(60);
    backend
        .acquire(&req("k", "holder", long, Duration::ZERO))
        .await
        .unwrap();
    // One waiter first, cancelled and gone: the watch stream, leases and
    // timers every waiter shares are up from here on.
    let warm = tokio::spawn({
        let backend = backend.clone();
        let r = req("k", "warm", long, Duration::from_secs(3600));
        async move { backend.acquire(&r).await }
    });
    until_queued(&backend, &key, 1).await;
    warm.abort();
    let _ = warm.await;
    until_queued_exactly(&backend, &key, 0).await;
    let metrics = tokio::runtime::Handle::current().metrics();
    let before = until_settled(&metrics).await;
    let waiters: Vec<_> = (0..WAITERS)
        .map(|i| {
            let backend = backend.clone();
            let r = req("k", &format!("w{i}"), long, Duration::from_secs(3600));
            tokio::spawn(async move { backend.acquire(&r).await })
        })
        .collect();
    until_queued(&backend, &key, WAITERS).await;
    // Every waiter past its join (its reply read: nothing of its own left in
    // flight) and watching: the count stops moving.
    until_settled(&metrics).await;
    for w in waiters {
        w.abort();
        let _ = w.await;
    }
    until_queued_exactly(&backend, &key, 0).await;
    let after = until_settled(&metrics).await;
    // (The client's own tasks, connections and timers, vary by a few; a
    // task per cancelled waiter, asleep for its max wait, adds 16.)
    assert!(
        after < before + WAITERS / 2,
        "{after} tasks alive after {WAITERS} cancelled waiters left, {before} before"
    );
    backend
        .release(&key, Holder::owner_only("holder"))
        .await
        .unwrap();
}

async fn until_queued_exactly(backend: &EtcdBackend, key: &LockKey, n: usize) {
    for _ in 0..2000 {
        if let Ok(Some(s)) = backend.status(key).await
            && s.waiters == n
        {
            return;
        }
        sleep(Duration::from_millis(5)).await;
    }
    panic!("the queue never had {n} waiters");
}

/// The number of tasks alive once it has stayed the same for a second
/// (leaves finishing, the client's connections settling).
async fn until_settled(metrics: &tokio::runtime::RuntimeMetrics) -> usize {
    let mut last = metrics.num_alive_tasks();
    let mut same = 0;
    while same < 50 {
        sleep(Duration::from_millis(20)).await;
        let now = metrics.num_alive_tasks();
        same = if now == last { same + 1 } else { 0 };
        last = now;
    }
    last
}
