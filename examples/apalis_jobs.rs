//! A lock handed from an HTTP request to an [apalis](https://docs.rs/apalis)
//! task, across processes, on one Redis (the locks and apalis's queue).
//!
//! - **web**: `POST /reports/{id}` takes the lock `report:{id}` through
//!   `LockLayer` (busy: `429`), cancels its release after the response and
//!   pushes a `BuildReport` task carrying the lock's `LockToken` onto
//!   apalis's Redis storage: `202 {"report", "queued": true, "fence"}`.
//!   `GET /reports/{id}` tells whether the report's lock is held, and by
//!   which fence: `{"report", "locked", "fence"}`.
//! - **worker**: an apalis worker on the same storage, its task function
//!   wrapped in `TaskLockLayer`, which restores each task's lock (under a new
//!   fence), hands it to the task as `Data<HeldLock>`, renews it while the
//!   task runs and releases it when the task is done, fails or panics.
//!
//! Run (one Redis, two terminals):
//!
//! ```text
//! cargo run --example apalis_jobs --features apalis -- --role worker
//! cargo run --example apalis_jobs --features apalis -- --role web --listen 127.0.0.1:3000
//! curl -X POST 127.0.0.1:3000/reports/7
//! ```
//!
//! Flags: `--redis URL` (default `redis://127.0.0.1:6379`), `--role web|worker`
//! (required), `--listen ADDR` (web only, default `127.0.0.1:3000`; port 0
//! picks one). The web prints `listening on ADDR` first, the worker
//! `worker ready`, then one line per task.
//!
//! Demo knobs on `POST /reports/{id}`: `?then=fail` or `?then=panic` makes
//! the task fail or panic instead of finishing (the lock is released
//! either way); `?gate=1` makes it wait, once running, until something is
//! pushed to the Redis list `go:report:{id}` (`RPUSH go:report:7 1`; at
//! most 30 s): a stand-in for long work, to watch the lock held while the
//! task runs (`tests/apalis_example.rs` drives it so).

use std::io::Write;
use std::time::Duration;

use apalis::prelude::*;
use apalis_redis::{Config, RedisStorage};
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tower_lock::job::LockedJob;
use tower_lock::job::apalis::TaskLockLayer;
use tower_lock::{
    HeldLock, LockLayer, LockSpec, LockToken, Locks, OwnedLock, RedisBackend, SharedBackend,
    path_params,
};

const USAGE: &str = "usage: apalis_jobs --role web|worker [--redis URL] [--listen ADDR]";
const QUEUE: &str = "reports";
/// apalis-redis 1.0 files every push under its scheduled set and wakes no
/// worker in another process: the worker looks for due tasks this often.
const POLL: Duration = Duration::from_millis(100);
const LOCK_TTL: Duration = Duration::from_secs(30);
/// How long a gated task waits for its go signal, in seconds.
const GATE_SECS: u64 = 30;

/// The task: which report, the lock it runs under, and the demo's knobs.
#[derive(Debug, Serialize, Deserialize)]
struct BuildReport {
    id: String,
    token: LockToken,
    then: Then,
    gate: bool,
}

/// Where the lock is, for `TaskLockLayer`.
impl LockedJob for BuildReport {
    fn lock_token(&self) -> Option<&LockToken> {
        Some(&self.token)
    }
}

/// How the task ends.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Then {
    Finish,
    Fail,
    Panic,
}

fn storage(conn: apalis_redis::ConnectionManager) -> RedisStorage<BuildReport> {
    RedisStorage::new(conn).with_config(Config::default().queue(QUEUE))
}

// ---------------------------------------------------------------------------
// The worker

/// The task function: runs with the restored lock in its data.
async fn build_report(
    task: BuildReport,
    lock: Data<HeldLock>,
    redis: Data<apalis_redis::Client>,
) -> Result<String, BoxDynError> {
    say(format!(
        "task report {}: running under fence {}",
        task.id,
        lock.fence()
    ));
    if task.gate {
        tokio::select! {
            go = wait_for_go(&redis, &task.id) => go?,
            // A task must stop once its lock is gone.
            _ = lock.lost() => return Err(AbortError::new("the report's lock was lost").into()),
        }
    }
    match task.then {
        Then::Finish => {
            say(format!("task report {}: done", task.id));
            Ok(format!("report {} built", task.id))
        }
        Then::Fail => {
            say(format!("task report {}: failing", task.id));
            Err(format!("report {} failed (asked to)", task.id).into())
        }
        Then::Panic => {
            say(format!("task report {}: panicking", task.id));
            panic!("report {} panicked (asked to)", task.id)
        }
    }
}

/// Block until something is pushed to `go:report:{id}` (a connection of
/// its own: BLPOP holds it).
async fn wait_for_go(redis: &apalis_redis::Client, id: &str) -> Result<(), BoxDynError> {
    let mut conn = redis.get_multiplexed_async_connection().await?;
    let popped: Option<(String, String)> = deadpool_redis::redis::cmd("BLPOP")
        .arg(format!("go:report:{id}"))
        .arg(GATE_SECS)
        .query_async(&mut conn)
        .await?;
    match popped {
        Some(_) => Ok(()),
        None => Err(format!("no go signal for report {id} within {GATE_SECS} s").into()),
    }
}

