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
