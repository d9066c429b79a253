//! The workloads through tower-lock, whatever the backend: serial,
//! parallel32, contended16 and held.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tower_lock::backend::Holder;

use tower_lock::backend::AcquireRequest;
use tower_lock::{JobSpec, LockError, LockKey, LockKind, OwnedLock, SharedBackend};

use super::args::Api;
use super::report::{Report, round, us};
use super::timing::{Cycle, Gate, Summary, Tally, alternate, percentile, run_loops, run_tally};
use super::{CONTENDED_WAIT, CONTENDERS, HOLD, PARALLEL, TTL, WARMUP};

#[derive(Clone)]
pub(crate) struct Locker {
    pub(crate) backend: SharedBackend,
    pub(crate) api: Api,
}

pub(crate) enum Held {
    Owned(OwnedLock),
    Request(AcquireRequest),
}

pub(crate) fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

impl Locker {
    pub(crate) async fn acquire(&self, key: String, max_wait: Duration) -> Result<Held, LockError> {
        self.acquire_kind(key, max_wait, LockKind::Exclusive).await
    }

    /// [`acquire`](Locker::acquire) a hold of `kind`.
    pub(crate) async fn acquire_kind(
        &self,
        key: String,
        max_wait: Duration,
        kind: LockKind,
    ) -> Result<Held, LockError> {
        match self.api {
            Api::Owned => {
                let spec = JobSpec::new(key, TTL).max_wait(max_wait).kind(kind);
                OwnedLock::acquire(self.backend.clone(), &spec)
                    .await
                    .map(Held::Owned)
            }
            Api::Backend => {
                let owner = uuid::Uuid::new_v4().to_string();
                let req = AcquireRequest::new(LockKey::global(key)?, owner, TTL, max_wait)?
                    .with_kind(kind)?;
                self.backend.acquire(&req).await?;
                Ok(Held::Request(req))
            }
        }
    }

    pub(crate) async fn release(&self, held: Held) -> Result<(), LockError> {
        match held {
            Held::Owned(lock) => lock.release().await,
            Held::Request(req) => {
                self.backend
                    .release(req.key(), Holder::owner_only(req.owner()))
                    .await
            }
        }
    }
}

/// `serial`/`parallel32`: acquire a fresh key, release it.
pub(crate) struct LockCycle {
    pub(crate) locker: Locker,
    pub(crate) prefix: String,
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

pub(crate) async fn serial_tally(
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

pub(crate) async fn serial(locker: &Locker, seconds: f64, prefix: &str) -> Result<Summary, String> {
    let (tally, elapsed) = serial_tally(locker, seconds, prefix).await?;
    Ok(Summary::new(tally, seconds, elapsed))
}

pub(crate) async fn parallel(locker: &Locker, seconds: f64) -> Result<Summary, String> {
    run_loops(PARALLEL, seconds, |w| LockCycle {
        locker: locker.clone(),
        prefix: format!("p{w}:"),
    })
    .await
}

/// `contended16`: 16 workers on one key, hold 1 ms.
pub(crate) async fn contended(locker: &Locker, seconds: f64, r: &mut Report) -> Result<(), String> {
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
pub(crate) async fn held(
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
pub(crate) async fn prefill(locker: &Locker, n: usize, seconds: f64) -> Result<f64, String> {
    let run = &uuid::Uuid::new_v4().simple().to_string()[..8];
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
