//! lockbench: tower-lock measured the way the peer libraries were
//! (`/work/shared/peers/WORKLOADS.md`), one JSON line per run.
//!
//! ```sh
//! cargo run --release --example lockbench -- --backend memory --workload serial --seconds 5
//! cargo run --release --example lockbench -- --backend redis://127.0.0.1:6390 --workload contended16 --seconds 5
//! ```
//!
//! Prints exactly one JSON line on stdout; progress and errors go to stderr.
//! Bad flags: usage on stderr, exit status 2. A run that cannot start (Redis
//! unreachable, backend missing from this build): message on stderr, exit 1.
//!
//! # Which API
//!
//! `serial`, `parallel32`, `contended16` and `held` take their locks the way
//! a background job would: [`OwnedLock::acquire`] with a global
//! [`LockSpec`] (a random owner token per acquisition), then
//! [`OwnedLock::release`]. `--api backend` runs the same loops one layer
//! down, on [`LockBackend::acquire`]/[`LockBackend::release`] with an
//! [`AcquireRequest`], to split the cost between the handle and the backend.
//! `http` goes through [`LockLayer`] on an axum route; `raw-*` use the redis
//! client directly (no tower-lock at all).
//!
//! # Accounting (identical to the peers)
//!
//! 200 uncontended warm-up cycles before timing. Window = `--seconds`. `ops`
//! = cycles that completed (released) inside the window, `ops_per_s = ops /
//! seconds`. Workers start no cycle after the window; the ones in flight
//! finish ("drain", in `elapsed_s`, not in `ops`). Latency samples are the
//! successful cycles *started* in the window (drain included); nearest-rank
//! p50/p99. Failures are counted in `errors`, not in the percentiles. The
//! runtime is tokio multi-thread with 2 workers, like the raw-rust peer.
//!
//! # Workloads beyond the peers'
//!
//! - `http`: an axum app on 127.0.0.1:0 in this process, `GET /locked/{id}`
//!   behind [`LockLayer`] (key `req:{id}`, a distinct id per request) and
//!   `GET /open/{id}` without it; 32 client tasks, each with its own
//!   keep-alive HTTP/1 connection (hyper), S seconds on each route. The two
//!   routes alternate in slices of about 0.5 s (A B, B A, ...) so a change
//!   in the shared machine's load cannot bias the ratio; each slice opens
//!   fresh connections and warms them up first. Then the same with ONE
//!   connection for S/2 seconds each (`one_conn_*`): the latency the layer
//!   adds to an unloaded server, where the 32-connection p50 is queueing.
//!   `unlocked_ops`, `one_conn_ops`, `one_conn_unlocked_ops`: requests
//!   counted per phase (with `ops`), to divide a `perf stat` of one side by.
//! - `held`: `serial` while 1,000,000 (memory) / 100,000 (Redis) other keys
//!   are held, pre-filled through `LockBackend::acquire` by 32 tasks, as a
//!   ratio to `serial` on an empty backend measured in the same run. Memory:
//!   the empty backend is a second `MemoryBackend`; Redis: the same server's
//!   next database (`/N+1`, an empty keyspace of its own). The two alternate
//!   in slices after the pre-fill.
//! - `raw-serial`, `raw-parallel32` (Redis only): the same loops on the redis
//!   client alone, one shared `MultiplexedConnection`: `SET key token NX PX
//!   30000`, then `EVALSHA` of a compare-and-delete script loaded before
//!   timing. On Redis, `serial` and `parallel32` also run that raw loop in
//!   alternating slices of the same run (`raw_*`, `ratio_to_raw`: S seconds
//!   each), so the ratio does not carry the drift between two runs. Every
//!   Redis run also reports `rtt_p50_us`/`rtt_p99_us`: 2,000 back-to-back
//!   PINGs before the warm-up. Redis `contended16` adds `idle_rtt_p50_us`:
//!   300 PINGs, each right after a 1-ms sleep (the hold), as a handoff's
//!   release starts from an idle process.
//!
//! `LOCKBENCH_ONLY=a|b` (profiling aid) runs one side of an alternating
//! comparison only: `a` = unlocked route / empty backend, `b` = locked route
//! / held backend, e.g. to `perf stat` one side alone.

use std::future::Future;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::sync::watch;
use tower_lock::{
    AcquireRequest, LockBackend, LockError, LockKey, LockLayer, LockSpec, MemoryBackend, OwnedLock,
    SharedBackend, new_owner_token, path_params,
};

