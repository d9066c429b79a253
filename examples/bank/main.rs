//! A toy bank whose deposits are serialised by a lock on the account.
//!
//! ```sh
//! cargo run --release --example bank -- --listen 127.0.0.1:3000
//! cargo run --release --example bank -- --listen 127.0.0.1:3001 --redis redis://127.0.0.1:6379
//! cargo run --release --features postgres --example bank -- --postgres postgres://app:pw@127.0.0.1/app
//! cargo run --release --features redis-cluster --example bank -- --redis-cluster redis://127.0.0.1:7000,redis://127.0.0.1:7001
//! cargo run --release --features etcd --example bank -- --etcd http://127.0.0.1:2379,http://127.0.0.1:22379
//! ```
//!
//! - `POST /accounts/{id}/deposit?amount=N[&hold_ms=M][&wait_ms=W][&ttl_ms=T]`
//!   locks `account:{id}` (global scope, TTL `T` ms or 30 s, waiting up to
//!   `W` ms, default 0), then reads the balance, sleeps `M` ms and writes
//!   balance + N. It answers `{"balance": new, "fence": fencing token}`.
//!   `T` is at most 24 h, `W`, `M` (and `pause_ms` below) at most 60 s:
//!   more is a `400`.
//!   The read-then-write is deliberate: without the lock (or with a TTL
//!   shorter than the hold) concurrent deposits lose updates.
//!   `keep=true` keeps the lock after the response (auto-release off): the
//!   response carries it in the `lock-key`, `lock-owner`, `lock-fence` and
//!   `lock-expires-at` headers, and the lock is freed by its TTL or by
//!   `DELETE /admin/locks/account:{id}` with the `lock-owner` header.
//!   `watchdog=true` renews the lock every TTL/3 while the deposit runs.
//! - `GET /accounts/{id}` answers `{"balance": n}` (`{"balance": n,
//!   "fence": f}` with `--fenced`) under a **shared** hold on
//!   `account:{id}`: reads run together, never beside a deposit (they wait
//!   up to 5 s for a running one, then `429`), and a deposit finds the
//!   account busy while reads hold it. On a backend without shared holds
//!   (a custom backend whose `supports` says no), and with `--fenced` (whose reads
//!   report the store's own view, balance and highest fence, which the
//!   fencing demonstrations watch while a holder is frozen mid-deposit),
//!   reads take no lock, as before.
//! - `POST /accounts/{id}/export?work_ms=M[&wait_ms=W]` holds one of the
//!   account's **2 permits** (`export:{id}`, across every bank process
//!   sharing the store; renewed by the watchdog while it works), counts
//!   itself in the store's count of the account's running exports, works
//!   `M` ms (at most 60 000) and answers `{"account": id, "running": n}`, `n`
//!   the exports running when it started, itself included. A third export
//!   waits up to `W` ms (default 0) for a permit, then gets `429`. On a
//!   backend without permits (a custom backend whose `supports` says no): `501`
//!   `LOCK_UNSUPPORTED`.
//! - With `--fenced`, the balance store refuses stale holders: it remembers,
//!   per account, the highest fence a deposit has read or written it with,
//!   and a deposit reads and writes with its lock's fence, each atomically
//!   with the check, so a holder whose lease ran out (a pause, a TTL shorter
//!   than the hold) cannot write over a newer holder's work. A refused
//!   deposit answers `409` with code `STALE_FENCE` and changes nothing; one
//!   that sees its own lock lost before it writes (its TTL passed, or a
//!   renewal found it gone) answers `409` with code `LOCK_LOST`.
//!   `pause_ms=P` pauses the deposit between that check and its write, as a
//!   GC or swap could: only the store's fence check can refuse it then. A
//!   write that gets no answer (the store went away) is looked up by its
//!   fence before the deposit answers. The
//!   read counts too: a check on the write alone would accept a stale write
//!   made after the newer holder read but before it wrote, and that holder
//!   would then overwrite it.
//! - `GET /accounts/{id}/statement?work_ms=M[&result_ttl_ms=T][&fail=true]`
//!   computes a statement through a [`SingleFlightLayer`] keyed
//!   `statement:{id}`: concurrent requests for one account (in every bank
//!   process sharing the store) run one computation, which sleeps `M` ms
//!   (at most 60 000), then answers `{"account": id, "balance": n,
//!   "computation": c}` with `c` a random number naming that computation;
//!   the others wait and get a copy of that response (header
//!   `single-flight: shared`). The result answers new requests for `T` ms
//!   (default 0: only those already waiting). `fail=true` makes the
//!   computation answer `500` (code `STATEMENT_FAILED`), which is neither
//!   shared nor stored: one waiting request computes in its place.
//! - `GET /stats` answers `{"statements_computed": n,
//!   "max_concurrent_exports": {"<id>": m, ...}}`: statement computations
//!   run by this process, and per account the most exports it saw running
//!   at once (by the store's count, shared by every process: the highest
//!   over all processes is the most that ever ran together; never above 2).
//! - With `--metrics` (needs tower-lock's feature `metrics`), `GET /metrics`
//!   answers tower-lock's metrics in the Prometheus text format (through
//!   `metrics-exporter-prometheus`): acquisitions of the deposit route by
//!   outcome (`acquired`, `busy`, ...), wait and held time histograms,
//!   statement flights by outcome, and the rest of the README's table.
//! - With `--admin-token T`, the admin API is mounted under `/admin` behind
//!   `Authorization: Bearer T`: `GET /admin/locks/account:7`,
//!   `DELETE /admin/locks/account:7` (owner in the `lock-owner` header) and
//!   `DELETE /admin/locks/account:7?force=true`.
//!
//! A busy account gets the layer's `429` with `Retry-After`; bad query
//! parameters get `400`, an unreachable balance store `503`, all with a JSON
//! body `{"error": {"code": "...", "message": "..."}}`.
//!
//! Balances and locks live in memory, or with `--redis URL` both live in
//! that Redis (balances under `bank:balance:{id}`), or with `--postgres URL`
//! both live in that PostgreSQL database (feature `postgres`; locks in
//! `tower_lock.locks`, balances in `bank_balances`, both created at start-up
//! or as soon as the database answers), so several bank processes can serve
//! the same accounts. `--redis-cluster URL[,URL…]` (feature `redis-cluster`)
//! does as `--redis` on a Redis Cluster: any of its nodes will do, and
//! naming several lets the bank start while one is down. `--etcd
//! URL[,URL…]` (feature `etcd`) keeps both in an etcd cluster (balances
//! under `bank/balance/{id}`): name its members' client endpoints.
//!
//! Prints `listening on ADDR` (the bound address) once it accepts requests.

