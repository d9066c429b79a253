//! What a violation is about, for a person: `CHAOS_DUMP=<file>` appends,
//! for each schedule with violations, the violations and the timeline of
//! every key they name (every call on it: invocation and reply in ms from
//! the run's first call as the violations print them, process and number,
//! what it asked and what it got) with the faults in between; and writes
//! the whole history as JSON to `<file>-<seed>.json`, which
//! `CHAOS_HISTORY=<json> cargo test --all-features --test chaos recheck --
//! --ignored --nocapture` checks again (a checker fix tried on the history
//! that showed its need, without running the schedule again).

use std::fmt::Write as _;
use std::io::Write as _;

use super::check::Violation;
use super::clock::MS;
use super::history::{History, Op, Outcome};

/// Append the dump of `history` (schedule `seed`) to `path`, and write the
/// history's JSON beside it.
pub fn write(path: &str, seed: u64, history: &History, violations: &[Violation]) {
    let json = format!("{path}-{seed}.json");
    let _ = std::fs::write(&json, serde_json::to_vec(history).expect("history JSON"));
    let text = render(seed, history, violations);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path);
    match file {
        Ok(mut f) => {
            let _ = f.write_all(text.as_bytes());
        }
        Err(e) => eprintln!("CHAOS_DUMP {path}: {e}"),
    }
}

/// The dump's text (see the module docs).
pub fn render(seed: u64, h: &History, violations: &[Violation]) -> String {
    let t0 = h.ops.iter().map(|o| o.inv).min().unwrap_or(0);
    let at = |ns: u64| (ns as f64 - t0 as f64) / MS as f64;
    let mut s = String::new();
    let _ = writeln!(s, "=== seed {seed}");
    for v in violations {
        let _ = writeln!(s, "VIOLATION {}: {}", v.kind, v.detail);
    }
    let mut keys: Vec<&str> = h
        .ops
        .iter()
        .map(|o| o.key.as_str())
        .filter(|k| {
            violations.is_empty()
                || violations
                    .iter()
                    .any(|v| v.detail.contains(&format!("{k}:")))
        })
        .collect();
    keys.sort_unstable();
    keys.dedup();
    for key in keys {
        let _ = writeln!(s, "--- {key}");
        let mut ops: Vec<&Op> = h.ops.iter().filter(|o| o.key == key).collect();
        ops.sort_by_key(|o| (o.inv, o.p, o.id));
        let mut faults = h.faults.iter().peekable();
        for op in ops {
            while let Some(f) = faults.next_if(|f| f.at <= op.inv) {
                let _ = writeln!(
                    s,
                    "{:9.1} ..{:9.1}  FAULT {}",
                    at(f.at),
                    at(f.until),
                    f.what
                );
            }
            let _ = writeln!(s, "{}", line(op, &at));
        }
        for f in faults {
            let _ = writeln!(
                s,
                "{:9.1} ..{:9.1}  FAULT {}",
                at(f.at),
                at(f.until),
                f.what
            );
        }
    }
    s
}

fn line(op: &Op, at: &dyn Fn(u64) -> f64) -> String {
    let mut s = format!(
        "{:9.1} ..{:9.1}  p{} #{:<4} {:?}",
        at(op.inv),
        at(op.ret),
        op.p,
        op.id,
        op.kind
    );
    if let Some(f) = op.fence_in {
        let _ = write!(s, " fence_in={f}");
    }
    if op.ttl_ms > 0 {
        let _ = write!(s, " ttl={}", op.ttl_ms);
    }
    if op.wait_ms > 0 {
        let _ = write!(s, " wait={}", op.wait_ms);
    }
    let outcome = match &op.outcome {
        Outcome::Other(code) => code.clone(),
        o => format!("{o:?}"),
    };
    let _ = write!(s, " -> {outcome}");
    if let Some(f) = op.fence {
        let _ = write!(s, " fence={f}");
    }
    if let Some(start) = op.start {
        let _ = write!(s, " lease={:.1}+{}", at(start), op.lease_ms);
    }
    if op.value > 0 {
        let _ = write!(s, " value={}", op.value);
    }
    if let Some(c) = op.checked {
        let _ = write!(s, " checked={:.1}", at(c));
    }
    for q in &op.queued {
        let _ = write!(s, " queued@{:.1}", at(*q));
    }
    s
}