const USAGE: &str = "\
usage: lockbench --backend memory|redis://HOST:PORT --workload W --seconds S [--api owned|backend]

  W: serial | parallel32 | contended16 | http | held | raw-serial | raw-parallel32
     (raw-* need a redis:// backend)
  S: length of the measured window, in seconds (> 0)
  --api: owned (default) = OwnedLock::acquire/release, backend = LockBackend::acquire/release

Prints one JSON line on stdout.";

/// TTL of every lock taken in the loops (as the peers).
const TTL: Duration = Duration::from_secs(30);
/// Uncontended cycles before timing (as the peers).
const WARMUP: u64 = 200;
/// The longest wait in contended16 (as the peers).
const CONTENDED_WAIT: Duration = Duration::from_secs(10);
const HOLD: Duration = Duration::from_millis(1);
const PARALLEL: usize = 32;
const CONTENDERS: usize = 16;
const HTTP_CONNECTIONS: usize = 32;
const HELD_MEMORY: usize = 1_000_000;
const HELD_REDIS: usize = 100_000;
/// Back-to-back PINGs for `rtt_p50_us`.
const RTT_SAMPLES: usize = 2_000;
/// PINGs after a `HOLD` sleep each, for contended16's `idle_rtt_p50_us`.
const IDLE_RTT_SAMPLES: usize = 300;

fn main() -> ExitCode {
    let args = match Args::parse(std::env::args().skip(1)) {
        Ok(Some(args)) => args,
        Ok(None) => {
            eprintln!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(msg) => {
            eprintln!("lockbench: {msg}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    match runtime.block_on(run(args)) {
        Ok(report) => {
            println!("{}", report.line());
            ExitCode::SUCCESS
        }
        Err(msg) => {
            eprintln!("lockbench: {msg}");
            ExitCode::from(1)
        }
    }
}

// ---------------------------------------------------------------------------
// Command line

#[derive(Debug, Clone, PartialEq)]
enum BackendArg {
    Memory,
    Redis(String),
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Workload {
    Serial,
    Parallel32,
    Contended16,
    Http,
    Held,
    RawSerial,
    RawParallel32,
}

impl Workload {
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "serial" => Workload::Serial,
            "parallel32" => Workload::Parallel32,
            "contended16" => Workload::Contended16,
            "http" => Workload::Http,
            "held" => Workload::Held,
            "raw-serial" => Workload::RawSerial,
            "raw-parallel32" => Workload::RawParallel32,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Workload::Serial => "serial",
            Workload::Parallel32 => "parallel32",
            Workload::Contended16 => "contended16",
            Workload::Http => "http",
            Workload::Held => "held",
            Workload::RawSerial => "raw-serial",
            Workload::RawParallel32 => "raw-parallel32",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Api {
    Owned,
    Backend,
}

#[derive(Debug)]
struct Args {
    backend: BackendArg,
    workload: Workload,
    seconds: f64,
    api: Api,
}

impl Args {
    /// `Ok(None)`: help was asked for.
    fn parse(mut it: impl Iterator<Item = String>) -> Result<Option<Args>, String> {
        let (mut backend, mut workload, mut seconds, mut api) = (None, None, None, Api::Owned);
        while let Some(flag) = it.next() {
            if flag == "-h" || flag == "--help" {
                return Ok(None);
            }
            let (name, inline) = match flag.split_once('=') {
                Some((n, v)) if n.starts_with("--") => (n.to_owned(), Some(v.to_owned())),
                _ => (flag.clone(), None),
            };
            let mut value = || {
                inline
                    .clone()
                    .or_else(|| it.next())
                    .ok_or_else(|| format!("{name} needs a value"))
            };
            match name.as_str() {
                "--backend" => {
                    let v = value()?;
                    backend = Some(if v == "memory" {
                        BackendArg::Memory
                    } else if v.starts_with("redis://") || v.starts_with("rediss://") {
                        BackendArg::Redis(v)
                    } else {
                        return Err(format!("unknown backend `{v}`"));
                    });
                }
                "--workload" => {
                    let v = value()?;
                    workload =
                        Some(Workload::parse(&v).ok_or_else(|| format!("unknown workload `{v}`"))?);
                }
                "--seconds" => {
                    let v = value()?;
                    let s: f64 = v
                        .parse()
                        .map_err(|_| format!("--seconds: not a number: `{v}`"))?;
                    if !(s > 0.0 && s.is_finite() && s <= 86_400.0) {
                        return Err(format!("--seconds must be in (0, 86400], got {v}"));
                    }
                    seconds = Some(s);
                }
                "--api" => {
                    api = match value()?.as_str() {
                        "owned" => Api::Owned,
                        "backend" => Api::Backend,
                        v => return Err(format!("unknown api `{v}`")),
                    };
                }
                _ => return Err(format!("unknown argument `{flag}`")),
            }
        }
        let backend = backend.ok_or("--backend is required")?;
        let workload = workload.ok_or("--workload is required")?;
        let seconds = seconds.ok_or("--seconds is required")?;
        if matches!(workload, Workload::RawSerial | Workload::RawParallel32)
            && backend == BackendArg::Memory
        {
            return Err(format!("{} needs a redis:// backend", workload.name()));
        }
        Ok(Some(Args {
            backend,
            workload,
            seconds,
            api,
        }))
    }
}

// ---------------------------------------------------------------------------
// The JSON line, fields in a fixed order

struct Report(Vec<(&'static str, Value)>);

impl Report {
    fn new(backend: &str, workload: Workload) -> Self {
        let mut r = Report(Vec::new());
        r.put("peer", "tower-lock");
        r.put("backend", backend);
        r.put("workload", workload.name());
        r
    }

    fn put(&mut self, key: &'static str, value: impl Into<Value>) {
        let value = value.into();
        match self.0.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => self.0.push((key, value)),
        }
    }

    fn line(&self) -> String {
        let fields: Vec<String> = self
            .0
            .iter()
            .map(|(k, v)| format!("{}:{}", Value::from(*k), v))
            .collect();
        format!("{{{}}}", fields.join(","))
    }
}

/// Microseconds, rounded to 0.01.
fn us(ns: f64) -> f64 {
    (ns / 10.0).round() / 100.0
}

fn round(x: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (x * f).round() / f
}

// ---------------------------------------------------------------------------
// Timing: windows, tallies, percentiles

#[derive(Debug, Clone, Copy)]
struct Window {
    start: Instant,
    end: Instant,
}

/// Starts every worker on the same window once all are warmed up.
struct Gate {
    tx: watch::Sender<Option<Window>>,
    ready: Arc<tokio::sync::Barrier>,
}

#[derive(Clone)]
struct GateRx {
    rx: watch::Receiver<Option<Window>>,
    ready: Arc<tokio::sync::Barrier>,
}

impl Gate {
    fn new(workers: usize) -> (Gate, GateRx) {
        let (tx, rx) = watch::channel(None);
        let ready = Arc::new(tokio::sync::Barrier::new(workers + 1));
        (
            Gate {
                tx,
                ready: ready.clone(),
            },
            GateRx { rx, ready },
        )
    }

    /// Wait for every worker to be ready, then open the window.
    async fn open(&self, seconds: f64) -> Window {
        self.ready.wait().await;
        let start = Instant::now();
        let window = Window {
            start,
            end: start + Duration::from_secs_f64(seconds),
        };
        self.tx.send_replace(Some(window));
        window
    }
}

impl GateRx {
    async fn wait(mut self) -> Window {
        self.ready.wait().await;
        let w = self.rx.wait_for(Option::is_some).await.expect("gate open");
        w.expect("some")
    }
}

#[derive(Default)]
struct Tally {
    ops: u64,
    errors: u64,
    lat_ns: Vec<u64>,
    first_error: Option<String>,
}

impl Tally {
    fn record(&mut self, result: Result<(), String>, t0: Instant, t1: Instant, window: &Window) {
        match result {
            Ok(()) => {
                self.lat_ns.push((t1 - t0).as_nanos() as u64);
                if t1 <= window.end {
                    self.ops += 1;
                }
            }
            Err(e) => {
                self.errors += 1;
                if self.first_error.is_none() {
                    self.first_error = Some(e);
                }
            }
        }
    }

    fn merge(&mut self, other: Tally) {
        self.ops += other.ops;
        self.errors += other.errors;
        self.lat_ns.extend(other.lat_ns);
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
    }
}

/// Nearest-rank percentile of sorted samples, in ns.
fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1] as f64
}

/// What a timed run of loops gives: throughput and per-cycle latency.
struct Summary {
    ops: u64,
    errors: u64,
    ops_per_s: f64,
    p50_ns: f64,
    p99_ns: f64,
    elapsed_s: f64,
}

impl Summary {
    fn new(mut tally: Tally, seconds: f64, elapsed: Duration) -> Self {
        if let Some(e) = &tally.first_error {
            eprintln!("lockbench: {} errors, first: {e}", tally.errors);
        }
        tally.lat_ns.sort_unstable();
        Summary {
            ops: tally.ops,
            errors: tally.errors,
            ops_per_s: tally.ops as f64 / seconds,
            p50_ns: percentile(&tally.lat_ns, 50.0),
            p99_ns: percentile(&tally.lat_ns, 99.0),
            elapsed_s: elapsed.as_secs_f64(),
        }
    }

    fn put(&self, r: &mut Report) {
        r.put("ops_per_s", round(self.ops_per_s, 1));
        r.put("p50_us", us(self.p50_ns));
        r.put("p99_us", us(self.p99_ns));
        r.put("max_concurrent_holders", Value::Null);
        r.put("errors", self.errors);
        r.put("ops", self.ops);
        r.put("elapsed_s", round(self.elapsed_s, 3));
    }
}

/// One acquire/release cycle (or one request) of a timed loop.
trait Cycle: Send + 'static {
    fn cycle(&mut self, i: u64) -> impl Future<Output = Result<(), String>> + Send;
}

/// Run `cycle` back to back: `warmup` untimed cycles, then the shared
/// window. Returns the tally and when this worker finished (drain included).
async fn drive<C: Cycle>(mut c: C, warmup: u64, gate: GateRx) -> (Tally, Instant) {
    for i in 0..warmup {
        if let Err(e) = c.cycle(u64::MAX - i).await {
            eprintln!("lockbench: warm-up cycle failed: {e}");
        }
    }
    let window = gate.wait().await;
    let mut tally = Tally {
        lat_ns: Vec::with_capacity(1 << 16),
        ..Tally::default()
    };
    let mut i = 0;
    loop {
        let t0 = Instant::now();
        if t0 >= window.end {
            break;
        }
        let result = c.cycle(i).await;
        let t1 = Instant::now();
        tally.record(result, t0, t1, &window);
        i += 1;
        // In-memory cycles never wait: let the other tasks of the worker run
        // now and then (every 128 cycles, tokio's budget), as I/O would.
        tokio::task::consume_budget().await;
    }
    (tally, Instant::now())
}

/// Run `workers` loops made by `make` on one window (after `WARMUP` cycles
/// shared among them); returns the tally and the window plus drain.
async fn run_tally<C: Cycle>(
    workers: usize,
    seconds: f64,
    mut make: impl FnMut(usize) -> C,
) -> Result<(Tally, Duration), String> {
    let (gate, rx) = Gate::new(workers);
    let per_worker = WARMUP.div_ceil(workers as u64);
    let handles: Vec<_> = (0..workers)
        .map(|w| tokio::spawn(drive(make(w), per_worker, rx.clone())))
        .collect();
    drop(rx);
    let window = gate.open(seconds).await;
    let mut total = Tally::default();
    let mut last = window.end;
    for h in handles {
        let (tally, done) = h.await.map_err(|e| format!("worker panicked: {e}"))?;
        total.merge(tally);
        last = last.max(done);
    }
    Ok((total, last - window.start))
}

/// [`run_tally`], summarised.
async fn run_loops<C: Cycle>(
    workers: usize,
    seconds: f64,
    make: impl FnMut(usize) -> C,
) -> Result<Summary, String> {
    let (tally, elapsed) = run_tally(workers, seconds, make).await?;
    Ok(Summary::new(tally, seconds, elapsed))
}

/// The length of one slice of an A/B comparison.
const SLICE_S: f64 = 0.5;

/// Measure A and B for `seconds` each, in alternating slices of about
/// `SLICE_S` (A B, B A, A B, ...), so that a change in the machine's load
/// (shared, noisy) hits both sides alike instead of biasing their ratio.
async fn alternate(
    seconds: f64,
    mut a: impl AsyncFnMut(f64) -> Result<(Tally, Duration), String>,
    mut b: impl AsyncFnMut(f64) -> Result<(Tally, Duration), String>,
) -> Result<(Summary, Summary), String> {
    // Profiling aid: LOCKBENCH_ONLY=a|b runs one side only (the other
    // reports nothing), e.g. to `perf stat` the locked HTTP route alone.
    let only = std::env::var("LOCKBENCH_ONLY").ok();
    let slices = (seconds / SLICE_S).round().max(1.0) as usize;
    let slice = seconds / slices as f64;
    let (mut ta, mut tb) = (Tally::default(), Tally::default());
    let (mut ea, mut eb) = (Duration::ZERO, Duration::ZERO);
    for k in 0..slices {
        for side in [k % 2 == 0, k % 2 == 1] {
            if only.as_deref() == Some(if side { "b" } else { "a" }) {
                continue;
            }
            if side {
                let (t, e) = a(slice).await?;
                ta.merge(t);
                ea += e;
            } else {
                let (t, e) = b(slice).await?;
                tb.merge(t);
                eb += e;
            }
        }
    }
    Ok((Summary::new(ta, seconds, ea), Summary::new(tb, seconds, eb)))
}

// ---------------------------------------------------------------------------
// Locking through tower-lock

#[derive(Clone)]
struct Locker {
    backend: SharedBackend,
    api: Api,
}

enum Held {
    Owned(OwnedLock),
    Request(AcquireRequest),
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

impl Locker {
    async fn acquire(&self, key: String, max_wait: Duration) -> Result<Held, LockError> {
        match self.api {
            Api::Owned => {
                let spec = LockSpec::new(key, TTL).global().max_wait(max_wait);
                OwnedLock::acquire(self.backend.clone(), &spec, "")
                    .await
                    .map(Held::Owned)
            }
            Api::Backend => {
                let req =
                    AcquireRequest::new(LockKey::global(key)?, new_owner_token(), TTL, max_wait)?;
                self.backend.acquire(&req).await?;
                Ok(Held::Request(req))
            }
        }
    }

    async fn release(&self, held: Held) -> Result<(), LockError> {
        match held {
            Held::Owned(lock) => lock.release().await,
            Held::Request(req) => self.backend.release(req.key(), req.owner()).await,
        }
    }
}

/// `serial`/`parallel32`: acquire a fresh key, release it.
struct LockCycle {
    locker: Locker,
    prefix: String,
}

impl Cycle for LockCycle {
    async fn cycle(&mut self, i: u64) -> Result<(), String> {
        let held = self
            .locker
            .acquire(format!("{}{i}", self.prefix), Duration::ZERO)
            .await
            .map_err(err)?;
        self.locker.release(held).await.map_err(err)
    }
}

async fn serial_tally(
    locker: &Locker,
    seconds: f64,
    prefix: &str,
) -> Result<(Tally, Duration), String> {
    run_tally(1, seconds, |_| LockCycle {
        locker: locker.clone(),
        prefix: prefix.to_owned(),
    })
    .await
}

async fn serial(locker: &Locker, seconds: f64, prefix: &str) -> Result<Summary, String> {
    let (tally, elapsed) = serial_tally(locker, seconds, prefix).await?;
    Ok(Summary::new(tally, seconds, elapsed))
}

async fn parallel(locker: &Locker, seconds: f64) -> Result<Summary, String> {
    run_loops(PARALLEL, seconds, |w| LockCycle {
        locker: locker.clone(),
        prefix: format!("p{w}:"),
    })
    .await
}

/// `contended16`: 16 workers on one key, hold 1 ms.
async fn contended(locker: &Locker, seconds: f64, r: &mut Report) -> Result<(), String> {
    const KEY: &str = "contended";
    for _ in 0..WARMUP {
        let held = locker
            .acquire(KEY.to_owned(), Duration::ZERO)
            .await
            .map_err(err)?;
        locker.release(held).await.map_err(err)?;
    }
    #[derive(Default)]
    struct Stats {
        ops: u64,
        errors: u64,
        waits: Vec<u64>,
        holds: Vec<u64>,
        same_worker: u64,
        wait_max: u64,
        first_error: Option<String>,
    }
    let holders = Arc::new(AtomicI64::new(0));
    let max_holders = Arc::new(AtomicI64::new(0));
    let last_holder = Arc::new(AtomicUsize::new(usize::MAX));
    let (gate, rx) = Gate::new(CONTENDERS);
    let workers: Vec<_> = (0..CONTENDERS)
        .map(|w| {
            let (locker, rx) = (locker.clone(), rx.clone());
            let (holders, max_holders, last_holder) =
                (holders.clone(), max_holders.clone(), last_holder.clone());
            tokio::spawn(async move {
                let window = rx.wait().await;
                let mut s = Stats::default();
                loop {
                    let t0 = Instant::now();
                    if t0 >= window.end {
                        break;
                    }
                    let held = match locker.acquire(KEY.to_owned(), CONTENDED_WAIT).await {
                        Ok(held) => held,
                        Err(e) => {
                            s.errors += 1;
                            s.wait_max = s.wait_max.max(t0.elapsed().as_nanos() as u64);
                            s.first_error.get_or_insert_with(|| e.to_string());
                            continue;
                        }
                    };
                    let t1 = Instant::now();
                    let now_holding = holders.fetch_add(1, Ordering::SeqCst) + 1;
                    max_holders.fetch_max(now_holding, Ordering::SeqCst);
                    let same = last_holder.swap(w, Ordering::SeqCst) == w;
                    let h0 = Instant::now();
                    tokio::time::sleep(HOLD).await;
                    let h1 = Instant::now();
                    holders.fetch_sub(1, Ordering::SeqCst);
                    let released = locker.release(held).await;
                    let t2 = Instant::now();
                    if let Err(e) = released {
                        s.errors += 1;
                        s.first_error.get_or_insert_with(|| e.to_string());
                    }
                    let wait = (t1 - t0).as_nanos() as u64;
                    s.wait_max = s.wait_max.max(wait);
                    s.waits.push(wait);
                    s.holds.push((h1 - h0).as_nanos() as u64);
                    s.same_worker += u64::from(same);
                    if t2 <= window.end {
                        s.ops += 1;
                    }
                }
                s
            })
        })
        .collect();
    drop(rx);
    let window = gate.open(seconds).await;
    let mut all = Stats::default();
    for h in workers {
        let s = h.await.map_err(|e| format!("worker panicked: {e}"))?;
        all.ops += s.ops;
        all.errors += s.errors;
        all.waits.extend(s.waits);
        all.holds.extend(s.holds);
        all.same_worker += s.same_worker;
        all.wait_max = all.wait_max.max(s.wait_max);
        if all.first_error.is_none() {
            all.first_error = s.first_error;
        }
    }
    let elapsed = window.start.elapsed().as_secs_f64();
    if let Some(e) = &all.first_error {
        eprintln!("lockbench: {} errors, first: {e}", all.errors);
    }
    all.waits.sort_unstable();
    all.holds.sort_unstable();
    let acquisitions = all.waits.len().max(1) as f64;
    let hold_mean_ns = all.holds.iter().sum::<u64>() as f64 / all.holds.len().max(1) as f64;
    let ops_per_s = all.ops as f64 / seconds;
    r.put("ops_per_s", round(ops_per_s, 1));
    r.put("p50_us", us(percentile(&all.waits, 50.0)));
    r.put("p99_us", us(percentile(&all.waits, 99.0)));
    r.put("max_concurrent_holders", max_holders.load(Ordering::SeqCst));
    r.put("errors", all.errors);
    r.put("ops", all.ops);
    r.put("elapsed_s", round(elapsed, 3));
    r.put("hold_p50_us", us(percentile(&all.holds, 50.0)));
    r.put("hold_mean_us", us(hold_mean_ns));
    r.put("wait_max_us", us(all.wait_max as f64));
    r.put("utilisation", round(ops_per_s * hold_mean_ns / 1e9, 4));
    r.put(
        "same_worker_reacquire_pct",
        round(100.0 * all.same_worker as f64 / acquisitions, 2),
    );
    Ok(())
}

/// `held`: `serial` while `n` other keys are held, as a ratio to `serial`
/// on an empty backend. With `empty` (a second `MemoryBackend`, or the same
/// Redis server's next database) the two alternate in slices after the
/// pre-fill; without, the empty run comes first, then the pre-fill, then the
/// held run.
async fn held(
    locker: &Locker,
    empty: Option<&Locker>,
    n: usize,
    seconds: f64,
    r: &mut Report,
) -> Result<(), String> {
    let (empty, held, prefill_s) = match empty {
        Some(empty) => {
            let prefill_s = prefill(locker, n, seconds).await?;
            let (e, h) = alternate(
                seconds,
                async |s| serial_tally(empty, s, "e:").await,
                async |s| serial_tally(locker, s, "s:").await,
            )
            .await?;
            (e, h, prefill_s)
        }
        None => {
            let e = serial(locker, seconds, "e:").await?;
            let prefill_s = prefill(locker, n, seconds).await?;
            let h = serial(locker, seconds, "s:").await?;
            (e, h, prefill_s)
        }
    };
    held.put(r);
    r.put("held_keys", n);
    r.put("prefill_s", round(prefill_s, 3));
    r.put("empty_ops_per_s", round(empty.ops_per_s, 1));
    r.put("empty_p50_us", us(empty.p50_ns));
    r.put("empty_p99_us", us(empty.p99_ns));
    r.put("empty_errors", empty.errors);
    r.put("ratio", round(held.ops_per_s / empty.ops_per_s, 4));
    Ok(())
}

/// Hold `n` keys (`LockBackend::acquire`, 32 tasks); returns the seconds it took.
async fn prefill(locker: &Locker, n: usize, seconds: f64) -> Result<f64, String> {
    let run = &new_owner_token()[..8];
    let owner: Arc<str> = Arc::from(format!("lockbench-held-{run}"));
    // Long enough to outlive both windows and the pre-fill; short enough
    // that a Redis left unflushed forgets them soon.
    let ttl = Duration::from_secs_f64(seconds * 4.0 + 120.0);
    let started = Instant::now();
    let next = Arc::new(AtomicUsize::new(0));
    let fillers: Vec<_> = (0..PARALLEL)
        .map(|_| {
            let (backend, next, owner) = (locker.backend.clone(), next.clone(), owner.clone());
            let prefix = format!("h:{run}:");
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        return Ok::<(), String>(());
                    }
                    let key = LockKey::global(format!("{prefix}{i}")).map_err(err)?;
                    let req = AcquireRequest::new(key, owner.clone(), ttl, Duration::ZERO)
                        .map_err(err)?;
                    backend.acquire(&req).await.map_err(err)?;
                    tokio::task::consume_budget().await;
                }
            })
        })
        .collect();
    for f in fillers {
        f.await
            .map_err(|e| format!("pre-fill panicked: {e}"))?
            .map_err(|e| format!("pre-fill failed: {e}"))?;
    }
    let prefill_s = started.elapsed().as_secs_f64();
    eprintln!("lockbench: {n} keys held (pre-fill {prefill_s:.2} s)");
    Ok(prefill_s)
}

// ---------------------------------------------------------------------------
// http: an axum app on loopback, the same route with and without LockLayer

async fn ok() -> &'static str {
    "ok"
}

