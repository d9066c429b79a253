//! A toy bank whose deposits are serialised by a lock on the account.
//!
//! ```sh
//! cargo run --release --example bank -- --listen 127.0.0.1:3000
//! cargo run --release --example bank -- --listen 127.0.0.1:3001 --redis redis://127.0.0.1:6379
//! cargo run --release --features postgres --example bank -- --postgres postgres://app:pw@127.0.0.1/app
//! cargo run --release --features redis-cluster --example bank -- --redis-cluster redis://127.0.0.1:7000,redis://127.0.0.1:7001
//! ```
//!
//! - `POST /accounts/{id}/deposit?amount=N[&hold_ms=M][&wait_ms=W][&ttl_ms=T]`
//!   locks `account:{id}` (global scope, TTL `T` ms or 30 s, waiting up to
//!   `W` ms, default 0), then reads the balance, sleeps `M` ms and writes
//!   balance + N. It answers `{"balance": new, "fence": fencing token}`.
//!   The read-then-write is deliberate: without the lock (or with a TTL
//!   shorter than the hold) concurrent deposits lose updates.
//!   `keep=true` keeps the lock after the response (auto-release off): the
//!   response carries it in the `lock-key`, `lock-owner`, `lock-fence` and
//!   `lock-expires-at` headers, and the lock is freed by its TTL or by
//!   `DELETE /admin/locks/account:{id}` with the `lock-owner` header.
//!   `watchdog=true` renews the lock every TTL/3 while the deposit runs.
//! - `GET /accounts/{id}` answers `{"balance": n}` without locking
//!   (`{"balance": n, "fence": f}` with `--fenced`).
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
//! - `GET /stats` answers `{"statements_computed": n}`: statement
//!   computations run by this process.
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
//! naming several lets the bank start while one is down.
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
use tower_lock::{
    FlightSpec, LockLayer, LockSpec, Locks, MemoryBackend, SharedBackend, SingleFlight,
    SingleFlightLayer, path_params,
};

