//! [`JobLockLayer`].

use std::fmt;

use tower_layer::Layer;

use super::JobLockService;
use crate::backend::SharedBackend;

/// Wraps a job handler with [`JobLockService`]: restores each job's lock,
/// releases it when the job is processed, fails or panics. See the
/// [module docs](crate::job).
#[derive(Clone)]
pub struct JobLockLayer {
    pub(super) backend: SharedBackend,
    pub(super) watchdog: bool,
}

impl JobLockLayer {
    /// Restore jobs' locks from `backend` (the one their tokens come from).
    pub fn new(backend: impl Into<SharedBackend>) -> Self {
        JobLockLayer {
            backend: backend.into(),
            watchdog: false,
        }
    }

    /// Renew each job's lock by its TTL every TTL/3 while the job runs, for
    /// jobs longer than the lock's TTL (default off).
    pub fn watchdog(mut self, on: bool) -> Self {
        self.watchdog = on;
        self
    }

    /// Whether the watchdog is on.
    pub fn get_watchdog(&self) -> bool {
        self.watchdog
    }
}

impl fmt::Debug for JobLockLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobLockLayer")
            .field("watchdog", &self.watchdog)
            .finish_non_exhaustive()
    }
}

impl<S> Layer<S> for JobLockLayer {
    type Service = JobLockService<S>;

    fn layer(&self, inner: S) -> JobLockService<S> {
        JobLockService {
            inner,
            layer: self.clone(),
        }
    }
}
