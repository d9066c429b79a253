//! The lost-lock signal ([`LostSignal`]) and the watchdog that renews locks
//! while they are held.
//!
//! One watchdog task runs per backend (only while it has locks to watch).
//! Each lock is extended by its TTL every TTL/3; locks falling due close
//! together are renewed in one [`LockBackend::extend_many`] call, so a tick
//! costs one round trip however many locks are watched. An extension only
//! ever updates a lock its owner still holds (it never re-creates one), so an
//! extension racing a release cannot resurrect the lock.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::backend::{ExtendRequest, SharedBackend};
use crate::error::LockError;
use crate::key::LockKey;

struct LostState {
    lost: AtomicBool,
    done: AtomicBool,
    // Tasks inside `lost()`: without any, changes need not wake anyone.
    listeners: AtomicUsize,
    notify: Notify,
    expiry: Mutex<Instant>,
    // Held for the whole round trip of an extension, by the watchdog and by
    // the holder's own `extend`: two extensions of one lock never overlap,
    // so the one that finishes last is the one the backend kept, and the
    // expiry recorded here is always the one the backend was told.
    gate: Arc<tokio::sync::Mutex<()>>,
}

/// Tells a holder that its lock is gone: taken over after expiry, released
/// by someone else (force release), or not renewed before its TTL ran out.
///
/// [`is_lost`](LostSignal::is_lost) is a cheap check for loops;
/// [`lost`](LostSignal::lost) resolves when it happens, for `tokio::select!`:
///
/// ```
/// # async fn work() {}
/// # async fn example(lock: tower_lock::HeldLock) -> Result<(), &'static str> {
/// tokio::select! {
///     _ = lock.lost() => Err("lock lost: aborting before writing"),
///     out = work() => Ok(out),
/// }
/// # }
/// ```
///
/// Once the lock is released by its holder the signal goes quiet: a loss
/// that had happened by then stays visible to every copy (`lost()` resolves,
/// `is_lost()` is `true`), and nothing later counts as one (`lost()` then
/// never resolves, `is_lost()` stays `false`).
#[derive(Clone)]
pub struct LostSignal(Arc<LostState>);

impl fmt::Debug for LostSignal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LostSignal")
            .field("lost", &self.is_lost())
            .finish()
    }
}

impl LostSignal {
    pub(crate) fn new(expiry: Instant) -> Self {
        LostSignal(Arc::new(LostState {
            lost: AtomicBool::new(false),
            done: AtomicBool::new(false),
            listeners: AtomicUsize::new(0),
            notify: Notify::new(),
            expiry: Mutex::new(expiry),
            gate: Arc::default(),
        }))
    }

    /// Hold this across an extension's round trip (see `LostState::gate`).
    pub(crate) async fn extending(&self) -> tokio::sync::OwnedMutexGuard<()> {
        self.0.gate.clone().lock_owned().await
    }

