//! distributed-lock 0.2's primitives behind one acquire/release pair, through
//! its documented API only: a provider built from a URL with its defaults
//! (`RedisLockProvider::new`, `PostgresLockProvider::new`), a lock object per
//! task made once by the provider, `acquire(Some(wait))`, `release()`.

use std::time::Duration;

use distributed_lock_core::error::LockError;
use distributed_lock_core::traits::{
    DistributedReaderWriterLock, DistributedSemaphore, LockHandle, ReaderWriterLockProvider,
    SemaphoreProvider,
};
use distributed_lock_postgres::{
    PostgresDistributedReaderWriterLock, PostgresLockProvider, PostgresReadLockHandle,
};
use distributed_lock_redis::{
    RedisDistributedReaderWriterLock, RedisDistributedSemaphore, RedisLockProvider,
    RedisReadLockHandle, RedisSemaphoreHandle,
};

use super::args::{Backend, Workload};

/// What the JSON line names as the API measured.
pub(crate) fn api(backend: &Backend, workload: Workload) -> &'static str {
    match (backend, workload) {
        (Backend::Redis(_), Workload::Readers64) => {
            "RedisLockProvider::create_reader_writer_lock + acquire_read/release"
        }
        (Backend::Redis(_), Workload::Permits4) => {
            "RedisLockProvider::create_semaphore(name, 4) + acquire/release"
        }
        (Backend::Postgres(_), Workload::Readers64) => {
            "PostgresLockProvider::create_reader_writer_lock + acquire_read/release"
        }
        (Backend::Postgres(_), Workload::Permits4) => "none",
    }
}

/// The settings the library runs with here: its defaults, read from its
/// source (0.2.0), so the JSON line says what was measured.
pub(crate) fn settings(backend: &Backend, workload: Workload) -> &'static str {
    match (backend, workload) {
        (Backend::Redis(_), Workload::Readers64) => {
            "defaults: expiry 30 s, extension cadence 10 s, one fred client (one connection); \
             acquire_read makes one attempt (EXISTS writer, SADD, PTTL, PEXPIRE: not atomic)"
        }
        (Backend::Redis(_), Workload::Permits4) => {
            "defaults: expiry 30 s, extension cadence 10 s, one fred client (one connection); \
             acquire polls an EVAL script with back-off 10 ms doubling to 200 ms"
        }
        (Backend::Postgres(_), Workload::Readers64) => {
            "defaults: session advisory locks (pg_advisory_lock_shared under SET LOCAL \
             lock_timeout), sqlx pool (max 10 connections, pinged before each use), a pooled \
             connection held per held lock, no TTL"
        }
        (Backend::Postgres(_), Workload::Permits4) => "none",
    }
}

/// A provider for the backend, built with the library's defaults.
pub(crate) enum Provider {
    Redis(RedisLockProvider),
    Postgres(PostgresLockProvider),
}

impl Provider {
    pub(crate) async fn connect(backend: &Backend) -> Result<Provider, String> {
        Ok(match backend {
            Backend::Redis(url) => Provider::Redis(
                RedisLockProvider::new(url.as_str())
                    .await
                    .map_err(|e| format!("distributed-lock Redis provider: {e}"))?,
            ),
            Backend::Postgres(url) => Provider::Postgres(
                PostgresLockProvider::new(url.as_str())
                    .await
                    .map_err(|e| format!("distributed-lock PostgreSQL provider: {e}"))?,
            ),
        })
    }

    /// The lock object a task uses for `key` (made once per task, as a
    /// process would keep it).
    pub(crate) fn lock(&self, workload: Workload, key: &str) -> Result<Lock, String> {
        Ok(match (self, workload) {
            (Provider::Redis(p), Workload::Readers64) => {
                Lock::RedisRead(p.create_reader_writer_lock(key))
            }
            (Provider::Redis(p), Workload::Permits4) => {
                Lock::RedisPermit(p.create_semaphore(key, 4))
            }
            (Provider::Postgres(p), Workload::Readers64) => {
                Lock::PostgresRead(p.create_reader_writer_lock(key))
            }
            (Provider::Postgres(_), Workload::Permits4) => {
                return Err(
                    "distributed-lock 0.2's PostgreSQL provider has no semaphore \
                     (PostgresLockProvider implements LockProvider and \
                     ReaderWriterLockProvider only): permits4 cannot run on it"
                        .into(),
                );
            }
        })
    }
}

pub(crate) enum Lock {
    RedisRead(RedisDistributedReaderWriterLock),
    RedisPermit(RedisDistributedSemaphore),
    PostgresRead(PostgresDistributedReaderWriterLock),
}

pub(crate) enum Held {
    RedisRead(RedisReadLockHandle),
    RedisPermit(RedisSemaphoreHandle),
    PostgresRead(PostgresReadLockHandle),
}

impl Lock {
    /// One acquisition, waiting up to `wait` by the library's own means.
    pub(crate) async fn acquire(&self, wait: Duration) -> Result<Held, LockError> {
        Ok(match self {
            Lock::RedisRead(l) => Held::RedisRead(l.acquire_read(Some(wait)).await?),
            Lock::RedisPermit(l) => Held::RedisPermit(l.acquire(Some(wait)).await?),
            Lock::PostgresRead(l) => Held::PostgresRead(l.acquire_read(Some(wait)).await?),
        })
    }
}

impl Held {
    pub(crate) async fn release(self) -> Result<(), LockError> {
        match self {
            Held::RedisRead(h) => h.release().await,
            Held::RedisPermit(h) => h.release().await,
            Held::PostgresRead(h) => h.release().await,
        }
    }
}
