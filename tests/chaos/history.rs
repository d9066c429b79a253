//! What a run records: every backend call of every client (invocation and
//! completion on the shared monotonic clock, the answer, the fence), every
//! read and write of the fenced store, hand-offs, and the faults injected.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

use super::clock::now_ns;

/// What an operation was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Acquire,
    Release,
    Extend,
    Claim,
    ForceRelease,
    FlightBegin,
    FlightPublish,
    /// A fenced read of the store (it claims the fence).
    Read,
    /// A fenced write of the store.
    Write,
    /// A holder turned its lock into a token for another process: it stops
    /// using the lock here.
    Handoff,
}

/// How it ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Ok,
    Busy,
    Timeout,
    NotFound,
    Mismatch,
    Unavailable,
    /// Single-flight: a fresh result answered, nothing was taken.
    Fresh,
    /// Single-flight: the flight is busy; the caller waits.
    Following,
    /// The store refused a stale fence.
    Stale,
    /// Refused at once: the key's holders are of another family
    /// (`LockError::KindMismatch`).
    KindMismatch,
    /// The caller dropped the call before it answered: what it did on the
    /// server is unknown.
    Cancelled,
    Other(String),
}

/// One operation.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Op {
    /// Process and operation number: unique in a run.
    pub p: u32,
    pub id: u64,
    pub kind: Kind,
    /// The lock's stored key (`LockKey::encoded`), or the store's key.
    pub key: String,
    /// The kind an acquisition asked for (`shared`, `permits=N`); absent
    /// for exclusive (and for calls that name a hold: the checker takes
    /// their kind from the grant of their fence).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lock_kind: Option<String>,
    /// The fence the call named (release, extend, claim, store calls); for
    /// a call naming an owner alone, the acquisition that owner token was
    /// granted in this process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence_in: Option<u64>,
    /// The owner token a grant went to or a call named: with the process
    /// and the fence, it tells apart two acquisitions of one process under
    /// one fence number (fences start over after a restart without data).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    #[serde(default)]
    pub ttl_ms: u64,
    #[serde(default)]
    pub wait_ms: u64,
    pub inv: u64,
    pub ret: u64,
    pub outcome: Outcome,
    /// The fence granted (acquire, claim, flight leader).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence: Option<u64>,
    /// A grant's lease: when its TTL started at the earliest the client can
    /// know (the call's invocation, or the hand-off after a wait), and how
    /// long it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<u64>,
    #[serde(default)]
    pub lease_ms: u64,
    /// Store calls: what the value read or written was.
    #[serde(default)]
    pub value: u64,
    /// Store calls: when the client last had its lock confirmed as held
    /// (its lost signal said so, or the layer ran the handler) before this
    /// call; `None` when it wrote without asking (fencing must catch it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checked: Option<u64>,
    /// A waiter: when each queue entry it made was known written on the
    /// server (see `queued.rs`); its place in the queue dates from the last.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub queued: Vec<u64>,
}

/// A fault the nemesis injected, and until when it lasted.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Fault {
    pub what: String,
    pub at: u64,
    pub until: u64,
    /// The process it stopped (SIGSTOP), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<u32>,
    /// Every lock held when it struck may be lost (a server that forgot its
    /// locks, a failover): leases end here, by the README's rules.
    #[serde(default)]
    pub loses_locks: bool,
    /// For a fault that loses locks: by when the server had lost them (its
    /// process killed). A lock asked for later was granted by the server
    /// that came back, not lost by this fault. `None`: `until`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lost_by: Option<u64>,
    /// Fences may start over after it (a server restarted without its data).
    #[serde(default)]
    pub resets_fences: bool,
    /// The process (`process`) was killed (SIGKILL) at `at`: it never
    /// resumes, and what it held the server keeps until it runs out.
    #[serde(default)]
    pub crash: bool,
    /// A server stall that neither loses locks nor breaks a connection (no
    /// call is retried because of it): leases still end at their TTL across
    /// it (see the cut-short rule).
    #[serde(default)]
    pub quiet: bool,
}

impl Fault {
    /// When the process it stopped runs again (never, after a crash).
    pub fn resumes(&self) -> u64 {
        if self.crash { u64::MAX } else { self.until }
    }
}

