//! Locks for background jobs and scheduled jobs, end to end, in one process.
//!
//! 1. **A job that keeps its request's lock** (Laravel's
//!    `releaseOnJobProcessedOrFailed`): `POST /reports/{id}` takes the lock
//!    `report:{id}`, cancels its release after the response, and queues a
//!    job carrying the lock as a `LockToken` on a plain tokio queue. A worker
//!    task runs the job handler under `JobLockLayer`, which restores the
//!    lock, hands it to the job and releases it when the job is processed,
//!    fails or panics. While the job runs, the same report answers `429`.
//! 2. **A singleton scheduled job** (ShedLock's `lockAtLeastFor` /
//!    `lockAtMostFor`): three instances fire the same nightly job a few
//!    milliseconds apart; `with_lock` with a minimum hold lets exactly one
//!    run, even though it finishes long before the others fire.
//!
//! Run: `cargo run --example jobs`. It checks what it prints and exits with
//! an error if a step went otherwise (`tests/jobs_example.rs` runs it).

use std::convert::Infallible;
use std::time::Duration;

use axum::body::Body;
use axum::extract::Path;
use axum::http::{Request, StatusCode};
use axum::routing::post;
use axum::{Json, Router};
use tokio::sync::{mpsc, oneshot};
use tower::{Service, ServiceBuilder, ServiceExt, service_fn};
use tower_lock::job::{JobLockLayer, LockedJob};
use tower_lock::{
    HeldLock, JobSpec, LockLayer, LockSpec, LockToken, Locks, MemoryBackend, SharedBackend,
    path_params, with_lock,
};

/// What the queue carries: the report to build and the lock it runs under.
struct ReportJob {
    id: String,
    token: LockToken,
    lock: Option<HeldLock>,
    /// Told when the job starts; the job then waits for `go` (so the demo
    /// can show the lock is held while it runs).
    started: Option<oneshot::Sender<()>>,
    go: Option<oneshot::Receiver<()>>,
}

impl LockedJob for ReportJob {
    fn lock_token(&self) -> Option<&LockToken> {
        Some(&self.token)
    }

    fn set_lock(&mut self, lock: HeldLock) {
        self.lock = Some(lock);
    }
}

/// The job handler: any `tower::Service<ReportJob>`.
async fn build_report(mut job: ReportJob) -> Result<String, Infallible> {
    let lock = job.lock.take().expect("JobLockLayer sets the lock");
    if let Some(started) = job.started.take() {
        let _ = started.send(());
    }
    if let Some(go) = job.go.take() {
        tokio::select! {
            _ = go => {}
            // A job must stop writing once its lock is gone.
            _ = lock.lost() => return Ok(format!("report {} aborted: lock lost", job.id)),
        }
    }
    Ok(format!(
        "report {} built under fence {}",
        job.id,
        lock.fence()
    ))
}

type Queue = mpsc::UnboundedSender<ReportJob>;

/// The demo hands each job its start/go channels through this slot.
type Hooks = std::sync::Arc<std::sync::Mutex<Option<(oneshot::Sender<()>, oneshot::Receiver<()>)>>>;

fn app(backend: &SharedBackend, queue: Queue, hooks: Hooks) -> Router {
    let reports = LockLayer::new(backend.clone(), |req: &Request<Body>| {
        let id = path_params(req).get("id")?.to_owned();
        Some(LockSpec::global(
            format!("report:{id}"),
            Duration::from_secs(30),
        ))
    });
    let handler = move |Path(id): Path<String>, locks: Locks| {
        let (queue, hooks) = (queue.clone(), hooks.clone());
        async move {
            // Keep the lock after the response: the job releases it.
            let lock = locks
                .cancel_auto_release(&format!("report:{id}"))
                .expect("the layer took it");
            let (started, go) = hooks.lock().unwrap().take().unzip();
            let job = ReportJob {
                id: id.clone(),
                token: lock.into_token(),
                lock: None,
                started,
                go,
            };
            queue.send(job).expect("the worker runs");
            (
                StatusCode::ACCEPTED,
                Json(serde_json::json!({"report": id, "queued": true})),
            )
        }
    };
    Router::new().route("/reports/{id}", post(handler).layer(reports))
}