const USAGE: &str =
    "usage: bank [--listen ADDR] [--redis URL | --redis-cluster URL[,URL…] | --postgres URL] [--admin-token T] [--fenced] [--metrics]

  --listen ADDR       address to listen on (default 127.0.0.1:3000; port 0 picks one)
  --redis URL         keep locks and balances in this Redis (e.g. redis://127.0.0.1:6379)
  --redis-cluster URL[,URL…]
                      keep locks and balances in this Redis Cluster, known by some of
                      its nodes (e.g. redis://127.0.0.1:7000,redis://127.0.0.1:7001;
                      needs feature `redis-cluster`)
  --postgres URL      keep locks and balances in this PostgreSQL database
                      (e.g. postgres://user:password@127.0.0.1/bank; needs feature `postgres`)
  --admin-token T     mount the lock admin API under /admin, for `Authorization: Bearer T`
  --fenced            refuse deposits whose lock is stale (fencing tokens checked by the store)
  --metrics           serve tower-lock's metrics at GET /metrics, Prometheus text format
                      (needs feature `metrics`)
  -h, --help          show this help";

/// TTL of an account lock unless the request says `ttl_ms`.
const DEFAULT_TTL: Duration = Duration::from_secs(30);

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
#[cfg(any(feature = "redis", feature = "postgres"))]
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
        Ok(Some(Args {
            listen: listen.unwrap_or_else(|| "127.0.0.1:3000".to_owned()),
            redis,
            redis_cluster,
            postgres,
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
        (None, None) => Bank {
            locks: SharedBackend::new(MemoryBackend::new()),
            balances: Balances::Memory(Mutex::default()),
            fenced: false,
            statements_computed: AtomicU64::new(0),
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
        .route("/accounts/{id}", get(balance))
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

/// `--metrics`: the handle that renders what the process recorded.
#[cfg(feature = "metrics")]
type Metrics = metrics_exporter_prometheus::PrometheusHandle;
#[cfg(not(feature = "metrics"))]
type Metrics = std::convert::Infallible;

/// Install the Prometheus recorder for the whole process. Its default
/// features are off (no HTTP listener of its own: `/metrics` is a route of
/// this app), so upkeep (draining histogram samples) is ours.
#[cfg(feature = "metrics")]
fn install_metrics() -> Result<Metrics, String> {
    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
    /// Seconds, from a fast in-memory acquisition to a long hold.
    const BUCKETS: &[f64] = &[
        0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
        10.0, 30.0, 60.0,
    ];
    let handle = PrometheusBuilder::new()
        // Histograms, not the exporter's default summaries: they aggregate
        // over several bank processes.
        .set_buckets_for_metric(Matcher::Suffix("_seconds".to_owned()), BUCKETS)
        .and_then(PrometheusBuilder::install_recorder)
        .map_err(|e| format!("--metrics: {e}"))?;
    tower_lock::describe_metrics();
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_secs(5));
        loop {
            every.tick().await;
            upkeep.run_upkeep();
        }
    });
    Ok(handle)
}

#[cfg(not(feature = "metrics"))]
fn install_metrics() -> Result<Metrics, String> {
    Err("--metrics needs tower-lock's `metrics` feature".to_owned())
}

/// `GET /metrics`.
#[cfg(feature = "metrics")]
async fn render_metrics(handle: Metrics) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        handle.render(),
    )
        .into_response()
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

/// The [`LockRequest`](tower_lock::LockRequest) of the deposit route: lock
/// `account:{id}` as the query asks.
///
/// A request whose query is invalid takes no lock: the handler parses the
/// same query and answers 400 before touching the balance.
fn deposit_lock(req: &Request<Body>) -> Option<LockSpec> {
    let id = path_params(req).get("id")?.to_owned();
    let params = DepositParams::from_uri(req.uri()).ok()?;
    Some(params.lock_spec(&id))
}

/// The query of a deposit.
#[derive(Debug)]
struct DepositParams {
    amount: i64,
    hold: Duration,
    wait: Duration,
    ttl: Duration,
    keep: bool,
    watchdog: bool,
    /// A pause between the deposit's own lost-lock check and its write.
    pause: Duration,
}

impl DepositParams {
    fn from_uri(uri: &Uri) -> Result<Self, ApiError> {
        let Query(pairs) = Query::<Vec<(String, String)>>::try_from_uri(uri)
            .map_err(|_| ApiError::bad_request("the query string is malformed"))?;
        let mut amount = None;
        let mut hold_ms = None;
        let mut wait_ms = None;
        let mut ttl_ms = None;
        let mut keep = None;
        let mut watchdog = None;
        let mut pause_ms = None;
        for (name, value) in &pairs {
            match name.as_str() {
                "amount" => set_once(&mut amount, name, value)?,
                "hold_ms" => set_once(&mut hold_ms, name, value)?,
                "wait_ms" => set_once(&mut wait_ms, name, value)?,
                "ttl_ms" => set_once(&mut ttl_ms, name, value)?,
                "keep" => set_once(&mut keep, name, value)?,
                "watchdog" => set_once(&mut watchdog, name, value)?,
                "pause_ms" => set_once(&mut pause_ms, name, value)?,
                // Unknown parameters are ignored, as most HTTP APIs do.
                _ => {}
            }
        }
        let ms = |v: Option<u64>| v.map(Duration::from_millis);
        Ok(DepositParams {
            amount: amount
                .ok_or_else(|| ApiError::bad_request("missing query parameter `amount`"))?,
            hold: ms(hold_ms).unwrap_or(Duration::ZERO),
            wait: ms(wait_ms).unwrap_or(Duration::ZERO),
            ttl: ms(ttl_ms).unwrap_or(DEFAULT_TTL),
            keep: keep.unwrap_or(false),
            watchdog: watchdog.unwrap_or(false),
            pause: ms(pause_ms).unwrap_or(Duration::ZERO),
        })
    }

    fn lock_spec(&self, id: &str) -> LockSpec {
        LockSpec::new(format!("account:{id}"), self.ttl)
            .global()
            .max_wait(self.wait)
            .auto_release(!self.keep)
            .watchdog(self.watchdog)
    }
}

/// Parse `value` into `slot`, refusing a second occurrence of `name`.
fn set_once<T: std::str::FromStr>(
    slot: &mut Option<T>,
    name: &str,
    value: &str,
) -> Result<(), ApiError> {
    if slot.is_some() {
        return Err(ApiError::bad_request(format!(
            "query parameter `{name}` is given twice"
        )));
    }
    let parsed = value.parse().map_err(|_| {
        ApiError::bad_request(format!(
            "query parameter `{name}` has an invalid value `{value}` (integers in range; `true`/`false` for flags)"
        ))
    })?;
    *slot = Some(parsed);
    Ok(())
}

async fn deposit(
    State(bank): State<Arc<Bank>>,
    id: Result<Path<String>, axum::extract::rejection::PathRejection>,
    uri: Uri,
    locks: Option<Locks>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let Path(id) = id.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let params = DepositParams::from_uri(&uri)?;
    // Valid parameters always come with the lock (see `deposit_lock`); never
    // touch the balance without it.
    let lock = locks.and_then(|l| l.first()).ok_or_else(|| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "INTERNAL",
            "the account lock is not held",
        )
    })?;

    let fence = lock.fence();
    let balance = if bank.fenced {
        bank.balances.read_fenced(&id, fence).await?
    } else {
        bank.balances.get(&id).await?
    };
    tokio::time::sleep(params.hold).await;
    let balance = balance
        .checked_add(params.amount)
        .ok_or_else(|| ApiError::bad_request("the deposit would overflow the balance"))?;
    if bank.fenced {
        // Not enough alone (the process can pause between this check and the
        // write), which is why the store checks the fence as it writes.
        if lock.is_lost() {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "LOCK_LOST",
                "the account's lock was lost before the deposit could write (its TTL passed): \
                 nothing was written",
            ));
        }
        // A pause here (GC, swap, SIGSTOP) is what no check in the handler
        // can catch; `pause_ms` makes one.
        tokio::time::sleep(params.pause).await;
        bank.write_fenced(&id, balance, fence).await?;
    } else {
        bank.balances.set(&id, balance).await?;
    }

    Ok(Json(json!({ "balance": balance, "fence": fence })))
}

