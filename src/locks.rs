//! The per-request lock registry ([`Locks`]), held-lock info ([`HeldLock`])
//! and owned handles for background jobs ([`OwnedLock`]).

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use axum::extract::FromRequestParts;
use axum::response::{IntoResponse, Response};
use http::request::Parts;

use serde::{Deserialize, Serialize};
use smallvec::{SmallVec, smallvec};
use smol_str::SmolStr;

use crate::backend::{BoxFuture, Lease, LockStatus, SharedBackend};
use crate::error::LockError;
use crate::key::{LockKey, Scope};
use crate::spec::{AcquireRequest, LockSpec};
use crate::watchdog::{LostSignal, WatchHandle, Watchdog};

/// A lock that is held: its key, owner token, fencing token and expiry, and
/// a signal that fires if it is lost.
pub struct HeldLock {
    key: LockKey,
    owner: Arc<str>,
    lease: Lease,
    // When the lock expires unless extended, by this process's clock.
    expiry: tokio::time::Instant,
    // Made on first use: most locks are released without anyone asking.
    // A clone makes it first, so every copy shares one signal.
    signal: OnceLock<LostSignal>,
}

impl Clone for HeldLock {
    fn clone(&self) -> Self {
        HeldLock {
            key: self.key.clone(),
            owner: self.owner.clone(),
            lease: self.lease.clone(),
            expiry: self.expiry,
            signal: OnceLock::from(self.lost_signal().clone()),
        }
    }
}

impl PartialEq for HeldLock {
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key && self.owner == other.owner && self.lease == other.lease
    }
}

impl Eq for HeldLock {}

impl HeldLock {
    pub(crate) fn new(
        key: LockKey,
        owner: Arc<str>,
        lease: Lease,
        expiry: tokio::time::Instant,
    ) -> Self {
        HeldLock {
            key,
            owner,
            lease,
            expiry,
            signal: OnceLock::new(),
        }
    }

    /// Whether the lock is known to be lost (see [`LostSignal`]).
    pub fn is_lost(&self) -> bool {
        match self.signal.get() {
            Some(signal) => signal.is_lost(),
            // Nobody else has the signal, so nobody has marked it lost.
            None => tokio::time::Instant::now() >= self.expiry,
        }
    }

    /// Resolves when the lock is lost: a renewal found it gone or owned by
    /// someone else, or its TTL passed without a successful renewal. Use it
    /// in `tokio::select!` to abort work that must not continue unlocked.
    pub async fn lost(&self) {
        self.lost_signal().lost().await
    }

    /// The lost-lock signal itself, to hand to other tasks.
    pub fn lost_signal(&self) -> &LostSignal {
        self.signal.get_or_init(|| LostSignal::new(self.expiry))
    }

    /// When the lock expires unless extended, by this process's clock.
    fn expiry(&self) -> tokio::time::Instant {
        match self.signal.get() {
            Some(signal) => signal.expiry(),
            None => self.expiry,
        }
    }

    /// A new expiry after an extension.
    fn set_expiry(&mut self, expiry: tokio::time::Instant) {
        self.expiry = expiry;
        if let Some(signal) = self.signal.get() {
            signal.set_expiry(expiry);
        }
    }

    /// Quiet the lost signal: the lock is being released.
    fn finish(&self) {
        if let Some(signal) = self.signal.get() {
            signal.finish();
        }
    }

    /// The validated key (with its scope).
    pub fn lock_key(&self) -> &LockKey {
        &self.key
    }

    /// The user's key, as given in the spec (NFC-normalised).
    pub fn key(&self) -> &str {
        self.key.key()
    }

    /// The owner token: whoever presents it can release or extend the lock.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// The fencing token. Pass it to the resource you protect and have it
    /// refuse writes carrying a smaller token than one it has already seen.
    pub fn fence(&self) -> u64 {
        self.lease.fence
    }

    /// When the lock was acquired.
    pub fn acquired_at(&self) -> SystemTime {
        self.lease.acquired_at
    }

