//! Profiling aid: what the layer costs per request, without TCP or timing.
//!
//! Calls an axum router in-process, one request after another on a
//! current-thread runtime, so `perf stat -e instructions:u` (or callgrind)
//! sees the router, the handler and the layer only, deterministically.
//! `scripts/layer-cost.sh` runs each mode twice and prints instructions per
//! request; BENCHMARKS.md quotes those figures.
//!
//! ```sh
//! cargo run --release --example layer_cost -- MODE N
//! ```
//!
//! Modes (N requests or cycles each):
//! - `open`: `GET /open/{id}`, no layer;
//! - `locked`: `GET /locked/{id}` behind a `LockLayer` on a `MemoryBackend`,
//!   key `req:{id}` from `path_params`, as lockbench's `http` workload;
//! - `none`: behind a `LockLayer` whose locker takes no lock (pass-through);
//! - `ident`: behind `tower`'s `Identity` layer and a no-op
//!   `axum::middleware::map_response`: what any layer costs;
//! - `serial`: `OwnedLock::acquire` + `release` on a fresh key, no HTTP.

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::response::Response;
use axum::routing::get;
use http::Request;
use http_body_util::BodyExt;
use tower::{Service, ServiceExt};
use tower_lock::{
    JobSpec, LockLayer, LockSpec, MemoryBackend, OwnedLock, SharedBackend, path_params,
};

async fn ok() -> &'static str {
    "ok"
}

fn usage() -> ! {
    eprintln!("usage: layer_cost open|locked|none|ident|serial N");
    std::process::exit(2)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(mode), Some(n)) = (args.next(), args.next().and_then(|n| n.parse::<u64>().ok()))
    else {
        usage()
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(async move {
        let memory = MemoryBackend::new();
        let backend = SharedBackend::new(memory.clone());
        let route = get(ok);
        let route = match mode.as_str() {
            "serial" => {
                for i in 0..n {
                    let spec = JobSpec::new(format!("s:{i}"), Duration::from_secs(30));
                    let lock = OwnedLock::acquire(backend.clone(), &spec)
                        .await
                        .expect("a fresh key is free");
                    lock.release().await.expect("held");
                }
                return;
            }
            "open" => route,
            "locked" => route.layer(LockLayer::new(backend.clone(), |req: &Request<Body>| {
                let params = path_params(req);
                let id = params.get("id")?;
                Some(LockSpec::new(format!("req:{id}"), Duration::from_secs(30)))
            })),
            "none" => route.layer(LockLayer::new(backend.clone(), |_: &Request<Body>| {
                None::<LockSpec>
            })),
            "ident" => route.layer(tower::layer::util::Identity::new()).layer(
                axum::middleware::map_response(|r: Response| async move { r }),
            ),
            _ => usage(),
        };
        let mut app = Router::new().route(&format!("/{mode}/{{id}}"), route);
        for i in 0..n {
            let req = Request::get(format!("/{mode}/{i}"))
                .header(http::header::HOST, "127.0.0.1")
                .body(Body::empty())
                .expect("a valid request");
            let ready = ServiceExt::<Request<Body>>::ready(&mut app)
                .await
                .expect("the router is always ready");
            let res = ready.call(req).await.expect("infallible");
            assert!(res.status().is_success(), "{}", res.status());
            res.into_body().collect().await.expect("a complete body");
        }
        assert!(memory.is_empty(), "every lock was released");
    });
}