    pub(crate) fn expiry(&self) -> Instant {
        *self.0.expiry.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the lock is known to be lost, or its TTL has passed without
    /// a successful extension (by this process's clock).
    pub fn is_lost(&self) -> bool {
        if self.0.lost.load(Ordering::SeqCst) {
            return true;
        }
        !self.0.done.load(Ordering::SeqCst) && Instant::now() >= self.expiry()
    }

    /// Resolves when the lock is lost (see [`is_lost`](LostSignal::is_lost)).
    /// Cancel-safe.
    pub async fn lost(&self) {
        struct Listening<'a>(&'a AtomicUsize);
        impl Drop for Listening<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        self.0.listeners.fetch_add(1, Ordering::SeqCst);
        let _listening = Listening(&self.0.listeners);
        loop {
            let notified = self.0.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.0.lost.load(Ordering::SeqCst) {
                return;
            }
            if self.0.done.load(Ordering::SeqCst) {
                return std::future::pending().await;
            }
            let expiry = self.expiry();
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep_until(expiry) => {
                    if !self.0.done.load(Ordering::SeqCst) && Instant::now() >= self.expiry() {
                        self.mark_lost();
                        return;
                    }
                }
            }
        }
    }

    pub(crate) fn mark_lost(&self) {
        if !self.0.done.load(Ordering::SeqCst) {
            self.0.lost.store(true, Ordering::SeqCst);
            self.wake();
        }
    }

    pub(crate) fn set_expiry(&self, expiry: Instant) {
        *self.0.expiry.lock().unwrap_or_else(|e| e.into_inner()) = expiry;
        self.wake();
    }

    /// The holder released the lock: nothing more to signal. A lock whose
    /// TTL had passed by then was lost all the same, and stays so.
    pub(crate) fn finish(&self) {
        if !self.0.done.load(Ordering::SeqCst) && Instant::now() >= self.expiry() {
            self.0.lost.store(true, Ordering::SeqCst);
        }
        self.0.done.store(true, Ordering::SeqCst);
        self.wake();
    }

    fn wake(&self) {
        // Both sides are SeqCst: a listener counts itself, then reads the
        // state; a writer writes the state, then reads the count. So either
        // the writer sees the listener, or the listener sees the new state
        // (its `Notified` is enabled before it looks).
        if self.0.listeners.load(Ordering::SeqCst) > 0 {
            self.0.notify.notify_waiters();
        }
    }
}

struct Watched {
    key: LockKey,
    owner: Arc<str>,
    ttl: Duration,
    due: Instant,
    signal: LostSignal,
}

#[derive(Default)]
struct DogState {
    entries: HashMap<u64, Watched>,
    next_id: u64,
    running: bool,
}

/// Renews watched locks of one backend.
pub(crate) struct Watchdog {
    backend: SharedBackend,
    state: Mutex<DogState>,
    wake: Notify,
}

/// Keeps a lock watched; dropping it stops the renewals (before a release).
pub(crate) struct WatchHandle {
    dog: Arc<Watchdog>,
    id: u64,
}

impl fmt::Debug for WatchHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WatchHandle").field("id", &self.id).finish()
    }
}

impl Drop for WatchHandle {
    fn drop(&mut self) {
        self.dog.state().entries.remove(&self.id);
    }
}

impl WatchHandle {
    /// The holder extended by hand: renew relative to that.
    pub(crate) fn set_ttl(&self, ttl: Duration) {
        if let Some(e) = self.dog.state().entries.get_mut(&self.id) {
            e.ttl = ttl;
            e.due = Instant::now() + ttl / 3;
        }
        self.dog.wake.notify_one();
    }
}

/// Watchdogs by backend identity (the shared backend's address).
type DogRegistry = Vec<(usize, Weak<Watchdog>)>;

fn registry() -> MutexGuard<'static, DogRegistry> {
    static DOGS: OnceLock<Mutex<DogRegistry>> = OnceLock::new();
    DOGS.get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

impl Watchdog {
    /// The watchdog of this backend (one per shared backend instance).
    pub(crate) fn for_backend(backend: &SharedBackend) -> Arc<Watchdog> {
        let id = Arc::as_ptr(backend) as *const () as usize;
        let mut dogs = registry();
        dogs.retain(|(_, w)| w.strong_count() > 0);
        if let Some(dog) = dogs
            .iter()
            .find(|(k, _)| *k == id)
            .and_then(|(_, w)| w.upgrade())
        {
            return dog;
        }
        let dog = Arc::new(Watchdog {
            backend: backend.clone(),
            state: Mutex::default(),
            wake: Notify::new(),
        });
        dogs.push((id, Arc::downgrade(&dog)));
        dog
    }