async fn balance(
    State(bank): State<Arc<Bank>>,
    id: Result<Path<String>, axum::extract::rejection::PathRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let Path(id) = id.map_err(|e| ApiError::bad_request(e.body_text()))?;
    if bank.fenced {
        let (balance, fence) = bank.balances.account(&id).await?;
        return Ok(Json(json!({ "balance": balance, "fence": fence })));
    }
    let balance = bank.balances.get(&id).await?;
    Ok(Json(json!({ "balance": balance })))
}

/// The single-flight of the statement route: one computation per account
/// at a time. An invalid query shares nothing: the handler answers 400.
fn statement_flight(req: &Request<Body>) -> Option<FlightSpec> {
    let id = path_params(req).get("id")?.to_owned();
    let params = StatementParams::from_uri(req.uri()).ok()?;
    Some(FlightSpec::new(format!("statement:{id}")).result_ttl(params.result_ttl))
}

/// The query of a statement.
struct StatementParams {
    work: Duration,
    result_ttl: Duration,
    fail: bool,
}

impl StatementParams {
    fn from_uri(uri: &Uri) -> Result<Self, ApiError> {
        let Query(pairs) = Query::<Vec<(String, String)>>::try_from_uri(uri)
            .map_err(|_| ApiError::bad_request("the query string is malformed"))?;
        let mut work_ms = None;
        let mut result_ttl_ms = None;
        let mut fail = None;
        for (name, value) in &pairs {
            match name.as_str() {
                "work_ms" => set_once(&mut work_ms, name, value)?,
                "result_ttl_ms" => set_once(&mut result_ttl_ms, name, value)?,
                "fail" => set_once(&mut fail, name, value)?,
                _ => {}
            }
        }
        let bounded = |ms: Option<u64>, max: Duration, name: &str| {
            let d = Duration::from_millis(ms.unwrap_or(0));
            if d > max {
                return Err(ApiError::bad_request(format!(
                    "query parameter `{name}` is over {} ms",
                    max.as_millis()
                )));
            }
            Ok(d)
        };
        Ok(StatementParams {
            work: bounded(work_ms, MAX_WORK, "work_ms")?,
            result_ttl: bounded(result_ttl_ms, MAX_RESULT_TTL, "result_ttl_ms")?,
            fail: fail.unwrap_or(false),
        })
    }
}

/// One statement computation (the single-flight layer runs it once per
/// burst): `work_ms` of work, then the balance.
async fn statement(
    State(bank): State<Arc<Bank>>,
    id: Result<Path<String>, axum::extract::rejection::PathRejection>,
    uri: Uri,
) -> Result<Json<serde_json::Value>, ApiError> {
    let Path(id) = id.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let params = StatementParams::from_uri(&uri)?;
    bank.statements_computed.fetch_add(1, Ordering::Relaxed);
    tokio::time::sleep(params.work).await;
    if params.fail {
        return Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "STATEMENT_FAILED",
            "the statement computation failed (fail=true)",
        ));
    }
    let balance = bank.balances.get(&id).await?;
    // Names this computation: equal bodies came from one computation.
    let computation = uuid::Uuid::new_v4().as_u64_pair().0;
    Ok(Json(json!({
        "account": id,
        "balance": balance,
        "computation": computation,
    })))
}

/// `GET /stats`.
async fn stats(State(bank): State<Arc<Bank>>) -> Json<serde_json::Value> {
    Json(json!({
        "statements_computed": bank.statements_computed.load(Ordering::Relaxed),
    }))
}

