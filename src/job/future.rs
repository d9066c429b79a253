//! [`JobFuture`]: restore, run, release.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use pin_project_lite::pin_project;
use tower_service::Service;

use super::{JobError, LockedJob};
use crate::backend::{BoxFuture, SharedBackend};
use crate::error::LockError;
use crate::lock::{LockToken, OwnedLock};

pin_project! {
    /// Response future of [`JobLockService`](super::JobLockService).
    pub struct JobFuture<S, J>
    where
        S: Service<J>,
    {
        #[pin]
        state: State<S, J>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, J>
    where
        S: Service<J>,
    {
        // A job without a lock.
        Passthrough {
            #[pin]
            future: S::Future,
        },
        // Restoring the job's lock; the job has not run.
        Restoring {
            restore: BoxFuture<'static, Result<OwnedLock, LockError>>,
            job: Option<J>,
            inner: Option<S>,
            watchdog: bool,
        },
        // The job runs; dropping this state (a panic unwinding, the runner
        // dropping the job) drops the handle, which releases the lock.
        Running {
            #[pin]
            future: S::Future,
            lock: Option<OwnedLock>,
        },
        // The job is done: releasing before its result is handed on.
        Releasing {
            release: BoxFuture<'static, Result<(), LockError>>,
            result: Option<Result<S::Response, S::Error>>,
        },
        Done,
    }
}

impl<S: Service<J>, J> JobFuture<S, J> {
    pub(super) fn passthrough(future: S::Future) -> Self {
        JobFuture {
            state: State::Passthrough { future },
        }
    }

    pub(super) fn restoring(
        backend: SharedBackend,
        token: LockToken,
        job: J,
        inner: S,
        watchdog: bool,
    ) -> Self {
        let restore = Box::pin(async move { OwnedLock::restore(backend, &token).await });
        JobFuture {
            state: State::Restoring {
                restore,
                job: Some(job),
                inner: Some(inner),
                watchdog,
            },
        }
    }
}

impl<S, J> Future for JobFuture<S, J>
where
    S: Service<J>,
    J: LockedJob,
{
    type Output = Result<S::Response, JobError<S::Error>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            let mut state = self.as_mut().project().state;
            match state.as_mut().project() {
                StateProj::Passthrough { future } => {
                    let result = ready!(future.poll(cx));
                    state.set(State::Done);
                    return Poll::Ready(result.map_err(JobError::Job));
                }
                StateProj::Restoring {
                    restore,
                    job,
                    inner,
                    watchdog,
                } => {
                    let mut lock = match ready!(restore.as_mut().poll(cx)) {
                        Ok(lock) => lock,
                        Err(e) => {
                            tracing::warn!(
                                code = e.code(),
                                "job not run: its lock could not be restored"
                            );
                            state.set(State::Done);
                            return Poll::Ready(Err(JobError::Lock(e)));
                        }
                    };
                    if *watchdog {
                        lock.start_watchdog();
                    }
                    let (Some(mut job), Some(mut svc)) = (job.take(), inner.take()) else {
                        unreachable!("JobFuture polled after it was taken apart");
                    };
                    job.set_lock(lock.info().clone());
                    let future = svc.call(job);
                    state.set(State::Running {
                        future,
                        lock: Some(lock),
                    });
                }
                StateProj::Running { future, lock } => {
                    let result = ready!(future.poll(cx));
                    let lock = lock.take().expect("lock present until the job ends");
                    state.set(State::Releasing {
                        release: Box::pin(lock.release()),
                        result: Some(result),
                    });
                }
                StateProj::Releasing { release, result } => {
                    if let Err(e) = ready!(release.as_mut().poll(cx)) {
                        // The job is done either way; the TTL frees the lock.
                        tracing::warn!(code = e.code(), "job's lock release failed");
                    }
                    let result = result.take().expect("result present until released");
                    state.set(State::Done);
                    return Poll::Ready(result.map_err(JobError::Job));
                }
                StateProj::Done => panic!("JobFuture polled after completion"),
            }
        }
    }
}
