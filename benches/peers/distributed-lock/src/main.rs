//! The peer side of tower-lock's lockbench `readers64` and `permits4`:
//! `distributed-lock` 0.2 (Rust) measured with the same workloads and the
//! same accounting as `examples/lockbench/kinds.rs`, printing one JSON line
//! with the same fields.
//!
//! ```sh
//! cargo run --release -- --backend redis://127.0.0.1:6390 --workload readers64 --seconds 5
//! cargo run --release -- --backend postgres://postgres@127.0.0.1:5433/postgres --workload readers64 --seconds 5
//! ```
//!
//! # Accounting (as lockbench's `holders`)
//!
//! 200 uncontended warm-up cycles before timing. Window = `--seconds`.
//! `ops` = cycles released inside the window, `ops_per_s = ops / seconds`;
//! no cycle starts after the window, the ones in flight finish (`elapsed_s`
//! includes that drain). A cycle: acquire (waiting up to 10 s, by the
//! library's own means), hold 1 ms (`tokio::time::sleep`), release. Waits
//! (`p50_us`, `p99_us`, nearest rank) are the successful acquisitions;
//! failures are counted in `errors` and the worker tries again at once.
//! `max_concurrent_holders`: an in-process counter, +1 right after acquire
//! returns, -1 right before release. `utilisation`: total hold time inside
//! the window / window (the mean number of holders at once).
//! `same_worker_reacquire_pct`: acquisitions by the worker that gave a hold
//! back last. Runtime: tokio multi-thread, 2 workers, as lockbench.
//!
//! Bad flags: usage on stderr, exit 2. A run that cannot start (server
//! unreachable, a primitive the provider lacks): message on stderr, exit 1.

mod args;
mod locks;

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Map, Value};
use tokio::sync::{Barrier, watch};

use self::args::{Args, USAGE, Workload};
use self::locks::{Lock, Provider};

/// As lockbench: uncontended cycles before timing.
const WARMUP: u64 = 200;
/// As lockbench (and the peers' contended16): the longest wait.
const WAIT: Duration = Duration::from_secs(10);
const HOLD: Duration = Duration::from_millis(1);
/// The one key every task works on (lockbench's `kinds`).
const KEY: &str = "kinds";