async fn worker(url: &str) -> Result<(), String> {
    let locks = SharedBackend::new(RedisBackend::from_url(url).map_err(|e| e.to_string())?);
    let client = apalis_redis::Client::open(url).map_err(|e| e.to_string())?;
    let conn = apalis_redis::connect(url)
        .await
        .map_err(|e| format!("cannot connect to {url}: {e}"))?;
    let worker = WorkerBuilder::new("reports")
        .backend(storage(conn).poll_with_interval(POLL))
        .data(client)
        // Restore each task's lock, renew it while the task runs, release it
        // when the task ends.
        .layer(TaskLockLayer::new(locks).watchdog(true))
        // Inside the lock layer: a panic becomes the task's error, and the
        // lock is released before the task is reported.
        .catch_panic()
        .build(build_report);
    say("worker ready".to_owned());
    worker.run().await.map_err(|e| e.to_string())
}

// ---------------------------------------------------------------------------
// The web

#[derive(Clone)]
struct Web {
    locks: SharedBackend,
    queue: RedisStorage<BuildReport>,
}

fn report_spec(id: &str) -> LockSpec {
    LockSpec::global(format!("report:{id}"), LOCK_TTL)
}

fn app(web: Web) -> Router {
    let lock_report = LockLayer::new(web.locks.clone(), |req: &Request<Body>| {
        Some(report_spec(path_params(req).get("id")?))
    });
    Router::new()
        .route(
            "/reports/{id}",
            post(queue_report).layer(lock_report).get(report_status),
        )
        .with_state(web)
}

#[derive(Deserialize)]
struct Knobs {
    then: Option<String>,
    gate: Option<String>,
}

fn bad_request(message: String) -> Response {
    let body = json!({"error": {"code": "BAD_REQUEST", "message": message}});
    (StatusCode::BAD_REQUEST, Json(body)).into_response()
}

async fn queue_report(
    State(mut web): State<Web>,
    Path(id): Path<String>,
    Query(knobs): Query<Knobs>,
    locks: Locks,
) -> Response {
    let then = match knobs.then.as_deref() {
        None | Some("finish") => Then::Finish,
        Some("fail") => Then::Fail,
        Some("panic") => Then::Panic,
        Some(other) => return bad_request(format!("then={other}: finish, fail or panic")),
    };
    let gate = match knobs.gate.as_deref() {
        None | Some("0") => false,
        Some("1") => true,
        Some(other) => return bad_request(format!("gate={other}: 0 or 1")),
    };
    // Keep the lock after the response: the task releases it.
    let lock = locks
        .cancel_auto_release(&format!("report:{id}"))
        .expect("the layer took it");
    let fence = lock.fence();
    let token = lock.into_token();
    let task = BuildReport {
        id: id.clone(),
        token: token.clone(),
        then,
        gate,
    };
    if let Err(e) = web.queue.push(task).await {
        // Not queued: nobody will release it, so release it here.
        if let Ok(lock) = OwnedLock::restore(web.locks.clone(), &token).await {
            let _ = lock.release().await;
        }
        let body = json!({"error": {"code": "QUEUE_UNAVAILABLE", "message": e.to_string()}});
        return (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response();
    }
    let body = json!({"report": id, "queued": true, "fence": fence});
    (StatusCode::ACCEPTED, Json(body)).into_response()
}

async fn report_status(State(web): State<Web>, Path(id): Path<String>) -> Response {
    let status = match report_spec(&id).to_lock_key() {
        Ok(key) => web.locks.status(&key).await,
        Err(e) => Err(e),
    };
    match status {
        Ok(Some(held)) => Json(json!({"report": id, "locked": true, "fence": held.fence})),
        Ok(None) => Json(json!({"report": id, "locked": false})),
        Err(e) => {
            let body = json!({"error": {"code": e.code(), "message": e.to_string()}});
            return (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response();
        }
    }
    .into_response()
}

async fn web(url: &str, listen: &str) -> Result<(), String> {
    let locks = SharedBackend::new(RedisBackend::from_url(url).map_err(|e| e.to_string())?);
    let conn = apalis_redis::connect(url)
        .await
        .map_err(|e| format!("cannot connect to {url}: {e}"))?;
    let app = app(Web {
        locks,
        queue: storage(conn),
    });
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    say(format!("listening on {addr}"));
    axum::serve(listener, app).await.map_err(|e| e.to_string())
}

// ---------------------------------------------------------------------------
// Flags

/// A line on stdout, flushed (a test reads it through a pipe).
fn say(line: String) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

struct Args {
    redis: String,
    role: String,
    listen: String,
}

fn parse(mut args: impl Iterator<Item = String>) -> Result<Args, String> {
    let (mut redis, mut role, mut listen) = (None, None, None);
    while let Some(flag) = args.next() {
        let slot = match flag.as_str() {
            "--redis" => &mut redis,
            "--role" => &mut role,
            "--listen" => &mut listen,
            _ => return Err(format!("unknown argument `{flag}`")),
        };
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        if slot.replace(value).is_some() {
            return Err(format!("{flag} given twice"));
        }
    }
    let role = role.ok_or("--role is required")?;
    if role != "web" && role != "worker" {
        return Err(format!("--role {role}: web or worker"));
    }
    Ok(Args {
        redis: redis.unwrap_or_else(|| "redis://127.0.0.1:6379".to_owned()),
        role,
        listen: listen.unwrap_or_else(|| "127.0.0.1:3000".to_owned()),
    })
}

#[tokio::main]
async fn main() {
    let args = match parse(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(e) => {
            eprintln!("{e}\n{USAGE}");
            std::process::exit(2);
        }
    };
    let run = match args.role.as_str() {
        "web" => web(&args.redis, &args.listen).await,
        _ => worker(&args.redis).await,
    };
    if let Err(e) = run {
        eprintln!("apalis_jobs: {e}");
        std::process::exit(1);
    }
}