    /// When the lock expires unless extended.
    pub fn expires_at(&self) -> SystemTime {
        self.lease.expires_at
    }

    /// The TTL granted by the last acquisition or extension.
    pub fn ttl(&self) -> Duration {
        self.lease.ttl
    }
}

impl fmt::Debug for HeldLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The owner token is a credential: keep it out of logs.
        f.debug_struct("HeldLock")
            .field("key", &self.key)
            .field("fence", &self.lease.fence)
            .field("expires_at", &self.lease.expires_at)
            .finish_non_exhaustive()
    }
}

struct Slot {
    lock: HeldLock,
    auto_release: bool,
    watch: Option<WatchHandle>,
}

impl Slot {
    /// Stop renewals and the lost signal: the lock is being released.
    fn retire(self) -> HeldLock {
        drop(self.watch);
        self.lock.finish();
        self.lock
    }
}

struct Registry {
    backend: SharedBackend,
    route: SmolStr,
    watchdog: bool,
    state: Mutex<RegistryState>,
}

/// Locks being released together: most requests hold one.
type HeldLocks = SmallVec<[HeldLock; 1]>;

#[derive(Default)]
struct RegistryState {
    // Inline for the common single lock: no allocation.
    slots: SmallVec<[Slot; 1]>,
    // Keys this request released (by hand or with the response), so that a
    // later call on them says so (`LOCK_ALREADY_RELEASED`).
    released: SmallVec<[LockKey; 1]>,
    closed: bool,
}

impl RegistryState {
    /// The error for `key`, which no slot holds: released by this request,
    /// or never held by it.
    fn missing(&self, key: &str) -> LockError {
        if self.released.iter().any(|k| k.key() == key) {
            LockError::AlreadyReleased
        } else {
            LockError::NotFound
        }
    }
}

/// The locks of one request, in its extensions; also an axum extractor.
///
/// The layer puts the locks it acquired here. A handler can read them, take
/// more locks that are released with the response, release one early, or
/// [`cancel_auto_release`](Locks::cancel_auto_release) one to hand it to a
/// background job.
///
/// ```
/// use std::time::Duration;
/// use tower_lock::{Locks, LockSpec};
///
/// async fn handler(locks: Locks) -> String {
///     let order = locks.get("order:1").map(|l| l.fence());
///     // A second lock, released together with the first after the response.
///     let audit = locks
///         .acquire(LockSpec::new("audit", Duration::from_secs(5)).global())
///         .await;
///     format!("{order:?} {:?}", audit.map(|l| l.fence()))
/// }
/// # let _ = handler;
/// ```
#[derive(Clone)]
pub struct Locks {
    inner: Arc<Registry>,
}

impl fmt::Debug for Locks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Locks")
            .field("held", &self.held())
            .finish_non_exhaustive()
    }
}

