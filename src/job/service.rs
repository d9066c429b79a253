//! [`JobLockService`].

use std::fmt;
use std::task::{Context, Poll};

use tower_service::Service;

use super::{JobError, JobFuture, JobLockLayer, LockedJob};
use crate::backend::SharedBackend;

/// A job handler whose jobs' locks are restored before and released after
/// each job. See [`JobLockLayer`].
#[derive(Clone)]
pub struct JobLockService<S> {
    pub(super) inner: S,
    pub(super) layer: JobLockLayer,
}

impl<S> JobLockService<S> {
    /// Wrap `inner`, restoring locks from `backend`.
    pub fn new(inner: S, backend: impl Into<SharedBackend>) -> Self {
        JobLockService {
            inner,
            layer: JobLockLayer::new(backend),
        }
    }

    /// A [`JobLockLayer`] (same as [`JobLockLayer::new`]).
    pub fn layer(backend: impl Into<SharedBackend>) -> JobLockLayer {
        JobLockLayer::new(backend)
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwrap the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: fmt::Debug> fmt::Debug for JobLockService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobLockService")
            .field("inner", &self.inner)
            .field("layer", &self.layer)
            .finish()
    }
}

impl<S, J> Service<J> for JobLockService<S>
where
    S: Service<J> + Clone,
    J: LockedJob,
{
    type Response = S::Response;
    type Error = JobError<S::Error>;
    type Future = JobFuture<S, J>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(JobError::Job)
    }

    fn call(&mut self, job: J) -> Self::Future {
        let Some(token) = job.lock_token().cloned() else {
            return JobFuture::passthrough(self.inner.call(job));
        };
        // The ready service goes with this job; a clone stays for the next.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        JobFuture::restoring(
            self.layer.backend.clone(),
            token,
            job,
            inner,
            self.layer.watchdog,
        )
    }
}
