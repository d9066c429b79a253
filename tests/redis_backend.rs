//! `RedisBackend` against a real, private redis-server: semantics, waiting
//! and hand-off, and faults. Timing goals belong to the benchmarks; here only
//! bounds that ARE the behaviour are asserted, with generous slack.
#![cfg(feature = "redis")]

mod common;

use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tower_lock::backend::Holder;

use common::proxy::Proxy;
use common::redis_server::{RedisServer, monitor_until};
use tokio::time::Instant;
use tower_lock::backend::redis::RedisBackend;
use tower_lock::backend::{AcquireRequest, FlightPublish, FlightStart, Lease};
use tower_lock::{LockBackend, LockError, LockKey, LockKind};

const SEC: Duration = Duration::from_secs(1);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn backend(server: &RedisServer) -> RedisBackend {
    RedisBackend::from_url(&server.url()).unwrap()
}

fn key(name: &str) -> LockKey {
    LockKey::global(name).unwrap()
}

fn req(name: &str, owner: &str, ttl: Duration, wait: Duration) -> AcquireRequest {
    AcquireRequest::new(key(name), owner, ttl, wait).unwrap()
}

/// The stored key of the global lock `name` with the default prefix.
fn stored(name: &str, suffix: &str) -> String {
    format!("lock:{{g:{name}}}{suffix}")
}

/// Wait until `n` waiters are queued on `name` (a condition, not a guess).
async fn queued(server: &RedisServer, name: &str, n: usize) {
    let deadline = Instant::now() + 5 * SEC;
    loop {
        let len: usize = server.cmd(&["LLEN", &stored(name, ":q")]).parse().unwrap();
        if len == n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{len} waiters queued, expected {n}"
        );
        tokio::time::sleep(ms(2)).await;
    }
}

/// One acquisition in a task of its own (a waiter).
fn spawn_acquire(
    b: &RedisBackend,
    req: AcquireRequest,
) -> tokio::task::JoinHandle<Result<Lease, LockError>> {
    let b = b.clone();
    tokio::spawn(async move { b.acquire(&req).await })
}

/// The lease a spawned acquisition got, within 5 s (a waiter that is never
/// woken fails the test instead of hanging it).
async fn granted(waiter: tokio::task::JoinHandle<Result<Lease, LockError>>) -> Lease {
    tokio::time::timeout(5 * SEC, waiter)
        .await
        .expect("the waiter was not granted the lock within 5 s")
        .expect("the waiter task panicked")
        .expect("the waiter's acquisition failed")
}

/// Make `b`'s wake-up subscription before a test's waiter comes: one wait
/// on a lock `direct` holds, until handed over. A waiter queues with its
/// first attempt, subscription or not; after this, its queue entry means it
/// listens too (it registers before that attempt when the subscription is
/// up).
async fn subscribe_first(direct: &RedisBackend, b: &RedisBackend) {
    let held = direct
        .acquire(&req("warm-up", "direct", 30 * SEC, Duration::ZERO))
        .await
        .unwrap();
    let waiter = spawn_acquire(b, req("warm-up", "b", 30 * SEC, 10 * SEC));
    let deadline = Instant::now() + 5 * SEC;
    while direct
        .status(&key("warm-up"))
        .await
        .unwrap()
        .is_none_or(|s| s.waiters == 0)
    {
        assert!(Instant::now() < deadline, "the warm-up waiter never queued");
        tokio::time::sleep(ms(2)).await;
    }
    direct
        .release(&key("warm-up"), Holder::new("direct", held.fence))
        .await
        .unwrap();
    let lease = granted(waiter).await;
    b.release(&key("warm-up"), Holder::new("b", lease.fence))
        .await
        .unwrap();
}

fn unavailable<T: std::fmt::Debug>(r: Result<T, LockError>) -> bool {
    matches!(r, Err(LockError::BackendUnavailable(_)))
}

// ---------------------------------------------------------------- semantics

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_status_release() {
    let server = RedisServer::start();
    let b = backend(&server);
    let r = req("a", "alice", 10 * SEC, Duration::ZERO);
    let before = SystemTime::now();
    let lease = b.acquire(&r).await.unwrap();
    assert!(lease.fence >= 1);
    assert_eq!(lease.ttl, 10 * SEC);
    assert_eq!(
        lease.expires_at.duration_since(lease.acquired_at).unwrap(),
        10 * SEC
    );
    // Server clock, same machine: sanity only.
    let skew = lease
        .acquired_at
        .duration_since(before)
        .unwrap_or_else(|e| e.duration());
    assert!(skew < 5 * SEC, "acquired_at is {skew:?} away from now");

    let st = b.status(r.key()).await.unwrap().expect("held");
    assert_eq!(st.owner, "alice");
    assert_eq!(st.fence, lease.fence);
    assert_eq!(st.acquired_at, lease.acquired_at);
    assert!(st.ttl_remaining <= 10 * SEC && st.ttl_remaining > 9 * SEC);

    b.release(r.key(), Holder::owner_only("alice"))
        .await
        .unwrap();
    assert_eq!(b.status(r.key()).await.unwrap(), None);
    assert_eq!(
        b.release(r.key(), Holder::owner_only("alice")).await,
        Err(LockError::NotFound)
    );
    // The lock key is gone; the slot's fence counter stays (no TTL).
    assert_eq!(server.cmd(&["EXISTS", &stored("a", "")]), "0");
    assert_eq!(server.cmd(&["PTTL", &b.fence_counter_key(r.key())]), "-1");
}

