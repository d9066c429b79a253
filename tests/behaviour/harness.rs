//! The backend harness: one shared backend plus what a test needs to know
//! about its clock.

use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Waker};
use std::time::Duration;

use tower_lock::backend::{AcquireRequest, Lease};
use tower_lock::{LockError, LockKey, MemoryBackend, SharedBackend};

/// Which store a harness runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// In-process: releases finish inside the call, time can be virtual.
    Memory,
    /// A real server: releases from `Drop` run in a task, time is real.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    Redis,
    /// A real PostgreSQL server: as `Redis`.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    Postgres,
    /// A real etcd cluster: as `Redis`.
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))]
    Etcd,
}

/// A backend under test.
pub struct Harness {
    /// The backend every test talks to.
    pub backend: SharedBackend,
    kind: BackendKind,
    paused: bool,
    /// Another handle on the same store, as a second process would have.
    another: Arc<dyn Fn() -> SharedBackend + Send + Sync>,
    /// A handle on the same store that can look locks up by owner (Redis:
    /// with its opt-in owner index on).
    indexed: Option<Arc<dyn Fn() -> SharedBackend + Send + Sync>>,
    /// Whatever must live as long as the backend (the server process).
    _keep: Option<Box<dyn Any + Send>>,
}

impl Harness {
    pub fn new(
        backend: SharedBackend,
        kind: BackendKind,
        another: Arc<dyn Fn() -> SharedBackend + Send + Sync>,
        keep: Option<Box<dyn Any + Send>>,
    ) -> Self {
        Harness {
            backend,
            kind,
            paused: false,
            another,
            indexed: None,
            _keep: keep,
        }
    }

    /// The same harness whose `indexed()` handles come from `make`.
    pub fn with_indexed(mut self, make: Arc<dyn Fn() -> SharedBackend + Send + Sync>) -> Self {
        self.indexed = Some(make);
        self
    }

    /// A handle on the same store that answers lookups by owner; its locks
    /// are indexed by owner (the main handle's may not be).
    pub fn indexed(&self) -> SharedBackend {
        match &self.indexed {
            Some(make) => make(),
            None => self.backend.clone(),
        }
    }

    /// Another handle on the same store, as a second process would have.
    pub fn another(&self) -> SharedBackend {
        (self.another)()
    }

    /// Whether the clock is tokio's paused clock (durations are exact). Only
    /// for tests in the `virtual_time` list of `for_each_backend!`; a real
    /// server's clock cannot be paused, so there TTLs are short and real.
    pub fn is_paused(&self) -> bool {
        self.paused
    }

    /// The time unit of TTL tests: 1 s of virtual time, or 150 ms real.
    pub fn unit(&self) -> Duration {
        if self.paused {
            Duration::from_secs(1)
        } else {
            Duration::from_millis(150)
        }
    }

    /// `n` units.
    pub fn units(&self, n: u32) -> Duration {
        self.unit() * n
    }

    /// Let `d` pass: advance the paused clock, or wait for the server's
    /// clock (that real wait is the point: a server-side TTL has to run out).
    pub async fn advance(&self, d: Duration) {
        if self.paused {
            tokio::time::advance(d).await;
        } else {
            tokio::time::sleep(d).await;
        }
    }

    /// Whether a release started from `Drop` has finished when `drop` returns
    /// (memory); otherwise it runs in a spawned task (remote backends).
    pub fn releases_inline(&self) -> bool {
        self.kind == BackendKind::Memory
    }

