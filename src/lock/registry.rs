//! [`Locks`]: the locks of one request, in its extensions; also the axum
//! extractor that hands them to handlers.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use smallvec::{SmallVec, smallvec};
use smol_str::SmolStr;

use super::acquire::acquire_guarded;
use super::release::{Finish, HeldLocks, release, release_detached, release_one};
use super::{HeldLock, OwnedLock};
use crate::backend::{LockStatus, SharedBackend};
use crate::error::LockError;
use crate::key::{LockKey, nfc};
use crate::observe::{self, Meter};
use crate::spec::LockSpec;
use crate::watchdog::WatchHandle;

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

/// What a layer decides for every lock of its requests.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Defaults {
    /// Renew locks whose spec does not say.
    pub(crate) watchdog: bool,
    /// Describe every lock in response headers, not only kept ones.
    pub(crate) lock_headers: bool,
}

struct Registry {
    backend: SharedBackend,
    route: SmolStr,
    defaults: Defaults,
    // Labels for the locks this request takes (nothing without `metrics`).
    meter: Meter,
    state: Mutex<RegistryState>,
}

#[derive(Default)]
struct RegistryState {
    // Inline for the common single lock: no allocation.
    slots: SmallVec<[Slot; 1]>,
    // Keys this request released by hand, so that a later call on them says
    // so (`LOCK_ALREADY_RELEASED`). Once the registry is closed (its response
    // released the locks) every call says so, without a list.
    released: SmallVec<[LockKey; 1]>,
    // Keys of `Locks::acquire` calls under way (NFC), so that two at once
    // on one key are refused as one after the other is.
    acquiring: Vec<String>,
    closed: bool,
    // The response's head was built (`described`): a lock kept after the
    // response can no longer reach the client in it.
    answered: bool,
}

impl RegistryState {
    /// Whether a lock with this auto-release setting is refused because it
    /// would be kept after a response whose head was built already (its
    /// owner token would reach nobody: held by nobody until its TTL).
    fn refuses_kept(&self, auto_release: bool) -> bool {
        self.answered && !auto_release
    }

