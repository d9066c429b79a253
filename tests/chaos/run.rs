//! One schedule: start the clients (processes, or tasks for the in-memory
//! backend), inject the faults the seed drew, collect every history, look
//! at liveness, check.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tower_lock::backend::{AcquireRequest, Holder};
use tower_lock::{LockError, LockKey, LockKind, MemoryBackend, SharedBackend};

use super::check::{self, Bounds, Violation};
use super::client::{self, ClientConfig, KindsConfig, Mix};
use super::clock::{MS, now_ns};
use super::history::{Fault, History, Log, Op, read_journal};
use super::queued;
use super::recorder::Recorder;
use super::rigs::{self, FaultKind, Rig};
use super::rng::Rng;
use super::store::Store;

/// The environment variable that makes a test-binary run a client process.
pub const CHILD_ENV: &str = "TOWER_LOCK_CHAOS_CHILD";

/// Which store a client process uses.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum BackendSpec {
    Memory,
    Redis(String),
    Cluster(Vec<String>),
    Postgres(String),
    Etcd(Vec<String>),
}

/// What a client process is given.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Child {
    pub client: ClientConfig,
    pub backend: BackendSpec,
    pub op_timeout_ms: u64,
    pub history: PathBuf,
}

/// How a schedule runs.
#[derive(Debug, Clone)]
pub struct Settings {
    pub run_ms: u64,
    pub processes: u32,
    pub tasks: u32,
    pub faults: u32,
    /// Tasks per process on the kinds keys (besides `tasks`).
    pub kinds_tasks: u32,
    pub op_timeout_ms: u64,
    pub bounds: Bounds,
    /// Only these faults of the rig's menu (`CHAOS_FAULT_KINDS`, names as
    /// in [`FaultKind`], comma-separated); empty: the whole menu.
    pub fault_kinds: Vec<String>,
    /// See [`ClientConfig::walk_away`] (`CHAOS_WALK_AWAY`).
    pub walk_away: Option<u64>,
    /// Tasks per process taking turns on the relay key
    /// (`CHAOS_RELAY_TASKS`, 0: none).
    pub relay_tasks: u32,
}

impl Settings {
    pub fn short() -> Settings {
        Settings {
            run_ms: 2_500,
            processes: 2,
            tasks: 3,
            faults: 3,
            kinds_tasks: 2,
            op_timeout_ms: 400,
            bounds: Bounds::default(),
            fault_kinds: Vec::new(),
            walk_away: None,
            relay_tasks: 3,
        }
    }

    /// From the environment: CHAOS_RUN_MS, CHAOS_PROCESSES, CHAOS_TASKS,
    /// CHAOS_FAULTS, CHAOS_KINDS_TASKS (0: no kinds workload),
    /// CHAOS_WAKE_BOUND_MS, CHAOS_FAULT_KINDS, CHAOS_WALK_AWAY,
    /// CHAOS_RELAY_TASKS (0: no relay workload) (defaults:
    /// [`Settings::short`]).
    pub fn from_env() -> Settings {
        let mut s = Settings::short();
        let get = |name: &str, default: u64| {
            std::env::var(name)
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(default)
        };
        s.run_ms = get("CHAOS_RUN_MS", s.run_ms);
        s.processes = get("CHAOS_PROCESSES", s.processes.into()) as u32;
        s.tasks = get("CHAOS_TASKS", s.tasks.into()) as u32;
        s.faults = get("CHAOS_FAULTS", s.faults.into()) as u32;
        s.kinds_tasks = get("CHAOS_KINDS_TASKS", s.kinds_tasks.into()) as u32;
        s.relay_tasks = get("CHAOS_RELAY_TASKS", s.relay_tasks.into()) as u32;
        s.bounds.wake_ns = get("CHAOS_WAKE_BOUND_MS", s.bounds.wake_ns / MS) * MS;
        s.walk_away = std::env::var("CHAOS_WALK_AWAY")
            .ok()
            .and_then(|v| v.parse().ok());
        if let Ok(kinds) = std::env::var("CHAOS_FAULT_KINDS") {
            s.fault_kinds = kinds
                .split(',')
                .map(|k| k.trim().to_owned())
                .filter(|k| !k.is_empty())
                .collect();
        }
        s
    }
}

/// What one schedule found.
pub struct Report {
    pub seed: u64,
    pub ops: usize,
    pub faults: Vec<Fault>,
    pub violations: Vec<Violation>,
    /// Operations on the kinds keys.
    pub kinds_ops: usize,
    /// Why the kinds workload did not run, if it did not.
    pub kinds_skipped: Option<String>,
}