impl Locks {
    pub(crate) fn new(backend: SharedBackend, route: SmolStr, watchdog: bool) -> Self {
        Locks {
            inner: Arc::new(Registry {
                backend,
                route,
                watchdog,
                state: Mutex::default(),
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, RegistryState> {
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every lock this request holds (auto-release or kept).
    pub fn held(&self) -> Vec<HeldLock> {
        self.state().slots.iter().map(|s| s.lock.clone()).collect()
    }

    /// The held lock with this user key, if any.
    pub fn get(&self, key: &str) -> Option<HeldLock> {
        self.state()
            .slots
            .iter()
            .find(|s| s.lock.key() == key)
            .map(|s| s.lock.clone())
    }

    /// The first lock the layer took for this request, if any.
    pub fn first(&self) -> Option<HeldLock> {
        self.state().slots.first().map(|s| s.lock.clone())
    }

    /// The backend these locks live in.
    pub fn backend(&self) -> &SharedBackend {
        &self.inner.backend
    }

    /// The route pattern used for [`Scope::Route`](crate::Scope::Route) keys.
    pub fn route(&self) -> &str {
        &self.inner.route
    }

    /// Locks kept after the response (auto-release off), for the headers.
    pub(crate) fn kept(&self) -> Vec<HeldLock> {
        self.state()
            .slots
            .iter()
            .filter(|s| !s.auto_release)
            .map(|s| s.lock.clone())
            .collect()
    }

    /// Add `lock` to the request's locks; `Err` gives it back if the
    /// response has already released them.
    // The `Err` is the lock itself, handed back on a path taken once per
    // request at most: boxing it would cost every call an allocation.
    #[allow(clippy::result_large_err)]
    pub(crate) fn register(
        &self,
        lock: HeldLock,
        auto_release: bool,
        watchdog: Option<bool>,
    ) -> Result<(), HeldLock> {
        let watch = watchdog
            .unwrap_or(self.inner.watchdog)
            .then(|| watch(&self.inner.backend, &lock));
        let mut state = self.state();
        if state.closed {
            drop(watch);
            return Err(lock);
        }
        state.slots.push(Slot {
            lock,
            auto_release,
            watch,
        });
        Ok(())
    }

    /// Take one more lock for this request, waiting up to the spec's max wait.
    ///
    /// It is released with the response unless the spec turns auto-release
    /// off. Fails with [`LockError::AlreadyReleased`] once the response has
    /// ended and the request's locks were released.
    pub async fn acquire(&self, spec: LockSpec) -> Result<HeldLock, LockError> {
        {
            let state = self.state();
            if state.closed {
                return Err(LockError::AlreadyReleased);
            }
            // `get`, `release`, `extend` and `cancel_auto_release` name a
            // lock by its key: one key must name one lock of the request.
            if state.slots.iter().any(|s| s.lock.key() == spec.key()) {
                return Err(LockError::InvalidKey(ONE_LOCK_PER_KEY));
            }
        }
        let req = spec.to_request(&self.inner.route)?;
        let lock = acquire_guarded(&self.inner.backend, &req).await?;
        match self.register(lock.clone(), spec.auto_releases(), spec.get_watchdog()) {
            Ok(()) => Ok(lock),
            Err(lock) => {
                release_detached(&self.inner.backend, smallvec![lock]);
                Err(LockError::AlreadyReleased)
            }
        }
    }

    /// Release one of this request's locks now, before the response ends.
    ///
    /// [`LockError::AlreadyReleased`] if this request already released it
    /// (by hand, or with its response), [`LockError::NotFound`] if the
    /// request never held it.
    pub async fn release(&self, key: &str) -> Result<(), LockError> {
        let lock = {
            let mut state = self.state();
            match state.slots.iter().position(|s| s.lock.key() == key) {
                Some(i) => {
                    let lock = state.slots.remove(i).retire();
                    state.released.push(lock.key.clone());
                    lock
                }
                None => return Err(state.missing(key)),
            }
        };
        // The registry no longer has it: if this future is dropped before
        // the backend answers, the release finishes in a task.
        let mut pending = ReleaseOnDrop {
            backend: &self.inner.backend,
            lock: Some(lock),
        };
        let result = match &pending.lock {
            Some(lock) => self.inner.backend.release(&lock.key, &lock.owner).await,
            None => Ok(()),
        };
        pending.lock = None;
        result
    }

    /// Stop releasing this lock with the response and get an owned handle
    /// to it, e.g. to move into `tokio::spawn`. The job then releases or
    /// extends it; dropping the handle releases it.
    ///
    /// `None` if this request holds no lock with that key.
    pub fn cancel_auto_release(&self, key: &str) -> Option<OwnedLock> {
        let mut state = self.state();
        let i = state.slots.iter().position(|s| s.lock.key() == key)?;
        let slot = state.slots.remove(i);
        Some(OwnedLock {
            backend: self.inner.backend.clone(),
            lock: slot.lock,
            released: false,
            watch: slot.watch,
        })
    }

    /// Set the remaining TTL of one of this request's locks.
    ///
    /// [`LockError::AlreadyReleased`] once this request released it (by
    /// hand, or with its response), [`LockError::NotFound`] if it never held
    /// it.
    pub async fn extend(&self, key: &str, ttl: Duration) -> Result<HeldLock, LockError> {
        let lock = self.lookup(key)?;
        // Never beside a watchdog renewal of the same lock (see `extending`).
        let _gate = lock.lost_signal().extending().await;
        let sent = tokio::time::Instant::now();
        let lease = self
            .inner
            .backend
            .extend(&lock.key, &lock.owner, ttl)
            .await?;
        let mut state = self.state();
        let slot = state.slots.iter_mut().find(|s| s.lock.key == lock.key);
        match slot {
            Some(slot) => {
                slot.lock.lease = lease;
                slot.lock.set_expiry(sent + ttl);
                if let Some(w) = &slot.watch {
                    w.set_ttl(ttl);
                }
                Ok(slot.lock.clone())
            }
            None => Err(LockError::AlreadyReleased),
        }
    }

    /// Ask the backend who holds this request's lock `key` now.
    pub async fn status(&self, key: &str) -> Result<Option<LockStatus>, LockError> {
        let lock = self.lookup(key)?;
        self.inner.backend.status(&lock.key).await
    }

    /// The held lock `key`, or why there is none.
    fn lookup(&self, key: &str) -> Result<HeldLock, LockError> {
        let state = self.state();
        match state.slots.iter().find(|s| s.lock.key() == key) {
            Some(slot) => Ok(slot.lock.clone()),
            None => Err(state.missing(key)),
        }
    }

    /// The earliest local expiry among locks the watchdog does not renew.
    pub(crate) fn earliest_expiry(&self) -> Option<tokio::time::Instant> {
        self.state()
            .slots
            .iter()
            .filter(|s| s.watch.is_none())
            .map(|s| s.lock.expiry())
            .min()
    }

    /// Whether any lock of the request is known to be lost (expired by this
    /// process's clock, or found gone by a renewal).
    pub(crate) fn any_lost(&self) -> bool {
        self.state().slots.iter().any(|s| s.lock.is_lost())
    }

    /// Close the registry and start releasing its auto-release locks.
    ///
    /// Returns `None` when everything was released synchronously (the
    /// in-memory backend), else the rest of the work to drive.
    pub(crate) fn release_auto(&self) -> Option<BoxFuture<'static, ()>> {
        self.close_and_release(false)
    }

    /// Close the registry and release every lock, kept ones included (the
    /// request was rejected after taking some of its locks).
    pub(crate) fn release_all(&self) -> Option<BoxFuture<'static, ()>> {
        self.close_and_release(true)
    }

    fn close_and_release(&self, all: bool) -> Option<BoxFuture<'static, ()>> {
        let mut locks = HeldLocks::new();
        {
            let mut state = self.state();
            state.closed = true;
            let mut i = 0;
            while i < state.slots.len() {
                if all || state.slots[i].auto_release {
                    let lock = state.slots.remove(i).retire();
                    state.released.push(lock.key.clone());
                    locks.push(lock);
                } else {
                    i += 1;
                }
            }
        }
        release_now(&self.inner.backend, locks)
    }
}

/// Releases `lock` in a task when dropped still holding it.
struct ReleaseOnDrop<'a> {
    backend: &'a SharedBackend,
    lock: Option<HeldLock>,
}

impl Drop for ReleaseOnDrop<'_> {
    fn drop(&mut self) {
        if let Some(lock) = self.lock.take() {
            release_detached(self.backend, smallvec![lock]);
        }
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        // The last handle on the request's locks is gone without the response
        // having released them (a dropped acquisition, a leaked extension).
        let state = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        if state.closed {
            return;
        }
        let locks: HeldLocks = state.slots.drain(..).map(Slot::retire).collect();
        release_detached(&self.backend, locks);
    }
}

