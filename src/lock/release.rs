//! Giving locks back, also when whoever started it goes away.
//!
//! One mechanism: [`Finish`], started work that completes. Awaited, it runs
//! in the caller; dropped unfinished (a request future dropped because the
//! client left, a `select!` that took the other branch, a panic unwinding),
//! the rest runs in a task. `Drop` cannot wait, so that is the only way to
//! finish async work from it; without a runtime to spawn on, the lock's TTL
//! frees it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use smallvec::SmallVec;

use crate::backend::{BoxFuture, Holder, SharedBackend};
use crate::error::LockError;
use crate::key::LockKey;
use crate::layer::retry::RetryPolicy;
use crate::lock::HeldLock;
use crate::lock::registry::Locks;
use crate::watchdog::LostSignal;

/// Started work that finishes even if it is dropped: see the module docs.
#[must_use = "dropping a Finish runs the rest of its work in a task"]
pub(crate) struct Finish<T: Send + 'static>(Option<BoxFuture<'static, T>>);

impl<T: Send + 'static> Finish<T> {
    /// `fut`, to be awaited (or dropped, which detaches it).
    pub(crate) fn new(fut: BoxFuture<'static, T>) -> Self {
        Finish(Some(fut))
    }
}

impl Finish<()> {
    /// Poll `fut` once: `None` if that finished it (a backend in this
    /// process answers at once, without a task or a wake-up), else the rest.
    pub(crate) fn start(mut fut: BoxFuture<'static, ()>) -> Option<Self> {
        if tokio::runtime::Handle::try_current().is_err() {
            // A remote backend's future would need the runtime's timers and I/O.
            warn_no_runtime();
            return None;
        }
        let mut cx = Context::from_waker(std::task::Waker::noop());
        match fut.as_mut().poll(&mut cx) {
            Poll::Ready(()) => None,
            Poll::Pending => Some(Finish(Some(fut))),
        }
    }
}

impl<T: Send + 'static> Future for Finish<T> {
    type Output = T;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let fut = self.0.as_mut().expect("Finish polled after completion");
        let out = ready!(fut.as_mut().poll(cx));
        self.0 = None;
        Poll::Ready(out)
    }
}

impl<T: Send + 'static> Drop for Finish<T> {
    fn drop(&mut self) {
        let Some(fut) = self.0.take() else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    let _ = fut.await;
                });
            }
            Err(_) => warn_no_runtime(),
        }
    }
}

fn warn_no_runtime() {
    tracing::warn!("no tokio runtime to release a lock on; it will be freed by its TTL");
}

/// Locks released together: most requests hold one.
pub(crate) type HeldLocks = SmallVec<[HeldLock; 1]>;

/// Release `locks`: at once what the backend can answer without I/O (in
/// memory: everything), the rest as a [`Finish`]. Outcomes are traced.
pub(crate) fn release(backend: &SharedBackend, mut locks: HeldLocks) -> Option<Finish<()>> {
    locks.retain(|lock| {
        lock.meter.held(lock.since);
        match release_now(backend, lock) {
            Some(result) => {
                traced(lock, result);
                false
            }
            None => true,
        }
    });
    if locks.is_empty() {
        return None;
    }
    let backend = backend.clone();
    Finish::start(Box::pin(async move {
        for lock in locks {
            let hold = MinHold::of(&lock);
            let result = give_back(&backend, lock.lock_key(), lock.holder(), hold).await;
            traced(&lock, result);
        }
    }))
}

/// [`release`] from `Drop`, where nobody waits: whatever is left runs in a
/// task.
pub(crate) fn release_detached(backend: &SharedBackend, locks: HeldLocks) {
    drop(release(backend, locks));
}

/// Release one lock and answer how it went. If the caller goes away while
/// the backend call is in flight, the call still completes, in a task.
pub(crate) async fn release_one(backend: &SharedBackend, lock: &HeldLock) -> Result<(), LockError> {
    lock.meter.held(lock.since);
    let result = match release_now(backend, lock) {
        Some(result) => result,
        None => {
            let (backend, key, owner) = (backend.clone(), lock.key.clone(), lock.owner.clone());
            let (fence, hold) = (lock.fence(), MinHold::of(lock));
            Finish::new(Box::pin(async move {
                give_back(&backend, &key, Holder::new(&owner, fence), hold).await
            }))
            .await
        }
    };
    if let Err(e) = &result {
        lock.meter.release_failed(e);
    }
    result
}