fn main() -> ExitCode {
    let args = match Args::parse(std::env::args().skip(1)) {
        Ok(Some(args)) => args,
        Ok(None) => {
            eprintln!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(msg) => {
            eprintln!("distributed-lock-peer-bench: {msg}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    match runtime.block_on(run(args)) {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(msg) => {
            eprintln!("distributed-lock-peer-bench: {msg}");
            ExitCode::from(1)
        }
    }
}

async fn run(args: Args) -> Result<String, String> {
    let (kind, tasks) = match args.workload {
        Workload::Readers64 => ("shared", 64),
        Workload::Permits4 => ("permits=4", 16),
    };
    let provider = Provider::connect(&args.backend).await?;
    // Before the warm-up, so a missing primitive is reported as such.
    let locks = (0..tasks)
        .map(|_| provider.lock(args.workload, KEY))
        .collect::<Result<Vec<_>, _>>()?;
    let mut r = Map::new();
    let mut put = |k: &str, v: Value| {
        r.insert(k.to_owned(), v);
    };
    put("peer", "distributed-lock 0.2".into());
    put("backend", args.backend.name().into());
    put("workload", args.workload.name().into());
    put("api", locks::api(&args.backend, args.workload).into());
    put(
        "settings",
        locks::settings(&args.backend, args.workload).into(),
    );
    put("kind", kind.into());
    put("tasks", tasks.into());
    for (k, v) in holders(locks, args.seconds).await? {
        put(k, v);
    }
    put("seconds", args.seconds.into());
    Ok(Value::Object(r).to_string())
}

#[derive(Default)]
struct Stats {
    ops: u64,
    errors: u64,
    waits: Vec<u64>,
    hold_ns: u64,
    same_worker: u64,
    first_error: Option<String>,
}

/// lockbench's `kinds::holders`, on distributed-lock: one task per lock
/// object, all on one key, the same window and counters.
async fn holders(locks: Vec<Lock>, seconds: f64) -> Result<Vec<(&'static str, Value)>, String> {
    let tasks = locks.len();
    for _ in 0..WARMUP {
        let held = locks[0]
            .acquire(WAIT)
            .await
            .map_err(|e| format!("warm-up acquire: {e}"))?;
        held.release()
            .await
            .map_err(|e| format!("warm-up release: {e}"))?;
    }
    let holders = Arc::new(AtomicI64::new(0));
    let max_holders = Arc::new(AtomicI64::new(0));
    let last_releaser = Arc::new(AtomicUsize::new(usize::MAX));
    // Every task waits at the barrier, then for the window to be set.
    let ready = Arc::new(Barrier::new(tasks + 1));
    let (tx, rx) = watch::channel(None::<(Instant, Instant)>);
    let workers: Vec<_> = locks
        .into_iter()
        .enumerate()
        .map(|(w, lock)| {
            let (ready, mut rx) = (ready.clone(), rx.clone());
            let (holders, max_holders, last_releaser) =
                (holders.clone(), max_holders.clone(), last_releaser.clone());
            tokio::spawn(async move {
                ready.wait().await;
                let (_, end) = rx
                    .wait_for(Option::is_some)
                    .await
                    .expect("window set")
                    .expect("some");
                let mut s = Stats::default();
                loop {
                    let t0 = Instant::now();
                    if t0 >= end {
                        break;
                    }
                    let held = match lock.acquire(WAIT).await {
                        Ok(held) => held,
                        Err(e) => {
                            s.errors += 1;
                            s.first_error.get_or_insert_with(|| e.to_string());
                            continue;
                        }
                    };
                    let t1 = Instant::now();
                    let now = holders.fetch_add(1, Ordering::SeqCst) + 1;
                    max_holders.fetch_max(now, Ordering::SeqCst);
                    s.same_worker += u64::from(last_releaser.load(Ordering::SeqCst) == w);
                    tokio::time::sleep(HOLD).await;
                    let h1 = Instant::now();
                    holders.fetch_sub(1, Ordering::SeqCst);
                    last_releaser.store(w, Ordering::SeqCst);
                    if let Err(e) = held.release().await {
                        s.errors += 1;
                        s.first_error.get_or_insert_with(|| e.to_string());
                    }
                    // Hold time inside the window only.
                    s.hold_ns += h1.min(end).saturating_duration_since(t1).as_nanos() as u64;
                    s.waits.push((t1 - t0).as_nanos() as u64);
                    if Instant::now() <= end {
                        s.ops += 1;
                    }
                }
                s
            })
        })
        .collect();
    drop(rx);
    ready.wait().await;
    let start = Instant::now();
    tx.send_replace(Some((start, start + Duration::from_secs_f64(seconds))));
    let mut all = Stats::default();
    for h in workers {
        let s = h.await.map_err(|e| format!("worker panicked: {e}"))?;
        all.ops += s.ops;
        all.errors += s.errors;
        all.waits.extend(s.waits);
        all.hold_ns += s.hold_ns;
        all.same_worker += s.same_worker;
        if all.first_error.is_none() {
            all.first_error = s.first_error;
        }
    }
    if let Some(e) = &all.first_error {
        eprintln!(
            "distributed-lock-peer-bench: {} errors, first: {e}",
            all.errors
        );
    }
    all.waits.sort_unstable();
    let acquisitions = all.waits.len().max(1) as f64;
    Ok(vec![
        ("ops_per_s", round(all.ops as f64 / seconds, 1).into()),
        ("p50_us", us(percentile(&all.waits, 50.0)).into()),
        ("p99_us", us(percentile(&all.waits, 99.0)).into()),
        (
            "max_concurrent_holders",
            max_holders.load(Ordering::SeqCst).into(),
        ),
        (
            "utilisation",
            round(all.hold_ns as f64 / 1e9 / seconds, 3).into(),
        ),
        (
            "same_worker_reacquire_pct",
            round(100.0 * all.same_worker as f64 / acquisitions, 2).into(),
        ),
        ("errors", all.errors.into()),
        ("ops", all.ops.into()),
        ("elapsed_s", round(start.elapsed().as_secs_f64(), 3).into()),
    ])
}

/// Nearest-rank percentile of sorted samples, in ns (lockbench's).
fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1] as f64
}

/// Microseconds, rounded to 0.01 (lockbench's).
fn us(ns: f64) -> f64 {
    (ns / 10.0).round() / 100.0
}

fn round(x: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (x * f).round() / f
}
