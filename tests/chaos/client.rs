//! A client process's workload: tasks doing random lock operations on a few
//! hot keys, with a fenced read-modify-write of the store under every lock
//! they hold. Every choice follows from the run's seed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use http::Request;
use http_body_util::BodyExt;
use serde::{Deserialize, Serialize};
use tower::ServiceExt;
use tower_lock::backend::Holder;
use tower_lock::flight::SingleFlight;
use tower_lock::{
    JobSpec, LockError, LockKey, LockKind, LockLayer, LockSpec, LockToken, Locks, OwnedLock,
    SharedBackend,
};

use super::clock::{MS, now_ns};
use super::history::{Kind, Log, Outcome};
use super::rng::Rng;
use super::store::{Answer, StoreClient};

#[path = "kinds_work.rs"]
mod kinds_work;
#[path = "relay_work.rs"]
pub mod relay_work;

/// What a client process is told (as JSON in its environment).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClientConfig {
    pub seed: u64,
    pub process: u32,
    pub tasks: u32,
    /// How long to start new operations, in ms.
    pub run_ms: u64,
    pub store_port: u16,
    /// The hot keys (global lock keys).
    pub keys: Vec<String>,
    /// Single-flight names.
    pub flights: Vec<String>,
    /// Custom owner tokens shared by every client.
    pub owners: Vec<String>,
    /// Which operations may run (see [`Mix`]).
    pub mix: Mix,
    /// The keys of shared holds and permits, and how many tasks use them
    /// (besides `tasks`, which keep to the exclusive keys); `None`: the
    /// backend holds exclusive locks only.
    #[serde(default)]
    pub kinds: Option<KindsConfig>,
    #[serde(default)]
    pub kinds_tasks: u32,
    /// Percent of exclusive holds that walk away besides the usual 5 %
    /// (`CHAOS_WALK_AWAY`, for aimed runs); `None`: the usual mix, its draws
    /// unchanged.
    #[serde(default)]
    pub walk_away: Option<u64>,
    /// The relay key and how many tasks take turns on it together (see
    /// `relay_work.rs`; besides the others, on streams of their own).
    #[serde(default)]
    pub relay: Option<String>,
    #[serde(default)]
    pub relay_tasks: u32,
    /// The relay key every process shares (a third of the rounds).
    #[serde(default)]
    pub relay_shared: Option<String>,
}

/// The keys the kinds workload uses (see `kinds.rs`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KindsConfig {
    /// Reader/writer key: shared and exclusive holds.
    pub rw: String,
    /// Permits key: `Permits(n)`.
    pub permits: String,
    pub n: u32,
}

/// The weights of the operations (percent of the draws).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Mix {
    pub lock: u64,
    pub handoff: u64,
    pub restore: u64,
    pub multi: u64,
    pub force: u64,
    pub flight: u64,
}

impl Default for Mix {
    fn default() -> Self {
        Mix {
            lock: 52,
            handoff: 10,
            restore: 12,
            multi: 12,
            force: 3,
            flight: 11,
        }
    }
}

