use std::time::Duration;

use axum::{Router, body::Body, routing::post};
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use tower::ServiceExt;
use tower_lock::{LockLayer, LockSpec, Locks, MemoryBackend, path_params};

fn app(backend: MemoryBackend) -> Router {
    let layer = LockLayer::new(backend, |req: &Request<Body>| {
        let id = path_params(req).get("id")?.to_owned();
        Some(LockSpec::new(
            format!("order:{id}"),
            Duration::from_secs(30),
        ))
    });
    Router::new().route(
        "/orders/{id}",
        post(|locks: Locks| async move { format!("fence {}", locks.first().unwrap().fence()) })
            .layer(layer),
    )
}

#[tokio::test]
async fn smoke() {
    let backend = MemoryBackend::new();
    let app = app(backend.clone());
    for _ in 0..3 {
        let res = app
            .clone()
            .oneshot(Request::post("/orders/1").body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        let body = res.into_body().collect().await.unwrap().to_bytes();
        assert!(body.starts_with(b"fence "), "{body:?}");
    }
    assert!(backend.is_empty());
}

/// A route whose locker names a lock only for `POST`: the `GET` passes
/// through untouched, so `Locks` is missing there and `Option<Locks>` is
/// `None`.
fn partly_locked(backend: MemoryBackend) -> Router {
    let layer = LockLayer::new(backend, |req: &Request<Body>| {
        (req.method() == http::Method::POST)
            .then(|| LockSpec::global("doc", Duration::from_secs(30)))
    });
    Router::new()
        .route(
            "/doc",
            axum::routing::get(|_: Locks| async { "unreachable" })
                .post(|_: Locks| async { "locked" })
                .layer(layer.clone()),
        )
        .route(
            "/maybe",
            axum::routing::get(|locks: Option<Locks>| async move {
                if locks.is_some() { "some" } else { "none" }
            })
            .post(
                |locks: Option<Locks>| async move { if locks.is_some() { "some" } else { "none" } },
            )
            .layer(layer),
        )
        .route("/bare", post(|_: Locks| async { "unreachable" }))
}

async fn send(app: &Router, method: &str, uri: &str) -> (StatusCode, String, String) {
    let res = app
        .clone()
        .oneshot(
            Request::builder()
                .method(method)
                .uri(uri)
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    let status = res.status();
    let content_type = res
        .headers()
        .get(http::header::CONTENT_TYPE)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let body = res.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        content_type,
        String::from_utf8(body.to_vec()).unwrap(),
    )
}

#[tokio::test]
async fn locks_extractor_without_locks_is_a_json_500_and_option_is_none() {
    let backend = MemoryBackend::new();
    let app = partly_locked(backend.clone());
    // The layer ran and named no lock for a GET of /doc; /bare has no layer.
    for (method, uri, code) in [
        ("GET", "/doc", "LOCK_NOT_REQUESTED"),
        ("POST", "/bare", "LOCK_LAYER_MISSING"),
    ] {
        let (status, content_type, body) = send(&app, method, uri).await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{method} {uri}");
        assert_eq!(content_type, "application/json", "{method} {uri}");
        let json: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(json["error"]["code"], code, "{body}");
        assert!(
            json["error"]["message"]
                .as_str()
                .unwrap()
                .contains("Option<Locks>"),
            "{body}"
        );
    }
    assert_eq!(
        send(&app, "POST", "/doc").await,
        (
            StatusCode::OK,
            "text/plain; charset=utf-8".into(),
            "locked".into()
        )
    );
    assert_eq!(send(&app, "GET", "/maybe").await.2, "none");
    assert_eq!(send(&app, "POST", "/maybe").await.2, "some");
    assert!(backend.is_empty());
}

mod common;
use common::logs::Logs;

/// (16.8) A layer wrapped around the router from outside runs before
/// routing, so `path_params(req).get("id")?` names no lock and every request
/// runs unlocked. The layer says so in the log, once.
#[tokio::test]
async fn a_layer_before_routing_warns_once_that_path_params_are_empty() {
    let (logs, _capture) = Logs::capture(tracing::Level::WARN);
    const WARNING: &str = "path_params read on a request that axum has not routed";
    let backend = MemoryBackend::new();
    let locker = |req: &Request<Body>| {
        let id = path_params(req).get("id")?.to_owned();
        Some(LockSpec::new(id, Duration::from_secs(30)))
    };
    // Wrapped around the router from outside: it runs before routing.
    let before_routing = tower::Layer::layer(
        &LockLayer::new(backend.clone(), locker),
        Router::new().route("/orders/{id}", post(|| async { "ok" })),
    );
    for _ in 0..3 {
        let res = before_routing
            .clone()
            .oneshot(Request::post("/orders/1").body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK);
    }
    assert_eq!(logs.count(WARNING), 1, "{}", logs.text());

    // On the router (after routing), the parameters are there: no warning.
    let after_routing = Router::new()
        .route("/orders/{id}", post(|| async { "ok" }))
        .layer(LockLayer::new(backend, locker));
    let res = after_routing
        .oneshot(Request::post("/orders/1").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(logs.count(WARNING), 1, "{}", logs.text());
}

/// (16.13) The `lock-route` header, echoed as it is into the admin API's
/// `?route=`, names the same lock even when the route pattern has `+`, `&`
/// or `=` (which mean something else in a query).
#[cfg(feature = "admin")]
#[tokio::test]
async fn kept_lock_headers_echo_into_the_admin_query_unchanged() {
    use tower_lock::SharedBackend;
    use tower_lock::admin::Admin;

    let backend = SharedBackend::new(MemoryBackend::new());
    let keep = LockLayer::new(backend.clone(), |_: &Request<Body>| {
        Some(LockSpec::new("k+1&x=y", Duration::from_secs(30)).auto_release(false))
    });
    let app = Router::new()
        .route("/a+b&c=d/{id}", post(|| async { "kept" }).layer(keep))
        .nest("/admin", Admin::new(backend).router());
    let res = app
        .clone()
        .oneshot(Request::post("/a+b&c=d/1").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let header = |name: &str| res.headers()[name].to_str().unwrap().to_owned();
    let uri = format!(
        "/admin/locks/{}?route={}",
        header("lock-key"),
        header("lock-route")
    );
    let release = Request::delete(uri.as_str())
        .header("lock-owner", header("lock-owner"))
        .body(Body::empty())
        .unwrap();
    let res = app.oneshot(release).await.unwrap();
    let status = res.status();
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(status, StatusCode::OK, "{uri}: {body:?}");
}