const ONE_LOCK_PER_KEY: &str = "this request already holds a lock with this key (a key names \
     one lock of a request, in route or global scope)";

/// Rejection of the [`Locks`] extractor when the request carries no locks:
/// no [`LockLayer`](crate::LockLayer) runs in front of the handler, or its
/// [`LockRequest`](crate::LockRequest) named no lock for this request (such
/// a request passes through untouched). `500` with code
/// `LOCK_LAYER_MISSING` and a JSON body. A handler whose route locks only
/// some requests extracts `Option<Locks>` instead.
#[derive(Debug, Clone, Copy)]
pub struct MissingLockLayer;

const MISSING_LOCK_LAYER: &str = "no locks for this request: no LockLayer runs in front of \
     this handler, or its LockRequest named no lock for this request (extract \
     Option<Locks> where that is expected)";

impl IntoResponse for MissingLockLayer {
    fn into_response(self) -> Response {
        crate::rejection::json_error(
            http::StatusCode::INTERNAL_SERVER_ERROR,
            "LOCK_LAYER_MISSING",
            MISSING_LOCK_LAYER,
        )
        .map(axum::body::Body::from)
    }
}

impl fmt::Display for MissingLockLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(MISSING_LOCK_LAYER)
    }
}

impl std::error::Error for MissingLockLayer {}

