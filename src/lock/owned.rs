//! [`OwnedLock`]: a lock held outside any request, by a job.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use smallvec::smallvec;

use super::acquire::acquire_guarded;
use super::held::HeldExtras;
use super::release::{Finish, MinHold, give_back, release_detached, release_one};
use super::{HeldLock, LockToken};
use crate::backend::{AsSharedBackend, Holder, Lease, LockStatus, SharedBackend};
use crate::error::LockError;
use crate::observe::{self, Meter};
use crate::spec::{JobSpec, LockSpec, new_attempt_id};
use crate::watchdog::WatchHandle;

/// A lock owned outside any request: from
/// [`Locks::cancel_auto_release`](crate::Locks::cancel_auto_release) or
/// [`OwnedLock::acquire`].
///
/// Move it into a background task and [`release`](OwnedLock::release) or
/// [`extend`](OwnedLock::extend) it there. Dropping it releases the lock (in
/// a background task; if that fails, the TTL frees it).
///
/// ```
/// use std::time::Duration;
/// use tower_lock::Locks;
///
/// async fn handler(locks: Locks) -> &'static str {
///     if let Some(lock) = locks.cancel_auto_release("report") {
///         tokio::spawn(async move {
///             // ... long work, still holding the lock ...
///             let _ = lock.release().await;
///         });
///     }
///     "accepted"
/// }
/// # let _ = handler;
/// ```
pub struct OwnedLock {
    backend: SharedBackend,
    lock: HeldLock,
    released: bool,
    watch: Option<WatchHandle>,
}

/// A lock claimed by [`OwnedLock::restore`] that has no handle yet: dropped
/// before it is `kept`, it is given back (under the claim's fence, so never
/// another acquisition; within the token's minimum hold, kept until its
/// end).
struct Claimed<'a> {
    backend: &'a SharedBackend,
    key: &'a crate::LockKey,
    owner: &'a str,
    fence: u64,
    /// The end of the token's minimum hold, if any: kept even so.
    hold_until: Option<tokio::time::Instant>,
    kept: bool,
}

impl Drop for Claimed<'_> {
    fn drop(&mut self) {
        if !self.kept {
            let (backend, key) = (self.backend.clone(), self.key.clone());
            let (owner, fence) = (self.owner.to_owned(), self.fence);
            let hold = self.hold_until.map(MinHold::until);
            drop(Finish::start(Box::pin(async move {
                let _ = give_back(&backend, &key, Holder::new(&owner, fence), hold).await;
            })));
        }
    }
}

impl fmt::Debug for OwnedLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OwnedLock")
            .field("lock", &self.lock)
            .field("watchdog", &self.watch.is_some())
            .finish()
    }
}

impl OwnedLock {
    pub(crate) fn from_parts(
        backend: SharedBackend,
        lock: HeldLock,
        watch: Option<WatchHandle>,
    ) -> Self {
        OwnedLock {
            backend,
            lock,
            released: false,
            watch,
        }
    }