/// The fast path reports times from the caller's clock, read before the
/// request: the reported expiry is never later than the server's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reported_expiry_is_never_later_than_the_servers() {
    let server = RedisServer::start();
    let b = backend(&server);
    for i in 0..20 {
        let name = format!("x{i}");
        let lease = b
            .acquire(&req(&name, "alice", 10 * SEC, Duration::ZERO))
            .await
            .unwrap();
        // PEXPIRETIME: the absolute expiry on the server, in Unix ms.
        let server_expiry: u64 = server
            .cmd(&["PEXPIRETIME", &stored(&name, "")])
            .parse()
            .unwrap();
        let reported = lease
            .expires_at
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        assert!(
            reported <= server_expiry,
            "reported {reported} ms, server {server_expiry} ms"
        );
        assert!(
            server_expiry - reported < 5_000,
            "{server_expiry} - {reported}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_lock_fails_with_holders_remaining_ttl() {
    let server = RedisServer::start();
    let b = backend(&server);
    b.acquire(&req("a", "alice", 10 * SEC, Duration::ZERO))
        .await
        .unwrap();
    let err = b
        .acquire(&req("a", "bob", SEC, Duration::ZERO))
        .await
        .unwrap_err();
    let LockError::AcquisitionFailed {
        retry_after: Some(left),
    } = err
    else {
        panic!("{err:?}");
    };
    assert!(left <= 10 * SEC && left > 9 * SEC, "{left:?}");
    // Not queued: no wait was allowed.
    assert_eq!(server.cmd(&["EXISTS", &stored("a", ":q")]), "0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_owner_cannot_release_or_extend() {
    let server = RedisServer::start();
    let b = backend(&server);
    let lease = b
        .acquire(&req("a", "alice", 10 * SEC, Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(
        b.release(&key("a"), Holder::owner_only("bob")).await,
        Err(LockError::OwnershipMismatch)
    );
    assert_eq!(
        b.extend(&key("a"), Holder::owner_only("bob"), SEC).await,
        Err(LockError::OwnershipMismatch)
    );
    let st = b.status(&key("a")).await.unwrap().unwrap();
    assert_eq!((st.owner.as_str(), st.fence), ("alice", lease.fence));
    assert_eq!(
        b.extend(&key("nothing"), Holder::owner_only("bob"), SEC)
            .await,
        Err(LockError::NotFound)
    );
    assert_eq!(
        b.release(&key("nothing"), Holder::owner_only("bob")).await,
        Err(LockError::NotFound)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_that_is_a_suffix_of_the_holder_is_refused() {
    // The release script matches the holder as the value's tail: a shorter
    // owner that ends the holder's must not pass, nor one with spaces that
    // spans the value's other fields, on the fast path (flag 0) or with a
    // waiter queued (flag 1).
    let server = RedisServer::start();
    let b = backend(&server);
    let lease = b
        .acquire(&req("s", "worker-ab", 10 * SEC, Duration::ZERO))
        .await
        .unwrap();
    let fence = lease.fence;
    let value = server.cmd(&["GET", &stored("s", "")]);
    let tail_with_spaces = value.split_once(' ').unwrap().1.to_owned();
    let refused = |queued: bool| {
        let b = b.clone();
        let tail = tail_with_spaces.clone();
        async move {
            for owner in ["ab", "b", "-ab", "- worker-ab", " worker-ab", tail.as_str()] {
                assert_eq!(
                    b.release(&key("s"), Holder::owner_only(owner)).await,
                    Err(LockError::OwnershipMismatch),
                    "release by {owner:?}, queued {queued}"
                );
                assert_eq!(
                    b.extend(&key("s"), Holder::owner_only(owner), SEC).await,
                    Err(LockError::OwnershipMismatch),
                    "extend by {owner:?}, queued {queued}"
                );
            }
            assert_eq!(
                b.release(&key("s"), Holder::owner_only("")).await,
                Err(LockError::OwnershipMismatch)
            );
            let st = b.status(&key("s")).await.unwrap().unwrap();
            assert_eq!((st.owner.as_str(), st.fence), ("worker-ab", fence));
        }
    };
    refused(false).await;
    let waiter = spawn_acquire(&b, req("s", "waiter", 10 * SEC, 10 * SEC));
    queued(&server, "s", 1).await;
    refused(true).await;
    b.release(&key("s"), Holder::owner_only("worker-ab"))
        .await
        .unwrap();
    let handed = granted(waiter).await;
    assert!(handed.fence > lease.fence);
    assert_eq!(
        b.release(&key("s"), Holder::owner_only("r")).await,
        Err(LockError::OwnershipMismatch)
    );
    b.release(&key("s"), Holder::owner_only("waiter"))
        .await
        .unwrap();
    assert_eq!(
        b.release(&key("s"), Holder::owner_only("waiter")).await,
        Err(LockError::NotFound)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_of_fifteen_digits_and_more_are_stored_exactly() {
    // The fast path writes the fence with `..` below 1e14 (Lua's %.14g) and
    // with `%d` from there on.
    let server = RedisServer::start();
    let b = backend(&server);
    server.cmd(&["SET", &b.fence_counter_key(&key("big")), "99999999999998"]);
    for expected in [
        99_999_999_999_999_u64,
        100_000_000_000_000,
        100_000_000_000_001,
    ] {
        let lease = b
            .acquire(&req("big", "o", 10 * SEC, Duration::ZERO))
            .await
            .unwrap();
        assert_eq!(lease.fence, expected);
        let st = b.status(&key("big")).await.unwrap().unwrap();
        assert_eq!((st.owner.as_str(), st.fence), ("o", expected));
        assert_eq!(
            b.extend(&key("big"), Holder::owner_only("o"), SEC)
                .await
                .unwrap()
                .fence,
            expected
        );
        b.release(&key("big"), Holder::owner_only("o"))
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_increases_across_release_expiry_and_instances() {
    let server = RedisServer::start();
    let b1 = backend(&server);
    let b2 = backend(&server).op_timeout(SEC);
    let mut fences = Vec::new();
    for i in 0..3 {
        let b = if i % 2 == 0 { &b1 } else { &b2 };
        fences.push(
            b.acquire(&req("f", "o", SEC, Duration::ZERO))
                .await
                .unwrap()
                .fence,
        );
        b.release(&key("f"), Holder::owner_only("o")).await.unwrap();
    }
    // Expiry instead of release.
    fences.push(
        b1.acquire(&req("f", "x", ms(30), Duration::ZERO))
            .await
            .unwrap()
            .fence,
    );
    tokio::time::sleep(ms(60)).await;
    fences.push(
        b2.acquire(&req("f", "y", ms(30), Duration::ZERO))
            .await
            .unwrap()
            .fence,
    );
    // Force release.
    assert!(b1.force_release(&key("f")).await.unwrap());
    fences.push(
        b1.acquire(&req("f", "z", SEC, Duration::ZERO))
            .await
            .unwrap()
            .fence,
    );
    assert!(fences.windows(2).all(|w| w[0] < w[1]), "{fences:?}");
}

/// A counter left per key by a version before per-slot counters is
/// migrated on first use: the fence exceeds both counters, then the per-key
/// one goes. On the fast path's slow twin (first acquire), on a hand-off and
/// when the slot's counter is already the larger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn legacy_per_key_counters_are_migrated_on_first_use() {
    let server = RedisServer::start();
    let b = backend(&server);
    let acquire = |name: &'static str| {
        let b = b.clone();
        async move {
            b.acquire(&req(name, "o", 10 * SEC, Duration::ZERO))
                .await
                .unwrap()
                .fence
        }
    };

    // The legacy counter is ahead of the slot's.
    server.cmd(&["SET", &stored("old", ":fence"), "1000"]);
    assert_eq!(acquire("old").await, 1001);
    assert_eq!(server.cmd(&["EXISTS", &stored("old", ":fence")]), "0");
    assert_eq!(
        server.cmd(&["GET", &b.fence_counter_key(&key("old"))]),
        "1001"
    );
    b.release(&key("old"), Holder::owner_only("o"))
        .await
        .unwrap();
    assert_eq!(acquire("old").await, 1002);
    b.release(&key("old"), Holder::owner_only("o"))
        .await
        .unwrap();

    // The slot's counter is ahead: it wins, the legacy one still goes.
    server.cmd(&["SET", &b.fence_counter_key(&key("ahead")), "5000"]);
    server.cmd(&["SET", &stored("ahead", ":fence"), "10"]);
    assert_eq!(acquire("ahead").await, 5001);
    assert_eq!(server.cmd(&["EXISTS", &stored("ahead", ":fence")]), "0");
    b.release(&key("ahead"), Holder::owner_only("o"))
        .await
        .unwrap();

    // A hand-off draws its fence through the same migration.
    let held = acquire("h").await;
    let waiter = spawn_acquire(&b, req("h", "w", 10 * SEC, 5 * SEC));
    queued(&server, "h", 1).await;
    let legacy = (held + 100).to_string();
    server.cmd(&["SET", &stored("h", ":fence"), &legacy]);
    b.release(&key("h"), Holder::owner_only("o")).await.unwrap();
    assert_eq!(granted(waiter).await.fence, held + 101);
    assert_eq!(server.cmd(&["EXISTS", &stored("h", ":fence")]), "0");
}

/// A process of the version before per-slot counters (its own acquire and
/// release scripts, tests/fixtures/per_key_fences), locking a key in turns
/// with this version, as during a rolling upgrade.
struct PreviousVersion<'a>(&'a RedisServer);

impl PreviousVersion<'_> {
    /// Acquire `name` (free, nobody queued) and release it: its fence.
    fn cycle(&self, name: &str, owner: &str) -> u64 {
        let keys = [
            stored(name, ""),
            stored(name, ":fence"),
            stored(name, ":q"),
            stored(name, ":w"),
        ];
        let tail = format!("1 - 1 {owner}");
        let mut args = vec![
            "EVAL",
            include_str!("fixtures/per_key_fences/acquire.lua"),
            "4",
        ];
        args.extend(keys.iter().map(String::as_str));
        args.extend(["10000", tail.as_str()]);
        let fence = self
            .0
            .cmd(&args)
            .parse()
            .expect("the old fast path's fence");
        let mut args = vec![
            "EVAL",
            include_str!("fixtures/per_key_fences/release.lua"),
            "4",
        ];
        args.extend(keys.iter().map(String::as_str));
        args.push(owner);
        assert_eq!(self.0.cmd(&args), "1");
        fence
    }
}

/// (Issue 27.4) A rolling upgrade: the previous version and this one lock
/// the same keys in turns. With the old per-lock counters kept in step,
/// every fence is above every earlier one, whichever version gave it
/// (deleting the old counter let the old version count again from 1: one
/// key's fences were 1, 2, 3, 4, 1, 2, 3, 4).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_never_repeat_beside_the_previous_version() {
    let server = RedisServer::start();
    let new = backend(&server).keep_legacy_fence_counters(true);
    let old = PreviousVersion(&server);
    let cycle = |name: &'static str, owner: &'static str| {
        let new = new.clone();
        async move {
            let lease = new
                .acquire(&req(name, owner, 10 * SEC, Duration::ZERO))
                .await
                .unwrap();
            new.release(&key(name), Holder::new(owner, lease.fence))
                .await
                .unwrap();
            lease.fence
        }
    };
    // New first on a fresh key, then old, in turns; and old first.
    for (name, new_first) in [("fresh", true), ("used", false)] {
        let mut fences = Vec::new();
        for round in 0..4 {
            for _ in 0..4 {
                if (round % 2 == 0) == new_first {
                    fences.push(cycle(name, "new").await);
                } else {
                    fences.push(old.cycle(name, "old"));
                }
            }
        }
        assert!(
            fences.windows(2).all(|w| w[0] < w[1]),
            "{name}: fences in acquisition order {fences:?}"
        );
    }
    // Waiters handed the lock draw through the same counter.
    let held = cycle("h", "new").await;
    let holder = new
        .acquire(&req("h", "a", 10 * SEC, Duration::ZERO))
        .await
        .unwrap();
    let waiter = spawn_acquire(&new, req("h", "w", 10 * SEC, 5 * SEC));
    queued(&server, "h", 1).await;
    new.release(&key("h"), Holder::new("a", holder.fence))
        .await
        .unwrap();
    let handed = granted(waiter).await.fence;
    new.release(&key("h"), Holder::new("w", handed))
        .await
        .unwrap();
    let after = old.cycle("h", "old");
    assert!(held < holder.fence && holder.fence < handed && handed < after);
}

/// With the owner index on, an acquisition that may wait forever
/// (`Duration::MAX`) still leaves an index that expires: Redis refuses
/// expiry times past its range, and the index was then left without one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_wait_still_leaves_an_index_that_expires() {
    let server = RedisServer::start();
    let b = backend(&server).index_owners(true);
    let r = req("endless", "patient", 30 * SEC, Duration::MAX);
    let lease = b.acquire(&r).await.unwrap();
    let pttl: i64 = server.cmd(&["PTTL", "lock:o:{patient}"]).parse().unwrap();
    assert!(pttl > 0, "the owner index has no expiry ({pttl})");
    b.release(&key("endless"), Holder::new("patient", lease.fence))
        .await
        .unwrap();
}

/// With the owner index on, a release's index update (a "drop") whose
/// reply is lost is not sent again: a second run would take the count of
/// the owner's other hold on the key and drop the entry of a lock still
/// held, hiding it from lookups (an entry too many, the price of not
/// sending it again, is checked and cleaned up by a lookup).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_index_drop_whose_reply_is_lost_keeps_the_other_holds_entry() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port()).await;
    let b = RedisBackend::from_url(&proxy.redis_url())
        .unwrap()
        .index_owners(true);
    let shared = || {
        AcquireRequest::new(key("doc"), "o", 30 * SEC, Duration::ZERO)
            .unwrap()
            .with_kind(LockKind::Shared)
            .unwrap()
    };
    // Every script loaded (a first call sends a script's text, which
    // names "drop" too).
    let warm = b.acquire(&shared()).await.unwrap();
    b.release(&key("doc"), Holder::new("o", warm.fence))
        .await
        .unwrap();
    let first = b.acquire(&shared()).await.unwrap();
    let _second = b.acquire(&shared()).await.unwrap();
    assert_eq!(b.held_by("o", 10).await.unwrap().len(), 2, "two holds");

    proxy.hold_carrying(b"drop");
    let release = tokio::spawn({
        let b = b.clone();
        async move { b.release(&key("doc"), Holder::new("o", first.fence)).await }
    });
    proxy.carried(1).await;
    proxy.reset_next_reply();
    proxy.let_go_all();
    release
        .await
        .unwrap()
        .expect("the release itself was answered");
    proxy.resets(1).await;
    assert_eq!(
        b.held_by("o", 10).await.unwrap().len(),
        1,
        "the index entry of the hold still held was dropped"
    );
}

/// (Issue 27.6) With the owner index on, refused acquisitions (a busy lock
/// answered at once, or a waiter whose max wait ran out) leave no index
/// behind: only what was granted is indexed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_acquisitions_leave_no_owner_index() {
    let server = RedisServer::start();
    let b = backend(&server).index_owners(true);
    let held = b
        .acquire(&req("busy", "holder", 30 * SEC, Duration::ZERO))
        .await
        .unwrap();
    for i in 0..50 {
        let r = req("busy", &format!("refused-{i}"), 30 * SEC, Duration::ZERO);
        let refused = b.acquire(&r).await;
        assert!(
            matches!(refused, Err(LockError::AcquisitionFailed { .. })),
            "{refused:?}"
        );
    }
    for i in 0..3 {
        let r = req("busy", &format!("waited-{i}"), 30 * SEC, ms(20));
        let refused = b.acquire(&r).await;
        assert!(
            matches!(refused, Err(LockError::Timeout { .. })),
            "{refused:?}"
        );
    }
    // Another acquisition under the holder's own token (a reused custom
    // owner) is refused too, and must not take the holder's entry along.
    let again = b
        .acquire(&req("busy", "holder", 30 * SEC, Duration::ZERO))
        .await;
    assert!(
        matches!(again, Err(LockError::AcquisitionFailed { .. })),
        "{again:?}"
    );
    assert_eq!(
        server.cmd(&["KEYS", "lock:o:*"]),
        "lock:o:{holder}",
        "index entries of refused acquisitions"
    );
    let found = b.held_by("holder", 10).await.unwrap();
    assert_eq!(found.len(), 1);
    b.release(&key("busy"), Holder::new("holder", held.fence))
        .await
        .unwrap();
    assert_eq!(
        server.cmd(&["KEYS", "lock:o:*"]),
        "",
        "released: no index left"
    );
}

/// Locking 10^5 distinct keys leaves at most one counter per hash slot
/// behind (per-key counters would leave 10^5).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distinct_keys_leave_a_bounded_number_of_keys() {
    const KEYS: usize = 100_000;
    let server = RedisServer::start();
    let b = backend(&server);
    let mut names = (0..KEYS).map(|i| format!("order-{i}"));
    loop {
        let batch: Vec<String> = names.by_ref().take(500).collect();
        // (Checked before spawning, as the loop's end.)
        if batch.is_empty() {
            break;
        }
        let cycles = batch.into_iter().map(|name| {
            let b = b.clone();
            async move {
                let r = AcquireRequest::new(key(&name), "o", 10 * SEC, Duration::ZERO).unwrap();
                b.acquire(&r).await.unwrap();
                b.release(r.key(), Holder::owner_only("o")).await.unwrap();
            }
        });
        let handles: Vec<_> = cycles.map(tokio::spawn).collect();
        for h in handles {
            h.await.unwrap();
        }
    }
    let left: usize = server.cmd(&["DBSIZE"]).parse().unwrap();
    assert!(
        left <= 16_384,
        "{left} keys left after locking {KEYS} distinct keys"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_replaces_ttl_on_the_server_and_never_revives() {
    let server = RedisServer::start();
    let b = backend(&server);
    let lease = b
        .acquire(&req("e", "alice", 10 * SEC, Duration::ZERO))
        .await
        .unwrap();

    let shorter = b
        .extend(&key("e"), Holder::owner_only("alice"), ms(500))
        .await
        .unwrap();
    assert_eq!(shorter.fence, lease.fence);
    assert_eq!(shorter.acquired_at, lease.acquired_at);
    assert_eq!(shorter.ttl, ms(500));
    let pttl: i64 = server.cmd(&["PTTL", &stored("e", "")]).parse().unwrap();
    assert!((0..=500).contains(&pttl), "PTTL {pttl}");

    let longer = b
        .extend(&key("e"), Holder::owner_only("alice"), 20 * SEC)
        .await
        .unwrap();
    assert!(longer.expires_at > lease.expires_at);
    let pttl: i64 = server.cmd(&["PTTL", &stored("e", "")]).parse().unwrap();
    assert!(pttl > 19_000, "PTTL {pttl}");

    assert!(matches!(
        b.extend(&key("e"), Holder::owner_only("alice"), Duration::ZERO)
            .await,
        Err(LockError::InvalidTtl(_))
    ));

    b.extend(&key("e"), Holder::owner_only("alice"), ms(30))
        .await
        .unwrap();
    tokio::time::sleep(ms(60)).await;
    assert_eq!(
        b.extend(&key("e"), Holder::owner_only("alice"), SEC).await,
        Err(LockError::NotFound)
    );
    assert_eq!(b.status(&key("e")).await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_lock_is_free_without_cleanup() {
    let server = RedisServer::start();
    let b = backend(&server);
    let old = b
        .acquire(&req("x", "alice", ms(50), Duration::ZERO))
        .await
        .unwrap();
    tokio::time::sleep(ms(80)).await;
    assert_eq!(b.status(&key("x")).await.unwrap(), None);
    let new = b
        .acquire(&req("x", "bob", SEC, Duration::ZERO))
        .await
        .unwrap();
    assert!(new.fence > old.fence);
    assert_eq!(
        b.release(&key("x"), Holder::owner_only("alice")).await,
        Err(LockError::OwnershipMismatch)
    );
    b.release(&key("x"), Holder::owner_only("bob"))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_release_frees_whoever_holds() {
    let server = RedisServer::start();
    let b = backend(&server);
    b.acquire(&req("k", "alice", 10 * SEC, Duration::ZERO))
        .await
        .unwrap();
    assert!(b.force_release(&key("k")).await.unwrap());
    assert_eq!(b.status(&key("k")).await.unwrap(), None);
    assert!(!b.force_release(&key("k")).await.unwrap());
    b.acquire(&req("k", "bob", SEC, Duration::ZERO))
        .await
        .unwrap();
}

/// (16.1) The connection breaks after Redis ran a force release and before
/// its reply arrived, so the backend sends it again: the repeat must not
/// free the waiter the first run handed the lock to (and hand it to the
/// next). Exactly one of two queued waiters holds the lock afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_force_release_repeated_after_a_lost_reply_frees_one_holder() {
    let server = RedisServer::start();
    let direct = backend(&server);
    let proxy = Proxy::start(server.port()).await;
    let operator = RedisBackend::from_url(&proxy.redis_url()).unwrap();
    // The operator's connection is open and the script loaded.
    assert!(!operator.force_release(&key("other")).await.unwrap());

    direct
        .acquire(&req("k", "holder", 30 * SEC, Duration::ZERO))
        .await
        .unwrap();
    let x = spawn_acquire(&direct, req("k", "x", 30 * SEC, 10 * SEC));
    queued(&server, "k", 1).await;
    let y = spawn_acquire(&direct, req("k", "y", 30 * SEC, SEC));
    queued(&server, "k", 2).await;

    proxy.reset_next_reply();
    assert!(
        operator.force_release(&key("k")).await.unwrap(),
        "the first run's answer: a lock was held"
    );
    proxy.resets(1).await;
    let lease = granted(x).await;
    let st = direct.status(&key("k")).await.unwrap().unwrap();
    assert_eq!((st.owner.as_str(), st.fence), ("x", lease.fence));
    assert_eq!(st.waiters, 1, "y still queued");
    let y = y.await.unwrap();
    assert!(matches!(y, Err(LockError::Timeout { .. })), "{y:?}");
}

/// A flight's publish whose reply is lost is run again (the connection is
/// replaced): the second run finds the lock released by the first, and must
/// recognise that success (the result is stored under the leader's fence)
/// instead of reporting a failed publish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_repeated_after_a_lost_reply_reports_its_success() {
    let server = RedisServer::start();
    let direct = backend(&server);
    let proxy = Proxy::start(server.port()).await;
    let leader = RedisBackend::from_url(&proxy.redis_url()).unwrap();
    let r = req("flight", "leader", 30 * SEC, SEC);
    let lease = match leader.flight_begin(&r).await.unwrap() {
        FlightStart::Leader(lease) => lease,
        _ => panic!("not the leader"),
    };
    let publish = FlightPublish {
        fence: lease.fence,
        value: Arc::from(&b"result"[..]),
        result_ttl: 10 * SEC,
        keep: 10 * SEC,
    };

    // The scripts are loaded: the reply lost is the publish's own.
    let warm = req("warm", "leader", 30 * SEC, SEC);
    let FlightStart::Leader(warm_lease) = leader.flight_begin(&warm).await.unwrap() else {
        panic!("not the leader");
    };
    let warm_publish = FlightPublish {
        fence: warm_lease.fence,
        ..publish.clone()
    };
    leader
        .flight_publish(warm.key(), "leader", &warm_publish)
        .await
        .unwrap();

    proxy.reset_next_reply();
    leader
        .flight_publish(r.key(), "leader", &publish)
        .await
        .expect("the publish succeeded, but was reported as failed");
    proxy.resets(1).await;
    let stored = direct.flight_result(r.key()).await.unwrap().unwrap();
    assert_eq!((stored.seq, &*stored.value), (lease.fence, &b"result"[..]));
    assert_eq!(direct.status(r.key()).await.unwrap(), None, "released");
}

/// How many scripts `server` has run so far: `EVALSHA`s that found their
/// script, and `EVAL`s (`INFO commandstats`).
fn scripts(server: &RedisServer) -> u64 {
    let calls = commands(server);
    calls("evalsha", "calls") - calls("evalsha", "failed_calls") + calls("eval", "calls")
}

/// `INFO commandstats` read now: a command's figure by name ("calls", ...),
/// scripts' own calls counted too.
fn commands(server: &RedisServer) -> impl Fn(&str, &str) -> u64 {
    let stats = server.cmd(&["INFO", "commandstats"]);
    move |command: &str, name: &str| -> u64 {
        let prefix = format!("cmdstat_{command}:");
        stats
            .lines()
            .find_map(|line| line.strip_prefix(prefix.as_str()))
            .and_then(|rest| {
                rest.split(',')
                    .find_map(|kv| kv.strip_prefix(&format!("{name}="))?.parse().ok())
            })
            .unwrap_or(0)
    }
}

/// Wait until `server` has run `n` more scripts than `before`.
async fn scripts_run(server: &RedisServer, before: u64, n: u64) {
    let deadline = Instant::now() + 10 * SEC;
    while scripts(server) < before + n {
        assert!(Instant::now() < deadline, "the held scripts never ran");
        tokio::time::sleep(ms(2)).await;
    }
}

/// (Issue 21.3 on Redis) An acquisition times out on a stalled connection
/// (the backend replaces it); its cleanup, a release with the owner token
/// made for it (as the layer sends one), must not run before it on the new
/// connection: the acquisition, landing later, would take the lock for
/// nobody. The cleanup queues behind it instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cleanup_release_never_overtakes_its_acquisition() {
    let server = RedisServer::start();
    let direct = backend(&server);
    let proxy = Proxy::start(server.port()).await;
    let b = RedisBackend::from_url(&proxy.redis_url())
        .unwrap()
        .op_timeout(ms(300));
    // Connected, with the scripts loaded.
    let warm = req("warm", "w", 10 * SEC, Duration::ZERO);
    let lease = b.acquire(&warm).await.unwrap();
    b.release(warm.key(), Holder::new("w", lease.fence))
        .await
        .unwrap();

    let before = scripts(&server);
    proxy.hold_open_commands(true);
    let r = req("k", "made-for-this-call", 30 * SEC, Duration::ZERO);
    assert!(unavailable(b.acquire(&r).await));
    let _ = b
        .release(r.key(), Holder::owner_only("made-for-this-call"))
        .await;
    proxy.hold_open_commands(false);
    scripts_run(&server, before, 2).await;
    assert_eq!(
        direct.status(&key("k")).await.unwrap(),
        None,
        "the acquisition ran after its cleanup: a lock for nobody"
    );
}

/// The same for a waiter: its queueing attempt times out, and its leave
/// (from the acquisition's drop guard) must not run first, or the late
/// attempt leaves an entry for nobody in the queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiters_leave_never_overtakes_its_queueing() {
    let server = RedisServer::start();
    let direct = backend(&server);
    let proxy = Proxy::start(server.port()).await;
    let b = RedisBackend::from_url(&proxy.redis_url())
        .unwrap()
        .op_timeout(ms(300));
    // Connected and subscribed (a wait served), with the scripts loaded.
    let first = direct
        .acquire(&req("warm", "a", 10 * SEC, Duration::ZERO))
        .await
        .unwrap();
    let waiter = spawn_acquire(&b, req("warm", "w", 10 * SEC, 5 * SEC));
    queued(&server, "warm", 1).await;
    direct
        .release(&key("warm"), Holder::new("a", first.fence))
        .await
        .unwrap();
    let lease = granted(waiter).await;
    b.release(&key("warm"), Holder::new("w", lease.fence))
        .await
        .unwrap();
    direct
        .acquire(&req("k", "holder", 30 * SEC, Duration::ZERO))
        .await
        .unwrap();

    let before = scripts(&server);
    proxy.hold_open_commands(true);
    let waited = b.acquire(&req("k", "waiter", 30 * SEC, 5 * SEC)).await;
    assert!(unavailable(waited));
    // The leave goes out from a task of its own: let it be sent (held behind
    // the attempt, or run elsewhere) before the attempt is let through.
    tokio::select! {
        () = proxy.held_writes(2) => {}
        () = scripts_run(&server, before, 1) => {}
    }
    proxy.hold_open_commands(false);
    // The attempt and the leave behind it have run (and a leave on the
    // fresh connection, sent beside it, before them).
    scripts_run(&server, before, 3).await;
    assert_eq!(
        server.cmd(&["HLEN", &stored("k", ":w")]),
        "0",
        "the waiter's entry stayed queued: its leave ran before it queued"
    );
}

/// A waiter (owner "waiter", through a proxy, op timeout 1 s) queued on
/// "k" behind "holder" (its lease returned), then dropped while its re-check
/// is held in the proxy (`hold_open_commands`, still on).
async fn dropped_with_its_re_check_stalled() -> (RedisServer, RedisBackend, Proxy, Lease) {
    let server = RedisServer::start();
    let direct = backend(&server);
    let proxy = Proxy::start(server.port()).await;
    let b = RedisBackend::from_url(&proxy.redis_url())
        .unwrap()
        .op_timeout(SEC);
    subscribe_first(&direct, &b).await;
    let held = direct
        .acquire(&req("k", "holder", 60 * SEC, Duration::ZERO))
        .await
        .unwrap();
    let waiter = spawn_acquire(&b, req("k", "waiter", 60 * SEC, 60 * SEC));
    queued(&server, "k", 1).await;
    // Its safety-net re-check (within 250 ms) is sent and stalls.
    proxy.hold_open_commands(true);
    proxy.held_writes(1).await;
    waiter.abort();
    assert!(waiter.await.unwrap_err().is_cancelled());
    (server, direct, proxy, held)
}

/// A queued waiter is dropped while its re-check is in flight on a
/// connection that stalls (and stays stalled). Its leave goes behind that
/// re-check, and stalls too; meanwhile the holder's release hands the lock
/// to the dropped entry. The leave also goes on the current connection (a
/// fresh one once the stalled one timed out), so the lock moves on to the
/// next waiter long before the dropped entry's deadline or the hand-off's
/// TTL (60 s each) would free it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_waiters_leave_does_not_wait_for_a_stalled_connection() {
    let (server, direct, proxy, held) = dropped_with_its_re_check_stalled().await;

    let next = spawn_acquire(&direct, req("k", "next", 60 * SEC, 20 * SEC));
    queued(&server, "k", 2).await;
    direct
        .release(&key("k"), Holder::new("holder", held.fence))
        .await
        .unwrap();
    let lease = tokio::time::timeout(30 * SEC, next)
        .await
        .unwrap()
        .unwrap()
        .expect("the lock stayed with the dropped waiter");
    proxy.hold_open_commands(false);
    assert_eq!(
        direct.status(&key("k")).await.unwrap().map(|s| s.fence),
        Some(lease.fence)
    );
}

/// The same dropped waiter, when the leave sent beside its stalled re-check
/// took its entry out before the holder released: the lock is then free
/// with nobody queued when the re-check lands. It must take nothing (it
/// took the lock for the gone waiter, until its TTL: 60 s); the leave
/// marked the waiter's ticket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_waiters_late_attempt_takes_nothing() {
    let (server, direct, proxy, held) = dropped_with_its_re_check_stalled().await;
    // The leave on a fresh connection (once the stalled one timed out).
    queued(&server, "k", 0).await;
    direct
        .release(&key("k"), Holder::new("holder", held.fence))
        .await
        .unwrap();

    // The re-check lands: it either took the lock (INCR, PSETEX) or found
    // its ticket marked (ZSCORE); nothing else runs either command here.
    let landed = |server: &RedisServer| {
        let calls = commands(server);
        calls("psetex", "calls") + calls("zscore", "calls")
    };
    let before = landed(&server);
    proxy.hold_open_commands(false);
    let deadline = Instant::now() + 10 * SEC;
    while landed(&server) == before {
        assert!(Instant::now() < deadline, "the held re-check never ran");
        tokio::time::sleep(ms(2)).await;
    }
    assert_eq!(
        direct.status(&key("k")).await.unwrap().map(|s| s.owner),
        None,
        "the dropped waiter's late re-check took the lock"
    );
}