impl<S: Send + Sync> FromRequestParts<S> for Locks {
    type Rejection = MissingLockLayer;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .get::<Locks>()
            .cloned()
            .ok_or(MissingLockLayer)
    }
}

impl<S: Send + Sync> axum::extract::OptionalFromRequestParts<S> for Locks {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut Parts,
        _state: &S,
    ) -> Result<Option<Self>, Self::Rejection> {
        Ok(parts.extensions.get::<Locks>().cloned())
    }
}

/// A lock owned outside any request: from
/// [`Locks::cancel_auto_release`] or [`OwnedLock::acquire`].
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

impl fmt::Debug for OwnedLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OwnedLock")
            .field("lock", &self.lock)
            .field("watchdog", &self.watch.is_some())
            .finish()
    }
}

impl OwnedLock {
    /// Acquire a lock outside any request (e.g. in a job), waiting up to the
    /// spec's max wait. A [`Scope::Route`] spec is namespaced by `route`.
    /// The spec's watchdog setting applies (default off).
    pub async fn acquire(
        backend: SharedBackend,
        spec: &LockSpec,
        route: &str,
    ) -> Result<OwnedLock, LockError> {
        let req = spec.to_request_in(route)?;
        let lock = acquire_guarded(&backend, &req).await?;
        let watch = spec
            .get_watchdog()
            .unwrap_or(false)
            .then(|| watch(&backend, &lock));
        Ok(OwnedLock {
            backend,
            lock,
            released: false,
            watch,
        })
    }

    /// Take over a lock from a [`LockToken`] made by
    /// [`into_token`](OwnedLock::into_token), here or in another process
    /// using the same backend configuration.
    ///
    /// Checks with the backend: [`LockError::NotFound`] if the lock has
    /// expired or was released, [`LockError::OwnershipMismatch`] if someone
    /// else holds it now, or the same owner token holds it under another
    /// fence (a later acquisition by a reused custom owner: the token is
    /// stale).
    ///
    /// The handle's TTL (what [`start_watchdog`](OwnedLock::start_watchdog)
    /// renews by) is the token's original TTL; a token made before tokens
    /// carried it falls back to the time the lock has left.
    pub async fn restore(
        backend: SharedBackend,
        token: &LockToken,
    ) -> Result<OwnedLock, LockError> {
        let key = token.lock_key()?;
        crate::spec::validate_owner(&token.owner)?;
        let sent = tokio::time::Instant::now();
        let status = backend.status(&key).await?.ok_or(LockError::NotFound)?;
        if status.owner != token.owner || status.fence != token.fence {
            return Err(LockError::OwnershipMismatch);
        }
        let ttl = token
            .ttl_ms
            .filter(|&ms| ms > 0)
            .map(Duration::from_millis)
            .unwrap_or(status.ttl_remaining)
            .min(crate::spec::MAX_TTL);
        let lease = Lease {
            fence: status.fence,
            acquired_at: status.acquired_at,
            expires_at: status.expires_at,
            ttl,
        };
        let lock = HeldLock::new(
            key,
            Arc::from(token.owner.as_str()),
            lease,
            sent + status.ttl_remaining,
        );
        Ok(OwnedLock {
            backend,
            lock,
            released: false,
            watch: None,
        })
    }

