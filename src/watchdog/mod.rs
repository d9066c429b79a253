//! The lost-lock signal ([`LostSignal`]) and the watchdog that renews locks
//! while they are held.
//!
//! One watchdog per backend handle ([`SharedBackend`](crate::SharedBackend):
//! clones share it); its task runs only while it has locks to watch.
//! Each lock is extended by its TTL every TTL/3; locks falling due close
//! together are renewed in one [`LockBackend::extend_many`] call, so a tick
//! costs one round trip however many locks are watched. An extension only
//! ever updates a lock its owner still holds (it never re-creates one), so an
//! extension racing a release cannot resurrect the lock.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::backend::{ExtendRequest, LockBackend};
use crate::key::LockKey;
use crate::observe::Meter;

mod renew;
mod signal;

pub use signal::LostSignal;

struct Watched {
    key: LockKey,
    owner: Arc<str>,
    fence: u64,
    ttl: Duration,
    due: Instant,
    /// A renewal of it is in flight.
    renewing: bool,
    signal: LostSignal,
    meter: Meter,
}

#[derive(Default)]
struct DogState {
    entries: HashMap<u64, Watched>,
    next_id: u64,
    running: bool,
}

/// Renews the watched locks of one backend handle ([`SharedBackend`]); its
/// task runs only while it has locks to watch.
///
/// [`SharedBackend`]: crate::SharedBackend
#[derive(Clone)]
pub(crate) struct Watchdog(Arc<Dog>);

struct Dog {
    backend: Arc<dyn LockBackend>,
    state: Mutex<DogState>,
    wake: Notify,
}

/// Keeps a lock watched; dropping it stops the renewals (before a release).
pub(crate) struct WatchHandle {
    dog: Arc<Dog>,
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

impl Watchdog {
    /// A watchdog renewing locks of `backend`.
    pub(crate) fn new(backend: Arc<dyn LockBackend>) -> Self {
        Watchdog(Arc::new(Dog {
            backend,
            state: Mutex::default(),
            wake: Notify::new(),
        }))
    }

    /// Start renewing `owner`'s acquisition `fence` of `key` every `ttl / 3`.
    pub(crate) fn watch(
        &self,
        key: LockKey,
        owner: Arc<str>,
        fence: u64,
        ttl: Duration,
        signal: LostSignal,
        meter: Meter,
    ) -> WatchHandle {
        self.0.watch(Watched {
            key,
            owner,
            fence,
            ttl,
            due: Instant::now(),
            renewing: false,
            signal,
            meter,
        })
    }
}

impl Dog {
    fn state(&self) -> MutexGuard<'_, DogState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Start renewing `watched` every `ttl / 3`.
    fn watch(self: &Arc<Self>, mut watched: Watched) -> WatchHandle {
        // A third of the TTL after the lock's last acquisition or extension,
        // as the lock's expiry says: a lock that has less left than that
        // (restored from a token, extended to less) is renewed sooner.
        let now = Instant::now();
        let ttl = watched.ttl;
        watched.due = watched
            .signal
            .expiry()
            .checked_sub(ttl - ttl / 3)
            .map_or(now, |due| due.max(now));
        let mut state = self.state();
        let id = state.next_id;
        state.next_id += 1;
        state.entries.insert(id, watched);
        if state.running {
            self.wake.notify_one();
        } else {
            state.running = true;
            let dog = Arc::clone(self);
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
            let (due, next) = {
                let mut state = self.state();
                if state.entries.is_empty() {
                    state.running = false;
                    return;
                }
                let now = Instant::now();
                let mut due = Vec::new();
                let mut next: Option<Instant> = None;
                for (id, e) in &mut state.entries {
                    if e.renewing {
                        // Its renewal is in flight; its answer wakes us.
                        continue;
                    }
                    // Renew a little early to share a round trip with others.
                    if e.due <= now + e.ttl / 12 {
                        match e.signal.0.gate.clone().try_lock_owned() {
                            Ok(gate) => {
                                e.renewing = true;
                                due.push(renew::Due {
                                    id: *id,
                                    gate,
                                    expiry: e.signal.expiry(),
                                    req: ExtendRequest {
                                        key: e.key.clone(),
                                        owner: e.owner.clone(),
                                        fence: e.fence,
                                        ttl: e.ttl,
                                    },
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
                (due, next)
            };
            if !due.is_empty() {
                // In a task of its own: a slow round trip must not hold
                // back the next locks falling due.
                tokio::spawn(Arc::clone(&self).renew(due));
                continue;
            }
            let wake_at = next.unwrap_or_else(|| Instant::now() + Duration::from_secs(1));
            tokio::select! {
                _ = tokio::time::sleep_until(wake_at) => {}
                _ = self.wake.notified() => {}
            }
        }
    }
}