use std::collections::HashMap;
use std::io::Write;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, Request, StatusCode, Uri, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router, body::Body};
use serde_json::json;
use tower_lock::admin::Admin;
use tower_lock::flight::{FlightSpec, SingleFlight, SingleFlightLayer};
use tower_lock::{LockLayer, LockSpec, Locks, MemoryBackend, SharedBackend, path_params};

mod deposit;
mod etcd_balances;
mod export;
mod metrics;
mod pg_balances;
mod redis_balances;
mod statement;
mod store;

use deposit::*;
use etcd_balances::*;
use export::*;
use metrics::*;
use pg_balances::*;
use redis_balances::*;
use statement::*;
use store::*;

const USAGE: &str =
    "usage: bank [--listen ADDR] [--redis URL | --redis-cluster URL[,URL…] | --postgres URL | --etcd URL[,URL…]] [--admin-token T] [--fenced] [--metrics]

  --listen ADDR       address to listen on (default 127.0.0.1:3000; port 0 picks one)
  --redis URL         keep locks and balances in this Redis (e.g. redis://127.0.0.1:6379)
  --redis-cluster URL[,URL…]
                      keep locks and balances in this Redis Cluster, known by some of
                      its nodes (e.g. redis://127.0.0.1:7000,redis://127.0.0.1:7001;
                      needs feature `redis-cluster`)
  --postgres URL      keep locks and balances in this PostgreSQL database
                      (e.g. postgres://user:password@127.0.0.1/bank; needs feature `postgres`)
  --etcd URL[,URL…]   keep locks and balances in this etcd cluster, known by its members'
                      client endpoints (e.g. http://127.0.0.1:2379,http://127.0.0.1:22379;
                      needs feature `etcd`)
  --admin-token T     mount the lock admin API under /admin, for `Authorization: Bearer T`
  --fenced            refuse deposits whose lock is stale (fencing tokens checked by the store)
  --metrics           serve tower-lock's metrics at GET /metrics, Prometheus text format
                      (needs feature `metrics`)
  -h, --help          show this help";

/// TTL of an account lock unless the request says `ttl_ms`.
const DEFAULT_TTL: Duration = Duration::from_secs(30);
/// The longest TTL a deposit may ask for (`ttl_ms`).
const MAX_LOCK_TTL: Duration = Duration::from_secs(24 * 3600);

/// How long a statement request waits for another's computation.
const STATEMENT_MAX_WAIT: Duration = Duration::from_secs(60);
/// TTL of a statement flight's lock (renewed while it computes): a bank
/// killed mid-computation is replaced by a waiting one within it.
const STATEMENT_LOCK_TTL: Duration = Duration::from_secs(3);
/// The longest statement computation a request may ask for.
const MAX_WORK: Duration = Duration::from_secs(60);
/// The longest result TTL a request may ask for.
const MAX_RESULT_TTL: Duration = Duration::from_secs(24 * 3600);

/// Upper bound on one balance read or write, so a hung store answers 503
/// instead of keeping the request (and the account's lock) forever.
#[cfg(any(feature = "redis", feature = "postgres", feature = "etcd"))]
const STORE_TIMEOUT: Duration = Duration::from_secs(2);

#[tokio::main]
async fn main() -> ExitCode {
    let args = match Args::parse(std::env::args().skip(1)) {
        Ok(Some(args)) => args,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(msg) => {
            eprintln!("bank: {msg}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bank: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Command-line flags.
#[derive(Debug)]
struct Args {
    listen: String,
    redis: Option<String>,
    redis_cluster: Option<String>,
    postgres: Option<String>,
    etcd: Option<String>,
    admin_token: Option<String>,
    fenced: bool,
    metrics: bool,
}

impl Args {
    /// `Ok(None)` for `--help`; `Err` for anything the usage doesn't allow.
    fn parse(mut args: impl Iterator<Item = String>) -> Result<Option<Args>, String> {
        let mut listen = None;
        let mut redis = None;
        let mut redis_cluster = None;
        let mut postgres = None;
        let mut etcd = None;
        let mut admin_token = None;
        let mut fenced = None;
        let mut metrics = None;
        while let Some(arg) = args.next() {
            // Accept both `--flag value` and `--flag=value`.
            let (flag, inline) = match arg.split_once('=') {
                Some((flag, value)) if flag.starts_with("--") => (flag, Some(value.to_owned())),
                _ => (arg.as_str(), None),
            };
            let switch = match flag {
                "--fenced" => Some(&mut fenced),
                "--metrics" => Some(&mut metrics),
                _ => None,
            };
            if let Some(switch) = switch {
                // A switch: `--fenced`, or `--fenced=true|false`.
                let on = match inline.as_deref() {
                    None | Some("true") => true,
                    Some("false") => false,
                    Some(other) => return Err(format!("{flag} takes no value (got `{other}`)")),
                };
                if switch.replace(on).is_some() {
                    return Err(format!("{flag} given twice"));
                }
                continue;
            }
            let slot = match flag {
                "-h" | "--help" => return Ok(None),
                "--listen" => &mut listen,
                "--redis" => &mut redis,
                "--redis-cluster" => &mut redis_cluster,
                "--postgres" => &mut postgres,
                "--etcd" => &mut etcd,
                "--admin-token" => &mut admin_token,
                _ => return Err(format!("unknown argument `{arg}`")),
            };
            let value = match inline.or_else(|| args.next()) {
                Some(value) if !value.is_empty() => value,
                _ => return Err(format!("{flag} needs a value")),
            };
            if slot.replace(value).is_some() {
                return Err(format!("{flag} given twice"));
            }
        }
        if redis.is_some() && postgres.is_some() {
            return Err("give --redis or --postgres, not both".to_owned());
        }
        if redis_cluster.is_some() && (redis.is_some() || postgres.is_some()) {
            return Err("give --redis-cluster alone, without --redis or --postgres".to_owned());
        }
        if etcd.is_some() && (redis.is_some() || redis_cluster.is_some() || postgres.is_some()) {
            return Err(
                "give --etcd alone, without --redis, --redis-cluster or --postgres".to_owned(),
            );
        }
        Ok(Some(Args {
            listen: listen.unwrap_or_else(|| "127.0.0.1:3000".to_owned()),
            redis,
            redis_cluster,
            postgres,
            etcd,
            admin_token,
            fenced: fenced.unwrap_or(false),
            metrics: metrics.unwrap_or(false),
        }))
    }
}

async fn run(args: Args) -> Result<(), String> {
    let bank = match (&args.redis, &args.postgres) {
        (Some(url), _) => redis_bank(url).await?,
        (None, Some(url)) => postgres_bank(url).await?,
        (None, None) if args.redis_cluster.is_some() => {
            redis_cluster_bank(args.redis_cluster.as_deref().unwrap_or_default()).await?
        }
        (None, None) if args.etcd.is_some() => {
            etcd_bank(args.etcd.as_deref().unwrap_or_default()).await?
        }
        (None, None) => Bank {
            locks: SharedBackend::new(MemoryBackend::new()),
            balances: Balances::Memory(Mutex::default()),
            fenced: false,
            statements_computed: AtomicU64::new(0),
            exports: Exports::default(),
        },
    };
    let bank = Bank {
        fenced: args.fenced,
        ..bank
    };
    // Before anything records: metrics go to the recorder installed then.
    let metrics = if args.metrics {
        Some(install_metrics()?)
    } else {
        None
    };
    let app = router(Arc::new(bank), args.admin_token.as_deref(), metrics);

    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    println!("listening on {addr}");
    std::io::stdout().flush().map_err(|e| e.to_string())?;

    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown_signal())
        .await
        .map_err(|e| e.to_string())
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Shared state: where the locks and the balances live.
struct Bank {
    /// Shared with the layer (and, later, an admin API on the same locks).
    locks: SharedBackend,
    balances: Balances,
    /// Deposits read and write with their lock's fence (`--fenced`).
    fenced: bool,
    /// Statement computations run by this process.
    statements_computed: AtomicU64,
    /// The most exports of each account seen running at once.
    exports: Exports,
}

fn router(bank: Arc<Bank>, admin_token: Option<&str>, metrics: Option<Metrics>) -> Router {
    let lock_account = LockLayer::new(bank.locks.clone(), deposit_lock);
    // Statements share computations through the same store as the locks.
    let flights = SingleFlight::new(bank.locks.clone())
        .max_wait(STATEMENT_MAX_WAIT)
        .lock_ttl(STATEMENT_LOCK_TTL);
    let one_statement = SingleFlightLayer::new(flights, statement_flight);
    let mut app = Router::new()
        .route("/accounts/{id}/deposit", post(deposit).layer(lock_account))
        .route(
            "/accounts/{id}",
            get(balance).layer(LockLayer::new(bank.locks.clone(), read_locks(&bank))),
        )
        .route(
            "/accounts/{id}/export",
            post(export).layer(LockLayer::new(bank.locks.clone(), export_lock)),
        )
        .route(
            "/accounts/{id}/statement",
            get(statement).layer(one_statement),
        )
        .route("/stats", get(stats));
    #[cfg(feature = "metrics")]
    if let Some(handle) = metrics {
        app = app.route("/metrics", get(move || render_metrics(handle.clone())));
    }
    #[cfg(not(feature = "metrics"))]
    if let Some(never) = metrics {
        match never {}
    }
    if let Some(token) = admin_token {
        let expected: Arc<str> = Arc::from(format!("Bearer {token}"));
        let admin = Admin::new(bank.locks.clone())
            .allow_force(true)
            .router()
            .layer(middleware::from_fn(
                move |req: Request<Body>, next: Next| {
                    let expected = expected.clone();
                    async move { require_bearer(&expected, req, next).await }
                },
            ));
        app = app.nest("/admin", admin);
    }
    app.fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "NOT_FOUND", "no such route") })
        .with_state(bank)
}

/// The admin API's guard: `Authorization: Bearer <token>` or 401.
async fn require_bearer(expected: &str, req: Request<Body>, next: Next) -> Response {
    let authorized = req
        .headers()
        .get(header::AUTHORIZATION)
        .is_some_and(|v| constant_time_eq(v.as_bytes(), expected.as_bytes()));
    if !authorized {
        let mut res = ApiError::new(
            StatusCode::UNAUTHORIZED,
            "UNAUTHORIZED",
            "send `Authorization: Bearer <admin token>`",
        )
        .into_response();
        res.headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        return res;
    }
    next.run(req).await
}

/// Compare without an early exit (`subtle`), so timing does not reveal the
/// token.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    bool::from(subtle::ConstantTimeEq::ct_eq(a, b))
}

/// A JSON error: `{"error": {"code": ..., "message": ...}}`, the same shape
/// as the lock layer's rejections.
#[derive(Debug)]
struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }

    fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "BAD_REQUEST", message)
    }

    /// `503 STORE_UNAVAILABLE`.
    #[cfg_attr(
        not(any(feature = "redis", feature = "postgres", feature = "etcd")),
        allow(dead_code)
    )]
    fn store(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "STORE_UNAVAILABLE",
            message,
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({ "error": { "code": self.code, "message": self.message } });
        let mut res = (self.status, Json(body)).into_response();
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            res.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        res
    }
}
