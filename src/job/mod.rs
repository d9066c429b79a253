//! Locks for job handlers, not for HTTP: [`JobLockLayer`] releases a job's
//! lock when the job is processed or fails (Laravel's
//! `releaseOnJobProcessedOrFailed`).
//!
//! An HTTP handler takes a lock, [cancels its auto-release](crate::Locks::cancel_auto_release),
//! and queues a job carrying the lock as a [`LockToken`]. The worker runs
//! its job handler (any `tower::Service<J>`) under this layer, which for
//! each job:
//!
//! 1. restores the lock from the job's token ([`OwnedLock::restore`]: the
//!    lock must still be the token's acquisition, else the job does not run
//!    and the call fails with [`JobError::Lock`]);
//! 2. hands the job the [`HeldLock`] ([`LockedJob::set_lock`]), for its
//!    [fence](HeldLock::fence) and [`lost`](HeldLock::lost); with
//!    [`watchdog`](JobLockLayer::watchdog) on, renews it while the job runs;
//! 3. releases it when the job's future completes, with a result or an
//!    error, and also when it panics or is dropped (the handle's drop
//!    releases, in a task for a remote backend).
//!
//! A job whose [`lock_token`](LockedJob::lock_token) is `None` runs as it is.
//! Being a plain tower layer, it fits job runners built on tower services
//! (a `tokio::sync::mpsc` queue and a worker loop, as in `examples/jobs.rs`;
//! for apalis workers, `job::apalis::TaskLockLayer` with feature `apalis`).
//!
//! ```
//! use std::time::Duration;
//! use tower::{Service, ServiceBuilder, ServiceExt, service_fn};
//! use tower_lock::job::{JobLockLayer, LockedJob};
//! use tower_lock::{HeldLock, JobSpec, LockToken, MemoryBackend, OwnedLock, SharedBackend};
//!
//! struct Export {
//!     id: u32,
//!     token: LockToken,
//!     lock: Option<HeldLock>,
//! }
//!
//! impl LockedJob for Export {
//!     fn lock_token(&self) -> Option<&LockToken> {
//!         Some(&self.token)
//!     }
//!     fn set_lock(&mut self, lock: HeldLock) {
//!         self.lock = Some(lock);
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let backend = SharedBackend::new(MemoryBackend::new());
//! // Where the HTTP handler took the lock and queued the job:
//! let spec = JobSpec::new("export:7", Duration::from_secs(60));
//! let token = OwnedLock::acquire(&backend, &spec).await?.into_token();
//! let job = Export { id: 7, token, lock: None };
//!
//! // The worker:
//! let mut worker = ServiceBuilder::new()
//!     .layer(JobLockLayer::new(backend.clone()).watchdog(true))
//!     .service(service_fn(|job: Export| async move {
//!         let lock = job.lock.expect("set before the job runs");
//!         Ok::<_, std::convert::Infallible>(format!("export {} under fence {}", job.id, lock.fence()))
//!     }));
//! let done = worker.ready().await?.call(job).await?;
//! assert!(done.starts_with("export 7"));
//! // Released once the job was processed.
//! assert!(backend.status(&spec.to_lock_key()?).await?.is_none());
//! # Ok(())
//! # }
//! ```
//!
//! [`LockToken`]: crate::LockToken
//! [`OwnedLock::restore`]: crate::OwnedLock::restore
//! [`HeldLock`]: crate::HeldLock
//! [`HeldLock::fence`]: crate::HeldLock::fence

#[cfg(feature = "apalis")]
#[cfg_attr(docsrs, doc(cfg(feature = "apalis")))]
pub mod apalis;
mod future;
mod layer;
mod service;

use std::fmt;

pub use future::JobFuture;
pub use layer::JobLockLayer;
pub use service::JobLockService;

use crate::error::LockError;
use crate::lock::{HeldLock, LockToken};

/// A job that may carry a lock, as [`JobLockLayer`] reads it.
///
/// Implement it for the job type your handler service takes (for a job
/// runner's wrapper type too: the trait is this crate's).
pub trait LockedJob {
    /// The lock handed to this job, `None` for a job that runs without one.
    fn lock_token(&self) -> Option<&LockToken>;

    /// Called with the restored lock right before the job runs. Keep it to
    /// read its [fence](HeldLock::fence) or watch [`lost`](HeldLock::lost).
    /// The default drops it (the layer still releases the lock).
    fn set_lock(&mut self, lock: HeldLock) {
        let _ = lock;
    }
}

/// The error of a job run under [`JobLockLayer`]: its lock could not be
/// restored (the job did not run), or the job's own error.
///
/// Its `Display` says which; the error itself is its
/// [`source`](std::error::Error::source). As an axum response (for a job
/// run from a handler; when `E` is one): the lock error as the layers
/// answer it, or the job's own error as it answers.
#[derive(Debug)]
#[non_exhaustive]
pub enum JobError<E> {
    /// The job's lock is gone or someone else's (expired, released, taken
    /// over): the job did not run.
    Lock(LockError),
    /// The job ran and failed (its lock was released).
    Job(E),
}

impl<E> fmt::Display for JobError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JobError::Lock(_) => f.write_str("the job's lock could not be restored"),
            JobError::Job(_) => f.write_str("the job failed"),
        }
    }
}

impl<E: axum::response::IntoResponse> axum::response::IntoResponse for JobError<E> {
    fn into_response(self) -> axum::response::Response {
        match self {
            JobError::Lock(e) => e.into_response(),
            JobError::Job(e) => e.into_response(),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for JobError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            JobError::Lock(e) => Some(e),
            JobError::Job(e) => Some(e),
        }
    }
}
