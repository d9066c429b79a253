//! The backend type's own checks: its traits and the size of its futures.

use super::*;

fn assert_traits<T: Clone + Send + Sync + 'static + LockBackend>() {}

#[test]
fn is_clone_send_sync_backend() {
    assert_traits::<RedisBackend>();
}

/// Every call's future is boxed and moved once; connecting (large and
/// rare) is boxed separately so it does not bloat them. A guard against
/// regressions, with generous room for dependency changes.
#[test]
fn operation_futures_stay_small() {
    let backend = RedisBackend::from_url("redis://127.0.0.1:1").unwrap();
    let key = LockKey::global("k").unwrap();
    let req = AcquireRequest::new(key, "o", Duration::from_secs(1), Duration::ZERO).unwrap();
    let acquire = std::mem::size_of_val(&backend.acquire_inner(&req));
    let holder = Holder::new("o", 1);
    let release = std::mem::size_of_val(&backend.release_inner(req.key(), holder));
    assert!(
        acquire < 3072 && release < 3072,
        "{acquire} / {release} bytes"
    );
}