impl Bank {
    /// [`Balances::write_fenced`], finding out whether a write that got no
    /// answer (the store went away mid-call) landed: the fence names this
    /// write, since no other deposit writes with it. Looked up until
    /// [`STORE_TIMEOUT`] has passed; only a store away for all of it leaves
    /// the outcome unknown (`503`).
    async fn write_fenced(&self, id: &str, balance: i64, fence: u64) -> Result<(), ApiError> {
        let err = match self.balances.write_fenced(id, balance, fence).await {
            Err(e) if e.code == "STORE_UNAVAILABLE" => e,
            done => return done,
        };
        #[cfg(any(feature = "redis", feature = "postgres"))]
        {
            let deadline = tokio::time::Instant::now() + STORE_TIMEOUT;
            while tokio::time::Instant::now() < deadline {
                match self.balances.account(id).await {
                    Ok((stored, seen)) if seen == fence && stored == balance => return Ok(()),
                    // Not written (and never will be: the call's connection is
                    // gone); another fence: someone newer used the account.
                    Ok(_) => return Err(err),
                    Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
            tracing::warn!("a fenced write's outcome is unknown: the store stayed away");
        }
        Err(err)
    }
}

/// A deposit refused by the store: a newer lock holder has read or written
/// the account since this deposit's lock was taken.
fn stale_fence() -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "STALE_FENCE",
        "a deposit holding a newer lock on this account has used it since this one's lock \
         was taken (this deposit's lock was lost): nothing was written",
    )
}

/// One account in memory: its balance, and the highest fence a fenced
/// deposit has read or written it with.
#[derive(Default, Clone, Copy)]
struct Account {
    balance: i64,
    fence: u64,
}

/// Where balances are kept. Unknown accounts have balance 0 (and fence 0).
enum Balances {
    Memory(Mutex<HashMap<String, Account>>),
    #[cfg(feature = "redis")]
    Redis(RedisStore),
    #[cfg(feature = "postgres")]
    Postgres(postgres_store::Store),
}

impl Balances {
    async fn get(&self, id: &str) -> Result<i64, ApiError> {
        match self {
            Balances::Memory(map) => Ok(memory(map).get(id).map_or(0, |a| a.balance)),
            #[cfg(feature = "redis")]
            Balances::Redis(store) => {
                let mut cmd = deadpool_redis::redis::cmd("GET");
                cmd.arg(redis_balance_key(id));
                redis_query::<Option<i64>>(store, cmd)
                    .await
                    .map(|b| b.unwrap_or(0))
            }
            #[cfg(feature = "postgres")]
            Balances::Postgres(store) => store.get(id).await,
        }
    }

    async fn set(&self, id: &str, balance: i64) -> Result<(), ApiError> {
        match self {
            Balances::Memory(map) => {
                memory(map).entry(id.to_owned()).or_default().balance = balance;
                Ok(())
            }
            #[cfg(feature = "redis")]
            Balances::Redis(store) => {
                let mut cmd = deadpool_redis::redis::cmd("SET");
                cmd.arg(redis_balance_key(id)).arg(balance);
                redis_query::<()>(store, cmd).await
            }
            #[cfg(feature = "postgres")]
            Balances::Postgres(store) => store.set(id, balance).await,
        }
    }
}

impl Balances {
    /// The balance, for a deposit holding the lock with `fence`: refused if
    /// the account has seen a higher fence, else the fence is remembered (in
    /// one atomic step with the check).
    async fn read_fenced(&self, id: &str, fence: u64) -> Result<i64, ApiError> {
        match self {
            Balances::Memory(map) => memory_fenced(map, id, fence, |account| account.balance),
            #[cfg(feature = "redis")]
            Balances::Redis(store) => redis_fenced::read(store, id, fence).await,
            #[cfg(feature = "postgres")]
            Balances::Postgres(store) => store.read_fenced(id, fence).await,
        }
    }

    /// Write `balance` with `fence`: refused (nothing written) if the account
    /// has seen a higher fence, in one atomic step with the check.
    async fn write_fenced(&self, id: &str, balance: i64, fence: u64) -> Result<(), ApiError> {
        match self {
            Balances::Memory(map) => memory_fenced(map, id, fence, |account| {
                account.balance = balance;
            }),
            #[cfg(feature = "redis")]
            Balances::Redis(store) => redis_fenced::write(store, id, balance, fence).await,
            #[cfg(feature = "postgres")]
            Balances::Postgres(store) => store.write_fenced(id, balance, fence).await,
        }
    }

    /// Balance and highest accepted fence of an account (fenced mode).
    async fn account(&self, id: &str) -> Result<(i64, u64), ApiError> {
        match self {
            Balances::Memory(map) => {
                let a = memory(map).get(id).copied().unwrap_or_default();
                Ok((a.balance, a.fence))
            }
            #[cfg(feature = "redis")]
            Balances::Redis(store) => redis_fenced::account(store, id).await,
            #[cfg(feature = "postgres")]
            Balances::Postgres(store) => store.account(id).await,
        }
    }
}