    /// The error for `key`, which no slot holds: released by this request
    /// (by hand, or with its response), or never held by it.
    fn missing(&self, key: &str) -> LockError {
        if self.closed || self.released.iter().any(|k| k.key() == key) {
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
/// background job. Its methods name a lock by its user key, spelt any way
/// Unicode allows: compared in NFC, the form the lock was taken in.
///
/// ```
/// use std::time::Duration;
/// use tower_lock::{Locks, LockSpec};
///
/// async fn handler(locks: Locks) -> String {
///     let order = locks.get("order:1").map(|l| l.fence());
///     // A second lock, released together with the first after the response.
///     let audit = locks
///         .acquire(LockSpec::global("audit", Duration::from_secs(5)))
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
    pub(crate) fn new(
        backend: SharedBackend,
        route: SmolStr,
        defaults: Defaults,
        meter: Meter,
    ) -> Self {
        Locks {
            inner: Arc::new(Registry {
                backend,
                route,
                defaults,
                meter,
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
        let key = &*nfc(key);
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

    /// The locks to describe in the response's headers, and whether each
    /// is kept after the response (auto-release off): only kept ones,
    /// unless the layer describes every lock. From then on no lock may be
    /// registered as kept (see `register`).
    pub(crate) fn described(&self) -> Vec<(HeldLock, bool)> {
        let all = self.inner.defaults.lock_headers;
        let mut state = self.state();
        state.answered = true;
        state
            .slots
            .iter()
            .filter(|s| all || !s.auto_release)
            .map(|s| (s.lock.clone(), !s.auto_release))
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
            .unwrap_or(self.inner.defaults.watchdog)
            .then(|| lock.watch(&self.inner.backend));
        let mut state = self.state();
        // Kept after a response whose head was built already (a lock taken
        // while the body streams), its owner token would reach nobody: held
        // by nobody until its TTL. Refused (`cancel_auto_release` hands a
        // lock on to a job in this process).
        if state.closed || state.refuses_kept(auto_release) {
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
    /// ended and the request's locks were released, and for a spec that
    /// turns auto-release off once the handler has answered (a lock taken
    /// while the body streams): its owner token could no longer reach the
    /// client in the response's headers. To hand such a lock to a job, take
    /// it with auto-release and [`cancel_auto_release`](Locks::cancel_auto_release) it.
    pub async fn acquire(&self, spec: LockSpec) -> Result<HeldLock, LockError> {
        // (Compared as stored: NFC, as every other method compares.)
        let key = nfc(spec.get_key()).into_owned();
        {
            let mut state = self.state();
            // (Kept after an answer: refused before any wait, see
            // `register`, which decides.)
            if state.closed || state.refuses_kept(spec.get_auto_release()) {
                return Err(LockError::AlreadyReleased);
            }
            // `get`, `release`, `extend` and `cancel_auto_release` name a
            // lock by its key: one key must name one lock of the request,
            // also while it is being acquired.
            let taken = state.acquiring.contains(&key);
            if taken || state.slots.iter().any(|s| s.lock.key() == key) {
                return Err(LockError::InvalidKey(ONE_LOCK_PER_KEY));
            }
            state.acquiring.push(key.clone());
        }
        // Until registered (or failed, or dropped), the key is taken.
        let _acquiring = Acquiring(self, key);
        let meter = &self.inner.meter;
        let req = spec
            .to_request(&self.inner.route)
            .inspect_err(|e| meter.acquisition(observe::error_outcome(e), None))?;
        let lock = acquire_guarded(&self.inner.backend, &req, meter).await?;
        match self.register(lock.clone(), spec.get_auto_release(), spec.get_watchdog()) {
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
        let key = &*nfc(key);
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
        release_one(&self.inner.backend, &lock).await
    }

    /// Release every lock this request holds now, kept ones
    /// (auto-release off) included: the guide's `releaseAll`. Returns how
    /// many were released; the first error, if any, after trying them all.
    ///
    /// Each is released as [`release`](Locks::release) would (a lock with a
    /// [minimum hold](crate::LockSpec::min_hold) is kept until it ends), and a
    /// later call on one of them says [`LockError::AlreadyReleased`]. The
    /// request can still [`acquire`](Locks::acquire) more.
    ///
    /// ```
    /// use tower_lock::Locks;
    ///
    /// async fn handler(locks: Locks) -> String {
    ///     // ... the work the locks protect is done; free them before the slow part.
    ///     let released = locks.release_all().await.unwrap_or(0);
    ///     format!("released {released}")
    /// }
    /// # let _ = handler;
    /// ```
    pub async fn release_all(&self) -> Result<usize, LockError> {
        let locks: HeldLocks = {
            let mut state = self.state();
            let slots: Vec<Slot> = state.slots.drain(..).collect();
            let locks: HeldLocks = slots.into_iter().map(Slot::retire).collect();
            let keys: Vec<LockKey> = locks.iter().map(|l| l.key.clone()).collect();
            state.released.extend(keys);
            locks
        };
        let results = crate::backend::join_all(
            locks
                .iter()
                .map(|lock| release_one(&self.inner.backend, lock))
                .collect(),
        )
        .await;
        let n = results.len();
        results.into_iter().collect::<Result<Vec<()>, _>>()?;
        Ok(n)
    }

    /// Stop releasing this lock with the response and get an owned handle
    /// to it, e.g. to move into `tokio::spawn`. The job then releases or
    /// extends it; dropping the handle releases it.
    ///
    /// `None` if this request holds no lock with that key.
    pub fn cancel_auto_release(&self, key: &str) -> Option<OwnedLock> {
        let key = &*nfc(key);
        let mut state = self.state();
        let i = state.slots.iter().position(|s| s.lock.key() == key)?;
        let slot = state.slots.remove(i);
        Some(OwnedLock::from_parts(
            self.inner.backend.clone(),
            slot.lock,
            slot.watch,
        ))
    }

    /// Set the remaining TTL of one of this request's locks.
    ///
    /// [`LockError::AlreadyReleased`] once this request released it (by
    /// hand, or with its response), [`LockError::NotFound`] if it never held
    /// it.
    pub async fn extend(&self, key: &str, ttl: Duration) -> Result<HeldLock, LockError> {
        let lock = self.lookup(key)?;
        lock.extend_on(&self.inner.backend, ttl, |lease, end| {
            let mut state = self.state();
            // The acquisition this extended, not any lock of the key:
            // released and taken again meanwhile, the key's slot holds
            // another one.
            let slot = state.slots.iter_mut().find(|s| {
                s.lock.key == lock.key
                    && s.lock.lease.fence == lock.lease.fence
                    && s.lock.owner == lock.owner
            });
            match slot {
                Some(slot) => {
                    slot.lock.lease = lease;
                    slot.lock.set_expiry(end);
                    if let Some(w) = &slot.watch {
                        w.set_ttl(ttl);
                    }
                    Ok(slot.lock.clone())
                }
                None => {
                    // Released, or handed to an owned handle meanwhile:
                    // that handle shares the lost signal, which learns the
                    // new end.
                    let mut lock = lock.clone();
                    lock.set_expiry(end);
                    Err(LockError::AlreadyReleased)
                }
            }
        })
        .await?
    }

    /// Ask the backend who holds this request's lock `key` now.
    pub async fn status(&self, key: &str) -> Result<Option<LockStatus>, LockError> {
        let lock = self.lookup(key)?;
        self.inner.backend.status(&lock.key).await
    }

    /// The held lock `key`, or why there is none.
    fn lookup(&self, key: &str) -> Result<HeldLock, LockError> {
        let key = &*nfc(key);
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

    /// Count every lock of the request known to be lost (metrics).
    pub(crate) fn record_lost(&self) {
        for slot in self.state().slots.iter().filter(|s| s.lock.is_lost()) {
            slot.lock.meter.lost();
        }
    }

    /// Close the registry and start releasing its auto-release locks.
    ///
    /// Returns `None` when everything was released synchronously (the
    /// in-memory backend), else the rest of the work to drive.
    pub(crate) fn release_auto(&self) -> Option<Finish<()>> {
        self.close_and_release(false)
    }

    /// Close the registry and release every lock, kept ones included (the
    /// request was rejected after taking some of its locks).
    pub(crate) fn close_and_release_all(&self) -> Option<Finish<()>> {
        self.close_and_release(true)
    }

    fn close_and_release(&self, all: bool) -> Option<Finish<()>> {
        let mut locks = HeldLocks::new();
        {
            let mut state = self.state();
            state.closed = true;
            let mut i = 0;
            while i < state.slots.len() {
                if all || state.slots[i].auto_release {
                    locks.push(state.slots.remove(i).retire());
                } else {
                    i += 1;
                }
            }
        }
        release(&self.inner.backend, locks)
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

/// A `Locks::acquire` call under way on its key: dropped, the key is free
/// for another.
struct Acquiring<'a>(&'a Locks, String);

impl Drop for Acquiring<'_> {
    fn drop(&mut self) {
        let mut state = self.0.state();
        if let Some(i) = state.acquiring.iter().position(|k| *k == self.1) {
            state.acquiring.swap_remove(i);
        }
    }
}

const ONE_LOCK_PER_KEY: &str = "this request already holds a lock with this key (a key names \
     one lock of a request, in route or global scope)";