/// (16.10) A waiter is handed the lock, but reads the grant only after the
/// lock was taken back (its lease ran out, someone else took it) and its own
/// re-check queued it again. It must not believe the old grant, nor leave its
/// new queue entry behind: it gets the lock after the current holder, with a
/// newer fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_read_after_the_lock_was_taken_back_is_not_believed() {
    stale_grant(false, false).await;
}

/// The same, when the waiter's first queueing call was sent twice (its
/// reply lost, the call sent again on a fresh connection: the second run
/// finds the entry the first made). That entry still counts as the call's
/// first: the old grant, read after a second entry, is not believed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_read_late_is_not_believed_when_the_first_queueing_was_sent_twice() {
    stale_grant(true, false).await;
}

/// The same, when the re-check that queued the waiter again was sent twice:
/// its second run finds the entry the first made ("not anew"), and that
/// entry is still the call's second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_read_late_is_not_believed_when_the_re_check_was_sent_twice() {
    stale_grant(false, true).await;
}

/// The scenario of the three tests above; `sent_twice`: the reply to the
/// waiter's first queueing call is lost (the proxy resets it);
/// `re_check_sent_twice`: the reply to the re-check that queues it again.
async fn stale_grant(sent_twice: bool, re_check_sent_twice: bool) {
    let server = RedisServer::start();
    let direct = backend(&server);
    let proxy = Proxy::start(server.port()).await;
    let slow = RedisBackend::from_url(&proxy.redis_url()).unwrap();
    subscribe_first(&direct, &slow).await;
    direct
        .acquire(&req("k", "h", 30 * SEC, Duration::ZERO))
        .await
        .unwrap();
    let before = scripts(&server);
    if sent_twice {
        proxy.reset_next_reply();
    }
    let waiter = spawn_acquire(&slow, req("k", "w", ms(100), 10 * SEC));
    if sent_twice {
        proxy.resets(1).await;
        // Its first run, and the same call again.
        scripts_run(&server, before, 2).await;
    }
    queued(&server, "k", 1).await;

    // The grant to w, and w's own re-checks, are held back...
    proxy.hold_pubsub(true);
    proxy.hold_commands(true);
    direct
        .release(&key("k"), Holder::owner_only("h"))
        .await
        .unwrap();
    let handed = direct.status(&key("k")).await.unwrap().unwrap();
    assert_eq!(handed.owner, "w");
    // ...until w's lease has run out and z has taken the lock.
    until_free(&direct, "k").await;
    let z = direct
        .acquire(&req("k", "z", 30 * SEC, Duration::ZERO))
        .await
        .unwrap();
    let ran = scripts(&server);
    if re_check_sent_twice {
        proxy.reset_next_reply();
    }
    proxy.hold_commands(false);
    if re_check_sent_twice {
        proxy.resets(1).await;
        // Its first run, and the same call again.
        scripts_run(&server, ran, 2).await;
    }
    // w's re-check finds z holding and queues w again; then w reads the
    // old grant, and z releases.
    queued(&server, "k", 1).await;
    proxy.hold_pubsub(false);
    direct
        .release(&key("k"), Holder::owner_only("z"))
        .await
        .unwrap();

    let lease = granted(waiter).await;
    assert!(
        lease.fence > z.fence,
        "w believed the old grant (fence {} <= z's {})",
        lease.fence,
        z.fence
    );
    let st = direct.status(&key("k")).await.unwrap().unwrap();
    assert_eq!(
        (st.owner.as_str(), st.fence, st.waiters),
        ("w", lease.fence, 0)
    );
}