/// The in-memory account `id` for a deposit holding `fence`, under the map's
/// lock (so the check and `f` are one step): refused if the account has seen
/// a higher fence, else the fence is remembered and `f` runs.
fn memory_fenced<T>(
    map: &Mutex<HashMap<String, Account>>,
    id: &str,
    fence: u64,
    f: impl FnOnce(&mut Account) -> T,
) -> Result<T, ApiError> {
    let mut map = memory(map);
    let account = map.entry(id.to_owned()).or_default();
    if account.fence > fence {
        return Err(stale_fence());
    }
    account.fence = fence;
    Ok(f(account))
}

fn memory(
    map: &Mutex<HashMap<String, Account>>,
) -> std::sync::MutexGuard<'_, HashMap<String, Account>> {
    map.lock().unwrap_or_else(|e| e.into_inner())
}

/// Fenced balances in Redis: a hash `bank:fenced:{id}` with `balance` and
/// `fence`, each operation one script (the check and the change atomic).
#[cfg(feature = "redis")]
mod redis_fenced {
    use std::sync::LazyLock;

    use deadpool_redis::redis::Script;

    use super::{ApiError, RedisStore, redis_query_script, stale_fence};

    static READ: LazyLock<Script> = LazyLock::new(|| {
        Script::new(
            "local f = tonumber(redis.call('HGET', KEYS[1], 'fence') or '0') \
             if f > tonumber(ARGV[1]) then return {-1, ''} end \
             redis.call('HSET', KEYS[1], 'fence', ARGV[1]) \
             return {1, redis.call('HGET', KEYS[1], 'balance') or '0'}",
        )
    });
    static WRITE: LazyLock<Script> = LazyLock::new(|| {
        Script::new(
            "local f = tonumber(redis.call('HGET', KEYS[1], 'fence') or '0') \
             if f > tonumber(ARGV[2]) then return -1 end \
             redis.call('HSET', KEYS[1], 'balance', ARGV[1], 'fence', ARGV[2]) \
             return 1",
        )
    });

    fn key(id: &str) -> String {
        format!("bank:fenced:{id}")
    }

    pub(super) async fn read(store: &RedisStore, id: &str, fence: u64) -> Result<i64, ApiError> {
        let mut inv = READ.prepare_invoke();
        inv.key(key(id)).arg(fence);
        let (code, balance): (i64, String) = redis_query_script(store, inv).await?;
        if code < 0 {
            return Err(stale_fence());
        }
        balance
            .parse()
            .map_err(|_| ApiError::store("a stored balance is not a number"))
    }

    pub(super) async fn write(
        store: &RedisStore,
        id: &str,
        balance: i64,
        fence: u64,
    ) -> Result<(), ApiError> {
        let mut inv = WRITE.prepare_invoke();
        inv.key(key(id)).arg(balance).arg(fence);
        match redis_query_script::<i64>(store, inv).await? {
            1 => Ok(()),
            _ => Err(stale_fence()),
        }
    }

    pub(super) async fn account(store: &RedisStore, id: &str) -> Result<(i64, u64), ApiError> {
        let mut cmd = deadpool_redis::redis::cmd("HMGET");
        cmd.arg(key(id)).arg("balance").arg("fence");
        let (balance, fence): (Option<i64>, Option<u64>) = super::redis_query(store, cmd).await?;
        Ok((balance.unwrap_or(0), fence.unwrap_or(0)))
    }
}

#[cfg(feature = "redis")]
fn redis_balance_key(id: &str) -> String {
    format!("bank:balance:{id}")
}

/// Run one command on a pooled connection, within [`STORE_TIMEOUT`].
#[cfg(feature = "redis")]
async fn redis_query<T: deadpool_redis::redis::FromRedisValue>(
    store: &RedisStore,
    cmd: deadpool_redis::redis::Cmd,
) -> Result<T, ApiError> {
    redis_run(store, async |conn| cmd.query_async::<T>(conn).await).await
}

/// Run one script on a pooled connection, within [`STORE_TIMEOUT`].
#[cfg(feature = "redis")]
async fn redis_query_script<T: deadpool_redis::redis::FromRedisValue>(
    store: &RedisStore,
    invocation: deadpool_redis::redis::ScriptInvocation<'_>,
) -> Result<T, ApiError> {
    redis_run(store, async |conn| invocation.invoke_async::<T>(conn).await).await
}