    /// Acquire a lock outside any request (a job, a scheduled task), waiting
    /// up to the spec's max wait. The spec's watchdog setting applies
    /// (default off).
    ///
    /// A job names a global lock: a [`JobSpec`], global by its type (a
    /// route-scoped [`LockSpec`] has no route to be scoped by here, and does
    /// not compile). To take the lock a route's layer takes, use
    /// [`acquire_in_route`](OwnedLock::acquire_in_route). `backend` is a
    /// [`SharedBackend`] or a reference to one ([`AsSharedBackend`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_lock::{JobSpec, MemoryBackend, OwnedLock, SharedBackend};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tower_lock::LockError> {
    /// let backend = SharedBackend::new(MemoryBackend::new());
    /// let spec = JobSpec::new("nightly-report", Duration::from_secs(60));
    /// let lock = OwnedLock::acquire(&backend, &spec).await?;
    /// // ... the job's work, fenced by lock.fence() ...
    /// lock.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn acquire(
        backend: impl AsSharedBackend,
        spec: &JobSpec,
    ) -> Result<OwnedLock, LockError> {
        // Global by its type: no route to check for.
        let spec = spec.as_lock_spec();
        // Not through `acquire_in_route`: one future less to move per call.
        let backend = backend.as_shared().clone();
        let meter = Meter::new(&backend, "");
        let req = spec
            .to_request_in("")
            .inspect_err(|e| meter.acquisition(observe::error_outcome(e), None))?;
        let lock = acquire_guarded(&backend, &req, &meter).await?;
        Ok(Self::taken(backend, lock, spec))
    }

    /// [`acquire`](OwnedLock::acquire) a lock of the route pattern `route`
    /// (e.g. `/orders/{id}`): for a route-scoped spec, the lock that route's
    /// layer takes for the same key; a global spec ignores `route`.
    pub async fn acquire_in_route(
        backend: impl AsSharedBackend,
        spec: &LockSpec,
        route: &str,
    ) -> Result<OwnedLock, LockError> {
        let backend = backend.as_shared().clone();
        let meter = Meter::new(&backend, route);
        let req = spec
            .to_request_in(route)
            .inspect_err(|e| meter.acquisition(observe::error_outcome(e), None))?;
        let lock = acquire_guarded(&backend, &req, &meter).await?;
        Ok(Self::taken(backend, lock, spec))
    }

    /// The handle of `lock`, just taken for `spec` (whose watchdog setting
    /// applies, default off).
    fn taken(backend: SharedBackend, lock: HeldLock, spec: &LockSpec) -> Self {
        let watch = spec
            .get_watchdog()
            .unwrap_or(false)
            .then(|| lock.watch(&backend));
        OwnedLock::from_parts(backend, lock, watch)
    }

    /// Take over a lock from a [`LockToken`] made by
    /// [`into_token`](OwnedLock::into_token), here or in another process
    /// using the same backend configuration.
    ///
    /// **Restoring is a claim**: one atomic step on the backend checks that
    /// the token's acquisition (owner token and fence) still holds the lock
    /// and makes it a new acquisition of the same owner, under a fresh fence
    /// (greater than the token's, as after a hand-off: a write fenced by the
    /// token's holder is now refused by a fenced store). So a token restores
    /// once while the lock lives. A job queue delivers at least once, and a
    /// job delivered twice must not run twice under one lock: the second
    /// restore of the same token gets [`LockError::OwnershipMismatch`] (as
    /// does a stale token, whose owner took the lock again since), and a
    /// token whose lock was released or expired gets [`LockError::NotFound`]
    /// (a finished job's token never restores, also while a
    /// [minimum hold](crate::LockSpec::min_hold) keeps the lock: that hold
    /// belongs to the restored acquisition). A restore repeated by the
    /// backend after a lost reply is recognised as the same claim.
    ///
    /// The expiry and the metadata are the lock's. The handle's TTL (what
    /// [`start_watchdog`](OwnedLock::start_watchdog) renews by) is the
    /// token's original TTL; a token made before tokens carried it falls
    /// back to the time the lock has left.
    pub async fn restore(
        backend: impl AsSharedBackend,
        token: &LockToken,
    ) -> Result<OwnedLock, LockError> {
        let backend = backend.as_shared().clone();
        let key = token.lock_key()?;
        crate::spec::validate_owner(token.owner())?;
        let sent = tokio::time::Instant::now();
        let holder = Holder::new(token.owner(), token.fence());
        let claimed = backend.claim(&key, holder, new_attempt_id()).await?;
        // Never past the lock's own end: a release within the hold shortens
        // the lock, and must not lengthen it (a token's wall-clock hold from
        // another clock, or edited).
        let hold_until = token.hold_left().map(|left| sent + left.min(claimed.ttl));
        // Until the handle exists, a drop (the caller went away while the
        // metadata is read) gives the claimed lock back: nobody else can,
        // and the token is spent.
        let mut claim = Claimed {
            backend: &backend,
            key: &key,
            owner: token.owner(),
            fence: claimed.fence,
            hold_until,
            kept: false,
        };
        // The metadata of the lock, not the token's copy (read after the
        // claim: it follows the lock's new fence).
        let metadata = match backend.status(&key).await {
            Ok(Some(status)) if status.fence == claimed.fence => status.metadata,
            _ => token.metadata().cloned(),
        };
        claim.kept = true;
        drop(claim);
        let left = claimed.ttl;
        let ttl = token
            .ttl_ms()
            .filter(|&ms| ms > 0)
            .map(Duration::from_millis)
            .unwrap_or(left)
            .min(crate::spec::MAX_TTL);
        let lease = Lease { ttl, ..claimed };
        let lock = HeldLock::new(
            key,
            Arc::from(token.owner()),
            lease,
            sent + left,
            HeldExtras::new(metadata, hold_until, token.kind()),
            Meter::new(&backend, ""),
        );
        Ok(OwnedLock::from_parts(backend, lock, None))
    }

    /// Turn the handle into a serialisable token (key, scope, owner, fence,
    /// expiry) without releasing the lock: hand it to a job queue, restore
    /// it with [`restore`](OwnedLock::restore). Renewals by this process's
    /// watchdog stop.
    ///
    /// Until a worker restores it, nothing releases or renews the lock but
    /// its TTL: choose one that covers the queue's latency, and if handing
    /// the token on fails (the queue refused it, the process panics before
    /// it is sent), restore it here and release it, or the lock is held by
    /// nobody until the TTL ends.
    pub fn into_token(mut self) -> LockToken {
        self.released = true;
        self.watch = None;
        LockToken::from_lock(&self.lock)
    }

    /// The lock's key, owner, fence and expiry.
    pub fn info(&self) -> &HeldLock {
        &self.lock
    }

    /// The fencing token.
    pub fn fence(&self) -> u64 {
        self.lock.fence()
    }

    /// Whether the lock is known to be lost (see [`HeldLock::lost`]).
    pub fn is_lost(&self) -> bool {
        self.lock.is_lost()
    }

    /// Resolves when the lock is lost (see [`HeldLock::lost`]).
    pub async fn lost(&self) {
        self.lock.lost().await
    }

    /// Renew the lock by its TTL every TTL/3 until it is released or this
    /// handle is dropped (a no-op if already on).
    pub fn start_watchdog(&mut self) {
        if self.watch.is_none() {
            self.watch = Some(self.lock.watch(&self.backend));
        }
    }

    /// Release the lock (checked against the owner token).
    pub async fn release(mut self) -> Result<(), LockError> {
        self.watch = None;
        self.lock.finish();
        // From here on the release is under way: dropped before the backend
        // answers (task aborted, `select!`), it completes in a task.
        self.released = true;
        release_one(&self.backend, &self.lock).await
    }

    /// Release every handle of `locks` (a job's set of locks: the guide's
    /// `releaseAll`), concurrently; the first error, if any, after all were
    /// tried.
    pub async fn release_all(locks: impl IntoIterator<Item = OwnedLock>) -> Result<(), LockError> {
        let releases = locks.into_iter().map(OwnedLock::release).collect();
        crate::backend::join_all(releases)
            .await
            .into_iter()
            .collect()
    }

    /// Set the remaining TTL to `ttl` (never revives an expired lock:
    /// [`LockError::NotFound`] then).
    pub async fn extend(&mut self, ttl: Duration) -> Result<(), LockError> {
        let lock = self.lock.clone();
        lock.extend_on(&self.backend, ttl, |lease, end| {
            self.lock.lease = lease;
            self.lock.set_expiry(end);
            if let Some(w) = &self.watch {
                w.set_ttl(ttl);
            }
        })
        .await
    }

    /// Ask the backend who holds this lock now.
    pub async fn status(&self) -> Result<Option<LockStatus>, LockError> {
        self.backend.status(&self.lock.key).await
    }

    /// The backend released the lock as part of another operation (a
    /// single-flight's publish): stop renewing, and do not release again.
    pub(crate) fn released_by_backend(mut self) {
        self.watch = None;
        self.lock.finish();
        self.released = true;
    }

    /// Give up the handle without releasing: the lock stays held until its
    /// TTL ends (or someone releases it with the owner token).
    pub fn keep(mut self) -> HeldLock {
        self.released = true;
        self.watch = None;
        self.lock.clone()
    }
}

impl Drop for OwnedLock {
    fn drop(&mut self) {
        self.watch = None;
        if !self.released {
            self.lock.finish();
            release_detached(&self.backend, smallvec![self.lock.clone()]);
        }
    }
}