struct HttpCycle {
    addr: SocketAddr,
    sender: Option<SendRequest<Empty<Bytes>>>,
    base: &'static str,
    worker: usize,
}

async fn http_connect(addr: SocketAddr) -> Result<SendRequest<Empty<Bytes>>, String> {
    let stream = tokio::net::TcpStream::connect(addr).await.map_err(err)?;
    stream.set_nodelay(true).map_err(err)?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(err)?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

impl Cycle for HttpCycle {
    async fn cycle(&mut self, i: u64) -> Result<(), String> {
        let alive = match &mut self.sender {
            Some(s) => s.ready().await.is_ok(),
            None => false,
        };
        if !alive {
            // First use, or the connection broke: a new one.
            self.sender = Some(http_connect(self.addr).await?);
        }
        let sender = self.sender.as_mut().expect("connected");
        let req = Request::get(format!("{}/{}-{i}", self.base, self.worker))
            .header(http::header::HOST, "127.0.0.1")
            .body(Empty::new())
            .map_err(err)?;
        let res = match sender.send_request(req).await {
            Ok(res) => res,
            Err(e) => {
                self.sender = None;
                return Err(e.to_string());
            }
        };
        let status = res.status();
        res.into_body().collect().await.map_err(err)?;
        if status.is_success() {
            Ok(())
        } else {
            Err(format!("HTTP {status}"))
        }
    }
}

async fn http(backend: SharedBackend, seconds: f64, r: &mut Report) -> Result<(), String> {
    let layer = LockLayer::from_shared(backend, |req: &Request<Body>| {
        let params = path_params(req);
        let id = params.get("id")?;
        Some(LockSpec::new(format!("req:{id}"), TTL))
    });
    let app = Router::new()
        .route("/locked/{id}", get(ok).layer(layer))
        .route("/open/{id}", get(ok));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(err)?;
    let addr = listener.local_addr().map_err(err)?;
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    tokio::spawn(async move { axum::serve(listener, app).await });

    let phase = async |base: &'static str, connections: usize, seconds: f64| {
        run_tally(connections, seconds, move |worker| HttpCycle {
            addr,
            sender: None,
            base,
            worker,
        })
        .await
    };
    let (open, locked) = alternate(
        seconds,
        async |s| phase("/open", HTTP_CONNECTIONS, s).await,
        async |s| phase("/locked", HTTP_CONNECTIONS, s).await,
    )
    .await?;
    // At 32 connections the machine is saturated and p50 is mostly queueing;
    // one connection shows the latency the layer adds to an unloaded server.
    let (open1, locked1) = alternate(
        seconds / 2.0,
        async |s| phase("/open", 1, s).await,
        async |s| phase("/locked", 1, s).await,
    )
    .await?;
    locked.put(r);
    r.put("unlocked_ops_per_s", round(open.ops_per_s, 1));
    r.put("ratio", round(locked.ops_per_s / open.ops_per_s, 4));
    r.put("unlocked_p50_us", us(open.p50_ns));
    r.put("unlocked_p99_us", us(open.p99_ns));
    r.put("p50_added_us", us(locked.p50_ns - open.p50_ns));
    r.put("unlocked_errors", open.errors);
    r.put("connections", HTTP_CONNECTIONS);
    r.put("one_conn_p50_us", us(locked1.p50_ns));
    r.put("one_conn_unlocked_p50_us", us(open1.p50_ns));
    r.put("one_conn_p50_added_us", us(locked1.p50_ns - open1.p50_ns));
    r.put("one_conn_seconds", seconds / 2.0);
    // Requests per phase, to divide a `perf stat` of one side by.
    r.put("unlocked_ops", open.ops);
    r.put("one_conn_ops", locked1.ops);
    r.put("one_conn_unlocked_ops", open1.ops);
    r.put("one_conn_errors", open1.errors + locked1.errors);
    Ok(())
}