    fn state(&self) -> MutexGuard<'_, DogState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Start renewing `key` every `ttl / 3`.
    pub(crate) fn watch(
        self: &Arc<Self>,
        key: LockKey,
        owner: Arc<str>,
        ttl: Duration,
        signal: LostSignal,
    ) -> WatchHandle {
        // A third of the TTL after the lock's last acquisition or extension,
        // as the lock's expiry says: a lock that has less left than that
        // (restored from a token, extended to less) is renewed sooner.
        let now = Instant::now();
        let due = signal
            .expiry()
            .checked_sub(ttl - ttl / 3)
            .map_or(now, |due| due.max(now));
        let mut state = self.state();
        let id = state.next_id;
        state.next_id += 1;
        state.entries.insert(
            id,
            Watched {
                key,
                owner,
                ttl,
                due,
                signal,
            },
        );
        if state.running {
            self.wake.notify_one();
        } else {
            state.running = true;
            let dog = self.clone();
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => {
                    rt.spawn(dog.run());
                }
                Err(_) => {
                    state.running = false;
                    tracing::warn!("no tokio runtime: lock renewals are off");
                }
            }
        }
        WatchHandle {
            dog: self.clone(),
            id,
        }
    }

    async fn run(self: Arc<Self>) {
        loop {
            let (ids, batch, gates, next) = {
                let mut state = self.state();
                if state.entries.is_empty() {
                    state.running = false;
                    return;
                }
                let now = Instant::now();
                let mut ids = Vec::new();
                let mut batch = Vec::new();
                let mut gates = Vec::new();
                let mut next: Option<Instant> = None;
                for (id, e) in &mut state.entries {
                    // Renew a little early to share a round trip with others.
                    if e.due <= now + e.ttl / 12 {
                        match e.signal.0.gate.clone().try_lock_owned() {
                            Ok(gate) => {
                                ids.push(*id);
                                gates.push(gate);
                                batch.push(ExtendRequest {
                                    key: e.key.clone(),
                                    owner: e.owner.clone(),
                                    ttl: e.ttl,
                                });
                                continue;
                            }
                            // The holder is extending it by hand, which
                            // renews it; look again shortly.
                            Err(_) => e.due = now + (e.ttl / 10).max(Duration::from_millis(5)),
                        }
                    }
                    next = Some(next.map_or(e.due, |n| n.min(e.due)));
                }
                (ids, batch, gates, next)
            };
            if batch.is_empty() {
                let wake_at = next.unwrap_or_else(|| Instant::now() + Duration::from_secs(1));
                tokio::select! {
                    _ = tokio::time::sleep_until(wake_at) => {}
                    _ = self.wake.notified() => {}
                }
                continue;
            }
            let sent = Instant::now();
            let results = self.backend.extend_many(&batch).await;
            let mut state = self.state();
            for (i, id) in ids.iter().enumerate() {
                let Some(e) = state.entries.get_mut(id) else {
                    continue; // released meanwhile: the result means nothing
                };
                let result = results
                    .get(i)
                    .cloned()
                    .unwrap_or(Err(LockError::BackendUnavailable("no result".into())));
                match result {
                    Ok(_) => {
                        // What the backend was told, which `e.ttl` still is:
                        // a change by hand waits for the gate.
                        let ttl = batch[i].ttl;
                        e.due = sent + ttl / 3;
                        e.signal.set_expiry(sent + ttl);
                    }
                    Err(LockError::NotFound | LockError::OwnershipMismatch) => {
                        tracing::warn!(key = %e.key.digest(), "lock lost: renewal found it gone");
                        e.signal.mark_lost();
                        state.entries.remove(id);
                    }
                    Err(err) => {
                        if e.signal.is_lost() {
                            tracing::warn!(key = %e.key.digest(), "lock lost: TTL passed without renewal");
                            e.signal.mark_lost();
                            state.entries.remove(id);
                        } else {
                            tracing::debug!(key = %e.key.digest(), code = err.code(), "renewal failed; retrying");
                            e.due = Instant::now() + (e.ttl / 10).max(Duration::from_millis(5));
                        }
                    }
                }
            }
            drop(state);
            drop(gates);
        }
    }
}