#[cfg(feature = "redis")]
async fn redis_run<T>(
    store: &RedisStore,
    f: impl AsyncFnOnce(&mut StoreConn) -> deadpool_redis::redis::RedisResult<T>,
) -> Result<T, ApiError> {
    let attempt = async {
        let mut conn = store.conn().await?;
        f(&mut conn).await.map_err(|e| e.to_string())
    };
    let result = match tokio::time::timeout(STORE_TIMEOUT, attempt).await {
        Ok(result) => result,
        Err(_) => Err(format!("no answer within {STORE_TIMEOUT:?}")),
    };
    result.map_err(|detail| {
        // Details go to the log, not to clients.
        tracing::warn!(error = %detail, "balance store error");
        ApiError::store("the balance store is unavailable")
    })
}

#[cfg(not(feature = "redis"))]
async fn redis_bank(_url: &str) -> Result<Bank, String> {
    Err("--redis needs tower-lock's `redis` feature".to_owned())
}

/// Locks and balances in the Redis at `url`.
#[cfg(feature = "redis")]
async fn redis_bank(url: &str) -> Result<Bank, String> {
    use deadpool_redis::{Config, Runtime};

    let locks = redis_lock_backend(url)?;
    // Balances get a pool of their own, so lock waiters can never starve the
    // holder's balance read/write of connections.
    let balances = RedisStore::Pool(
        Config::from_url(url)
            .create_pool(Some(Runtime::Tokio1))
            .map_err(|e| format!("bad --redis URL: {e}"))?,
    );
    // Redis may come up later: warn, serve, and answer 503 until it does.
    let mut ping = deadpool_redis::redis::cmd("PING");
    ping.arg("bank");
    if redis_query::<String>(&balances, ping).await.is_err() {
        eprintln!("bank: warning: Redis at {url} does not answer yet");
    }
    Ok(Bank {
        locks,
        balances: Balances::Redis(balances),
        fenced: false,
        statements_computed: AtomicU64::new(0),
    })
}

/// Where Redis balances live: a server's pool, or a cluster.
#[cfg(feature = "redis")]
enum RedisStore {
    Pool(deadpool_redis::Pool),
    #[cfg(feature = "redis-cluster")]
    Cluster(Box<cluster::Store>),
}

/// A connection to the balances' Redis.
#[cfg(feature = "redis")]
enum StoreConn {
    Pool(deadpool_redis::Connection),
    #[cfg(feature = "redis-cluster")]
    Cluster(deadpool_redis::redis::cluster_async::ClusterConnection),
}

#[cfg(feature = "redis")]
impl RedisStore {
    async fn conn(&self) -> Result<StoreConn, String> {
        match self {
            RedisStore::Pool(pool) => pool
                .get()
                .await
                .map(StoreConn::Pool)
                .map_err(|e| e.to_string()),
            #[cfg(feature = "redis-cluster")]
            RedisStore::Cluster(store) => store.conn().await.map(StoreConn::Cluster),
        }
    }
}

#[cfg(feature = "redis")]
impl deadpool_redis::redis::aio::ConnectionLike for StoreConn {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a deadpool_redis::redis::Cmd,
    ) -> deadpool_redis::redis::RedisFuture<'a, deadpool_redis::redis::Value> {
        match self {
            StoreConn::Pool(c) => c.req_packed_command(cmd),
            #[cfg(feature = "redis-cluster")]
            StoreConn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a deadpool_redis::redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> deadpool_redis::redis::RedisFuture<'a, Vec<deadpool_redis::redis::Value>> {
        match self {
            StoreConn::Pool(c) => c.req_packed_commands(cmd, offset, count),
            #[cfg(feature = "redis-cluster")]
            StoreConn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            StoreConn::Pool(c) => c.get_db(),
            #[cfg(feature = "redis-cluster")]
            StoreConn::Cluster(c) => c.get_db(),
        }
    }
}

#[cfg(not(feature = "redis-cluster"))]
async fn redis_cluster_bank(_urls: &str) -> Result<Bank, String> {
    Err("--redis-cluster needs tower-lock's `redis-cluster` feature".to_owned())
}

/// Locks and balances in the Redis Cluster some of whose nodes `urls`
/// (comma-separated) names.
#[cfg(feature = "redis-cluster")]
async fn redis_cluster_bank(urls: &str) -> Result<Bank, String> {
    let nodes: Vec<String> = urls
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(str::to_owned)
        .collect();
    let locks = tower_lock::RedisBackend::from_cluster_urls(nodes.iter().map(String::as_str))
        .map_err(|e| format!("bad --redis-cluster URLs: {e}"))?;
    let store = RedisStore::Cluster(Box::new(cluster::Store::new(nodes)?));
    // The cluster may come up later: warn, serve, and answer 503 until it does.
    let mut ping = deadpool_redis::redis::cmd("PING");
    ping.arg("bank");
    if redis_query::<String>(&store, ping).await.is_err() {
        eprintln!("bank: warning: the Redis Cluster does not answer yet");
    }
    Ok(Bank {
        locks: SharedBackend::new(locks),
        balances: Balances::Redis(store),
        fenced: false,
        statements_computed: AtomicU64::new(0),
    })
}