/// Run `cfg.tasks` tasks against `backend` until `cfg.run_ms` has passed;
/// every backend call goes to `log` (the backend is a `Recorder`), and so
/// does every store call.
pub async fn run(cfg: Arc<ClientConfig>, backend: SharedBackend, log: Log) {
    let end = now_ns() + cfg.run_ms * MS;
    let root = Rng::new(cfg.seed).fork(u64::from(cfg.process) + 1);
    let mut tasks = Vec::new();
    for t in 0..cfg.tasks {
        let (cfg, backend, log) = (cfg.clone(), backend.clone(), log.clone());
        let rng = root.fork(u64::from(t) + 1);
        tasks.push(tokio::spawn(async move {
            let mut task = Task::new(cfg, backend, log, rng).await;
            while now_ns() < end {
                task.step().await;
            }
        }));
    }
    // The kinds tasks draw from streams of their own: the exclusive tasks'
    // draws (and so their figures) stay what they were.
    for t in 0..cfg.kinds_tasks {
        let (cfg, backend, log) = (cfg.clone(), backend.clone(), log.clone());
        let rng = root.fork(0x4B1D_0000 + u64::from(t));
        tasks.push(tokio::spawn(async move {
            let mut task = Task::new(cfg, backend, log, rng).await;
            while now_ns() < end && !task.unsupported {
                task.kinds_step().await;
            }
        }));
    }
    if cfg.relay_tasks > 0 {
        let (cfg, backend, log) = (cfg.clone(), backend.clone(), log.clone());
        let root = root.fork(0x5E1A_0000);
        tasks.push(tokio::spawn(async move {
            let mut relay = Vec::new();
            for t in 0..cfg.relay_tasks {
                let rng = root.fork(u64::from(t) + 1);
                relay.push(Task::new(cfg.clone(), backend.clone(), log.clone(), rng).await);
            }
            relay_work::relay(relay, root, end).await;
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
}

struct Task {
    cfg: Arc<ClientConfig>,
    backend: SharedBackend,
    log: Log,
    rng: Rng,
    store: StoreClient,
    router: Router,
    flights: SingleFlight,
    /// A kinds call answered `Unsupported`: the kinds task stops.
    unsupported: bool,
}

/// State the layer's handler needs.
#[derive(Clone)]
struct Shared {
    log: Log,
    store_port: u16,
    pause_ms: Arc<std::sync::atomic::AtomicU64>,
}

impl Task {
    async fn new(cfg: Arc<ClientConfig>, backend: SharedBackend, log: Log, rng: Rng) -> Task {
        let store = StoreClient::connect(cfg.store_port).await;
        let shared = Shared {
            log: log.clone(),
            store_port: cfg.store_port,
            pause_ms: Arc::default(),
        };
        let router = multi_router(&backend, shared);
        let flights = SingleFlight::new(backend.clone())
            .max_wait(Duration::from_millis(800))
            .lock_ttl(Duration::from_millis(400));
        Task {
            cfg,
            backend,
            log,
            rng,
            store,
            router,
            flights,
            unsupported: false,
        }
    }

    fn ttl(&mut self) -> Duration {
        Duration::from_millis(self.rng.range(150, 600))
    }

    fn spec(&mut self) -> JobSpec {
        let key = self.rng.pick(&self.cfg.keys).clone();
        let mut spec = JobSpec::new(key, self.ttl());
        if self.rng.chance(50) {
            spec = spec.max_wait(Duration::from_millis(self.rng.range(50, 1_500)));
        }
        // A job's own name as its owner (a "nightly-job" on each key), shared
        // by every client that runs it: the case where only the fence tells
        // two acquisitions apart.
        if self.rng.chance(30) {
            let job = format!("job-{}", spec.as_lock_spec().get_key());
            spec = spec.owner(job);
        } else if self.rng.chance(10) {
            spec = spec.owner(self.rng.pick(&self.cfg.owners).clone());
        }
        if self.rng.chance(15) {
            spec = spec.watchdog(true);
        }
        spec
    }

    async fn step(&mut self) {
        let m = &self.cfg.mix;
        let draw = self.rng.range(
            0,
            m.lock + m.handoff + m.restore + m.multi + m.force + m.flight - 1,
        );
        let mut at = m.lock;
        if draw < at {
            return self.lock().await;
        }
        at += m.handoff;
        if draw < at {
            return self.handoff().await;
        }
        at += m.restore;
        if draw < at {
            return self.restore().await;
        }
        at += m.multi;
        if draw < at {
            return self.multi().await;
        }
        at += m.force;
        if draw < at {
            return self.force().await;
        }
        self.flight().await
    }

    /// Acquire (maybe cancelled mid-call), work under the lock, then
    /// release, drop, extend and release, or walk away.
    async fn lock(&mut self) {
        let spec = self.spec();
        self.hold(spec).await
    }

    /// Acquire `spec` (maybe cancelled mid-call), work under the lock, then
    /// release, drop, extend and release, or walk away.
    async fn hold(&mut self, spec: JobSpec) {
        let acquire = OwnedLock::acquire(self.backend.clone(), &spec);
        let lock = if self.rng.chance(10) {
            // Cancelled at a random point of the call.
            let cut = Duration::from_micros(self.rng.range(0, 5_000));
            match tokio::time::timeout(cut, acquire).await {
                Ok(r) => r,
                Err(_) => return,
            }
        } else {
            acquire.await
        };
        let mut lock = match lock {
            Ok(lock) => lock,
            Err(e) => {
                self.unsupported |= matches!(e, LockError::Unsupported(_));
                self.idle().await;
                return;
            }
        };
        let watched = spec.as_lock_spec().get_watchdog() == Some(true);
        let hold = if watched {
            // Across several TTLs: the watchdog must keep it.
            spec.as_lock_spec().get_ttl() * self.rng.range(1, 3) as u32
        } else {
            Duration::from_millis(self.rng.range(0, 20))
        };
        let stalled = self.critical(&lock, hold).await;
        // A holder that stalled past its TTL carries on as if it still held
        // the lock half the time: it extends, works and releases.
        let mut end = if stalled && self.rng.chance(50) {
            95
        } else {
            self.rng.range(0, 99)
        };
        if let Some(p) = self.cfg.walk_away
            && self.rng.chance(p)
        {
            end = 85;
        }
        match end {
            0..=69 => {
                let release = lock.release();
                if self.rng.chance(10) {
                    let cut = Duration::from_micros(self.rng.range(0, 3_000));
                    let _ = tokio::time::timeout(cut, release).await;
                } else {
                    let _ = release.await;
                }
            }
            70..=84 => drop(lock),
            85..=89 => {
                // Walk away: the TTL frees it.
                let _ = lock.keep();
            }
            _ => {
                let ttl = self.ttl();
                // Half the time by its owner token alone (`Holder::owner_only`),
                // as a job that kept only its owner would, when that token
                // names this acquisition alone (not a custom owner shared
                // with others): it extends this hold or nothing. Not beside
                // its own watchdog: a call past the handle's gate can cross a
                // renewal in flight, and the handle would believe the one
                // that answered last, not the one the server applied last
                // (PostgreSQL short pass, CI: held after its lease).
                let by_owner =
                    spec.as_lock_spec().get_owner().is_none() && !watched && self.rng.chance(50);
                let extended = if by_owner {
                    let info = lock.info();
                    let holder = Holder::owner_only(info.owner());
                    let sent = Instant::now();
                    let extend = self.backend.extend(info.lock_key(), holder, ttl);
                    // The handle does not see this call: the job counts the
                    // new TTL from when it asked, as the handle's own
                    // extend does, and works only within it (an answer
                    // that came after it, behind a row held for longer,
                    // leaves nothing it can be sure of).
                    extend.await.is_ok() && sent.elapsed() < ttl
                } else {
                    lock.extend(ttl).await.is_ok()
                };
                if extended {
                    self.critical(&lock, Duration::from_millis(5)).await;
                }
                let _ = lock.release().await;
            }
        }
    }

    /// Take a lock and hand it to whichever process pops the token.
    async fn handoff(&mut self) {
        let spec = self.spec();
        self.hand_off(spec).await
    }

    /// Take `spec`'s lock at once and hand it on as a token.
    async fn hand_off(&mut self, spec: JobSpec) {
        let spec = spec.watchdog(false).max_wait(Duration::ZERO);
        let Ok(lock) = OwnedLock::acquire(self.backend.clone(), &spec).await else {
            return self.idle().await;
        };
        self.critical(&lock, Duration::from_millis(2)).await;
        let mut op = self
            .log
            .start(Kind::Handoff, lock.info().lock_key().encoded(usize::MAX));
        op.fence_in = Some(lock.fence());
        op.owner = Some(lock.info().owner().to_owned());
        op.ret = op.inv;
        op.outcome = Outcome::Ok;
        self.log.push(op);
        let token = serde_json::to_string(&lock.into_token()).expect("token JSON");
        let _ = self.store.push(&token).await;
    }

    /// Restore a handed-off token (maybe a second time: queues deliver at
    /// least once), work, release.
    async fn restore(&mut self) {
        let Answer::Token(token) = self.store.pop().await else {
            return self.idle().await;
        };
        let Ok(parsed) = serde_json::from_str::<LockToken>(&token) else {
            return;
        };
        // Delivered again now and then.
        if self.rng.chance(15) {
            let _ = self.store.push(&token).await;
        }
        let Ok(lock) = OwnedLock::restore(self.backend.clone(), &parsed).await else {
            return;
        };
        let hold = Duration::from_millis(self.rng.range(0, 15));
        self.critical(&lock, hold).await;
        let _ = lock.release().await;
    }

    /// A request through a `LockLayer` that locks two keys.
    async fn multi(&mut self) {
        let a = self.rng.range(0, self.cfg.keys.len() as u64 - 1) as usize;
        let b = (a + 1 + self.rng.range(0, self.cfg.keys.len() as u64 - 2) as usize)
            % self.cfg.keys.len();
        let ttl = self.ttl().as_millis();
        let wait = if self.rng.chance(50) {
            self.rng.range(50, 800)
        } else {
            0
        };
        let uri = format!(
            "/m?a={}&b={}&ttl={ttl}&wait={wait}",
            self.cfg.keys[a], self.cfg.keys[b]
        );
        let req = Request::post(uri).body(Body::empty()).expect("request");
        let call = async {
            let Ok(res) = self.router.clone().oneshot(req).await;
            let _ = res.into_body().collect().await;
        };
        if self.rng.chance(10) {
            let cut = Duration::from_micros(self.rng.range(0, 8_000));
            let _ = tokio::time::timeout(cut, call).await;
        } else {
            call.await;
        }
    }

    /// An operator's force release.
    async fn force(&mut self) {
        let key = self.rng.pick(&self.cfg.keys).clone();
        self.force_key(&key).await
    }

    async fn force_key(&mut self, key: &str) {
        let key = LockKey::global(key).expect("key");
        let _ = self.backend.force_release(&key).await;
        self.idle().await;
    }

    /// A single-flight run.
    async fn flight(&mut self) {
        let name = self.rng.pick(&self.cfg.flights).clone();
        let work = Duration::from_millis(self.rng.range(1, 30));
        let _ = self
            .flights
            .run(&name, Duration::ZERO, || async move {
                tokio::time::sleep(work).await;
                Ok::<u64, ()>(1)
            })
            .await;
    }

    async fn idle(&mut self) {
        tokio::time::sleep(Duration::from_millis(self.rng.range(0, 5))).await;
    }

    /// Fenced read-modify-write of the lock's store key, holding `hold`
    /// between read and write; now and then a pause longer than the TTL (a
    /// task stuck in its critical section): whether it was.
    async fn critical(&mut self, lock: &OwnedLock, hold: Duration) -> bool {
        let stalled = self.rng.chance(5);
        let pause = if stalled {
            lock.info().ttl() * 3 / 2
        } else {
            hold
        };
        let checks = !self.rng.chance(20);
        if lock.info().kind() != LockKind::Exclusive {
            // Shared holds and permits work side by side: a read-modify-write
            // of one store key would lose their updates by design. The
            // checker sees their overlaps in the history itself.
            tokio::time::sleep(pause).await;
            return stalled;
        }
        let key = lock.info().lock_key().encoded(usize::MAX);
        critical(
            &self.log,
            &mut self.store,
            &key,
            (lock.info().owner(), lock.fence()),
            pause,
            None,
            || {
                if checks {
                    (!lock.is_lost()).then(|| Some(now_ns()))
                } else {
                    Some(None)
                }
            },
        )
        .await;
        stalled
    }
}

/// Read the store under `(owner, fence)`, wait `pause`, write value + 1; before each
/// call `still` says whether to go on (`None`: the lock is lost) and when
/// the lock was last confirmed held (`Some(None)`: not asked). `entered`:
/// the layer confirmed it then (the handler runs), for the first call.
async fn critical(
    log: &Log,
    store: &mut StoreClient,
    key: &str,
    (owner, fence): (&str, u64),
    pause: Duration,
    entered: Option<u64>,
    still: impl Fn() -> Option<Option<u64>>,
) {
    let checked = match entered {
        Some(at) => Some(at),
        None => match still() {
            None => return,
            Some(at) => at,
        },
    };
    let mut op = log.start(Kind::Read, key.to_owned());
    op.fence_in = Some(fence);
    op.owner = Some(owner.to_owned());
    op.checked = checked;
    let answer = store.read(key, fence).await;
    op.ret = now_ns();
    let value = match answer {
        Answer::Ok(v) => {
            op.outcome = Outcome::Ok;
            op.value = v;
            log.push(op);
            v
        }
        Answer::Stale => {
            op.outcome = Outcome::Stale;
            log.push(op);
            return;
        }
        _ => {
            op.outcome = Outcome::Other("store".into());
            log.push(op);
            return;
        }
    };
    if !pause.is_zero() {
        tokio::time::sleep(pause).await;
    }
    let Some(checked) = still() else {
        return;
    };
    let mut op = log.start(Kind::Write, key.to_owned());
    op.fence_in = Some(fence);
    op.owner = Some(owner.to_owned());
    op.checked = checked;
    op.value = value + 1;
    let answer = store.write(key, fence, value + 1).await;
    op.ret = now_ns();
    op.outcome = match answer {
        Answer::Ok(_) => Outcome::Ok,
        Answer::Stale => Outcome::Stale,
        _ => Outcome::Other("store".into()),
    };
    log.push(op);
}

/// `POST /m?a=..&b=..&ttl=..&wait=..`: both keys locked by the layer; the
/// handler works under each.
fn multi_router(backend: &SharedBackend, shared: Shared) -> Router {
    let layer = LockLayer::new(backend.clone(), |req: &Request<Body>| {
        let q = req.uri().query().unwrap_or("");
        let get = |name: &str| {
            q.split('&')
                .find_map(|kv| kv.strip_prefix(name).and_then(|v| v.strip_prefix('=')))
                .unwrap_or("")
                .to_owned()
        };
        let ttl = Duration::from_millis(get("ttl").parse().unwrap_or(300));
        let wait = Duration::from_millis(get("wait").parse().unwrap_or(0));
        [get("a"), get("b")].map(|k| LockSpec::global(k, ttl).max_wait(wait))
    });
    let handler = move |locks: Locks| {
        let shared = shared.clone();
        // The layer runs the handler only while every lock is held.
        let entered = now_ns();
        async move {
            let mut store = StoreClient::connect(shared.store_port).await;
            let pause = shared.pause_ms.load(std::sync::atomic::Ordering::Relaxed);
            for lock in locks.held() {
                let key = lock.lock_key().encoded(usize::MAX);
                let held = lock.clone();
                critical(
                    &shared.log,
                    &mut store,
                    &key,
                    (lock.owner(), lock.fence()),
                    Duration::from_millis(pause + 2),
                    Some(entered),
                    move || (!held.is_lost()).then(|| Some(now_ns())),
                )
                .await;
            }
            "ok"
        }
    };
    Router::new().route("/m", post(handler).layer(layer))
}

/// A lock key as the store names it.
#[allow(dead_code)]
pub fn store_key(key: &str) -> Result<String, LockError> {
    Ok(LockKey::global(key)?.encoded(usize::MAX))
}
