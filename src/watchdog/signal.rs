//! [`LostSignal`]: tells a holder that its lock is gone.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;
use tokio::time::Instant;

pub(super) struct LostState {
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
    pub(super) gate: Arc<tokio::sync::Mutex<()>>,
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
pub struct LostSignal(pub(super) Arc<LostState>);

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
