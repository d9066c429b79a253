//! apalis tasks under `TaskLockLayer` (feature `apalis`): the lock a task
//! carries is restored for it, handed to it as apalis task data, and
//! released when it is done, fails or panics; errors reach apalis as it
//! reads them (the task's own untouched, a spent token as `AbortError`, an
//! unreachable backend as a plain, retryable error).

use std::time::Duration;

use apalis_core::error::{AbortError, BoxDynError};
use apalis_core::task::Task;
use apalis_core::task::data::Data;
use apalis_core::task::task_fn::task_fn;
use tower::{ServiceBuilder, ServiceExt};
use tower_lock::job::LockedJob;
use tower_lock::job::apalis::TaskLockLayer;
use tower_lock::{HeldLock, JobSpec, LockError, LockToken, OwnedLock};

use super::harness::Harness;
use super::support::{Probe, assert_comes_free, gkey, status_of};

/// A task's arguments, as a storage would decode them.
#[derive(Clone)]
struct Report {
    token: LockToken,
    outcome: &'static str,
    /// Given by `set_lock`, as for a job of `JobLockLayer`.
    lock: Option<HeldLock>,
}

impl LockedJob for Report {
    fn lock_token(&self) -> Option<&LockToken> {
        Some(&self.token)
    }
    fn set_lock(&mut self, lock: HeldLock) {
        self.lock = Some(lock);
    }
}

/// An error of the task's own.
#[derive(Debug)]
struct ReportFailed;

impl std::fmt::Display for ReportFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the report failed")
    }
}

impl std::error::Error for ReportFailed {}

/// The task function: answers the fence of the lock in its data (which its
/// arguments were given too), or fails, or panics.
async fn build(report: Report, lock: Data<HeldLock>) -> Result<u64, BoxDynError> {
    let given = report.lock.as_ref().map(HeldLock::fence);
    assert_eq!(given, Some(lock.fence()), "the arguments have the lock too");
    match report.outcome {
        "ok" => Ok(lock.fence()),
        "err" => Err(ReportFailed.into()),
        _ => panic!("the report panicked"),
    }
}

/// A lock taken and turned into a token, as a web handler queues it, and
/// the fence it was taken under.
async fn handed_off(h: &Harness, key: &str) -> (LockToken, u64) {
    let spec = JobSpec::new(key, Duration::from_secs(30));
    let lock = OwnedLock::acquire(&h.backend, &spec).await.unwrap();
    let fence = lock.fence();
    (lock.into_token(), fence)
}

fn task(token: LockToken, outcome: &'static str) -> Task<Report> {
    Task::new(Report {
        token,
        outcome,
        lock: None,
    })
}

pub async fn apalis_tasks_release_their_lock_when_done_failed_or_panicked(h: Harness) {
    // The worker is another process, on its own handle.
    let worker = ServiceBuilder::new()
        .layer(TaskLockLayer::new(h.indexed()))
        .service(task_fn(build));

    let (token, fence) = handed_off(&h, "report:ok").await;
    let done = worker.clone().oneshot(task(token, "ok")).await.unwrap();
    assert!(done > fence, "the task ran with its lock, claimed");
    assert_eq!(status_of(&h.backend, &gkey("report:ok")).await, None);

    // The task's own error reaches apalis as it is (apalis may retry it).
    let (token, _) = handed_off(&h, "report:err").await;
    let failed = worker
        .clone()
        .oneshot(task(token, "err"))
        .await
        .unwrap_err();
    assert!(failed.downcast_ref::<ReportFailed>().is_some(), "{failed}");
    assert_eq!(status_of(&h.backend, &gkey("report:err")).await, None);

    let (token, _) = handed_off(&h, "report:panic").await;
    let w = worker.clone();
    let panicked = tokio::spawn(async move { w.oneshot(task(token, "panic")).await }).await;
    assert!(panicked.unwrap_err().is_panic());
    assert_comes_free(&h, &gkey("report:panic")).await;

    // A spent token (a first delivery ran, and released the lock): a second
    // delivery does not run, and apalis is told not to retry it.
    let (token, _) = handed_off(&h, "report:spent").await;
    let first = OwnedLock::restore(h.backend.clone(), &token).await.unwrap();
    first.release().await.unwrap();
    let spent = worker
        .clone()
        .oneshot(task(token, "panic"))
        .await
        .unwrap_err();
    let abort = spent.downcast_ref::<AbortError>().expect("an AbortError");
    let cause = std::error::Error::source(abort).and_then(|e| e.downcast_ref::<LockError>());
    assert!(matches!(cause, Some(LockError::NotFound)), "{spent}");
}

pub async fn an_apalis_task_whose_lock_backend_is_down_may_be_retried(h: Harness) {
    let probe = Probe::new(&h.backend);
    let worker = ServiceBuilder::new()
        .layer(TaskLockLayer::new(probe.backend()))
        .service(task_fn(build));
    let (token, taken) = handed_off(&h, "report:retry").await;

    probe.set_down(true);
    let down = worker
        .clone()
        .oneshot(task(token.clone(), "ok"))
        .await
        .unwrap_err();
    assert!(down.downcast_ref::<AbortError>().is_none(), "{down}");
    assert!(
        matches!(
            down.downcast_ref::<LockError>(),
            Some(LockError::BackendUnavailable(_))
        ),
        "{down}"
    );

    // The retry, once the backend answers, runs under the same lock.
    probe.set_down(false);
    let fence = worker.oneshot(task(token.clone(), "ok")).await.unwrap();
    assert!(fence > taken);
    assert_eq!(status_of(&h.backend, &gkey("report:retry")).await, None);
}
