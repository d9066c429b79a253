//! Connecting as apps do: a password in the URL, and `rediss://` (TLS, with
//! feature `redis-tls`), each against a private redis-server.
#![cfg(feature = "redis")]

mod common;

use std::time::Duration;
use tower_lock::backend::Holder;

use common::redis_server::RedisServer;
use tower_lock::backend::AcquireRequest;
use tower_lock::{LockBackend, LockError, LockKey, RedisBackend};

fn req(owner: &str, ttl_ms: u64, wait_ms: u64) -> AcquireRequest {
    AcquireRequest::new(
        LockKey::global("conn").unwrap(),
        owner,
        Duration::from_millis(ttl_ms),
        Duration::from_millis(wait_ms),
    )
    .unwrap()
}

/// Acquire; wait for a lock whose holder never releases (the waiter
/// subscribes for wake-ups over the same URL, then takes the lock when the
/// holder's TTL runs out); release.
async fn exercise(backend: &RedisBackend) {
    let key = LockKey::global("conn").unwrap();
    backend.acquire(&req("a", 300, 0)).await.expect("acquire");
    let lease = backend
        .acquire(&req("b", 10_000, 5_000))
        .await
        .expect("the waiter gets the lock after the holder's TTL");
    assert!(lease.fence > 1);
    assert_eq!(backend.status(&key).await.unwrap().unwrap().owner, "b");
    backend
        .release(&key, Holder::owner_only("b"))
        .await
        .expect("release");
}

#[tokio::test]
async fn password_in_the_url() {
    let server = RedisServer::start();
    assert_eq!(
        server.cmd(&["CONFIG", "SET", "requirepass", "s3cret"]),
        "OK"
    );
    let port = server.port();

    let backend = RedisBackend::from_url(&format!("redis://:s3cret@127.0.0.1:{port}")).unwrap();
    exercise(&backend).await;

    let wrong = RedisBackend::from_url(&format!("redis://:nope@127.0.0.1:{port}")).unwrap();
    let err = wrong.acquire(&req("c", 1_000, 0)).await.unwrap_err();
    assert!(
        matches!(err, LockError::BackendUnavailable(_)),
        "a wrong password must fail closed: {err:?}"
    );
    assert!(
        !format!("{wrong:?}").contains("nope"),
        "Debug must not show the password"
    );
}

#[cfg(feature = "redis-tls")]
#[tokio::test]
async fn rediss_url_with_tls() {
    let server = RedisServer::start();
    let dir = std::env::temp_dir().join(format!(
        "tower-lock-tls-{}-{}",
        std::process::id(),
        server.port()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let made = std::process::Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        ])
        .args(["-subj", "/CN=127.0.0.1", "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("openssl (Debian: apt-get install -y openssl)");
    assert!(made.status.success(), "{made:?}");
    let path = |p: &std::path::Path| p.to_str().unwrap().to_owned();
    for (name, value) in [
        ("tls-cert-file", path(&cert)),
        ("tls-key-file", path(&key)),
        ("tls-ca-cert-file", path(&cert)),
        ("tls-auth-clients", "no".to_owned()),
    ] {
        assert_eq!(server.cmd(&["CONFIG", "SET", name, &value]), "OK", "{name}");
    }
    let tls_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    assert_eq!(
        server.cmd(&["CONFIG", "SET", "tls-port", &tls_port.to_string()]),
        "OK"
    );

    // Self-signed: `#insecure` skips verification (test only).
    let backend =
        RedisBackend::from_url(&format!("rediss://127.0.0.1:{tls_port}/#insecure")).unwrap();
    exercise(&backend).await;
    let _ = std::fs::remove_dir_all(&dir);
}
