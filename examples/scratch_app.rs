//! A scratch app written from the documentation alone, as a new user would:
//! every front door of the crate on one router, with no type annotation the
//! docs do not show. CI builds it (`cargo build --examples`), so an API
//! change that makes the documented way stop compiling fails there.
//!
//! ```sh
//! cargo run --example scratch_app     # serves nothing: builds the app, calls it once, exits
//! ```
//!
//! - a lock per order from a closure (`LockLayer::from_fn`, `|req|`), the
//!   handler extracting its lock (`HeldLock`);
//! - a handler returning `Result<_, LockError>`;
//! - single-flight and a lock on one route, in one `ServiceBuilder`;
//! - client-directed locks (`ClientLocks`), with a rejection of its own;
//! - a job taking a global lock (`JobSpec`) on the shared backend (`with_lock`), and a
//!   worker releasing a job's lock when the job is done (`JobLockLayer`).

use std::convert::Infallible;
use std::time::Duration;

use axum::body::Body;
use axum::routing::{get, post};
use axum::{Json, Router};
use http::{Request, StatusCode};
use serde_json::json;
use tower::{Service, ServiceBuilder, ServiceExt, service_fn};
use tower_lock::flight::{FlightSpec, SingleFlight, SingleFlightLayer};
use tower_lock::job::{JobLockLayer, LockedJob};
use tower_lock::{
    ClientLocks, HeldLock, JobSpec, LockError, LockLayer, LockSpec, LockToken, Locks,
    MemoryBackend, OwnedLock, SharedBackend, path_params, with_lock,
};

async fn pay(lock: HeldLock) -> String {
    format!("paid under fence {}", lock.fence())
}

async fn release_early(locks: Locks) -> Result<String, LockError> {
    let n = locks.release_all().await?;
    Ok(format!("released {n}"))
}

async fn report(lock: HeldLock) -> String {
    format!("report built under fence {}", lock.fence())
}

async fn charge(locks: Option<Locks>) -> &'static str {
    if locks.is_some() {
        "charged, locked"
    } else {
        "charged"
    }
}

/// A job carrying the lock its HTTP handler took.
struct Export {
    token: LockToken,
    lock: Option<HeldLock>,
}

impl LockedJob for Export {
    fn lock_token(&self) -> Option<&LockToken> {
        Some(&self.token)
    }
    fn set_lock(&mut self, lock: HeldLock) {
        self.lock = Some(lock);
    }
}

fn app(backend: &SharedBackend) -> Router {
    let orders = LockLayer::from_fn(backend.clone(), |req| {
        let id = path_params(req).get("id")?.to_owned();
        Some(
            LockSpec::new(format!("order:{id}"), Duration::from_secs(30))
                .max_wait(Duration::from_secs(2)),
        )
    });
    let imports = LockLayer::from_fn(backend.clone(), |_| {
        LockSpec::global("import", Duration::from_secs(60))
    });
    let flight = SingleFlightLayer::from_fn(SingleFlight::new(backend.clone()), |_| {
        FlightSpec::new("ledger-report")
    });
    let ledger = LockLayer::from_fn(backend.clone(), |_| {
        LockSpec::global("ledger", Duration::from_secs(30))
    });
    let client_locks = LockLayer::new(
        backend.clone(),
        ClientLocks::new().max_ttl(Duration::from_secs(30)),
    )
    .rejection(|e| (e.status(), Json(json!({"busy": e.code()}))));
    Router::new()
        .route("/orders/{id}/pay", post(pay).layer(orders))
        .route("/import", post(release_early).layer(imports))
        .route(
            "/report",
            get(report).layer(ServiceBuilder::new().layer(flight).layer(ledger)),
        )
        .route("/charge", post(charge).layer(client_locks))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let backend = SharedBackend::new(MemoryBackend::new());
    let app = app(&backend);
    for (method, path) in [
        ("POST", "/orders/7/pay"),
        ("POST", "/import"),
        ("GET", "/report"),
        ("POST", "/charge"),
    ] {
        let req = Request::builder()
            .method(method)
            .uri(path)
            .body(Body::empty())?;
        let res = app.clone().oneshot(req).await?;
        assert_eq!(res.status(), StatusCode::OK, "{method} {path}");
        println!("{method} {path}: {}", res.status());
    }

    // A job's own lock: global, on the shared backend.
    let nightly = JobSpec::new("nightly-report", Duration::from_secs(60));
    let rows = with_lock(&backend, &nightly, |lock| async move { lock.fence() }).await?;
    println!("nightly report under fence {rows}");

    // A lock handed to a job queue as a token, released when the job is done.
    let export = JobSpec::new("export:7", Duration::from_secs(60));
    let token = OwnedLock::acquire(&backend, &export).await?.into_token();
    let mut worker = ServiceBuilder::new()
        .layer(JobLockLayer::new(backend.clone()))
        .service(service_fn(|job: Export| async move {
            let fence = job.lock.map(|l| l.fence());
            Ok::<_, Infallible>(format!("exported under fence {fence:?}"))
        }));
    let done = worker
        .ready()
        .await?
        .call(Export { token, lock: None })
        .await?;
    println!("{done}");
    Ok(())
}
