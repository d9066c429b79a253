//! The fault-schedule checker: every backend under random faults, every
//! history checked for two holders, falling fences, lost wake-ups, lost
//! updates and locks that never come free (see `check.rs` for the model).
//!
//! A schedule is drawn from a seed: the clients' operations (acquire with
//! and without a max wait, release, extend, watchdog renewals, hand-offs
//! between processes with restore, redelivered tokens, shared custom
//! owners, multi-lock requests through a `LockLayer`, force releases,
//! single-flight runs, calls cancelled at random points, pauses inside
//! critical sections) and the nemesis's faults (client processes stopped
//! with SIGSTOP or killed with SIGKILL, server restarts with and without their data, connections
//! reset, replies lost, traffic held back through a TCP proxy, the
//! wake-up connections killed, cluster primaries killed, etcd leaders
//! killed and members stopped). Tasks of their own take shared and
//! exclusive holds of a reader/writer key and permits of a permits key
//! (`kinds_work.rs`; skipped, with a note, on a backend that answers
//! `Unsupported` for them). In each process a relay of tasks of its own
//! takes turns on an exclusive key of the process's own, the way the
//! hand-off's wake-up paths are tested: a long hold handed to waiters with
//! short TTLs that walk away, holds that end just before their TTL, waiters
//! that give up (`relay_work.rs`). Client processes
//! (two per schedule; tasks of one process for the in-memory backend) record
//! every backend call on the machine's monotonic clock, journalled as it
//! goes so that a killed process leaves its history; the coordinator
//! serves the fenced store, injects the faults, and checks the merged
//! history afterwards.
//!
//! ```sh
//! cargo test --all-features --test chaos                      # the short pass (CI)
//! scripts/check.sh                                            # the long run
//! CHAOS_BACKEND=redis CHAOS_SEED=1234 cargo test --all-features --test chaos \
//!     long_run -- --ignored --nocapture                       # replay one schedule
//! ```
//!
//! A failing schedule prints its seed; the same seed draws the same
//! operations and faults at the same times (the machine's scheduling is not
//! replayed).

// Without the server backends' features, their rigs and the proxy go unused.
#![cfg_attr(
    not(all(feature = "redis", feature = "postgres")),
    allow(dead_code, unused_imports, unused_variables)
)]

#[path = "../common/mod.rs"]
mod common;

mod check;
mod client;
mod clock;
mod dump;
mod history;
mod proxy;
mod queued;
mod recorder;
mod rigs;
mod rng;
mod run;
mod store;

use rigs::Rig;
use run::{Report, Settings};

/// The client processes are this binary, run with one test selected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_client() {
    run::child_main().await
}