/// A backend for a client, recording into `log`.
pub fn backend(spec: &BackendSpec, op_timeout: Duration, log: Log) -> SharedBackend {
    match spec {
        BackendSpec::Memory => SharedBackend::new(Recorder {
            inner: MemoryBackend::new(),
            log,
        }),
        #[cfg(feature = "redis")]
        BackendSpec::Redis(url) => SharedBackend::new(Recorder {
            inner: tower_lock::RedisBackend::from_url(url)
                .expect("redis URL")
                .op_timeout(op_timeout),
            log,
        }),
        #[cfg(feature = "redis-cluster")]
        BackendSpec::Cluster(urls) => SharedBackend::new(Recorder {
            inner: tower_lock::RedisBackend::from_cluster_urls(urls.iter().map(String::as_str))
                .expect("cluster URLs")
                .op_timeout(op_timeout),
            log,
        }),
        #[cfg(feature = "postgres")]
        BackendSpec::Postgres(url) => SharedBackend::new(Recorder {
            inner: tower_lock::PostgresBackend::builder()
                .op_timeout(op_timeout)
                .build(url)
                .expect("postgres URL"),
            log,
        }),
        #[cfg(feature = "etcd")]
        BackendSpec::Etcd(endpoints) => SharedBackend::new(Recorder {
            inner: tower_lock::EtcdBackend::from_endpoints(endpoints)
                .expect("etcd endpoints")
                .op_timeout(op_timeout),
            log,
        }),
        #[allow(unreachable_patterns)]
        other => panic!("{other:?} needs a feature this build does not have"),
    }
}

/// The client process: run the workload of the config in the environment,
/// write its history, exit.
pub async fn child_main() {
    let Ok(json) = std::env::var(CHILD_ENV) else {
        return;
    };
    let child: Child = serde_json::from_str(&json).expect("child config");
    queued::install();
    let log = Log::journalled(child.client.process, &journal_of(&child.history));
    let backend = backend(
        &child.backend,
        Duration::from_millis(child.op_timeout_ms),
        log.clone(),
    );
    client::run(Arc::new(child.client), backend, log.clone()).await;
    // Releases of dropped locks, queue leaves, finish in background tasks:
    // wait for their answers (a call still out after that is recorded as
    // cancelled).
    log.settle(now_ns() + (2 * child.op_timeout_ms + 200) * MS)
        .await;
    let ops = log.take();
    // The process exits right after: its exit time, for what it still holds.
    let history = serde_json::to_vec(&(&ops, now_ns())).expect("JSON");
    std::fs::write(&child.history, history).expect("history");
    println!("CHAOS-CLIENT-DONE {}", ops.len());
}

/// Where a client process journals its calls as it goes (read instead of
/// its history when it was killed).
fn journal_of(history: &std::path::Path) -> PathBuf {
    history.with_extension("journal")
}

/// Kill one of the client processes still running (`pids`: process, pid),
/// never the last one: it leaves its locks and queue entries on the server.
fn crash(pids: &mut Vec<(u32, u32)>, rng: &mut Rng) -> Fault {
    let at = now_ns();
    if pids.len() < 2 {
        return rigs::fault("crash skipped (one client process left)".into(), at);
    }
    let (p, pid) = pids.remove(rng.range(0, pids.len() as u64 - 1) as usize);
    rigs::signal(pid, libc::SIGKILL);
    let mut f = rigs::fault(format!("sigkill p{p}"), at);
    f.process = Some(p);
    f.crash = true;
    f
}

/// The faults of schedule `seed`: (ms into the run, what).
pub fn faults_of(seed: u64, rig: &dyn Rig, s: &Settings) -> Vec<(u64, FaultKind)> {
    let menu: Vec<FaultKind> = rig
        .menu()
        .iter()
        .filter(|k| s.fault_kinds.is_empty() || s.fault_kinds.contains(&format!("{k:?}")))
        .copied()
        .collect();
    if menu.is_empty() {
        return Vec::new();
    }
    let mut rng = Rng::new(seed).fork(0xFA);
    let mut out: Vec<(u64, FaultKind)> = (0..s.faults)
        .map(|_| {
            (
                rng.range(s.run_ms / 10, s.run_ms * 8 / 10),
                *rng.pick(&menu),
            )
        })
        .collect();
    out.sort_by_key(|f| f.0);
    out
}