/// The worker: takes jobs off the queue and runs each under the job layer.
fn spawn_worker(
    backend: SharedBackend,
    mut jobs: mpsc::UnboundedReceiver<ReportJob>,
) -> mpsc::UnboundedReceiver<String> {
    let (done_tx, done_rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut worker = ServiceBuilder::new()
            // Renew the lock while a long job runs.
            .layer(JobLockLayer::new(backend).watchdog(true))
            .service(service_fn(build_report));
        while let Some(job) = jobs.recv().await {
            let outcome = match worker.ready().await {
                Ok(worker) => worker.call(job).await,
                Err(e) => Err(e),
            };
            let line = match outcome {
                Ok(line) => line,
                Err(e) => format!("job failed: {e}"),
            };
            let _ = done_tx.send(line);
        }
    });
    done_rx
}

async fn post_report(app: &Router, id: &str) -> StatusCode {
    let req = Request::post(format!("/reports/{id}"))
        .body(Body::empty())
        .unwrap();
    app.clone().oneshot(req).await.unwrap().status()
}

fn check(ok: bool, what: &str) {
    if !ok {
        eprintln!("FAILED: {what}");
        std::process::exit(1);
    }
}

#[tokio::main]
async fn main() {
    let backend = SharedBackend::new(MemoryBackend::new());

    // --- 1. A job keeps its request's lock until it is processed.
    let (queue, jobs) = mpsc::unbounded_channel();
    let hooks: Hooks = Default::default();
    let app = app(&backend, queue, hooks.clone());
    let mut done = spawn_worker(backend.clone(), jobs);

    let (started_tx, started_rx) = oneshot::channel();
    let (go_tx, go_rx) = oneshot::channel();
    *hooks.lock().unwrap() = Some((started_tx, go_rx));
    let first = post_report(&app, "7").await;
    println!("POST /reports/7 -> {}", first.as_u16());
    check(first == StatusCode::ACCEPTED, "the first request is queued");

    started_rx.await.expect("the job starts");
    let busy = post_report(&app, "7").await;
    println!("POST /reports/7 while its job runs -> {}", busy.as_u16());
    check(
        busy == StatusCode::TOO_MANY_REQUESTS,
        "the report stays locked while its job runs",
    );

    let _ = go_tx.send(());
    let line = done.recv().await.expect("the job finishes");
    println!("worker: {line}");
    check(
        line.starts_with("report 7 built"),
        "the job ran under its lock",
    );

    let again = post_report(&app, "7").await;
    println!("POST /reports/7 after its job -> {}", again.as_u16());
    check(
        again == StatusCode::ACCEPTED,
        "the job released the lock when it was processed",
    );
    println!("worker: {}", done.recv().await.expect("the second job"));

    // --- 2. A singleton scheduled job: every instance fires, one runs.
    let nightly = JobSpec::new("cron:nightly-report", Duration::from_secs(60))
        // Finished early or not, hold it 2 s: an instance whose clock fires
        // a little later finds it taken. 60 s at most if the winner crashes.
        .min_hold(Duration::from_secs(2));
    let mut runs = Vec::new();
    for instance in ["a", "b", "c"] {
        let (backend, nightly) = (backend.clone(), nightly.clone());
        runs.push(tokio::spawn(async move {
            // Clocks differ a little between instances.
            tokio::time::sleep(Duration::from_millis(30) * (instance.as_bytes()[0] - b'a') as u32)
                .await;
            let ran = with_lock(&backend, &nightly, |lock| async move {
                format!("nightly report built under fence {}", lock.fence())
            })
            .await;
            match ran {
                Ok(line) => {
                    println!("cron instance {instance}: {line}");
                    true
                }
                Err(e) => {
                    println!("cron instance {instance}: skipped ({})", e.code());
                    false
                }
            }
        }));
    }
    let mut ran = 0;
    for run in runs {
        ran += usize::from(run.await.expect("instance"));
    }
    check(ran == 1, "exactly one instance runs the nightly job");
    println!("ok");
}