    /// Turn the handle into a serialisable token (key, scope, owner, fence,
    /// expiry) without releasing the lock: hand it to a job queue, restore
    /// it with [`restore`](OwnedLock::restore). Renewals by this process's
    /// watchdog stop.
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
            self.watch = Some(watch(&self.backend, &self.lock));
        }
    }

    /// Release the lock (checked against the owner token).
    pub async fn release(mut self) -> Result<(), LockError> {
        self.watch = None;
        self.lock.finish();
        let result = match self
            .backend
            .try_release_now(&self.lock.key, &self.lock.owner)
        {
            Some(result) => result,
            None => self.backend.release(&self.lock.key, &self.lock.owner).await,
        };
        // Answered, either way. Dropped before (task aborted, `select!`),
        // `Drop` releases in a task instead.
        self.released = true;
        result
    }

    /// Set the remaining TTL to `ttl` (never revives an expired lock:
    /// [`LockError::NotFound`] then).
    pub async fn extend(&mut self, ttl: Duration) -> Result<(), LockError> {
        // Never beside a watchdog renewal of the same lock (see `extending`).
        let _gate = self.lock.lost_signal().extending().await;
        let sent = tokio::time::Instant::now();
        let lease = self
            .backend
            .extend(&self.lock.key, &self.lock.owner, ttl)
            .await?;
        self.lock.lease = lease;
        self.lock.set_expiry(sent + ttl);
        if let Some(w) = &self.watch {
            w.set_ttl(ttl);
        }
        Ok(())
    }

    /// Ask the backend who holds this lock now.
    pub async fn status(&self) -> Result<Option<LockStatus>, LockError> {
        self.backend.status(&self.lock.key).await
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

/// A held lock as data, to move it between processes (serde).
///
/// Made by [`OwnedLock::into_token`], taken back by [`OwnedLock::restore`].
/// The owner token inside is the credential to release the lock: treat the
/// token like a secret.
///
/// Releasing the same token twice: the second release answers
/// [`LockError::NotFound`] on both built-in backends (they do not keep
/// tombstones of released locks); an [`OwnedLock`] itself cannot be released
/// twice, and [`Locks::release`] answers [`LockError::AlreadyReleased`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockToken {
    /// The user's key.
    pub key: String,
    /// The route pattern of a route-scoped lock; `None` for global.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route: Option<String>,
    /// The owner token.
    pub owner: String,
    /// The fencing token of the acquisition.
    pub fence: u64,
    /// Expiry when the token was made, in milliseconds since the Unix epoch.
    pub expires_at_ms: u64,
    /// The TTL the lock was taken (or last extended) with, in milliseconds:
    /// what a watchdog started after [`OwnedLock::restore`] renews it by.
    /// Absent in tokens from before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
}

impl LockToken {
    fn from_lock(lock: &HeldLock) -> Self {
        LockToken {
            key: lock.key().to_owned(),
            route: lock.key.route_pattern().map(str::to_owned),
            owner: lock.owner().to_owned(),
            fence: lock.fence(),
            expires_at_ms: unix_ms(lock.expires_at()),
            ttl_ms: Some(u64::try_from(lock.ttl().as_millis()).unwrap_or(u64::MAX)),
        }
    }

    /// The validated key this token names.
    pub fn lock_key(&self) -> Result<LockKey, LockError> {
        match &self.route {
            None => LockKey::global(&self.key),
            Some(route) => LockKey::route(route, &self.key),
        }
    }

    /// The scope of the lock.
    pub fn scope(&self) -> Scope {
        if self.route.is_some() {
            Scope::Route
        } else {
            Scope::Global
        }
    }
}