/// One schedule at a time in this binary: each keeps the machine's cores
/// busy, and the checker's bounds are for one run at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Run `seeds` on `rig`; every report, printed; panics with the violations.
async fn pass(rig: &mut dyn Rig, seeds: &[u64], settings: &Settings) -> Vec<Report> {
    let mut reports = Vec::new();
    for &seed in seeds {
        let report = run::schedule(rig, seed, settings).await;
        println!(
            "chaos {} seed {seed}: {} ops, faults [{}], {} violations",
            rig.name(),
            report.ops,
            report
                .faults
                .iter()
                .map(|f| f.what.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            report.violations.len()
        );
        note_kinds(rig.name(), &report);
        reports.push(report);
    }
    let bad: Vec<String> = reports
        .iter()
        .flat_map(|r| {
            r.violations
                .iter()
                .map(move |v| format!("seed {}: {}: {}", r.seed, v.kind, v.detail))
        })
        .collect();
    assert!(
        bad.is_empty(),
        "{} violations on {} (replay: CHAOS_BACKEND={} CHAOS_SEED=<seed> cargo test \
         --all-features --test chaos long_run -- --ignored --nocapture):\n{}",
        bad.len(),
        rig.name(),
        rig.name(),
        bad.join("\n")
    );
    reports
}

/// The short pass's seeds: CHAOS_SEEDS (comma-separated), else two fixed.
fn short_seeds() -> Vec<u64> {
    match std::env::var("CHAOS_SEEDS") {
        Ok(s) => s.split(',').filter_map(|x| x.trim().parse().ok()).collect(),
        Err(_) => vec![1, 2],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_pass_memory() {
    let _one = ONE_AT_A_TIME.lock().await;
    let mut rig = rigs::MemoryRig(tower_lock::MemoryBackend::new());
    pass(&mut rig, &short_seeds(), &Settings::short()).await;
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_pass_redis() {
    let _one = ONE_AT_A_TIME.lock().await;
    let mut rig = rigs::RedisRig::start().await;
    pass(&mut rig, &short_seeds(), &Settings::short()).await;
}

#[cfg(feature = "redis-cluster")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_pass_redis_cluster() {
    let _one = ONE_AT_A_TIME.lock().await;
    let mut rig = rigs::ClusterRig::shared().await;
    pass(&mut rig, &short_seeds(), &Settings::short()).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_pass_postgres() {
    let _one = ONE_AT_A_TIME.lock().await;
    let mut rig = rigs::PostgresRig::start().await;
    pass(&mut rig, &short_seeds(), &Settings::short()).await;
}

#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_pass_etcd() {
    let _one = ONE_AT_A_TIME.lock().await;
    let mut rig = rigs::EtcdRig::start().await;
    pass(&mut rig, &short_seeds(), &Settings::short()).await;
}

/// The long run (scripts/check.sh): CHAOS_BACKEND (memory, redis,
/// redis-cluster, redis-cluster-failover, postgres, etcd), CHAOS_SCHEDULES
/// (default 200) from CHAOS_SEED_BASE (default 1000), or one CHAOS_SEED;
/// CHAOS_STOP_AT_FIRST=1 stops at the first schedule with a violation;
/// CHAOS_DUMP=<file> appends each violating schedule's timeline of the keys
/// concerned to <file> and writes its history to <file>-<seed>.json
/// (CHAOS_DUMP_ALL=1: every schedule; see `dump.rs`; `recheck` checks such a
/// history again).
/// Prints one line per schedule and a summary line `CHAOS-SUMMARY {json}`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "minutes long: scripts/check.sh"]
async fn long_run() {
    let backend = std::env::var("CHAOS_BACKEND").unwrap_or_else(|_| "memory".into());
    let settings = Settings::from_env();
    let seeds: Vec<u64> = match std::env::var("CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        Some(seed) => vec![seed],
        None => {
            let n: u64 = env_or("CHAOS_SCHEDULES", 200);
            let base: u64 = env_or("CHAOS_SEED_BASE", 1_000);
            (base..base + n).collect()
        }
    };
    let stop_at_first = std::env::var("CHAOS_STOP_AT_FIRST").is_ok_and(|v| v == "1");
    let mut rig: Box<dyn Rig> = match backend.as_str() {
        "memory" => Box::new(rigs::MemoryRig(tower_lock::MemoryBackend::new())),
        #[cfg(feature = "redis")]
        "redis" => Box::new(rigs::RedisRig::start().await),
        #[cfg(feature = "redis-cluster")]
        "redis-cluster" => Box::new(rigs::ClusterRig::shared().await),
        #[cfg(feature = "redis-cluster")]
        "redis-cluster-failover" => Box::new(rigs::ClusterRig::with_replicas().await),
        #[cfg(feature = "postgres")]
        "postgres" => Box::new(rigs::PostgresRig::start().await),
        #[cfg(feature = "etcd")]
        "etcd" => Box::new(rigs::EtcdRig::start().await),
        other => panic!("unknown CHAOS_BACKEND {other}"),
    };
    let started = std::time::Instant::now();
    let (mut ops, mut schedules, mut faults, mut crashes) = (0usize, 0usize, 0usize, 0usize);
    let (mut kinds_ops, mut kinds_skipped) = (0usize, 0usize);
    let mut violations: Vec<String> = Vec::new();
    let mut first: Option<(u64, f64)> = None;
    for seed in seeds {
        let report = run::schedule(rig.as_mut(), seed, &settings).await;
        schedules += 1;
        ops += report.ops;
        faults += report.faults.len();
        let killed = report.faults.iter().filter(|f| f.crash).count();
        crashes += killed;
        println!(
            "chaos {backend} seed {seed}: {} ops, {} faults ({killed} client process killed), \
             {} violations",
            report.ops,
            report.faults.len(),
            report.violations.len()
        );
        if !report.faults.is_empty() {
            let what: Vec<&str> = report.faults.iter().map(|f| f.what.as_str()).collect();
            println!("  faults: {}", what.join("; "));
        }
        note_kinds(&backend, &report);
        kinds_ops += report.kinds_ops;
        kinds_skipped += usize::from(report.kinds_skipped.is_some());
        for v in &report.violations {
            println!("  VIOLATION seed {seed}: {}: {}", v.kind, v.detail);
            violations.push(format!("seed {seed}: {}", v.kind));
        }
        if !report.violations.is_empty() && first.is_none() {
            first = Some((seed, started.elapsed().as_secs_f64()));
        }
        if stop_at_first && first.is_some() {
            break;
        }
    }
    println!(
        "CHAOS-SUMMARY {}",
        serde_json::json!({
            "backend": backend,
            "schedules": schedules,
            "ops": ops,
            "kinds_ops": kinds_ops,
            "kinds_skipped_schedules": kinds_skipped,
            "faults": faults,
            "client_processes_killed": crashes,
            "violations": violations.len(),
            "first_violation_seed": first.map(|f| f.0),
            "first_violation_after_s": first.map(|f| f.1),
            "seconds": started.elapsed().as_secs_f64(),
        })
    );
    if !stop_at_first {
        assert!(violations.is_empty(), "violations: {violations:?}");
    }
}

/// Check a recorded history again (`CHAOS_DUMP` wrote it):
/// `CHAOS_HISTORY=<json>`; prints the violations, and with CHAOS_DUMP set
/// the timeline of their keys. The rig's own bounds are not in the
/// history: for an etcd one, `CHAOS_STOPPED_HOLDER_MS=3500
/// CHAOS_TOGETHER_MS=100` (the etcd rig's; see `Bounds`).
#[test]
#[ignore = "needs CHAOS_HISTORY"]
fn recheck() {
    let path = std::env::var("CHAOS_HISTORY").expect("CHAOS_HISTORY=<history JSON>");
    let history: history::History =
        serde_json::from_slice(&std::fs::read(&path).expect("read the history")).expect("JSON");
    let mut bounds = run::Settings::from_env().bounds;
    bounds.stopped_holder_ns = env_or(
        "CHAOS_STOPPED_HOLDER_MS",
        bounds.stopped_holder_ns / 1_000_000,
    ) * 1_000_000;
    bounds.together_ns = env_or("CHAOS_TOGETHER_MS", bounds.together_ns / 1_000_000) * 1_000_000;
    let violations = check::check(&history, bounds);
    for v in &violations {
        println!("  VIOLATION: {}: {}", v.kind, v.detail);
    }
    if std::env::var("CHAOS_DUMP").is_ok() {
        print!("{}", dump::render(0, &history, &violations));
    }
    println!("{} violations", violations.len());
}

/// The kinds workload's share of a schedule, or why it did not run (a
/// backend that holds exclusive locks only answers `Unsupported`).
fn note_kinds(backend: &str, report: &run::Report) {
    match &report.kinds_skipped {
        Some(why) => println!(
            "  note: kinds workload skipped on {backend} (seed {}): {why}",
            report.seed
        ),
        None => println!("  kinds: {} ops on the kinds keys", report.kinds_ops),
    }
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