    /// Let other tasks (and, for a real server, the network) make progress
    /// before a condition is looked at again. Never moves a paused clock.
    pub async fn tick(&self) {
        if self.kind == BackendKind::Memory {
            tokio::task::yield_now().await;
        } else {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Wait until at least `n` acquirers are queued on `key` (state, read
    /// through `LockStatus::waiters`).
    pub async fn until_queued(&self, key: &LockKey, n: usize) {
        self.until_waiters(key, |w| w >= n, &format!("{n} waiters never queued"))
            .await;
    }

    /// Wait until exactly `n` acquirers are queued on `key` (a cancelled
    /// waiter's leave goes out from a task of its own).
    pub async fn until_queue_is(&self, key: &LockKey, n: usize) {
        self.until_waiters(key, |w| w == n, &format!("the queue never became {n} long"))
            .await;
    }

    async fn until_waiters(&self, key: &LockKey, done: impl Fn(usize) -> bool, never: &str) {
        for _ in 0..20_000 {
            let queued = self.backend.status(key).await.expect("status");
            if queued.is_some_and(|s| done(s.waiters)) {
                return;
            }
            self.tick().await;
        }
        panic!("{never}");
    }

    /// Wait until `key` is free (state, read through `status`): for a lock
    /// whose release runs after the answer that gave it up (a waiter's
    /// leave goes out from a task of its own).
    pub async fn until_free(&self, key: &LockKey) {
        for _ in 0..20_000 {
            if self.backend.status(key).await.expect("status").is_none() {
                return;
            }
            self.tick().await;
        }
        panic!("{key:?} was never given back");
    }

    /// An acquirer that joins `req`'s queue and is then frozen, as a
    /// stopped process: queued and alive (its wait has not ended) but never
    /// acting on its own. [`Frozen::thaw`] lets it go on.
    pub async fn frozen_waiter(&self, req: AcquireRequest) -> Frozen {
        let key = req.key().clone();
        let frozen = if self.kind == BackendKind::Memory {
            // Polled once (it joins the queue), then not again.
            let backend = self.backend.clone();
            let mut fut: Pin<Box<dyn Future<Output = _> + Send>> =
                Box::pin(async move { backend.acquire(&req).await });
            let mut cx = Context::from_waker(Waker::noop());
            assert!(fut.as_mut().poll(&mut cx).is_pending(), "the lock is busy");
            Frozen::Unpolled(fut)
        } else {
            // Its own thread and runtime, blocked once it is queued.
            let backend = (self.another)();
            let (freeze_tx, freeze_rx) = tokio::sync::oneshot::channel::<()>();
            let (thaw_tx, thaw_rx) = std::sync::mpsc::channel::<()>();
            let (done_tx, done_rx) = tokio::sync::oneshot::channel();
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("runtime");
                rt.block_on(async move {
                    let waiter = tokio::spawn(async move { backend.acquire(&req).await });
                    let _ = freeze_rx.await;
                    // Blocks the thread, so the waiter's task cannot run.
                    let _ = thaw_rx.recv();
                    let _ = done_tx.send(waiter.await.expect("waiter task"));
                });
            });
            Frozen::Thread {
                freeze: Some(freeze_tx),
                thaw: thaw_tx,
                done: done_rx,
            }
        };
        self.until_queued(&key, 1).await;
        match frozen {
            Frozen::Thread {
                mut freeze,
                thaw,
                done,
            } => {
                let _ = freeze.take().expect("not frozen yet").send(());
                Frozen::Thread { freeze, thaw, done }
            }
            unpolled => unpolled,
        }
    }
}

/// See [`Harness::frozen_waiter`].
pub enum Frozen {
    Unpolled(Pin<Box<dyn Future<Output = Result<Lease, LockError>> + Send>>),
    Thread {
        freeze: Option<tokio::sync::oneshot::Sender<()>>,
        thaw: std::sync::mpsc::Sender<()>,
        done: tokio::sync::oneshot::Receiver<Result<Lease, LockError>>,
    },
}

impl Frozen {
    /// Let the waiter go on; what its acquisition ends with.
    pub async fn thaw(self) -> Result<Lease, LockError> {
        match self {
            Frozen::Unpolled(fut) => fut.await,
            Frozen::Thread { thaw, done, .. } => {
                let _ = thaw.send(());
                done.await.expect("the frozen waiter's thread ended")
            }
        }
    }
}

/// A fresh in-memory backend on real time.
pub async fn memory_backend() -> Harness {
    let backend = SharedBackend::new(MemoryBackend::new());
    let same = backend.clone();
    Harness::new(
        backend,
        BackendKind::Memory,
        Arc::new(move || same.clone()),
        None,
    )
}

/// A fresh in-memory backend for a runtime started with a paused clock
/// (`#[tokio::test(start_paused = true)]`): durations are exact, because the
/// clock stands on tokio's millisecond ticks from the start.
pub async fn memory_backend_paused() -> Harness {
    let mut h = memory_backend().await;
    h.paused = true;
    h
}

/// A Redis backend on a private server started for this test.
///
#[cfg(feature = "redis")]
pub async fn redis_backend() -> Harness {
    use crate::common::redis_server::RedisServer;
    use tower_lock::backend::redis::RedisBackend;

    let server = RedisServer::start();
    let url = server.url();
    let backend = RedisBackend::from_url(&url).expect("Redis backend for the test server");
    let url2 = url.clone();
    let another = move || -> SharedBackend {
        SharedBackend::new(RedisBackend::from_url(&url).expect("Redis backend for the test server"))
    };
    let indexed = move || -> SharedBackend {
        SharedBackend::new(
            RedisBackend::from_url(&url2)
                .expect("Redis backend for the test server")
                .index_owners(true),
        )
    };
    Harness::new(
        SharedBackend::new(backend),
        BackendKind::Redis,
        Arc::new(another),
        Some(Box::new(server)),
    )
    .with_indexed(Arc::new(indexed))
}

/// A Redis backend on the Redis Cluster this test binary shares (3
/// primaries), under a key prefix of this test's own.
#[cfg(feature = "redis-cluster")]
pub async fn redis_cluster_backend() -> Harness {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use crate::common::redis_cluster::RedisCluster;
    use tower_lock::backend::redis::RedisBackend;

    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let cluster = RedisCluster::shared();
    let urls = cluster.urls();
    let prefix = format!(
        "t{}-{}:",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    let make = move |index_owners: bool| -> SharedBackend {
        SharedBackend::new(
            RedisBackend::from_cluster_urls(urls.iter().map(String::as_str))
                .expect("Redis backend for the test cluster")
                .prefix(prefix.clone())
                .index_owners(index_owners),
        )
    };
    let indexed = make.clone();
    Harness::new(
        make(false),
        BackendKind::Redis,
        Arc::new(move || make(false)),
        None,
    )
    .with_indexed(Arc::new(move || indexed(true)))
}

/// A PostgreSQL backend on a private server started for this test, its
/// schema migrated.
#[cfg(feature = "postgres")]
pub async fn postgres_backend() -> Harness {
    use crate::common::pg_server::PgServer;
    use tower_lock::backend::postgres::PostgresBackend;

    let server = PgServer::start();
    let url = server.url();
    let backend = PostgresBackend::from_url(&url).expect("PostgreSQL backend for the test server");
    backend.migrate().await.expect("migrate the test server");
    let another = move || -> SharedBackend {
        SharedBackend::new(
            PostgresBackend::from_url(&url).expect("PostgreSQL backend for the test server"),
        )
    };
    Harness::new(
        SharedBackend::new(backend),
        BackendKind::Postgres,
        Arc::new(another),
        Some(Box::new(server)),
    )
}

/// An etcd backend on the 3-member etcd cluster this test binary shares,
/// under a key prefix of this test's own.
#[cfg(feature = "etcd")]
pub async fn etcd_backend() -> Harness {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use crate::common::etcd_cluster::EtcdCluster;
    use tower_lock::backend::etcd::EtcdBackend;

    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let cluster = EtcdCluster::shared();
    let endpoints = cluster.endpoints();
    let prefix = format!(
        "t{}-{}/",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    let make = move |index_owners: bool| -> SharedBackend {
        SharedBackend::new(
            EtcdBackend::from_endpoints(&endpoints)
                .expect("etcd backend for the test cluster")
                .prefix(prefix.clone())
                .index_owners(index_owners),
        )
    };
    let indexed = make.clone();
    Harness::new(
        make(false),
        BackendKind::Etcd,
        Arc::new(move || make(false)),
        None,
    )
    .with_indexed(Arc::new(move || indexed(true)))
}