/// Milliseconds since the Unix epoch (0 before it).
pub(crate) fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn watch(backend: &SharedBackend, lock: &HeldLock) -> WatchHandle {
    Watchdog::for_backend(backend).watch(
        lock.key.clone(),
        lock.owner.clone(),
        lock.ttl(),
        lock.lost_signal().clone(),
    )
}

/// Take the lock described by `req` at once, if the backend can answer
/// without waiting or I/O (see [`LockBackend::try_acquire_now`]).
pub(crate) fn acquire_now(
    backend: &SharedBackend,
    req: &AcquireRequest,
) -> Option<Result<HeldLock, LockError>> {
    let sent = tokio::time::Instant::now();
    let result = backend.try_acquire_now(req)?;
    Some(acquired(req, result, sent))
}

/// The outcome of an acquisition, traced; `started` is when the lock's TTL
/// began at the earliest.
fn acquired(
    req: &AcquireRequest,
    result: Result<Lease, LockError>,
    started: tokio::time::Instant,
) -> Result<HeldLock, LockError> {
    match &result {
        Ok(lease) => tracing::debug!(
            key = %req.key().digest(),
            fence = lease.fence,
            "lock acquired"
        ),
        Err(e) => tracing::debug!(key = %req.key().digest(), code = e.code(), "lock not acquired"),
    }
    result.map(|lease| {
        let expiry = started + lease.ttl;
        HeldLock::new(req.key().clone(), req.owner_arc().clone(), lease, expiry)
    })
}

/// Acquire, and if this future is dropped while the backend call is in
/// flight, or the call fails with [`LockError::BackendUnavailable`], release
/// best-effort with the owner token: a request that was cancelled, or whose
/// reply was lost, may still have taken the lock on the server. Only for a
/// token generated for this call (see [`AcquireRequest`]'s `fresh_owner`).
pub(crate) async fn acquire_guarded(
    backend: &SharedBackend,
    req: &AcquireRequest,
) -> Result<HeldLock, LockError> {
    if let Some(result) = acquire_now(backend, req) {
        return result;
    }
    struct InFlight<'a> {
        backend: &'a SharedBackend,
        req: &'a AcquireRequest,
        done: bool,
    }
    impl Drop for InFlight<'_> {
        fn drop(&mut self) {
            if !self.done {
                let backend = self.backend.clone();
                let key = self.req.key().clone();
                let owner = self.req.owner_arc().clone();
                run_detached(Box::pin(async move {
                    let _ = backend.release(&key, &owner).await;
                }));
            }
        }
    }
    // Only a token made for this call: a caller's own token may hold the
    // lock already (acquire is idempotent for it), or again by the time a
    // release would land (a retry).
    let mut guard = InFlight {
        backend,
        req,
        done: !req.has_fresh_owner(),
    };
    let sent = tokio::time::Instant::now();
    let acquire = backend.acquire(req);
    // The span only when someone listens: building one costs more than an
    // in-memory acquisition.
    let result = if tracing::enabled!(tracing::Level::DEBUG) {
        let span = tracing::debug_span!(
            "tower_lock.acquire",
            key = %req.key().digest(),
            max_wait_ms = req.max_wait().as_millis() as u64
        );
        tracing::Instrument::instrument(acquire, span).await
    } else {
        acquire.await
    };
    // An unreachable backend may still have taken the lock (the reply came
    // after the op timeout, or the connection broke after sending): the
    // guard releases it with the owner token, as for a dropped call.
    guard.done |= !matches!(result, Err(LockError::BackendUnavailable(_)));
    drop(guard);
    // The lock's TTL started between sending and now. Without waiting, the
    // send time is the safe (early) estimate. After a wait it started when
    // the lock was handed over, which the lease dates.
    let started = match &result {
        Ok(lease) if !req.max_wait().is_zero() => ttl_start(
            sent,
            tokio::time::Instant::now(),
            SystemTime::now(),
            lease.acquired_at,
        ),
        _ => sent,
    };
    acquired(req, result, started)
}

