//! [`HeldLock`]: what is known of a lock that is held, and its lost signal.

use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use crate::backend::{Holder, Lease, SharedBackend};
use crate::key::LockKey;
use crate::metadata::LockMetadata;
use crate::observe::{Meter, Since};
use crate::spec::LockKind;
use crate::watchdog::{LostSignal, WatchHandle};

/// A lock that is held: its key, owner token, fencing token and expiry, and
/// a signal that fires if it is lost.
///
/// Pass the fencing token along with every write the lock protects, and have
/// the store refuse a write whose fence is lower than one it has seen: a
/// holder that lost its lock without noticing (a pause longer than the TTL)
/// then cannot overwrite the next holder's work.
///
/// ```
/// use tower_lock::Locks;
///
/// async fn pay(locks: Locks) -> String {
///     let order = locks.first().expect("the layer took it");
///     // e.g. UPDATE orders SET paid = true, fence = $1 WHERE id = $2 AND fence <= $1
///     format!("paid under fence {}", order.fence())
/// }
/// # let _ = pay;
/// ```
pub struct HeldLock {
    pub(super) key: LockKey,
    pub(super) owner: Arc<str>,
    pub(super) lease: Lease,
    // When the lock expires unless extended, by this process's clock.
    expiry: tokio::time::Instant,
    // Boxed, as few locks have any: 8 bytes in every handle instead of 32
    // (handles are moved on every acquire and release).
    extras: Option<Box<HeldExtras>>,
    // Made on first use: most locks are released without anyone asking.
    // A clone makes it first, so every copy shares one signal.
    signal: OnceLock<LostSignal>,
    // Metric labels and when it was taken (nothing without feature `metrics`).
    pub(crate) meter: Meter,
    pub(crate) since: Since,
}

/// What few locks have.
#[derive(Clone)]
pub(crate) struct HeldExtras {
    metadata: Option<LockMetadata>,
    // Released before then, the lock is kept until then (`LockSpec::min_hold`).
    hold_until: Option<tokio::time::Instant>,
    // A shared hold or a permit (an exclusive lock has no extras for it).
    kind: LockKind,
}

impl HeldExtras {
    /// A handle's metadata and the end of its minimum hold: no allocation
    /// when neither is there. Made before the handle's other parts, which
    /// then go straight into place.
    #[inline]
    pub(crate) fn new(
        metadata: Option<LockMetadata>,
        hold_until: Option<tokio::time::Instant>,
        kind: LockKind,
    ) -> Option<Box<HeldExtras>> {
        if metadata.is_none() && hold_until.is_none() && kind == LockKind::Exclusive {
            None
        } else {
            HeldExtras::boxed(metadata, hold_until, kind)
        }
    }

    // Out of line: the common handle has none.
    #[cold]
    #[inline(never)]
    fn boxed(
        metadata: Option<LockMetadata>,
        hold_until: Option<tokio::time::Instant>,
        kind: LockKind,
    ) -> Option<Box<HeldExtras>> {
        Some(Box::new(HeldExtras {
            metadata,
            hold_until,
            kind,
        }))
    }
}

