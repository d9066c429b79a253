//! A held lock handed to another process as a serialised `LockToken`, and
//! restored, extended and released there, on a private Redis. The other
//! process is this test binary run again with the token in its environment.
#![cfg(feature = "redis")]

mod common;

use std::time::Duration;

use common::redis_server::RedisServer;
use tower_lock::{JobSpec, LockError, LockKey, LockToken, OwnedLock, RedisBackend, SharedBackend};

const CHILD_TOKEN: &str = "TOWER_LOCK_TEST_CHILD_TOKEN";
const CHILD_URL: &str = "TOWER_LOCK_TEST_CHILD_URL";

/// The second process: restore the token from the environment, extend,
/// release. Does nothing when run by the test harness on its own.
#[tokio::test]
async fn child_restores_extends_and_releases() {
    let (Ok(token), Ok(url)) = (std::env::var(CHILD_TOKEN), std::env::var(CHILD_URL)) else {
        return;
    };
    let token: LockToken = serde_json::from_str(&token).expect("a token");
    let backend = SharedBackend::new(RedisBackend::from_url(&url).expect("URL"));
    let mut lock = OwnedLock::restore(backend.clone(), &token)
        .await
        .expect("restore in the second process");
    // Restoring claims the lock: a new acquisition, fenced above the token.
    assert!(lock.fence() > token.fence());
    lock.extend(Duration::from_secs(60)).await.expect("extend");
    lock.release().await.expect("release");
    // The same token again: the lock is gone.
    assert_eq!(
        OwnedLock::restore(backend, &token).await.unwrap_err(),
        LockError::NotFound
    );
    println!("CHILD-RELEASED {}", token.fence());
}

#[tokio::test]
async fn token_is_restored_in_a_second_process() {
    if std::env::var(CHILD_TOKEN).is_ok() {
        return; // this is the child run
    }
    let server = RedisServer::start();
    let backend = SharedBackend::new(RedisBackend::from_url(&server.url()).unwrap());
    let spec = JobSpec::new("job:42", Duration::from_secs(5));
    let lock = OwnedLock::acquire(backend.clone(), &spec).await.unwrap();
    let fence = lock.fence();
    let token = serde_json::to_string(&lock.into_token()).unwrap();
    let key = LockKey::global("job:42").unwrap();
    assert!(
        backend.status(&key).await.unwrap().is_some(),
        "turning the handle into a token must not release the lock"
    );

    let out = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "child_restores_extends_and_releases",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_TOKEN, &token)
        .env(CHILD_URL, server.url())
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the second process failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(&format!("CHILD-RELEASED {fence}")),
        "{stdout}"
    );
    assert_eq!(
        backend.status(&key).await.unwrap(),
        None,
        "released by the second process"
    );

    // A token whose lock someone else holds now is refused.
    let other = OwnedLock::acquire(backend.clone(), &spec).await.unwrap();
    let stale: LockToken = serde_json::from_str(&token).unwrap();
    assert_eq!(
        OwnedLock::restore(backend.clone(), &stale)
            .await
            .unwrap_err(),
        LockError::OwnershipMismatch
    );
    other.release().await.unwrap();
}
