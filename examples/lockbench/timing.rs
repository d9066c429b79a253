//! Timing: windows shared by every worker, tallies, percentiles, and A/B
//! comparisons in alternating slices.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::watch;

use super::WARMUP;
use super::report::{Report, round, us};

#[derive(Debug, Clone, Copy)]
pub(crate) struct Window {
    pub(crate) start: Instant,
    pub(crate) end: Instant,
}

/// Starts every worker on the same window once all are warmed up.
pub(crate) struct Gate {
    pub(crate) tx: watch::Sender<Option<Window>>,
    pub(crate) ready: Arc<tokio::sync::Barrier>,
}

#[derive(Clone)]
pub(crate) struct GateRx {
    pub(crate) rx: watch::Receiver<Option<Window>>,
    pub(crate) ready: Arc<tokio::sync::Barrier>,
}

impl Gate {
    pub(crate) fn new(workers: usize) -> (Gate, GateRx) {
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
    pub(crate) async fn open(&self, seconds: f64) -> Window {
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
    pub(crate) async fn wait(mut self) -> Window {
        self.ready.wait().await;
        let w = self.rx.wait_for(Option::is_some).await.expect("gate open");
        w.expect("some")
    }
}

#[derive(Default)]
pub(crate) struct Tally {
    pub(crate) ops: u64,
    pub(crate) errors: u64,
    pub(crate) lat_ns: Vec<u64>,
    pub(crate) first_error: Option<String>,
}

impl Tally {
    pub(crate) fn record(
        &mut self,
        result: Result<(), String>,
        t0: Instant,
        t1: Instant,
        window: &Window,
    ) {
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

    pub(crate) fn merge(&mut self, other: Tally) {
        self.ops += other.ops;
        self.errors += other.errors;
        self.lat_ns.extend(other.lat_ns);
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
    }
}

/// Nearest-rank percentile of sorted samples, in ns.
pub(crate) fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1] as f64
}

/// What a timed run of loops gives: throughput and per-cycle latency.
pub(crate) struct Summary {
    pub(crate) ops: u64,
    pub(crate) errors: u64,
    pub(crate) ops_per_s: f64,
    pub(crate) p50_ns: f64,
    pub(crate) p99_ns: f64,
    pub(crate) elapsed_s: f64,
}

impl Summary {
    pub(crate) fn new(mut tally: Tally, seconds: f64, elapsed: Duration) -> Self {
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

    pub(crate) fn put(&self, r: &mut Report) {
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
pub(crate) trait Cycle: Send + 'static {
    fn cycle(&mut self, i: u64) -> impl Future<Output = Result<(), String>> + Send;
}

/// Run `cycle` back to back: `warmup` untimed cycles, then the shared
/// window. Returns the tally and when this worker finished (drain included).
pub(crate) async fn drive<C: Cycle>(mut c: C, warmup: u64, gate: GateRx) -> (Tally, Instant) {
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
pub(crate) async fn run_tally<C: Cycle>(
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
pub(crate) async fn run_loops<C: Cycle>(
    workers: usize,
    seconds: f64,
    make: impl FnMut(usize) -> C,
) -> Result<Summary, String> {
    let (tally, elapsed) = run_tally(workers, seconds, make).await?;
    Ok(Summary::new(tally, seconds, elapsed))
}

/// The length of one slice of an A/B comparison.
pub(crate) const SLICE_S: f64 = 0.5;

/// Measure A and B for `seconds` each, in alternating slices of about
/// `SLICE_S` (A B, B A, A B, ...), so that a change in the machine's load
/// (shared, noisy) hits both sides alike instead of biasing their ratio.
pub(crate) async fn alternate(
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
