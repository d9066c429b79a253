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