/// Release `lock` at once if the backend can without I/O and nothing keeps
/// it held longer.
#[inline]
fn release_now(backend: &SharedBackend, lock: &HeldLock) -> Option<Result<(), LockError>> {
    match lock.hold_left() {
        None => backend.try_release_now(lock.lock_key(), lock.holder()),
        Some(_) => None,
    }
}

/// What is left of a lock's minimum hold when it is given back.
pub(crate) struct MinHold {
    until: tokio::time::Instant,
    /// The lock's extension gate, when its signal exists (see below).
    signal: Option<LostSignal>,
}

impl MinHold {
    /// `lock`'s, if a release now must keep it held longer.
    pub(crate) fn of(lock: &HeldLock) -> Option<MinHold> {
        lock.hold_left()?;
        Some(MinHold {
            until: lock.hold_until()?,
            signal: Some(lock.lost_signal().clone()),
        })
    }

    /// Until `until`, for a lock nothing renews or extends yet (a restore
    /// that never made its handle).
    pub(crate) fn until(until: tokio::time::Instant) -> MinHold {
        MinHold {
            until,
            signal: None,
        }
    }
}

/// Give a lock back: free it, or, within its minimum hold, shorten it to end
/// with the hold (checked against the acquisition; never revives it). The
/// shortening waits for a renewal or extension of the lock under way (the
/// extension gate): landing after it, that would keep the lock for a whole
/// TTL.
pub(crate) async fn give_back(
    backend: &SharedBackend,
    key: &LockKey,
    holder: Holder<'_>,
    hold: Option<MinHold>,
) -> Result<(), LockError> {
    let Some(hold) = hold else {
        return backend.release(key, holder).await;
    };
    let _gate = match &hold.signal {
        Some(signal) => Some(signal.extending().await),
        None => None,
    };
    let left = hold
        .until
        .saturating_duration_since(tokio::time::Instant::now());
    // Less than a millisecond is no hold (backends count whole ms).
    if left < Duration::from_millis(1) {
        return backend.release(key, holder).await;
    }
    backend.extend(key, holder, left).await.map(drop)
}

/// Count and trace the outcome of a release nobody waits for.
fn traced(lock: &HeldLock, result: Result<(), LockError>) {
    let key = lock.lock_key();
    match result {
        Ok(()) => tracing::debug!(key = %key.digest(), "lock released"),
        Err(e) => {
            lock.meter.release_failed(&e);
            tracing::warn!(
            key = %key.digest(),
            code = e.code(),
            error = %e,
            "lock release failed; the lock will be freed by its TTL"
            )
        }
    }
}

/// The locks of one response: released with its end ([`start`](Self::start)),
/// or when it is dropped first (client gone, body dropped early, panic
/// unwinding). Exactly once either way.
///
/// Until the handler has answered, kept locks (`auto_release(false)`) go
/// too: their owner token reaches the client only with the response, so
/// after a handler that never answered (the client went away, a timeout,
/// a panic caught outside, an error) nobody could release them.
pub(crate) struct ReleaseGuard {
    locks: Option<Locks>,
    // Where the hold time goes, and since when (a layer whose
    // `Retry-After` is estimated from its hold times).
    clock: Option<(Arc<RetryPolicy>, tokio::time::Instant)>,
    // The handler answered: kept locks stay kept.
    answered: bool,
}

impl ReleaseGuard {
    pub(crate) fn new(locks: Locks, holds: Option<&Arc<RetryPolicy>>) -> Self {
        ReleaseGuard {
            locks: Some(locks),
            clock: holds.map(|p| (p.clone(), tokio::time::Instant::now())),
            answered: false,
        }
    }

    /// The handler answered with a response: from now on kept locks stay
    /// held after it (their owner token goes out with it).
    pub(crate) fn answered(mut self) -> Self {
        self.answered = true;
        self
    }

    fn release(&self, locks: Locks) -> Option<Finish<()>> {
        if self.answered {
            locks.release_auto()
        } else {
            locks.close_and_release_all()
        }
    }

    /// The locks are let go now: record how long they were held.
    fn record(&mut self) {
        if let Some((policy, since)) = self.clock.take() {
            policy.record(since.elapsed());
        }
    }

    pub(crate) fn locks(&self) -> Option<&Locks> {
        self.locks.as_ref()
    }

    /// Release now; `None` if done synchronously, else the work to await.
    pub(crate) fn start(mut self) -> Option<Finish<()>> {
        self.record();
        let locks = self.locks.take()?;
        self.release(locks)
    }
}

impl Drop for ReleaseGuard {
    fn drop(&mut self) {
        self.record();
        if let Some(locks) = self.locks.take() {
            // Dropping the unfinished release detaches it.
            drop(self.release(locks));
        }
    }
}
