//! `LockLayer` among the tower-http layers apps stack with it (timeout,
//! compression, trace, catch-panic, CORS), around it and inside it, in one
//! `ServiceBuilder` on an axum route: every response still releases the
//! lock, also when an outer layer gives up on the request (timeout) or a
//! handler panics.

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use http::{Request, StatusCode, header};
use http_body_util::BodyExt;
use tower::{ServiceBuilder, ServiceExt};
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::compression::CompressionLayer;
use tower_http::cors::CorsLayer;
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::TraceLayer;
use tower_lock::{LockKey, LockLayer, LockSpec, MemoryBackend, SharedBackend};

const TIMEOUT: Duration = Duration::from_millis(200);

fn locker(_: &Request<Body>) -> Option<LockSpec> {
    Some(LockSpec::global("k", Duration::from_secs(30)))
}

/// `/ok` (a body big enough to compress), `/slow` (past the timeout),
/// `/panic`.
fn handlers() -> Router {
    Router::new()
        .route("/ok", post(|| async { "x".repeat(4096) }))
        .route(
            "/slow",
            post(|| async {
                tokio::time::sleep(Duration::from_secs(30)).await;
                "late"
            }),
        )
        .route(
            "/panic",
            post(|| async {
                if true {
                    panic!("handler failed");
                }
                "never"
            }),
        )
}

async fn call(app: &Router, path: &str) -> (StatusCode, Option<String>, usize) {
    let req = Request::post(path)
        .header(header::ACCEPT_ENCODING, "gzip")
        .header(header::ORIGIN, "https://example.com")
        .body(Body::empty())
        .unwrap();
    let res = app.clone().oneshot(req).await.unwrap();
    let status = res.status();
    let encoding = res
        .headers()
        .get(header::CONTENT_ENCODING)
        .map(|v| v.to_str().unwrap().to_owned());
    let body = res.into_body().collect().await.unwrap().to_bytes();
    (status, encoding, body.len())
}

async fn assert_free(backend: &SharedBackend) {
    let key = LockKey::global("k").unwrap();
    assert_eq!(backend.status(&key).await.unwrap(), None, "lock released");
}

async fn exercise(app: Router, backend: &SharedBackend) {
    let (status, encoding, len) = call(&app, "/ok").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(encoding.as_deref(), Some("gzip"), "compressed");
    assert!(len < 4096);
    assert_free(backend).await;

    let (status, _, _) = call(&app, "/slow").await;
    assert_eq!(status, StatusCode::REQUEST_TIMEOUT);
    assert_free(backend).await;

    let (status, _, _) = call(&app, "/panic").await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_free(backend).await;
}

/// The tower-http layers around `LockLayer` in one `ServiceBuilder`: the
/// timeout answers `408` with an empty `LockBody` of its own.
#[tokio::test]
async fn tower_http_layers_around_lock_layer() {
    let backend = SharedBackend::new(MemoryBackend::new());
    let stack = ServiceBuilder::new()
        .layer(TraceLayer::new_for_http())
        .layer(CorsLayer::permissive())
        .layer(CompressionLayer::new())
        .layer(TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            TIMEOUT,
        ))
        .layer(CatchPanicLayer::new())
        .layer(LockLayer::new(backend.clone(), locker));
    exercise(handlers().layer(stack), &backend).await;
}

/// The same layers inside `LockLayer`: it wraps their bodies.
#[tokio::test]
async fn tower_http_layers_inside_lock_layer() {
    let backend = SharedBackend::new(MemoryBackend::new());
    let stack = ServiceBuilder::new()
        .layer(LockLayer::new(backend.clone(), locker))
        .layer(TraceLayer::new_for_http())
        .layer(CorsLayer::permissive())
        .layer(CompressionLayer::new())
        .layer(TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            TIMEOUT,
        ))
        .layer(CatchPanicLayer::new());
    exercise(handlers().layer(stack), &backend).await;
}

/// Compile-time checks: what axum's `route_layer`/`layer` and a
/// multi-threaded server need from the layer, its service, future and body.
#[test]
fn layer_service_future_and_body_are_send_sync() {
    fn send_sync_clone<T: Send + Sync + Clone + 'static>() {}
    fn send<T: Send>() {}
    fn send_sync<T: Send + Sync>() {}
    type Locker = fn(&Request<Body>) -> Option<LockSpec>;
    type Inner = axum::routing::Route;
    send_sync_clone::<LockLayer<Locker>>();
    send_sync_clone::<tower_lock::layer::LockService<Inner, Locker>>();
    send::<tower_lock::layer::ResponseFuture<Inner, Body, Body>>();
    send::<tower_lock::layer::LockBody<Body>>();
    send_sync_clone::<SharedBackend>();
    send_sync_clone::<tower_lock::Locks>();
    send_sync::<tower_lock::OwnedLock>();
}
