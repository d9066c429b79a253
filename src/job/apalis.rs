//! [apalis](https://docs.rs/apalis) workers (feature `apalis`): the job
//! layer for apalis tasks.
//!
//! An apalis worker is a tower service over [`Task<Args>`](apalis_core::task::Task)
//! wrapped in apalis's layers, so [`JobLockLayer`]'s machinery fits as it
//! is; two things are apalis's own, and this module adds them:
//!
//! - **Where the token is.** [`Task<A>`](apalis_core::task::Task) is a
//!   [`LockedJob`] when its arguments `A` are: the token travels in the
//!   arguments (serialised with them by the storage), and the restored
//!   [`HeldLock`] goes into the task's data, where a task function takes it
//!   as [`Data<HeldLock>`](apalis_core::task::data::Data) (and to
//!   `A`'s [`set_lock`](LockedJob::set_lock)).
//! - **What an error is.** apalis wants a worker's errors as its
//!   `BoxDynError` and reads them by downcasting (`AbortError`: do not
//!   retry). [`JobError`] cannot be one
//!   (`Box<dyn Error>` is not an `Error` itself), so [`TaskLockLayer`] hands
//!   on the task's own error as it is, and a lock that cannot be restored as
//!   an `AbortError` around the [`LockError`]: its token is spent (released,
//!   expired, claimed by a first delivery, taken over), and no retry can run
//!   the task under it. Only [`LockError::BackendUnavailable`] stays a plain
//!   error, which apalis may retry: the lock may still be there once the
//!   backend answers.
//!
//! The lock is released when the task's future completes (done or failed),
//! and when it panics: put apalis's `catch_panic` inside this layer (added
//! after it on the `WorkerBuilder`) and the release happens before the task
//! is reported; without it the unwinding drops the handle, which releases in
//! a background task.
//!
//! ```
//! use std::time::Duration;
//! use apalis::prelude::*;
//! use serde::{Deserialize, Serialize};
//! use tower_lock::job::LockedJob;
//! use tower_lock::job::apalis::TaskLockLayer;
//! use tower_lock::{HeldLock, JobSpec, LockToken, MemoryBackend, OwnedLock, SharedBackend};
//!
//! /// The task's arguments: what to export, and the lock it runs under.
//! #[derive(Serialize, Deserialize)]
//! struct Export {
//!     id: u32,
//!     token: LockToken,
//! }
//!
//! impl LockedJob for Export {
//!     fn lock_token(&self) -> Option<&LockToken> {
//!         Some(&self.token)
//!     }
//! }
//!
//! async fn export(task: Export, lock: Data<HeldLock>, worker: WorkerContext) -> Result<String, BoxDynError> {
//!     worker.stop()?; // one task in this example
//!     Ok(format!("export {} under fence {}", task.id, lock.fence()))
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let locks = SharedBackend::new(MemoryBackend::new());
//! // Where the HTTP handler took the lock and queued the task:
//! let spec = JobSpec::new("export:7", Duration::from_secs(60));
//! let token = OwnedLock::acquire(&locks, &spec).await?.into_token();
//! let mut storage = MemoryStorage::new();
//! storage.push(Export { id: 7, token }).await?;
//!
//! // The worker:
//! WorkerBuilder::new("exports")
//!     .backend(storage)
//!     .layer(TaskLockLayer::new(locks.clone()).watchdog(true))
//!     .catch_panic()
//!     .build(export)
//!     .run()
//!     .await?;
//! // Released once the task was processed.
//! assert!(locks.status(&spec.to_lock_key()?).await?.is_none());
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use apalis_core::error::{AbortError, BoxDynError};
use apalis_core::task::Task;
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use super::{JobError, JobFuture, JobLockLayer, JobLockService, LockedJob};
use crate::backend::SharedBackend;
use crate::error::LockError;
use crate::lock::{HeldLock, LockToken};

impl<A: LockedJob> LockedJob for Task<A> {
    fn lock_token(&self) -> Option<&LockToken> {
        self.args.lock_token()
    }

    /// Into the task's data (a task function's `Data<HeldLock>`), and to
    /// the arguments' own `set_lock`.
    fn set_lock(&mut self, lock: HeldLock) {
        self.inject_data(lock.clone());
        self.args.set_lock(lock);
    }
}

/// [`JobLockLayer`] for an apalis worker: restores each task's lock,
/// releases it when the task is done, fails or panics, and reports errors
/// as apalis reads them. See the [module docs](self).
#[derive(Clone)]
pub struct TaskLockLayer {
    layer: JobLockLayer,
}

impl TaskLockLayer {
    /// Restore tasks' locks from `backend` (the one their tokens come from).
    pub fn new(backend: impl Into<SharedBackend>) -> Self {
        TaskLockLayer {
            layer: JobLockLayer::new(backend),
        }
    }

    /// Renew each task's lock by its TTL every TTL/3 while the task runs
    /// (default off); see [`JobLockLayer::watchdog`].
    pub fn watchdog(self, on: bool) -> Self {
        TaskLockLayer {
            layer: self.layer.watchdog(on),
        }
    }

    /// Whether the watchdog is on.
    pub fn get_watchdog(&self) -> bool {
        self.layer.get_watchdog()
    }
}

impl fmt::Debug for TaskLockLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TaskLockLayer")
            .field("watchdog", &self.get_watchdog())
            .finish_non_exhaustive()
    }
}

impl<S> Layer<S> for TaskLockLayer {
    type Service = TaskLockService<S>;

    fn layer(&self, inner: S) -> TaskLockService<S> {
        TaskLockService {
            inner: self.layer.layer(inner),
        }
    }
}

/// An apalis task handler whose tasks' locks are restored before and
/// released after each task. See [`TaskLockLayer`].
#[derive(Clone)]
pub struct TaskLockService<S> {
    inner: JobLockService<S>,
}

impl<S: fmt::Debug> fmt::Debug for TaskLockService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TaskLockService")
            .field("inner", &self.inner)
            .finish()
    }
}

impl<S, A> Service<Task<A>> for TaskLockService<S>
where
    S: Service<Task<A>> + Clone,
    S::Error: Into<BoxDynError>,
    A: LockedJob,
{
    type Response = S::Response;
    type Error = BoxDynError;
    type Future = TaskLockFuture<S, A>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(task_error)
    }

    fn call(&mut self, task: Task<A>) -> Self::Future {
        TaskLockFuture {
            inner: self.inner.call(task),
        }
    }
}

pin_project! {
    /// Response future of [`TaskLockService`].
    pub struct TaskLockFuture<S, A>
    where
        S: Service<Task<A>>,
    {
        #[pin]
        inner: JobFuture<S, Task<A>>,
    }
}

impl<S, A> Future for TaskLockFuture<S, A>
where
    S: Service<Task<A>>,
    S::Error: Into<BoxDynError>,
    A: LockedJob,
{
    type Output = Result<S::Response, BoxDynError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.project().inner.poll(cx).map_err(task_error)
    }
}

/// A job layer error as apalis reads it: the task's own error untouched (an
/// `AbortError` or `RetryAfterError` it returned keeps its meaning), a spent
/// token as an `AbortError`.
fn task_error<E: Into<BoxDynError>>(e: JobError<E>) -> BoxDynError {
    match e {
        JobError::Job(e) => e.into(),
        JobError::Lock(e @ LockError::BackendUnavailable(_)) => Box::new(e),
        JobError::Lock(e) => Box::new(AbortError::new(e)),
    }
}