impl Clone for HeldLock {
    fn clone(&self) -> Self {
        HeldLock {
            key: self.key.clone(),
            owner: self.owner.clone(),
            lease: self.lease.clone(),
            expiry: self.expiry,
            extras: self.extras.clone(),
            signal: OnceLock::from(self.lost_signal().clone()),
            meter: self.meter.clone(),
            since: self.since,
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
    /// A handle with its extras ([`HeldExtras::new`]), built in place: no
    /// `memcpy` of a handle built first and moved.
    #[inline]
    pub(crate) fn new(
        key: LockKey,
        owner: Arc<str>,
        lease: Lease,
        expiry: tokio::time::Instant,
        extras: Option<Box<HeldExtras>>,
        meter: Meter,
    ) -> Self {
        HeldLock {
            key,
            owner,
            lease,
            expiry,
            extras,
            signal: OnceLock::new(),
            meter,
            since: Since::now(),
        }
    }

    /// The kind of hold: exclusive, shared, or one of a key's permits (see
    /// [`LockKind`]).
    pub fn kind(&self) -> LockKind {
        self.extras.as_ref().map_or(LockKind::Exclusive, |e| e.kind)
    }

    /// How much longer the lock must be held after a release now (see
    /// [`LockSpec::min_hold`](crate::LockSpec::min_hold)); `None` when a
    /// release may free it.
    #[inline]
    pub(crate) fn hold_left(&self) -> Option<Duration> {
        let left = self
            .hold_until()?
            .saturating_duration_since(tokio::time::Instant::now());
        // Less than a millisecond is no hold (backends count whole ms).
        (left >= Duration::from_millis(1)).then_some(left)
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
    pub(super) fn expiry(&self) -> tokio::time::Instant {
        match self.signal.get() {
            Some(signal) => signal.expiry(),
            None => self.expiry,
        }
    }

    /// A new expiry after an extension.
    pub(super) fn set_expiry(&mut self, expiry: tokio::time::Instant) {
        self.expiry = expiry;
        if let Some(signal) = self.signal.get() {
            signal.set_expiry(expiry);
        }
    }

    /// Quiet the lost signal: the lock is being released.
    pub(super) fn finish(&self) {
        if let Some(signal) = self.signal.get() {
            signal.finish();
        }
    }

    /// Renew this lock through `backend`'s watchdog until the handle is
    /// dropped.
    /// Extend this acquisition on `backend` to `ttl` (checked here: a
    /// backend that skipped the check would have the lock end past what an
    /// `Instant` holds), never beside a watchdog renewal of it: `apply`
    /// gets the new lease and when the lock now ends, still within the
    /// extension's gate.
    pub(crate) async fn extend_on<R>(
        &self,
        backend: &SharedBackend,
        ttl: Duration,
        apply: impl FnOnce(Lease, tokio::time::Instant) -> R,
    ) -> Result<R, crate::error::LockError> {
        crate::spec::validate_ttl(ttl)?;
        // Never beside a watchdog renewal of the same lock (see `extending`).
        let _gate = self.lost_signal().extending().await;
        let sent = tokio::time::Instant::now();
        let lease = backend
            .extend(&self.key, self.holder(), ttl)
            .await
            .inspect_err(|e| self.meter.backend_error("extend", e))?;
        Ok(apply(lease, sent + ttl))
    }

    pub(crate) fn watch(&self, backend: &SharedBackend) -> WatchHandle {
        backend.watchdog().watch(
            self.key.clone(),
            self.owner.clone(),
            self.lease.fence,
            self.ttl(),
            self.lost_signal().clone(),
            self.meter.clone(),
        )
    }

    /// The validated key (with its scope).
    pub fn lock_key(&self) -> &LockKey {
        &self.key
    }

    /// The user's key, as given in the spec (NFC-normalised).
    pub fn key(&self) -> &str {
        self.key.key()
    }

    /// The owner token: whoever presents it with the fence can release or
    /// extend the lock.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// This acquisition, as the backend names it (owner token and fence).
    pub(crate) fn holder(&self) -> Holder<'_> {
        Holder::new(&self.owner, self.lease.fence)
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

    /// The metadata stored with the lock ([`LockSpec::metadata`](crate::LockSpec::metadata)).
    pub fn metadata(&self) -> Option<&LockMetadata> {
        self.extras.as_ref()?.metadata.as_ref()
    }

    /// Until when (by this process's clock) a release only shortens the
    /// lock to this time instead of freeing it ([`LockSpec::min_hold`](crate::LockSpec::min_hold)).
    #[inline]
    pub fn hold_until(&self) -> Option<tokio::time::Instant> {
        self.extras.as_ref()?.hold_until
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