// ---------------------------------------------------------------------------

async fn run(args: Args) -> Result<Report, String> {
    let backend_name = match &args.backend {
        BackendArg::Memory => "memory",
        BackendArg::Redis(_) => "redis",
    };
    let mut r = Report::new(backend_name, args.workload);
    if let BackendArg::Redis(url) = &args.backend {
        return redis::run(url, &args, r).await;
    }
    let locker = Locker {
        backend: Arc::new(MemoryBackend::new()),
        api: args.api,
    };
    // `held` compares with a second, empty backend.
    let empty = Locker {
        backend: Arc::new(MemoryBackend::new()),
        api: args.api,
    };
    run_locks(&locker, Some(&empty), &args, HELD_MEMORY, &mut r).await?;
    Ok(r)
}

/// The workloads through tower-lock, whatever the backend.
async fn run_locks(
    locker: &Locker,
    empty: Option<&Locker>,
    args: &Args,
    held_keys: usize,
    r: &mut Report,
) -> Result<(), String> {
    let api = match args.api {
        Api::Owned => "OwnedLock",
        Api::Backend => "LockBackend",
    };
    match args.workload {
        Workload::Serial => {
            r.put("api", api);
            serial(locker, args.seconds, "s:").await?.put(r);
        }
        Workload::Parallel32 => {
            r.put("api", api);
            parallel(locker, args.seconds).await?.put(r);
        }
        Workload::Contended16 => {
            r.put("api", api);
            contended(locker, args.seconds, r).await?;
        }
        Workload::Held => {
            r.put("api", api);
            held(locker, empty, held_keys, args.seconds, r).await?;
        }
        Workload::Http => {
            r.put("api", "LockLayer");
            http(locker.backend.clone(), args.seconds, r).await?;
        }
        Workload::RawSerial | Workload::RawParallel32 => {
            unreachable!("rejected by the argument parser")
        }
    }
    r.put("seconds", args.seconds);
    Ok(())
}

