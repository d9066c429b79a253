//! The workloads of shared holds and permits: `readers64`, `permits4`, and
//! `kinds-serial` (the cycle of each kind beside the exclusive one).

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::time::Instant;

use tower_lock::LockKind;

use super::locks::{Held, Locker, err};
use super::report::{Report, round, us};
use super::timing::{Cycle, Gate, alternate, percentile, run_tally};
use super::{CONTENDED_WAIT, HOLD, WARMUP};

/// `readers64`: 64 tasks, one key, shared holds of 1 ms. `permits4`: 16
/// tasks, one key, 4 permits, holds of 1 ms. Reports the waits, the most
/// holders seen at once (never above the kind's bound), the utilisation
/// (mean holders at once = total hold time / window) and, for permits, how
/// often a permit went to the worker that gave one back last.
pub(crate) async fn holders(
    locker: &Locker,
    kind: LockKind,
    tasks: usize,
    seconds: f64,
    r: &mut Report,
) -> Result<(), String> {
    const KEY: &str = "kinds";
    for _ in 0..WARMUP {
        let held = locker
            .acquire_kind(KEY.to_owned(), CONTENDED_WAIT, kind)
            .await
            .map_err(err)?;
        locker.release(held).await.map_err(err)?;
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
    let holders = Arc::new(AtomicI64::new(0));
    let max_holders = Arc::new(AtomicI64::new(0));
    let last_releaser = Arc::new(AtomicUsize::new(usize::MAX));
    let (gate, rx) = Gate::new(tasks);
    let workers: Vec<_> = (0..tasks)
        .map(|w| {
            let (locker, rx) = (locker.clone(), rx.clone());
            let (holders, max_holders, last_releaser) =
                (holders.clone(), max_holders.clone(), last_releaser.clone());
            tokio::spawn(async move {
                let window = rx.wait().await;
                let mut s = Stats::default();
                loop {
                    let t0 = Instant::now();
                    if t0 >= window.end {
                        break;
                    }
                    let held: Held = match locker
                        .acquire_kind(KEY.to_owned(), CONTENDED_WAIT, kind)
                        .await
                    {
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
                    let released = locker.release(held).await;
                    if let Err(e) = released {
                        s.errors += 1;
                        s.first_error.get_or_insert_with(|| e.to_string());
                    }
                    // Hold time inside the window only: utilisation is the
                    // mean number of holders over the window.
                    let h_end = h1.min(window.end);
                    s.hold_ns += h_end.saturating_duration_since(t1).as_nanos() as u64;
                    s.waits.push((t1 - t0).as_nanos() as u64);
                    if Instant::now() <= window.end {
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
        all.hold_ns += s.hold_ns;
        all.same_worker += s.same_worker;
        if all.first_error.is_none() {
            all.first_error = s.first_error;
        }
    }
    if let Some(e) = &all.first_error {
        eprintln!("lockbench: {} errors, first: {e}", all.errors);
    }
    all.waits.sort_unstable();
    let acquisitions = all.waits.len().max(1) as f64;
    r.put("kind", kind.to_string());
    r.put("tasks", tasks);
    r.put("ops_per_s", round(all.ops as f64 / seconds, 1));
    r.put("p50_us", us(percentile(&all.waits, 50.0)));
    r.put("p99_us", us(percentile(&all.waits, 99.0)));
    r.put("max_concurrent_holders", max_holders.load(Ordering::SeqCst));
    r.put("utilisation", round(all.hold_ns as f64 / 1e9 / seconds, 3));
    r.put(
        "same_worker_reacquire_pct",
        round(100.0 * all.same_worker as f64 / acquisitions, 2),
    );
    r.put("errors", all.errors);
    r.put("ops", all.ops);
    r.put("elapsed_s", round(window.start.elapsed().as_secs_f64(), 3));
    Ok(())
}

/// `kinds-serial`: one task cycling fresh keys, exclusive against shared
/// and against permits(4), in alternating slices of the same run:
/// `shared_ratio` and `permits_ratio` are the kind's cycle time over the
/// exclusive one's (1.0: as cheap).
pub(crate) async fn serial(locker: &Locker, seconds: f64, r: &mut Report) -> Result<(), String> {
    let tally = |kind: LockKind, prefix: &'static str| {
        let locker = locker.clone();
        async move |s: f64| {
            run_tally(1, s, |_| KindCycle {
                locker: locker.clone(),
                prefix,
                kind,
            })
            .await
        }
    };
    let (ex, shared) = alternate(
        seconds,
        tally(LockKind::Exclusive, "x:"),
        tally(LockKind::Shared, "r:"),
    )
    .await?;
    let (ex2, permits) = alternate(
        seconds,
        tally(LockKind::Exclusive, "y:"),
        tally(LockKind::Permits(4), "n:"),
    )
    .await?;
    let cycle_us = |ops_per_s: f64| 1e6 / ops_per_s.max(f64::MIN_POSITIVE);
    r.put("exclusive_cycle_us", round(cycle_us(ex.ops_per_s), 1));
    r.put("shared_cycle_us", round(cycle_us(shared.ops_per_s), 1));
    r.put("permits_cycle_us", round(cycle_us(permits.ops_per_s), 1));
    r.put("shared_ratio", round(ex.ops_per_s / shared.ops_per_s, 3));
    r.put("permits_ratio", round(ex2.ops_per_s / permits.ops_per_s, 3));
    r.put(
        "errors",
        ex.errors + shared.errors + ex2.errors + permits.errors,
    );
    Ok(())
}

/// `serial`'s cycle for a lock of `kind`: acquire a fresh key, release it.
struct KindCycle {
    locker: Locker,
    prefix: &'static str,
    kind: LockKind,
}

impl Cycle for KindCycle {
    async fn cycle(&mut self, i: u64) -> Result<(), String> {
        let key = format!("{}{i}", self.prefix);
        let held = self
            .locker
            .acquire_kind(key, std::time::Duration::ZERO, self.kind)
            .await
            .map_err(err)?;
        self.locker.release(held).await.map_err(err)
    }
}