/// The operations of one process, shared by its tasks.
#[derive(Clone)]
pub struct Log {
    p: u32,
    next: Arc<AtomicU64>,
    ops: Arc<Mutex<Vec<Op>>>,
    /// Backend calls invoked and not answered yet (see [`Log::take`]).
    in_flight: Arc<Mutex<BTreeMap<u64, Op>>>,
    /// Told when the last call in flight answers.
    settled: Arc<Notify>,
    /// A client process's journal: every call written down as it begins
    /// and as it ends, so that a process killed mid-run leaves its history
    /// (see [`read_journal`]).
    journal: Option<Arc<Mutex<std::fs::File>>>,
}

/// One line of a journal.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Entry {
    Begin(Op),
    Done(Op),
    Forget(u64),
}

impl Log {
    pub fn new(p: u32) -> Self {
        Log {
            p,
            next: Arc::new(AtomicU64::new(0)),
            ops: Arc::default(),
            in_flight: Arc::default(),
            settled: Arc::default(),
            journal: None,
        }
    }

    /// A client process's log, journalled to `path` as it goes.
    pub fn journalled(p: u32, path: &std::path::Path) -> Self {
        let file = std::fs::File::create(path).expect("journal");
        Log {
            journal: Some(Arc::new(Mutex::new(file))),
            ..Log::new(p)
        }
    }

    fn write(&self, entry: &Entry) {
        use std::io::Write;
        if let Some(journal) = &self.journal {
            let mut line = serde_json::to_vec(entry).expect("JSON");
            line.push(b'\n');
            // One write(2) per line, unbuffered: a SIGKILL loses no line
            // that was written, and cuts none in half but the last.
            let _ = lock(journal).write_all(&line);
        }
    }

    /// A new operation, invoked now.
    pub fn start(&self, kind: Kind, key: String) -> Op {
        Op {
            p: self.p,
            id: self.next.fetch_add(1, Ordering::Relaxed),
            kind,
            key,
            lock_kind: None,
            fence_in: None,
            owner: None,
            ttl_ms: 0,
            wait_ms: 0,
            inv: now_ns(),
            ret: 0,
            outcome: Outcome::Cancelled,
            fence: None,
            start: None,
            lease_ms: 0,
            value: 0,
            checked: None,
            queued: Vec::new(),
        }
    }

    /// `op` (a backend call) is on its way: until it is pushed, [`Log::take`]
    /// records it as cancelled.
    pub fn begin(&self, op: &Op) {
        self.write(&Entry::Begin(op.clone()));
        lock(&self.in_flight).insert(op.id, op.clone());
    }

    /// `op` needs no record after all (it was not sent).
    pub fn forget(&self, op: &Op) {
        self.write(&Entry::Forget(op.id));
        self.answered(op.id);
    }

    fn answered(&self, id: u64) {
        let mut in_flight = lock(&self.in_flight);
        if in_flight.remove(&id).is_some() && in_flight.is_empty() {
            self.settled.notify_waiters();
        }
    }

    pub fn push(&self, op: Op) {
        let id = op.id;
        self.write(&Entry::Done(op.clone()));
        lock(&self.ops).push(op);
        self.answered(id);
    }

    /// Wait until no backend call is in flight (background releases, queue
    /// leaves, renewals after the workload), or until `deadline` (ns).
    pub async fn settle(&self, deadline: u64) {
        loop {
            let settled = self.settled.notified();
            if lock(&self.in_flight).is_empty() {
                return;
            }
            let left = deadline.saturating_sub(now_ns());
            if left == 0
                || tokio::time::timeout(Duration::from_nanos(left), settled)
                    .await
                    .is_err()
            {
                return;
            }
        }
    }

    /// Every operation so far, with the backend calls still in flight as
    /// cancelled (answered now, outcome unknown): a release that a process
    /// ending left on its way was still made, and whatever it did on the
    /// server the history must show it (else the lease it ended looks held
    /// to its TTL).
    pub fn take(&self) -> Vec<Op> {
        let mut ops = std::mem::take(&mut *lock(&self.ops));
        let now = now_ns();
        ops.extend(
            std::mem::take(&mut *lock(&self.in_flight))
                .into_values()
                .map(|mut op| {
                    op.ret = now;
                    op.outcome = Outcome::Cancelled;
                    op
                }),
        );
        ops
    }
}