// ---------------------------------------------------------------------------
// Redis: the raw client baseline and the tower-lock backend

#[cfg(not(feature = "redis"))]
mod redis {
    use super::{Args, Report};

    pub(crate) async fn run(_url: &str, _args: &Args, _r: Report) -> Result<Report, String> {
        Err("built without the `redis` feature".into())
    }
}

#[cfg(feature = "redis")]
mod redis {
    use std::time::Instant;

    use deadpool_redis::redis::aio::MultiplexedConnection;
    use deadpool_redis::redis::{self as client, Client};
    use tower_lock::new_owner_token;

    use super::{
        Api, Args, Cycle, HELD_REDIS, HOLD, IDLE_RTT_SAMPLES, LockCycle, Locker, PARALLEL,
        RTT_SAMPLES, Report, Workload, alternate, err, percentile, round, run_locks, run_loops,
        run_tally, us,
    };

    /// Compare-and-delete, as the raw-rust peer.
    const RELEASE: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end";

    pub(crate) async fn run(url: &str, args: &Args, mut r: Report) -> Result<Report, String> {
        let client = Client::open(url).map_err(err)?;
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| format!("connecting to {url}: {e}"))?;
        let (rtt_p50, rtt_p99) = rtt(&mut conn).await?;
        // A handoff follows a hold during which the process (and often the
        // server) sat idle; on a VM, waking up costs a round trip far more
        // than `rtt_p50_us` shows.
        let idle_rtt_p50 = match args.workload {
            Workload::Contended16 => Some(idle_rtt(&mut conn).await?),
            _ => None,
        };
        let workers = match args.workload {
            Workload::RawSerial | Workload::Serial => 1,
            _ => PARALLEL,
        };
        match args.workload {
            Workload::RawSerial | Workload::RawParallel32 => {
                r.put("api", "redis MultiplexedConnection");
                let sha = load_release(&mut conn).await?;
                let summary = run_loops(workers, args.seconds, |w| RawCycle {
                    conn: conn.clone(),
                    sha: sha.clone(),
                    prefix: format!("raw:{w}:"),
                })
                .await?;
                summary.put(&mut r);
                r.put("seconds", args.seconds);
            }
            Workload::Serial | Workload::Parallel32 => {
                // The same loop on the raw client in alternating slices of
                // this run, so `ratio_to_raw` does not carry the machine's
                // drift between two runs (the raw-* workloads still report
                // the contiguous figure).
                let locker = Locker {
                    backend: tower_backend::connect(url)?,
                    api: args.api,
                };
                let sha = load_release(&mut conn).await?;
                let (raw, ours) = alternate(
                    args.seconds,
                    async |s| {
                        run_tally(workers, s, |w| RawCycle {
                            conn: conn.clone(),
                            sha: sha.clone(),
                            prefix: format!("raw:{w}:"),
                        })
                        .await
                    },
                    async |s| {
                        run_tally(workers, s, |w| LockCycle {
                            locker: locker.clone(),
                            prefix: if workers == 1 {
                                "s:".to_owned()
                            } else {
                                format!("p{w}:")
                            },
                        })
                        .await
                    },
                )
                .await?;
                r.put(
                    "api",
                    match args.api {
                        Api::Owned => "OwnedLock",
                        Api::Backend => "LockBackend",
                    },
                );
                ours.put(&mut r);
                r.put("raw_ops_per_s", round(raw.ops_per_s, 1));
                r.put("raw_p50_us", us(raw.p50_ns));
                r.put("raw_p99_us", us(raw.p99_ns));
                r.put("raw_errors", raw.errors);
                r.put("ratio_to_raw", round(ours.ops_per_s / raw.ops_per_s, 4));
                r.put("seconds", args.seconds);
            }
            _ => {
                let locker = Locker {
                    backend: tower_backend::connect(url)?,
                    api: args.api,
                };
                // `held` compares with an empty keyspace on the same server:
                // the next database number (its own, empty hash table).
                let empty = match args.workload {
                    Workload::Held => {
                        let other = other_db(url)?;
                        r.put("empty_url_db", other.1);
                        Some(Locker {
                            backend: tower_backend::connect(&other.0)?,
                            api: args.api,
                        })
                    }
                    _ => None,
                };
                run_locks(&locker, empty.as_ref(), args, HELD_REDIS, &mut r).await?;
            }
        }
        r.put("rtt_p50_us", rtt_p50);
        r.put("rtt_p99_us", rtt_p99);
        if let Some(idle) = idle_rtt_p50 {
            r.put("idle_rtt_p50_us", idle);
        }
        Ok(r)
    }

    /// `url` with the next database number (`/N` → `/N+1`, none → `/1`).
    fn other_db(url: &str) -> Result<(String, u32), String> {
        let (base, query) = match url.split_once('?') {
            Some((b, q)) => (b, format!("?{q}")),
            None => (url, String::new()),
        };
        let after_scheme = base.find("://").map_or(0, |i| i + 3);
        let (authority, db) = match base[after_scheme..].find('/') {
            None => (base, 0),
            Some(i) => {
                let (authority, db) = base.split_at(after_scheme + i);
                let db = match &db[1..] {
                    "" => 0,
                    n => n
                        .parse()
                        .map_err(|_| format!("cannot read the database number in {url}"))?,
                };
                (authority, db)
            }
        };
        let other = (db + 1) % 16;
        Ok((format!("{authority}/{other}{query}"), other))
    }

    /// Load the compare-and-delete script; its hash.
    async fn load_release(conn: &mut MultiplexedConnection) -> Result<String, String> {
        client::cmd("SCRIPT")
            .arg("LOAD")
            .arg(RELEASE)
            .query_async(conn)
            .await
            .map_err(err)
    }

    /// p50/p99 of back-to-back PINGs, µs.
    async fn rtt(conn: &mut MultiplexedConnection) -> Result<(f64, f64), String> {
        let mut samples = Vec::with_capacity(RTT_SAMPLES);
        for _ in 0..RTT_SAMPLES {
            let t0 = Instant::now();
            let _: String = client::cmd("PING").query_async(conn).await.map_err(err)?;
            samples.push(t0.elapsed().as_nanos() as u64);
        }
        samples.sort_unstable();
        Ok((
            us(percentile(&samples, 50.0)),
            us(percentile(&samples, 99.0)),
        ))
    }

    /// p50 of PINGs each sent right after a `HOLD` sleep, µs: a round trip
    /// that starts from idle, as a release after a hold does.
    async fn idle_rtt(conn: &mut MultiplexedConnection) -> Result<f64, String> {
        let mut samples = Vec::with_capacity(IDLE_RTT_SAMPLES);
        for _ in 0..IDLE_RTT_SAMPLES {
            tokio::time::sleep(HOLD).await;
            let t0 = Instant::now();
            let _: String = client::cmd("PING").query_async(conn).await.map_err(err)?;
            samples.push(t0.elapsed().as_nanos() as u64);
        }
        samples.sort_unstable();
        Ok(us(percentile(&samples, 50.0)))
    }

    /// `SET key token NX PX 30000`, then EVALSHA compare-and-delete.
    struct RawCycle {
        conn: MultiplexedConnection,
        sha: String,
        prefix: String,
    }

    impl Cycle for RawCycle {
        async fn cycle(&mut self, i: u64) -> Result<(), String> {
            let key = format!("{}{i}", self.prefix);
            let token = new_owner_token();
            let set: Option<String> = client::cmd("SET")
                .arg(&key)
                .arg(&token)
                .arg("NX")
                .arg("PX")
                .arg(30_000)
                .query_async(&mut self.conn)
                .await
                .map_err(err)?;
            if set.is_none() {
                return Err(format!("{key} is held"));
            }
            let deleted: i64 = client::cmd("EVALSHA")
                .arg(&self.sha)
                .arg(1)
                .arg(&key)
                .arg(&token)
                .query_async(&mut self.conn)
                .await
                .map_err(err)?;
            if deleted == 1 {
                Ok(())
            } else {
                Err(format!("{key} was no longer ours"))
            }
        }
    }

    /// The tower-lock Redis backend: the only code here that names its API.
    mod tower_backend {
        use std::sync::Arc;
        use std::time::Duration;

        use tower_lock::SharedBackend;
        use tower_lock::backend::redis::RedisBackend;

        pub(crate) fn connect(url: &str) -> Result<SharedBackend, String> {
            let backend = RedisBackend::from_url(url)
                .map_err(|e| format!("RedisBackend::from_url: {e}"))?
                .with_prefix("lockbench:")
                .with_op_timeout(Duration::from_secs(2));
            Ok(Arc::new(backend))
        }
    }
}
