//! The backend harness: one shared backend plus what a test needs to know
//! about its clock.

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use tower_lock::{MemoryBackend, SharedBackend};

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
}

/// A backend under test.
pub struct Harness {
    /// The backend every test talks to.
    pub backend: SharedBackend,
    kind: BackendKind,
    paused: bool,
    /// Whatever must live as long as the backend (the server process).
    _keep: Option<Box<dyn Any + Send>>,
}

impl Harness {
    pub fn new(
        backend: SharedBackend,
        kind: BackendKind,
        keep: Option<Box<dyn Any + Send>>,
    ) -> Self {
        Harness {
            backend,
            kind,
            paused: false,
            _keep: keep,
        }
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
}

/// A fresh in-memory backend on real time.
pub async fn memory_backend() -> Harness {
    Harness::new(Arc::new(MemoryBackend::new()), BackendKind::Memory, None)
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
    let backend = RedisBackend::from_url(&server.url()).expect("Redis backend for the test server");
    Harness::new(
        Arc::new(backend),
        BackendKind::Redis,
        Some(Box::new(server)),
    )
}

/// A PostgreSQL backend on a private server started for this test, its
/// schema migrated.
#[cfg(feature = "postgres")]
pub async fn postgres_backend() -> Harness {
    use crate::common::pg_server::PgServer;
    use tower_lock::backend::postgres::PostgresBackend;

    let server = PgServer::start();
    let backend =
        PostgresBackend::from_url(&server.url()).expect("PostgreSQL backend for the test server");
    backend.migrate().await.expect("migrate the test server");
    Harness::new(
        Arc::new(backend),
        BackendKind::Postgres,
        Some(Box::new(server)),
    )
}