/// The history of a client process killed at `killed` (ns), from its
/// journal: every call it finished, and the calls still in flight as
/// cancelled at the kill (what they did on the server is unknown).
pub fn read_journal(path: &std::path::Path, killed: u64) -> Vec<Op> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut ops = Vec::new();
    let mut in_flight = BTreeMap::new();
    // A line the kill cut short does not parse: the call it began counts
    // as never sent, the call it ended as still in flight.
    for entry in text.lines().filter_map(|l| serde_json::from_str(l).ok()) {
        match entry {
            Entry::Begin(op) => {
                in_flight.insert(op.id, op);
            }
            Entry::Done(op) => {
                in_flight.remove(&op.id);
                ops.push(op);
            }
            Entry::Forget(id) => {
                in_flight.remove(&id);
            }
        }
    }
    ops.extend(in_flight.into_values().map(|mut op| {
        op.ret = killed.max(op.inv);
        op.outcome = Outcome::Cancelled;
        op
    }));
    ops
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Everything a run recorded, for the checker.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct History {
    pub ops: Vec<Op>,
    pub faults: Vec<Fault>,
    /// The store's final state: key → (value, accepted writes).
    pub store: Vec<(String, u64, u64)>,
    /// When the workload ended and the run's end (liveness looked then).
    pub end: u64,
    /// Keys found held (or queued) by nobody alive after the run.
    pub stuck: Vec<String>,
    /// When each client process that ran to its end exited (process, ns):
    /// what it still held the server keeps until it runs out, as after a
    /// crash (see `Fault::crash`).
    pub exits: Vec<(u32, u64)>,
    /// The op timeout of the backend under test, in ms.
    pub op_timeout_ms: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_call_still_in_flight_is_recorded_as_cancelled() {
        // A release a process ending left on its way (a dropped lock's) was
        // made: the history must say so, or the lease looks held to its TTL.
        let log = Log::new(1);
        let done = log.start(Kind::Acquire, "k".into());
        log.begin(&done);
        log.push(done);
        let release = log.start(Kind::Release, "k".into());
        log.begin(&release);
        log.settle(now_ns() + 1_000_000).await;
        let ops = log.take();
        assert_eq!(ops.len(), 2);
        assert_eq!(
            (ops[1].kind, &ops[1].outcome),
            (Kind::Release, &Outcome::Cancelled)
        );
        assert!(ops[1].ret >= ops[1].inv);
    }

    #[test]
    fn a_killed_process_leaves_its_history_in_its_journal() {
        let path = std::env::temp_dir().join(format!("chaos-journal-{}", std::process::id()));
        let log = Log::journalled(1, &path);
        let mut done = log.start(Kind::Acquire, "k".into());
        log.begin(&done);
        done.outcome = Outcome::Ok;
        log.push(done);
        let waiting = log.start(Kind::Acquire, "k".into());
        log.begin(&waiting);
        let unsent = log.start(Kind::Release, "k".into());
        log.begin(&unsent);
        log.forget(&unsent);
        // Killed here: no `take`, no history file; and a line cut short.
        {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new()
                .append(true)
                .open(&path)
                .unwrap();
            f.write_all(b"{\"done\":{\"p\":1,").unwrap();
        }
        let ops = read_journal(&path, waiting.inv + 5);
        let _ = std::fs::remove_file(&path);
        let seen: Vec<(u64, &Outcome, u64)> =
            ops.iter().map(|o| (o.id, &o.outcome, o.ret)).collect();
        assert_eq!(seen.len(), 2, "{seen:?}");
        assert_eq!(seen[0].1, &Outcome::Ok);
        assert_eq!(
            (seen[1].0, seen[1].1, seen[1].2),
            (waiting.id, &Outcome::Cancelled, waiting.inv + 5)
        );
    }

    #[tokio::test]
    async fn settle_returns_when_the_last_call_answers() {
        let log = Log::new(1);
        let mut op = log.start(Kind::Release, "k".into());
        log.begin(&op);
        let pusher = {
            let log = log.clone();
            tokio::spawn(async move {
                op.outcome = Outcome::Ok;
                log.push(op);
            })
        };
        log.settle(now_ns() + 60_000_000_000).await;
        pusher.await.unwrap();
        assert_eq!(log.take()[0].outcome, Outcome::Ok);
    }
}
