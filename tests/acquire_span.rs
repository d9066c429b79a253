//! The acquisition span: one per acquisition, with the outcome and the wait
//! as fields and the hashed key only. The only test of its binary: tracing
//! caches per call site whether anyone listens, and a test on another
//! thread hitting the same call sites without a subscriber races with the
//! capture.

mod common;

use std::sync::Arc;
use std::time::Duration;

use axum::{Router, body::Body, routing::post};
use http::{Request, StatusCode};
use tokio::sync::Notify;
use tower::ServiceExt;
use tower_lock::{LockLayer, LockSpec, Locks, MemoryBackend, path_params};

use common::logs::Logs;

#[derive(Default)]
struct Gate {
    entered: Notify,
    release: Notify,
}

/// `/m5/{id}` locking `acct:{id}`, whose handler holds the lock until
/// `release` is notified (after telling `entered`).
fn holding_app(held: Arc<Gate>) -> Router {
    let layer = LockLayer::new(MemoryBackend::new(), move |req: &Request<Body>| {
        let id = path_params(req).get("id")?.to_owned();
        Some(LockSpec::new(format!("acct:{id}"), Duration::from_secs(30)))
    });
    Router::new().route(
        "/m5/{id}",
        post(move |_: Locks| {
            let held = held.clone();
            async move {
                held.entered.notify_one();
                held.release.notified().await;
                "done"
            }
        })
        .layer(layer),
    )
}

async fn post_status(app: &Router, path: &str) -> StatusCode {
    app.clone()
        .oneshot(Request::post(path).body(Body::empty()).unwrap())
        .await
        .unwrap()
        .status()
}

/// One span per acquisition, with the outcome, the wait and the hashed key,
/// never the key itself.
#[tokio::test(flavor = "current_thread")]
async fn the_acquisition_span_has_outcome_wait_and_hashed_key_only() {
    let (logs, _guard) = Logs::capture(tracing::Level::DEBUG);
    let gate = Arc::new(Gate::default());
    let app = holding_app(gate.clone());
    let holder = tokio::spawn({
        let app = app.clone();
        async move { post_status(&app, "/m5/secret-account-9").await }
    });
    gate.entered.notified().await;
    assert_eq!(
        post_status(&app, "/m5/secret-account-9").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    gate.release.notify_one();
    assert_eq!(holder.await.unwrap(), StatusCode::OK);

    let text = logs.text();
    let spans: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("tower_lock.acquire{"))
        .collect();
    assert!(
        spans
            .iter()
            .any(|l| l.contains("outcome=\"acquired\"") || l.contains("outcome=acquired")),
        "{text}"
    );
    assert!(
        spans
            .iter()
            .any(|l| l.contains("outcome=\"busy\"") || l.contains("outcome=busy")),
        "{text}"
    );
    assert!(spans.iter().all(|l| l.contains("wait_ms=")), "{text}");
    assert!(spans.iter().all(|l| l.contains("key=")), "{text}");
    assert!(
        !text.contains("secret-account-9"),
        "a raw key was logged:\n{text}"
    );
}
