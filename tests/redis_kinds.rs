//! The Redis backend's storage of shared holds: the holds' expiry index
//! stays the holds' own (the behaviour across processes is in
//! `kinds_across_processes.rs`).
#![cfg(feature = "redis")]

mod common;

use std::time::Duration;

use common::redis_server::RedisServer;
use tower_lock::backend::{AcquireRequest, Holder};
use tower_lock::{LockKey, LockKind, RedisBackend};

/// The holds' expiry index (`{E}:he`: each hold's fence scored by its
/// expiry, beside the holds' hash `{E}:h`) follows the holds as they are
/// taken, extended, run out and released, and both keys go with the last
/// hold: nothing of a shared key outlives its holds.
#[tokio::test]
async fn kinds_expiry_index_follows_the_holds_and_goes_with_the_last() {
    use tower_lock::backend::LockBackend;
    let server = RedisServer::start();
    let backend = RedisBackend::from_url(&server.url()).unwrap();
    let key = LockKey::global("index").unwrap();
    let (hash, index) = ("lock:{g:index}:h", "lock:{g:index}:he");
    let shared = |owner: &str, ttl: Duration| {
        AcquireRequest::new(key.clone(), owner, ttl, Duration::ZERO)
            .unwrap()
            .with_kind(LockKind::Shared)
            .unwrap()
    };
    let long = Duration::from_secs(30);
    let a = backend.acquire(&shared("a", long)).await.unwrap();
    let short = backend
        .acquire(&shared("short", Duration::from_millis(300)))
        .await
        .unwrap();
    let b = backend.acquire(&shared("b", long)).await.unwrap();
    assert_eq!(server.cmd(&["ZCARD", index]), "3");
    // The kind, then per hold its value and its acquisition's index entry.
    assert_eq!(server.cmd(&["HLEN", hash]), "7");

    let score = |fence: u64| -> u64 {
        let s = server.cmd(&["ZSCORE", index, &fence.to_string()]);
        s.parse()
            .unwrap_or_else(|_| panic!("no expiry for {fence}: {s}"))
    };
    let before = score(b.fence);
    backend
        .extend(&key, Holder::new("b", b.fence), Duration::from_secs(60))
        .await
        .unwrap();
    assert!(
        score(b.fence) >= before + 29_000,
        "the extension did not move b's expiry"
    );

    // Let the short hold's server-side TTL run out (that wait is the point):
    // the next script that looks drops it from both keys.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let c = backend.acquire(&shared("c", long)).await.unwrap();
    assert_eq!(server.cmd(&["ZCARD", index]), "3");
    assert_eq!(server.cmd(&["HLEN", hash]), "7");
    assert_eq!(
        server.cmd(&["HEXISTS", hash, &short.fence.to_string()]),
        "0"
    );

    for (owner, fence) in [("a", a.fence), ("b", b.fence), ("c", c.fence)] {
        backend
            .release(&key, Holder::new(owner, fence))
            .await
            .unwrap();
    }
    assert_eq!(server.cmd(&["EXISTS", hash, index]), "0");
}

/// Waits until `n` waiters are queued on `key` (`{E}:q`), at most 10 s.
async fn queued(server: &RedisServer, key: &str, n: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while server.cmd(&["LLEN", &format!("lock:{{g:{key}}}:q")]) != n {
        assert!(tokio::time::Instant::now() < deadline, "never {n} queued");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// The release of a key's last hold with a writer queued hands the key to
/// that writer in the same script: right after the release returns, the
/// lock is the writer's (the release's fast path, for a key nobody waits
/// on, must not take this one).
#[tokio::test]
async fn releasing_the_last_hold_hands_the_key_to_the_queued_writer_at_once() {
    use tower_lock::backend::LockBackend;
    let server = RedisServer::start();
    let backend = RedisBackend::from_url(&server.url()).unwrap();
    let key = LockKey::global("handed").unwrap();
    let long = Duration::from_secs(30);
    let reader = backend
        .acquire(
            &AcquireRequest::new(key.clone(), "reader", long, Duration::ZERO)
                .unwrap()
                .with_kind(LockKind::Shared)
                .unwrap(),
        )
        .await
        .unwrap();
    let writer = tokio::spawn({
        let (backend, key) = (backend.clone(), key.clone());
        async move {
            let req = AcquireRequest::new(key, "writer", long, Duration::from_secs(20)).unwrap();
            backend.acquire(&req).await
        }
    });
    queued(&server, "handed", "1").await;
    backend
        .release(&key, Holder::new("reader", reader.fence))
        .await
        .unwrap();
    let value = server.cmd(&["GET", "lock:{g:handed}"]);
    assert!(
        value.ends_with(" writer"),
        "right after the release the lock is {value:?}"
    );
    let lease = writer.await.unwrap().unwrap();
    assert!(lease.fence > reader.fence);
}

/// A hold whose TTL ran out on the server is not its holder's to release:
/// the release is refused (the holder learns it lost the hold) and touches
/// no other hold.
#[tokio::test]
async fn releasing_a_hold_that_ran_out_is_refused() {
    use tower_lock::backend::LockBackend;
    let server = RedisServer::start();
    let backend = RedisBackend::from_url(&server.url()).unwrap();
    let key = LockKey::global("ran-out").unwrap();
    let permit = |owner: &str, ttl: Duration| {
        AcquireRequest::new(key.clone(), owner, ttl, Duration::ZERO)
            .unwrap()
            .with_kind(LockKind::Permits(2))
            .unwrap()
    };
    let short = backend
        .acquire(&permit("short", Duration::from_millis(200)))
        .await
        .unwrap();
    let long = backend
        .acquire(&permit("long", Duration::from_secs(30)))
        .await
        .unwrap();
    // Let the short hold's server-side TTL run out (that wait is the point).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let refused = backend
        .release(&key, Holder::new("short", short.fence))
        .await;
    assert!(
        refused.is_err(),
        "released a hold that ran out: {refused:?}"
    );
    backend
        .release(&key, Holder::new("long", long.fence))
        .await
        .unwrap();
}

/// A restore (a claim) of the only shared hold moves it to a new fence; its
/// expiry index keeps its TTL. (The old entry went first, emptying the
/// index, which Redis deletes; the new one made it again without a TTL:
/// kept forever if that hold then ran out unreleased.)
#[tokio::test]
async fn a_claimed_only_hold_keeps_its_index_expiring() {
    use tower_lock::backend::LockBackend;
    let server = RedisServer::start();
    let backend = RedisBackend::from_url(&server.url()).unwrap();
    let key = LockKey::global("claimed").unwrap();
    let req = AcquireRequest::new(key.clone(), "o", Duration::from_secs(30), Duration::ZERO)
        .unwrap()
        .with_kind(LockKind::Shared)
        .unwrap();
    let held = backend.acquire(&req).await.unwrap();
    let claimed = backend
        .claim(&key, Holder::new("o", held.fence), 4242)
        .await
        .unwrap();
    assert!(claimed.fence > held.fence);
    let ttl: i64 = server
        .cmd(&["PTTL", "lock:{g:claimed}:he"])
        .parse()
        .unwrap();
    assert!(ttl > 0, "the expiry index lost its TTL: {ttl}");
}