/// Run schedule `seed` on `rig`.
pub async fn schedule(rig: &mut dyn Rig, seed: u64, s: &Settings) -> Report {
    let store = Store::start().await;
    let mix = Mix::default();
    let kinds_skipped = if s.kinds_tasks == 0 {
        Some("CHAOS_KINDS_TASKS=0".to_owned())
    } else {
        kinds_unsupported(rig, seed, s).await
    };
    let kinds = kinds_skipped.is_none().then(|| KindsConfig {
        rw: format!("s{seed}-rw"),
        permits: format!("s{seed}-p"),
        n: 2 + (seed % 2) as u32,
    });
    let cfg = |process: u32, tasks: u32, kinds_tasks: u32, relay_tasks: u32| ClientConfig {
        seed,
        process,
        tasks,
        run_ms: s.run_ms,
        store_port: store.port,
        keys: (0..3).map(|i| format!("s{seed}-k{i}")).collect(),
        flights: (0..2).map(|i| format!("s{seed}-f{i}")).collect(),
        owners: vec![format!("shared-{seed}-a"), format!("shared-{seed}-b")],
        mix: mix.clone(),
        kinds: kinds.clone(),
        kinds_tasks: if kinds.is_some() { kinds_tasks } else { 0 },
        walk_away: s.walk_away,
        // A key per process: another process's calls on it would hand an
        // expired lock on, and hide the waiter that slept through it.
        relay: (s.relay_tasks > 0).then(|| format!("s{seed}-relay-p{process}")),
        relay_tasks,
        relay_shared: (s.relay_tasks > 0).then(|| format!("s{seed}-relay")),
    };
    let dir = std::env::temp_dir().join(format!("tower-lock-chaos-{}-{seed}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("history dir");
    let spec = rig.client_backend();
    let start = now_ns();
    let mut ops: Vec<Op> = Vec::new();
    let mut exits = Vec::new();
    let mut violations = Vec::new();
    let faults: Arc<Mutex<Vec<Fault>>> = Arc::default();

    let plan = faults_of(seed, rig, s);
    match spec {
        BackendSpec::Memory => {
            queued::install();
            let log = Log::new(0);
            let backend = SharedBackend::new(Recorder {
                inner: rig.memory().expect("the memory rig's backend"),
                log: log.clone(),
            });
            client::run(
                Arc::new(cfg(
                    0,
                    s.processes * s.tasks,
                    s.processes * s.kinds_tasks,
                    s.processes * s.relay_tasks,
                )),
                backend,
                log.clone(),
            )
            .await;
            log.settle(now_ns() + (2 * s.op_timeout_ms + 200) * MS)
                .await;
            ops = log.take();
        }
        _ => {
            let mut children = Vec::new();
            for p in 0..s.processes {
                let history = dir.join(format!("p{p}.json"));
                let child = Child {
                    client: cfg(p + 1, s.tasks, s.kinds_tasks, s.relay_tasks),
                    backend: spec.clone(),
                    op_timeout_ms: s.op_timeout_ms,
                    history: history.clone(),
                };
                let process = tokio::process::Command::new(std::env::current_exe().unwrap())
                    .args(["chaos_client", "--exact", "--nocapture", "--test-threads=1"])
                    .env(CHILD_ENV, serde_json::to_string(&child).unwrap())
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .kill_on_drop(true)
                    .spawn()
                    .expect("spawn a client process");
                children.push((p + 1, process, history));
            }
            let mut pids: Vec<(u32, u32)> = children
                .iter()
                .map(|(p, c, _)| (*p, c.id().expect("pid")))
                .collect();
            // The nemesis, on the schedule.
            for (at_ms, kind) in plan {
                let at = start + at_ms * MS;
                let now = now_ns();
                if at > now {
                    tokio::time::sleep(Duration::from_nanos(at - now)).await;
                }
                let mut rng = Rng::new(seed).fork(at_ms);
                let fault = if kind == FaultKind::Crash {
                    crash(&mut pids, &mut rng)
                } else {
                    rig.inject(kind, &pids, &mut rng).await
                };
                faults.lock().unwrap().push(fault);
            }
            let killed: Vec<(u32, u64)> = faults
                .lock()
                .unwrap()
                .iter()
                .filter(|f| f.crash)
                .filter_map(|f| Some((f.process?, f.at)))
                .collect();
            for (p, mut child, history) in children {
                let waited =
                    tokio::time::timeout(Duration::from_millis(s.run_ms + 45_000), child.wait())
                        .await;
                if let Some(&(_, at)) = killed.iter().find(|k| k.0 == p) {
                    ops.append(&mut read_journal(&journal_of(&history), at));
                    continue;
                }
                match waited {
                    Ok(Ok(status)) if status.success() => {
                        let bytes = std::fs::read(&history).unwrap_or_default();
                        let (mut read, exit): (Vec<Op>, u64) =
                            serde_json::from_slice(&bytes).unwrap_or_default();
                        ops.append(&mut read);
                        exits.push((p, exit));
                    }
                    Ok(_) => {
                        let out = child.wait_with_output().await;
                        let err = out
                            .map(|o| String::from_utf8_lossy(&o.stderr).into_owned())
                            .unwrap_or_default();
                        violations.push(Violation {
                            kind: "client-failed",
                            detail: format!("client process p{p} failed: {}", tail(&err)),
                        });
                    }
                    Err(_) => {
                        let _ = child.kill().await;
                        violations.push(Violation {
                            kind: "hang",
                            detail: format!("client process p{p} did not finish"),
                        });
                    }
                }
            }
        }
    }
    let workload_end = now_ns();
    let keys_only = cfg(0, 0, 0, 0);
    let relay_keys: Vec<String> = (0..=s.processes)
        .filter_map(|p| cfg(p, 0, 0, 0).relay)
        .chain(keys_only.relay_shared.clone())
        .collect();
    let stuck = liveness(rig, &keys_only, &relay_keys, s).await;
    let _ = std::fs::remove_dir_all(&dir);
    let history = History {
        ops,
        faults: faults.lock().unwrap().clone(),
        store: store.snapshot(),
        end: workload_end,
        stuck,
        exits,
        op_timeout_ms: s.op_timeout_ms,
    };
    let mut bounds = s.bounds;
    bounds.stopped_holder_ns = rig.stopped_holder_ms() * MS;
    bounds.together_ns = rig.together_ms() * MS;
    violations.extend(check::check(&history, bounds));
    let dump_all = std::env::var("CHAOS_DUMP_ALL").is_ok_and(|v| v == "1");
    if let Ok(path) = std::env::var("CHAOS_DUMP")
        && (dump_all || !violations.is_empty())
    {
        super::dump::write(&path, seed, &history, &violations);
    }
    let kinds_keys: Vec<String> = kinds
        .iter()
        .flat_map(|k| [&k.rw, &k.permits])
        .map(|k| LockKey::global(k).expect("key").encoded(usize::MAX))
        .collect();
    Report {
        seed,
        ops: history.ops.len(),
        kinds_ops: history
            .ops
            .iter()
            .filter(|o| kinds_keys.contains(&o.key))
            .count(),
        faults: history.faults,
        violations,
        kinds_skipped,
    }
}

/// Whether the backend refuses the kinds (`LockError::Unsupported`): asked
/// once per schedule with a shared hold and a permit on a key of its own.
/// `Some(why)`: the kinds workload does not run.
async fn kinds_unsupported(rig: &mut dyn Rig, seed: u64, s: &Settings) -> Option<String> {
    let backend = rig.checker_backend(Duration::from_millis(s.op_timeout_ms * 5));
    for kind in [LockKind::Shared, LockKind::Permits(2)] {
        let key = LockKey::global(format!("s{seed}-kinds-probe")).expect("key");
        let owner = format!("kinds-probe-{seed}");
        let req = AcquireRequest::new(key, owner.as_str(), Duration::from_secs(2), Duration::ZERO)
            .and_then(|r| r.with_kind(kind))
            .expect("probe request");
        match backend.acquire(&req).await {
            Ok(lease) => {
                let holder = Holder::new(&owner, lease.fence);
                let _ = backend.release(req.key(), holder).await;
            }
            Err(LockError::Unsupported(why)) => return Some(format!("{kind}: {why}")),
            // Anything else is the kinds workload's to meet.
            Err(_) => {}
        }
    }
    None
}

fn tail(s: &str) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

/// After the run: every key must come free within the longest TTL and
/// wait of the workload (released, or run out); the keys that did not.
async fn liveness(
    rig: &mut dyn Rig,
    cfg: &ClientConfig,
    relay_keys: &[String],
    s: &Settings,
) -> Vec<String> {
    // The longest TTL is 600 ms, the longest wait 1.5 s (a waiter that
    // died with a stopped process keeps its queue entry that long), a
    // release may still be on its way: within that, every key comes free.
    // (Plus, on etcd, the lease of a client process that exited holding:
    // its locks go when that runs out.)
    let deadline = now_ns() + (2_500 + rig.stopped_holder_ms()) * MS;
    // The relay key's holds last longer, and its waiters wait longer.
    let relay_deadline = deadline + (client::relay_work::LONGEST_TTL_MS + 1_000) * MS;
    let backend = rig.checker_backend(Duration::from_millis(s.op_timeout_ms * 5));
    let mut stuck = Vec::new();
    let kinds = cfg.kinds.iter().flat_map(|k| [&k.rw, &k.permits]);
    let keys = cfg.keys.iter().chain(kinds).map(|k| (k, deadline));
    for (name, deadline) in keys.chain(relay_keys.iter().map(|k| (k, relay_deadline))) {
        let key = LockKey::global(name).expect("key");
        loop {
            let last = match backend.status(&key).await {
                Ok(None) => break,
                Ok(Some(status)) => format!(
                    "{} (held, fence {}, {:?} left, {} waiters)",
                    key.encoded(usize::MAX),
                    status.fence,
                    status.ttl_remaining,
                    status.waiters
                ),
                Err(e) => format!("{} (status failed: {e})", key.encoded(usize::MAX)),
            };
            if now_ns() > deadline {
                stuck.push(last);
                break;
            }
            // Polled: a lock that runs out says nothing when it does.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    stuck
}