/// Balances in a Redis Cluster: one connection (a multiplexed one per
/// node), opened on first use and again after a failed attempt.
#[cfg(feature = "redis-cluster")]
mod cluster {
    use deadpool_redis::redis::cluster::ClusterClient;
    use deadpool_redis::redis::cluster_async::ClusterConnection;
    use tokio::sync::OnceCell;

    pub(super) struct Store {
        client: ClusterClient,
        conn: OnceCell<ClusterConnection>,
    }

    impl Store {
        pub(super) fn new(nodes: Vec<String>) -> Result<Self, String> {
            let client = ClusterClient::builder(nodes)
                // STORE_TIMEOUT bounds every call; retries just have to be
                // quick enough to fit in it during a failover.
                .min_retry_wait(2)
                .max_retry_wait(100)
                .build()
                .map_err(|e| format!("bad --redis-cluster URLs: {e}"))?;
            Ok(Store {
                client,
                conn: OnceCell::new(),
            })
        }

        pub(super) async fn conn(&self) -> Result<ClusterConnection, String> {
            self.conn
                .get_or_try_init(|| self.client.get_async_connection())
                .await
                .cloned()
                .map_err(|e| e.to_string())
        }
    }
}

/// The Redis lock backend for `url`, with a pool of its own.
#[cfg(feature = "redis")]
fn redis_lock_backend(url: &str) -> Result<SharedBackend, String> {
    let backend =
        tower_lock::RedisBackend::from_url(url).map_err(|e| format!("bad --redis URL: {e}"))?;
    Ok(SharedBackend::new(backend))
}

#[cfg(not(feature = "postgres"))]
async fn postgres_bank(_url: &str) -> Result<Bank, String> {
    Err("--postgres needs tower-lock's `postgres` feature".to_owned())
}