/// When a lock granted after a wait started its TTL, by this process's
/// clock: `now` less the lease's age by the wall clock, kept between `sent`
/// and `now`. A backend on another machine dates the lease by its own clock:
/// if that runs behind, the estimate errs early (the safe side), bounded by
/// `sent`; if ahead, it falls back to `now`, late by at most the delivery.
fn ttl_start(
    sent: tokio::time::Instant,
    now: tokio::time::Instant,
    wall_now: SystemTime,
    acquired_at: SystemTime,
) -> tokio::time::Instant {
    let age = wall_now.duration_since(acquired_at).unwrap_or_default();
    now.checked_sub(age)
        .map_or(sent, |start| start.clamp(sent, now))
}

/// Release `locks` now: returns `None` if that finished synchronously, else
/// the remaining work.
fn release_now(backend: &SharedBackend, mut locks: HeldLocks) -> Option<BoxFuture<'static, ()>> {
    // What the backend can release at once (in memory: everything) goes
    // without a future.
    locks.retain(
        |lock| match backend.try_release_now(&lock.key, &lock.owner) {
            Some(result) => {
                released(&lock.key, result);
                false
            }
            None => true,
        },
    );
    if locks.is_empty() {
        return None;
    }
    let backend = backend.clone();
    poll_once(Box::pin(async move {
        for lock in locks {
            released(&lock.key, backend.release(&lock.key, &lock.owner).await);
        }
    }))
}

/// Trace the outcome of an automatic release.
fn released(key: &LockKey, result: Result<(), LockError>) {
    match result {
        Ok(()) => tracing::debug!(key = %key.digest(), "lock released"),
        Err(e) => tracing::warn!(
            key = %key.digest(),
            code = e.code(),
            error = %e,
            "lock release failed; the lock will be freed by its TTL"
        ),
    }
}

/// Poll `fut` once: backends that answer synchronously (in memory) finish
/// here, without a task or a wake-up; others return the remaining work.
fn poll_once(mut fut: BoxFuture<'static, ()>) -> Option<BoxFuture<'static, ()>> {
    if tokio::runtime::Handle::try_current().is_err() {
        // A remote backend's future would need the runtime's timers and I/O.
        tracing::warn!("no tokio runtime to release a lock on; it will be freed by its TTL");
        return None;
    }
    let mut cx = Context::from_waker(std::task::Waker::noop());
    match fut.as_mut().poll(&mut cx) {
        Poll::Ready(()) => None,
        Poll::Pending => Some(fut),
    }
}

/// Release `locks` without anyone waiting for it (from `Drop`).
fn release_detached(backend: &SharedBackend, locks: HeldLocks) {
    if let Some(fut) = release_now(backend, locks) {
        spawn_or_warn(fut);
    }
}

/// Drive the rest of a started release in the background.
pub(crate) fn release_detached_future(fut: BoxFuture<'static, ()>) {
    spawn_or_warn(fut);
}

/// Drive `fut` to completion in the background.
pub(crate) fn run_detached(fut: BoxFuture<'static, ()>) {
    if let Some(fut) = poll_once(fut) {
        spawn_or_warn(fut);
    }
}

fn spawn_or_warn(fut: BoxFuture<'static, ()>) {
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => {
            handle.spawn(fut);
        }
        Err(_) => {
            tracing::warn!("no tokio runtime to release a lock on; it will be freed by its TTL")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::Instant;

    #[test]
    fn ttl_start_after_a_wait_is_dated_by_the_lease() {
        let sent = Instant::now();
        let now = sent + Duration::from_secs(10);
        let wall = SystemTime::now();
        let at = |age_ms: u64| ttl_start(sent, now, wall, wall - Duration::from_millis(age_ms));
        // Handed over 3 ms before the reply was read: 3 ms before now.
        assert_eq!(at(3), now - Duration::from_millis(3));
        // Never before the request was sent, never after now.
        assert_eq!(at(60_000), sent);
        assert_eq!(
            ttl_start(sent, now, wall, wall + Duration::from_secs(1)),
            now
        );
    }
}