/// Wait until nobody holds `name`.
async fn until_free(b: &RedisBackend, name: &str) {
    let deadline = Instant::now() + 5 * SEC;
    while b.status(&key(name)).await.unwrap().is_some() {
        assert!(Instant::now() < deadline, "{name} still held");
        tokio::time::sleep(ms(2)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn route_keys_with_braces_and_long_keys_work() {
    let server = RedisServer::start();
    let b = backend(&server).prefix("app:");
    let k = LockKey::route("/orders/{id}", "}{".repeat(256)).unwrap();
    let k_ = k.clone();
    let r = AcquireRequest::new(k.clone(), "o", SEC, Duration::ZERO).unwrap();
    b.acquire(&r).await.unwrap();
    assert_eq!(b.status(&k).await.unwrap().unwrap().owner, "o");
    // The lock's keys hashed; beside them only the slot's fence counter.
    let keys = server.cmd(&["KEYS", "app:*"]);
    assert!(
        keys.lines()
            .all(|k| k.starts_with("app:{h:") || k == b.fence_counter_key(&k_)),
        "{keys}"
    );
    b.release(&k, Holder::owner_only("o")).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_from_an_existing_pool() {
    let server = RedisServer::start();
    let pool = deadpool_redis::Config::from_url(server.url())
        .create_pool(Some(deadpool_redis::Runtime::Tokio1))
        .unwrap();
    let b = RedisBackend::from_pool(pool.clone(), server.url().as_str()).unwrap();
    b.acquire(&req("p", "o", SEC, Duration::ZERO))
        .await
        .unwrap();
    b.release(&key("p"), Holder::owner_only("o")).await.unwrap();
    // The other constructors.
    let from_config =
        RedisBackend::from_config(&deadpool_redis::Config::from_url(server.url())).unwrap();
    from_config
        .acquire(&req("p", "o2", SEC, Duration::ZERO))
        .await
        .unwrap();
    assert!(matches!(
        RedisBackend::from_url("nonsense://x"),
        Err(LockError::InvalidConfig(_))
    ));
    // The app's pool still works.
    let mut conn = pool.get().await.unwrap();
    let pong: String = deadpool_redis::redis::cmd("PING")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(pong, "PONG");
}

// ------------------------------------------------------- waiting, hand-off
// (The queue contract itself, FIFO, hand-off at release and at expiry, no
// barging, a cancelled waiter, is in the behavioural suite for every
// backend: tests/behaviour/queue.rs. Here: what is Redis's own.)

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiter_times_out_with_retry_after_and_leaves_the_queue() {
    let server = RedisServer::start();
    let b = backend(&server);
    b.acquire(&req("t", "alice", 10 * SEC, Duration::ZERO))
        .await
        .unwrap();
    let start = Instant::now();
    let err = b.acquire(&req("t", "bob", SEC, ms(200))).await.unwrap_err();
    let took = start.elapsed();
    let LockError::Timeout {
        waited,
        retry_after: Some(left),
    } = err
    else {
        panic!("{err:?}");
    };
    assert!(
        waited >= ms(200) && took < SEC,
        "waited {waited:?}, took {took:?}"
    );
    assert!(left <= 10 * SEC && left > 8 * SEC, "{left:?}");
    assert_eq!(server.cmd(&["LLEN", &stored("t", ":q")]), "0");
    assert_eq!(server.cmd(&["HLEN", &stored("t", ":w")]), "0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_queue_entries_are_skipped() {
    let server = RedisServer::start();
    let b = backend(&server);
    b.acquire(&req("d", "holder", 30 * SEC, Duration::ZERO))
        .await
        .unwrap();
    // A waiter of a crashed process, its deadline passed.
    server.cmd(&["RPUSH", &stored("d", ":q"), "ghost"]);
    server.cmd(&[
        "HSET",
        &stored("d", ":w"),
        "ghost",
        "1000 60000 1 tower-lock:wake:nobody",
    ]);
    let waiter = spawn_acquire(&b, req("d", "live", SEC, 10 * SEC));
    queued(&server, "d", 2).await;
    b.release(&key("d"), Holder::owner_only("holder"))
        .await
        .unwrap();
    granted(waiter).await;
    assert_eq!(b.status(&key("d")).await.unwrap().unwrap().owner, "live");
}

/// A process's first waiter queues with its first attempt, before its
/// wake-up subscription is made (on demand, which on a loaded machine took
/// more than 150 ms in the chaos checker's runs): a newcomer that comes
/// while it subscribes does not pass it. The grant published while it did
/// not listen yet is found by its attempt after subscribing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_keeps_its_place_while_it_subscribes() {
    let server = RedisServer::start();
    let direct = backend(&server);
    let holder = direct
        .acquire(&req("sub", "holder", 30 * SEC, Duration::ZERO))
        .await
        .unwrap();
    // A fresh backend through the proxy, which holds its SUBSCRIBE back.
    let proxy = Proxy::start(server.port()).await;
    proxy.hold_carrying(b"SUBSCRIBE");
    let late = RedisBackend::from_url(&proxy.redis_url()).unwrap();
    let waiter = spawn_acquire(&late, req("sub", "waiter", 30 * SEC, 20 * SEC));
    // Its first attempt found the lock busy; now it subscribes.
    proxy.carried(1).await;
    direct
        .release(&key("sub"), Holder::new("holder", holder.fence))
        .await
        .unwrap();
    let newcomer = direct
        .acquire(&req("sub", "newcomer", 30 * SEC, Duration::ZERO))
        .await;
    assert!(
        matches!(newcomer, Err(LockError::AcquisitionFailed { .. })),
        "the newcomer passed the waiter: {newcomer:?}"
    );
    assert_eq!(
        direct.status(&key("sub")).await.unwrap().unwrap().owner,
        "waiter",
        "right after the release the lock belongs to the waiter"
    );
    proxy.let_go_all();
    let lease = granted(waiter).await;
    assert!(lease.fence > holder.fence);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contended_lock_is_mutually_exclusive_and_fair() {
    let server = RedisServer::start();
    let b = backend(&server);
    let holders = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for w in 0..8 {
        let b = b.clone();
        let holders = holders.clone();
        let log = log.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..10 {
                let owner = format!("w{w}-{i}");
                let r = req("hot", &owner, 10 * SEC, 10 * SEC);
                b.acquire(&r).await.unwrap();
                let n = holders.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                assert_eq!(n, 0, "two holders at once");
                log.lock().unwrap().push(w);
                tokio::time::sleep(ms(1)).await;
                holders.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                b.release(r.key(), Holder::owner_only(&owner))
                    .await
                    .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let log = log.lock().unwrap();
    let repeats = log.windows(2).filter(|w| w[0] == w[1]).count();
    println!(
        "contended: {} acquisitions, same-worker re-acquire {:.1} %",
        log.len(),
        100.0 * repeats as f64 / (log.len() - 1) as f64
    );
    assert_eq!(log.len(), 80);
}

// ------------------------------------------------------------------- faults

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_connection_is_unavailable_at_once() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let b = RedisBackend::from_url(&format!("redis://127.0.0.1:{port}")).unwrap();
    for wait in [Duration::ZERO, 5 * SEC] {
        let start = Instant::now();
        let r = b.acquire(&req("r", "o", SEC, wait)).await;
        let took = start.elapsed();
        println!("refused connection (max wait {wait:?}): {r:?} after {took:?}");
        assert!(unavailable(r));
        assert!(took < SEC, "{took:?}");
    }
    assert!(unavailable(
        b.release(&key("r"), Holder::owner_only("o")).await
    ));
    assert!(unavailable(b.status(&key("r")).await));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_server_is_unavailable_within_the_op_timeout() {
    // Accepts connections and never answers.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut open = Vec::new();
        for conn in listener.incoming() {
            open.push(conn);
        }
    });
    let op_timeout = ms(300);
    let b = RedisBackend::from_url(&format!("redis://127.0.0.1:{port}"))
        .unwrap()
        .op_timeout(op_timeout);
    for wait in [Duration::ZERO, ms(500)] {
        let start = Instant::now();
        let r = b.acquire(&req("s", "o", SEC, wait)).await;
        let took = start.elapsed();
        println!("silent server (max wait {wait:?}): {r:?} after {took:?}");
        assert!(unavailable(r));
        assert!(took < wait + op_timeout + ms(700), "{took:?}");
    }
    let start = Instant::now();
    assert!(unavailable(
        b.release(&key("s"), Holder::owner_only("o")).await
    ));
    assert!(start.elapsed() < op_timeout + ms(700));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiter_learns_at_once_that_redis_died() {
    let mut server = RedisServer::start();
    let b = backend(&server);
    b.acquire(&req("k", "holder", 30 * SEC, Duration::ZERO))
        .await
        .unwrap();
    let waiter = tokio::spawn({
        let b = b.clone();
        async move {
            let r = b.acquire(&req("k", "waiter", 30 * SEC, 10 * SEC)).await;
            (r, Instant::now())
        }
    });
    queued(&server, "k", 1).await;
    let killing = Instant::now();
    server.kill();
    let (r, done) = waiter.await.unwrap();
    let after = done.saturating_duration_since(killing);
    println!("waiter after SIGKILL: {r:?}, {after:?} after the kill started");
    assert!(unavailable(r));
    assert!(after < SEC, "{after:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_calls_after_a_restart_succeed() {
    let mut server = RedisServer::start();
    let b = backend(&server);
    // Warm up both connections (operations and pub/sub).
    b.acquire(&req("k", "a", 30 * SEC, Duration::ZERO))
        .await
        .unwrap();
    let w = spawn_acquire(&b, req("k", "b", 30 * SEC, 10 * SEC));
    queued(&server, "k", 1).await;
    b.release(&key("k"), Holder::owner_only("a")).await.unwrap();
    w.await.unwrap().unwrap();

    server.kill();
    server.restart();
    // The held lock is gone with the empty restart: release says so.
    assert_eq!(
        b.release(&key("k"), Holder::owner_only("b")).await,
        Err(LockError::NotFound)
    );
    let start = Instant::now();
    b.acquire(&req("k2", "a", 30 * SEC, Duration::ZERO))
        .await
        .unwrap();
    println!("first acquire after restart took {:?}", start.elapsed());

    // Waiting works again: the pub/sub connection is re-made.
    let w = spawn_acquire(&b, req("k2", "b", 30 * SEC, 10 * SEC));
    queued(&server, "k2", 1).await;
    b.release(&key("k2"), Holder::owner_only("a"))
        .await
        .unwrap();
    granted(w).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_acquire_after_restart_succeeds_without_warm_pubsub() {
    let mut server = RedisServer::start();
    let b = backend(&server);
    b.acquire(&req("k", "a", SEC, Duration::ZERO))
        .await
        .unwrap();
    server.kill();
    server.restart();
    b.acquire(&req("k", "a", SEC, Duration::ZERO))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_mid_run_is_harmless() {
    let server = RedisServer::start();
    let b = backend(&server);
    b.acquire(&req("k", "a", 10 * SEC, Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(server.cmd(&["SCRIPT", "FLUSH"]), "OK");
    b.extend(&key("k"), Holder::owner_only("a"), 20 * SEC)
        .await
        .unwrap();
    assert_eq!(server.cmd(&["SCRIPT", "FLUSH"]), "OK");
    assert!(b.status(&key("k")).await.unwrap().is_some());
    assert_eq!(server.cmd(&["SCRIPT", "FLUSH"]), "OK");
    b.release(&key("k"), Holder::owner_only("a")).await.unwrap();
    assert_eq!(server.cmd(&["SCRIPT", "FLUSH"]), "OK");
    b.acquire(&req("k", "a", 10 * SEC, Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(server.cmd(&["SCRIPT", "FLUSH"]), "OK");
    assert!(b.force_release(&key("k")).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_connections_are_replaced() {
    let server = RedisServer::start();
    let b = backend(&server);
    b.acquire(&req("k", "a", 30 * SEC, Duration::ZERO))
        .await
        .unwrap();
    let killed: u32 = server
        .cmd(&["CLIENT", "KILL", "TYPE", "normal"])
        .parse()
        .unwrap();
    assert!(killed >= 1);
    b.extend(&key("k"), Holder::owner_only("a"), 30 * SEC)
        .await
        .unwrap();
    server.cmd(&["CLIENT", "KILL", "TYPE", "normal"]);
    b.release(&key("k"), Holder::owner_only("a")).await.unwrap();

    // Kill the pub/sub connection while a waiter waits: it re-subscribes and
    // is still handed the lock.
    subscribe_first(&backend(&server), &b).await;
    b.acquire(&req("k", "a", 30 * SEC, Duration::ZERO))
        .await
        .unwrap();
    let w = spawn_acquire(&b, req("k", "b", 30 * SEC, 10 * SEC));
    queued(&server, "k", 1).await;
    let killed: u32 = server
        .cmd(&["CLIENT", "KILL", "TYPE", "pubsub"])
        .parse()
        .unwrap();
    assert_eq!(killed, 1);
    // Wait until it has subscribed again before releasing.
    let deadline = Instant::now() + 5 * SEC;
    while server
        .cmd(&["PUBSUB", "CHANNELS", "tower-lock:wake:*"])
        .is_empty()
    {
        assert!(Instant::now() < deadline, "never re-subscribed");
        tokio::time::sleep(ms(2)).await;
    }
    b.release(&key("k"), Holder::owner_only("a")).await.unwrap();
    let lease = granted(w).await;
    assert!(lease.fence > 0);
    assert_eq!(b.status(&key("k")).await.unwrap().unwrap().owner, "b");
}

/// (16.9) A Redis that may evict keys (an `allkeys-*` or `volatile-*`
/// maxmemory policy) can drop fence counters or live locks: the backend
/// warns once, at its first connection.
#[tokio::test]
async fn an_evicting_redis_is_warned_about_once() {
    use common::logs::Logs;
    const WARNING: &str = "Redis may evict tower-lock's keys";
    let (logs, _capture) = Logs::capture(tracing::Level::WARN);
    let evicting = RedisServer::start_with(&["--maxmemory-policy", "allkeys-lru"]);
    let b = backend(&evicting);
    for i in 0..3 {
        let r = req(&format!("k{i}"), "o", SEC, Duration::ZERO);
        b.acquire(&r).await.unwrap();
        b.release(r.key(), Holder::owner_only("o")).await.unwrap();
    }
    assert_eq!(logs.count(WARNING), 1, "{}", logs.text());
    assert!(logs.text().contains("allkeys-lru"));

    let safe = RedisServer::start();
    let b = backend(&safe);
    b.acquire(&req("k", "o", SEC, Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(logs.count(WARNING), 1, "noeviction is not warned about");
}

/// (16.12) Configuration at the extremes never panics: an op timeout of
/// `Duration::MAX` is as good as forever, and a call still fails fast on a
/// refused connection.
#[tokio::test]
async fn an_endless_op_timeout_is_accepted() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let b = RedisBackend::from_url(&format!("redis://127.0.0.1:{port}"))
        .unwrap()
        .op_timeout(Duration::MAX);
    assert!(b.get_op_timeout() >= Duration::from_secs(365 * 24 * 3600));
    let r = req("k", "o", SEC, Duration::MAX);
    let started = Instant::now();
    assert!(unavailable(b.acquire(&r).await));
    assert!(started.elapsed() < 5 * SEC);
}

/// The fault-schedule checker's PostgreSQL seed 1096, on Redis (the same
/// design): the holder is released right after the second waiter's
/// re-check (its acquire script seen on the server), the first
/// waiter is handed the lock and walks away with it (TTL 100 ms). Nothing
/// but the hand-off's nudge (`"w <id> <ms>"` to the waiter that comes to
/// the head) tells the second that the lock is free 100 ms later: it last
/// saw the old holder's expiry (30 s), and after 4 s of waiting its
/// safety-net re-check comes 1 to 2 s after the last one. So it gets the
/// lock within a few hundred ms with the nudge, after at least 1 s without
/// (red in every run with the script's nudge or the waiter's use of it
/// removed). The 4 s wait is the condition under test (re-checks that far
/// apart), not a stand-in for a signal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_behind_a_holder_that_walked_away_wakes_at_its_ttl() {
    let server = RedisServer::start();
    let b = backend(&server);
    let held = b
        .acquire(&req("k", "holder", 30 * SEC, Duration::ZERO))
        .await
        .unwrap();
    let first = spawn_acquire(&b, req("k", "first", ms(100), 60 * SEC));
    queued(&server, "k", 1).await;
    let second = spawn_acquire(&b, req("k", "second", 30 * SEC, 60 * SEC));
    queued(&server, "k", 2).await;
    tokio::time::sleep(4 * SEC).await;
    // Each re-check runs the acquire script again, with the waiter's owner
    // among its arguments: seen on MONITOR, it has run when the release
    // below reaches the server. (Not "its queue entry changed": the entry
    // stores the deadline, which a re-check often writes again unchanged,
    // to the millisecond; the test then waited out the holder's TTL.)
    let port = server.port();
    let rechecked = tokio::task::spawn_blocking(move || {
        monitor_until(port, 10 * SEC, |line| line.contains(" second\""))
    });
    rechecked
        .await
        .unwrap()
        .unwrap()
        .expect("the second waiter re-checked within 10 s");
    let released = Instant::now();
    b.release(&key("k"), Holder::new("holder", held.fence))
        .await
        .unwrap();
    let first = granted(first).await;
    let second = granted(second).await;
    let took = released.elapsed();
    assert!(second.fence > first.fence);
    assert!(
        took < ms(100) + ms(600),
        "the second waiter got the lock {took:?} after the release, behind a 100 ms holder"
    );
}