/// Locks and balances in the PostgreSQL database at `url`.
#[cfg(feature = "postgres")]
async fn postgres_bank(url: &str) -> Result<Bank, String> {
    let locks = tower_lock::PostgresBackend::from_url(url)
        .map_err(|e| format!("bad --postgres URL: {e}"))?;
    // Balances get a pool of their own, so lock waiters can never starve the
    // holder's balance read/write of connections.
    let store = postgres_store::Store::new(url)?;
    // The database may come up later: warn, serve (503 until it answers),
    // and create the tables as soon as it does.
    if let Err(e) = store.set_up(&locks).await {
        eprintln!("bank: warning: PostgreSQL at the --postgres URL does not answer yet ({e})");
        let (store, locks) = (store.clone(), locks.clone());
        tokio::spawn(async move {
            while store.set_up(&locks).await.is_err() {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
    }
    Ok(Bank {
        locks: SharedBackend::new(locks),
        balances: Balances::Postgres(store),
        fenced: false,
        statements_computed: AtomicU64::new(0),
    })
}

/// Balances in PostgreSQL: `bank_balances(id text primary key, balance
/// bigint, fence bigint)` (the fence: the highest a fenced deposit read or
/// wrote the account with).
#[cfg(feature = "postgres")]
mod postgres_store {
    use deadpool_postgres::{Manager, Pool};

    use super::{ApiError, STORE_TIMEOUT, stale_fence};
    use axum::http::StatusCode;

    #[derive(Clone)]
    pub(crate) struct Store {
        pool: Pool,
    }

    /// A fence as PostgreSQL's `bigint` (fences stay far below 2^63).
    fn fence_sql(fence: u64) -> Result<i64, ApiError> {
        i64::try_from(fence).map_err(|_| ApiError::store("a fence beyond bigint"))
    }

    impl Store {
        pub(crate) fn new(url: &str) -> Result<Store, String> {
            let config: tokio_postgres::Config = url
                .parse()
                .map_err(|e| format!("bad --postgres URL: {e}"))?;
            // TLS as the lock backend speaks it: with feature `postgres-tls`,
            // through the system's OpenSSL (`sslmode=require` in the URL to
            // insist on it), else plain.
            #[cfg(feature = "postgres-tls")]
            let manager = {
                let tls = native_tls::TlsConnector::new()
                    .map_err(|e| format!("TLS for --postgres: {e}"))?;
                Manager::new(config, postgres_native_tls::MakeTlsConnector::new(tls))
            };
            #[cfg(not(feature = "postgres-tls"))]
            let manager = Manager::new(config, tokio_postgres::NoTls);
            let pool = Pool::builder(manager)
                .max_size(16)
                .build()
                .map_err(|e| format!("bad --postgres URL: {e}"))?;
            Ok(Store { pool })
        }

        /// The lock schema and the balances table, if the database answers.
        pub(crate) async fn set_up(
            &self,
            locks: &tower_lock::PostgresBackend,
        ) -> Result<(), String> {
            locks.migrate().await.map_err(|e| e.to_string())?;
            self.run(async |c: &tokio_postgres::Client| {
                c.batch_execute(
                    "CREATE TABLE IF NOT EXISTS bank_balances \
                     (id text PRIMARY KEY, balance bigint NOT NULL); \
                     ALTER TABLE bank_balances \
                     ADD COLUMN IF NOT EXISTS fence bigint NOT NULL DEFAULT 0",
                )
                .await
            })
            .await
            .map_err(|e| e.message)
        }

        pub(crate) async fn get(&self, id: &str) -> Result<i64, ApiError> {
            let row = self
                .run(async |c: &tokio_postgres::Client| {
                    c.query_opt("SELECT balance FROM bank_balances WHERE id = $1", &[&id])
                        .await
                })
                .await?;
            Ok(row.map_or(0, |r| r.get(0)))
        }

        pub(crate) async fn set(&self, id: &str, balance: i64) -> Result<(), ApiError> {
            self.run(async |c: &tokio_postgres::Client| {
                c.execute(
                    "INSERT INTO bank_balances (id, balance) VALUES ($1, $2) \
                     ON CONFLICT (id) DO UPDATE SET balance = excluded.balance",
                    &[&id, &balance],
                )
                .await
            })
            .await
            .map(|_| ())
        }

        /// The balance for a deposit holding `fence`, remembering the fence
        /// unless the account has seen a higher one (then: stale). One
        /// statement: the check and the change are atomic.
        pub(crate) async fn read_fenced(&self, id: &str, fence: u64) -> Result<i64, ApiError> {
            let fence = fence_sql(fence)?;
            let row = self
                .run(async |c: &tokio_postgres::Client| {
                    c.query_opt(
                        "INSERT INTO bank_balances (id, balance, fence) VALUES ($1, 0, $2) \
                         ON CONFLICT (id) DO UPDATE SET fence = excluded.fence \
                         WHERE bank_balances.fence <= excluded.fence \
                         RETURNING balance",
                        &[&id, &fence],
                    )
                    .await
                })
                .await?;
            row.map(|r| r.get(0)).ok_or_else(stale_fence)
        }

        /// Write `balance` with `fence` unless the account has seen a higher
        /// fence (then: stale, nothing written). One statement.
        pub(crate) async fn write_fenced(
            &self,
            id: &str,
            balance: i64,
            fence: u64,
        ) -> Result<(), ApiError> {
            let fence = fence_sql(fence)?;
            let written = self
                .run(async |c: &tokio_postgres::Client| {
                    c.execute(
                        "INSERT INTO bank_balances (id, balance, fence) VALUES ($1, $2, $3) \
                         ON CONFLICT (id) DO UPDATE \
                         SET balance = excluded.balance, fence = excluded.fence \
                         WHERE bank_balances.fence <= excluded.fence",
                        &[&id, &balance, &fence],
                    )
                    .await
                })
                .await?;
            if written == 1 {
                Ok(())
            } else {
                Err(stale_fence())
            }
        }

        /// Balance and highest accepted fence of an account.
        pub(crate) async fn account(&self, id: &str) -> Result<(i64, u64), ApiError> {
            let row = self
                .run(async |c: &tokio_postgres::Client| {
                    c.query_opt(
                        "SELECT balance, fence FROM bank_balances WHERE id = $1",
                        &[&id],
                    )
                    .await
                })
                .await?;
            Ok(row.map_or((0, 0), |r| {
                (r.get(0), u64::try_from(r.get::<_, i64>(1)).unwrap_or(0))
            }))
        }

        /// Run `f` on a pooled connection within [`STORE_TIMEOUT`].
        async fn run<T>(
            &self,
            f: impl AsyncFnOnce(&tokio_postgres::Client) -> Result<T, tokio_postgres::Error>,
        ) -> Result<T, ApiError> {
            let attempt = async {
                let conn = self.pool.get().await.map_err(|e| e.to_string())?;
                f(&conn).await.map_err(|e| e.to_string())
            };
            let result = match tokio::time::timeout(STORE_TIMEOUT, attempt).await {
                Ok(result) => result,
                Err(_) => Err(format!("no answer within {STORE_TIMEOUT:?}")),
            };
            result.map_err(|detail| {
                // Details go to the log, not to clients.
                tracing::warn!(error = %detail, "balance store error");
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "STORE_UNAVAILABLE",
                    "the balance store is unavailable",
                )
            })
        }
    }
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
    #[cfg_attr(not(any(feature = "redis", feature = "postgres")), allow(dead_code))]
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
